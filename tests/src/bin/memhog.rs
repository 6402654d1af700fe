//! A process that allocates memory at a set rate and touches every page, to drive a memory
//! cgroup into reclaim and OOM from inside the cgroup (never the whole machine).
//!
//! usage: memhog <total-MiB> [MiB-per-second] [hold-seconds]
//! A rate of 0 allocates as fast as it can. After allocating it holds the memory for
//! hold-seconds (default 3600) so the test decides when it ends.

use std::time::{Duration, Instant};

fn arg(args: &[String], i: usize, default: u64) -> u64 {
    match args.get(i) {
        None => default,
        Some(text) => match text.parse() {
            Ok(v) => v,
            Err(_) => {
                eprintln!("memhog: argument {i} ({text:?}) is not a whole number");
                std::process::exit(2);
            }
        },
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let total_mib = arg(&args, 1, 128);
    let rate = arg(&args, 2, 0);
    let hold = arg(&args, 3, 3600);
    let start = Instant::now();
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    for i in 0..total_mib {
        let mut chunk = vec![0u8; 1 << 20];
        // Touch every page so the memory is really charged to the cgroup.
        for page in chunk.chunks_mut(4096) {
            page[0] = 1;
        }
        chunks.push(chunk);
        if rate > 0 {
            let due = Duration::from_secs_f64((i + 1) as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    println!("allocated {total_mib} MiB");
    std::thread::sleep(Duration::from_secs(hold));
    drop(chunks);
}
