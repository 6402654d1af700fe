//! Part 8: concurrent pressure (issue 23). Evictions that overlap: the loop must keep
//! observing and deciding while an eviction is in flight, a hard threshold must not wait
//! behind a soft eviction's grace period, a victim that will not die must not leave the
//! node unguarded, and page cache turning into working set must not go unseen. Four
//! scenarios on the OOM part's modelled 512 MiB node
//! ([`reactor_tests::node`], kubepods limited to it, every pod BestEffort, the hogs growing at
//! 200 MiB/s — the 10 MiB per 50 ms, paced per 1 MiB chunk — toward 600 MiB):
//!
//! - **soft then hard**: `allocatableMemory.available` hard 100Mi, soft 300Mi with a 1 s
//!   grace, `evictionMaxPodGracePeriod` 60. Pod A (terminationGracePeriodSeconds 60, SIGTERM
//!   blocked so it dies only by SIGKILL) holds 230 MiB: the soft threshold is met and the
//!   loop starts A's graceful eviction. Once A's SIGTERM is pending (read from
//!   `/proc/<pid>/status`), hog B starts.
//! - **two hogs** started 100 ms apart (hard threshold only).
//! - **frozen victim**: pod F holds 230 MiB and is frozen in a v1 freezer cgroup under the
//!   node's own root, so its SIGKILL cannot complete (its anonymous memory is still reaped
//!   by the eviction's `process_mrelease`); then a hog starts (hard threshold only).
//! - **activation burst** (issue 42): pod C (a memhog holding 1 MiB) has a 200 MiB file in
//!   page cache, filled from its container's memory cgroup ([`page_cache::fill`]: written
//!   to `/var/tmp`, its cache dropped and read once: inactive file pages); hog H starts,
//!   and once H's pod cgroup has charged 100 MiB (its usage read every ms) C reads the file
//!   twice from the same cgroup (`dd` processes in C's container cgroup), which moves its
//!   pages to the active list:
//!   kubepods' working set grows by 200 MiB with no change of usage, so a threshold armed on
//!   usage alone, or a tripwire placed for the page cache before it, cannot see it; H's
//!   growth then crosses the level (hard threshold only). Its crossing is clocked on the
//!   working set (part 2's [`Basis::WorkingSet`]: H's own usage plus kubepods' working set
//!   without it before H, plus C's active file pages the reads added, read right after
//!   them).
//!
//! The allocatable signal is the one the bench's node can use: `memory.available` is read
//! on the machine's root cgroup, whose usage the modelled 512 MiB node does not bound.
//!
//! Each scenario runs for the agent's loop and for a "kubelet-like" loop
//! ([`ReactorSettings::serial_evictions`]: wait for each eviction to finish and its memory to
//! come back before the next pass), every source on in both, the two modes taking turns
//! repetition by repetition as in part 2, each repetition with a loop of its own. Per
//! repetition the bench records, by its own 2 ms watch and not by the loop's records,
//! whether the kernel OOM killer fired (the pods' memcg `oom_kill` counters) before any pod
//! the agent evicted was released (its pod cgroup empty), the time from the hard threshold's
//! crossing by the hogs' own clock (part 2's [`Clock`]: the earliest crossing among the
//! hogs' progress records) to that release, and which pods the loop evicted, with what
//! grace. A repetition ends when every hog has ended (evicted or OOM-killed; each grows past
//! the node) or after 20 s; what still runs then is killed by the bench.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reactor::act::cgroups::CgroupPath;
use reactor::act::runtime::{RestartPolicy, Runtime};
use reactor::reactor::{Action, Decision, ReactorSettings};
use reactor::sense::monotonic_ns;
use reactor_tests::freezer::Freezer;
use reactor_tests::node::{Node, NodeSpec, MI};
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use crate::lag::node_runtime;
use crate::oom::{start_mode_with, Basis, Clock, HOG_MI, MODES};
use crate::opts::Opts;
use crate::page_cache::{self, CacheFile, MemStat};
use crate::report::{Dist, Part, Table};

const CAPACITY_MI: u64 = 512;
const HARD_MI: u64 = 100;
/// The hogs' rate, MiB/s: 10 MiB per 50 ms.
const RATE: u64 = 200;
/// What pods A and F hold, MiB.
const HOLD_MI: u64 = 230;
/// A's `terminationGracePeriodSeconds` and the node's `evictionMaxPodGracePeriod`.
const GRACE_S: i64 = 60;
/// How far before the clock's crossing a release may come and still be taken as the
/// answer to it (an early kill, as in part 2); further, the records missed the crossing.
const EARLY_NS: i64 = 50_000_000;
/// How long a repetition watches at most once its hogs started.
const WATCH: Duration = Duration::from_secs(20);
/// The activation burst's file, MiB, and how far the hog has grown when C reads it, MiB.
/// A timer from the hog's spawn started the reads anywhere from 100 to 300 MiB into its
/// growth (the spawn returns when the pod runs, not when it starts to grow): past about
/// 200 MiB the activation itself crosses the level.
const ACTIVATED_MI: u64 = 200;
const READ_AT_MI: u64 = 100;
/// How long C waits for the hog to reach [`READ_AT_MI`] before it gives up on the reads.
const READ_WAIT: Duration = Duration::from_secs(10);

/// The scenarios.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scenario {
    SoftThenHard,
    TwoHogs,
    Frozen,
    ActivationBurst,
}

const SCENARIOS: [Scenario; 4] = [
    Scenario::SoftThenHard,
    Scenario::TwoHogs,
    Scenario::Frozen,
    Scenario::ActivationBurst,
];

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::SoftThenHard => "soft then hard",
            Scenario::TwoHogs => "two hogs 100 ms apart",
            Scenario::Frozen => "frozen victim + hog",
            Scenario::ActivationBurst => "activation burst: 200 MiB of cache activated + hog",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Scenario::SoftThenHard => "soft_then_hard",
            Scenario::TwoHogs => "two_hogs",
            Scenario::Frozen => "frozen_victim",
            Scenario::ActivationBurst => "activation_burst",
        }
    }

    fn spec(self) -> NodeSpec {
        let soft: &'static [(&str, &str, &str)] = match self {
            Scenario::SoftThenHard => &[("allocatableMemory.available", "300Mi", "1s")],
            _ => &[],
        };
        NodeSpec {
            name: match self {
                Scenario::SoftThenHard => "bench-soft-hard",
                Scenario::TwoHogs => "bench-two-hogs",
                Scenario::Frozen => "bench-frozen",
                Scenario::ActivationBurst => "bench-activation",
            },
            capacity_mi: CAPACITY_MI,
            hard: &[("allocatableMemory.available", "100Mi")],
            soft,
            min_reclaim: &[],
            transition: Duration::from_secs(2),
            ebpf: true,
            deferred: true,
        }
    }
}

/// A loop mode: the agent's, or one that waits for each eviction as the kubelet does.
struct LoopMode {
    name: &'static str,
    serial: bool,
}

const LOOP_MODES: [LoopMode; 2] = [
    LoopMode {
        name: "agent",
        serial: false,
    },
    LoopMode {
        name: "kubelet-like",
        serial: true,
    },
];

/// One pod of a repetition, as the bench watches it.
struct Pod {
    role: &'static str,
    uid: String,
    /// A hog: the repetition ends when every hog has ended.
    hog: bool,
    cgroup: CgroupPath,
    container: CgroupPath,
    oom0: u64,
    /// When the bench first saw its memcg `oom_kill` counter move, CLOCK_MONOTONIC ns.
    oom_at: Option<u64>,
    /// When the bench first saw its pod cgroup empty or gone.
    gone_at: Option<u64>,
}

impl Pod {
    fn new(role: &'static str, uid: String, hog: bool) -> Result<Pod> {
        let cgroup = CgroupPath::pod(Some("besteffort"), &uid).context("a pod cgroup")?;
        let container = cgroup.join("app").context("a container cgroup")?;
        Ok(Pod {
            role,
            uid,
            hog,
            cgroup,
            container,
            oom0: 0,
            oom_at: None,
            gone_at: None,
        })
    }

    fn watch(&mut self, node: &Node, now: u64) {
        if self.oom_at.is_none() && node.cgroups.oom_kills(&self.container).unwrap_or(0) > self.oom0
        {
            self.oom_at = Some(now);
        }
        if self.gone_at.is_none()
            && (!node.cgroups.exists(&self.cgroup)
                || node.cgroups.is_empty(&self.cgroup).unwrap_or(false))
        {
            self.gone_at = Some(now);
        }
    }
}

/// What one repetition came to.
#[derive(Default)]
struct Rep {
    oom_first: bool,
    /// The roles whose memcg counted a kernel OOM kill during the watch.
    oom_killed: Vec<&'static str>,
    /// The roles the loop evicted, with the grace it gave (`None`: an eviction status with
    /// no decision record).
    evicted: Vec<(&'static str, Option<i64>)>,
    /// The first pod the loop evicted whose cgroup emptied after the hogs started, and when
    /// against the crossing.
    released: Option<&'static str>,
    crossing_to_released_ns: Option<u64>,
    /// The same, signed: below 0 the release came before the clock's crossing (the
    /// figure above reads 0 then).
    released_after_crossing_ns: Option<i64>,
    /// Soft then hard: A's SIGTERM pending → B started, or why B started without it.
    soft_started: Option<bool>,
    /// Why there is no crossing, if there is none.
    no_crossing: Option<&'static str>,
    /// The hogs still running when the watch ended (killed by the bench).
    left_running: Vec<&'static str>,
    seconds: f64,
    /// Activation burst: C's pod cgroup before the reads and just after them, and how long
    /// the two reads took (or why they failed).
    activation: Option<Activation>,
}

/// The activation burst's two reads under way ([`ReadsDone`]).
type ActivationReads = tokio::task::JoinHandle<Result<ReadsDone>>;

/// What the activation burst's reads came to.
struct ReadsDone {
    /// How long the two reads took.
    took: Duration,
    /// C's pod cgroup just after them.
    after: MemStat,
    /// When they began and ended (CLOCK_MONOTONIC ns), and H's pod cgroup usage when they
    /// began.
    began: u64,
    ended: u64,
    hog_usage_at_start: u64,
}

/// What the activation burst's two reads did.
struct Activation {
    before: MemStat,
    after: Option<MemStat>,
    reads: Result<Duration, String>,
    /// The reads' end against the clock's crossing, signed, ns.
    ended_after_crossing_ns: Option<i64>,
    /// The clock's working set without H (C's activated pages added) and kubepods' usage
    /// and inactive file pages when it was armed, bytes.
    clock_armed_at: Option<(u64, u64, u64)>,
    /// When the reads began after H's spawn, ns, with H's usage then.
    began_after_hog_ns: Option<u64>,
    hog_usage_at_start: Option<u64>,
    ended_at: Option<u64>,
}

impl Activation {
    /// C's active file pages the reads added, bytes.
    fn activated(&self) -> Option<u64> {
        self.after
            .map(|a| a.active_file.saturating_sub(self.before.active_file))
    }

    fn json(&self) -> Value {
        json!({
            "c_pod_before_reads": self.before.json(),
            "c_pod_after_reads": self.after.map(|a| a.json()),
            "activated_bytes": self.activated(),
            "reads_seconds": self.reads.as_ref().ok().map(Duration::as_secs_f64),
            "reads_error": self.reads.as_ref().err(),
            "reads_ended_after_crossing_ns": self.ended_after_crossing_ns,
            "reads_began_after_hog_spawn_ns": self.began_after_hog_ns,
            "clock_working_set_without_hog_bytes": self.clock_armed_at.map(|c| c.0),
            "kubepods_when_clock_armed": self.clock_armed_at.map(|c| json!({
                "usage_bytes": c.1, "inactive_file_bytes": c.2,
            })),
            "hog_usage_when_reads_began_bytes": self.hog_usage_at_start,
        })
    }
}

/// Whether process `pid` has SIGTERM pending (blocked by `MEMHOG_BLOCK_TERM`).
fn term_pending(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .filter(|l| l.starts_with("ShdPnd:") || l.starts_with("SigPnd:"))
        .filter_map(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok())
        .any(|mask| mask & (1 << (15 - 1)) != 0)
}

/// The first process of a pod's container (memhog is the container's process).
fn pid_of(node: &Node, pod: &Pod) -> Result<u32> {
    let pids = node.cgroups.procs(&pod.container)?;
    pids.first()
        .copied()
        .with_context(|| format!("pod {} has no process", pod.role))
}

/// Runs a BestEffort memhog pod with `args` and `env`.
async fn run_pod(node: &Node, pod: &Pod, args: &[&str], env: &[(&str, &str)]) {
    node.run_env(
        &pod.uid,
        Some("besteffort"),
        json!({}),
        args,
        env,
        RestartPolicy::Never,
    )
    .await;
}

/// Starts a hog with its progress record armed on the hard threshold.
async fn run_hog(node: &Node, pod: &Pod, clock: &Clock) -> Result<()> {
    let env = clock.hog_env()?;
    let env = env.each_ref().map(|(k, v)| (*k, v.as_str()));
    run_pod(node, pod, &[&HOG_MI.to_string(), &RATE.to_string()], &env).await;
    Ok(())
}

/// Arms a hog's clock and starts the hog beside `holder`, the pod already holding memory;
/// returns when the hog started.
async fn add_hog(
    node: &Node,
    holder: Pod,
    role: &'static str,
    uid: String,
    pods: &mut Vec<Pod>,
    clocks: &mut Vec<Clock>,
) -> Result<u64> {
    let hog = Pod::new(role, uid, true)?;
    let clock = Clock::arm(node, &hog.uid, CAPACITY_MI - HARD_MI)?;
    pods.push(holder);
    let started = monotonic_ns();
    run_hog(node, &hog, &clock).await?;
    pods.push(hog);
    clocks.push(clock);
    Ok(started)
}

async fn repetition(
    node: &mut Node,
    scenario: Scenario,
    serial: bool,
    freezer: Option<&Freezer>,
    tag: &str,
) -> Result<Rep> {
    let started = Instant::now();
    start_mode_with(node, &MODES[0], |s: &mut ReactorSettings| {
        s.serial_evictions = serial;
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut rep = Rep::default();
    let mut pods: Vec<Pod> = Vec::new();
    let mut clocks: Vec<Clock> = Vec::new();
    let level_mi = CAPACITY_MI - HARD_MI;
    let hogs_started;
    // Activation burst: C's file (removed, its cache with it, before the node settles) and
    // the reads under way with C's pod cgroup before them.
    let mut cache_file: Option<CacheFile> = None;
    let mut reads: Option<(ActivationReads, MemStat)> = None;
    match scenario {
        Scenario::SoftThenHard => {
            let a = Pod::new("A", format!("a-{tag}"), false)?;
            run_pod(
                node,
                &a,
                &[&HOLD_MI.to_string(), "0"],
                &[("MEMHOG_BLOCK_TERM", "1")],
            )
            .await;
            node.set_termination_grace(&a.uid, GRACE_S);
            node.wait_usage(&a.uid, Some("besteffort"), HOLD_MI * MI)
                .await;
            let pid = pid_of(node, &a)?;
            let t = Instant::now();
            while !term_pending(pid) && t.elapsed() < Duration::from_secs(10) {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            rep.soft_started = Some(term_pending(pid));
            hogs_started =
                add_hog(node, a, "B", format!("b-{tag}"), &mut pods, &mut clocks).await?;
        }
        Scenario::TwoHogs => {
            let h1 = Pod::new("H1", format!("h1-{tag}"), true)?;
            let h2 = Pod::new("H2", format!("h2-{tag}"), true)?;
            let c1 = Clock::arm(node, &h1.uid, level_mi)?;
            let c2 = Clock::arm(node, &h2.uid, level_mi)?;
            hogs_started = monotonic_ns();
            run_hog(node, &h1, &c1).await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
            run_hog(node, &h2, &c2).await?;
            pods.extend([h1, h2]);
            clocks.extend([c1, c2]);
        }
        Scenario::Frozen => {
            let freezer = freezer.context("the frozen scenario needs its freezer cgroup")?;
            let f = Pod::new("F", format!("f-{tag}"), false)?;
            run_pod(node, &f, &[&HOLD_MI.to_string(), "0"], &[]).await;
            node.wait_usage(&f.uid, Some("besteffort"), HOLD_MI * MI)
                .await;
            freezer.add(pid_of(node, &f)?)?;
            if !freezer.freeze(Duration::from_secs(10))? {
                bail!("pod F did not freeze within 10 s");
            }
            hogs_started =
                add_hog(node, f, "H", format!("h-{tag}"), &mut pods, &mut clocks).await?;
        }
        Scenario::ActivationBurst => {
            let c = Pod::new("C", format!("c-{tag}"), false)?;
            run_pod(node, &c, &["1", "0"], &[]).await;
            node.wait_usage(&c.uid, Some("besteffort"), MI).await;
            let memory = std::path::Path::new(reactor_tests::MEMCG_V1_ROOT).join(&node.root.name);
            let (c_pod, c_app) = (c.cgroup.under(&memory), c.container.under(&memory));
            let file = page_cache::fill(&c_app, ACTIVATED_MI * MI)?;
            let before = page_cache::stat(&c_pod)?;
            // kubepods' statistics hold C's cache before the clock reads them.
            page_cache::settled(&memory.join("kubepods"), &c_pod)?;
            let hog = Pod::new("H", format!("h-{tag}"), true)?;
            let clock = Clock::arm_on(node, &hog.uid, level_mi, Basis::WorkingSet)?;
            // The two reads once H has grown READ_AT_MI, on a blocking thread beside the
            // watch (started before H, so H's start cannot delay it); C's pod cgroup is read
            // again as soon as they end.
            let h_usage = hog.cgroup.under(&memory).join("memory.usage_in_bytes");
            let path = file.path.clone();
            let task = tokio::task::spawn_blocking(move || {
                let deadline = Instant::now() + READ_WAIT;
                let hog_usage_at_start = loop {
                    let usage = std::fs::read_to_string(&h_usage)
                        .ok()
                        .and_then(|t| t.trim().parse::<u64>().ok())
                        .unwrap_or(0);
                    if usage >= READ_AT_MI * MI {
                        break usage;
                    }
                    if Instant::now() > deadline {
                        bail!("H's pod cgroup never reached {READ_AT_MI} MiB: no reads");
                    }
                    std::thread::sleep(Duration::from_millis(1));
                };
                let began = monotonic_ns();
                let took = page_cache::read(&c_app, &path)? + page_cache::read(&c_app, &path)?;
                let ended = monotonic_ns();
                Ok(ReadsDone {
                    took,
                    after: page_cache::stat(&c_pod)?,
                    began,
                    ended,
                    hog_usage_at_start,
                })
            });
            reads = Some((task, before));
            cache_file = Some(file);
            pods.push(c);
            hogs_started = monotonic_ns();
            run_hog(node, &hog, &clock).await?;
            pods.push(hog);
            clocks.push(clock);
        }
    }
    for p in &mut pods {
        p.oom0 = node.cgroups.oom_kills(&p.container).unwrap_or(0);
    }

    // The watch: every 2 ms each pod's OOM counter and cgroup; the loop's records as they
    // come.
    let mut decisions: Vec<Decision> = Vec::new();
    let deadline = tokio::time::Instant::now() + WATCH;
    let mut settle: Option<tokio::time::Instant> = None;
    loop {
        let lp = node.lp();
        tokio::select! {
            d = lp.decisions.recv() => match d {
                Ok(d) => decisions.push(d),
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => break,
            },
            () = tokio::time::sleep(Duration::from_millis(2)) => {
                let now = monotonic_ns();
                for p in &mut pods {
                    p.watch(node, now);
                }
                // Once every hog has ended, a moment more for the loop's records.
                if settle.is_none() && pods.iter().filter(|p| p.hog).all(|p| p.gone_at.is_some()) {
                    settle = Some(tokio::time::Instant::now() + Duration::from_millis(300));
                }
                if settle.is_some_and(|s| tokio::time::Instant::now() >= s) {
                    break;
                }
            },
            () = tokio::time::sleep_until(deadline) => break,
        }
    }
    let watch_end = monotonic_ns();
    if let Some((task, before)) = reads.take() {
        let (reads, done) = match task.await {
            Ok(Ok(done)) => (Ok(done.took), Some(done)),
            Ok(Err(e)) => (Err(format!("{e:#}")), None),
            Err(e) => (Err(format!("the activation reads' task: {e}")), None),
        };
        let after = done.as_ref().map(|d| d.after);
        // C's pages the reads activated joined the working set H's record cannot see.
        if let (Some(after), Some(clock)) = (after, clocks.first_mut()) {
            clock.add_working_set(after.active_file.saturating_sub(before.active_file));
        }
        rep.activation = Some(Activation {
            before,
            after,
            reads,
            ended_after_crossing_ns: None,
            clock_armed_at: clocks.first().map(Clock::armed_at),
            began_after_hog_ns: done.as_ref().map(|d| d.began.saturating_sub(hogs_started)),
            hog_usage_at_start: done.as_ref().map(|d| d.hog_usage_at_start),
            ended_at: done.as_ref().map(|d| d.ended),
        });
    }
    rep.left_running = pods
        .iter()
        .filter(|p| p.hog && p.gone_at.is_none())
        .map(|p| p.role)
        .collect();

    // Clean up: thaw, kill what is left by pid (a graceful stop in flight then ends, and the
    // loop with it), stop and forget every pod, then the loop's last records.
    if let Some(f) = freezer {
        let _ = f.set("THAWED");
    }
    for p in &pods {
        for pid in node.cgroups.procs_recursive(&p.cgroup).unwrap_or_default() {
            if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
    for p in &pods {
        let _ = node.runtime.stop_pod(&p.uid, Duration::ZERO).await;
        node.pods.remove(&p.uid);
    }
    decisions.extend(node.stop_loop_draining().await);
    for p in &pods {
        let _ = node.cgroups.remove(&p.cgroup, Duration::from_secs(2));
    }
    // C's cache was reparented to kubepods with its cgroup: removing the file frees it.
    drop(cache_file);
    let statuses = node.pods.evictions();

    // What the repetition came to.
    let role = |uid: &str| pods.iter().find(|p| p.uid == uid).map(|p| p.role);
    for d in &decisions {
        if let Action::Evicted {
            uid, grace_seconds, ..
        } = &d.action
        {
            if let Some(r) = role(uid) {
                rep.evicted.push((r, Some(*grace_seconds)));
            }
        }
    }
    for p in &pods {
        if statuses.contains_key(&p.uid) && !rep.evicted.iter().any(|(r, _)| *r == p.role) {
            rep.evicted.push((p.role, None));
        }
    }
    rep.oom_killed = pods
        .iter()
        .filter(|p| p.oom_at.is_some())
        .map(|p| p.role)
        .collect();
    let first_release = pods
        .iter()
        .filter(|p| rep.evicted.iter().any(|(r, _)| *r == p.role))
        .filter_map(|p| p.gone_at.map(|g| (g, p.role)))
        .filter(|&(g, _)| g >= hogs_started && g <= watch_end)
        .min();
    let oom_at = pods.iter().filter_map(|p| p.oom_at).min();
    rep.oom_first = oom_at.is_some_and(|o| first_release.is_none_or(|(r, _)| o <= r));
    rep.released = first_release.map(|(_, r)| r);
    let mut crossing: Option<u64> = None;
    for c in &clocks {
        let (at, clock_rep) = c.read();
        match at {
            Some(at) => crossing = Some(crossing.map_or(at, |x: u64| x.min(at))),
            None => rep.no_crossing = rep.no_crossing.or(clock_rep.none),
        }
    }
    if crossing.is_some() {
        rep.no_crossing = None;
    }
    if let (Some(a), Some(c)) = (rep.activation.as_mut(), crossing) {
        // Two CLOCK_MONOTONIC times: their difference fits an i64.
        a.ended_after_crossing_ns = a.ended_at.map(|e| e.wrapping_sub(c) as i64);
    }
    if let (Some(c), Some((r, _))) = (crossing, first_release) {
        // Two CLOCK_MONOTONIC times: their difference fits an i64.
        let after = r.wrapping_sub(c) as i64;
        rep.released_after_crossing_ns = Some(after);
        // A release far before the crossing means the records missed the first crossing
        // (seen with two hogs: the first hog killed inside its crossing piece, the other's
        // record then placing the later, second crossing): no figure rather than a wrong one.
        if after >= -EARLY_NS {
            rep.crossing_to_released_ns = Some(r.saturating_sub(c));
        } else {
            rep.no_crossing = Some("the records missed the first crossing");
        }
    }

    // The node back to empty for the next repetition.
    let t = Instant::now();
    while node.usage(&CgroupPath::kubepods()) > 32 * MI && t.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    rep.seconds = started.elapsed().as_secs_f64();
    Ok(rep)
}

/// Run part 8.
pub fn run(opts: &Opts) -> Result<Part> {
    let reps = opts
        .concurrent_reps
        .unwrap_or(if opts.quick { 1 } else { 10 });
    // As `reactor run` runs the agent: the loop on its own `SCHED_FIFO` thread, the rest at
    // normal scheduling (see `node_runtime`).
    let (rt, realtime) = node_runtime()?;
    let mut rows: Vec<(Scenario, &'static str, Vec<Rep>)> = Vec::new();
    for scenario in SCENARIOS {
        if scenario == Scenario::Frozen && !Freezer::available() {
            bail!("the frozen-victim scenario needs the v1 freezer at /sys/fs/cgroup/freezer");
        }
        let mut by_mode: Vec<Vec<Rep>> = LOOP_MODES.iter().map(|_| Vec::new()).collect();
        rt.block_on(async {
            let mut node = Node::start(scenario.spec()).await;
            node.config.eviction_max_pod_grace_period = GRACE_S;
            node.loop_thread = crate::lag::node_loop_thread(realtime);
            let freezer = match scenario {
                Scenario::Frozen => Some(Freezer::new(&node.root.name)?),
                _ => None,
            };
            let mut result = Ok(());
            'reps: for rep in 0..reps {
                // The modes take turns, the first one alternating from round to round.
                for k in 0..LOOP_MODES.len() {
                    let mi = (k + rep) % LOOP_MODES.len();
                    let tag = format!("{rep}-{mi}");
                    let r = repetition(
                        &mut node,
                        scenario,
                        LOOP_MODES[mi].serial,
                        freezer.as_ref(),
                        &tag,
                    )
                    .await;
                    node.stop_loop().await;
                    match r {
                        Ok(r) => by_mode[mi].push(r),
                        Err(e) => {
                            result = Err(e.context(format!(
                                "{} {} repetition {rep}",
                                scenario.name(),
                                LOOP_MODES[mi].name
                            )));
                            break 'reps;
                        }
                    }
                }
            }
            drop(freezer);
            node.finish().await;
            result
        })?;
        for (m, reps) in LOOP_MODES.iter().zip(by_mode) {
            eprintln!(
                "bench: concurrent {} {}: OOM killer first in {} of {}",
                scenario.name(),
                m.name,
                reps.iter().filter(|r| r.oom_first).count(),
                reps.len()
            );
            rows.push((scenario, m.name, reps));
        }
    }
    Ok(summarise(&rows, reps, realtime))
}

/// `role (grace) count` for every eviction of the repetitions, e.g. `A (60 s) 10, B (0 s) 3`.
fn evictions_text(reps: &[Rep]) -> String {
    let mut counts: BTreeMap<(&str, Option<i64>), usize> = BTreeMap::new();
    for (role, grace) in reps.iter().flat_map(|r| &r.evicted) {
        *counts.entry((role, *grace)).or_default() += 1;
    }
    if counts.is_empty() {
        return "none".into();
    }
    counts
        .iter()
        .map(|((role, grace), n)| match grace {
            Some(g) => format!("{role} ({g} s) {n}"),
            None => format!("{role} (no record) {n}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn roles_text(roles: impl Iterator<Item = &'static str>) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for r in roles {
        *counts.entry(r).or_default() += 1;
    }
    if counts.is_empty() {
        return "-".into();
    }
    counts
        .iter()
        .map(|(r, n)| format!("{r} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn summarise(rows: &[(Scenario, &'static str, Vec<Rep>)], reps: usize, realtime: bool) -> Part {
    let mut t = Table::new(
        "8. Concurrent pressure: overlapping evictions on a 512 MiB node, allocatableMemory.available<100Mi",
        &[
            "scenario",
            "loop",
            "OOM killer first",
            "OOM-killed",
            "crossing→released p50",
            "crossing→released p99",
            "evicted (grace)",
            "first released",
        ],
    )
    .text_columns(2);
    let mut out: BTreeMap<&str, Value> = BTreeMap::new();
    let mut samples = 0;
    for (scenario, mode, rs) in rows {
        let n = rs.len();
        samples += n;
        let oom = rs.iter().filter(|r| r.oom_first).count();
        let release = Dist::of(
            &rs.iter()
                .filter_map(|r| r.crossing_to_released_ns)
                .collect::<Vec<_>>(),
        );
        t.row(vec![
            scenario.name().to_string(),
            mode.to_string(),
            format!("{oom}/{n}"),
            roles_text(rs.iter().flat_map(|r| r.oom_killed.iter().copied())),
            release.p50_text(),
            release.p99_text(),
            evictions_text(rs),
            roles_text(rs.iter().filter_map(|r| r.released)),
        ]);
        let entry = out
            .entry(scenario.key())
            .or_insert_with(|| json!({"name": scenario.name(), "modes": {}}));
        entry["modes"][*mode] = json!({
            "repetitions": n,
            "oom_killer_first": oom,
            "crossing_to_released": release.json(),
            "repetition_detail": rs.iter().map(|r| json!({
                "oom_killer_first": r.oom_first,
                "oom_killed": r.oom_killed,
                "evicted": r.evicted.iter().map(|(role, g)| json!({"pod": role, "grace_seconds": g})).collect::<Vec<_>>(),
                "first_released": r.released,
                "crossing_to_released_ns": r.crossing_to_released_ns,
                "released_after_crossing_ns": r.released_after_crossing_ns,
                "no_crossing": r.no_crossing,
                "soft_eviction_started_before_hog": r.soft_started,
                "hogs_left_running": r.left_running,
                "seconds": r.seconds,
                "activation": r.activation.as_ref().map(Activation::json),
            })).collect::<Vec<_>>(),
        });
    }
    let no_soft = rows
        .iter()
        .flat_map(|(_, _, rs)| rs)
        .filter(|r| r.soft_started == Some(false))
        .count();
    let left = rows
        .iter()
        .flat_map(|(_, _, rs)| rs)
        .filter(|r| !r.left_running.is_empty())
        .count();
    let early = rows
        .iter()
        .flat_map(|(_, _, rs)| rs)
        .filter(|r| r.released_after_crossing_ns.is_some_and(|d| d < 0))
        .count();
    let uncrossed = rows
        .iter()
        .flat_map(|(_, _, rs)| rs)
        .filter(|r| r.no_crossing.is_some())
        .count();
    t.note(format!(
        "{reps} repetitions per scenario and loop, the two loops taking turns; every pod \
         BestEffort, hogs growing at {RATE} MiB/s (10 MiB per 50 ms, in 1 MiB chunks) toward \
         {HOG_MI} MiB with restartPolicy Never; every source on; agent: the loop as it is, \
         kubelet-like: serialEvictions (wait for each eviction to finish and its memory to \
         come back before the next pass)"
    ));
    t.note(format!(
        "soft then hard: soft allocatableMemory.available<300Mi (grace 1 s), \
         evictionMaxPodGracePeriod {GRACE_S}; A holds {HOLD_MI} MiB with \
         terminationGracePeriodSeconds {GRACE_S} and SIGTERM blocked; B starts once A's \
         SIGTERM is pending ({no_soft} repetitions saw no SIGTERM within 10 s and started B \
         anyway). two hogs: H1, then H2 100 ms later. frozen victim: F holds {HOLD_MI} MiB \
         in a v1 freezer cgroup, frozen before hog H starts (its memory can still be reaped \
         by process_mrelease, its exit cannot run)"
    ));
    t.note(format!(
        "OOM killer first: a pod's memcg oom_kill counter moved before any pod the loop \
         evicted had its cgroup empty (or with none), by the bench's own 2 ms watch; \
         OOM-killed: per pod, repetitions with a kernel OOM kill in it; crossing→released: \
         kubepods' working set passing {} MiB by the hogs' own clock (part 2's) → the first \
         evicted pod's cgroup empty after the hogs started; evicted: the loop's eviction \
         records by pod and grace (a record that comes only after the bench killed what was \
         left is counted too); {uncrossed} repetitions had no crossing placed (with two hogs, the first hog killed \
         inside its crossing piece leaves the records only the second crossing: a release \
         over 50 ms before the clock's crossing is not timed); {early} releases came before \
         the clock's crossing (those within 50 ms read 0); {left} ended at the \
         {} s bound with a hog still running (killed by the bench)",
        CAPACITY_MI - HARD_MI,
        WATCH.as_secs()
    ));
    let activations: Vec<&Activation> = rows
        .iter()
        .flat_map(|(_, _, rs)| rs)
        .filter_map(|r| r.activation.as_ref())
        .collect();
    if !activations.is_empty() {
        let activated: Vec<u64> = activations.iter().filter_map(|a| a.activated()).collect();
        let failed = activations.iter().filter(|a| a.reads.is_err()).count();
        let after_crossing = activations
            .iter()
            .filter(|a| a.ended_after_crossing_ns.is_some_and(|d| d > 0))
            .count();
        let mib =
            |b: Option<&u64>| b.map_or("-".into(), |b| format!("{:.0}", *b as f64 / MI as f64));
        t.note(format!(
            "activation burst: C holds 1 MiB and a {ACTIVATED_MI} MiB file filled from its \
             container's memory cgroup (written to /var/tmp with dd conv=fsync, its cache \
             dropped and read once: inactive file pages); H starts, and once H's pod cgroup has \
             charged {READ_AT_MI} MiB C reads the file twice from the same cgroup, moving it to \
             the active list ({}–{} MiB of C's file pages activated over the repetitions, read \
             right after the reads), so kubepods' working set grows with no change of usage; \
             its clock is H's own usage plus kubepods' working set without H before it plus \
             what the reads activated; {after_crossing} repetitions' reads ended after the \
             clock's crossing (the activation itself then crossed, and the clock placed the \
             crossing early, where H alone would have met the level with the activation done), \
             {failed} repetitions' reads failed or did not run",
            mib(activated.iter().min()),
            mib(activated.iter().max()),
        ));
    }
    t.note(crate::lag::node_scheduling_note(realtime));
    Part {
        key: "concurrent",
        tables: vec![t],
        json: json!({
            "capacity_mib": CAPACITY_MI,
            "hard_threshold": "allocatableMemory.available<100Mi",
            "soft_threshold": "allocatableMemory.available<300Mi (soft then hard only), grace 1s",
            "max_pod_grace_period_seconds": GRACE_S,
            "hog_rate_mib_s": RATE,
            "repetitions": reps,
            "scenarios": out,
        }),
        samples,
    }
}
