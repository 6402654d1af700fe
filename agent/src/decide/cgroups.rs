//! The cgroup values the kubelet sets for the pod hierarchy. (Each container's
//! `oom_score_adj`, the other value the kubelet derives from a pod's QoS, is
//! [`super::oom_score`].)
//!
//! The hierarchy (cgroupfs driver) is `kubepods` for the node allocatable, `kubepods/burstable`
//! and `kubepods/besteffort` for two QoS tiers, `pod<uid>` under the pod's tier (Guaranteed pods
//! sit directly under `kubepods`), then the containers. Each level gets a resource config
//! (cpu shares, CFS quota and period, memory limit) computed from requests and limits; the
//! runtime writes only the non-zero values, so a value left at zero is a file left alone.
//!
//! Everything here is integer arithmetic in the kubelet's units (millicores, microseconds,
//! bytes) so the values match the kubelet's byte for byte.

use super::memory_qos::{MemoryNode, SwapBehavior, ThrottlingFactor};
use super::pod::{ContainerInfo, PodInfo};
use super::qos::QosClass;
use super::quantity::Quantity;
use super::resources::{ResourceList, CPU, MEMORY};

/// The fewest cpu shares the kernel accepts; what a pod without cpu requests gets.
pub(crate) const MIN_SHARES: u64 = 2;
/// The most cpu shares the kernel accepts.
pub(crate) const MAX_SHARES: u64 = 262_144;
/// Shares per whole cpu.
pub(crate) const SHARES_PER_CPU: i128 = 1024;
/// The default CFS period, in microseconds (100 ms).
pub const DEFAULT_QUOTA_PERIOD_US: u64 = 100_000;
/// The smallest CFS quota, in microseconds (1 ms).
pub const MIN_QUOTA_PERIOD_US: i64 = 1_000;

/// v2 `memory.min`.
pub(crate) const MEMORY_MIN: &str = "memory.min";
/// v2 `memory.low`.
pub(crate) const MEMORY_LOW: &str = "memory.low";
/// v2 `memory.high`.
pub(crate) const MEMORY_HIGH: &str = "memory.high";
/// v2 `memory.swap.max`.
pub(crate) const MEMORY_SWAP_MAX: &str = "memory.swap.max";

/// Which cgroup interface the node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupVersion {
    /// Per-controller hierarchies (`cpu.shares`, `memory.limit_in_bytes`).
    V1,
    /// The unified hierarchy (`cpu.weight`, `cpu.max`, `memory.max`).
    V2,
}

/// The node settings the cgroup values depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSettings {
    /// The cgroup interface.
    pub version: CgroupVersion,
    /// Allocatable cpu (capacity minus system and kube reserved), if known.
    pub allocatable_cpu: Option<Quantity>,
    /// Allocatable memory (capacity minus system and kube reserved), if known.
    pub allocatable_memory: Option<Quantity>,
    /// `qosReserved` for memory, as a percentage 0..=100, when set.
    pub qos_reserved_memory_percent: Option<i64>,
    /// `cpuCFSQuota`: whether cpu limits become CFS quotas.
    pub enforce_cpu_limits: bool,
    /// `cpuCFSQuotaPeriod`, in microseconds.
    pub cpu_period_us: u64,
    /// The machine's memory capacity in bytes, the base of burstable `oom_score_adj`
    /// ([`super::oom_score`]) and of Memory QoS.
    pub memory_capacity: Option<i64>,
    /// `singleProcessOOMKill`; `None` is the kubelet's default for the version (see
    /// [`NodeSettings::oom_group`]).
    pub single_process_oom_kill: Option<bool>,
    /// The `MemoryQoS` feature gate (off by default, as in the kubelet): `memory.min` and
    /// `memory.high` on cgroup v2 ([`super::memory_qos`]).
    pub memory_qos: bool,
    /// `memoryThrottlingFactor`: where `memory.high` sits between request and limit.
    pub memory_throttling_factor: ThrottlingFactor,
    /// `memorySwap.swapBehavior`.
    pub swap_behavior: SwapBehavior,
    /// The node's swap in bytes (`SwapTotal`), the base of LimitedSwap shares.
    pub swap_capacity: i64,
    /// Whether the kernel can limit a cgroup's swap (v2 `memory.swap.max` exists): without
    /// it the kubelet configures no swap at all (`swapControllerAvailable`).
    pub swap_controller: bool,
}

impl NodeSettings {
    /// What [`super::memory_qos`] needs of the node.
    pub(crate) fn memory_node(&self) -> MemoryNode {
        MemoryNode {
            v2: self.version == CgroupVersion::V2,
            memory_qos: self.memory_qos,
            memory_throttling_factor: self.memory_throttling_factor,
            allocatable_memory: self.allocatable_memory.map(|q| bytes(Some(q))),
            memory_capacity: self.memory_capacity,
            swap_behavior: self.swap_behavior,
            swap_capacity: self.swap_capacity,
            swap_controller: self.swap_controller,
        }
    }

    /// Whether container cgroups get `memory.oom.group = 1`: on cgroup v2 unless
    /// `singleProcessOOMKill` is true. The kubelet hands it to the runtime in the container's
    /// unified settings, so an OOM kill takes every process of the container, not just the
    /// largest one (which could leave a half-dead container running).
    pub(crate) fn oom_group(&self) -> bool {
        self.version == CgroupVersion::V2 && !self.single_process_oom_kill.unwrap_or(false)
    }
}

/// One cgroup's resource config, as the kubelet fills its `ResourceConfig` (or the CRI
/// `LinuxContainerResources`): `None` is "not set"; the runtime also skips zeros.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResourceConfig {
    /// cpu shares (v1 `cpu.shares`; converted to `cpu.weight` on v2).
    pub cpu_shares: Option<u64>,
    /// CFS quota in microseconds; -1 is unlimited.
    pub cpu_quota: Option<i64>,
    /// CFS period in microseconds.
    pub cpu_period: Option<u64>,
    /// Memory limit in bytes.
    pub memory: Option<i64>,
    /// v2 `memory.oom.group` (containers only, from [`NodeSettings::oom_group`]).
    pub memory_oom_group: Option<bool>,
    /// v2 `memory.min` in bytes (Memory QoS: requests protected from reclaim).
    pub memory_min: Option<i64>,
    /// v2 `memory.low` in bytes (never set by the kubelet version followed; kept so the
    /// writer and `reactor plan cgroups` name it).
    pub memory_low: Option<i64>,
    /// v2 `memory.high` in bytes (Memory QoS: the throttle below the limit).
    pub memory_high: Option<i64>,
    /// v2 `memory.swap.max` in bytes (containers only; 0 is no swap).
    pub memory_swap_max: Option<i64>,
}

/// A value written to a cgroup file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileValue {
    /// A number (`cpu.shares`, `memory.max` in bytes, ...).
    Int(i64),
    /// Text (`cpu.max`: `"QUOTA PERIOD"` or `"max PERIOD"`).
    Text(String),
}

/// `MilliCPUToShares`: 1024 shares per cpu, at least 2, at most 262144.
pub(crate) fn milli_cpu_to_shares(milli_cpu: i64) -> u64 {
    if milli_cpu == 0 {
        return MIN_SHARES;
    }
    let shares = (milli_cpu as i128 * SHARES_PER_CPU) / 1000;
    if shares < MIN_SHARES as i128 {
        MIN_SHARES
    } else if shares > MAX_SHARES as i128 {
        MAX_SHARES
    } else {
        shares as u64
    }
}

/// `MilliCPUToQuota`: the CFS quota for a cpu limit over `period_us`, at least 1 ms; zero
/// (no quota) when there is no limit.
pub(crate) fn milli_cpu_to_quota(milli_cpu: i64, period_us: u64) -> i64 {
    if milli_cpu == 0 {
        return 0;
    }
    let quota = (milli_cpu as i128 * period_us as i128) / 1000;
    let quota = quota.clamp(i64::MIN as i128, i64::MAX as i128) as i64;
    quota.max(MIN_QUOTA_PERIOD_US)
}

/// The kubelet's shares → `cpu.weight` conversion for cgroup v2 (linear, 2..262144 onto
/// 1..10000); 0 means "not set".
pub(crate) fn cpu_shares_to_weight(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    if shares >= MAX_SHARES {
        return 10_000;
    }
    1 + (shares.saturating_sub(2) * 9999) / 262_142
}

fn milli(q: Option<Quantity>) -> i64 {
    q.map_or(0, |q| super::pod::clamp_i64(q.milli_value()))
}

fn bytes(q: Option<Quantity>) -> i64 {
    q.map_or(0, |q| super::pod::clamp_i64(q.value()))
}

/// The `kubepods` cgroup: shares from allocatable cpu, memory limit at allocatable memory
/// (`enforceNodeAllocatable: [pods]`). A resource the node does not report is left unset.
pub fn kubepods(node: &NodeSettings) -> ResourceConfig {
    ResourceConfig {
        cpu_shares: node
            .allocatable_cpu
            .map(|q| milli_cpu_to_shares(milli(Some(q)))),
        cpu_quota: None,
        cpu_period: None,
        memory: node.allocatable_memory.map(|q| bytes(Some(q))),
        ..ResourceConfig::default()
    }
}

/// The burstable and best-effort tier cgroups (`UpdateCgroups`): best-effort always gets the
/// minimum shares; burstable gets the shares of the sum of its pods' cpu requests; with a
/// memory `qosReserved`, each tier's memory limit leaves room for the requests of the tiers
/// above it (that percentage of them).
pub fn qos_tiers(node: &NodeSettings, pods: &[PodInfo]) -> (ResourceConfig, ResourceConfig) {
    let mut burstable_cpu: i64 = 0;
    let mut guaranteed_mem: i64 = 0;
    let mut burstable_mem: i64 = 0;
    for pod in pods {
        match pod.qos {
            QosClass::Burstable => {
                burstable_cpu = burstable_cpu.saturating_add(milli(pod.requests.get(CPU)));
                burstable_mem = burstable_mem.saturating_add(bytes(pod.requests.get(MEMORY)));
            }
            QosClass::Guaranteed => {
                guaranteed_mem = guaranteed_mem.saturating_add(bytes(pod.requests.get(MEMORY)));
            }
            QosClass::BestEffort => {}
        }
    }
    let mut burstable = ResourceConfig {
        cpu_shares: Some(milli_cpu_to_shares(burstable_cpu)),
        ..ResourceConfig::default()
    };
    let mut best_effort = ResourceConfig {
        cpu_shares: Some(MIN_SHARES),
        ..ResourceConfig::default()
    };
    if let (Some(percent), Some(allocatable)) =
        (node.qos_reserved_memory_percent, node.allocatable_memory)
    {
        let allocatable = bytes(Some(allocatable));
        if allocatable != 0 {
            let reserve = |sum: i64| ((sum as i128 * percent as i128) / 100) as i64;
            let burstable_limit = allocatable.saturating_sub(reserve(guaranteed_mem));
            let best_effort_limit = burstable_limit.saturating_sub(reserve(burstable_mem));
            burstable.memory = Some(burstable_limit);
            best_effort.memory = Some(best_effort_limit);
        }
    }
    let (_, burstable_min) = super::memory_qos::qos_memory_min(&node.memory_node(), pods);
    burstable.memory_min = burstable_min;
    (burstable, best_effort)
}

/// `kubepods` with the pods on the node: [`kubepods`] plus, with Memory QoS, its
/// `memory.min` (the kubelet's Guaranteed tier is `kubepods` itself, so it carries the
/// requests of Guaranteed and Burstable pods).
pub(crate) fn kubepods_with_pods(node: &NodeSettings, pods: &[PodInfo]) -> ResourceConfig {
    ResourceConfig {
        memory_min: super::memory_qos::qos_memory_min(&node.memory_node(), pods).0,
        ..kubepods(node)
    }
}

/// The pod cgroup's name under the cgroupfs driver.
pub(crate) fn pod_cgroup(pod: &PodInfo) -> String {
    match pod.qos {
        QosClass::Guaranteed => format!("kubepods/pod{}", pod.uid),
        QosClass::Burstable => format!("kubepods/burstable/pod{}", pod.uid),
        QosClass::BestEffort => format!("kubepods/besteffort/pod{}", pod.uid),
    }
}

/// The pod cgroup (`ResourceConfigForPod`): shares from the pod's cpu requests; for a
/// Guaranteed pod the CFS quota and period and the memory limit always; for a Burstable pod
/// the quota only when every container (init containers included) has a cpu limit, the memory
/// limit only when every one has a memory limit (a pod-level limit counts for all); a
/// BestEffort pod only gets the minimum shares. Without CFS enforcement the quota is -1.
pub fn pod_config(node: &NodeSettings, pod: &PodInfo) -> ResourceConfig {
    let mut cpu_limits_declared = true;
    let mut memory_limits_declared = true;
    let mut check = |limits: &ResourceList| {
        if limits.get_or_zero(CPU).nanos() == 0 {
            cpu_limits_declared = false;
        }
        if limits.get_or_zero(MEMORY).nanos() == 0 {
            memory_limits_declared = false;
        }
    };
    for c in &pod.containers {
        check(&c.limits);
    }
    // An init container is judged together with the sidecars started before it, a sidecar
    // by the running total of sidecar limits, as the kubelet's aggregation sees them.
    let mut sidecars = ResourceList::new();
    for c in &pod.init_containers {
        if c.sidecar {
            sidecars.add_all(&c.limits);
            check(&sidecars);
        } else {
            let mut moment = c.limits.clone();
            moment.add_all(&sidecars);
            check(&moment);
        }
    }
    if let Some(pod_limits) = &pod.pod_level_limits {
        if pod_limits.get_or_zero(CPU).nanos() != 0 {
            cpu_limits_declared = true;
        }
        if pod_limits.get_or_zero(MEMORY).nanos() != 0 {
            memory_limits_declared = true;
        }
    }
    let shares = milli_cpu_to_shares(milli(pod.requests.get(CPU)));
    let mut quota = milli_cpu_to_quota(milli(pod.limits.get(CPU)), node.cpu_period_us);
    if !node.enforce_cpu_limits {
        quota = -1;
    }
    let memory = bytes(pod.limits.get(MEMORY));
    let memory_min = super::memory_qos::pod_memory_min(&node.memory_node(), pod);
    match pod.qos {
        QosClass::Guaranteed => ResourceConfig {
            cpu_shares: Some(shares),
            cpu_quota: Some(quota),
            cpu_period: Some(node.cpu_period_us),
            memory: Some(memory),
            memory_min,
            ..ResourceConfig::default()
        },
        QosClass::Burstable => ResourceConfig {
            cpu_shares: Some(shares),
            cpu_quota: cpu_limits_declared.then_some(quota),
            cpu_period: cpu_limits_declared.then_some(node.cpu_period_us),
            memory: memory_limits_declared.then_some(memory),
            memory_min,
            ..ResourceConfig::default()
        },
        QosClass::BestEffort => ResourceConfig {
            cpu_shares: Some(MIN_SHARES),
            memory_min,
            ..ResourceConfig::default()
        },
    }
}

/// What the kubelet hands the runtime for a container (`generateLinuxContainerResources`):
/// shares from the cpu request (from the limit when no request is written at all), the
/// memory limit when non-zero, and with CFS enforcement the period and the quota of the cpu
/// limit. A container without a limit of its own inherits the pod-level one.
pub fn container_config(node: &NodeSettings, pod: &PodInfo, c: &ContainerInfo) -> ResourceConfig {
    let pod_level = pod.pod_level_limits.as_ref();
    let inherit = |name: &str| {
        let own = c.limits.get_or_zero(name);
        if own.nanos() == 0 {
            if let Some(p) = pod_level {
                return p.get_or_zero(name);
            }
        }
        own
    };
    let cpu_limit = inherit(CPU);
    let memory_limit = bytes(Some(inherit(MEMORY)));
    let shares = match c.requests.get(CPU) {
        None => milli_cpu_to_shares(milli(Some(cpu_limit))),
        Some(request) => milli_cpu_to_shares(milli(Some(request))),
    };
    let (memory_min, memory_high) = super::memory_qos::container_memory(&node.memory_node(), c);
    let mut config = ResourceConfig {
        cpu_shares: Some(shares),
        memory: (memory_limit != 0).then_some(memory_limit),
        memory_oom_group: node.oom_group().then_some(true),
        memory_min,
        memory_high,
        memory_swap_max: super::memory_qos::container_swap_max(&node.memory_node(), pod, c),
        ..ResourceConfig::default()
    };
    if node.enforce_cpu_limits {
        config.cpu_quota = Some(milli_cpu_to_quota(
            milli(Some(cpu_limit)),
            node.cpu_period_us,
        ));
        config.cpu_period = Some(node.cpu_period_us);
    }
    config
}

/// The files a runtime writes for `config` and their values: only non-zero values are
/// written; on v2 shares become `cpu.weight`, quota and period become one `cpu.max`.
pub fn files(config: &ResourceConfig, version: CgroupVersion) -> Vec<(&'static str, FileValue)> {
    let shares = config.cpu_shares.unwrap_or(0);
    let quota = config.cpu_quota.unwrap_or(0);
    let period = config.cpu_period.unwrap_or(0);
    let memory = config.memory.unwrap_or(0);
    let mut out = Vec::with_capacity(4);
    match version {
        CgroupVersion::V1 => {
            if shares != 0 {
                out.push(("cpu.shares", FileValue::Int(clamp_u64(shares))));
            }
            if period != 0 {
                out.push(("cpu.cfs_period_us", FileValue::Int(clamp_u64(period))));
            }
            if quota != 0 {
                out.push(("cpu.cfs_quota_us", FileValue::Int(quota)));
            }
            if memory != 0 {
                out.push(("memory.limit_in_bytes", FileValue::Int(memory)));
            }
        }
        CgroupVersion::V2 => {
            let weight = cpu_shares_to_weight(shares);
            if weight != 0 {
                out.push(("cpu.weight", FileValue::Int(clamp_u64(weight))));
            }
            if quota != 0 || period != 0 {
                let mut text = if quota > 0 {
                    quota.to_string()
                } else {
                    "max".to_string()
                };
                if period != 0 {
                    text.push(' ');
                    text.push_str(&period.to_string());
                }
                out.push(("cpu.max", FileValue::Text(text)));
            }
            if memory == -1 {
                out.push(("memory.max", FileValue::Text("max".to_string())));
            } else if memory != 0 {
                out.push(("memory.max", FileValue::Int(memory)));
            }
            if let Some(group) = config.memory_oom_group {
                out.push(("memory.oom.group", FileValue::Int(i64::from(group))));
            }
            // Memory QoS and swap: written whenever decided, 0 included (a `memory.swap.max`
            // of 0 is the NoSwap the kubelet writes).
            for (name, value) in [
                (MEMORY_MIN, config.memory_min),
                (MEMORY_LOW, config.memory_low),
                (MEMORY_HIGH, config.memory_high),
                (MEMORY_SWAP_MAX, config.memory_swap_max),
            ] {
                if let Some(v) = value {
                    out.push((name, FileValue::Int(v)));
                }
            }
        }
    }
    out
}

fn clamp_u64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    const GI: i64 = 1 << 30;

    fn node(version: CgroupVersion) -> NodeSettings {
        NodeSettings {
            version,
            allocatable_cpu: Some(Quantity::from_units(3)),
            allocatable_memory: Some(Quantity::from_units(8 * GI)),
            qos_reserved_memory_percent: Some(100),
            enforce_cpu_limits: true,
            cpu_period_us: DEFAULT_QUOTA_PERIOD_US,
            memory_capacity: Some(8 * GI),
            single_process_oom_kill: None,
            memory_qos: false,
            memory_throttling_factor: ThrottlingFactor::default(),
            swap_behavior: SwapBehavior::NoSwap,
            swap_capacity: 0,
            swap_controller: true,
        }
    }

    fn pod(name: &str, uid: &str, containers: Value) -> PodInfo {
        PodInfo::from_json(json!({"metadata": {"name": name, "uid": uid},
            "spec": {"containers": containers}}))
        .unwrap()
    }

    fn res(cpu: &str, mem: &str) -> Value {
        json!({"cpu": cpu, "memory": mem})
    }

    /// The three pods of the seed's worked example.
    fn seed_pods() -> Vec<PodInfo> {
        vec![
            pod(
                "pod-guaranteed-1",
                "g1",
                json!([{"name": "container3", "resources": {"requests": res("1", "1Gi"), "limits": res("1", "1Gi")}}]),
            ),
            pod(
                "pod-burstable-1",
                "b1",
                json!([
                    {"name": "container1", "resources": {"requests": res("1", "1Gi"), "limits": res("1", "1Gi")}},
                    {"name": "container2", "resources": {"requests": res("1", "1Gi"), "limits": res("2", "2Gi")}}]),
            ),
            pod("pod-besteffort-1", "e1", json!([{"name": "container4"}])),
        ]
    }

    fn int(files: &[(&'static str, FileValue)], name: &str) -> Option<i64> {
        files
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| match v {
                FileValue::Int(i) => Some(*i),
                FileValue::Text(_) => None,
            })
    }

    fn text(files: &[(&'static str, FileValue)], name: &str) -> Option<String> {
        files
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| match v {
                FileValue::Text(t) => Some(t.clone()),
                FileValue::Int(_) => None,
            })
    }

    #[test]
    fn seed_004_worked_example() {
        let n = node(CgroupVersion::V1);
        let pods = seed_pods();
        assert_eq!(pods[0].qos, QosClass::Guaranteed);
        assert_eq!(pods[1].qos, QosClass::Burstable);
        assert_eq!(pods[2].qos, QosClass::BestEffort);

        let k = files(&kubepods(&n), n.version);
        assert_eq!(int(&k, "cpu.shares"), Some(3072));
        assert_eq!(int(&k, "memory.limit_in_bytes"), Some(8 * GI));
        assert_eq!(int(&k, "cpu.cfs_quota_us"), None);

        let (b, e) = qos_tiers(&n, &pods);
        let b = files(&b, n.version);
        let e = files(&e, n.version);
        assert_eq!(int(&b, "cpu.shares"), Some(2048));
        assert_eq!(int(&b, "memory.limit_in_bytes"), Some(7 * GI));
        assert_eq!(int(&e, "cpu.shares"), Some(2));
        assert_eq!(int(&e, "memory.limit_in_bytes"), Some(5 * GI));

        // Guaranteed pod: 1 cpu, 1Gi, directly under kubepods.
        assert_eq!(pod_cgroup(&pods[0]), "kubepods/podg1");
        let g = files(&pod_config(&n, &pods[0]), n.version);
        assert_eq!(int(&g, "cpu.shares"), Some(1024));
        assert_eq!(int(&g, "cpu.cfs_quota_us"), Some(100_000));
        assert_eq!(int(&g, "cpu.cfs_period_us"), Some(100_000));
        assert_eq!(int(&g, "memory.limit_in_bytes"), Some(GI));
        let c3 = files(
            &container_config(&n, &pods[0], &pods[0].containers[0]),
            n.version,
        );
        assert_eq!(int(&c3, "cpu.shares"), Some(1024));

        // Burstable pod: shares of 2 cpu, quota of 3 cpu, memory limit 3Gi.
        assert_eq!(pod_cgroup(&pods[1]), "kubepods/burstable/podb1");
        let p = files(&pod_config(&n, &pods[1]), n.version);
        assert_eq!(int(&p, "cpu.shares"), Some(2048));
        assert_eq!(int(&p, "cpu.cfs_quota_us"), Some(300_000));
        assert_eq!(int(&p, "memory.limit_in_bytes"), Some(3 * GI));
        let c1 = files(
            &container_config(&n, &pods[1], &pods[1].containers[0]),
            n.version,
        );
        let c2 = files(
            &container_config(&n, &pods[1], &pods[1].containers[1]),
            n.version,
        );
        assert_eq!(int(&c1, "cpu.shares"), Some(1024));
        assert_eq!(int(&c2, "cpu.shares"), Some(1024));
        assert_eq!(int(&c1, "cpu.cfs_quota_us"), Some(100_000));
        assert_eq!(int(&c2, "cpu.cfs_quota_us"), Some(200_000));
        assert_eq!(int(&c2, "memory.limit_in_bytes"), Some(2 * GI));

        // Best-effort pod: the minimum shares and nothing else.
        assert_eq!(pod_cgroup(&pods[2]), "kubepods/besteffort/pode1");
        let be = files(&pod_config(&n, &pods[2]), n.version);
        assert_eq!(be, vec![("cpu.shares", FileValue::Int(2))]);
    }

    #[test]
    fn seed_004_on_cgroup_v2() {
        let n = node(CgroupVersion::V2);
        let pods = seed_pods();
        let k = files(&kubepods(&n), n.version);
        // 1 + (3072 - 2) * 9999 / 262142 = 118
        assert_eq!(int(&k, "cpu.weight"), Some(118));
        assert_eq!(int(&k, "memory.max"), Some(8 * GI));
        let (b, e) = qos_tiers(&n, &pods);
        assert_eq!(int(&files(&b, n.version), "cpu.weight"), Some(79));
        assert_eq!(int(&files(&e, n.version), "cpu.weight"), Some(1));
        assert_eq!(int(&files(&e, n.version), "memory.max"), Some(5 * GI));
        let p = files(&pod_config(&n, &pods[1]), n.version);
        assert_eq!(text(&p, "cpu.max").as_deref(), Some("300000 100000"));
        assert_eq!(int(&p, "memory.max"), Some(3 * GI));
        let be = files(&pod_config(&n, &pods[2]), n.version);
        assert_eq!(be, vec![("cpu.weight", FileValue::Int(1))]);
    }

    #[test]
    fn shares_and_weight_conversions() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(100), 102);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_shares(1_000_000), MAX_SHARES);
        assert_eq!(cpu_shares_to_weight(2), 1);
        assert_eq!(cpu_shares_to_weight(1024), 39);
        assert_eq!(cpu_shares_to_weight(MAX_SHARES), 10_000);
        assert_eq!(cpu_shares_to_weight(0), 0);
    }

    #[test]
    fn quota_has_a_one_millisecond_floor_and_follows_the_period() {
        assert_eq!(milli_cpu_to_quota(0, 100_000), 0);
        assert_eq!(milli_cpu_to_quota(5, 100_000), 1_000);
        assert_eq!(milli_cpu_to_quota(250, 100_000), 25_000);
        assert_eq!(milli_cpu_to_quota(250, 50_000), 12_500);
    }

    #[test]
    fn custom_period_changes_quota_and_period() {
        let mut n = node(CgroupVersion::V1);
        n.cpu_period_us = 50_000;
        let pods = seed_pods();
        let g = files(&pod_config(&n, &pods[0]), n.version);
        assert_eq!(int(&g, "cpu.cfs_quota_us"), Some(50_000));
        assert_eq!(int(&g, "cpu.cfs_period_us"), Some(50_000));
        let c = files(
            &container_config(&n, &pods[1], &pods[1].containers[1]),
            n.version,
        );
        assert_eq!(int(&c, "cpu.cfs_quota_us"), Some(100_000));
        assert_eq!(int(&c, "cpu.cfs_period_us"), Some(50_000));
    }

    #[test]
    fn without_cfs_enforcement_quota_is_unlimited_for_pods_and_absent_for_containers() {
        let mut n = node(CgroupVersion::V1);
        n.enforce_cpu_limits = false;
        let pods = seed_pods();
        let g = files(&pod_config(&n, &pods[0]), n.version);
        assert_eq!(int(&g, "cpu.cfs_quota_us"), Some(-1));
        let c = files(
            &container_config(&n, &pods[0], &pods[0].containers[0]),
            n.version,
        );
        assert_eq!(int(&c, "cpu.cfs_quota_us"), None);
        assert_eq!(int(&c, "cpu.cfs_period_us"), None);
        n.version = CgroupVersion::V2;
        let g = files(&pod_config(&n, &pods[0]), n.version);
        assert_eq!(text(&g, "cpu.max").as_deref(), Some("max 100000"));
    }

    #[test]
    fn burstable_pod_without_every_limit_leaves_quota_and_memory_unset() {
        let n = node(CgroupVersion::V1);
        let p = pod(
            "b",
            "u",
            json!([
                {"name": "a", "resources": {"requests": res("500m", "1Gi"), "limits": {"cpu": "1"}}},
                {"name": "b", "resources": {"requests": {"cpu": "250m"}, "limits": {"memory": "1Gi"}}}]),
        );
        assert_eq!(p.qos, QosClass::Burstable);
        let f = files(&pod_config(&n, &p), n.version);
        assert_eq!(int(&f, "cpu.shares"), Some(768));
        assert_eq!(int(&f, "cpu.cfs_quota_us"), None);
        assert_eq!(int(&f, "cpu.cfs_period_us"), None);
        assert_eq!(int(&f, "memory.limit_in_bytes"), None);
        // A container without a cpu limit still gets the period, not a quota.
        let cb = files(&container_config(&n, &p, &p.containers[1]), n.version);
        assert_eq!(int(&cb, "cpu.cfs_period_us"), Some(100_000));
        assert_eq!(int(&cb, "cpu.cfs_quota_us"), None);
        assert_eq!(int(&cb, "memory.limit_in_bytes"), Some(GI));
        let mut n2 = n.clone();
        n2.version = CgroupVersion::V2;
        let cb = files(&container_config(&n2, &p, &p.containers[1]), n2.version);
        assert_eq!(text(&cb, "cpu.max").as_deref(), Some("max 100000"));
    }

    #[test]
    fn an_init_container_without_limits_blocks_the_pod_quota() {
        let n = node(CgroupVersion::V1);
        let p = PodInfo::from_json(json!({"metadata": {"name": "i", "uid": "u"}, "spec": {
            "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "100m"}}}],
            "containers": [{"name": "a", "resources": {"requests": res("1", "1Gi"), "limits": res("2", "2Gi")}}]}}))
        .unwrap();
        let f = files(&pod_config(&n, &p), n.version);
        assert_eq!(int(&f, "cpu.cfs_quota_us"), None);
        assert_eq!(int(&f, "memory.limit_in_bytes"), None);
    }

    #[test]
    fn an_init_container_after_a_limited_sidecar_counts_as_limited() {
        let n = node(CgroupVersion::V1);
        let p = PodInfo::from_json(json!({"metadata": {"name": "i", "uid": "u"}, "spec": {
            "initContainers": [
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": res("100m", "64Mi"), "limits": res("100m", "64Mi")}},
                {"name": "init", "resources": {"requests": {"cpu": "100m"}}}],
            "containers": [{"name": "a", "resources": {"requests": res("1", "1Gi"), "limits": res("2", "2Gi")}}]}}))
        .unwrap();
        let f = files(&pod_config(&n, &p), n.version);
        // Limits: 2 + 100m (sidecar); the init moment (100m) is below that.
        assert_eq!(int(&f, "cpu.cfs_quota_us"), Some(210_000));
        assert_eq!(
            int(&f, "memory.limit_in_bytes"),
            Some(2 * GI + 64 * (1 << 20))
        );
    }

    #[test]
    fn container_shares_fall_back_to_the_limit_only_without_a_request() {
        let n = node(CgroupVersion::V1);
        let p = pod(
            "l",
            "u",
            json!([{"name": "a", "resources": {"limits": {"cpu": "500m"}}},
                   {"name": "b", "resources": {"requests": {"cpu": "0"}, "limits": {"cpu": "500m"}}}]),
        );
        let a = files(&container_config(&n, &p, &p.containers[0]), n.version);
        assert_eq!(int(&a, "cpu.shares"), Some(512));
        let b = files(&container_config(&n, &p, &p.containers[1]), n.version);
        assert_eq!(int(&b, "cpu.shares"), Some(2));
    }

    #[test]
    fn qos_reserve_percent_scales_the_reservation() {
        let mut n = node(CgroupVersion::V1);
        n.qos_reserved_memory_percent = Some(50);
        let (b, e) = qos_tiers(&n, &seed_pods());
        // 8Gi - 50% of 1Gi; then - 50% of 2Gi.
        assert_eq!(b.memory, Some(8 * GI - GI / 2));
        assert_eq!(e.memory, Some(8 * GI - GI / 2 - GI));
        n.qos_reserved_memory_percent = None;
        let (b, e) = qos_tiers(&n, &seed_pods());
        assert_eq!(b.memory, None);
        assert_eq!(e.memory, None);
    }

    #[test]
    fn overhead_counts_in_pod_and_tier_values() {
        let n = node(CgroupVersion::V1);
        let p = PodInfo::from_json(json!({"metadata": {"name": "o", "uid": "u"}, "spec": {
            "overhead": {"cpu": "250m", "memory": "128Mi"},
            "containers": [{"name": "a", "resources": {"requests": res("1", "1Gi"), "limits": res("1", "1Gi")}}]}}))
        .unwrap();
        let f = files(&pod_config(&n, &p), n.version);
        assert_eq!(int(&f, "cpu.shares"), Some(1280));
        assert_eq!(int(&f, "cpu.cfs_quota_us"), Some(125_000));
        assert_eq!(int(&f, "memory.limit_in_bytes"), Some(GI + 128 * (1 << 20)));
        let (b, _) = qos_tiers(&n, std::slice::from_ref(&p));
        assert_eq!(b.memory, Some(8 * GI - GI - 128 * (1 << 20)));
    }

    #[test]
    fn pod_level_limits_declare_for_all_containers_and_are_inherited() {
        let n = node(CgroupVersion::V1);
        let p = PodInfo::from_json(json!({"metadata": {"name": "p", "uid": "u"}, "spec": {
            "resources": {"requests": res("1", "1Gi"), "limits": res("2", "2Gi")},
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "500m"}}}]}}))
        .unwrap();
        let f = files(&pod_config(&n, &p), n.version);
        assert_eq!(int(&f, "cpu.shares"), Some(1024));
        assert_eq!(int(&f, "cpu.cfs_quota_us"), Some(200_000));
        assert_eq!(int(&f, "memory.limit_in_bytes"), Some(2 * GI));
        let c = files(&container_config(&n, &p, &p.containers[0]), n.version);
        assert_eq!(int(&c, "cpu.shares"), Some(512));
        assert_eq!(int(&c, "cpu.cfs_quota_us"), Some(200_000));
        assert_eq!(int(&c, "memory.limit_in_bytes"), Some(2 * GI));
    }

    #[test]
    fn unknown_allocatable_leaves_kubepods_and_reserves_unset() {
        let mut n = node(CgroupVersion::V1);
        n.allocatable_cpu = None;
        n.allocatable_memory = None;
        assert_eq!(files(&kubepods(&n), n.version), vec![]);
        let (b, _) = qos_tiers(&n, &seed_pods());
        assert_eq!(b.memory, None);
    }

    #[test]
    fn oom_group_on_v2_containers_unless_single_process_oom_kill() {
        let pods = seed_pods();
        let burstable = &pods[1];
        let c = &burstable.containers[0];
        let v2 = node(CgroupVersion::V2);
        let files_v2 = files(&container_config(&v2, burstable, c), CgroupVersion::V2);
        assert_eq!(int(&files_v2, "memory.oom.group"), Some(1));
        // Pod and QoS cgroups are never OOM groups.
        let pod_files = files(&pod_config(&v2, burstable), CgroupVersion::V2);
        assert_eq!(int(&pod_files, "memory.oom.group"), None);
        let single = NodeSettings {
            single_process_oom_kill: Some(true),
            ..v2.clone()
        };
        let files_single = files(&container_config(&single, burstable, c), CgroupVersion::V2);
        assert_eq!(int(&files_single, "memory.oom.group"), None);
        let v1 = node(CgroupVersion::V1);
        assert!(!v1.oom_group());
        let files_v1 = files(&container_config(&v1, burstable, c), CgroupVersion::V1);
        assert!(files_v1.iter().all(|(n, _)| !n.starts_with("memory.oom")));
    }
}
