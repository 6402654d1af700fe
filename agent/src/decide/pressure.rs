//! One housekeeping pass of the eviction manager over fresh observations: which thresholds
//! are met, which node conditions to report, and what to reclaim.
//!
//! The kubelet keeps state between passes (when each threshold was first met, when each
//! condition was last seen, which thresholds it acted on, when each signal was last
//! measured). Here that state is a plain value passed in and handed back, and the time is an
//! argument, so the same pass runs in the live agent and in `reactor plan pressure`.

use std::collections::BTreeMap;

use crate::decide::psi_conditions::{self, PsiReadings, PsiSettings, PsiState};
use crate::decide::quantity::Quantity;
use crate::decide::quantity_text::binary_si;
use crate::decide::signal::{NodeCondition, Resource, Signal};
use crate::decide::thresholds::{format_quantity, Threshold, ThresholdValue};

/// Nanoseconds on whatever clock the caller uses (Unix time for plans, monotonic live).
pub(crate) type Nanos = i128;

/// A signal measured at one moment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observation {
    /// How much is left.
    pub available: Quantity,
    /// The total the signal's percentages refer to; `None` when unknown (a percentage
    /// threshold on such a signal is then never met, which callers should refuse up front).
    pub capacity: Option<Quantity>,
    /// When the figure was measured.
    pub at: Nanos,
}

/// The latest observation of each signal.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observations {
    by_signal: [Option<Observation>; 9],
    /// The PSI `full` averages the KEP-5394 conditions read (none unless read).
    pub psi: PsiReadings,
}

fn slot(signal: Signal) -> usize {
    Signal::ALL.iter().position(|s| *s == signal).unwrap_or(0)
}

impl Observations {
    /// Records a signal's observation, replacing any earlier one.
    pub fn set(&mut self, signal: Signal, observation: Observation) {
        self.by_signal[slot(signal)] = Some(observation);
    }

    /// The observation of a signal, if it was measured.
    pub fn get(&self, signal: Signal) -> Option<&Observation> {
        self.by_signal[slot(signal)].as_ref()
    }
}

/// What the manager remembers between passes. Start with `EvictionState::default()`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EvictionState {
    /// Threshold (by index into the threshold list) → when it was first seen met.
    pub first_observed_at: BTreeMap<usize, Nanos>,
    /// Condition → when a threshold raising it was last seen met.
    pub conditions_last_observed_at: BTreeMap<NodeCondition, Nanos>,
    /// The thresholds the last pass acted on (grace periods satisfied), by index; they stay
    /// met until the minimum reclaim is satisfied too.
    pub thresholds_met: Vec<usize>,
    /// When each signal was last measured, to act only on fresh statistics.
    pub last_observed: Observations,
    /// The PSI conditions' rule as it stood at the last pass (KEP-5394's hysteresis).
    pub psi: PsiState,
}

/// What to reclaim in this pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Reclaim {
    /// Index of the threshold acted on.
    pub threshold: usize,
    /// Its signal.
    pub signal: Signal,
    /// The resource to reclaim.
    pub resource: Resource,
    /// The level available must reach: threshold plus minimum reclaim.
    pub reclaim_to: Quantity,
    /// The threshold's amount alone and what was available, for the eviction message.
    pub threshold_quantity: Quantity,
    /// What was available when the threshold was evaluated.
    pub available: Quantity,
    /// Whether the threshold is hard (grace period 0 for the evicted pod).
    pub hard: bool,
}

/// The outcome of one pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct PassResult {
    /// Thresholds met now, grace periods satisfied (indices, ascending).
    pub met: Vec<usize>,
    /// Node conditions to report (kept for the transition period after the last sighting).
    pub conditions: Vec<NodeCondition>,
    /// What to reclaim, if anything.
    pub reclaim: Option<Reclaim>,
}

/// Indices of the thresholds whose signal is below their level; with `enforce_min_reclaim`
/// the level includes the minimum reclaim (a threshold already acted on stays met until
/// available climbs past threshold + minimum reclaim).
pub(crate) fn thresholds_met(
    thresholds: &[Threshold],
    candidates: impl IntoIterator<Item = usize>,
    observations: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<usize> {
    candidates
        .into_iter()
        .filter(|&i| {
            let Some(t) = thresholds.get(i) else {
                return false;
            };
            let Some(obs) = observations.get(t.signal) else {
                return false;
            };
            let capacity = obs.capacity.unwrap_or(Quantity::ZERO);
            t.level(capacity, enforce_min_reclaim) > obs.available
        })
        .collect()
}

/// [`pass_with_psi`] with the PSI conditions off: how the tests run the kubelet's rules
/// alone.
#[cfg(test)]
pub(crate) fn pass(
    thresholds: &[Threshold],
    state: &EvictionState,
    observations: &Observations,
    now: Nanos,
    transition_period_nanos: i128,
) -> (EvictionState, PassResult) {
    pass_with_psi(
        thresholds,
        &PsiSettings::default(),
        state,
        observations,
        now,
        transition_period_nanos,
    )
}

/// Runs one housekeeping pass at `now`, as the kubelet's `synchronize` does up to the choice
/// of what to reclaim. `transition_period_nanos` is `evictionPressureTransitionPeriod`.
///
/// With KEP-5394's PSI conditions (off in `psi`'s default): each is seen while its rule holds on
/// `observations.psi` ([`psi_conditions::step`]) and reported, like the eviction conditions,
/// until the transition period has passed since it was last seen, so every condition the
/// agent reports has the same one. The kubelet sets its PSI conditions in a node-status
/// setter (`nodestatus.PSICondition`, PR #137357), outside the eviction manager whose
/// `evictionPressureTransitionPeriod` this is; that setter's code was not available to
/// read, so holding them for the period is the agent's choice (docs/cgroup-v2.md).
pub(crate) fn pass_with_psi(
    thresholds: &[Threshold],
    psi: &PsiSettings,
    state: &EvictionState,
    observations: &Observations,
    now: Nanos,
    transition_period_nanos: i128,
) -> (EvictionState, PassResult) {
    // Met now, ignoring grace periods; plus the ones acted on before whose minimum reclaim is
    // not yet satisfied.
    let mut met = thresholds_met(thresholds, 0..thresholds.len(), observations, false);
    let unresolved = thresholds_met(
        thresholds,
        state.thresholds_met.iter().copied(),
        observations,
        true,
    );
    for i in unresolved {
        if !met.contains(&i) {
            met.push(i);
        }
    }
    met.sort_unstable();

    let first_observed_at: BTreeMap<usize, Nanos> = met
        .iter()
        .map(|&i| (i, state.first_observed_at.get(&i).copied().unwrap_or(now)))
        .collect();

    // Conditions follow thresholds met regardless of grace periods.
    let mut conditions_last_observed_at = state.conditions_last_observed_at.clone();
    for &i in &met {
        conditions_last_observed_at.insert(thresholds[i].signal.condition(), now);
    }
    let psi_state = psi_conditions::step(psi, &state.psi, &observations.psi);
    for c in psi_state.contended() {
        conditions_last_observed_at.insert(c, now);
    }
    if !psi.enabled {
        conditions_last_observed_at.retain(|c, _| !psi_conditions::is_psi(*c));
    }
    let conditions: Vec<NodeCondition> = conditions_last_observed_at
        .iter()
        .filter(|(_, &at)| now - at < transition_period_nanos)
        .map(|(c, _)| *c)
        .collect();

    let acting: Vec<usize> = first_observed_at
        .iter()
        .filter(|(&i, &at)| now - at >= i128::from(thresholds[i].grace_period_nanos))
        .map(|(&i, _)| i)
        .collect();

    // Act only on signals measured since the previous pass.
    let fresh: Vec<usize> = acting
        .iter()
        .copied()
        .filter(|&i| {
            let signal = thresholds[i].signal;
            match (observations.get(signal), state.last_observed.get(signal)) {
                (Some(obs), Some(last)) => obs.at > last.at,
                (Some(_), None) => true,
                (None, _) => false,
            }
        })
        .collect();

    let reclaim =
        pick_reclaim(thresholds, &fresh).and_then(|i| reclaim_of(thresholds, i, observations));

    let next = EvictionState {
        first_observed_at,
        conditions_last_observed_at,
        thresholds_met: acting.clone(),
        last_observed: observations.clone(),
        psi: psi_state,
    };
    (
        next,
        PassResult {
            met: acting,
            conditions,
            reclaim,
        },
    )
}

/// What reclaiming for threshold `i` means with `observations`; `None` when its signal was
/// not observed.
pub(crate) fn reclaim_of(
    thresholds: &[Threshold],
    i: usize,
    observations: &Observations,
) -> Option<Reclaim> {
    let t = thresholds.get(i)?;
    let obs = observations.get(t.signal)?;
    let capacity = obs.capacity.unwrap_or(Quantity::ZERO);
    Some(Reclaim {
        threshold: i,
        signal: t.signal,
        resource: t.signal.resource(),
        reclaim_to: t.level(capacity, true),
        threshold_quantity: t.level(capacity, false),
        available: obs.available,
        hard: t.is_hard(),
    })
}

/// The threshold to reclaim for: memory signals before all others (the kubelet's
/// `byEvictionPriority`); among equals, the first in the threshold list (hard thresholds
/// are listed before soft ones). The kubelet leaves the order among equals to map
/// iteration, so any choice among them is one it could make.
pub(crate) fn pick_reclaim(thresholds: &[Threshold], candidates: &[usize]) -> Option<usize> {
    candidates
        .iter()
        .copied()
        .filter(|&i| i < thresholds.len())
        .min_by_key(|&i| (!thresholds[i].signal.is_memory(), i))
}

/// The "Threshold quantity: …, available: …" figures of the eviction message, as the
/// kubelet's `getThresholdMetInfo` picks them: the first of the `met` thresholds that
/// starves `resource` and has an observation. A percentage threshold prints in the binary
/// form (the kubelet builds it as bytes whatever the resource); the available figure prints
/// as bytes for memory and disk, as a count for inodes and pids.
pub(crate) fn threshold_met_text(
    thresholds: &[Threshold],
    met: &[usize],
    observations: &Observations,
    resource: Resource,
) -> Option<(String, String)> {
    met.iter().find_map(|&i| {
        let t = thresholds.get(i)?;
        if t.signal.resource() != resource {
            return None;
        }
        let obs = observations.get(t.signal)?;
        let capacity = obs.capacity.unwrap_or(Quantity::ZERO);
        let quantity = match t.value {
            ThresholdValue::Quantity(q) => format_quantity(q, resource.is_bytes()),
            ThresholdValue::Percentage { .. } => {
                binary_si(t.value.quantity(capacity).nanos() / 1_000_000_000)
            }
        };
        Some((
            quantity,
            format_quantity(obs.available, resource.is_bytes()),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::thresholds::{parse_thresholds, EvictionSettings};

    const SEC: i128 = 1_000_000_000;
    const MI: i64 = 1 << 20;

    fn settings(hard: &[(&str, &str)], soft: &[(&str, &str, &str)]) -> Vec<Threshold> {
        let mut s = EvictionSettings {
            hard: hard
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        for (k, v, g) in soft {
            s.soft.insert(k.to_string(), v.to_string());
            s.soft_grace_period.insert(k.to_string(), g.to_string());
        }
        parse_thresholds(&s).unwrap()
    }

    fn mem(available_mi: i64, at: i128) -> Observations {
        let mut o = Observations::default();
        o.set(
            Signal::MemoryAvailable,
            Observation {
                available: Quantity::from_units(available_mi * MI),
                capacity: Some(Quantity::from_units(1024 * MI)),
                at,
            },
        );
        o
    }

    #[test]
    fn hard_threshold_acts_at_once_and_strictly_below() {
        let ts = settings(&[("memory.available", "100Mi")], &[]);
        let (_, r) = pass(
            &ts,
            &EvictionState::default(),
            &mem(100, SEC),
            SEC,
            300 * SEC,
        );
        assert!(r.met.is_empty(), "equal to the threshold is not below it");
        let (_, r) = pass(
            &ts,
            &EvictionState::default(),
            &mem(99, SEC),
            SEC,
            300 * SEC,
        );
        assert_eq!(r.met, [0]);
        assert_eq!(r.conditions, [NodeCondition::MemoryPressure]);
        let rec = r.reclaim.unwrap();
        assert!(rec.hard);
        assert_eq!(rec.reclaim_to, Quantity::from_units(100 * MI));
    }

    #[test]
    fn soft_threshold_waits_for_its_grace_period_but_condition_does_not() {
        let ts = settings(
            &[("memory.available", "50Mi")],
            &[("memory.available", "300Mi", "1m")],
        );
        let mut state = EvictionState::default();
        let mut results = Vec::new();
        for (t, avail) in [(0, 200), (30, 200), (60, 200), (70, 400)] {
            let (next, r) = pass(&ts, &state, &mem(avail, t * SEC), t * SEC, 300 * SEC);
            state = next;
            results.push(r);
        }
        assert!(results[0].met.is_empty());
        assert_eq!(results[0].conditions, [NodeCondition::MemoryPressure]);
        assert!(results[1].met.is_empty());
        assert_eq!(results[2].met, [1]);
        let rec = results[2].reclaim.unwrap();
        assert!(!rec.hard);
        // Recovered: not met, but the condition stays for the transition period.
        assert!(results[3].met.is_empty());
        assert_eq!(results[3].conditions, [NodeCondition::MemoryPressure]);
        let (_, r) = pass(&ts, &state, &mem(400, 361 * SEC), 361 * SEC, 300 * SEC);
        assert!(r.conditions.is_empty());
    }

    #[test]
    fn interrupted_soft_threshold_restarts_its_grace_period() {
        let ts = settings(&[], &[("memory.available", "300Mi", "1m")]);
        let ts: Vec<_> = ts.into_iter().filter(|t| !t.is_hard()).collect();
        let mut state = EvictionState::default();
        for (t, avail) in [(0, 200), (50, 400), (60, 200), (100, 200)] {
            let (next, r) = pass(&ts, &state, &mem(avail, t * SEC), t * SEC, 300 * SEC);
            state = next;
            assert!(r.met.is_empty(), "at {t}");
        }
        let (_, r) = pass(&ts, &state, &mem(200, 120 * SEC), 120 * SEC, 300 * SEC);
        assert_eq!(r.met.len(), 1);
    }

    #[test]
    fn min_reclaim_keeps_an_acted_threshold_met() {
        let mut s = EvictionSettings::default();
        s.hard
            .insert("memory.available".to_string(), "100Mi".to_string());
        s.minimum_reclaim
            .insert("memory.available".to_string(), "50Mi".to_string());
        let ts = parse_thresholds(&s).unwrap();
        let (state, r) = pass(
            &ts,
            &EvictionState::default(),
            &mem(90, SEC),
            SEC,
            300 * SEC,
        );
        assert_eq!(
            r.reclaim.unwrap().reclaim_to,
            Quantity::from_units(150 * MI)
        );
        // Above the threshold but below threshold + reclaim: still met.
        let (state, r) = pass(&ts, &state, &mem(120, 2 * SEC), 2 * SEC, 300 * SEC);
        assert_eq!(r.met, [0]);
        // Past threshold + reclaim: resolved.
        let (_, r) = pass(&ts, &state, &mem(151, 3 * SEC), 3 * SEC, 300 * SEC);
        assert!(r.met.is_empty());
        // Never acted on: min reclaim does not widen the threshold.
        let (_, r) = pass(
            &ts,
            &EvictionState::default(),
            &mem(120, SEC),
            SEC,
            300 * SEC,
        );
        assert!(r.met.is_empty());
    }

    #[test]
    fn stale_statistics_do_not_evict_twice() {
        let ts = settings(&[("memory.available", "100Mi")], &[]);
        let (state, r) = pass(
            &ts,
            &EvictionState::default(),
            &mem(50, SEC),
            SEC,
            300 * SEC,
        );
        assert!(r.reclaim.is_some());
        // Same measurement time again: met, but no action on stale stats.
        let (_, r) = pass(&ts, &state, &mem(50, SEC), 2 * SEC, 300 * SEC);
        assert_eq!(r.met, [0]);
        assert!(r.reclaim.is_none());
    }

    #[test]
    fn memory_is_reclaimed_before_disk_and_hard_before_soft() {
        let ts = settings(
            &[("nodefs.available", "1Gi"), ("memory.available", "100Mi")],
            &[("memory.available", "200Mi", "0s")],
        );
        // The soft threshold with a zero grace period is hard for the kubelet.
        assert!(ts.iter().all(Threshold::is_hard));
        let mut o = mem(50, SEC);
        o.set(
            Signal::NodeFsAvailable,
            Observation {
                available: Quantity::from_units(1),
                capacity: Some(Quantity::from_units(100 << 30)),
                at: SEC,
            },
        );
        let (_, r) = pass(&ts, &EvictionState::default(), &o, SEC, 300 * SEC);
        assert_eq!(r.met.len(), 3);
        assert_eq!(
            r.conditions,
            [NodeCondition::MemoryPressure, NodeCondition::DiskPressure]
        );
        let rec = r.reclaim.unwrap();
        assert_eq!(rec.signal, Signal::MemoryAvailable);
        assert_eq!(rec.threshold_quantity, Quantity::from_units(100 * MI));
    }

    #[test]
    fn threshold_text_for_the_message() {
        let ts = settings(
            &[("memory.available", "100Mi"), ("nodefs.inodesFree", "5%")],
            &[],
        );
        let mut o = mem(50, SEC);
        o.set(
            Signal::NodeFsInodesFree,
            Observation {
                available: Quantity::from_units(3000),
                capacity: Some(Quantity::from_units(100_000)),
                at: SEC,
            },
        );
        let (_, r) = pass(&ts, &EvictionState::default(), &o, SEC, 300 * SEC);
        assert_eq!(
            threshold_met_text(&ts, &r.met, &o, Resource::Memory),
            Some(("100Mi".to_string(), "50Mi".to_string()))
        );
        // 5% of 100000 inodes is 5000 (binary form: not a multiple of 1024, plain).
        assert_eq!(
            threshold_met_text(&ts, &r.met, &o, Resource::Inodes),
            Some(("5000".to_string(), "3k".to_string()))
        );
        assert_eq!(threshold_met_text(&ts, &r.met, &o, Resource::Pids), None);
    }

    #[test]
    fn a_signal_without_observation_is_never_met() {
        let ts = settings(&[("pid.available", "100")], &[]);
        let (_, r) = pass(&ts, &EvictionState::default(), &mem(1, SEC), SEC, 300 * SEC);
        assert!(r.met.is_empty());
        assert!(r.conditions.is_empty());
    }

    fn psi(system_memory: (f64, f64)) -> Observations {
        let mut o = mem(900, 0);
        o.psi.full[0] = Some(psi_conditions::FullAverages {
            avg10: system_memory.0,
            avg60: system_memory.1,
        });
        o
    }

    #[test]
    fn a_psi_condition_rises_holds_for_the_transition_period_and_falls() {
        let ts = settings(&[("memory.available", "100Mi")], &[]);
        let on = PsiSettings {
            enabled: true,
            ..PsiSettings::default()
        };
        let period = 30 * SEC;
        let sys = NodeCondition::SystemMemoryContentionPressure;
        // (at, avg10, avg60, reported?)
        let steps = [
            (0, 0.0, 0.0, false),
            // avg10 over, avg60 not yet: the KEP waits for the minute.
            (10, 5.0, 0.5, false),
            // Both over: True.
            (20, 12.0, 2.0, true),
            // avg60 still over, avg10 falling under: the rule keeps it (last seen now).
            (30, 0.2, 1.5, true),
            // avg60 under: the rule lets go, the transition period holds it...
            (40, 0.0, 0.5, true),
            // ... 29 s after it was last seen (at 30 s) ...
            (59, 0.0, 0.1, true),
            // ... and not at 30 s.
            (60, 0.0, 0.0, false),
        ];
        let mut state = EvictionState::default();
        for (at, avg10, avg60, want) in steps {
            let (next, r) = pass_with_psi(&ts, &on, &state, &psi((avg10, avg60)), at * SEC, period);
            state = next;
            assert_eq!(
                r.conditions.contains(&sys),
                want,
                "at {at}s: {:?}",
                r.conditions
            );
            assert!(
                r.met.is_empty() && r.reclaim.is_none(),
                "PSI evicts nothing"
            );
        }
    }

    #[test]
    fn psi_conditions_need_their_gate() {
        let ts = settings(&[("memory.available", "100Mi")], &[]);
        let (_, r) = pass(
            &ts,
            &EvictionState::default(),
            &psi((100.0, 100.0)),
            SEC,
            300 * SEC,
        );
        assert!(r.conditions.is_empty(), "{:?}", r.conditions);
        // Turned off while held: dropped at once, not after the transition period.
        let on = PsiSettings {
            enabled: true,
            ..PsiSettings::default()
        };
        let (state, r) = pass_with_psi(
            &ts,
            &on,
            &EvictionState::default(),
            &psi((100.0, 100.0)),
            SEC,
            300 * SEC,
        );
        assert_eq!(
            r.conditions,
            [NodeCondition::SystemMemoryContentionPressure]
        );
        let (_, r) = pass(&ts, &state, &psi((100.0, 100.0)), 2 * SEC, 300 * SEC);
        assert!(r.conditions.is_empty(), "{:?}", r.conditions);
    }
}
