//! What happens on the node, fanned out to every `reactor events` client.
//!
//! A broadcast channel, because slow clients must never hold up the pod manager or the
//! reactor loop: a client that falls behind is told how many events it missed (the sequence
//! numbers jump) instead of slowing the sender down.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::broadcast;

/// How many events a slow client may fall behind by.
const CAPACITY: usize = 4096;
/// How many recovery events of the start are replayed to each new client.
const REPLAY: usize = 256;

/// One event, stamped and numbered.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeEvent {
    /// When it was recorded (wall clock).
    pub at: SystemTime,
    /// Increases by one per event from 1, so a client sees what it missed.
    pub sequence: u64,
    /// What happened.
    pub kind: NodeEventKind,
}

/// What happened; mirrors the API's `Event.kind` but in domain terms.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeEventKind {
    /// The kernel reported pressure (from `sense`).
    Pressure {
        /// `ebpf`, `psi`, `memcg`, `poll`.
        source: String,
        /// The cgroup concerned, empty for the node.
        cgroup: String,
        /// What kind of event.
        kind: String,
        /// Kernel timestamp, CLOCK_MONOTONIC ns.
        at_monotonic_ns: u64,
        /// Detection lag, ns.
        lag_ns: u64,
    },
    /// A pod was admitted or refused.
    Admission {
        /// `namespace`.
        namespace: String,
        /// `name`.
        name: String,
        /// uid.
        uid: String,
        /// Whether it was admitted.
        admitted: bool,
        /// The kubelet's reason when refused.
        reason: String,
        /// The kubelet's message when refused.
        message: String,
    },
    /// A critical pod preempted others.
    Preemption {
        /// The critical pod, `namespace/name`.
        preemptor: String,
        /// Victims, `namespace/name`, in eviction order.
        victims: Vec<String>,
        /// What it needed (`Insufficient memory`).
        reasons: Vec<String>,
        /// A dry run: nothing was stopped, and the critical pod was refused.
        dry_run: bool,
    },
    /// The eviction manager evicted a pod (published by the reactor loop).
    Eviction {
        /// `namespace/name`.
        pod: String,
        /// uid.
        uid: String,
        /// The signal.
        signal: String,
        /// The kubelet's message.
        message: String,
        /// Grace given, seconds.
        grace_period_seconds: i64,
        /// From the waking kernel event to the kill, ns (-1: a timer woke the decision).
        reaction_ns: i64,
        /// The process the kernel killed at the crossing, when it made the kill.
        killed_at_crossing: Option<u32>,
        /// A dry run: the eviction the loop would have made; nothing was killed or stopped.
        dry_run: bool,
        /// The SIGKILL cutting short this pod's graceful eviction (announced before): the
        /// same eviction, not a second one.
        escalated: bool,
    },
    /// A container was OOM-killed by the kernel.
    OomKill {
        /// `namespace/name`.
        pod: String,
        /// The container.
        container: String,
        /// The cgroup the kill was counted in.
        cgroup: String,
    },
    /// An image GC round ran (periodic, or the reclaim before a disk-pressure eviction), or
    /// failed.
    ImageGc {
        /// `periodic` or `reclaim`.
        trigger: String,
        /// Image ids deleted, in order.
        removed: Vec<String>,
        /// Bytes freed, as the runtime sized the deleted images.
        freed_bytes: u64,
        /// The kubelet's event reason for a failure (`FreeDiskSpaceFailed`, `ImageGCFailed`),
        /// `RoundFailed` when the round could not run, empty for a round that went well.
        reason: String,
        /// What went wrong, one line; empty when nothing did.
        message: String,
        /// A dry run: `removed` would have been deleted (`freed_bytes` what they would have
        /// freed); nothing was.
        dry_run: bool,
    },
    /// A memory reclaim before an eviction (`memoryReclaim.enabled`), published by the
    /// reactor loop's decision forwarder: what the decision record's `memoryReclaim` says.
    MemoryReclaim {
        /// The threshold's signal.
        signal: String,
        /// The cgroup asked.
        cgroup: String,
        /// `resolved`, `skipped`, `bounded`, `short` or `failed`.
        outcome: String,
        /// Threshold plus minimum reclaim minus available, bytes.
        shortfall_bytes: u64,
        /// Active file pages of the cgroup, bytes.
        active_file_bytes: u64,
        /// Bytes asked of `memory.reclaim`.
        requested_bytes: u64,
        /// Bytes freed.
        freed_bytes: u64,
        /// Writes made.
        steps: u32,
        /// How long it took, ns.
        took_ns: u64,
        /// Why the write failed; empty when it did not.
        error: String,
    },
    /// The agent recovered from damaged state or a crash (`record::state_file` notices,
    /// `node::recover`'s re-admissions, orphans and finished stops).
    Recovery {
        /// `set-aside`, `fell-back`, `write-failed`, `write-recovered`, `re-admitted`,
        /// `orphaned`, `orphan-removed`, `orphan-kept` (a dry run), `orphan-replaced`,
        /// `stop-finished`.
        action: String,
        /// The state file, empty for a pod.
        file: String,
        /// `namespace/name`, empty for a state file.
        pod: String,
        /// The pod's uid, empty for a state file.
        uid: String,
        /// One line for people.
        message: String,
    },
    /// A node condition turned True or False (after its transition period).
    Condition {
        /// Condition type.
        condition: String,
        /// Whether it is True now.
        on: bool,
        /// The kubelet's reason.
        reason: String,
        /// The kubelet's message (for a PSI condition, with the figure read).
        message: String,
    },
    /// A pod was removed from the node (stopped, its cgroup gone).
    Removed {
        /// `namespace/name`.
        pod: String,
        /// uid.
        uid: String,
        /// Why: `api`, `static-manifest-removed`, ...
        cause: String,
    },
}

/// State-file notices (`record::state_file`) as `recovery` events on `events`: how every
/// checkpoint owner's set-aside files and failed writes reach `reactor events`.
pub fn notices_to(events: &EventHub) -> crate::record::state_file::Notices {
    let events = events.clone();
    crate::record::state_file::Notices::to(move |n| {
        events.publish(NodeEventKind::Recovery {
            action: n.action.as_str().to_string(),
            file: n.file.display().to_string(),
            pod: String::new(),
            uid: String::new(),
            message: n.message.clone(),
        })
    })
}

/// The sender side, shared by everything that publishes.
#[derive(Clone, Debug)]
pub struct EventHub {
    tx: broadcast::Sender<NodeEvent>,
    sequence: Arc<AtomicU64>,
    /// Recovery events published before [`EventHub::started`]: the agent's start is when
    /// state files are set aside and lost pods recovered, and nobody can be listening then.
    replay: Arc<std::sync::Mutex<Vec<NodeEvent>>>,
    sealed: Arc<AtomicBool>,
}

impl Default for EventHub {
    fn default() -> Self {
        EventHub::new()
    }
}

impl EventHub {
    /// A hub with no subscribers yet.
    pub fn new() -> EventHub {
        let (tx, _) = broadcast::channel(CAPACITY);
        EventHub {
            tx,
            sequence: Arc::new(AtomicU64::new(0)),
            replay: Arc::new(std::sync::Mutex::new(Vec::new())),
            sealed: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Ends the start: recovery events from now on are only streamed live (the ones so far
    /// stay in the replay).
    pub fn started(&self) {
        self.sealed.store(true, Ordering::Relaxed);
    }

    /// The recovery events of the start, then a subscriber for everything from now on.
    pub(crate) fn subscribe_with_replay(&self) -> (Vec<NodeEvent>, broadcast::Receiver<NodeEvent>) {
        let replay = self.replay.lock().unwrap_or_else(|e| e.into_inner());
        let rx = self.tx.subscribe();
        (replay.clone(), rx)
    }

    /// Stamps, numbers and sends `kind` to every subscriber (none listening is fine).
    pub fn publish(&self, kind: NodeEventKind) {
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed) + 1;
        let event = NodeEvent {
            at: SystemTime::now(),
            sequence,
            kind,
        };
        if matches!(event.kind, NodeEventKind::Recovery { .. })
            && !self.sealed.load(Ordering::Relaxed)
        {
            let mut replay = self.replay.lock().unwrap_or_else(|e| e.into_inner());
            if replay.len() < REPLAY {
                replay.push(event.clone());
            }
        }
        let _ = self.tx.send(event);
    }

    /// A new subscriber, seeing events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<NodeEvent> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn subscribers_see_numbered_events() {
        let hub = EventHub::new();
        hub.publish(NodeEventKind::Removed {
            pod: "a/b".into(),
            uid: "u".into(),
            cause: "api".into(),
        });
        let mut rx = hub.subscribe();
        hub.publish(NodeEventKind::Removed {
            pod: "a/c".into(),
            uid: "v".into(),
            cause: "api".into(),
        });
        let e = rx.recv().await.unwrap();
        assert_eq!(e.sequence, 2);
        assert!(matches!(e.kind, NodeEventKind::Removed { ref pod, .. } if pod == "a/c"));
    }
}
