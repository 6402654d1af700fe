//! The decision record: everything needed to explain afterwards why the loop did what it did.
//!
//! One [`Decision`] per evaluation that found a threshold met, changed the node conditions,
//! or acted, and one per kernel OOM kill. It goes out on a broadcast channel (for the API's
//! event stream and for tests) and as one structured log line.

use crate::human;
use std::collections::BTreeMap;

use serde::Serialize;

use crate::sense::{Kind, PressureEvent, Source};

/// The kernel event (or timer) that woke the loop.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Wake {
    /// The event: for a re-check timer, the latest kernel event before it (what armed it).
    pub event: Option<PressureEvent>,
    /// `true` when a timer (grace period, transition period, a close threshold, the victim
    /// released) woke the loop rather than an event.
    pub timer: bool,
    /// Detection lag of `event`: from its `at_ns` to when the loop took it.
    pub detection_lag_ns: Option<u64>,
    /// Events folded into this evaluation (the storm that became one pass).
    pub coalesced: usize,
}

impl Wake {
    /// A wake-up by the loop's own timer (or its start), carrying `event`, the latest kernel
    /// event before it, if any.
    pub(crate) fn timer(event: Option<PressureEvent>) -> Wake {
        Wake {
            event,
            timer: true,
            detection_lag_ns: None,
            coalesced: 0,
        }
    }
}

/// One signal's value as the pass saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SignalValue {
    /// The signal name (`allocatableMemory.available`).
    pub signal: String,
    /// What was available, printed as the kubelet prints quantities.
    pub available: String,
    /// The capacity it is measured against.
    pub capacity: Option<String>,
}

/// One pod in the ranking at the moment of the decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RankedPod {
    /// The pod uid.
    pub uid: String,
    /// `namespace/name`.
    pub name: String,
    /// The QoS class.
    pub qos: String,
    /// The pod's priority.
    pub priority: i32,
    /// Its working set in bytes, when the statistics cover it.
    pub working_set_bytes: Option<u64>,
    /// Critical pods are ranked but never evicted.
    pub critical: bool,
}

/// What the loop did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Action {
    /// Thresholds are met or conditions are set, but nothing is due (grace period running,
    /// statistics stale, or nothing met).
    None,
    /// Node-level resources were reclaimed first (dead containers, unused images).
    Reclaimed {
        /// Bytes the reclaim reported freed.
        freed_bytes: u64,
        /// Whether the threshold was resolved by it (no eviction needed).
        resolved: bool,
        /// Why the reclaim failed, if it did.
        error: Option<String>,
    },
    /// A pod was evicted.
    Evicted {
        /// The pod uid.
        uid: String,
        /// `namespace/name`.
        pod: String,
        /// The signal whose threshold was met (`allocatableMemory.available`).
        signal: String,
        /// The pod's QoS class.
        qos: String,
        /// Grace period given, seconds.
        grace_seconds: i64,
        /// The kubelet's eviction message, the pod's status message.
        message: String,
        /// The eviction event's annotations.
        annotations: BTreeMap<String, String>,
        /// Whether the pod cgroup was empty (memory released) when this record was made:
        /// `false` at the kill; the eviction's [`Action::Released`] record follows.
        released: bool,
        /// Why the eviction could not start, if it could not.
        error: Option<String>,
        /// `true` when this is the SIGKILL of a pod whose graceful eviction was under way:
        /// a hard threshold met during its grace period, the pod first in the ranking.
        escalated: bool,
    },
    /// The second record of an eviction: the victim's memory is back (its pod cgroup
    /// empty, `release_ns` from its SIGKILL), or it is past its bound and still holds
    /// `pending_bytes` (a frozen cgroup, a process in D state, a hung runtime stop): the
    /// loop no longer counts on that memory and evicts the next pod if a threshold is
    /// still met.
    Released {
        /// The pod uid.
        uid: String,
        /// `namespace/name`.
        pod: String,
        /// Whether the pod cgroup is empty.
        released: bool,
        /// What the victim still holds when it is not, bytes.
        pending_bytes: Option<u64>,
        /// Why the runtime's stop failed, if it ended and did.
        error: Option<String>,
    },
    /// A dry run (`dryRun`): the eviction the loop would have made, with the message the pod
    /// would have ended with. Nothing was killed or stopped; recorded once per pod per
    /// pressure episode ([`crate::decide::dry_run`]).
    WouldEvict {
        /// The pod uid.
        uid: String,
        /// `namespace/name`.
        pod: String,
        /// The signal whose threshold was met.
        signal: String,
        /// The pod's QoS class.
        qos: String,
        /// The grace period it would have been given, seconds.
        grace_seconds: i64,
        /// The kubelet's eviction message.
        message: String,
        /// The eviction event's annotations.
        annotations: BTreeMap<String, String>,
    },
    /// A threshold was met but no pod could be evicted (none, or only critical ones).
    NothingToEvict,
    /// The kernel OOM killer killed a process: pressure the agent did not prevent.
    OomKilled {
        /// The pod uid, where the cgroup maps to a pod.
        uid: Option<String>,
        /// `namespace/name`, where known.
        pod: Option<String>,
        /// The container, where known.
        container: Option<String>,
        /// The victim's pid and command, where the source knows them.
        pid: Option<u32>,
        /// The victim's command name.
        comm: Option<String>,
        /// Whether the restart policy restarts the container (the runtime restarts it).
        restarting: Option<bool>,
        /// Always `OOMKilled`.
        reason: String,
    },
}

/// What a memory reclaim before the eviction did (`memoryReclaim.enabled`, cgroup v2):
/// attached to the decision it came before, whether it resolved the threshold or the pod
/// was evicted anyway.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryReclaim {
    /// The signal of the threshold acted on (`memory.available`).
    pub signal: String,
    /// The cgroup reclaim was asked of (`/kubepods` below the cgroup root).
    pub cgroup: String,
    /// `resolved` (the threshold cleared: nothing evicted), `skipped` (not tried: the
    /// active file pages could not cover the shortfall), `bounded` (tried, stopped at the
    /// time or step bound with the threshold still met), `short` (tried; what was left was
    /// no longer file pages), `failed` (the write failed), or `dry-run` (a dry run: nothing
    /// written; `requested_bytes` is what the first step would have asked for).
    pub outcome: String,
    /// The shortfall when the decision was taken: threshold plus minimum reclaim minus
    /// available, bytes.
    pub shortfall_bytes: u64,
    /// The cgroup's active file pages then, bytes.
    pub active_file_bytes: u64,
    /// Bytes asked of `memory.reclaim`, all steps together.
    pub requested_bytes: u64,
    /// What reclaim freed: the drop of the cgroup's file pages (active and inactive) over
    /// the steps, bytes (a pod reading its file again meanwhile makes it an underestimate).
    pub freed_bytes: u64,
    /// `memory.reclaim` writes made.
    pub steps: u32,
    /// What the threshold's signal showed available at the last re-observation, bytes
    /// (`None` when nothing was written).
    pub available_after_bytes: Option<u64>,
    /// How long it took, from the first decision to the last re-observation, ns.
    pub took_ns: u64,
    /// Why the write failed, if it did.
    pub error: Option<String>,
}

/// One explained decision.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// Sequence number, from 1.
    pub seq: u64,
    /// What woke the loop.
    pub wake: Wake,
    /// `CLOCK_MONOTONIC` ns when the signals were read.
    pub observed_at_ns: u64,
    /// The signal values read.
    pub signals: Vec<SignalValue>,
    /// The thresholds met with grace periods satisfied (`signal<value`).
    pub met: Vec<String>,
    /// The node conditions reported after this pass.
    pub conditions: Vec<String>,
    /// The ranking at that moment, first to evict first (top N).
    pub ranking: Vec<RankedPod>,
    /// What was done.
    pub action: Action,
    /// The memory reclaim tried (or skipped) before this action, when `memoryReclaim` is on
    /// and the threshold acted on is a memory one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_reclaim: Option<MemoryReclaim>,
    /// From the waking kernel event's `at_ns` to the victim's SIGKILL; `None` when a timer
    /// woke the pass (the close watch or a grace period): then no kernel event marks the
    /// moment the threshold was crossed, and an earlier event of the episode would make the
    /// figure mean something else.
    pub reaction_lag_ns: Option<u64>,
    /// From the signals being read (`observed_at_ns`) to the victim's SIGKILL: the agent's own
    /// share of the reaction, for every eviction however it was woken.
    pub decide_to_kill_ns: Option<u64>,
    /// The loop thread's CPU time over the same span (`CLOCK_THREAD_CPUTIME_ID`): close to
    /// `decide_to_kill_ns` when the thread ran throughout (a few tens of µs over it at most,
    /// when the thread moved between CPUs whose scheduler clocks differ), well below it when
    /// it waited (off the CPU, or blocked). Whether the hypervisor's steal counts as running
    /// depends on the kernel's steal accounting. `None` when the pass's start and the kill
    /// were read on different threads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decide_to_kill_cpu_ns: Option<u64>,
    /// From SIGKILL to the victim's pod cgroup being empty (on the eviction's
    /// [`Action::Released`] record).
    pub release_ns: Option<u64>,
    /// Kernel OOM kills so far that the agent did not prevent.
    pub unprevented_ooms: u64,
    /// The process the eBPF charge program sent SIGKILL at the hard threshold's crossing,
    /// the staged victim's ([`crate::sense::ebpf::stage`]): this eviction's kill was made
    /// there, at the kernel's record, and the loop completed it (the pod's other processes,
    /// the runtime's stop, the status). `None` when the loop made the kill.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub killed_at_crossing: Option<u32>,
    /// With `killed_at_crossing`: when and where the program killed, as its record gave it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crossing_kill: Option<CrossingKillFigures>,
    /// The loop runs a dry run (`dryRun`): what this record says would be done was not.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// Where a kill at the crossing was made: the kernel's time of the charge that crossed (the
/// SIGKILL went out in the same program run), the watched cgroup's usage then and the usage
/// level it was compared with (a working-set level plus the page cache the program had
/// followed). The pass that completes the eviction may have been woken by another record,
/// later: these say when the kill itself was, and how far past the level (checkable against
/// the kernel's own statistics afterwards).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CrossingKillFigures {
    /// `CLOCK_MONOTONIC` ns of the crossing charge and the SIGKILL.
    pub at_ns: u64,
    /// Usage at that charge, bytes.
    pub usage_bytes: u64,
    /// The usage level compared, bytes.
    pub level_bytes: u64,
}

impl Decision {
    /// A record of `action`, woken by `wake`, read at `observed_at_ns`, with the conditions
    /// reported and the count of OOM kills not prevented; no figures, ranking or times yet
    /// (the caller fills in what its record carries).
    pub fn new(
        wake: Wake,
        observed_at_ns: u64,
        conditions: Vec<String>,
        action: Action,
        unprevented_ooms: u64,
    ) -> Decision {
        Decision {
            seq: 0,
            wake,
            observed_at_ns,
            signals: Vec::new(),
            met: Vec::new(),
            conditions,
            ranking: Vec::new(),
            action,
            memory_reclaim: None,
            reaction_lag_ns: None,
            decide_to_kill_ns: None,
            decide_to_kill_cpu_ns: None,
            release_ns: None,
            unprevented_ooms,
            killed_at_crossing: None,
            crossing_kill: None,
            dry_run: false,
        }
    }

    /// One structured log line.
    pub(crate) fn log(&self) {
        let source = self
            .wake
            .event
            .as_ref()
            .map_or("timer", |e| e.source.name());
        let kind = self
            .wake
            .event
            .as_ref()
            .map_or_else(String::new, |e| e.kind.to_string());
        let signals = self
            .signals
            .iter()
            .map(|s| {
                format!(
                    "{}={}",
                    s.signal,
                    human::signal_value(&s.signal, &s.available)
                )
            })
            .collect::<Vec<_>>()
            .join(",");
        let ranking = self
            .ranking
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let action = serde_json::to_string(&self.action).unwrap_or_default();
        let memory_reclaim = self
            .memory_reclaim
            .as_ref()
            .map(|m| serde_json::to_string(m).unwrap_or_default());
        // The `_ns` fields are exact for machines; these are the same times for people.
        let go = |ns: Option<u64>| ns.map_or_else(|| "-".to_string(), human::duration_ns);
        tracing::info!(
            seq = self.seq,
            source,
            kind = %kind,
            coalesced = self.wake.coalesced,
            detection_lag = %go(self.wake.detection_lag_ns),
            detection_lag_ns = self.wake.detection_lag_ns,
            signals = %signals,
            met = %self.met.join(","),
            conditions = ?self.conditions,
            ranking = %ranking,
            action = %action,
            memory_reclaim = memory_reclaim.as_deref(),
            reaction_lag = %go(self.reaction_lag_ns),
            reaction_lag_ns = self.reaction_lag_ns,
            decide_to_kill_ns = self.decide_to_kill_ns,
            decide_to_kill_cpu_ns = self.decide_to_kill_cpu_ns,
            release = %go(self.release_ns),
            release_ns = self.release_ns,
            unprevented_ooms = self.unprevented_ooms,
            killed_at_crossing = self.killed_at_crossing,
            crossing_kill_at_ns = self.crossing_kill.map(|a| a.at_ns),
            crossing_usage_bytes = self.crossing_kill.map(|a| a.usage_bytes),
            crossing_level_bytes = self.crossing_kill.map(|a| a.level_bytes),
            dry_run = self.dry_run,
            "eviction decision"
        );
    }
}

/// Whether an event comes from the kernel (not the housekeeping tick).
pub(crate) fn is_kernel_event(event: &PressureEvent) -> bool {
    event.source != Source::Poll && !matches!(event.kind, Kind::Tick)
}
