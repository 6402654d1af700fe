//! Part 5: the agent's footprint. The release `reactor run` with every sense source on
//! (eBPF, PSI, memcg notification, the 10 s tick), a test cgroup root and its own state dir
//! and socket, as the CLI tests start it: resident memory and CPU over an idle window, then
//! over a window of memory storm in a test memory cgroup (holder, page-cache thrash, hogs
//! OOM-killed one after another), whose events the agent takes, counts and logs.
//!
//! CPU is the on-CPU time of every agent thread (`/proc/<pid>/task/*/schedstat`) over the
//! window; RSS is `VmRSS` sampled every 250 ms, and the peak is `VmHWM`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reactor_tests::agent::TestAgent;
use reactor_tests::TestMemcg;
use serde_json::json;

use crate::report::{Part, Table};
use crate::Opts;

const MI: u64 = 1 << 20;

/// Sum of every thread's on-CPU nanoseconds.
fn cpu_ns(pid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    dir.flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

/// A `/proc/<pid>/status` field in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// One window's figures.
struct Window {
    secs: f64,
    cpu_percent: f64,
    rss_avg_kib: u64,
    rss_max_kib: u64,
    events: usize,
}

fn pressure_events(agent: &TestAgent) -> usize {
    agent.log().matches("pressure event").count()
}

fn measure(agent: &TestAgent, length: Duration) -> Result<Window> {
    let pid = agent.pid();
    let events0 = pressure_events(agent);
    let cpu0 = cpu_ns(pid);
    let t = Instant::now();
    let mut rss = Vec::new();
    while t.elapsed() < length {
        let r = status_kib(pid, "VmRSS:");
        if r == 0 {
            bail!("the agent is gone: {}", agent.log());
        }
        rss.push(r);
        std::thread::sleep(Duration::from_millis(250));
    }
    let secs = t.elapsed().as_secs_f64();
    let cpu = cpu_ns(pid).saturating_sub(cpu0);
    Ok(Window {
        secs,
        cpu_percent: cpu as f64 / 1e9 / secs * 100.0,
        rss_avg_kib: rss.iter().sum::<u64>() / rss.len().max(1) as u64,
        rss_max_kib: rss.iter().copied().max().unwrap_or(0),
        events: pressure_events(agent).saturating_sub(events0),
    })
}

/// Holder above most of the limit, a reader thrashing the page cache, and hogs OOM-killed
/// one after another, until `stop`.
fn storm(cg: &mut TestMemcg, file: &std::path::Path, stop: &AtomicBool) -> Result<usize> {
    crate::lag::spawn_holder(cg)?;
    crate::lag::spawn_reader(cg, file)?;
    let mut rounds = 0;
    while !stop.load(Ordering::SeqCst) {
        crate::lag::hog_until_killed(cg, &|| stop.load(Ordering::SeqCst))?;
        rounds += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(rounds)
}

/// Run part 5.
pub fn run(opts: &Opts) -> Result<Part> {
    let length = Duration::from_secs(if opts.quick { 5 } else { 20 });
    let agent = TestAgent::start_sensing(
        "bench-footprint",
        "sense:\n  ebpf: true\n  psi: true\n  memcgThreshold: true\n  poll: true\n",
        "realtimePriority: 10\n",
    );
    // Let it settle (programs attached, first tick done).
    std::thread::sleep(Duration::from_secs(2));
    let idle = measure(&agent, length)?;

    let mut cg = TestMemcg::new("bench-footprint-storm", 96 * MI).context("storm memcg")?;
    let dir = tempfile::tempdir_in("/var/tmp").context("temp dir on disk")?;
    let file = crate::lag::working_set_file(dir.path())?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let storm_thread = std::thread::spawn(move || {
        let r = storm(&mut cg, &file, &flag);
        drop(cg);
        r
    });
    std::thread::sleep(Duration::from_millis(500));
    let busy = measure(&agent, length);
    stop.store(true, Ordering::SeqCst);
    let rounds = match storm_thread.join() {
        Ok(r) => r?,
        Err(_) => bail!("the storm thread panicked"),
    };
    let busy = busy?;
    let hwm = status_kib(agent.pid(), "VmHWM:");
    drop(agent);

    let mut t = Table::new(
        "5. Footprint of `reactor run` (release, every source on)",
        &[
            "window",
            "length",
            "CPU",
            "RSS avg",
            "RSS max",
            "pressure events taken",
        ],
    );
    let mib = |kib: u64| format!("{:.1} MiB", kib as f64 / 1024.0);
    for (name, w) in [("idle", &idle), ("storm", &busy)] {
        t.row(vec![
            name.to_string(),
            format!("{:.0} s", w.secs),
            format!("{:.2}%", w.cpu_percent),
            mib(w.rss_avg_kib),
            mib(w.rss_max_kib),
            format!("{} ({:.0}/s)", w.events, w.events as f64 / w.secs),
        ]);
    }
    t.note(format!(
        "peak RSS (VmHWM) {}; storm: {rounds} hog rounds in a 96 MiB memcg with page-cache \
         thrash; CPU is % of one core",
        mib(hwm)
    ));
    let wj = |w: &Window| {
        json!({
            "seconds": w.secs, "cpu_percent_of_one_core": w.cpu_percent,
            "rss_avg_bytes": w.rss_avg_kib * 1024, "rss_max_bytes": w.rss_max_kib * 1024,
            "pressure_events": w.events,
        })
    };
    Ok(Part {
        key: "footprint",
        tables: vec![t],
        json: json!({
            "idle": wj(&idle), "storm": wj(&busy), "storm_hog_rounds": rounds,
            "peak_rss_bytes": hwm * 1024,
        }),
        samples: usize::from(idle.rss_max_kib > 0) + usize::from(busy.rss_max_kib > 0),
    })
}
