//! `sense`: every way the kernel tells us about memory pressure, turned into one stream of
//! [`PressureEvent`]s.
//!
//! Each source runs as its own tokio task and sends into one channel, so the reactor loop
//! has a single place to wake from whatever the node offers (eBPF, PSI, memcg notification,
//! or the polling fallback). The event carries the kernel's own timestamp where the kernel
//! gives one, so the detection lag (`now - at_ns` when the reactor takes the event) is a
//! measured figure rather than an estimate.

use serde::Serialize;

pub mod ebpf;

/// Where an event came from. One variant per sense source; the config switches each one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// eBPF programs on kernel tracepoints, delivered through the BPF ring buffer.
    Ebpf,
    /// A PSI trigger on `/proc/pressure/memory` or a cgroup's `memory.pressure`.
    Psi,
    /// A memcg notification: v1 `cgroup.event_control` threshold eventfd, v2 `memory.events`.
    MemcgThreshold,
    /// The housekeeping tick: a fallback that reads the signals at a fixed interval.
    Poll,
}

impl Source {
    /// Every source, in the order the agent attaches them.
    pub const ALL: [Source; 4] = [
        Source::Ebpf,
        Source::Psi,
        Source::MemcgThreshold,
        Source::Poll,
    ];

    /// The name used in config keys, logs, metrics labels and `reactor watch`.
    pub fn name(self) -> &'static str {
        match self {
            Source::Ebpf => "ebpf",
            Source::Psi => "psi",
            Source::MemcgThreshold => "memcg-threshold",
            Source::Poll => "poll",
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One thing the kernel said about pressure, with the kernel's timestamp.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PressureEvent {
    /// `CLOCK_MONOTONIC` nanoseconds at which the kernel saw the event (its own
    /// `bpf_ktime_get_ns()` for eBPF; the wake-up time for sources that carry no timestamp).
    pub at_ns: u64,
    /// Which sense source delivered it.
    pub source: Source,
    /// The cgroup the event belongs to, as a path inside the memory hierarchy
    /// (`/kubepods/burstable/pod…`), or `None` for node-wide events.
    pub cgroup: Option<String>,
    /// What happened.
    pub kind: Kind,
}

/// What a pressure event reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Kind {
    /// The kernel OOM killer chose a victim (`oom:mark_victim`, or an OOM counted in
    /// `memory.oom_control` / `memory.events`).
    OomKill {
        /// The victim's pid, where the source knows it.
        pid: Option<u32>,
        /// The victim's command name, where the source knows it.
        comm: Option<String>,
        /// The victim's resident memory (anon + file + shmem) in bytes, where the source
        /// knows it (`oom:mark_victim` does).
        #[serde(skip_serializing_if = "Option::is_none")]
        rss_bytes: Option<u64>,
        /// The victim's `oom_score_adj`, where the source knows it.
        #[serde(skip_serializing_if = "Option::is_none")]
        oom_score_adj: Option<i32>,
    },
    /// A task stalled in reclaim; the duration is measured in the kernel.
    ReclaimStall {
        /// The stalled task.
        pid: u32,
        /// How long it stalled, in nanoseconds.
        duration_ns: u64,
        /// Whether it was memcg (limit) reclaim rather than global direct reclaim.
        memcg: bool,
        /// Earlier stalls in the same cgroup folded into this event by the kernel-side rate
        /// limit (so a reclaim storm cannot flood the ring buffer); 0 when none.
        folded: u64,
        /// Their total stall time, in nanoseconds.
        folded_ns: u64,
    },
    /// A memcg event counter moved (`memcg:count_memcg_events`: high, max, oom...).
    MemcgEvent {
        /// The event item, by its kernel name.
        item: String,
        /// How many were counted since the last report for this cgroup.
        count: u64,
    },
    /// A PSI trigger fired: stall time crossed the threshold within the window.
    PsiTrigger {
        /// `"some"` or `"full"`.
        level: String,
    },
    /// Usage crossed a memcg threshold (v1 eventfd) or `memory.events` changed (v2).
    ThresholdCrossed {
        /// The threshold in bytes, where there is one.
        threshold_bytes: Option<u64>,
    },
    /// The housekeeping tick: nothing from the kernel, just time to look again.
    Tick,
    /// Events were lost before the agent could read them (the eBPF ring buffer was full);
    /// `count` is how many since the previous report. Pressure may have been missed, so the
    /// consumer should look at the signals now.
    Dropped {
        /// Records lost since the last `Dropped` report.
        count: u64,
    },
}
