//! Keeps the device gauges (`reactor_devices`, `reactor_devices_allocated`) in step with the
//! device manager: a task that waits on the manager's change notification and copies its
//! counts into the metrics after every change, so a scrape sees a plugin's devices, a health
//! flip, an allocation or a deleted resource as soon as the manager does, with no polling.

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};

use reactor::devices::DeviceManager;
use reactor::record::metrics::Metrics;

/// Starts forwarding. The task holds the manager weakly, so it never keeps a stopped
/// manager alive; it ends when the manager is gone (or when the caller aborts it).
///
/// Resources that disappear between two changes are passed as `deleted`, so their series
/// leave the exposition. They are found by comparing with the previous round rather than
/// taken from [`DeviceManager::capacity`], whose once-only `deleted` report belongs to node
/// status.
pub fn spawn(devices: &Arc<DeviceManager>, metrics: &Arc<Metrics>) -> tokio::task::JoinHandle<()> {
    let mut changes = devices.subscribe();
    let devices: Weak<DeviceManager> = Arc::downgrade(devices);
    let metrics = Arc::clone(metrics);
    tokio::spawn(async move {
        let mut known: BTreeSet<String> = BTreeSet::new();
        loop {
            // Mark the current value seen before reading, so a change during the read
            // wakes the next round.
            changes.borrow_and_update();
            let Some(manager) = devices.upgrade() else {
                return;
            };
            let resources = manager.snapshot();
            drop(manager);
            let now: BTreeSet<String> = resources.keys().cloned().collect();
            let deleted: Vec<String> = known.difference(&now).cloned().collect();
            let counts = resources.into_iter().map(|(r, c)| (r, c.into())).collect();
            metrics.update_devices(&counts, &deleted);
            known = now;
            if changes.changed().await.is_err() {
                return;
            }
        }
    })
}
