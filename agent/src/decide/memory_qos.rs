//! Memory QoS and swap on cgroup v2: the `memory.min`, `memory.high` and `memory.swap.max`
//! values the kubelet writes, beside the cpu and memory limits of [`super::cgroups`].
//!
//! Followed: Kubernetes v1.34 (`release-1.34`), where `MemoryQoS` is an alpha feature gate
//! (KEP-2570) and `NodeSwap` is GA (KEP-2400):
//! - `pkg/kubelet/cm/qos_container_manager_linux.go` (`setMemoryQoS`): `kubepods` gets
//!   `memory.min` = the memory requests of every Guaranteed and Burstable pod,
//!   `kubepods/burstable` the Burstable pods' alone; each only when above zero. BestEffort gets
//!   nothing: it has no requests to protect.
//! - `pkg/kubelet/cm/helpers_linux.go` (`ResourceConfigForPod`): a pod cgroup's `memory.min`
//!   is the pod's memory request (overhead and pod-level requests included), when above zero.
//!   The kubelet sets no `memory.high` on pod, tier or `kubepods` cgroups.
//! - `pkg/kubelet/kuberuntime/kuberuntime_container_linux.go`
//!   (`generateLinuxContainerResources`, `GetContainerSwapBehavior`,
//!   `calcSwapForBurstablePods`): a container's `memory.min` is its own memory request, its
//!   `memory.high` sits between request and limit (below), and on v2 every container gets a
//!   `memory.swap.max`: 0 unless LimitedSwap gives it a share.
//! - `pkg/kubelet/apis/config/v1beta1/defaults.go`: `memoryThrottlingFactor` 0.9,
//!   `memorySwap.swapBehavior` empty, which is NoSwap.
//!
//! v1.34 writes no `memory.low` anywhere (the tiered reservation policy that uses it came
//! later); `reactor plan cgroups` still prints the name, as null, so a reader sees it is left
//! to the kernel's default. All of it is v2 only: v1 has none of these files.
//!
//! Why: `memory.min` keeps the kernel's reclaim away from memory a pod asked for, so a noisy
//! neighbour is reclaimed first; `memory.high` makes a container that nears its limit reclaim
//! and slow down instead of meeting the OOM killer at `memory.max`.

use super::pod::{clamp_i64, ContainerInfo, PodInfo};
use super::qos::QosClass;
use super::quantity::Quantity;
use super::resources::MEMORY;

/// The kubelet's default `memoryThrottlingFactor` (v1.34 `DefaultMemoryThrottlingFactor`).
pub(crate) const DEFAULT_THROTTLING_FACTOR: f64 = 0.9;

/// The page size `memory.high` is rounded down to. The kubelet uses its host's
/// `os.Getpagesize()`; 4 KiB is that on x86-64 and on the arm64 kernels nodes run, and
/// keeping it a constant keeps this module free of the machine.
pub(crate) const PAGE_SIZE: i64 = 4096;

/// `memoryThrottlingFactor`: where `memory.high` sits between request and limit, in (0, 1].
/// A float, as in the kubelet, so the rounding is the kubelet's; equality is by bits, which
/// is all a config comparison needs.
#[derive(Clone, Copy, Debug)]
pub struct ThrottlingFactor(pub f64);

impl PartialEq for ThrottlingFactor {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for ThrottlingFactor {}

impl Default for ThrottlingFactor {
    fn default() -> Self {
        ThrottlingFactor(DEFAULT_THROTTLING_FACTOR)
    }
}

/// `memorySwap.swapBehavior`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SwapBehavior {
    /// No container may swap (`memory.swap.max` 0); the default, as an empty value is.
    #[default]
    NoSwap,
    /// Burstable containers get swap in proportion to their memory request.
    LimitedSwap,
}

impl SwapBehavior {
    /// The KubeletConfiguration value; `""` is NoSwap, as in the kubelet.
    pub fn parse(text: &str) -> Option<SwapBehavior> {
        match text {
            "" | "NoSwap" => Some(SwapBehavior::NoSwap),
            "LimitedSwap" => Some(SwapBehavior::LimitedSwap),
            _ => None,
        }
    }

    /// The name the kubelet uses.
    #[cfg(test)]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SwapBehavior::NoSwap => "NoSwap",
            SwapBehavior::LimitedSwap => "LimitedSwap",
        }
    }
}

/// The node settings these values depend on (`cgroups::NodeSettings::memory_node` gives
/// them; a separate view so this module does not reach back into `cgroups`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MemoryNode {
    /// The node runs cgroup v2.
    pub v2: bool,
    /// The `MemoryQoS` feature gate.
    pub memory_qos: bool,
    /// `memoryThrottlingFactor`.
    pub memory_throttling_factor: ThrottlingFactor,
    /// Allocatable memory (capacity minus reserved) in bytes, if known: the `memory.high`
    /// ceiling of a container without a memory limit.
    pub allocatable_memory: Option<i64>,
    /// The machine's memory in bytes, if known: the base of LimitedSwap shares.
    pub memory_capacity: Option<i64>,
    /// `memorySwap.swapBehavior`.
    pub swap_behavior: SwapBehavior,
    /// The node's swap in bytes (`SwapTotal`).
    pub swap_capacity: i64,
    /// Whether the kernel can limit a cgroup's swap.
    pub swap_controller: bool,
}

/// Whether Memory QoS files are written: the `MemoryQoS` gate on, on cgroup v2.
pub(crate) fn enforced(node: &MemoryNode) -> bool {
    node.memory_qos && node.v2
}

fn memory_bytes(q: Option<Quantity>) -> i64 {
    q.map_or(0, |q| clamp_i64(q.value()))
}

/// `memory.min` of `kubepods` and of `kubepods/burstable` (`setMemoryQoS`): Guaranteed plus
/// Burstable requests, and Burstable requests alone; `None` where the sum is zero or Memory
/// QoS is off.
pub(crate) fn qos_memory_min(node: &MemoryNode, pods: &[PodInfo]) -> (Option<i64>, Option<i64>) {
    if !enforced(node) {
        return (None, None);
    }
    let mut guaranteed: i64 = 0;
    let mut burstable: i64 = 0;
    for pod in pods {
        let request = memory_bytes(pod.requests.get(MEMORY));
        match pod.qos {
            QosClass::Guaranteed => guaranteed = guaranteed.saturating_add(request),
            QosClass::Burstable => burstable = burstable.saturating_add(request),
            QosClass::BestEffort => {}
        }
    }
    let kubepods = guaranteed.saturating_add(burstable);
    (
        (kubepods > 0).then_some(kubepods),
        (burstable > 0).then_some(burstable),
    )
}

/// A pod cgroup's `memory.min`: the pod's memory request, when above zero.
pub(crate) fn pod_memory_min(node: &MemoryNode, pod: &PodInfo) -> Option<i64> {
    if !enforced(node) {
        return None;
    }
    Some(memory_bytes(pod.requests.get(MEMORY))).filter(|v| *v > 0)
}

/// A container's `memory.min` and `memory.high`.
///
/// `memory.min` is the container's own memory request when above zero. `memory.high` is
/// `floor(request + factor × (limit − request))` rounded down to a page, where a container
/// without a memory limit uses the node's allocatable memory (capacity minus reserved) as
/// its limit; it is left unset where request equals limit (a Guaranteed container, which
/// the kubelet leaves to `memory.max` alone), and where it would not be above the request.
/// The arithmetic is in `f64` as the kubelet's, so the bytes are the kubelet's.
pub(crate) fn container_memory(node: &MemoryNode, c: &ContainerInfo) -> (Option<i64>, Option<i64>) {
    if !enforced(node) {
        return (None, None);
    }
    let request = memory_bytes(c.requests.get(MEMORY));
    let limit = memory_bytes(c.limits.get(MEMORY));
    let min = (request != 0).then_some(request);
    if request == limit {
        return (min, None);
    }
    let ceiling = if limit != 0 {
        limit
    } else {
        match node.allocatable_memory {
            Some(a) if a > 0 => a,
            _ => return (min, None),
        }
    };
    let high = memory_high(request, ceiling, node.memory_throttling_factor.0);
    (min, (high != 0 && high > request).then_some(high))
}

/// `request + factor × (ceiling − request)`, floored, then rounded down to [`PAGE_SIZE`].
pub(crate) fn memory_high(request: i64, ceiling: i64, factor: f64) -> i64 {
    let raw = (request as f64 + (ceiling as f64 - request as f64) * factor).floor();
    let pages = (raw / PAGE_SIZE as f64) as i64;
    pages.saturating_mul(PAGE_SIZE)
}

/// A container's `memory.swap.max` (`configureContainerSwapResources`): `None` on v1 and
/// where the kernel has no swap controller (the kubelet writes no swap file then); on v2 the
/// LimitedSwap share for a container that may swap, else 0.
///
/// A container may swap only under LimitedSwap, in a Burstable pod that is not critical
/// (static, mirror, or priority 2000000000 and above), when it names a memory request or
/// limit and the two differ; every other container gets 0, so a node with swap on never
/// lets a Guaranteed, BestEffort or critical container's memory out to swap.
pub(crate) fn container_swap_max(
    node: &MemoryNode,
    pod: &PodInfo,
    c: &ContainerInfo,
) -> Option<i64> {
    if !node.v2 || !node.swap_controller {
        return None;
    }
    if node.swap_behavior != SwapBehavior::LimitedSwap || pod.is_critical() {
        return Some(0);
    }
    let request = memory_bytes(c.requests.get(MEMORY));
    let limit = memory_bytes(c.limits.get(MEMORY));
    let names_memory = request != 0 || limit != 0;
    if pod.qos != QosClass::Burstable || !names_memory || request == limit {
        return Some(0);
    }
    Some(
        limited_swap(
            request,
            node.memory_capacity.unwrap_or(0),
            node.swap_capacity,
        )
        .unwrap_or(0),
    )
}

/// `request / node memory × node swap`, truncated (`calcSwapForBurstablePods`). `None`,
/// which the kubelet turns into no swap, when the node's memory is unknown or the request is
/// larger than it.
pub(crate) fn limited_swap(request: i64, memory_capacity: i64, swap_capacity: i64) -> Option<i64> {
    if memory_capacity <= 0 || request > memory_capacity {
        return None;
    }
    let share = request as f64 / memory_capacity as f64;
    Some((share * swap_capacity as f64) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const MI: i64 = 1 << 20;
    const GI: i64 = 1 << 30;

    fn node() -> MemoryNode {
        MemoryNode {
            v2: true,
            allocatable_memory: Some(32 * GI),
            memory_capacity: Some(40 * GI),
            memory_qos: true,
            memory_throttling_factor: ThrottlingFactor::default(),
            swap_behavior: SwapBehavior::LimitedSwap,
            swap_capacity: 5 * GI,
            swap_controller: true,
        }
    }

    fn pod(doc: serde_json::Value) -> PodInfo {
        PodInfo::from_json(doc).unwrap()
    }

    fn one(requests: serde_json::Value, limits: serde_json::Value) -> PodInfo {
        pod(
            json!({"metadata": {"name": "p", "uid": "u"}, "spec": {"containers": [
            {"name": "c", "resources": {"requests": requests, "limits": limits}}]}}),
        )
    }

    #[test]
    fn memory_high_is_the_kubelets_formula() {
        // The kubelet's TestGenerateContainerConfigWithMemoryQoSEnforced, pod1: request
        // 128Mi, limit 256Mi, factor 0.9: floor(128Mi + 0.9 × 128Mi) = 255013683, and
        // rounded down to a 4 KiB page, 255012864.
        let p = one(json!({"memory": "128Mi"}), json!({"memory": "256Mi"}));
        let (min, high) = container_memory(&node(), &p.containers[0]);
        assert_eq!(min, Some(128 * MI));
        assert_eq!(high, Some(255_012_864));
        assert_eq!(high.unwrap() % PAGE_SIZE, 0);
        // pod2: no limit, so the node allocatable (32Gi here) is the ceiling.
        let p = one(json!({"memory": "128Mi"}), json!({}));
        let (_, high) = container_memory(&node(), &p.containers[0]);
        let want = memory_high(128 * MI, 32 * GI, 0.9);
        assert_eq!(high, Some(want));
        // 128Mi + 0.9 × (32Gi − 128Mi) = 30937186304, 7553024 whole pages.
        assert_eq!(want, 7_553_024 * PAGE_SIZE);
    }

    #[test]
    fn memory_high_follows_the_factor_and_skips_guaranteed_containers() {
        let mut n = node();
        n.memory_throttling_factor = ThrottlingFactor(0.5);
        let p = one(json!({"memory": "100Mi"}), json!({"memory": "200Mi"}));
        assert_eq!(
            container_memory(&n, &p.containers[0]),
            (Some(100 * MI), Some(150 * MI))
        );
        // Request equal to limit: memory.min only, memory.max does the rest.
        let g = one(json!({"memory": "1Gi"}), json!({"memory": "1Gi"}));
        assert_eq!(container_memory(&n, &g.containers[0]), (Some(GI), None));
        // A limit and no request: no memory.min, memory.high at half the limit.
        let l = one(json!({}), json!({"memory": "200Mi"}));
        assert_eq!(
            container_memory(&n, &l.containers[0]),
            (None, Some(100 * MI))
        );
        // Neither: nothing at all (request and limit are both 0).
        let e = one(json!({}), json!({}));
        assert_eq!(container_memory(&n, &e.containers[0]), (None, None));
        // No limit and no allocatable known: no ceiling, no memory.high.
        n.allocatable_memory = None;
        let r = one(json!({"memory": "1Gi"}), json!({}));
        assert_eq!(container_memory(&n, &r.containers[0]), (Some(GI), None));
    }

    #[test]
    fn memory_high_not_above_the_request_is_left_unset() {
        // A factor this small puts memory.high below the request once rounded to a page.
        let mut n = node();
        n.memory_throttling_factor = ThrottlingFactor(1e-9);
        let p = one(json!({"memory": "1000001"}), json!({"memory": "1000002"}));
        assert_eq!(
            container_memory(&n, &p.containers[0]),
            (Some(1_000_001), None)
        );
    }

    #[test]
    fn nothing_without_the_gate_or_on_v1() {
        let p = one(json!({"memory": "128Mi"}), json!({"memory": "256Mi"}));
        let mut off = node();
        off.memory_qos = false;
        assert_eq!(container_memory(&off, &p.containers[0]), (None, None));
        assert_eq!(pod_memory_min(&off, &p), None);
        assert_eq!(qos_memory_min(&off, std::slice::from_ref(&p)), (None, None));
        let mut v1 = node();
        v1.v2 = false;
        assert_eq!(container_memory(&v1, &p.containers[0]), (None, None));
        assert_eq!(container_swap_max(&v1, &p, &p.containers[0]), None);
        // No swap controller: no swap file at all, as the kubelet.
        let mut no_controller = node();
        no_controller.swap_controller = false;
        assert_eq!(
            container_swap_max(&no_controller, &p, &p.containers[0]),
            None
        );
    }

    #[test]
    fn tiers_and_pods_get_their_requests_as_memory_min() {
        let n = node();
        let g = one(
            json!({"memory": "1Gi", "cpu": "1"}),
            json!({"memory": "1Gi", "cpu": "1"}),
        );
        let b = pod(json!({"metadata": {"name": "b", "uid": "b"}, "spec": {
            "overhead": {"memory": "64Mi"},
            "containers": [{"name": "c", "resources": {"requests": {"memory": "256Mi"}}}]}}));
        let e = one(json!({}), json!({}));
        assert_eq!(g.qos, QosClass::Guaranteed);
        assert_eq!(b.qos, QosClass::Burstable);
        // Overhead counts in the pod's request, so in the pod's and the tiers' memory.min.
        assert_eq!(pod_memory_min(&n, &b), Some(320 * MI));
        assert_eq!(pod_memory_min(&n, &e), None);
        let (kubepods, burstable) = qos_memory_min(&n, &[g.clone(), b.clone(), e.clone()]);
        assert_eq!(kubepods, Some(GI + 320 * MI));
        assert_eq!(burstable, Some(320 * MI));
        // Only Guaranteed pods: burstable's stays unset.
        assert_eq!(qos_memory_min(&n, &[g, e]), (Some(GI), None));
    }

    #[test]
    fn limited_swap_is_the_kubelets_share() {
        // TestGenerateLinuxContainerResourcesWithSwap: 40Gi of memory, 5Gi of swap; a 1Gi
        // request gets 1/40 of the swap, a 2Gi one 2/40.
        assert_eq!(limited_swap(GI, 40 * GI, 5 * GI), Some(128 * MI));
        assert_eq!(limited_swap(2 * GI, 40 * GI, 5 * GI), Some(256 * MI));
        // calcSwapForBurstablePods refuses these; the kubelet then gives no swap.
        assert_eq!(limited_swap(GI, 0, 5 * GI), None);
        assert_eq!(limited_swap(41 * GI, 40 * GI, 5 * GI), None);
        // Truncated, not rounded: 1 byte of 3 over 2 bytes of swap is 0.666 → 0.
        assert_eq!(limited_swap(1, 3, 2), Some(0));
    }

    #[test]
    fn swap_goes_only_to_burstable_containers_that_name_memory() {
        let n = node();
        // The kubelet's burstable pod: c1 requests 1Gi, c2 2Gi.
        let b = pod(
            json!({"metadata": {"name": "b", "uid": "b"}, "spec": {"containers": [
            {"name": "c1", "resources": {"requests": {"memory": "1Gi"}}},
            {"name": "c2", "resources": {"requests": {"memory": "2Gi"}}},
            {"name": "none"},
            {"name": "guaranteed", "resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "2Gi"}}}]}}),
        );
        let swap = |c: usize| container_swap_max(&n, &b, &b.containers[c]);
        assert_eq!(swap(0), Some(128 * MI));
        assert_eq!(swap(1), Some(256 * MI));
        assert_eq!(swap(2), Some(0), "a container naming no memory");
        assert_eq!(
            swap(3),
            Some(0),
            "a container whose request equals its limit"
        );
        // Guaranteed and BestEffort pods: 0.
        let g = one(
            json!({"memory": "1Gi", "cpu": "1"}),
            json!({"memory": "1Gi", "cpu": "1"}),
        );
        assert_eq!(container_swap_max(&n, &g, &g.containers[0]), Some(0));
        let e = one(json!({}), json!({}));
        assert_eq!(container_swap_max(&n, &e, &e.containers[0]), Some(0));
        // A critical pod (system-critical priority), and a static one: 0.
        for critical in [
            json!({"metadata": {"name": "c", "uid": "c"}, "spec": {"priority": 2_000_000_000,
                "containers": [{"name": "c", "resources": {"requests": {"memory": "1Gi"}}}]}}),
            json!({"metadata": {"name": "s", "uid": "s",
                "annotations": {"kubernetes.io/config.source": "file"}}, "spec": {
                "containers": [{"name": "c", "resources": {"requests": {"memory": "1Gi"}}}]}}),
        ] {
            let p = pod(critical);
            assert!(p.is_critical());
            assert_eq!(container_swap_max(&n, &p, &p.containers[0]), Some(0));
        }
        // NoSwap: 0 for the burstable container too.
        let mut no = node();
        no.swap_behavior = SwapBehavior::NoSwap;
        assert_eq!(container_swap_max(&no, &b, &b.containers[0]), Some(0));
        // Swap does not need the MemoryQoS gate.
        let mut gate_off = node();
        gate_off.memory_qos = false;
        assert_eq!(
            container_swap_max(&gate_off, &b, &b.containers[0]),
            Some(128 * MI)
        );
    }

    #[test]
    fn swap_behavior_names() {
        assert_eq!(SwapBehavior::parse(""), Some(SwapBehavior::NoSwap));
        assert_eq!(SwapBehavior::parse("NoSwap"), Some(SwapBehavior::NoSwap));
        assert_eq!(
            SwapBehavior::parse("LimitedSwap"),
            Some(SwapBehavior::LimitedSwap)
        );
        assert_eq!(SwapBehavior::parse("UnlimitedSwap"), None);
        assert_eq!(SwapBehavior::LimitedSwap.as_str(), "LimitedSwap");
    }
}
