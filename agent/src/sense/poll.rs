//! The housekeeping tick: the fallback that works on every node.
//!
//! The kubelet looks at its signals every `housekeepingInterval` (10 s by default); this
//! source does the same so that a node with no kernel notification at all (no PSI, no memcg
//! events, no eBPF) is still watched, and so that slow drifts that never cross a notified
//! threshold are still seen.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use super::clock::monotonic_ns;
use super::event::{Kind, PressureEvent, Source};

/// Sends a [`Kind::Tick`] now and every `interval` after, until the receiver is gone. A tick
/// that could not be taken on time is delayed rather than bunched up: after a stall the
/// reactor needs one fresh look, not several at once.
pub(crate) async fn run(interval: Duration, tx: mpsc::Sender<PressureEvent>) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let event = PressureEvent {
            at_ns: monotonic_ns(),
            source: Source::Poll,
            woke_ns: None,
            cgroup: None,
            kind: Kind::Tick,
        };
        if tx.send(event).await.is_err() {
            return;
        }
    }
}
