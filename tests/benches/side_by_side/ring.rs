//! Part 4: the eBPF ring buffer. Producers in a test memory cgroup — one child process per
//! CPU, each pinned to its CPU — take page faults at a set total rate (one
//! `memcg:count_memcg_events` PGFAULT record per fault, kernel rate limit off); the rate
//! doubles until the drop counter moves, a record goes missing, or the producers cannot go
//! faster, and the highest rate with no drop is reported. The faults are reads of anonymous
//! memory never written (each maps the shared zero page; `MADV_DONTNEED` unmaps it again), the
//! cheapest way user space has to fire a tracepoint the agent attaches: no page is allocated,
//! zeroed or charged. The consumer is the agent's own drain ([`EbpfSource::run`], names and
//! channel included) on `SCHED_FIFO` threads, as deployed. Then a one-page ring buffer is
//! flooded to show the drop accounting: records lost in the kernel come back as `Dropped`
//! events with their count.
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

use crate::lag::{deployed_runtime, REALTIME_PRIORITY};
use crate::opts::Opts;
use crate::report::{Part, Table};

/// The first argument that makes this binary the page-faulting child.
pub const CHILD_FLAG: &str = "--fault-child";

const REGION: usize = 4 << 20;
const PAGE: usize = 4096;

/// The child: join the cgroup at `args[0]` (its `cgroup.procs`), pin itself to CPU `args[3]`,
/// fault pages at `args[1]` per second (0: as fast as it can) for `args[2]` milliseconds,
/// print how many.
pub fn child(args: &[String]) -> Result<()> {
    let (Some(procs), Some(rate), Some(millis), Some(cpu)) =
        (args.first(), args.get(1), args.get(2), args.get(3))
    else {
        bail!("usage: {CHILD_FLAG} <cgroup.procs> <faults-per-second> <milliseconds> <cpu>");
    };
    let rate: u64 = rate.parse().context("faults per second")?;
    let run_for = Duration::from_millis(millis.parse().context("milliseconds")?);
    let cpu: usize = cpu.parse().context("cpu")?;
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set).context("pinning to the cpu")?;
    let base = join_and_map(procs, REGION)?;
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
            // until the process exits; a volatile read so the fault really happens (it maps
            // the zero page: the region is never written).
            unsafe { std::ptr::read_volatile(base.cast::<u8>().add(page * PAGE)) };
            faults += 1;
            page += 1;
            if page == pages {
                page = 0;
                // SAFETY: the whole mapping; dropping its mappings makes the next reads
                // fault again, and nothing holds references into it.
                unsafe { rustix::mm::madvise(base, REGION, rustix::mm::Advice::LinuxDontNeed) }
                    .context("madvise")?;
            }
        }
    }
    println!("faults {faults} nanos {}", start.elapsed().as_nanos());
    Ok(())
}

/// A faulting child's setup: joins the cgroup whose `cgroup.procs` is `procs`, then maps `len`
/// bytes of private anonymous memory with small pages (one fault per page).
pub(crate) fn join_and_map(procs: &str, len: usize) -> Result<*mut std::ffi::c_void> {
    std::fs::write(procs, std::process::id().to_string())
        .with_context(|| format!("joining {procs}"))?;
    // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
    let base = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
            rustix::mm::MapFlags::PRIVATE,
        )
    }
    .context("mapping the region")?;
    // SAFETY: advice on our own fresh mapping: small pages, one fault per page.
    unsafe { rustix::mm::madvise(base, len, rustix::mm::Advice::LinuxNoHugepage) }
        .context("madvise(MADV_NOHUGEPAGE)")?;
    Ok(base)
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

/// How many producers: one per CPU.
fn producers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// One run of the producers, together; returns (faults they made, seconds the longest ran).
fn fault(cg: &TestMemcg, rate: u64, millis: u64) -> Result<(u64, f64)> {
    let n = producers();
    let mut children = Vec::new();
    for cpu in 0..n {
        let child = Command::new(std::env::current_exe()?)
            .arg(CHILD_FLAG)
            .arg(cg.path.join("cgroup.procs"))
            .arg((rate / n as u64).to_string())
            .arg(millis.to_string())
            .arg(cpu.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting a faulting child")?;
        children.push(child);
    }
    let (mut total, mut secs) = (0u64, 0f64);
    for child in children {
        let out = child
            .wait_with_output()
            .context("waiting for a faulting child")?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "faulting child failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let mut words = text.split_whitespace();
        match (words.nth(1), words.nth(1)) {
            (Some(f), Some(ns)) => {
                total += f.parse::<u64>().context("child's fault count")?;
                secs = secs.max(ns.parse::<f64>().context("child's time")? / 1e9);
            }
            _ => bail!("faulting child said {text:?}"),
        }
    }
    Ok((total, secs))
}

/// CPU time this process (the consumer: the drain and the counting task) has used, ns.
fn own_cpu_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|w| w.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the command.
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    // SAFETY-free: the USER_HZ of /proc is 100 on Linux.
    ticks * 10_000_000
}

/// One step's figures.
struct Step {
    target: u64,
    generated: u64,
    secs: f64,
    received: u64,
    all: u64,
    dropped: u64,
    /// CPU the consumer used in the step, ns.
    consumer_cpu_ns: u64,
}

fn step(cg: &TestMemcg, counters: &Counters, target: u64, millis: u64) -> Result<Step> {
    let before = counters.get();
    let cpu0 = own_cpu_ns();
    let (generated, secs) = fault(cg, target, millis)?;
    // Let the consumer drain and the drop counter be checked (every 50 ms).
    std::thread::sleep(Duration::from_millis(250));
    let after = counters.get();
    Ok(Step {
        consumer_cpu_ns: own_cpu_ns().saturating_sub(cpu0),
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
    // The consumer runs as deployed (`realtimePriority: 10`); the producers are reset to
    // normal scheduling on fork.
    let (rt, realtime) = deployed_runtime()?;
    let ring_bytes = agent_ring_bytes();
    let (counters, task) = start(&rt, ring_bytes, &cg.cgroup)?;
    let mut steps = Vec::new();
    let mut target = 25_000u64;
    loop {
        let s = step(&cg, &counters, target, millis)?;
        let achieved = rate(s.generated, s.secs);
        let stop = s.dropped > 0
            || s.received < s.generated
            || achieved < 0.7 * target as f64
            || target >= 12_800_000;
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
    // No drop: the kernel counted none, and every fault of ours arrived as a record.
    let clean = |s: &&Step| s.dropped == 0 && s.received >= s.generated;
    let best_step = steps
        .iter()
        .filter(clean)
        .max_by(|a, b| rate(a.generated, a.secs).total_cmp(&rate(b.generated, b.secs)));
    let best = best_step.map_or(0.0, |s| rate(s.generated, s.secs));
    let best_ring_total = best_step.map_or(0.0, |s| rate(s.all, s.secs));
    let limited_by = match steps.last() {
        Some(s) if s.dropped > 0 => "the next step dropped records in the kernel".to_string(),
        Some(s) if s.received < s.generated => {
            "the next step lost records without a drop being counted".to_string()
        }
        Some(s) if s.target >= 12_800_000 => "the ladder's top was reached".to_string(),
        _ => format!(
            "the {} producers could go no faster on {} CPUs shared with the consumer (no drop \
             seen)",
            producers(),
            producers()
        ),
    };
    let per_record = |s: &Step| {
        if s.all > 0 {
            s.consumer_cpu_ns as f64 / s.all as f64
        } else {
            0.0
        }
    };
    t.note(format!(
        "highest rate with no drop: {} from this cgroup, {} through the ring in all ({limited_by}); \
         {} ms per step, {} producers pinned one per CPU, one record per page fault (reads of \
         never-written memory: zero-page faults; kernel rate limit off)",
        k(best),
        k(best_ring_total),
        millis,
        producers()
    ));
    t.note(format!(
        "consumer: the agent's drain (decode, cgroup name, channel) and a counting task on \
         {}; its CPU per record at the best step: {:.0} ns (process CPU time / records through \
         the ring)",
        if realtime {
            format!("SCHED_FIFO {REALTIME_PRIORITY}")
        } else {
            "normal scheduling (SCHED_FIFO refused)".to_string()
        },
        best_step.map_or(0.0, per_record)
    ));
    t.note(
        "for scale: the kernel's own BPF ring-buffer benchmark (selftests `bench_ringbufs`, one \
         producer reserving and committing back to back from a syscall loop, a bare consumer) \
         is published at about 12 M events/s; here every record costs a page fault to make and \
         goes through the agent's whole drain, so this is the end-to-end rate the agent \
         sustains, not the ring's ceiling"
            .to_string(),
    );
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
            "consumer_cpu_ns": s.consumer_cpu_ns, "consumer_cpu_ns_per_record": per_record(s),
        })
    };
    Ok(Part {
        key: "ring",
        tables: vec![t],
        json: json!({
            "ring_bytes": ring_bytes,
            "steps": steps.iter().map(step_json).collect::<Vec<_>>(),
            "highest_rate_without_drops_per_s": best,
            "ring_total_at_highest_rate_per_s": best_ring_total,
            "limited_by": limited_by,
            "producers": producers(),
            "generator": "zero-page read faults, one memcg:count_memcg_events record each",
            "consumer_realtime": realtime,
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
