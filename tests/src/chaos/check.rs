//! The invariants of a chaos run, checked from what the node and the agent show: the pods'
//! cgroups, `pod ls`, the event stream, the state files and the agent's `/proc` entry. Each
//! check counts how often it ran; a failed check is a violation (the run fails), except the
//! kernel OOM kills that happen where the thresholds cannot catch the pressure, which are
//! counted as exceptions with their cause (docs/reliability.md defines both).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::schedule::PodPlan;

/// Counts of checks, exceptions and the violations found.
#[derive(Default, Debug)]
pub struct Tally {
    /// How many times each invariant was checked.
    pub checks: BTreeMap<&'static str, u64>,
    /// Kernel OOM kills excused, by cause.
    pub exceptions: BTreeMap<String, u64>,
    /// What failed, one line each.
    pub violations: Vec<String>,
}

impl Tally {
    /// Counts one check of `name` and records a violation when `ok` is false.
    pub fn check(&mut self, name: &'static str, ok: bool, what: impl FnOnce() -> String) {
        *self.checks.entry(name).or_default() += 1;
        if !ok {
            self.violations.push(format!("{name}: {}", what()));
        }
    }
}

/// What the run knows of one pod it applied.
pub struct Tracked {
    /// Its plan.
    pub plan: PodPlan,
    /// The uid the agent gave it (None: the apply failed or was refused).
    pub uid: Option<String>,
    /// Its pod cgroup below the agent's root (`/kubepods/besteffort/pod<uid>`).
    pub cgroup: Option<String>,
    /// When it was applied.
    pub applied: Instant,
    /// When the run first saw it ended (phase Failed or Succeeded) or removed it.
    pub ended: Option<Instant>,
    /// The run removed it (`pod rm`): it may vanish from `pod ls`.
    pub removed: bool,
    /// Eviction events seen for it (an escalation of a graceful one not counted).
    pub evictions: u32,
    /// The grace its eviction gave (0 once escalated).
    pub eviction_grace: Option<i64>,
    /// Its container's restart count when it was evicted.
    pub restarts_at_eviction: Option<u64>,
    /// Its processes are frozen by the run until then (and may not die before).
    pub frozen_until: Option<Instant>,
}

impl Tracked {
    /// The full name `chaos/<name>`.
    pub fn full(&self) -> String {
        format!("chaos/{}", self.plan.name())
    }
}

/// Every pid in a cgroup directory and the directories below it.
pub fn pids_below(dir: &Path) -> Vec<u32> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        out.extend(
            std::fs::read_to_string(d.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse::<u32>().ok()),
        );
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    out
}

/// Pod cgroups (memory hierarchy) below `kubepods` that hold processes, by uid.
pub fn busy_pods(kubepods: &Path) -> BTreeMap<String, Vec<u32>> {
    let mut out = BTreeMap::new();
    for tier in ["", "burstable", "besteffort"] {
        for e in std::fs::read_dir(kubepods.join(tier))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(uid) = name.strip_prefix("pod") else {
                continue;
            };
            let pids = pids_below(&e.path());
            if !pids.is_empty() {
                out.insert(uid.to_string(), pids);
            }
        }
    }
    out
}

/// Every container memcg below `kubepods` (the directories two levels below a pod
/// cgroup's tier), for the OOM watch.
pub fn container_memcgs(kubepods: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for tier in ["", "burstable", "besteffort"] {
        for pod in std::fs::read_dir(kubepods.join(tier))
            .into_iter()
            .flatten()
            .flatten()
        {
            if !pod.file_name().to_string_lossy().starts_with("pod") {
                continue;
            }
            out.push(pod.path());
            for c in std::fs::read_dir(pod.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if c.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push(c.path());
                }
            }
        }
    }
    out
}

/// The kernel's OOM kills of processes in that very memcg: v1 `memory.oom_control`'s
/// `oom_kill`, or v2 `memory.events.local`'s (`memory.events` counts the cgroups below too,
/// and a kill would be counted at the pod and at its container). `v2` says which: the watch
/// reads every container's every 5 ms, so it opens the one file that exists.
pub fn oom_kills(dir: &Path, v2: bool) -> Option<u64> {
    let file = if v2 {
        "memory.events.local"
    } else {
        "memory.oom_control"
    };
    let text = std::fs::read_to_string(dir.join(file)).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

/// `VmRSS` of a process in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// The pods a `pods.json` checkpoint holds: uid → phase. Read as plain JSON, never through
/// the agent's loader (which sets damaged files aside: the run must only look).
pub fn checkpoint_pods(state_dir: &Path) -> Option<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(state_dir.join("pods.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    Some(
        v["data"]
            .as_array()?
            .iter()
            .filter_map(|p| {
                Some((
                    p["uid"].as_str()?.to_string(),
                    p["phase"].as_str().unwrap_or("").to_string(),
                ))
            })
            .collect(),
    )
}

/// A `pod ls --json` row's uid → phase.
pub fn listed_phases(pods: &[Value]) -> BTreeMap<String, String> {
    pods.iter()
        .filter_map(|p| {
            Some((
                p["uid"].as_str()?.to_string(),
                p["phase"].as_str().unwrap_or("").to_string(),
            ))
        })
        .collect()
}

/// Whether a `pod ls` row has ended.
pub fn ended(p: &Value) -> bool {
    matches!(p["phase"].as_str(), Some("Failed" | "Succeeded"))
}

/// The rows of `pod ls` that rank before `victim` for `signal` by a relation that holds
/// whatever the exact usages are (the kubelet's orders: memory by exceeds-request, then
/// priority, then usage above request; pids by priority, then count; disk by
/// exceeds-request, then priority, then usage, and under the process runtime no pod has a
/// known disk usage). Only a running, non-critical pod whose own eviction has not been
/// announced can rank before anyone. It does when its priority is lower and, for memory, it
/// is BestEffort with memory in use (it exceeds its request of 0, so it is in the first
/// group whatever the victim is); for a Guaranteed victim under memory pressure, any
/// BestEffort pod with memory in use does (a Guaranteed pod cannot exceed its request).
/// For pids and disk a lower priority is enough.
pub fn ranks_before<'a>(
    victim: &Value,
    signal: &str,
    snapshot: &'a [Value],
    evicting: &BTreeSet<String>,
) -> Vec<&'a Value> {
    let vp = victim["priority"].as_i64().unwrap_or(0);
    let memory = signal.starts_with("memory") || signal.starts_with("allocatableMemory");
    snapshot
        .iter()
        .filter(|q| q["uid"] != victim["uid"] && q["phase"] == "Running")
        .filter(|q| q["reason"].as_str().unwrap_or("").is_empty())
        .filter(|q| !evicting.contains(q["uid"].as_str().unwrap_or("")))
        .filter(|q| q["priority"].as_i64().unwrap_or(0) < 2_000_000_000)
        .filter(|q| {
            let lower = q["priority"].as_i64().unwrap_or(0) < vp;
            let besteffort_in_use =
                q["qos"] == "BestEffort" && q["memoryWorkingSetBytes"].as_u64().unwrap_or(0) > 0;
            if memory {
                besteffort_in_use && (lower || victim["qos"] == "Guaranteed")
            } else {
                lower
            }
        })
        .collect()
}

/// Windows in which a kernel OOM kill is outside what the thresholds promise, with the
/// cause each gives.
#[derive(Default)]
pub struct Excuses {
    /// The agent was not running or had just started (SIGKILL until 2 s after its socket
    /// answered again).
    pub agent_down: Vec<(Instant, Option<Instant>)>,
}

impl Excuses {
    /// Why an OOM kill seen at `at` is excused, or `None` when it is a violation.
    pub fn cause(&self, at: Instant, pods: &[Tracked], ramp_limit_mib_s: u64) -> Option<String> {
        let settle = Duration::from_secs(2);
        if self
            .agent_down
            .iter()
            .any(|(from, to)| at >= *from && to.is_none_or(|t| at <= t + settle))
        {
            return Some("agent down or restarting".into());
        }
        if pods
            .iter()
            .any(|p| p.frozen_until.is_some_and(|u| at <= u + settle))
        {
            return Some("a frozen pod (its memory cannot come back)".into());
        }
        let rate: u64 = pods
            .iter()
            .filter(|p| p.ended.is_none())
            .filter_map(|p| {
                let (mib, rate) = super::ramp(&p.plan)?;
                let secs = if rate == 0 { 1 } else { mib.div_ceil(rate) + 1 };
                (at <= p.applied + Duration::from_secs(secs) + settle).then_some(if rate == 0 {
                    2000
                } else {
                    rate
                })
            })
            .sum();
        (rate > ramp_limit_mib_s).then(|| {
            format!("allocation faster than the threshold covers (> {ramp_limit_mib_s} MiB/s)")
        })
    }
}
