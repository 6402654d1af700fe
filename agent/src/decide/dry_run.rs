//! Dry run (`dryRun`): which would-be evictions are recorded.
//!
//! In a dry run the loop decides as always and records the eviction it would make instead of
//! making it. Nothing is killed, so the next pass finds the same pod first for the same
//! threshold, and would record it again on every re-read (every millisecond near a
//! threshold). The rule here: a pod is recorded once per pressure episode — from its record
//! until the threshold it was recorded for is no longer met (the pass's `met`: grace periods
//! satisfied, and a threshold acted on stays met until its minimum reclaim is satisfied too),
//! or until the pod is gone. A pod recorded for one threshold is not recorded again for
//! another while its episode lasts.
//!
//! While a recorded pod still ranks first, nothing else is recorded: the real agent would
//! have evicted it and counted its memory as coming back, and a dry run cannot tell what
//! that memory would have changed. Another pod is recorded when it ranks first itself (it
//! grew past the first, or the first is gone).

/// One would-be eviction of the current episode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WouldEvict {
    /// The pod uid.
    pub uid: String,
    /// `namespace/name`.
    pub pod: String,
    /// The threshold it was recorded for (index into the loop's thresholds).
    pub threshold: usize,
    /// The threshold's signal name (`memory.available`).
    pub signal: String,
    /// The kubelet's eviction message, as the pod would have ended with.
    pub message: String,
    /// When it was recorded, on the caller's clock.
    pub at_ns: u64,
}

/// The would-be evictions of the current pressure episodes, one per pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DryRunLedger {
    recorded: Vec<WouldEvict>,
}

impl DryRunLedger {
    /// Ends the episodes that are over: the pods whose threshold is not in `met` (this
    /// pass's), and the pods `running` says are gone. Returns them, oldest first.
    pub(crate) fn end_episodes(
        &mut self,
        met: &[usize],
        running: impl Fn(&str) -> bool,
    ) -> Vec<WouldEvict> {
        let (kept, ended): (Vec<_>, Vec<_>) = std::mem::take(&mut self.recorded)
            .into_iter()
            .partition(|w| met.contains(&w.threshold) && running(&w.uid));
        self.recorded = kept;
        ended
    }

    /// Whether `uid` was recorded in its current episode.
    pub(crate) fn recorded(&self, uid: &str) -> bool {
        self.recorded.iter().any(|w| w.uid == uid)
    }

    /// Records `would` unless its pod was recorded in this episode already; returns whether
    /// it was recorded now (the caller then emits its record and counts it).
    pub(crate) fn record(&mut self, would: WouldEvict) -> bool {
        if self.recorded(&would.uid) {
            return false;
        }
        self.recorded.push(would);
        true
    }

    /// The would-be evictions of the current episodes, oldest first.
    pub(crate) fn current(&self) -> &[WouldEvict] {
        &self.recorded
    }

    /// Whether no episode is open.
    pub fn is_empty(&self) -> bool {
        self.recorded.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn would(uid: &str, threshold: usize) -> WouldEvict {
        WouldEvict {
            uid: uid.to_string(),
            pod: format!("default/{uid}"),
            threshold,
            signal: "memory.available".to_string(),
            message: "The node was low on resource: memory.".to_string(),
            at_ns: 1,
        }
    }

    #[test]
    fn a_pod_is_recorded_once_per_episode() {
        let mut l = DryRunLedger::default();
        let running = |_: &str| true;
        assert!(l.record(would("hog", 0)));
        // The next passes: the threshold still met, the same pod first.
        for _ in 0..1000 {
            assert!(l.end_episodes(&[0], running).is_empty());
            assert!(
                !l.record(would("hog", 0)),
                "recorded again within its episode"
            );
        }
        // Not for another threshold met meanwhile either.
        assert!(!l.record(would("hog", 1)));
        // Another pod that ranks first is recorded once too.
        assert!(l.record(would("batch", 0)));
        assert!(!l.record(would("batch", 0)));
        assert_eq!(l.current().len(), 2);
        // The threshold clears: the episode ends for both, and a new one records again.
        let ended = l.end_episodes(&[], running);
        assert_eq!(
            ended.iter().map(|w| w.uid.as_str()).collect::<Vec<_>>(),
            ["hog", "batch"]
        );
        assert!(l.is_empty());
        assert!(l.record(would("hog", 0)));
    }

    #[test]
    fn an_episode_ends_with_its_own_threshold_or_its_pod() {
        let mut l = DryRunLedger::default();
        assert!(l.record(would("hog", 0)));
        assert!(l.record(would("reader", 2)));
        // Threshold 2 clears while 0 stays met: only the reader's episode ends.
        let ended = l.end_episodes(&[0], |_| true);
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].uid, "reader");
        assert!(l.recorded("hog") && !l.recorded("reader"));
        // The hog is gone (the kernel's OOM killer, or the pod removed): its episode ends.
        let ended = l.end_episodes(&[0], |uid| uid != "hog");
        assert_eq!(ended.len(), 1);
        assert!(l.is_empty());
        // A pod of the same name back with a new uid is a new pod.
        assert!(l.record(would("hog-2", 0)));
    }
}
