//! The eviction a kernel kill at a hard threshold's crossing stands for.
//!
//! With `killAtCrossing`, the eBPF charge program kills the staged victim's process at the
//! crossing of a hard memory threshold's level (`sense::ebpf::stage`). The loop then completes
//! that eviction whatever its own pass finds a moment later: the victim's memory may already
//! be coming back, and a pass that read available above the threshold must not leave a pod
//! half-killed and unrecorded. The eviction is recorded for the threshold whose level the
//! kernel saw crossed, with what was available at the crossing by the kernel's own figures.

use super::pressure::{reclaim_of, Observation, Observations, Reclaim};
use super::quantity::Quantity;
use super::signal::Signal;
use super::thresholds::Threshold;

/// The kernel's figures at the crossing, in bytes: the watched cgroup's usage when the
/// crossing page was charged and the usage level it was checked against (the working-set
/// level plus the page cache it left out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtCrossing {
    /// Usage at the crossing.
    pub usage_bytes: u64,
    /// The usage level crossed.
    pub level_bytes: u64,
}

/// The reclaim a kill at the crossing of `signal`'s hard threshold stands for, and the
/// observations with that signal's `available` as it was at the crossing: the threshold's
/// level less how far past it usage was (the working-set level is `capacity - level`, so the
/// working set at the crossing was that plus the overshoot). `None` when no hard threshold
/// is on `signal` or the signal was not observed (its capacity is unknown).
pub fn crossing_reclaim(
    thresholds: &[Threshold],
    signal: Signal,
    observations: &Observations,
    at: AtCrossing,
) -> Option<(Reclaim, Observations)> {
    let i = thresholds
        .iter()
        .position(|t| t.signal == signal && t.is_hard())?;
    let obs = observations.get(signal)?;
    let capacity = obs.capacity.unwrap_or(Quantity::ZERO);
    let level = thresholds[i].level(capacity, false);
    let past = i64::try_from(at.usage_bytes.saturating_sub(at.level_bytes)).unwrap_or(i64::MAX);
    let available = level
        .saturating_sub(Quantity::from_units(past))
        .max(Quantity::ZERO);
    let mut then = observations.clone();
    then.set(
        signal,
        Observation {
            available,
            capacity: obs.capacity,
            at: obs.at,
        },
    );
    let reclaim = reclaim_of(thresholds, i, &then)?;
    Some((reclaim, then))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::thresholds::mebibytes as threshold;

    const MI: u64 = 1 << 20;

    fn observed(signal: Signal, available_mi: u64) -> Observations {
        let mut o = Observations::default();
        o.set(
            signal,
            Observation {
                available: Quantity::from_units((available_mi * MI) as i64),
                capacity: Some(Quantity::from_units((512 * MI) as i64)),
                at: 7,
            },
        );
        o
    }

    #[test]
    fn the_hard_threshold_is_met_as_the_kernel_saw_it_even_once_memory_is_back() {
        let signal = Signal::AllocatableMemoryAvailable;
        let thresholds = [threshold(signal, 256, 30), threshold(signal, 128, 0)];
        // The pass read 300Mi available (the victim's memory coming back); the kernel saw
        // usage 1 MiB past the level.
        let at = AtCrossing {
            usage_bytes: 385 * MI,
            level_bytes: 384 * MI,
        };
        let (r, then) = crossing_reclaim(&thresholds, signal, &observed(signal, 300), at).unwrap();
        assert_eq!(
            r.threshold, 1,
            "the hard one, not the soft one listed first"
        );
        assert!(r.hard);
        assert_eq!(r.available, Quantity::from_units((127 * MI) as i64));
        assert_eq!(
            then.get(signal).unwrap().available,
            Quantity::from_units((127 * MI) as i64)
        );
        assert_eq!(then.get(signal).unwrap().at, 7);
    }

    #[test]
    fn no_hard_threshold_or_no_observation_stands_for_nothing() {
        let signal = Signal::MemoryAvailable;
        let at = AtCrossing {
            usage_bytes: 10,
            level_bytes: 5,
        };
        let soft = [threshold(signal, 128, 30)];
        assert!(crossing_reclaim(&soft, signal, &observed(signal, 100), at).is_none());
        let hard = [threshold(signal, 128, 0)];
        assert!(crossing_reclaim(&hard, signal, &Observations::default(), at).is_none());
        // A usage level above usage (a record out of order) counts as no overshoot.
        let under = AtCrossing {
            usage_bytes: 5,
            level_bytes: 10,
        };
        let (r, _) = crossing_reclaim(&hard, signal, &observed(signal, 100), under).unwrap();
        assert_eq!(r.available, Quantity::from_units((128 * MI) as i64));
    }
}
