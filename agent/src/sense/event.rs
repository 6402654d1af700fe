//! What the sense layer hands on: one [`PressureEvent`] per thing the kernel said, the
//! [`Source`] it came through and its [`Kind`], printed on one line for logs and tables.

use serde::Serialize;

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
    /// `CLOCK_MONOTONIC` nanoseconds at which the source's task woke to read it, where the
    /// source knows: for eBPF, when the ring-buffer reader began the pass that took the record
    /// (or the record's own `at_ns` if it was written during that pass); for memcg and PSI
    /// the same stamp as `at_ns`. With it the lag splits into kernel → wake (the time the event
    /// waited for the reader to run) and wake → taken (the agent's own path), which compare
    /// alike across sources. `None` for the tick and `Dropped` reports.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub woke_ns: Option<u64>,
    /// Which sense source delivered it.
    pub source: Source,
    /// The cgroup the event belongs to, as a path inside the memory hierarchy
    /// (`/kubepods/burstable/pod…`), or `None` for node-wide events.
    pub cgroup: Option<String>,
    /// What happened.
    pub kind: Kind,
}

/// A process the eBPF charge program sent SIGKILL at a hard threshold's crossing, because it
/// was charging inside the staged victim pod ([`crate::sense::ebpf::stage`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct KilledAtCrossing {
    /// The killed process (thread-group id).
    pub pid: u32,
    /// The staged victim pod cgroup's id (kernfs inode) the kill was for.
    pub cgroup_id: u64,
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
        /// The level's cumulative stall (`total=`, µs) read just after the wake-up, where it
        /// could be read: two events' difference is the stall between them.
        total_us: Option<u64>,
    },
    /// Usage crossed a memcg threshold (v1 eventfd) or `memory.events` changed (v2).
    ThresholdCrossed {
        /// The threshold in bytes, where there is one.
        threshold_bytes: Option<u64>,
        /// Usage read at wake-up, where it could be read. The v1 eventfd fires on crossings in
        /// both directions; this says which one it was.
        usage_bytes: Option<u64>,
        /// The process the eBPF charge program killed at this crossing, the staged victim's
        /// ([`crate::sense::ebpf::stage`]); `None` for every other crossing and source.
        #[serde(skip_serializing_if = "Option::is_none")]
        killed: Option<KilledAtCrossing>,
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

impl std::fmt::Display for Kind {
    /// One short line for logs, `reactor watch`'s table and `reactor events`: sizes and times
    /// as kubectl and Go print them (`rss=496Ki`, `12.5ms`; `crate::human`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::human;
        fn opt<T>(v: &Option<T>, show: impl Fn(&T) -> String) -> String {
            v.as_ref().map_or_else(|| "?".to_string(), show)
        }
        let bytes = |b: &u64| human::bytes(i128::from(*b));
        match self {
            Kind::OomKill {
                pid,
                comm,
                rss_bytes,
                oom_score_adj,
            } => write!(
                f,
                "oom-kill pid={} comm={} rss={} oom_score_adj={}",
                opt(pid, ToString::to_string),
                opt(comm, ToString::to_string),
                opt(rss_bytes, bytes),
                opt(oom_score_adj, ToString::to_string)
            ),
            Kind::ReclaimStall {
                pid,
                duration_ns,
                memcg,
                folded,
                folded_ns,
            } => write!(
                f,
                "reclaim-stall pid={pid} {} memcg={memcg} folded={folded} ({})",
                human::duration_ns(*duration_ns),
                human::duration_ns(*folded_ns)
            ),
            Kind::MemcgEvent { item, count } => write!(f, "memcg-event {item} +{count}"),
            Kind::PsiTrigger { level, total_us } => {
                write!(
                    f,
                    "psi-trigger {level} total={}",
                    opt(total_us, |us| human::duration_ns(us.saturating_mul(1000)))
                )
            }
            Kind::ThresholdCrossed {
                threshold_bytes,
                usage_bytes,
                killed,
            } => {
                write!(
                    f,
                    "threshold-crossed threshold={} usage={}",
                    opt(threshold_bytes, bytes),
                    opt(usage_bytes, bytes)
                )?;
                match killed {
                    Some(k) => write!(f, " killed-at-crossing pid={}", k.pid),
                    None => Ok(()),
                }
            }
            Kind::Tick => f.write_str("tick"),
            Kind::Dropped { count } => write!(f, "ring-buffer-drops +{count}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_print_on_one_line() {
        let k = Kind::ThresholdCrossed {
            threshold_bytes: Some(10),
            usage_bytes: None,
            killed: None,
        };
        assert_eq!(k.to_string(), "threshold-crossed threshold=10 usage=?");
        let k = Kind::ThresholdCrossed {
            threshold_bytes: Some(384 << 20),
            usage_bytes: Some(402_661_377),
            killed: None,
        };
        assert_eq!(
            k.to_string(),
            "threshold-crossed threshold=384Mi usage=~384Mi"
        );
        let k = Kind::PsiTrigger {
            level: "some".into(),
            total_us: Some(2_500),
        };
        assert_eq!(k.to_string(), "psi-trigger some total=2.5ms");
        assert_eq!(Kind::Tick.to_string(), "tick");
    }
}
