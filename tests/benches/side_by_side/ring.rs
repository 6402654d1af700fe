//! Part 4: the eBPF ring buffer. A child in a test memory cgroup faults pages in at a set
//! rate (one `memcg:count_memcg_events` PGFAULT record per fault, kernel rate limit off); the
//! rate doubles until the drop counter moves or the child cannot go faster, and the highest
//! rate with no drop is reported. Then a one-page ring buffer is flooded to show the drop
//! accounting: records lost in the kernel come back as `Dropped` events with their count.
//!
//! The tracepoint sees every page fault on the machine, so other processes' faults share
//! the ring buffer: the table gives both this cgroup's rate and the ring's total.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reactor::sense::ebpf::{EbpfOptions, EbpfSource};
use reactor::sense::{Kind, PressureEvent};
use reactor_tests::TestMemcg;
use serde_json::json;

use crate::report::{Part, Table};
use crate::Opts;

/// The first argument that makes this binary the page-faulting child.
pub const CHILD_FLAG: &str = "--fault-child";

const REGION: usize = 4 << 20;
const PAGE: usize = 4096;

/// The child: join the cgroup at `args[0]` (its `cgroup.procs`), fault pages at `args[1]`
/// per second (0: as fast as it can) for `args[2]` milliseconds, print how many.
pub fn child(args: &[String]) -> Result<()> {
    let (Some(procs), Some(rate), Some(millis)) = (args.first(), args.get(1), args.get(2)) else {
        bail!("usage: {CHILD_FLAG} <cgroup.procs> <faults-per-second> <milliseconds>");
    };
    let rate: u64 = rate.parse().context("faults per second")?;
    let run_for = Duration::from_millis(millis.parse().context("milliseconds")?);
    std::fs::write(procs, std::process::id().to_string())
        .with_context(|| format!("joining {procs}"))?;
    // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
    let base = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            REGION,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::PRIVATE,
        )
    }
    .context("mapping the region")?;
    let pages = REGION / PAGE;
    let start = Instant::now();
    let mut faults: u64 = 0;
    let mut page = 0;
    while start.elapsed() < run_for {
        if rate > 0 {
            let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
            if faults >= due {
                std::thread::sleep(Duration::from_micros(100));
                continue;
            }
        }
        for _ in 0..64 {
            // SAFETY: `page < pages`, so the byte is inside the mapping, which stays mapped
            // until the process exits; a volatile write so the fault really happens.
            unsafe { std::ptr::write_volatile(base.cast::<u8>().add(page * PAGE), 1) };
            faults += 1;
            page += 1;
            if page == pages {
                page = 0;
                // SAFETY: the whole mapping; dropping its pages makes the next writes
                // fault again (fresh zero pages), and nothing holds references into it.
                unsafe { rustix::mm::madvise(base, REGION, rustix::mm::Advice::LinuxDontNeed) }
                    .context("madvise")?;
            }
        }
    }
    println!("faults {faults} nanos {}", start.elapsed().as_nanos());
    Ok(())
}

/// What the consumer has counted so far.
#[derive(Default)]
struct Counters {
    ours: AtomicU64,
    all: AtomicU64,
    dropped: AtomicU64,
}

impl Counters {
    fn get(&self) -> [u64; 3] {
        [
            self.ours.load(Ordering::SeqCst),
            self.all.load(Ordering::SeqCst),
            self.dropped.load(Ordering::SeqCst),
        ]
    }
}

/// Attaches a source with `ring_bytes` of ring buffer and counts what it delivers.
fn start(
    rt: &tokio::runtime::Runtime,
    ring_bytes: u32,
    cgroup: &str,
) -> Result<(Arc<Counters>, tokio::task::JoinHandle<()>)> {
    let opts = EbpfOptions {
        ring_buffer_bytes: ring_bytes,
        min_interval: Duration::ZERO,
        memcg_items: vec!["PGFAULT".into()],
        drop_check_interval: Duration::from_millis(50),
        ..EbpfOptions::default()
    };
    let source = rt
        .block_on(async { EbpfSource::attach(opts) })
        .context("attaching the eBPF source")?;
    if !source.attached().contains(&"count_memcg_events") {
        bail!("count_memcg_events did not attach: {:?}", source.missing());
    }
    let counters = Arc::new(Counters::default());
    let c = counters.clone();
    let ours = Some(cgroup.to_string());
    let (tx, mut rx) = tokio::sync::mpsc::channel::<PressureEvent>(1 << 16);
    let task = rt.spawn(async move {
        let run = tokio::spawn(source.run(tx));
        while let Some(e) = rx.recv().await {
            c.all.fetch_add(1, Ordering::Relaxed);
            match e.kind {
                Kind::Dropped { count } => {
                    c.dropped.fetch_add(count, Ordering::SeqCst);
                }
                Kind::MemcgEvent { count, .. } if e.cgroup == ours => {
                    c.ours.fetch_add(count, Ordering::SeqCst);
                }
                _ => {}
            }
        }
        run.abort();
    });
    Ok((counters, task))
}

/// One run of the child; returns (faults it made, seconds it ran).
pub(crate) fn fault(cg: &TestMemcg, rate: u64, millis: u64) -> Result<(u64, f64)> {
    let out = Command::new(std::env::current_exe()?)
        .arg(CHILD_FLAG)
        .arg(cg.path.join("cgroup.procs"))
        .arg(rate.to_string())
        .arg(millis.to_string())
        .stdin(Stdio::null())
        .output()
        .context("running the faulting child")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "faulting child failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut words = text.split_whitespace();
    match (words.nth(1), words.nth(1)) {
        (Some(f), Some(n)) => Ok((
            f.parse().context("child's fault count")?,
            n.parse::<f64>().context("child's time")? / 1e9,
        )),
        _ => bail!("faulting child said {text:?}"),
    }
}

/// One step's figures.
struct Step {
    target: u64,
    generated: u64,
    secs: f64,
    received: u64,
    all: u64,
    dropped: u64,
}

fn step(cg: &TestMemcg, counters: &Counters, target: u64, millis: u64) -> Result<Step> {
    let before = counters.get();
    let (generated, secs) = fault(cg, target, millis)?;
    // Let the consumer drain and the drop counter be checked (every 50 ms).
    std::thread::sleep(Duration::from_millis(250));
    let after = counters.get();
    Ok(Step {
        target,
        generated,
        secs,
        received: after[0] - before[0],
        all: after[1] - before[1],
        dropped: after[2] - before[2],
    })
}

fn rate(n: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

fn k(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.2}M/s", r / 1e6)
    } else {
        format!("{:.0}k/s", r / 1e3)
    }
}

/// Run part 4.
pub fn run(opts: &Opts) -> Result<Part> {
    let millis = if opts.quick { 400 } else { 2000 };
    let cg = TestMemcg::new("bench-ring", 256 << 20).context("creating the test memcg")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let ring_bytes = agent_ring_bytes();
    let (counters, task) = start(&rt, ring_bytes, &cg.cgroup)?;
    let mut steps = Vec::new();
    let mut target = 25_000u64;
    loop {
        let s = step(&cg, &counters, target, millis)?;
        let achieved = rate(s.generated, s.secs);
        let stop = s.dropped > 0 || achieved < 0.7 * target as f64 || target >= 3_200_000;
        steps.push(s);
        if stop {
            break;
        }
        target *= 2;
    }
    task.abort();
    let _ = rt.block_on(task);

    // Overload: one page of ring buffer, the child flat out.
    let (counters, task) = start(&rt, 4096, &cg.cgroup)?;
    let flood = step(&cg, &counters, 0, millis)?;
    task.abort();
    let _ = rt.block_on(task);
    drop(cg);

    let mut t = Table::new(
        "4. eBPF ring buffer: sustained rate and drops",
        &[
            "ring",
            "target",
            "achieved (this cgroup)",
            "received (this cgroup)",
            "ring total",
            "dropped (reported)",
        ],
    );
    let row = |ring: String, s: &Step| {
        vec![
            ring,
            if s.target == 0 {
                "flat out".into()
            } else {
                k(s.target as f64)
            },
            format!("{} ({})", k(rate(s.generated, s.secs)), s.generated),
            format!("{}", s.received),
            k(rate(s.all, s.secs)),
            s.dropped.to_string(),
        ]
    };
    let ring_name = format!("{} KiB", ring_bytes / 1024);
    for s in &steps {
        t.row(row(ring_name.clone(), s));
    }
    t.row(row("4 KiB".into(), &flood));
    let best = steps
        .iter()
        .filter(|s| s.dropped == 0)
        .map(|s| rate(s.generated, s.secs))
        .fold(0.0, f64::max);
    let limited_by = match steps.last() {
        Some(s) if s.dropped > 0 => "the next step dropped records",
        _ => "the faulting child could go no faster (no drop seen)",
    };
    t.note(format!(
        "highest rate with no drop: {} from this cgroup ({limited_by}); {} ms per step, one \
         record per page fault (kernel rate limit off)",
        k(best),
        millis
    ));
    let lost = flood.generated.saturating_sub(flood.received);
    t.note(format!(
        "flood of a one-page ring: {} faults, {} records received from this cgroup, {lost} \
         lost; {} drops reported (every cgroup's records share the ring, so reported ≥ lost: \
         {})",
        flood.generated,
        flood.received,
        flood.dropped,
        if flood.dropped >= lost { "yes" } else { "NO" }
    ));
    let step_json = |s: &Step| {
        json!({
            "target_per_s": s.target, "generated": s.generated, "seconds": s.secs,
            "achieved_per_s": rate(s.generated, s.secs), "received": s.received,
            "ring_total": s.all, "ring_total_per_s": rate(s.all, s.secs), "dropped": s.dropped,
        })
    };
    Ok(Part {
        key: "ring",
        tables: vec![t],
        json: json!({
            "ring_bytes": ring_bytes,
            "steps": steps.iter().map(step_json).collect::<Vec<_>>(),
            "highest_rate_without_drops_per_s": best,
            "flood": step_json(&flood),
            "flood_lost_from_this_cgroup": lost,
            "flood_drops_account_for_losses": flood.dropped >= lost,
        }),
        samples: steps.len() + usize::from(flood.generated > 0),
    })
}

/// The ring-buffer size the agent runs with.
fn agent_ring_bytes() -> u32 {
    EbpfOptions::default().ring_buffer_bytes
}
