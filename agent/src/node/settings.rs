//! The node as the pod manager models it, computed once from the config at start: capacity,
//! allocatable for admission, and the cgroup settings `decide` computes values from.
//!
//! Two allocatables, as in the kubelet: the `kubepods` cgroup is limited to capacity minus
//! `systemReserved` and `kubeReserved` (node-allocatable enforcement), while admission
//! compares against the allocatable of the kubelet's node status, which for memory also
//! subtracts the hard `memory.available` eviction threshold — a pod that would push the node
//! straight into eviction is not admitted.

use crate::config::Config;
use crate::decide::cgroups::{CgroupVersion, NodeSettings};
use crate::decide::quantity::Quantity;
use crate::decide::resources::{ResourceList, CPU, MEMORY, PODS};
use crate::decide::thresholds::{effective_hard, parse_hard, EvictionSettings};
use crate::plan::cgroups::{AllocatableInput, MemorySwapInput, NodeInput};
use crate::plan::input::JsonQuantity;

use super::admit::{allocatable, DEFAULT_MAX_PODS};

/// Everything about the node the pod manager needs; see the module doc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePlan {
    /// Capacity and admission allocatable.
    pub resources: super::admit::NodeResources,
    /// The cgroup settings (allocatable here is capacity minus reserved).
    pub cgroups: NodeSettings,
    /// Whether `enforceNodeAllocatable` holds `pods` (the `kubepods` memory limit is set).
    pub enforce_pods: bool,
    /// `runtime.kind`, the only runtime class pods may name.
    pub runtime_kind: String,
}

/// The machine's cpu count, when `node.cpuCapacity` is not set.
fn machine_cpus() -> i64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as i64)
}

/// Why the node could not be modelled from the config; each names the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum NodePlanError {
    /// The memory capacity: `node.memoryCapacity`, or `MemTotal` when it is unset.
    #[error(transparent)]
    MemoryCapacity(#[from] crate::observe::ObserveError),
    /// A quantity the config gives that is not one, or negative.
    #[error("{key}: {reason}")]
    Quantity {
        /// The config key (`node.cpuCapacity`).
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The hard `memory.available` eviction threshold.
    #[error(transparent)]
    Threshold(#[from] crate::decide::thresholds::ThresholdError),
    /// The cgroup settings computed from the node.
    #[error(transparent)]
    Cgroups(#[from] crate::plan::input::InputError),
}

fn quantity(key: &'static str, text: &str) -> Result<Quantity, NodePlanError> {
    let q = Quantity::parse(text).map_err(|e| NodePlanError::Quantity {
        key,
        reason: e.to_string(),
    })?;
    if q.is_negative() {
        return Err(NodePlanError::Quantity {
            key,
            reason: format!("{text:?} must not be negative"),
        });
    }
    Ok(q)
}

impl NodePlan {
    /// Computes the plan for `config` on a node with cgroup `version` and `swap_bytes` of swap
    /// (the kernel's `SwapTotal`, which LimitedSwap shares out). Errors name the key.
    pub fn from_config(
        config: &Config,
        version: CgroupVersion,
        swap_bytes: u64,
    ) -> Result<NodePlan, NodePlanError> {
        let bytes = crate::observe::memory_capacity(config)?;
        let memory = Quantity::from_units(i64::try_from(bytes).unwrap_or(i64::MAX));
        let cpu = if config.node.cpu_capacity.is_empty() {
            Quantity::from_units(machine_cpus())
        } else {
            quantity("node.cpuCapacity", &config.node.cpu_capacity)?
        };
        let mut capacity = ResourceList::default();
        capacity.set(CPU, cpu);
        capacity.set(MEMORY, memory);
        capacity.set(PODS, Quantity::from_units(DEFAULT_MAX_PODS));
        let list = |m: &std::collections::BTreeMap<String, crate::config::ConfigQuantity>| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.0))
                .collect::<ResourceList>()
        };
        let system = list(&config.system_reserved);
        let kube = list(&config.kube_reserved);
        let enforce_pods = config.enforce_node_allocatable.iter().any(|s| s == "pods");
        let hard = effective_hard(&EvictionSettings {
            hard: config.eviction_hard.clone(),
            // The config's own default holds the kubelet's defaults (an absent key); an
            // empty map there was written so.
            hard_given: true,
            soft: Default::default(),
            soft_grace_period: Default::default(),
            minimum_reclaim: Default::default(),
            merge_defaults: config.merge_default_eviction_settings,
            enforce_allocatable_pods: enforce_pods,
        });
        // The threshold's amount as the eviction manager computes it (decide's one home
        // for threshold maths); none when the kubelet ignores it (`0%`, `100%`).
        let hard_memory = match hard.get("memory.available") {
            None => None,
            Some(text) => parse_hard("memory.available", text)?.map(|v| v.quantity(memory)),
        };
        let for_cgroups = allocatable(&capacity, &[&system, &kube], None);
        let for_admission = allocatable(&capacity, &[&system, &kube], hard_memory);
        let cgroups = NodeInput {
            cgroup_version: Some(match version {
                CgroupVersion::V1 => 1,
                CgroupVersion::V2 => 2,
            }),
            allocatable: AllocatableInput {
                cpu: for_cgroups.get(CPU).map(JsonQuantity),
                memory: for_cgroups.get(MEMORY).map(JsonQuantity),
            },
            qos_reserved: config.qos_reserved.clone(),
            enforce_cpu_limits: Some(config.cpu_cfs_quota),
            cpu_cfs_quota_period: Some(crate::decide::duration::format_go_duration(
                config.cpu_cfs_quota_period.0,
            )),
            memory_capacity: Some(JsonQuantity(memory)),
            single_process_oom_kill: config.single_process_oom_kill,
            feature_gates: config.feature_gates.clone(),
            memory_throttling_factor: Some(config.memory_throttling_factor),
            memory_swap: MemorySwapInput {
                swap_behavior: config.memory_swap.swap_behavior.clone(),
            },
            swap_capacity: Some(JsonQuantity(Quantity::from_units(
                i64::try_from(swap_bytes).unwrap_or(i64::MAX),
            ))),
        }
        .settings()?;
        Ok(NodePlan {
            resources: super::admit::NodeResources {
                capacity,
                allocatable: for_admission,
            },
            cgroups,
            enforce_pods,
            runtime_kind: config.runtime.kind.clone(),
        })
    }

    /// The `kubepods` values: allocatable cpu shares always, the memory limit only when
    /// `enforceNodeAllocatable` holds `pods`.
    pub fn kubepods(&self) -> crate::decide::cgroups::ResourceConfig {
        let mut top = crate::decide::cgroups::kubepods(&self.cgroups);
        if !self.enforce_pods {
            top.memory = None;
        }
        top
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_node_from_config() {
        let config = Config::from_yaml(
            "node: {memoryCapacity: 1Gi, cpuCapacity: '2'}\nsystemReserved: {memory: 100Mi}\nevictionHard: {memory.available: 100Mi}\nqosReserved: {memory: '100%'}\n",
        )
        .unwrap();
        let plan = NodePlan::from_config(&config, CgroupVersion::V1, 0).unwrap();
        assert_eq!(
            plan.resources.allocatable.get(MEMORY),
            Some(Quantity::from_units((1 << 30) - (200 << 20)))
        );
        assert_eq!(
            plan.cgroups.allocatable_memory,
            Some(Quantity::from_units((1 << 30) - (100 << 20)))
        );
        assert_eq!(plan.kubepods().memory, Some((1 << 30) - (100 << 20)));
        assert_eq!(plan.cgroups.qos_reserved_memory_percent, Some(100));
        assert_eq!(plan.cgroups.memory_capacity, Some(1 << 30));
        assert!(!plan.cgroups.memory_qos);
    }

    #[test]
    fn memory_qos_and_swap_reach_the_cgroup_settings() {
        let config = Config::from_yaml(
            "node: {memoryCapacity: 1Gi, cpuCapacity: '2'}
featureGates: {MemoryQoS: true}
memoryThrottlingFactor: 0.75
memorySwap: {swapBehavior: LimitedSwap}
failSwapOn: false
",
        )
        .unwrap();
        let plan = NodePlan::from_config(&config, CgroupVersion::V2, 512 << 20).unwrap();
        assert!(plan.cgroups.memory_qos);
        assert_eq!(plan.cgroups.memory_throttling_factor.0, 0.75);
        assert_eq!(
            plan.cgroups.swap_behavior,
            crate::decide::memory_qos::SwapBehavior::LimitedSwap
        );
        assert_eq!(plan.cgroups.swap_capacity, 512 << 20);
    }
}
