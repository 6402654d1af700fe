//! Detection lag of the eBPF source on a quiet machine: how long from the kernel's
//! `bpf_ktime_get_ns()` in the program to the event leaving the source's channel.
//!
//! A child process in a test memory cgroup touches one fresh page every `REACTOR_BENCH_GAP_US`
//! microseconds (default 200); each fault moves the memcg `PGFAULT` counter, which the
//! `count_memcg_events` program reports (no rate limit, so one record per fault). The bench
//! takes `REACTOR_BENCH_EVENTS` (default 5000) of that cgroup's events off the channel and
//! prints p50/p90/p99/max of `CLOCK_MONOTONIC now - at_ns`.
//!
//! Needs root. Run: `cargo bench -p reactor --bench ebpf_lag`. Targets (not asserted):
//! p50 < 20 µs, p99 < 200 µs.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reactor::sense::ebpf::{monotonic_ns, EbpfOptions, EbpfSource};
use reactor::sense::Kind;

const MEMCG_ROOT: &str = "/sys/fs/cgroup/memory";

fn env_or(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}={v:?} is not a whole number")),
    }
}

/// The child: join the cgroup, then fault in one page per gap.
fn child(procs: &str, pages: usize, gap: Duration) -> Result<()> {
    std::fs::write(procs, std::process::id().to_string())
        .with_context(|| format!("joining {procs}"))?;
    // A large zeroed allocation is mapped lazily: each first write is a page fault.
    let mut region = vec![0u8; (pages + 1) * 4096];
    let start = Instant::now();
    for i in 0..pages {
        region[i * 4096] = 1;
        std::hint::black_box(&region);
        let due = gap * (i as u32 + 1);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    Ok(())
}

/// Removes the bench cgroup (after the child is gone) on every exit path.
struct Cgroup(PathBuf);

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            if std::fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("warning: could not remove {}", self.0.display());
    }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        let (Some(procs), Some(pages), Some(gap)) = (args.get(2), args.get(3), args.get(4)) else {
            bail!("usage: ebpf_lag --child <cgroup.procs> <pages> <gap-us>");
        };
        return child(
            procs,
            pages.parse().context("pages")?,
            Duration::from_micros(gap.parse().context("gap-us")?),
        );
    }
    let events = env_or("REACTOR_BENCH_EVENTS", 5000)? as usize;
    let gap_us = env_or("REACTOR_BENCH_GAP_US", 200)?;
    let warmup = 100;

    let name = format!("reactor-bench-ebpf-lag-{}", std::process::id());
    let dir = PathBuf::from(MEMCG_ROOT).join(&name);
    std::fs::create_dir(&dir)
        .with_context(|| format!("creating {} (needs root)", dir.display()))?;
    let guard = Cgroup(dir.clone());
    std::fs::write(dir.join("memory.limit_in_bytes"), (1u64 << 30).to_string())?;
    let ours = Some(format!("/{name}"));

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let opts = EbpfOptions {
        min_interval: Duration::ZERO,
        memcg_items: vec!["PGFAULT".into()],
        ring_buffer_bytes: 1 << 20,
        ..Default::default()
    };
    let source = EbpfSource::attach(opts).context("attaching the eBPF source")?;
    let (tx, mut rx) = tokio::sync::mpsc::channel(65_536);
    let task = rt.spawn(source.run(tx));

    let mut hog = Command::new(std::env::current_exe()?)
        .arg("--child")
        .arg(dir.join("cgroup.procs"))
        .arg((events + warmup + 500).to_string())
        .arg(gap_us.to_string())
        .spawn()
        .context("starting the page-touching child")?;

    // The consumer is a task on the same runtime, as the reactor loop is: the lag is what
    // the reactor would see when it takes the event.
    let consumer = rt.spawn(async move {
        let mut lags = Vec::with_capacity(events);
        let (mut skipped, mut dropped) = (0, 0);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        while lags.len() < events {
            let Ok(Some(ev)) = tokio::time::timeout_at(deadline, rx.recv()).await else {
                break;
            };
            let lag = monotonic_ns().saturating_sub(ev.at_ns);
            match ev.kind {
                Kind::Dropped { count } => dropped += count,
                Kind::MemcgEvent { .. } if ev.cgroup == ours => {
                    if skipped < warmup {
                        skipped += 1;
                    } else {
                        lags.push(lag);
                    }
                }
                _ => {}
            }
        }
        (lags, dropped)
    });
    let (mut lags, dropped) = rt.block_on(consumer)?;
    let _ = hog.kill();
    let _ = hog.wait();
    task.abort();
    drop(rt);
    drop(guard);

    if lags.is_empty() {
        bail!("no events from the bench cgroup");
    }
    lags.sort_unstable();
    let us = |ns: u64| ns as f64 / 1000.0;
    // The tail is the scheduler's: say how busy the machine was.
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().next().unwrap_or("?");
    println!(
        "ebpf detection lag over {} events (gap {gap_us} µs, {dropped} dropped, load {load}): \
         p50 {:.1} µs  p90 {:.1} µs  p99 {:.1} µs  max {:.1} µs",
        lags.len(),
        us(percentile(&lags, 0.50)),
        us(percentile(&lags, 0.90)),
        us(percentile(&lags, 0.99)),
        us(*lags.last().unwrap_or(&0)),
    );
    Ok(())
}
