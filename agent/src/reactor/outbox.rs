//! What the loop hands out: its decisions (numbered, logged, broadcast), the node
//! conditions and the status snapshot it publishes, its metrics, and the tap on every event
//! it receives. One part, so every record leaves the loop the same way.

use std::sync::Arc;

use tokio::sync::{broadcast, watch};

use super::decision::{Action, Decision, Wake};
use super::status::{NodePressure, Transitions};
use crate::record::metrics::Metrics;
use crate::sense::Received;

/// What `Reactor::with_tap` takes: called with every event the loop receives.
pub(crate) type EventTap = Box<dyn Fn(&Received) + Send + Sync>;

/// The loop's outputs and the counters its records carry.
pub(super) struct Outbox {
    /// Every decision, for whoever subscribed.
    pub(super) decisions: broadcast::Sender<Decision>,
    /// The node conditions reported now.
    pub(super) conditions: watch::Sender<Vec<String>>,
    /// The last pass's signals, thresholds and conditions (`reactor status`).
    pub(super) pressure: watch::Sender<Option<NodePressure>>,
    /// When each listed condition last changed, for the status snapshot.
    pub(super) transitions: Transitions,
    /// The last decision's number.
    seq: u64,
    /// Kernel OOM kills the agent did not prevent, carried by every record.
    pub(super) unprevented_ooms: u64,
    /// Called with every event the loop receives.
    pub(super) tap: Option<EventTap>,
    /// Signal values, thresholds, conditions, evictions and reaction lag.
    pub(super) metrics: Option<Arc<Metrics>>,
    /// The last `nothingToEvict` recorded: its signal, the pods it ranked (uids) and when
    /// (`CLOCK_MONOTONIC` ns), see [`Outbox::nothing_to_evict_said`].
    nothing_said: Option<(String, Vec<String>, u64)>,
}

impl Outbox {
    /// Nothing said yet; `transitions` lists the conditions the node reports.
    pub(super) fn new(transitions: Transitions) -> Outbox {
        Outbox {
            decisions: broadcast::channel(1024).0,
            conditions: watch::channel(Vec::new()).0,
            pressure: watch::channel(None).0,
            transitions,
            seq: 0,
            unprevented_ooms: 0,
            tap: None,
            metrics: None,
            nothing_said: None,
        }
    }

    /// A record made now, outside a pass (`action`, with the conditions reported now and
    /// the OOM count).
    pub(super) fn record(&self, wake: Wake, at_ns: u64, action: Action) -> Decision {
        let conditions = self.conditions.borrow().clone();
        Decision::new(wake, at_ns, conditions, action, self.unprevented_ooms)
    }

    /// Whether a `nothingToEvict` for `signal` over the same `ranked` pods was recorded less
    /// than `every` ago; when not, this one counts as recorded now. A threshold met with
    /// nothing evictable (only critical pods left, or the memory held by pods already
    /// evicted) stays so while every kernel crossing wakes a pass: chaos saw 200 such
    /// records a second. As the kubelet says "unable to evict" once per housekeeping pass,
    /// the loop says it again only when the pods or the signal change, or `every` has gone.
    pub(super) fn nothing_to_evict_said(
        &mut self,
        signal: &str,
        ranked: Vec<String>,
        now_ns: u64,
        every: std::time::Duration,
    ) -> bool {
        let every = u64::try_from(every.as_nanos()).unwrap_or(u64::MAX);
        if let Some((s, r, at)) = &self.nothing_said {
            if s == signal && *r == ranked && now_ns.saturating_sub(*at) < every {
                return true;
            }
        }
        self.nothing_said = Some((signal.to_string(), ranked, now_ns));
        false
    }

    /// Numbers `d`, logs it and sends it to the subscribers.
    pub(super) fn emit(&mut self, mut d: Decision) {
        self.seq += 1;
        d.seq = self.seq;
        d.log();
        let _ = self.decisions.send(d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn nothing_to_evict_is_said_again_only_when_something_changed_or_the_interval_passed() {
        let mut out = Outbox::new(Transitions::new(&Default::default()));
        let every = Duration::from_secs(10);
        let pods = || vec!["critical-uid".to_string()];
        let s = 1_000_000_000;
        assert!(!out.nothing_to_evict_said("memory.available", pods(), s, every));
        assert!(out.nothing_to_evict_said("memory.available", pods(), s + 5_000_000, every));
        assert!(out.nothing_to_evict_said("memory.available", pods(), s + 9_000_000_000, every));
        // Another signal, other pods, or the interval gone: said again.
        assert!(!out.nothing_to_evict_said("pid.available", pods(), s + 9_100_000_000, every));
        assert!(!out.nothing_to_evict_said("pid.available", vec![], s + 9_200_000_000, every));
        assert!(out.nothing_to_evict_said("pid.available", vec![], s + 19_100_000_000, every));
        assert!(!out.nothing_to_evict_said("pid.available", vec![], s + 19_200_000_000, every));
    }
}
