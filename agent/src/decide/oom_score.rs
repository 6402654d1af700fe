//! Each container's `oom_score_adj`: how readily the kernel's OOM killer picks it, from the
//! pod's QoS class and its memory request (the kubelet's `GetContainerOOMScoreAdjust`).
//!
//! The runtime hands the value to the container when it creates it (`act::pod_spec`), and
//! `reactor plan cgroups` prints it. It sits apart from the cgroup values ([`super::cgroups`]):
//! it is a per-process kernel setting, not a cgroup file, and it changes for its own reasons
//! (the kubelet's OOM policy, not its cgroup layout).

use super::pod::{clamp_i64, ContainerInfo, PodInfo};
use super::qos::QosClass;
use super::quantity::Quantity;
use super::resources::{ResourceList, CPU, MEMORY};

/// `oom_score_adj` of Guaranteed and node-critical containers.
pub(crate) const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
/// `oom_score_adj` of BestEffort containers.
pub(crate) const BESTEFFORT_OOM_SCORE_ADJ: i64 = 1000;

/// `GetContainerOOMScoreAdjust`: -997 for node-critical pods and Guaranteed ones, 1000 for
/// BestEffort ones; a Burstable container gets `1000 - 1000 * request / capacity` kept within
/// 3..=999 (pod-level memory requests not given to any container are shared out evenly; a
/// sidecar gets no more than the pod's smallest regular container). `None` when a burstable
/// container needs a memory capacity that was not given.
pub fn oom_score_adj(
    pod: &PodInfo,
    c: &ContainerInfo,
    memory_capacity: Option<i64>,
) -> Option<i64> {
    if pod.is_node_critical() {
        return Some(GUARANTEED_OOM_SCORE_ADJ);
    }
    match pod.qos {
        QosClass::Guaranteed => return Some(GUARANTEED_OOM_SCORE_ADJ),
        QosClass::BestEffort => return Some(BESTEFFORT_OOM_SCORE_ADJ),
        QosClass::Burstable => {}
    }
    let capacity = memory_capacity.filter(|c| *c > 0)? as i128;
    let request = |c: &ContainerInfo| bytes(c.requests.get(MEMORY));
    let pod_level_requests_set = pod.pod_level_requests.as_ref().is_some_and(|r| {
        r.iter()
            .any(|(n, _)| n == CPU || n == MEMORY || n.starts_with("hugepages-"))
    });
    let remaining_per_container = if pod_level_requests_set {
        remaining_pod_memory_per_container(pod)
    } else {
        0
    };
    let mut adj = 1000 - (1000 * (request(c) + remaining_per_container)) / capacity;
    let is_sidecar = c.sidecar && pod.init_containers.iter().any(|i| i.name == c.name);
    if is_sidecar {
        if let Some(min_regular) = pod.containers.iter().map(request).min() {
            let min_adj = 1000 - (1000 * (min_regular + remaining_per_container)) / capacity;
            adj = adj.min(min_adj);
        }
    }
    let floor = (1000 + GUARANTEED_OOM_SCORE_ADJ) as i128;
    if adj < floor {
        return Some(floor as i64);
    }
    if adj == BESTEFFORT_OOM_SCORE_ADJ as i128 {
        return Some(BESTEFFORT_OOM_SCORE_ADJ - 1);
    }
    Some(adj.clamp(i64::MIN as i128, i64::MAX as i128) as i64)
}

/// Pod-level memory requests not claimed by any container, per container
/// (`remainingPodMemReqPerContainer`).
fn remaining_pod_memory_per_container(pod: &PodInfo) -> i128 {
    let Some(pod_requests) = &pod.pod_level_requests else {
        return 0;
    };
    let pod_memory = pod_requests.get_or_zero(MEMORY);
    if pod_memory.nanos() == 0 {
        return 0;
    }
    let count = (pod.containers.len() + pod.init_containers.len()) as i128;
    if count == 0 {
        return 0;
    }
    // The container aggregate (sidecar-aware), without pod-level values or overhead.
    let mut total = ResourceList::new();
    for c in &pod.containers {
        total.add_all(&c.requests);
    }
    let mut sidecars = ResourceList::new();
    let mut peak = ResourceList::new();
    for c in &pod.init_containers {
        if c.sidecar {
            total.add_all(&c.requests);
            sidecars.add_all(&c.requests);
            peak.max_all(&sidecars);
        } else {
            let mut moment = c.requests.clone();
            moment.add_all(&sidecars);
            peak.max_all(&moment);
        }
    }
    total.max_all(&peak);
    let remaining = bytes(Some(pod_memory)) - bytes(total.get(MEMORY));
    remaining / count
}

/// A quantity in bytes, 0 when absent, held to the range of an `i64` first as the kubelet's
/// `Value()` is, then widened so the score's products cannot overflow.
fn bytes(q: Option<Quantity>) -> i128 {
    q.map_or(0, |q| clamp_i64(q.value())) as i128
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    const GI: i64 = 1 << 30;

    /// cpu and memory, as a container's requests or limits give them.
    type CpuMemory<'a> = Option<(&'a str, &'a str)>;

    /// A pod of `containers`, each `(name, requests, limits)`.
    fn pod(containers: &[(&str, CpuMemory, CpuMemory)]) -> PodInfo {
        let res = |r: Option<(&str, &str)>| r.map(|(cpu, mem)| json!({"cpu": cpu, "memory": mem}));
        let containers: Vec<Value> = containers
            .iter()
            .map(|(name, req, lim)| {
                json!({"name": name, "resources": {"requests": res(*req), "limits": res(*lim)}})
            })
            .collect();
        PodInfo::from_json(json!({"metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": containers}}))
        .unwrap()
    }

    /// The three pods of the seed's worked example (pod cgroups), on an 8Gi machine.
    #[test]
    fn seed_004_worked_example() {
        let cap = Some(8 * GI);
        let g = pod(&[("container3", Some(("1", "1Gi")), Some(("1", "1Gi")))]);
        let b = pod(&[
            ("container1", Some(("1", "1Gi")), Some(("1", "1Gi"))),
            ("container2", Some(("1", "1Gi")), Some(("2", "2Gi"))),
        ]);
        let e = pod(&[("container4", None, None)]);
        assert_eq!(g.qos, QosClass::Guaranteed);
        assert_eq!(b.qos, QosClass::Burstable);
        assert_eq!(e.qos, QosClass::BestEffort);
        assert_eq!(oom_score_adj(&g, &g.containers[0], cap), Some(-997));
        // 1Gi of 8Gi: 1000 - 125.
        assert_eq!(oom_score_adj(&b, &b.containers[0], cap), Some(875));
        assert_eq!(oom_score_adj(&e, &e.containers[0], cap), Some(1000));
    }

    #[test]
    fn burstable_oom_score_adj_bounds() {
        let cap = Some(8 * GI);
        let p = PodInfo::from_json(json!({"metadata": {"name": "b", "uid": "u"}, "spec": {
            "containers": [
                {"name": "none", "resources": {"requests": {"cpu": "1"}}},
                {"name": "all", "resources": {"requests": {"memory": "8Gi"}}},
                {"name": "tiny", "resources": {"requests": {"memory": "1Mi"}}}]}}))
        .unwrap();
        // No memory request: 1000 would tie best-effort, so 999.
        assert_eq!(oom_score_adj(&p, &p.containers[0], cap), Some(999));
        // The whole machine: 0, raised to the floor 3.
        assert_eq!(oom_score_adj(&p, &p.containers[1], cap), Some(3));
        // 1Mi of 8Gi: 1000 - 0 (integer division) = 1000 → 999.
        assert_eq!(oom_score_adj(&p, &p.containers[2], cap), Some(999));
        assert_eq!(oom_score_adj(&p, &p.containers[0], None), None);
    }

    #[test]
    fn node_critical_pods_get_the_guaranteed_score_others_by_qos() {
        let cap = Some(8 * GI);
        let nc = PodInfo::from_json(json!({"metadata": {"name": "n"}, "spec": {
            "priority": 2000001000, "priorityClassName": "system-node-critical",
            "containers": [{"name": "a"}]}}))
        .unwrap();
        assert_eq!(oom_score_adj(&nc, &nc.containers[0], cap), Some(-997));
        // A static pod is critical but not node-critical: best-effort stays 1000.
        let st = PodInfo::from_json(json!({"metadata": {"name": "s",
            "annotations": {"kubernetes.io/config.source": "file"}}, "spec": {
            "containers": [{"name": "a"}]}}))
        .unwrap();
        assert_eq!(oom_score_adj(&st, &st.containers[0], cap), Some(1000));
        // system-cluster-critical is not node-critical either.
        let cc = PodInfo::from_json(json!({"metadata": {"name": "c"}, "spec": {
            "priority": 2000000000, "priorityClassName": "system-cluster-critical",
            "containers": [{"name": "a", "resources": {"requests": {"memory": "1Gi"}}}]}}))
        .unwrap();
        assert_eq!(oom_score_adj(&cc, &cc.containers[0], cap), Some(875));
    }

    #[test]
    fn sidecar_oom_score_adj_is_capped_by_the_smallest_regular_container() {
        let cap = Some(8 * GI);
        let p = PodInfo::from_json(json!({"metadata": {"name": "s"}, "spec": {
            "initContainers": [{"name": "side", "restartPolicy": "Always",
                "resources": {"requests": {"memory": "256Mi"}}}],
            "containers": [{"name": "a", "resources": {"requests": {"memory": "2Gi"}}},
                           {"name": "b", "resources": {"requests": {"memory": "1Gi"}}}]}}))
        .unwrap();
        // Own: 1000 - 1000*256Mi/8Gi = 969; smallest regular (1Gi): 875 → 875.
        assert_eq!(oom_score_adj(&p, &p.init_containers[0], cap), Some(875));
    }

    #[test]
    fn pod_level_memory_is_shared_out_for_oom_score_adj() {
        let cap = Some(8 * GI);
        let p = PodInfo::from_json(json!({"metadata": {"name": "p"}, "spec": {
            "resources": {"requests": {"memory": "4Gi"}},
            "containers": [{"name": "a", "resources": {"requests": {"memory": "1Gi"}}},
                           {"name": "b"}]}}))
        .unwrap();
        assert_eq!(p.qos, QosClass::Burstable);
        // (4Gi - 1Gi) / 2 = 1.5Gi each: a = 2.5Gi → 1000 - 312 = 688; b = 1.5Gi → 813.
        assert_eq!(oom_score_adj(&p, &p.containers[0], cap), Some(688));
        assert_eq!(oom_score_adj(&p, &p.containers[1], cap), Some(813));
    }
}
