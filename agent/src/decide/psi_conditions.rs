//! PSI node conditions (KEP-5394, feature gate `PSINodeCondition`, alpha): memory and I/O
//! contention, for the whole system and for kubepods, from the kernel's `full` stall
//! averages.
//!
//! Sources followed: the KEP, `keps/sig-node/5394-psi-node-conditions/README.md` and
//! `kep.yaml` in kubernetes/enhancements at 64765b4 (July 2026; stage alpha, milestone
//! v1.36), and the kubelet's implementation, kubernetes/kubernetes PR #137357 "Implement
//! PSINodeCondition" (its `pkg/kubelet` PSI tests: four conditions, one
//! `nodestatus.PSICondition` setter each, fed the Summary API's `psi.full` `avg10`/`avg60`
//! of the node's memory and I/O and of the pods' system container, each with its own
//! threshold in the KubeletConfiguration). What this module takes from them:
//!
//! | condition | PSI figure | threshold key |
//! | --- | --- | --- |
//! | `SystemMemoryContentionPressure` | `/proc/pressure/memory` `full` | `systemMemoryContentionThreshold` |
//! | `SystemDiskContentionPressure` | `/proc/pressure/io` `full` | `systemDiskContentionThreshold` |
//! | `KubepodsMemoryContentionPressure` | kubepods' `memory.pressure` `full` | `kubepodsMemoryContentionThreshold` |
//! | `KubepodsDiskContentionPressure` | kubepods' `io.pressure` `full` | `kubepodsDiskContentionThreshold` |
//!
//! A threshold is in the unit the kernel prints the averages in, percent of wall time
//! (`0.9` is 0.9 % of the time with every task stalled), and `0` turns its condition off, as
//! in the kubelet's tests (a zero threshold reads no PSI at all). The rule is the KEP's
//! ("Design Details", point 3): the condition turns on when `avg60 >= threshold` and the
//! pressure is still rising, `avg10 >= threshold`; it turns off when `avg60 < threshold`; in
//! between (avg60 at or above, avg10 below: pressure falling) it keeps its state. Reported
//! conditions then follow the eviction manager's rule for every node condition: kept until
//! `evictionPressureTransitionPeriod` has passed since the rule last held
//! ([`crate::decide::pressure::pass_with_psi`]).
//!
//! Pure: readings and the previous state in, the next state out; no clock, no files.

use crate::decide::signal::NodeCondition;

/// The kubelet's default for each threshold: 0.9 (percent). The PR's
/// `pkg/kubelet/apis/config/v1beta1/defaults.go` set all four to `0.9` when its authors ran
/// their threshold experiments (March 2026); the merged file was not available to check.
pub(crate) const DEFAULT_THRESHOLD: f64 = 0.9;

/// The four PSI conditions, in the order the node status lists them here.
pub(crate) const PSI_CONDITIONS: [NodeCondition; 4] = [
    NodeCondition::SystemMemoryContentionPressure,
    NodeCondition::SystemDiskContentionPressure,
    NodeCondition::KubepodsMemoryContentionPressure,
    NodeCondition::KubepodsDiskContentionPressure,
];

/// The KubeletConfiguration key of each condition's threshold, in [`PSI_CONDITIONS`] order.
pub(crate) const THRESHOLD_KEYS: [&str; 4] = [
    "systemMemoryContentionThreshold",
    "systemDiskContentionThreshold",
    "kubepodsMemoryContentionThreshold",
    "kubepodsDiskContentionThreshold",
];

/// Where each condition's figure is read, in [`PSI_CONDITIONS`] order (for messages and
/// `reactor plan pressure`'s input keys).
pub(crate) const SOURCES: [&str; 4] = [
    "system.memory",
    "system.io",
    "kubepods.memory",
    "kubepods.io",
];

/// The `full` averages of one pressure file, in percent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FullAverages {
    /// Over the last 10 s.
    pub avg10: f64,
    /// Over the last 60 s.
    pub avg60: f64,
}

/// One reading of the four figures; `None` where a figure could not be read (no PSI in the
/// kernel, cgroup v1 for the kubepods ones, kubepods not made yet).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PsiReadings {
    /// In [`PSI_CONDITIONS`] order.
    pub full: [Option<FullAverages>; 4],
}

impl PsiReadings {
    /// The reading for `condition`, if it is a PSI condition and was read.
    pub(crate) fn of(&self, condition: NodeCondition) -> Option<FullAverages> {
        slot(condition).and_then(|i| self.full[i])
    }
}

/// The feature gate and the four thresholds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PsiSettings {
    /// `featureGates.PSINodeCondition` (off by default).
    pub enabled: bool,
    /// In [`PSI_CONDITIONS`] order; `0` turns a condition off.
    pub thresholds: [f64; 4],
}

impl Default for PsiSettings {
    fn default() -> Self {
        PsiSettings {
            enabled: false,
            thresholds: [DEFAULT_THRESHOLD; 4],
        }
    }
}

impl PsiSettings {
    /// The PSI conditions the node reports: all four with the gate on (a condition whose
    /// threshold is 0 is reported, always False), none with it off.
    pub(crate) fn listed(&self) -> &'static [NodeCondition] {
        if self.enabled {
            &PSI_CONDITIONS
        } else {
            &[]
        }
    }

    /// Checks a threshold as the config and the plan input take it: a finite percentage,
    /// 0 to 100.
    pub(crate) fn check_threshold(value: f64) -> Result<(), NotAPercentage> {
        if value.is_finite() && (0.0..=100.0).contains(&value) {
            Ok(())
        } else {
            Err(NotAPercentage(value))
        }
    }
}

/// A PSI condition threshold outside 0 to 100.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error("{0} is not a percentage of stalled time from 0 to 100 (0 turns the condition off)")]
pub(crate) struct NotAPercentage(pub f64);

/// Which PSI conditions the rule holds for now, without the transition period.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PsiState {
    /// In [`PSI_CONDITIONS`] order.
    pub contended: [bool; 4],
}

impl PsiState {
    /// The conditions the rule holds for.
    pub(crate) fn contended(&self) -> impl Iterator<Item = NodeCondition> + '_ {
        PSI_CONDITIONS
            .iter()
            .zip(self.contended)
            .filter(|(_, on)| *on)
            .map(|(c, _)| *c)
    }
}

/// The reason a PSI condition is given: `KubeletHas<Type>` when True, as the kubelet's
/// setter reports it (seen in the PR authors' experiment output, March 2026);
/// `KubeletHasNo<Type>` when False, chosen here after `KubeletHasNoDiskPressure` (the
/// kubelet's False reason was not found). `None` for a condition that is not a PSI one.
pub fn reason(condition: NodeCondition, on: bool) -> Option<&'static str> {
    Some(match (condition, on) {
        (NodeCondition::SystemMemoryContentionPressure, true) => {
            "KubeletHasSystemMemoryContentionPressure"
        }
        (NodeCondition::SystemMemoryContentionPressure, false) => {
            "KubeletHasNoSystemMemoryContentionPressure"
        }
        (NodeCondition::SystemDiskContentionPressure, true) => {
            "KubeletHasSystemDiskContentionPressure"
        }
        (NodeCondition::SystemDiskContentionPressure, false) => {
            "KubeletHasNoSystemDiskContentionPressure"
        }
        (NodeCondition::KubepodsMemoryContentionPressure, true) => {
            "KubeletHasKubepodsMemoryContentionPressure"
        }
        (NodeCondition::KubepodsMemoryContentionPressure, false) => {
            "KubeletHasNoKubepodsMemoryContentionPressure"
        }
        (NodeCondition::KubepodsDiskContentionPressure, true) => {
            "KubeletHasKubepodsDiskContentionPressure"
        }
        (NodeCondition::KubepodsDiskContentionPressure, false) => {
            "KubeletHasNoKubepodsDiskContentionPressure"
        }
        _ => return None,
    })
}

/// The message that goes with [`reason`]: `kubelet has <Type>` (the kubelet's) or
/// `kubelet has no <Type>`.
pub fn message(condition: NodeCondition, on: bool) -> Option<&'static str> {
    Some(match (condition, on) {
        (NodeCondition::SystemMemoryContentionPressure, true) => {
            "kubelet has SystemMemoryContentionPressure"
        }
        (NodeCondition::SystemMemoryContentionPressure, false) => {
            "kubelet has no SystemMemoryContentionPressure"
        }
        (NodeCondition::SystemDiskContentionPressure, true) => {
            "kubelet has SystemDiskContentionPressure"
        }
        (NodeCondition::SystemDiskContentionPressure, false) => {
            "kubelet has no SystemDiskContentionPressure"
        }
        (NodeCondition::KubepodsMemoryContentionPressure, true) => {
            "kubelet has KubepodsMemoryContentionPressure"
        }
        (NodeCondition::KubepodsMemoryContentionPressure, false) => {
            "kubelet has no KubepodsMemoryContentionPressure"
        }
        (NodeCondition::KubepodsDiskContentionPressure, true) => {
            "kubelet has KubepodsDiskContentionPressure"
        }
        (NodeCondition::KubepodsDiskContentionPressure, false) => {
            "kubelet has no KubepodsDiskContentionPressure"
        }
        _ => return None,
    })
}

/// Whether `condition` is one of the four PSI conditions.
pub(crate) fn is_psi(condition: NodeCondition) -> bool {
    PSI_CONDITIONS.contains(&condition)
}

fn slot(condition: NodeCondition) -> Option<usize> {
    PSI_CONDITIONS.iter().position(|c| *c == condition)
}

/// The KEP's rule for one condition: `was` its state before, `reading` the figure now.
/// No reading keeps the state (a missed read is not relief); a zero threshold is off.
pub(crate) fn contended(threshold: f64, was: bool, reading: Option<FullAverages>) -> bool {
    if threshold <= 0.0 {
        return false;
    }
    let Some(r) = reading else {
        return was;
    };
    if r.avg60 < threshold {
        false
    } else if r.avg10 >= threshold {
        true
    } else {
        // avg60 at or above the threshold but avg10 below it: trending lower, state kept.
        was
    }
}

/// One step of the four conditions' rule. With the gate off, nothing is ever contended.
pub(crate) fn step(settings: &PsiSettings, state: &PsiState, readings: &PsiReadings) -> PsiState {
    let mut next = PsiState::default();
    if !settings.enabled {
        return next;
    }
    for i in 0..PSI_CONDITIONS.len() {
        next.contended[i] = contended(settings.thresholds[i], state.contended[i], readings.full[i]);
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    fn avg(avg10: f64, avg60: f64) -> Option<FullAverages> {
        Some(FullAverages { avg10, avg60 })
    }

    #[test]
    fn the_keps_rule_rises_on_both_averages_and_falls_on_avg60() {
        let t = 0.9;
        // Both below: off.
        assert!(!contended(t, false, avg(0.5, 0.5)));
        // avg10 alone over (a burst the minute has not seen): still off.
        assert!(!contended(t, false, avg(6.0, 0.5)));
        // avg60 over but falling (avg10 below): an off condition stays off...
        assert!(!contended(t, false, avg(0.5, 1.0)));
        // ... and an on one stays on.
        assert!(contended(t, true, avg(0.5, 1.0)));
        // Both at or over: on (>= counts).
        assert!(contended(t, false, avg(0.9, 0.9)));
        assert!(contended(t, false, avg(6.0, 4.0)));
        // avg60 below: off, whatever avg10 says.
        assert!(!contended(t, true, avg(6.0, 0.89)));
    }

    #[test]
    fn a_zero_threshold_is_off_even_at_full_stall() {
        // The kubelet's "zero threshold" case: 100 % stalled, no condition.
        assert!(!contended(0.0, false, avg(100.0, 100.0)));
        assert!(!contended(0.0, true, avg(100.0, 100.0)));
    }

    #[test]
    fn a_missing_reading_keeps_the_state() {
        assert!(contended(0.9, true, None));
        assert!(!contended(0.9, false, None));
    }

    #[test]
    fn the_gate_off_contends_nothing() {
        let readings = PsiReadings {
            full: [avg(100.0, 100.0); 4],
        };
        let off = PsiSettings::default();
        assert!(!off.enabled);
        assert_eq!(
            step(&off, &PsiState::default(), &readings),
            PsiState::default()
        );
        assert!(off.listed().is_empty());
        let on = PsiSettings {
            enabled: true,
            ..off
        };
        // The kubelet's "all four True at 100 % with 0.9 thresholds" case.
        let s = step(&on, &PsiState::default(), &readings);
        assert_eq!(s.contended().collect::<Vec<_>>(), PSI_CONDITIONS);
        assert_eq!(on.listed(), PSI_CONDITIONS);
    }

    #[test]
    fn each_condition_reads_its_own_figure_and_threshold() {
        let settings = PsiSettings {
            enabled: true,
            thresholds: [0.9, 5.0, 0.0, 0.9],
        };
        let readings = PsiReadings {
            full: [avg(1.0, 1.0), avg(4.0, 4.0), avg(50.0, 50.0), None],
        };
        let s = step(&settings, &PsiState::default(), &readings);
        assert_eq!(
            s.contended().collect::<Vec<_>>(),
            [NodeCondition::SystemMemoryContentionPressure]
        );
        assert_eq!(
            readings.of(NodeCondition::SystemDiskContentionPressure),
            avg(4.0, 4.0)
        );
        assert_eq!(readings.of(NodeCondition::MemoryPressure), None);
    }

    #[test]
    fn reasons_and_messages_name_the_condition() {
        for c in PSI_CONDITIONS {
            assert_eq!(
                reason(c, true),
                Some(format!("KubeletHas{}", c.name()).as_str())
            );
            assert_eq!(
                reason(c, false),
                Some(format!("KubeletHasNo{}", c.name()).as_str())
            );
            assert_eq!(
                message(c, true),
                Some(format!("kubelet has {}", c.name()).as_str())
            );
            assert_eq!(
                message(c, false),
                Some(format!("kubelet has no {}", c.name()).as_str())
            );
        }
        assert_eq!(reason(NodeCondition::MemoryPressure, true), None);
    }

    #[test]
    fn thresholds_are_percentages() {
        assert!(PsiSettings::check_threshold(0.0).is_ok());
        assert!(PsiSettings::check_threshold(0.9).is_ok());
        assert!(PsiSettings::check_threshold(100.0).is_ok());
        for bad in [-0.1, 100.5, f64::NAN, f64::INFINITY] {
            assert!(PsiSettings::check_threshold(bad).is_err(), "{bad}");
        }
    }
}
