//! What image GC tells the rest of the agent: one event per round outcome, on a broadcast
//! channel the agent forwards (to its event stream and the node's Kubernetes events once
//! those exist), and counters for the metrics endpoint.
//!
//! The event names follow the kubelet's (`FreeDiskSpaceFailed`, `ImageGCFailed`) so an
//! operator's alerts keep their meaning.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Why a round ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum GcTrigger {
    /// The periodic GC (thresholds and maximum age).
    Periodic,
    /// The disk-pressure reclaim (`delete_unused_images`), which ignores the thresholds.
    Reclaim,
}

/// One image GC outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum ImageGcEvent {
    /// A round ran to its end (possibly freeing nothing, possibly with some deletions
    /// refused: `errors`).
    RoundFinished {
        /// Periodic or reclaim.
        trigger: GcTrigger,
        /// Image filesystem usage in percent when the round planned (periodic rounds).
        usage_percent: Option<i64>,
        /// What the round had to free to reach the low threshold (`None` below the high
        /// threshold, and for reclaim, which frees all it may).
        bytes_to_free: Option<i64>,
        /// Bytes freed, as the sum of the deleted images' sizes reported by the runtime.
        freed_bytes: u64,
        /// Deleted image ids, in deletion order.
        deleted: Vec<String>,
        /// Deletions the runtime refused, one line each.
        errors: Vec<String>,
        /// A dry run: `deleted` would have been deleted (`freed_bytes` what they would have
        /// freed); nothing was.
        dry_run: bool,
    },
    /// A periodic round freed less than it needed to reach the low threshold; `message` is
    /// the kubelet's text for the node event of the same name.
    FreeDiskSpaceFailed {
        /// The kubelet's message.
        message: String,
    },
    /// The periodic GC failed twice or more in a row (the kubelet only raises an event on a
    /// repeated failure; a single one may be stats not being ready yet).
    ImageGcFailed {
        /// Why the latest round failed.
        message: String,
    },
    /// A round could not run, or stopped part way: the runtime is down or hung, or the image
    /// filesystem could not be measured.
    RoundFailed {
        /// Periodic or reclaim.
        trigger: GcTrigger,
        /// What went wrong, one line.
        reason: String,
    },
}

impl ImageGcEvent {
    /// The reason string of the matching Kubernetes node event, where the kubelet has one.
    pub fn kubelet_reason(&self) -> Option<&'static str> {
        match self {
            ImageGcEvent::FreeDiskSpaceFailed { .. } => Some("FreeDiskSpaceFailed"),
            ImageGcEvent::ImageGcFailed { .. } => Some("ImageGCFailed"),
            _ => None,
        }
    }
}

/// Running totals since the manager started, for metrics. Atomic so readers never wait on a
/// round in progress.
#[derive(Debug, Default)]
pub struct Counters {
    detections: AtomicU64,
    runs: AtomicU64,
    failures: AtomicU64,
    freed_bytes: AtomicU64,
    images_deleted: AtomicU64,
    deletion_errors: AtomicU64,
    reclaims: AtomicU64,
    containers_removed: AtomicU64,
    sandboxes_removed: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CountersSnapshot {
    /// Successful image detections (including those rounds make).
    pub detections: u64,
    /// Periodic rounds started.
    pub runs: u64,
    /// Periodic rounds that failed (could not run, or freed less than needed).
    pub failures: u64,
    /// Bytes freed by all rounds and reclaims (sum of deleted images' sizes).
    pub freed_bytes: u64,
    /// Images deleted by all rounds and reclaims.
    pub images_deleted: u64,
    /// Image deletions the runtime refused.
    pub deletion_errors: u64,
    /// Disk-pressure reclaims run.
    pub reclaims: u64,
    /// Dead containers removed by reclaims.
    pub containers_removed: u64,
    /// Not-ready sandboxes removed by reclaims.
    pub sandboxes_removed: u64,
}

/// Which counter to add to.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Counter {
    Detections,
    Runs,
    Failures,
    FreedBytes,
    ImagesDeleted,
    DeletionErrors,
    Reclaims,
    ContainersRemoved,
    SandboxesRemoved,
}

impl Counters {
    pub(crate) fn add(&self, counter: Counter, n: u64) {
        let c = match counter {
            Counter::Detections => &self.detections,
            Counter::Runs => &self.runs,
            Counter::Failures => &self.failures,
            Counter::FreedBytes => &self.freed_bytes,
            Counter::ImagesDeleted => &self.images_deleted,
            Counter::DeletionErrors => &self.deletion_errors,
            Counter::Reclaims => &self.reclaims,
            Counter::ContainersRemoved => &self.containers_removed,
            Counter::SandboxesRemoved => &self.sandboxes_removed,
        };
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// The current values.
    pub fn snapshot(&self) -> CountersSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CountersSnapshot {
            detections: get(&self.detections),
            runs: get(&self.runs),
            failures: get(&self.failures),
            freed_bytes: get(&self.freed_bytes),
            images_deleted: get(&self.images_deleted),
            deletion_errors: get(&self.deletion_errors),
            reclaims: get(&self.reclaims),
            containers_removed: get(&self.containers_removed),
            sandboxes_removed: get(&self.sandboxes_removed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_reasons_and_warnings() {
        let ok = ImageGcEvent::RoundFinished {
            trigger: GcTrigger::Periodic,
            usage_percent: Some(10),
            bytes_to_free: None,
            freed_bytes: 0,
            deleted: vec![],
            errors: vec![],
            dry_run: false,
        };
        assert_eq!(ok.kubelet_reason(), None);
        let failed = ImageGcEvent::FreeDiskSpaceFailed {
            message: "x".into(),
        };
        assert_eq!(failed.kubelet_reason(), Some("FreeDiskSpaceFailed"));
        let json = serde_json::to_value(ImageGcEvent::ImageGcFailed {
            message: "y".into(),
        })
        .unwrap();
        assert_eq!(json["type"], "imageGcFailed");
        assert_eq!(
            ImageGcEvent::ImageGcFailed {
                message: "y".into()
            }
            .kubelet_reason(),
            Some("ImageGCFailed")
        );
    }

    #[test]
    fn counters_add_up() {
        let c = Counters::default();
        c.add(Counter::Runs, 2);
        c.add(Counter::FreedBytes, 100);
        c.add(Counter::FreedBytes, 23);
        let s = c.snapshot();
        assert_eq!((s.runs, s.freed_bytes, s.failures), (2, 123, 0));
    }
}
