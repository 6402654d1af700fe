//! The node's pressure as the loop's last pass saw it, for `reactor status` and the API's
//! `NodeStatus`: each signal's value, each threshold with whether it is met and since when,
//! and the three node conditions with their last transition.
//!
//! The loop already reads every signal and evaluates every threshold on each pass; keeping
//! the outcome costs one small allocation per pass and means the status an operator reads is
//! exactly what the decisions were based on, never a second reading that could disagree.

use std::time::{Duration, SystemTime};

use crate::decide::pressure::{thresholds_met, EvictionState, Observations};
use crate::decide::psi_conditions::{FullAverages, PsiSettings, SOURCES};
use crate::decide::quantity::Quantity;
use crate::decide::signal::{NodeCondition, Signal};
use crate::decide::thresholds::{format_quantity, Threshold};
use crate::observe::Signals;

/// The three eviction node conditions, in the order the node status lists them (KEP-5394's
/// PSI conditions follow them with their gate on: [`Transitions::new`]).
pub(crate) const CONDITIONS: [NodeCondition; 3] = [
    NodeCondition::MemoryPressure,
    NodeCondition::DiskPressure,
    NodeCondition::PidPressure,
];

/// One signal's reading.
#[derive(Clone, Debug, PartialEq)]
pub struct SignalState {
    /// The signal.
    pub signal: Signal,
    /// What was available.
    pub available: Quantity,
    /// What it is measured against, when known.
    pub capacity: Option<Quantity>,
}

/// One configured threshold and where the signal stands against it.
#[derive(Clone, Debug, PartialEq)]
pub struct ThresholdState {
    /// The signal it watches.
    pub signal: Signal,
    /// `hard` (no grace period) or `soft`.
    pub hard: bool,
    /// The value as configured (`128Mi`, `10%`).
    pub value: String,
    /// The level it resolves to against the signal's capacity now (`134217728` bytes).
    pub resolved: Option<Quantity>,
    /// The soft grace period (zero for a hard threshold).
    pub grace_period: Duration,
    /// `evictionMinimumReclaim` for the signal, as configured.
    pub minimum_reclaim: Option<String>,
    /// Whether the signal is below the level now.
    pub met: bool,
    /// When it was first seen below the level in the current episode (wall clock).
    pub met_since: Option<SystemTime>,
}

/// One node condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionState {
    /// The condition.
    pub condition: NodeCondition,
    /// Whether it is reported true (the transition period applied).
    pub on: bool,
    /// When it last changed; the agent's start until the first change.
    pub last_transition: SystemTime,
}

/// The node's pressure at one pass.
#[derive(Clone, Debug, PartialEq)]
pub struct NodePressure {
    /// When the signals were read.
    pub observed_at: SystemTime,
    /// Every signal that could be read.
    pub signals: Vec<SignalState>,
    /// Every configured threshold.
    pub thresholds: Vec<ThresholdState>,
    /// The three eviction conditions, then the four PSI ones with their gate on.
    pub conditions: Vec<ConditionState>,
    /// With KEP-5394's gate on, the PSI figure each PSI condition read, and its threshold.
    pub psi: Vec<PsiFigure>,
    /// Whether the loop runs a dry run (`dryRun`).
    pub dry_run: bool,
    /// In a dry run, the evictions it would have made in the episodes still open.
    pub would_evict: Vec<WouldEvictState>,
}

/// One PSI condition's figure at the pass (KEP-5394).
#[derive(Clone, Debug, PartialEq)]
pub struct PsiFigure {
    /// The condition it feeds.
    pub condition: NodeCondition,
    /// Where it is read (`system.memory`, `kubepods.io`, ...).
    pub source: &'static str,
    /// The `full` averages, when they could be read.
    pub full: Option<FullAverages>,
    /// The condition's threshold (percent; 0 is off).
    pub threshold: f64,
}

/// An eviction a dry run would have made, as `reactor status` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WouldEvictState {
    /// `namespace/name`.
    pub pod: String,
    /// The pod uid.
    pub uid: String,
    /// The signal whose threshold was met.
    pub signal: String,
    /// The kubelet's eviction message.
    pub message: String,
    /// When it was recorded (wall clock).
    pub at: SystemTime,
}

/// The would-be evictions of a dry run's open episodes, their times on the wall clock of
/// `signals`' reading.
pub(crate) fn would_evict(
    recorded: &[crate::decide::dry_run::WouldEvict],
    signals: &Signals,
) -> Vec<WouldEvictState> {
    recorded
        .iter()
        .map(|w| {
            let ago = signals.monotonic_ns.saturating_sub(w.at_ns);
            WouldEvictState {
                pod: w.pod.clone(),
                uid: w.uid.clone(),
                signal: w.signal.clone(),
                message: w.message.clone(),
                at: signals
                    .wall
                    .checked_sub(Duration::from_nanos(ago))
                    .unwrap_or(signals.wall),
            }
        })
        .collect()
}

impl ConditionState {
    /// The kubelet's reason for the condition's state (`KubeletHasInsufficientMemory`, ...).
    pub fn reason(&self) -> &'static str {
        match (self.condition, self.on) {
            (NodeCondition::MemoryPressure, true) => "KubeletHasInsufficientMemory",
            (NodeCondition::MemoryPressure, false) => "KubeletHasSufficientMemory",
            (NodeCondition::DiskPressure, true) => "KubeletHasDiskPressure",
            (NodeCondition::DiskPressure, false) => "KubeletHasNoDiskPressure",
            (NodeCondition::PidPressure, true) => "KubeletHasInsufficientPID",
            (NodeCondition::PidPressure, false) => "KubeletHasSufficientPID",
            (c, on) => crate::decide::psi_conditions::reason(c, on).unwrap_or_default(),
        }
    }

    /// The kubelet's message for it.
    pub fn message(&self) -> &'static str {
        match (self.condition, self.on) {
            (NodeCondition::MemoryPressure, true) => "kubelet has insufficient memory available",
            (NodeCondition::MemoryPressure, false) => "kubelet has sufficient memory available",
            (NodeCondition::DiskPressure, true) => "kubelet has disk pressure",
            (NodeCondition::DiskPressure, false) => "kubelet has no disk pressure",
            (NodeCondition::PidPressure, true) => "kubelet has insufficient PID available",
            (NodeCondition::PidPressure, false) => "kubelet has sufficient PID available",
            (c, on) => crate::decide::psi_conditions::message(c, on).unwrap_or_default(),
        }
    }
}

/// The conditions' states and when each last changed, kept by the loop between passes.
#[derive(Clone, Debug)]
pub struct Transitions {
    psi: PsiSettings,
    listed: Vec<NodeCondition>,
    states: Vec<(bool, SystemTime)>,
}

impl Default for Transitions {
    fn default() -> Self {
        Transitions::new(&PsiSettings::default())
    }
}

impl Transitions {
    /// The three eviction conditions, and KEP-5394's four PSI ones with their gate on.
    pub fn new(psi: &PsiSettings) -> Transitions {
        let listed: Vec<NodeCondition> = CONDITIONS.iter().chain(psi.listed()).copied().collect();
        let states = vec![(false, SystemTime::now()); listed.len()];
        Transitions {
            psi: *psi,
            listed,
            states,
        }
    }

    /// The conditions the node reports, in order.
    pub(crate) fn listed(&self) -> &[NodeCondition] {
        &self.listed
    }
}

/// Builds the snapshot of one pass; `on` are the conditions the pass reports.
pub fn snapshot(
    thresholds: &[Threshold],
    state: &EvictionState,
    observations: &Observations,
    on: &[NodeCondition],
    transitions: &mut Transitions,
    signals: &Signals,
) -> NodePressure {
    let wall = signals.wall;
    let mono = i128::from(signals.monotonic_ns);
    let to_wall = |at: i128| {
        let ago = u64::try_from(mono.saturating_sub(at).max(0)).unwrap_or(0);
        wall.checked_sub(Duration::from_nanos(ago)).unwrap_or(wall)
    };
    let met = thresholds_met(thresholds, 0..thresholds.len(), observations, false);
    let threshold_states = thresholds
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let bytes = t.signal.resource().is_bytes();
            let capacity = observations.get(t.signal).and_then(|o| o.capacity);
            ThresholdState {
                signal: t.signal,
                hard: t.is_hard(),
                value: t.value.display(bytes).to_string(),
                resolved: capacity.map(|c| t.level(c, false)),
                grace_period: Duration::from_nanos(
                    u64::try_from(t.grace_period_nanos).unwrap_or(0),
                ),
                minimum_reclaim: t.min_reclaim.as_ref().map(|m| m.display(bytes).to_string()),
                met: met.contains(&i),
                met_since: state.first_observed_at.get(&i).map(|&at| to_wall(at)),
            }
        })
        .collect();
    let signal_states = Signal::ALL
        .iter()
        .filter_map(|&s| {
            let o = observations.get(s)?;
            Some(SignalState {
                signal: s,
                available: o.available,
                capacity: o.capacity,
            })
        })
        .collect();
    let conditions = transitions
        .listed
        .iter()
        .zip(transitions.states.iter_mut())
        .map(|(&c, (was, since))| {
            let now = on.contains(&c);
            if now != *was {
                *was = now;
                *since = wall;
            }
            ConditionState {
                condition: c,
                on: now,
                last_transition: *since,
            }
        })
        .collect();
    let psi = transitions
        .psi
        .listed()
        .iter()
        .enumerate()
        .map(|(i, &c)| PsiFigure {
            condition: c,
            source: SOURCES[i],
            full: observations.psi.of(c),
            threshold: transitions.psi.thresholds[i],
        })
        .collect();
    NodePressure {
        observed_at: wall,
        signals: signal_states,
        thresholds: threshold_states,
        conditions,
        psi,
        dry_run: false,
        would_evict: Vec::new(),
    }
}

/// A quantity printed the way the signal's unit is printed elsewhere (bytes as the kubelet
/// prints them, counts as plain numbers).
pub(crate) fn show(signal: Signal, q: Quantity) -> String {
    format_quantity(q, signal.resource().is_bytes())
}
