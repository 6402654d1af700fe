//! Part 5: the agent's footprint. The release `reactor run` with every sense source on
//! (eBPF, PSI, memcg notification, the 10 s tick), a test cgroup root and its own state dir
//! and socket, as the CLI tests start it: resident memory and CPU over an idle window, then
//! over a window of memory storm in a test memory cgroup (holder, page-cache thrash, hogs
//! OOM-killed one after another), whose events the agent takes, counts and logs.
//!
//! CPU is the on-CPU time of every agent thread (`/proc/<pid>/task/*/schedstat`) over the
//! window; RSS is `VmRSS` sampled every 250 ms, and the peak is `VmHWM`.
//!
//! The machine is shared, so each window also says what the events were (source, kind and
//! cgroup of each `pressure event` line) and how long the node's tasks stalled on memory in
//! it (`/proc/pressure/memory` totals): node-wide PSI triggers (5 ms of stall in a 2 s window)
//! fire on any memory stall on the node, the agent's own cgroups or not, and each one is a
//! logged event and a pass of the loop, so an "idle" window with events and a stall figure
//! beside them measured other work on the machine, not an idle agent. (The kernel updates
//! those totals every 2 s, so the stall figure is the window's give or take 2 s.)

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reactor_tests::agent::TestAgent;
use reactor_tests::TestMemcg;
use serde_json::json;

use crate::opts::Opts;
use crate::report::{Part, Table};

const MI: u64 = 1 << 20;

/// Every sense source on (eBPF, PSI, the memcg notification, the tick): the agent as the
/// footprint and the real-program parts run it.
pub(crate) const SENSE_ALL: &str =
    "sense:\n  ebpf: true\n  psi: true\n  memcgThreshold: true\n  poll: true\n";

/// Sum of every thread's on-CPU nanoseconds (`/proc/<pid>/task/*/schedstat`, the scheduler's
/// own account, ns); 0 for a process that cannot be read.
pub(crate) fn cpu_ns(pid: u32) -> u64 {
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
pub(crate) fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The node's memory stall totals in microseconds (`some`, `full`), from
/// `/proc/pressure/memory`; zeros without PSI.
fn node_stall_us() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/pressure/memory").unwrap_or_default();
    let total = |level: &str| {
        text.lines()
            .find(|l| l.starts_with(level))
            .and_then(|l| l.rsplit("total=").next())
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (total("some "), total("full "))
}

/// One window's figures.
struct Window {
    secs: f64,
    cpu_percent: f64,
    rss_avg_kib: u64,
    rss_max_kib: u64,
    events: usize,
    /// `source kind cgroup` of each event line → how many.
    by_kind: BTreeMap<String, usize>,
    /// The node's memory stall in the window, µs (`some`, `full`).
    stall_us: (u64, u64),
}

/// `source kind cgroup` of one `pressure event` log line (plain format): the kind's leading
/// words (`psi-trigger some`, `oom-kill`), not its figures.
fn event_key(line: &str) -> String {
    let field = |name: &str| {
        line.split_once(&format!(" {name}="))
            .map(|(_, rest)| rest.trim_start_matches('"'))
            .map(|rest| rest.split(['"', ' ']).next().unwrap_or("").to_string())
            .unwrap_or_else(|| "?".into())
    };
    let kind = line
        .split_once(" kind=")
        .map(|(_, rest)| {
            rest.split(' ')
                .take_while(|w| !w.contains('='))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| "?".into());
    format!("{} {kind} {}", field("source"), field("cgroup"))
}

/// The `pressure event` lines of the agent's log after byte `from`, counted by
/// [`event_key`]; and the log's length.
fn pressure_events(agent: &TestAgent, from: usize) -> (BTreeMap<String, usize>, usize) {
    let log = agent.log();
    let mut by_kind = BTreeMap::new();
    for line in log.get(from..).unwrap_or("").lines() {
        if line.contains("pressure event ") {
            *by_kind.entry(event_key(line)).or_insert(0) += 1;
        }
    }
    (by_kind, log.len())
}

fn measure(agent: &TestAgent, length: Duration) -> Result<Window> {
    let pid = agent.pid();
    let (_, log0) = pressure_events(agent, 0);
    let stall0 = node_stall_us();
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
    let stall1 = node_stall_us();
    let (by_kind, _) = pressure_events(agent, log0);
    Ok(Window {
        secs,
        cpu_percent: cpu as f64 / 1e9 / secs * 100.0,
        rss_avg_kib: rss.iter().sum::<u64>() / rss.len().max(1) as u64,
        rss_max_kib: rss.iter().copied().max().unwrap_or(0),
        events: by_kind.values().sum(),
        by_kind,
        stall_us: (
            stall1.0.saturating_sub(stall0.0),
            stall1.1.saturating_sub(stall0.1),
        ),
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
    let agent = TestAgent::start_sensing("bench-footprint", SENSE_ALL, "realtimePriority: 10\n");
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
    for (name, w) in [("idle", &idle), ("storm", &busy)] {
        let events = if w.by_kind.is_empty() {
            "none".to_string()
        } else {
            w.by_kind
                .iter()
                .map(|(k, n)| format!("{k} ×{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        t.note(format!(
            "{name}: node memory stall in the window (/proc/pressure/memory) some {:.1} ms, \
             full {:.1} ms; events (source kind cgroup): {events}",
            w.stall_us.0 as f64 / 1e3,
            w.stall_us.1 as f64 / 1e3,
        ));
    }
    let wj = |w: &Window| {
        json!({
            "seconds": w.secs, "cpu_percent_of_one_core": w.cpu_percent,
            "rss_avg_bytes": w.rss_avg_kib * 1024, "rss_max_bytes": w.rss_max_kib * 1024,
            "pressure_events": w.events, "pressure_events_by_kind": w.by_kind,
            "node_memory_stall_some_us": w.stall_us.0, "node_memory_stall_full_us": w.stall_us.1,
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
