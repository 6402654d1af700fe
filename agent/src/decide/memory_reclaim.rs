//! Reclaim first, for memory too (opt-in, `memoryReclaim.enabled`): whether asking the
//! kernel to drop page cache can stand in for an eviction, and how much to ask for.
//!
//! The kubelet counts active file pages (page cache recently used) in the working set, so
//! `memory.available` can cross a threshold because of cache the kernel would drop in
//! milliseconds, and a pod is evicted for its own warm cache (kubernetes#43916). On cgroup
//! v2, writing N bytes to a cgroup's `memory.reclaim` asks the kernel to reclaim that much
//! from it now, clean page cache first. The loop asks only when the *active* file pages
//! could cover the shortfall: inactive file pages are already left out of the working set,
//! so dropping them frees nothing the signal sees, and anonymous memory is not file-backed
//! (without swap the kernel cannot reclaim it at all). A fast anonymous hog therefore skips
//! reclaim at once and is evicted without waiting for a reclaim that cannot succeed.
//!
//! Reclaim runs in steps, each re-deciding on fresh figures ([`next_step`]), so it stops as
//! soon as the threshold is clear, as soon as the file pages no longer cover what is left,
//! and at the time bound; whatever it could not fix is then evicted as before.

use std::time::Duration;

use crate::decide::pressure::{Observation, Observations};
use crate::decide::quantity::Quantity;
use crate::decide::thresholds::Threshold;

/// The largest single `memory.reclaim` write: one step stays short (clean page cache drops
/// at gigabytes per second), so the loop checks its time bound between steps.
pub(crate) const MAX_STEP_BYTES: u64 = 256 << 20;

/// The least one step asks for (when the file pages hold that much): asking for exactly a
/// small shortfall leaves the node on the threshold, and a pod re-reading its cache refills
/// a few hundred KiB before the next pass, so the loop would reclaim again and again; a
/// floor buys headroom, from cache only, at no cost beyond re-reading it.
pub(crate) const MIN_STEP_BYTES: u64 = 16 << 20;

/// The most steps one reclaim takes, whatever the time bound: each step asks for the whole
/// shortfall, so more than this means the kernel is not giving the file pages back faster
/// than they are read in again.
pub(crate) const MAX_STEPS: u32 = 16;

/// What the loop knows before a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReclaimView {
    /// How far available is below threshold plus minimum reclaim, bytes ([`shortfall`]).
    pub shortfall_bytes: u64,
    /// Active file pages of the cgroup reclaim is asked of (kubepods): what the working set
    /// counts and `memory.reclaim` can drop.
    pub active_file_bytes: u64,
    /// Time spent on this reclaim so far.
    pub elapsed: Duration,
    /// The bound (`memoryReclaim.timeout`).
    pub timeout: Duration,
    /// Steps taken so far.
    pub steps: u32,
}

/// Why reclaim stops (or is not tried) with the threshold still met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// The active file pages cannot cover the shortfall: the pressure is not page cache.
    FilePagesShort,
    /// The time bound passed.
    TimeBound,
    /// [`MAX_STEPS`] steps were taken.
    StepBound,
}

impl StopReason {
    /// The name records, events and metrics use.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StopReason::FilePagesShort => "file-pages-short",
            StopReason::TimeBound => "time-bound",
            StopReason::StepBound => "step-bound",
        }
    }
}

/// What to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Write this many bytes to `memory.reclaim`.
    Ask {
        /// Bytes to ask for.
        bytes: u64,
    },
    /// Stop reclaiming; evict what is left.
    Stop(StopReason),
}

/// The shortfall of `threshold` on `observation`: threshold plus minimum reclaim, minus what
/// is available, in bytes; zero when the threshold is clear.
pub(crate) fn shortfall(threshold: &Threshold, observation: &Observation) -> u64 {
    let capacity = observation.capacity.unwrap_or(Quantity::ZERO);
    let level = threshold.level(capacity, true).value();
    let available = observation.available.value();
    u64::try_from(level.saturating_sub(available).max(0)).unwrap_or(u64::MAX)
}

/// The largest shortfall among the memory thresholds on `observations`: what must be freed
/// for every one of them to clear with its minimum reclaim (the loop's test for reclaim
/// standing in for an eviction). Zero when all are clear.
pub(crate) fn memory_shortfall(thresholds: &[Threshold], observations: &Observations) -> u64 {
    thresholds
        .iter()
        .filter(|t| t.signal.is_memory())
        .filter_map(|t| observations.get(t.signal).map(|o| shortfall(t, o)))
        .max()
        .unwrap_or(0)
}

/// The next step. Reclaim is tried only while the active file pages cover the whole
/// shortfall (a partial reclaim would only delay the eviction it cannot avoid), within the
/// time and step bounds; each step asks for the shortfall, at least [`MIN_STEP_BYTES`] when
/// the active file pages hold that much, at most [`MAX_STEP_BYTES`].
/// A zero shortfall asks for nothing: the caller has already found the threshold clear.
pub(crate) fn next_step(view: &ReclaimView) -> Step {
    if view.active_file_bytes < view.shortfall_bytes || view.shortfall_bytes == 0 {
        return Step::Stop(StopReason::FilePagesShort);
    }
    if view.steps >= MAX_STEPS {
        return Step::Stop(StopReason::StepBound);
    }
    if view.elapsed >= view.timeout {
        return Step::Stop(StopReason::TimeBound);
    }
    Step::Ask {
        bytes: view
            .shortfall_bytes
            .max(MIN_STEP_BYTES.min(view.active_file_bytes))
            .min(MAX_STEP_BYTES),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::signal::Signal;
    use crate::decide::thresholds::ThresholdValue;

    const MI: u64 = 1 << 20;

    fn view(shortfall: u64, active: u64) -> ReclaimView {
        ReclaimView {
            shortfall_bytes: shortfall,
            active_file_bytes: active,
            elapsed: Duration::ZERO,
            timeout: Duration::from_millis(100),
            steps: 0,
        }
    }

    #[test]
    fn file_heavy_shortfall_asks_for_the_shortfall() {
        assert_eq!(
            next_step(&view(40 * MI, 200 * MI)),
            Step::Ask { bytes: 40 * MI }
        );
        // Exactly covered is enough.
        assert_eq!(
            next_step(&view(40 * MI, 40 * MI)),
            Step::Ask { bytes: 40 * MI }
        );
    }

    #[test]
    fn anonymous_pressure_skips_at_once() {
        assert_eq!(
            next_step(&view(40 * MI, 39 * MI)),
            Step::Stop(StopReason::FilePagesShort)
        );
        assert_eq!(
            next_step(&view(40 * MI, 0)),
            Step::Stop(StopReason::FilePagesShort)
        );
        // The file-pages check comes first: a hog never waits for the bounds either.
        let mut v = view(40 * MI, 0);
        v.elapsed = Duration::from_secs(1);
        assert_eq!(next_step(&v), Step::Stop(StopReason::FilePagesShort));
    }

    #[test]
    fn bounded_in_time_and_steps() {
        let mut v = view(40 * MI, 400 * MI);
        v.elapsed = Duration::from_millis(100);
        assert_eq!(next_step(&v), Step::Stop(StopReason::TimeBound));
        v.elapsed = Duration::from_millis(99);
        assert!(matches!(next_step(&v), Step::Ask { .. }));
        v.steps = MAX_STEPS;
        assert_eq!(next_step(&v), Step::Stop(StopReason::StepBound));
    }

    #[test]
    fn one_step_is_capped() {
        assert_eq!(
            next_step(&view(1 << 40, 2 << 40)),
            Step::Ask {
                bytes: MAX_STEP_BYTES
            }
        );
    }

    #[test]
    fn a_small_shortfall_asks_for_the_floor_within_the_file_pages() {
        assert_eq!(
            next_step(&view(MI, 200 * MI)),
            Step::Ask {
                bytes: MIN_STEP_BYTES
            }
        );
        assert_eq!(next_step(&view(MI, 4 * MI)), Step::Ask { bytes: 4 * MI });
    }

    #[test]
    fn nothing_short_asks_nothing() {
        assert_eq!(
            next_step(&view(0, 100 * MI)),
            Step::Stop(StopReason::FilePagesShort)
        );
    }

    #[test]
    fn shortfall_counts_the_minimum_reclaim() {
        let t = Threshold {
            signal: Signal::MemoryAvailable,
            value: ThresholdValue::Quantity(Quantity::from_units((100 * MI) as i64)),
            grace_period_nanos: 0,
            min_reclaim: Some(ThresholdValue::Quantity(Quantity::from_units(
                (50 * MI) as i64,
            ))),
        };
        let obs = |avail: u64| Observation {
            available: Quantity::from_units(avail as i64),
            capacity: Some(Quantity::from_units((1024 * MI) as i64)),
            at: 0,
        };
        assert_eq!(shortfall(&t, &obs(80 * MI)), 70 * MI);
        assert_eq!(shortfall(&t, &obs(200 * MI)), 0);
    }
}
