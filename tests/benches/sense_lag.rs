//! Detection-lag benchmark for the sources that need no eBPF: the v1 memcg eventfds
//! (threshold and OOM) and the PSI trigger, in one run on the real kernel, plus what the
//! housekeeping tick alone would have added.
//!
//!     cargo build --release -p reactor-tests --bins &&
//!     cargo bench -p reactor-tests --bench sense_lag
//!
//! (`cargo xtask bench` runs the fuller side-by-side comparison, eBPF and polling included.)
//!
//! Environment: `SENSE_BENCH_ROUNDS` (OOM rounds, default 30), `SENSE_BENCH_PSI_SECS`
//! (seconds of page-cache thrash for PSI, default 20), `SENSE_BENCH_INTERVAL` (the tick,
//! default 1s; 10s is the kubelet's default), `SENSE_BENCH_GAP_MS` (pause between OOM
//! rounds, default 150; make it larger with a long tick so OOMs fall at different phases).
//!
//! Lag is what the agent measures for every event: `CLOCK_MONOTONIC` when the consumer takes
//! the event minus the event's timestamp (the source's wake-up for these sources). The
//! figures are printed, never asserted. All pressure stays inside a 64 MiB test cgroup.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reactor::config::Config;
use reactor::decide::duration::parse_go_duration;
use reactor::sense::lag::format_ns;
use reactor::sense::{Kind, MemcgTarget, Received, Sense, SenseOptions, Source};
use reactor_tests::{is_root, memhog_bin, TestMemcg, MEMCG_V1_ROOT};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn exact(samples: &mut [u64]) -> String {
    if samples.is_empty() {
        return "no samples".into();
    }
    samples.sort_unstable();
    let at =
        |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1];
    format!(
        "n={:<4} p50={:<9} p99={:<9} max={}",
        samples.len(),
        format_ns(at(0.50)),
        format_ns(at(0.99)),
        format_ns(at(1.0))
    )
}

fn main() {
    if !is_root()
        || !Path::new(MEMCG_V1_ROOT)
            .join("cgroup.event_control")
            .exists()
    {
        eprintln!("sense_lag: needs root and the cgroup v1 memory controller; nothing measured");
        return;
    }
    if !memhog_bin().exists() {
        eprintln!(
            "sense_lag: {} missing: cargo build --release -p reactor-tests --bins",
            memhog_bin().display()
        );
        std::process::exit(1);
    }
    let rounds = env_u64("SENSE_BENCH_ROUNDS", 30);
    let psi_secs = env_u64("SENSE_BENCH_PSI_SECS", 20);
    let gap = Duration::from_millis(env_u64("SENSE_BENCH_GAP_MS", 150));
    let interval = std::env::var("SENSE_BENCH_INTERVAL")
        .ok()
        .and_then(|v| parse_go_duration(&v).ok())
        .filter(|d| !d.is_zero())
        .unwrap_or(Duration::from_secs(1));

    let mut cg = TestMemcg::new("bench", 64 << 20).expect("create bench memcg");
    let dir = tempfile::tempdir_in("/var/tmp").expect("temp dir on disk");
    let file = dir.path().join("working-set.bin");
    cg.spawn(Command::new("dd").args([
        "if=/dev/zero",
        &format!("of={}", file.display()),
        "bs=1M",
        "count=64",
        "status=none",
    ]))
    .expect("spawn dd");
    cg.wait_all(Duration::from_secs(60));

    let mut opts = SenseOptions::from_config(
        &Config::default(),
        vec![MemcgTarget {
            cgroup: cg.cgroup.clone(),
            threshold_bytes: Some(32 << 20),
        }],
    );
    opts.ebpf = false;
    opts.poll_interval = interval;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let done = Arc::new(AtomicBool::new(false));
    let (events, lag, cg) = runtime.block_on(async {
        let mut sense = Sense::start(&opts).expect("sense starts");
        let flag = done.clone();
        let workload = std::thread::spawn(move || {
            // Phase 1: OOM rounds, each crossing the threshold up, OOM-killing, and down.
            for _ in 0..rounds {
                let before = cg.wait_all(Duration::ZERO).len();
                cg.spawn(Command::new(memhog_bin()).args(["256", "0", "60"]))
                    .expect("spawn hog");
                let started = Instant::now();
                while cg.wait_all(Duration::ZERO)[before].is_none()
                    && started.elapsed() < Duration::from_secs(10)
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                std::thread::sleep(gap);
            }
            // Phase 2: hold 52 MiB and stream a 64 MiB file through the rest (PSI).
            cg.spawn(Command::new(memhog_bin()).args(["52", "0", "3600"]))
                .expect("spawn holding hog");
            std::thread::sleep(Duration::from_millis(500));
            let script = format!("while :; do cat '{}' > /dev/null; done", file.display());
            cg.spawn(Command::new("sh").args(["-c", &script]))
                .expect("spawn reader");
            std::thread::sleep(Duration::from_secs(psi_secs));
            flag.store(true, Ordering::SeqCst);
            cg
        });
        let mut events: Vec<Received> = Vec::new();
        while !done.load(Ordering::SeqCst) {
            if let Ok(Some(r)) =
                tokio::time::timeout(Duration::from_millis(200), sense.next()).await
            {
                events.push(r);
            }
        }
        let cg = workload.join().expect("workload");
        let lag = sense.shutdown().await;
        (events, lag, cg)
    });
    drop(cg); // kills the hog and the reader, removes the cgroup

    println!(
        "sense_lag: {rounds} OOM rounds, {psi_secs}s of thrash, tick every {}",
        reactor::decide::duration::format_go_duration(interval)
    );
    println!("exact, from every event:");
    let lags = |pred: &dyn Fn(&Received) -> bool| -> Vec<u64> {
        events
            .iter()
            .filter(|r| pred(r))
            .map(|r| r.lag_ns)
            .collect()
    };
    let rows: [(&str, Vec<u64>); 5] = [
        (
            "memcg threshold eventfd",
            lags(&|r| matches!(r.event.kind, Kind::ThresholdCrossed { .. })),
        ),
        (
            "memcg OOM eventfd",
            lags(&|r| {
                r.event.source == Source::MemcgThreshold
                    && matches!(r.event.kind, Kind::OomKill { .. } | Kind::MemcgEvent { .. })
            }),
        ),
        (
            "psi trigger (some)",
            lags(&|r| matches!(&r.event.kind, Kind::PsiTrigger { level, .. } if level == "some")),
        ),
        (
            "psi trigger (full)",
            lags(&|r| matches!(&r.event.kind, Kind::PsiTrigger { level, .. } if level == "full")),
        ),
        ("poll tick", lags(&|r| r.event.kind == Kind::Tick)),
    ];
    for (name, mut samples) in rows {
        println!("  {name:<24} {}", exact(&mut samples));
    }
    println!("histogram estimates (what reactor watch prints):");
    for snapshot in lag.snapshot() {
        println!("  {snapshot}");
    }
    // What a tick-only agent would have waited: from each OOM notification to the next tick.
    let ticks: Vec<u64> = events
        .iter()
        .filter(|r| r.event.kind == Kind::Tick)
        .map(|r| r.event.at_ns)
        .collect();
    let mut waits: Vec<u64> = events
        .iter()
        .filter(|r| {
            r.event.source == Source::MemcgThreshold && matches!(r.event.kind, Kind::OomKill { .. })
        })
        .filter_map(|r| {
            ticks
                .iter()
                .find(|&&t| t >= r.event.at_ns)
                .map(|t| t - r.event.at_ns)
        })
        .collect();
    println!(
        "  {:<24} {}",
        "OOM seen by the tick after",
        exact(&mut waits)
    );
}
