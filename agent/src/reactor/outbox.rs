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
pub type EventTap = Box<dyn Fn(&Received) + Send + Sync>;

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
        }
    }

    /// A record made now, outside a pass (`action`, with the conditions reported now and
    /// the OOM count).
    pub(super) fn record(&self, wake: Wake, at_ns: u64, action: Action) -> Decision {
        let conditions = self.conditions.borrow().clone();
        Decision::new(wake, at_ns, conditions, action, self.unprevented_ooms)
    }

    /// Numbers `d`, logs it and sends it to the subscribers.
    pub(super) fn emit(&mut self, mut d: Decision) {
        self.seq += 1;
        d.seq = self.seq;
        d.log();
        let _ = self.decisions.send(d);
    }
}
