//! Admission: does a pod fit next to the pods already admitted? Pure, as the kubelet's
//! `GeneralPredicates` resource check (`noderesources.Fits`) does it.
//!
//! What counts: the effective requests ([`PodInfo::requests`]) of every admitted pod that is
//! not terminal, plus the new pod's, against the node's allocatable. Allocatable is what the
//! kubelet reports in its node status (and so what the scheduler and its own admission compare
//! against): capacity minus `systemReserved` and `kubeReserved`, and for memory minus the
//! hard `memory.available` eviction threshold too. The `pods` count is checked first, then
//! cpu, memory and ephemeral storage, each only when the pod asks for some — the kubelet's
//! order, so the first failure named is the same one it names.
//!
//! Extended resources (device-plugin resources) are checked by the device manager
//! (`can_admit`), which knows which devices are healthy and free; hugepages are not modelled.

use crate::decide::pod::{clamp_i64, PodInfo};
use crate::decide::preempt::AdmitFailure;
use crate::decide::quantity::Quantity;
use crate::decide::resources::{ResourceList, CPU, EPHEMERAL_STORAGE, MEMORY, PODS};

/// The kubelet's default `maxPods`, the node's `pods` capacity.
pub(crate) const DEFAULT_MAX_PODS: i64 = 110;

/// The node's resources as admission compares them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeResources {
    /// Capacity: what the machine (or `node.*Capacity`) has.
    pub capacity: ResourceList,
    /// Capacity minus reserved, and for memory minus the hard eviction threshold.
    pub allocatable: ResourceList,
}

/// Capacity minus `reserved` (each `systemReserved` and `kubeReserved` entry), and memory
/// minus `hard_memory_threshold` (the resolved `evictionHard` `memory.available`), never
/// below zero. Resources the node has no capacity for are not listed.
pub(crate) fn allocatable(
    capacity: &ResourceList,
    reserved: &[&ResourceList],
    hard_memory_threshold: Option<Quantity>,
) -> ResourceList {
    let mut out = ResourceList::default();
    for (name, cap) in capacity.iter() {
        let mut left = cap;
        for r in reserved {
            left = left.saturating_sub(r.get_or_zero(name));
        }
        if name == MEMORY {
            if let Some(t) = hard_memory_threshold {
                left = left.saturating_sub(t);
            }
        }
        out.set(
            name,
            if left.is_negative() {
                Quantity::ZERO
            } else {
                left
            },
        );
    }
    out
}

/// The kubelet's integer view of a quantity for `resource`: millicores for cpu, whole units
/// (rounded up) for everything else.
pub(crate) fn units(resource: &str, q: Quantity) -> i64 {
    if resource == CPU {
        clamp_i64(q.milli_value())
    } else {
        clamp_i64(q.value())
    }
}

/// Every resource shortage that keeps `pod` off a node with `allocatable` where `admitted`
/// already run (`admitted` must hold only non-terminal pods, without `pod`). Empty: it fits.
pub(crate) fn fit(
    pod: &PodInfo,
    admitted: &[&PodInfo],
    allocatable: &ResourceList,
) -> Vec<AdmitFailure> {
    let mut failures = Vec::new();
    let allowed_pods = allocatable
        .get(PODS)
        .map_or(DEFAULT_MAX_PODS, |q| units(PODS, q));
    let used_pods = admitted.len() as i64;
    if used_pods + 1 > allowed_pods {
        failures.push(AdmitFailure::InsufficientResource {
            resource: PODS.to_string(),
            requested: 1,
            used: used_pods,
            capacity: allowed_pods,
        });
    }
    for resource in [CPU, MEMORY, EPHEMERAL_STORAGE] {
        let requested = units(resource, pod.requests.get_or_zero(resource));
        if requested == 0 {
            continue;
        }
        // Ephemeral storage is only checked where the node reports it (as the scheduler
        // skips it when the node has no such capacity).
        let Some(cap) = allocatable.get(resource) else {
            if resource == EPHEMERAL_STORAGE {
                continue;
            }
            failures.push(AdmitFailure::InsufficientResource {
                resource: resource.to_string(),
                requested,
                used: 0,
                capacity: 0,
            });
            continue;
        };
        let capacity = units(resource, cap);
        let used = admitted
            .iter()
            .map(|p| units(resource, p.requests.get_or_zero(resource)))
            .fold(0i64, i64::saturating_add);
        if requested > capacity.saturating_sub(used) {
            failures.push(AdmitFailure::InsufficientResource {
                resource: resource.to_string(),
                requested,
                used,
                capacity,
            });
        }
    }
    failures
}

/// The kubelet's rejection for a failure: reason `OutOf<resource>` and message
/// `Node didn't have enough resource: <r>, requested: N, used: N, capacity: N`
/// (`lifecycle.PredicateAdmitHandler` over `InsufficientResourceError`).
pub(crate) fn rejection(failure: &AdmitFailure) -> (String, String) {
    match failure {
        AdmitFailure::InsufficientResource {
            resource,
            requested,
            used,
            capacity,
        } => (
            format!("OutOf{resource}"),
            format!(
                "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
            ),
        ),
        AdmitFailure::Other { reason } => ("UnexpectedAdmissionError".to_string(), reason.clone()),
    }
}

/// Extended resources a pod asks for (resource names with a domain, `vendor.com/gpu`, that
/// are not `kubernetes.io/` or `hugepages-`), which the device manager admits.
pub(crate) fn is_extended(resource: &str) -> bool {
    resource.contains('/') && !resource.starts_with("kubernetes.io/")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, cpu: &str, memory: &str) -> PodInfo {
        let mut requests = serde_json::Map::new();
        if !cpu.is_empty() {
            requests.insert("cpu".into(), cpu.into());
        }
        if !memory.is_empty() {
            requests.insert("memory".into(), memory.into());
        }
        PodInfo::from_json(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}]}
        }))
        .unwrap()
    }

    fn list(pairs: &[(&str, &str)]) -> ResourceList {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity::parse(v).unwrap()))
            .collect()
    }

    #[test]
    fn allocatable_subtracts_reserved_and_the_hard_memory_threshold() {
        let cap = list(&[("cpu", "4"), ("memory", "8Gi"), ("pods", "110")]);
        let sys = list(&[("cpu", "500m"), ("memory", "1Gi")]);
        let kube = list(&[("memory", "512Mi")]);
        let a = allocatable(
            &cap,
            &[&sys, &kube],
            Some(Quantity::parse("100Mi").unwrap()),
        );
        assert_eq!(a.get("cpu"), Some(Quantity::parse("3500m").unwrap()));
        assert_eq!(
            a.get("memory"),
            Some(Quantity::from_units(
                (8i64 << 30) - (1 << 30) - (512 << 20) - (100 << 20)
            ))
        );
        assert_eq!(a.get("pods"), Some(Quantity::parse("110").unwrap()));
        // Never negative.
        let small = allocatable(&list(&[("memory", "1Gi")]), &[&sys], None);
        assert_eq!(small.get("memory"), Some(Quantity::ZERO));
    }

    #[test]
    fn fits_until_memory_runs_out_and_names_it_like_the_kubelet() {
        let alloc = list(&[("cpu", "2"), ("memory", "1Gi"), ("pods", "110")]);
        let a = pod("a", "500m", "600Mi");
        let b = pod("b", "500m", "500Mi");
        assert!(fit(&a, &[], &alloc).is_empty());
        let failures = fit(&b, &[&a], &alloc);
        assert_eq!(failures.len(), 1, "{failures:?}");
        let (reason, message) = rejection(&failures[0]);
        assert_eq!(reason, "OutOfmemory");
        assert_eq!(
            message,
            format!(
                "Node didn't have enough resource: memory, requested: {}, used: {}, capacity: {}",
                500 << 20,
                600 << 20,
                1 << 30
            )
        );
    }

    #[test]
    fn cpu_in_millicores_and_best_effort_always_fits_resources() {
        let alloc = list(&[("cpu", "1"), ("memory", "1Gi"), ("pods", "3")]);
        let a = pod("a", "700m", "");
        let b = pod("b", "301m", "");
        let (reason, message) = rejection(&fit(&b, &[&a], &alloc)[0]);
        assert_eq!(reason, "OutOfcpu");
        assert!(message.ends_with("requested: 301, used: 700, capacity: 1000"));
        let be = pod("be", "", "");
        assert!(fit(&be, &[&a, &b], &alloc).is_empty());
        let (reason, _) = rejection(&fit(&be, &[&a, &b, &be], &alloc)[0]);
        assert_eq!(reason, "OutOfpods");
    }

    #[test]
    fn extended_names() {
        assert!(is_extended("vendor.com/gpu"));
        assert!(!is_extended("memory"));
        assert!(!is_extended("hugepages-2Mi"));
        assert!(!is_extended("kubernetes.io/batch"));
    }
}
