//! The eviction a kernel kill at a hard threshold's crossing stands for.
//!
//! With `killAtCrossing`, the eBPF charge program kills the staged victim's process at the
//! crossing of a hard memory threshold's level (`sense::ebpf::stage`). The loop then completes
//! that eviction whatever its own pass finds a moment later: the victim's memory may already
//! be coming back, and a pass that read available above the threshold must not leave a pod
//! half-killed and unrecorded. The eviction is recorded for the threshold whose level the
//! kernel saw crossed, with what was available at the crossing by the kernel's own figures.
//!
//! **Leaving a crossing to the kernel.** The loop may read a hard memory threshold as met a
//! moment before the kernel's check does, by a reading the kernel does not share: reclaim
//! takes a batch of page cache off the LRU (no longer counted inactive) before it uncharges
//! it, so a pass that reads usage and `memory.stat` in between overstates the working set by
//! the batch (measured on a node full of page cache: the passes woken by reclaim's own
//! `pgscan_direct` records, 2–4 MiB batches at 150–350 MiB/s, saw the crossing before the
//! kernel in 19 of 20 repetitions, and killed without the staged kill). While the kernel
//! watches the threshold, with a victim staged for it, a pass whose reading is at most
//! [`Defer::allowance_bytes`] past the level leaves the crossing to the kernel for at most
//! [`Defer::for_ns`]: the kernel kills the staged victim at the real crossing, or writes its
//! record (which wakes the loop to act) when the crossing is charged by another pod; the
//! bound makes the loop act anyway when neither came.

use super::pressure::{reclaim_of, Observation, Observations, Reclaim};
use super::quantity::Quantity;
use super::signal::Signal;
use super::thresholds::Threshold;

/// The kernel's figures at the crossing, in bytes: the watched cgroup's usage when the
/// crossing page was charged and the usage level it was checked against (the working-set
/// level plus the page cache it left out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AtCrossing {
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
pub(crate) fn crossing_reclaim(
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

/// How far and how long the loop leaves a crossing it read to the kernel's check (see the
/// module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Defer {
    /// The most the loop's reading may be past the level (the reclaim batch it may count).
    pub allowance_bytes: u64,
    /// The longest the loop waits from the first pass that left it.
    pub for_ns: u64,
}

/// Whether a pass that read `reclaim` met leaves it to the kernel, which watches it with a
/// victim staged (`kernel_ready`), given when the first pass of this run left it
/// (`since_ns`, `None`: none did) and the time now.
pub(crate) fn leave_to_kernel(
    reclaim: &Reclaim,
    kernel_ready: bool,
    since_ns: Option<u64>,
    now_ns: u64,
    defer: Defer,
) -> bool {
    if !kernel_ready
        || !reclaim.hard
        || reclaim.signal.resource() != super::signal::Resource::Memory
    {
        return false;
    }
    let past = reclaim
        .threshold_quantity
        .value()
        .saturating_sub(reclaim.available.value());
    let within = u64::try_from(past).is_ok_and(|p| p <= defer.allowance_bytes);
    let waited = since_ns.map_or(0, |s| now_ns.saturating_sub(s));
    within && waited < defer.for_ns
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

    #[test]
    fn a_crossing_just_read_is_left_to_the_kernel_for_a_bounded_time() {
        let signal = Signal::AllocatableMemoryAvailable;
        let hard = [threshold(signal, 128, 0)];
        let soft = [threshold(signal, 128, 30)];
        let met = |thresholds: &[Threshold], available_mi: u64| {
            reclaim_of(thresholds, 0, &observed(signal, available_mi)).unwrap()
        };
        let defer = Defer {
            allowance_bytes: 4 * MI,
            for_ns: 20_000_000,
        };
        // 2 MiB past the level, the kernel watching: left, the first time and within the bound.
        assert!(leave_to_kernel(&met(&hard, 126), true, None, 5, defer));
        assert!(leave_to_kernel(
            &met(&hard, 126),
            true,
            Some(0),
            19_999_999,
            defer
        ));
        // Not past the bound, not without the kernel, not beyond the allowance, never soft.
        assert!(!leave_to_kernel(
            &met(&hard, 126),
            true,
            Some(0),
            20_000_000,
            defer
        ));
        assert!(!leave_to_kernel(&met(&hard, 126), false, None, 5, defer));
        assert!(!leave_to_kernel(&met(&hard, 123), true, None, 5, defer));
        assert!(leave_to_kernel(&met(&hard, 124), true, None, 5, defer));
        assert!(!leave_to_kernel(&met(&soft, 126), true, None, 5, defer));
    }
}
