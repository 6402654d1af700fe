//! Evictions in flight: which met thresholds still call for a new eviction while earlier
//! victims are on their way out, and what a hard threshold does to a graceful eviction.
//!
//! The loop does not wait for a victim to die before it looks again (issue 23): a soft
//! eviction's grace period may be a minute, and the node must stay guarded meanwhile. So
//! every pass sees the victims in flight, and these rules say what they stand for:
//!
//! - A victim that got SIGKILL and is dying normally gives its memory back within
//!   moments: its usage counts as already freed, so a second pod is not evicted where one
//!   suffices. The kubelet gets the same effect by waiting for the victim; here the loop
//!   keeps watching, and evicts the next pod only when memory falls further than the
//!   victims in flight will give back.
//! - A victim still in its grace period (SIGTERM sent, not yet killed) counts as freed for
//!   soft thresholds — its grace is what a soft threshold grants — but not for hard ones: a
//!   hard threshold never waits behind a soft eviction (kubernetes#123872).
//! - A victim past its bound (killed, and still not gone: a frozen cgroup, a process in D
//!   state, a hung runtime stop) counts for nothing: the next pod is evicted. The bound
//!   runs from the kill, or from the victim's last visible release of memory when later
//!   (the loop tracks that for each victim, up to the kubelet's 30 s cleanup wait): a
//!   victim still giving pages back is dying, not stuck.
//!
//! For disk and pids the victims' share is not measured per pod here; a victim in flight for
//! the same resource covers the threshold as a whole, by the same three rules.

use crate::decide::pressure::Observations;
use crate::decide::quantity::Quantity;
use crate::decide::signal::Resource;
use crate::decide::thresholds::Threshold;

/// One eviction in flight as the rules see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Victim {
    /// The resource it was evicted for.
    pub resource: Resource,
    /// Whether its processes got SIGKILL (grace 0, escalated, or its grace ran out).
    pub killed: bool,
    /// Whether it is past its bound and still not gone: it counts for nothing.
    pub stuck: bool,
    /// Memory it still holds and will give back (its usage now, capped by its usage at the
    /// decision), bytes; 0 once released.
    pub pending_bytes: u64,
}

impl Victim {
    /// Whether this victim counts against `threshold` (see the module doc).
    fn counts_for(&self, threshold: &Threshold) -> bool {
        self.resource == threshold.signal.resource()
            && !self.stuck
            && (self.killed || !threshold.is_hard())
    }
}

/// The thresholds among `met` that are still met once the victims in flight are counted:
/// for a memory signal, with what the counting victims will give back added to what is
/// available (against the threshold plus its minimum reclaim, the level an eviction
/// reclaims to); for another signal, met unless a counting victim for its resource is in
/// flight.
pub(crate) fn uncovered(
    thresholds: &[Threshold],
    met: &[usize],
    observations: &Observations,
    victims: &[Victim],
) -> Vec<usize> {
    met.iter()
        .copied()
        .filter(|&i| {
            let Some(t) = thresholds.get(i) else {
                return false;
            };
            let counting = victims.iter().filter(|v| v.counts_for(t));
            if !t.signal.is_memory() {
                return counting.count() == 0;
            }
            let Some(obs) = observations.get(t.signal) else {
                return true;
            };
            let back: u64 = counting.map(|v| v.pending_bytes).sum();
            let back = Quantity::from_units(i64::try_from(back).unwrap_or(i64::MAX));
            let capacity = obs.capacity.unwrap_or(Quantity::ZERO);
            t.level(capacity, true) > obs.available.saturating_add(back)
        })
        .collect()
}

/// What a hard threshold does when the ranking (`order`, first to evict first, over the
/// candidates) includes pods whose graceful eviction is in flight (`in_flight[i]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HardChoice {
    /// The first non-critical pod is already being evicted gracefully: its stop becomes a
    /// SIGKILL now.
    Escalate(usize),
    /// Evict this pod (not in flight) with grace 0.
    Evict(usize),
}

/// The first non-critical pod in `order`: escalated if its graceful eviction is in flight,
/// evicted otherwise; `None` when every pod is critical.
pub(crate) fn hard_choice(
    order: &[usize],
    critical: impl Fn(usize) -> bool,
    in_flight: impl Fn(usize) -> bool,
) -> Option<HardChoice> {
    let first = order.iter().copied().find(|&i| !critical(i))?;
    Some(if in_flight(first) {
        HardChoice::Escalate(first)
    } else {
        HardChoice::Evict(first)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::pressure::Observation;
    use crate::decide::signal::Signal;
    use crate::decide::thresholds::ThresholdValue;

    const MI: i64 = 1 << 20;

    use crate::decide::thresholds::mebibytes as threshold;

    fn available(mi: i64) -> Observations {
        let mut o = Observations::default();
        o.set(
            Signal::MemoryAvailable,
            Observation {
                available: Quantity::from_units(mi * MI),
                capacity: Some(Quantity::from_units(512 * MI)),
                at: 0,
            },
        );
        o
    }

    fn memory_victim(killed: bool, stuck: bool, pending_mi: u64) -> Victim {
        Victim {
            resource: Resource::Memory,
            killed,
            stuck,
            pending_bytes: pending_mi << 20,
        }
    }

    /// The node: hard at 100Mi, soft at 300Mi with a grace period.
    fn node() -> Vec<Threshold> {
        vec![
            threshold(Signal::MemoryAvailable, 100, 0),
            threshold(Signal::MemoryAvailable, 300, 1_000_000_000),
        ]
    }

    #[test]
    fn with_nothing_in_flight_every_met_threshold_stands() {
        assert_eq!(uncovered(&node(), &[0, 1], &available(50), &[]), [0, 1]);
    }

    #[test]
    fn a_killed_victims_memory_counts_as_freed_so_one_eviction_suffices() {
        // 80Mi left, a victim holding 60Mi is dying: 140Mi once it is gone, above 100Mi.
        let v = [memory_victim(true, false, 60)];
        assert_eq!(
            uncovered(&node(), &[0], &available(80), &v),
            Vec::<usize>::new()
        );
        // Memory fell further than the victim will give back: the next pod goes now.
        assert_eq!(uncovered(&node(), &[0], &available(30), &v), [0]);
        // Two victims together cover what one does not.
        let two = [
            memory_victim(true, false, 60),
            memory_victim(true, false, 20),
        ];
        assert_eq!(
            uncovered(&node(), &[0], &available(30), &two),
            Vec::<usize>::new()
        );
    }

    #[test]
    fn a_graceful_victim_covers_soft_thresholds_but_never_hard_ones() {
        // The scenario: A (230Mi) in its 60 s grace, B growing; 90Mi left.
        let a = [memory_victim(false, false, 230)];
        assert_eq!(uncovered(&node(), &[0, 1], &available(90), &a), [0]);
        // Soft alone: A's eviction stands for it, no second soft eviction.
        assert_eq!(
            uncovered(&node(), &[1], &available(200), &a),
            Vec::<usize>::new()
        );
        // Once A is killed (escalated) it counts for the hard threshold too.
        let killed = [memory_victim(true, false, 230)];
        assert_eq!(
            uncovered(&node(), &[0, 1], &available(90), &killed),
            Vec::<usize>::new()
        );
    }

    #[test]
    fn a_stuck_victim_counts_for_nothing() {
        let v = [memory_victim(true, true, 200)];
        assert_eq!(uncovered(&node(), &[0], &available(80), &v), [0]);
    }

    #[test]
    fn minimum_reclaim_is_the_level_the_victims_must_reach() {
        let mut t = node();
        t[0].min_reclaim = Some(ThresholdValue::Quantity(Quantity::from_units(50 * MI)));
        // 80 + 60 = 140Mi: above 100Mi, below 150Mi.
        let v = [memory_victim(true, false, 60)];
        assert_eq!(uncovered(&t, &[0], &available(80), &v), [0]);
    }

    #[test]
    fn other_resources_are_covered_by_any_counting_victim_of_theirs() {
        let t = vec![threshold(Signal::NodeFsAvailable, 1024, 0)];
        let disk = |killed, stuck| Victim {
            resource: Resource::EphemeralStorage,
            killed,
            stuck,
            pending_bytes: 0,
        };
        let o = Observations::default();
        assert_eq!(
            uncovered(&t, &[0], &o, &[disk(true, false)]),
            Vec::<usize>::new()
        );
        assert_eq!(uncovered(&t, &[0], &o, &[disk(false, false)]), [0], "hard");
        assert_eq!(uncovered(&t, &[0], &o, &[disk(true, true)]), [0], "stuck");
        // A memory victim says nothing about disk.
        assert_eq!(
            uncovered(&t, &[0], &o, &[memory_victim(true, false, 1)]),
            [0]
        );
    }

    #[test]
    fn a_hard_threshold_escalates_the_graceful_victim_when_it_ranks_first() {
        // Ranking 2, 0, 1; pod 2 critical; pod 0 in its grace period.
        let order = [2, 0, 1];
        let critical = |i| i == 2;
        assert_eq!(
            hard_choice(&order, critical, |i| i == 0),
            Some(HardChoice::Escalate(0))
        );
        // The graceful victim ranks second: the first pod is evicted at once instead.
        assert_eq!(
            hard_choice(&order, critical, |i| i == 1),
            Some(HardChoice::Evict(0))
        );
        assert_eq!(hard_choice(&[2], critical, |_| false), None);
    }
}
