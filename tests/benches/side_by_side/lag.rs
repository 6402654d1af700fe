//! Part 1: detection lag by source, on one storm.
//!
//! A test memory cgroup (v1, 96 MiB limit) goes through pressure episodes: a holder crosses
//! the 64 MiB threshold and stays above it, a reader streams a file through the rest (page
//! cache thrash: reclaim stalls, PSI), and hogs are OOM-killed one after another. Every source
//! listens to the same episodes at once:
//!
//! - eBPF ring buffer, memcg threshold eventfd, PSI trigger: the sense layer's own lag for
//!   each event, split where the source allows: kernel → wake (the kernel's
//!   `bpf_ktime_get_ns()` to the ring-buffer reader's wake-up, eBPF only) and wake → taken
//!   (the source task's wake-up to the consumer taking the event, every kernel source), and
//!   for eBPF the whole kernel → taken;
//! - polling at 1 s and at 10 s (the kubelet's housekeeping): a tick reads the cgroup's usage
//!   as the kubelet reads its stats; the lag is from the threshold crossing (the memcg
//!   eventfd's wake-up) to the first tick that read usage above the threshold. An episode
//!   lasts until both pollers have seen it, as pressure lasts until someone acts.
//!
//! The sense layer runs as deployed: its threads on `SCHED_FIFO` 10 (`realtimePriority`),
//! the workload on normal scheduling. The console log level is left as found (it is the
//! operator's) and stated in the notes; the `console` part measures what it does.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reactor::config::Config;
use reactor::sense::{monotonic_ns, Kind, MemcgTarget, Received, Sense, SenseOptions, Source};
use reactor_tests::{memhog_bin, TestMemcg};
use serde_json::json;

use crate::opts::Opts;
use crate::report::{ratio, ratio_json, Dist, Part, Table};

const MI: u64 = 1 << 20;
/// The storm's memcg limit.
pub const LIMIT: u64 = 96 * MI;
/// The threshold the memcg eventfd and the pollers watch.
pub const THRESHOLD: u64 = 64 * MI;
/// What the holder keeps, MiB: above the threshold, with room below the limit for the
/// reader and each hog to start.
pub const HOLD_MIB: &str = "72";

/// One poller's readings: (monotonic ns, usage bytes).
type Readings = Arc<Mutex<Vec<(u64, u64)>>>;

/// A pressure episode as the workload ran it.
pub struct Episode {
    start_ns: u64,
    /// When the workload itself first read usage above the threshold (a fallback origin).
    seen_by_workload_ns: u64,
    end_ns: u64,
    oom_rounds: usize,
    /// Times the holder itself was OOM-killed (a hog starting while the last one was still
    /// being torn down) and started again.
    holder_restarts: usize,
}

pub fn usage(cg: &TestMemcg) -> u64 {
    std::fs::read_to_string(cg.path.join("memory.usage_in_bytes"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// A 64 MiB file whose page cache is dropped, so reading it charges the reader's cgroup.
pub fn working_set_file(dir: &std::path::Path) -> Result<std::path::PathBuf> {
    let path = dir.join("working-set.bin");
    let mut f = std::fs::File::create(&path).context("creating the working-set file")?;
    let chunk = vec![7u8; MI as usize];
    for _ in 0..64 {
        f.write_all(&chunk)?;
    }
    f.sync_all()?;
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)
        .context("dropping the file's page cache")?;
    Ok(path)
}

/// Starts a sense layer with only the housekeeping tick at `interval`; every tick reads the
/// cgroup's usage, and `seen` keeps the time of the last reading above the threshold.
fn poller(
    interval: Duration,
    usage_file: std::path::PathBuf,
    stop: Arc<AtomicBool>,
) -> Result<(tokio::task::JoinHandle<()>, Readings, Arc<AtomicU64>)> {
    let mut o = SenseOptions::from_config(&Config::default(), Vec::new());
    o.ebpf = false;
    o.psi = false;
    o.memcg = false;
    o.poll = true;
    o.poll_interval = interval;
    let mut sense = Sense::start(&o).context("starting a poll-only sense layer")?;
    let readings: Readings = Arc::default();
    let seen = Arc::new(AtomicU64::new(0));
    let (r, s) = (readings.clone(), seen.clone());
    let task = tokio::spawn(async move {
        while !stop.load(Ordering::SeqCst) {
            let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(200), sense.next()).await
            else {
                continue;
            };
            if ev.event.kind != Kind::Tick {
                continue;
            }
            let u = std::fs::read_to_string(&usage_file)
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
                .unwrap_or(0);
            let now = monotonic_ns();
            if let Ok(mut v) = r.lock() {
                v.push((now, u));
            }
            if u >= THRESHOLD {
                s.store(now, Ordering::SeqCst);
            }
        }
        sense.shutdown().await;
    });
    Ok((task, readings, seen))
}

/// Starts the holder: the first child of every episode.
pub fn spawn_holder(cg: &mut TestMemcg) -> Result<()> {
    cg.spawn(
        Command::new(memhog_bin())
            .args([HOLD_MIB, "0", "3600"])
            .stdout(Stdio::null()),
    )
    .context("starting the holder")?;
    Ok(())
}

/// Starts the page-cache reader (a willing OOM victim); returns its index among the
/// cgroup's children.
pub fn spawn_reader(cg: &mut TestMemcg, file: &std::path::Path) -> Result<usize> {
    let index = cg.wait_all(Duration::ZERO).len();
    let script = format!(
        "echo 1000 > /proc/self/oom_score_adj && while :; do cat '{}' > /dev/null; done",
        file.display()
    );
    cg.spawn(
        Command::new("sh")
            .args(["-c", &script])
            .stderr(Stdio::null()),
    )
    .context("starting the reader")?;
    Ok(index)
}

/// How long an episode of the storm lasts.
pub enum Until {
    /// Until both pollers have seen it (their last sighting after the episode's start).
    Seen([Arc<AtomicU64>; 2]),
    /// A fixed number of hog rounds.
    Rounds(usize),
}

impl Until {
    fn done(&self, start_ns: u64, rounds: usize) -> bool {
        match self {
            Until::Seen(seen) => seen.iter().all(|s| s.load(Ordering::SeqCst) > start_ns),
            Until::Rounds(n) => rounds >= *n,
        }
    }
}

/// The storm: `episodes` episodes, each held `until` says so (or `cap`).
pub fn storm(
    cg: &mut TestMemcg,
    file: &std::path::Path,
    episodes: usize,
    cap: Duration,
    until: Until,
) -> Result<Vec<Episode>> {
    let mut out = Vec::new();
    for _ in 0..episodes {
        let start_ns = monotonic_ns();
        spawn_holder(cg)?;
        let t = Instant::now();
        while usage(cg) < THRESHOLD {
            if t.elapsed() > Duration::from_secs(10) {
                bail!("the holder never crossed the threshold");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let seen_by_workload_ns = monotonic_ns();
        let mut reader = spawn_reader(cg, file)?;
        // OOM rounds until both pollers saw the episode. The hog and the reader volunteer as
        // OOM victims (oom_score_adj 1000), so the holder keeps usage above the threshold.
        let mut oom_rounds = 0;
        let mut holder_restarts = 0;
        let began = Instant::now();
        while began.elapsed() < cap && !until.done(start_ns, oom_rounds) {
            let status = cg.wait_all(Duration::ZERO);
            if status.first().is_some_and(Option::is_some) {
                // The holder (always the first child of the episode) was killed after all.
                holder_restarts += 1;
                cg.kill_all();
                spawn_holder(cg)?;
                reader = spawn_reader(cg, file)?;
            } else if status.get(reader).is_some_and(Option::is_some) {
                reader = spawn_reader(cg, file)?;
            }
            hog_until_killed(cg, &|| false)?;
            oom_rounds += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        let end_ns = monotonic_ns();
        cg.kill_all();
        // Drop the page cache the reader left charged, so the next episode crosses again.
        let _ = std::fs::write(cg.path.join("memory.force_empty"), "0");
        let t = Instant::now();
        while usage(cg) >= THRESHOLD / 2 && t.elapsed() < Duration::from_secs(5) {
            let _ = std::fs::write(cg.path.join("memory.force_empty"), "0");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        out.push(Episode {
            start_ns,
            seen_by_workload_ns,
            end_ns,
            oom_rounds,
            holder_restarts,
        });
    }
    Ok(out)
}

/// Run part 1.
pub fn run(opts: &Opts) -> Result<Part> {
    let episodes_wanted = if opts.quick { 1 } else { 10 };
    // The 10 s poller sees an episode within one interval; the cap only bounds a broken run.
    let cap = Duration::from_secs(13);
    let mut cg = TestMemcg::new("bench-lag", LIMIT).context("creating the test memcg")?;
    let dir = tempfile::tempdir_in("/var/tmp").context("temp dir on disk")?;
    let file = working_set_file(dir.path())?;
    let (rt, realtime) = deployed_runtime()?;
    let console = console_level();
    let cgroup = cg.cgroup.clone();
    let usage_file = cg.path.join("memory.usage_in_bytes");

    let (events, episodes) = rt.block_on(async {
        let o = storm_sense_options(&cgroup);
        let sense = Sense::start(&o).context("starting the sense layer")?;
        for s in [Source::Ebpf, Source::Psi, Source::MemcgThreshold] {
            if !sense.report().has(s) {
                let why: Vec<String> = sense
                    .report()
                    .missing
                    .iter()
                    .map(|m| format!("{}: {}", m.source, m.reason))
                    .collect();
                bail!("source {s} did not attach: {}", why.join("; "));
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (p1, r1, s1) = poller(Duration::from_secs(1), usage_file.clone(), stop.clone())?;
        let (p10, r10, s10) = poller(Duration::from_secs(10), usage_file.clone(), stop.clone())?;
        let collector = collect(sense, stop.clone());
        let path = file.clone();
        let workload = tokio::task::spawn_blocking(move || {
            let r = storm(&mut cg, &path, episodes_wanted, cap, Until::Seen([s1, s10]));
            drop(cg); // kills what is left, removes the cgroup
            r
        });
        let episodes = workload.await.context("the storm thread")?;
        stop.store(true, Ordering::SeqCst);
        let events = collector.await.context("the event collector")?;
        let _ = p1.await;
        let _ = p10.await;
        let episodes = episodes?;
        let readings = [
            r1.lock().map(|v| v.clone()).unwrap_or_default(),
            r10.lock().map(|v| v.clone()).unwrap_or_default(),
        ];
        Ok::<_, anyhow::Error>(((events, readings), episodes))
    })?;
    let (events, readings) = events;
    Ok(summarise(
        &cgroup,
        &events,
        &readings,
        &episodes,
        opts.quick,
        (realtime, console),
    ))
}

/// The `realtimePriority` the shipped systemd unit's configuration gives the agent.
pub const REALTIME_PRIORITY: u8 = 10;

/// The runtime a modelled node runs on as `reactor run` runs the agent with
/// `realtimePriority: 10`: normal scheduling for the pod manager and the process runtime (as
/// the pods are), the caller then puts the loop on a thread of its own at `SCHED_FIFO`
/// ([`REALTIME_PRIORITY`] through `Node::loop_thread`). The flag says whether the kernel
/// allows `SCHED_FIFO` (asked on a throwaway thread, so no thread here keeps it). A node on a
/// [`deployed_runtime`] instead has its runtime work at `SCHED_FIFO` too, which held a
/// victim's exit off a CPU during its teardown.
pub fn node_runtime() -> Result<(tokio::runtime::Runtime, bool)> {
    let realtime =
        std::thread::spawn(|| reactor::priority::set_realtime(REALTIME_PRIORITY).is_ok())
            .join()
            .unwrap_or(false);
    let _ = reactor::priority::set_normal();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    Ok((rt, realtime))
}

/// The `Node::loop_thread` of a node on [`node_runtime`]: the loop's own thread at
/// [`REALTIME_PRIORITY`] where the kernel allows it, else at normal scheduling.
pub fn node_loop_thread(realtime: bool) -> Option<u8> {
    Some(if realtime { REALTIME_PRIORITY } else { 0 })
}

/// The table note saying how a node on [`node_runtime`] was scheduled.
pub fn node_scheduling_note(realtime: bool) -> String {
    if realtime {
        format!(
            "the loop on a thread of its own at SCHED_FIFO {REALTIME_PRIORITY} \
             (realtimePriority, as deploy/ configures the agent); the pod manager, the runtime \
             and the pods at normal scheduling"
        )
    } else {
        "the loop's thread on normal scheduling (SCHED_FIFO refused)".to_string()
    }
}

/// A runtime whose threads run as the deployed agent's do (`SCHED_FIFO` 10, reset on fork
/// so the workload stays on normal scheduling); also puts the calling thread there. The
/// flag says whether the kernel allowed it.
pub fn deployed_runtime() -> Result<(tokio::runtime::Runtime, bool)> {
    let realtime = reactor::priority::set_realtime(REALTIME_PRIORITY).is_ok();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(|| {
            let _ = reactor::priority::set_realtime(REALTIME_PRIORITY);
        })
        .build()?;
    Ok((rt, realtime))
}

/// The console log level now (the first field of `/proc/sys/kernel/printk`).
pub fn console_level() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/printk")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The sense options of a storm's listeners: `cgroup` watched with [`THRESHOLD`], no
/// polling by the sense layer (the pollers, where there are any, are the bench's own).
pub fn storm_sense_options(cgroup: &str) -> SenseOptions {
    let mut o = SenseOptions::from_config(
        &Config::default(),
        vec![MemcgTarget {
            cgroup: cgroup.to_string(),
            threshold_bytes: Some(THRESHOLD),
        }],
    );
    o.poll = false;
    o
}

/// Takes every event `sense` delivers until `stop` is set, then shuts it down: the storm's
/// event collector, returning what it took.
pub fn collect(mut sense: Sense, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<Received>> {
    tokio::spawn(async move {
        let mut got: Vec<Received> = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            if let Ok(Some(r)) =
                tokio::time::timeout(Duration::from_millis(200), sense.next()).await
            {
                got.push(r);
            }
        }
        sense.shutdown().await;
        got
    })
}

/// The eBPF events of `cgroup` in `events` (drop reports left out).
pub fn ebpf_of<'a>(events: &'a [Received], cgroup: &'a str) -> impl Iterator<Item = &'a Received> {
    events.iter().filter(move |r| {
        r.event.source == Source::Ebpf
            && !matches!(r.event.kind, Kind::Dropped { .. })
            && r.event.cgroup.as_deref() == Some(cgroup)
    })
}

/// Kernel → wake of eBPF events: the reader's wake-up minus the kernel's timestamp.
pub fn kernel_to_wake<'a>(events: impl Iterator<Item = &'a Received>) -> Vec<u64> {
    events
        .filter_map(|r| r.event.woke_ns.map(|w| w.saturating_sub(r.event.at_ns)))
        .collect()
}

/// Wake → taken of events that carry a wake-up time.
pub fn wake_to_taken<'a>(events: impl Iterator<Item = &'a Received>) -> Vec<u64> {
    events.filter_map(|r| r.wake_lag_ns).collect()
}

fn summarise(
    cgroup: &str,
    events: &[Received],
    readings: &[Vec<(u64, u64)>; 2],
    episodes: &[Episode],
    quick: bool,
    (realtime, console): (bool, Option<u32>),
) -> Part {
    let ours = |r: &&Received| r.event.cgroup.as_deref() == Some(cgroup);
    let ebpf: Vec<u64> = ebpf_of(events, cgroup).map(|r| r.lag_ns).collect();
    let ebpf_k2w = kernel_to_wake(ebpf_of(events, cgroup));
    let ebpf_w2t = wake_to_taken(ebpf_of(events, cgroup));
    let memcg_events = || {
        events
            .iter()
            .filter(|r| r.event.source == Source::MemcgThreshold)
            .filter(ours)
    };
    let memcg: Vec<u64> = memcg_events().map(|r| r.lag_ns).collect();
    let memcg_w2t = wake_to_taken(memcg_events());
    let psi_events = || events.iter().filter(|r| r.event.source == Source::Psi);
    let psi: Vec<u64> = psi_events().map(|r| r.lag_ns).collect();
    let psi_w2t = wake_to_taken(psi_events());
    let ebpf_ooms = events
        .iter()
        .filter(ours)
        .filter(|r| r.event.source == Source::Ebpf && matches!(r.event.kind, Kind::OomKill { .. }))
        .count();
    // Each episode's crossing: the memcg eventfd's wake-up on the way up, else the
    // workload's own reading.
    let mut from_eventfd = 0;
    let crossings: Vec<u64> = episodes
        .iter()
        .map(|e| {
            let up = events.iter().find(|r| {
                r.event.source == Source::MemcgThreshold
                    && r.event.cgroup.as_deref() == Some(cgroup)
                    && r.event.at_ns >= e.start_ns
                    && r.event.at_ns <= e.end_ns
                    && matches!(r.event.kind, Kind::ThresholdCrossed { usage_bytes, .. }
                        if usage_bytes.is_none_or(|u| u >= THRESHOLD))
            });
            match up {
                Some(r) => {
                    from_eventfd += 1;
                    r.event.at_ns
                }
                None => e.seen_by_workload_ns,
            }
        })
        .collect();
    let mut poll_lags: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
    let mut missed = [0usize; 2];
    for (i, r) in readings.iter().enumerate() {
        for (e, &c) in episodes.iter().zip(&crossings) {
            match r
                .iter()
                .find(|&&(t, u)| t >= c && t <= e.end_ns && u >= THRESHOLD)
            {
                Some(&(t, _)) => poll_lags[i].push(t - c),
                None => missed[i] += 1,
            }
        }
    }
    // (source, measured, distribution, missed episodes, kernel → wake, wake → taken)
    let wake_base = Dist::of(&ebpf_w2t);
    let dists = [
        (
            "eBPF ring buffer",
            "kernel timestamp → taken",
            Dist::of(&ebpf),
            None,
            Some(Dist::of(&ebpf_k2w)),
            Some(wake_base),
        ),
        (
            "memcg threshold eventfd",
            "wake → taken",
            Dist::of(&memcg),
            None,
            None,
            Some(Dist::of(&memcg_w2t)),
        ),
        (
            "PSI trigger",
            "wake → taken",
            Dist::of(&psi),
            None,
            None,
            Some(Dist::of(&psi_w2t)),
        ),
        (
            "poll 1 s",
            "crossing → tick that saw it",
            Dist::of(&poll_lags[0]),
            Some(missed[0]),
            None,
            None,
        ),
        (
            "poll 10 s (kubelet)",
            "crossing → tick that saw it",
            Dist::of(&poll_lags[1]),
            Some(missed[1]),
            None,
            None,
        ),
    ];
    let base = dists[0].2;
    let mut t = Table::new(
        "1. Detection lag by source, same storm",
        &[
            "source",
            "measured",
            "n",
            "p50",
            "p99",
            "max",
            "p50 ×eBPF",
            "p99 ×eBPF",
            "max ×eBPF",
        ],
    )
    .text_columns(2);
    // A row's figures and its ratios to `against` (`-` without one).
    let cells = |name: String, what: &str, n: String, d: &Dist, against: Option<&Dist>| {
        let v = |d: &Dist, f: fn(&Dist) -> u64| (d.n > 0).then(|| f(d));
        let r = |f: fn(&Dist) -> u64| match against {
            Some(a) => ratio(v(d, f), v(a, f)),
            None => "-".to_string(),
        };
        vec![
            name,
            what.to_string(),
            n,
            d.p50_text(),
            d.p99_text(),
            d.max_text(),
            r(|d| d.p50),
            r(|d| d.p99),
            r(|d| d.max),
        ]
    };
    let mut rows_json = Vec::new();
    for (name, what, d, miss, k2w, w2t) in &dists {
        let n = match miss {
            Some(m) if *m > 0 => format!("{} ({m} missed)", d.n),
            _ => d.n.to_string(),
        };
        // memcg and PSI rows are wake → taken: compared with eBPF's wake → taken (like with
        // like); eBPF's and the polls' whole lag with eBPF's kernel → taken.
        let against = if *what == "wake → taken" {
            &wake_base
        } else {
            &base
        };
        t.row(cells(name.to_string(), what, n, d, Some(against)));
        if let (Some(k2w), Some(w2t)) = (k2w, w2t) {
            t.row(cells(
                format!("{name}, split"),
                "kernel timestamp → wake",
                k2w.n.to_string(),
                k2w,
                None,
            ));
            t.row(cells(
                format!("{name}, split"),
                "wake → taken",
                w2t.n.to_string(),
                w2t,
                Some(&wake_base),
            ));
        }
        let v = |d: &Dist, f: fn(&Dist) -> u64| (d.n > 0).then(|| f(d));
        rows_json.push(json!({
            "source": name, "measured": what, "lag": d.json(), "missed_episodes": miss,
            "kernel_to_wake": k2w.map(|p| p.json()),
            "wake_to_taken": w2t.map(|p| p.json()),
            "ratio_to_ebpf": {
                "p50": ratio_json(v(d, |d| d.p50), v(against, |d| d.p50)),
                "p99": ratio_json(v(d, |d| d.p99), v(against, |d| d.p99)),
                "max": ratio_json(v(d, |d| d.max), v(against, |d| d.max)),
            },
        }));
    }
    let oom_rounds: usize = episodes.iter().map(|e| e.oom_rounds).sum();
    let restarts: usize = episodes.iter().map(|e| e.holder_restarts).sum();
    t.note(format!(
        "{} pressure episodes in a 96 MiB v1 memcg (threshold 64 MiB): holder above the \
         threshold, page-cache thrash, {oom_rounds} hog rounds ({ebpf_ooms} OOM kills seen by \
         eBPF; the holder itself killed {restarts} times); each episode held until both pollers saw \
         it{}",
        episodes.len(),
        if quick { " (--quick)" } else { "" }
    ));
    t.note(
        "eBPF/memcg/PSI: lag of every event of the storm as the sense layer measures it. eBPF \
         from the kernel's own timestamp, split at the ring-buffer reader's wake-up (the start \
         of the pass that took the record, or the record's own time if it was written during \
         that pass); memcg and PSI have no kernel timestamp, so their lag is wake → taken \
         only (and PSI fires only once stall time fills its threshold within the 2 s window). \
         Wake → taken rows are compared with eBPF's wake → taken; PSI is node-wide"
            .to_string(),
    );
    t.note(format!(
        "sense layer threads {}; console log level {} (as found: the operator's setting; the \
         kernel prints each OOM kill at error level, on the console when the level is above 3)",
        if realtime {
            format!(
                "SCHED_FIFO {REALTIME_PRIORITY} (realtimePriority, as deployed); workload normal"
            )
        } else {
            "on normal scheduling (SCHED_FIFO refused)".to_string()
        },
        console.map_or_else(|| "unknown".to_string(), |l| l.to_string())
    ));
    t.note(format!(
        "polls: from the threshold crossing (memcg eventfd wake-up, {from_eventfd}/{} \
         episodes; else the workload's own reading) to the first tick that read usage above \
         the threshold, one sample per episode",
        episodes.len()
    ));
    // Every source's distribution, thinned, for the CDF chart (`charts.rs`).
    let cdf: Vec<_> = [&ebpf, &memcg, &psi, &poll_lags[0], &poll_lags[1]]
        .iter()
        .zip(&dists)
        .map(|(v, d)| json!({"source": d.0, "points": crate::charts::cdf_points(v)}))
        .collect();
    let samples = base.n + dists[1].2.n + poll_lags[0].len();
    Part {
        key: "lag",
        tables: vec![t],
        json: json!({
            "episodes": episodes.len(), "hog_rounds": oom_rounds, "ebpf_oom_kills": ebpf_ooms,
            "holder_restarts": restarts,
            "limit_bytes": LIMIT, "threshold_bytes": THRESHOLD, "sources": rows_json,
            "cdf": cdf,
            "sense_realtime": realtime, "console_loglevel": console,
        }),
        samples,
    }
}

/// Starts a 256 MiB hog (the OOM killer's first choice, `oom_score_adj` 1000) in `cg` and
/// waits until it is gone, at most 5 s or until `stop` says so.
pub fn hog_until_killed(cg: &mut TestMemcg, stop: &dyn Fn() -> bool) -> Result<()> {
    let before = cg.wait_all(Duration::ZERO).len();
    let hog = format!(
        "echo 1000 > /proc/self/oom_score_adj && exec '{}' 256 0 60",
        memhog_bin().display()
    );
    cg.spawn(Command::new("sh").args(["-c", &hog]).stdout(Stdio::null()))
        .context("starting a hog")?;
    let t = Instant::now();
    while cg
        .wait_all(Duration::ZERO)
        .get(before)
        .is_some_and(Option::is_none)
        && t.elapsed() < Duration::from_secs(5)
        && !stop()
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}
