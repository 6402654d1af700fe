//! Pod QoS classes, computed as Kubernetes computes them.
//!
//! The QoS class decides a pod's cgroup parent, its `oom_score_adj` and the tier it falls in
//! when a critical pod preempts, so it must match the API server's value exactly. The rule:
//! each container (init containers included) is BestEffort when it names no cpu or memory,
//! Guaranteed when its cpu and memory requests equal its limits and are set, Burstable
//! otherwise; the pod is Guaranteed or BestEffort only when every container agrees, Burstable
//! otherwise. Pod-level resources (`spec.resources`), when set, decide alone.

use std::fmt;

use super::resources::{ResourceList, CPU, MEMORY};

/// A pod's quality-of-service class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QosClass {
    /// Requests equal limits for cpu and memory in every container.
    Guaranteed,
    /// Anything between: some request or limit, not all equal.
    Burstable,
    /// No cpu or memory request or limit anywhere.
    BestEffort,
}

impl QosClass {
    /// The API spelling (`"Guaranteed"`, `"Burstable"`, `"BestEffort"`).
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }

    /// Parses the API spelling, as found in `status.qosClass`.
    pub fn parse(text: &str) -> Option<QosClass> {
        match text {
            "Guaranteed" => Some(QosClass::Guaranteed),
            "Burstable" => Some(QosClass::Burstable),
            "BestEffort" => Some(QosClass::BestEffort),
            _ => None,
        }
    }
}

impl fmt::Display for QosClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The class of one set of requests and limits (one container, or the pod-level block).
///
/// Only cpu and memory count. An absent entry reads as zero, so a request without a limit (or
/// the reverse) makes the set Burstable; cpu set while memory is not is Burstable as well.
pub(crate) fn resources_qos(requests: &ResourceList, limits: &ResourceList) -> QosClass {
    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    let mut class: Option<QosClass> = None;
    for name in [CPU, MEMORY] {
        let request = requests.get_or_zero(name);
        let limit = limits.get_or_zero(name);
        if request != limit {
            return QosClass::Burstable;
        }
        let unset = request.nanos() == 0;
        let this = if unset {
            QosClass::BestEffort
        } else {
            QosClass::Guaranteed
        };
        match class {
            None => class = Some(this),
            Some(previous) if previous != this => return QosClass::Burstable,
            Some(_) => {}
        }
    }
    class.unwrap_or(QosClass::BestEffort)
}

/// Combines the classes of a pod's containers: any Burstable, or a mix of Guaranteed and
/// BestEffort, makes the pod Burstable; no container at all is BestEffort.
pub(crate) fn combine<I: IntoIterator<Item = QosClass>>(classes: I) -> QosClass {
    let mut pod: Option<QosClass> = None;
    for class in classes {
        match (pod, class) {
            (_, QosClass::Burstable) => return QosClass::Burstable,
            (None, c) => pod = Some(c),
            (Some(p), c) if p != c => return QosClass::Burstable,
            _ => {}
        }
    }
    pod.unwrap_or(QosClass::BestEffort)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::quantity::Quantity;

    fn list(entries: &[(&str, &str)]) -> ResourceList {
        entries
            .iter()
            .map(|(n, v)| (n.to_string(), Quantity::parse(v).unwrap()))
            .collect()
    }

    #[test]
    fn empty_is_best_effort() {
        assert_eq!(
            resources_qos(&ResourceList::new(), &ResourceList::new()),
            QosClass::BestEffort
        );
    }

    #[test]
    fn equal_cpu_and_memory_is_guaranteed() {
        let r = list(&[("cpu", "1"), ("memory", "1Gi")]);
        assert_eq!(resources_qos(&r, &r), QosClass::Guaranteed);
        // Exact comparison: 1000m is 1.
        let l = list(&[("cpu", "1000m"), ("memory", "1073741824")]);
        assert_eq!(resources_qos(&r, &l), QosClass::Guaranteed);
    }

    #[test]
    fn cpu_only_is_burstable() {
        let r = list(&[("cpu", "1")]);
        assert_eq!(resources_qos(&r, &r), QosClass::Burstable);
    }

    #[test]
    fn limits_only_is_burstable_without_api_defaulting() {
        let l = list(&[("cpu", "1"), ("memory", "1Gi")]);
        assert_eq!(resources_qos(&ResourceList::new(), &l), QosClass::Burstable);
    }

    #[test]
    fn other_resources_alone_are_best_effort() {
        let r = list(&[("ephemeral-storage", "1Gi")]);
        assert_eq!(
            resources_qos(&r, &ResourceList::new()),
            QosClass::BestEffort
        );
    }

    #[test]
    fn zero_quantities_count_as_unset() {
        let r = list(&[("cpu", "0"), ("memory", "0")]);
        assert_eq!(resources_qos(&r, &r), QosClass::BestEffort);
    }

    #[test]
    fn combining_mixed_classes_is_burstable() {
        use QosClass::*;
        assert_eq!(combine([Guaranteed, Guaranteed]), Guaranteed);
        assert_eq!(combine([BestEffort, BestEffort]), BestEffort);
        assert_eq!(combine([Guaranteed, BestEffort]), Burstable);
        assert_eq!(combine([BestEffort, Burstable]), Burstable);
        assert_eq!(combine([]), BestEffort);
    }
}
