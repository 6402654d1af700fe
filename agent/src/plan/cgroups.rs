//! `plan cgroups`: the cgroup files and values the kubelet would write for a node's pods.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::input::{invalid, parse, InputError, JsonQuantity};
use crate::decide::cgroups::{
    container_config, files, kubepods_with_pods, pod_cgroup, pod_config, qos_tiers, CgroupVersion,
    FileValue, NodeSettings, ResourceConfig, DEFAULT_QUOTA_PERIOD_US, MEMORY_HIGH, MEMORY_LOW,
    MEMORY_MIN, MEMORY_SWAP_MAX,
};
use crate::decide::duration::parse_go_duration_nanos;
use crate::decide::memory_qos::{SwapBehavior, ThrottlingFactor, DEFAULT_THROTTLING_FACTOR};
use crate::decide::oom_score::oom_score_adj;
use crate::decide::pod::{clamp_i64, PodInfo};
use crate::decide::quantity::Quantity;

/// The input document.
#[derive(Deserialize)]
pub struct CgroupsInput {
    /// The node's cgroup settings.
    pub node: NodeInput,
    /// The pods on the node.
    #[serde(default)]
    pub pods: Vec<PodInfo>,
}

/// The node block, with the KubeletConfiguration's meaning for each field.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeInput {
    /// 1 or 2 (default 1).
    pub cgroup_version: Option<u8>,
    /// Capacity minus system and kube reserved.
    #[serde(default)]
    pub allocatable: AllocatableInput,
    /// `qosReserved`: resource → `"N%"`; only memory is supported, as in the kubelet.
    #[serde(default)]
    pub qos_reserved: BTreeMap<String, String>,
    /// `cpuCFSQuota` (default true).
    #[serde(rename = "enforceCPULimits")]
    pub enforce_cpu_limits: Option<bool>,
    /// `cpuCFSQuotaPeriod`, a Go duration (default `"100ms"`).
    #[serde(rename = "cpuCFSQuotaPeriod")]
    pub cpu_cfs_quota_period: Option<String>,
    /// The machine's memory (for burstable `oom_score_adj`).
    pub memory_capacity: Option<JsonQuantity>,
    /// `singleProcessOOMKill` (default: `false` on v2, `true` on v1; `false` is refused on
    /// v1, as the kubelet refuses it).
    #[serde(rename = "singleProcessOOMKill")]
    pub single_process_oom_kill: Option<bool>,
    /// `featureGates`: `MemoryQoS` (default false) turns on `memory.min`/`memory.high` on
    /// v2; `NodeSwap` is GA and locked on in v1.34, so `false` is refused; other gates do not
    /// change a cgroup value and are ignored.
    #[serde(default)]
    pub feature_gates: BTreeMap<String, bool>,
    /// `memoryThrottlingFactor` (default 0.9), in (0, 1].
    pub memory_throttling_factor: Option<f64>,
    /// `memorySwap` (`swapBehavior`: `NoSwap`, the default, or `LimitedSwap`).
    #[serde(default)]
    pub memory_swap: MemorySwapInput,
    /// The node's swap (`SwapTotal`; default 0), which LimitedSwap shares out.
    pub swap_capacity: Option<JsonQuantity>,
}

/// `memorySwap`, as in KubeletConfiguration.
#[derive(Deserialize, Default, Clone)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemorySwapInput {
    /// `""`, `NoSwap` or `LimitedSwap`.
    #[serde(default)]
    pub swap_behavior: String,
}

/// Allocatable cpu and memory.
#[derive(Deserialize, Default)]
pub struct AllocatableInput {
    /// cpu (cores or millicores).
    pub cpu: Option<JsonQuantity>,
    /// memory (bytes).
    pub memory: Option<JsonQuantity>,
}

fn non_negative(q: Option<JsonQuantity>, path: &str) -> Result<Option<Quantity>, InputError> {
    match q {
        Some(JsonQuantity(q)) if q.is_negative() => {
            Err(invalid(path, format!("quantity {q} must not be negative")))
        }
        Some(JsonQuantity(q)) => Ok(Some(q)),
        None => Ok(None),
    }
}

/// `ParseQOSReserved`: `"N%"` with N in 0..=100, for memory only.
fn qos_reserved(map: &BTreeMap<String, String>) -> Result<Option<i64>, InputError> {
    let mut memory = None;
    for (resource, value) in map {
        let path = format!("node.qosReserved.{resource}");
        if resource != "memory" {
            return Err(invalid(
                &path,
                format!("cannot reserve {resource:?} (only memory can be reserved)"),
            ));
        }
        let digits = value.strip_suffix('%').ok_or_else(|| {
            invalid(
                &path,
                format!("{value:?} must be a percentage like \"100%\""),
            )
        })?;
        let percent: i64 = digits
            .parse()
            .map_err(|_| invalid(&path, format!("{value:?} is not a whole percentage")))?;
        if !(0..=100).contains(&percent) {
            return Err(invalid(
                &path,
                format!("{value:?} must be between 0% and 100%"),
            ));
        }
        memory = Some(percent);
    }
    Ok(memory)
}

impl NodeInput {
    /// Validates the node block into the rule's settings.
    pub fn settings(&self) -> Result<NodeSettings, InputError> {
        let version = match self.cgroup_version.unwrap_or(1) {
            1 => CgroupVersion::V1,
            2 => CgroupVersion::V2,
            v => return Err(invalid("node.cgroupVersion", format!("{v} is not 1 or 2"))),
        };
        let cpu_period_us = match &self.cpu_cfs_quota_period {
            None => DEFAULT_QUOTA_PERIOD_US,
            Some(text) => {
                let nanos = parse_go_duration_nanos(text)
                    .map_err(|e| invalid("node.cpuCFSQuotaPeriod", e))?;
                if !(1_000_000..=1_000_000_000).contains(&nanos) {
                    return Err(invalid(
                        "node.cpuCFSQuotaPeriod",
                        format!("{text:?} must be between 1ms and 1s, inclusive"),
                    ));
                }
                (nanos / 1_000) as u64
            }
        };
        if version == CgroupVersion::V1 && self.single_process_oom_kill == Some(false) {
            return Err(invalid(
                "node.singleProcessOOMKill",
                "false needs cgroup v2 (v1 has no memory.oom.group)",
            ));
        }
        let memory_capacity = non_negative(self.memory_capacity, "node.memoryCapacity")?
            .map(|q| clamp_i64(q.value()));
        let memory = memory_qos_settings(self)?;
        Ok(NodeSettings {
            version,
            allocatable_cpu: non_negative(self.allocatable.cpu, "node.allocatable.cpu")?,
            allocatable_memory: non_negative(self.allocatable.memory, "node.allocatable.memory")?,
            qos_reserved_memory_percent: qos_reserved(&self.qos_reserved)?,
            enforce_cpu_limits: self.enforce_cpu_limits.unwrap_or(true),
            cpu_period_us,
            memory_capacity,
            single_process_oom_kill: self.single_process_oom_kill,
            memory_qos: memory.memory_qos,
            memory_throttling_factor: memory.throttling_factor,
            swap_behavior: memory.swap_behavior,
            swap_capacity: non_negative(self.swap_capacity, "node.swapCapacity")?
                .map_or(0, |q| clamp_i64(q.value())),
            // `plan` has no kernel to ask: a v2 node is taken to have swap accounting, as
            // every kernel since 5.8 does by default; the agent asks its own.
            swap_controller: version == CgroupVersion::V2,
        })
    }
}

/// The Memory QoS and swap part of the node block, validated.
struct MemorySettings {
    memory_qos: bool,
    throttling_factor: ThrottlingFactor,
    swap_behavior: SwapBehavior,
}

fn memory_qos_settings(node: &NodeInput) -> Result<MemorySettings, InputError> {
    if node.feature_gates.get("NodeSwap") == Some(&false) {
        return Err(invalid(
            "node.featureGates.NodeSwap",
            "cannot be false: the gate is GA and locked to true (Kubernetes v1.34)",
        ));
    }
    let factor = node
        .memory_throttling_factor
        .unwrap_or(DEFAULT_THROTTLING_FACTOR);
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(invalid(
            "node.memoryThrottlingFactor",
            format!("{factor} must be greater than 0 and at most 1.0"),
        ));
    }
    let behavior = &node.memory_swap.swap_behavior;
    let swap_behavior = SwapBehavior::parse(behavior).ok_or_else(|| {
        invalid(
            "node.memorySwap.swapBehavior",
            format!("{behavior:?} is not NoSwap or LimitedSwap"),
        )
    })?;
    Ok(MemorySettings {
        memory_qos: node
            .feature_gates
            .get("MemoryQoS")
            .copied()
            .unwrap_or(false),
        throttling_factor: ThrottlingFactor(factor),
        swap_behavior,
    })
}

/// Which cgroup a settings object is for: the Memory QoS files are named on every v2 cgroup,
/// `memory.swap.max` on containers only.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Group,
    Container,
}

fn settings_object(
    config: &ResourceConfig,
    version: CgroupVersion,
    level: Level,
) -> Map<String, Value> {
    let mut out = Map::new();
    if version == CgroupVersion::V2 {
        // Null where the kubelet leaves the file at the kernel's default, so the reader sees
        // the name and that nothing is written to it.
        let mut named = vec![MEMORY_MIN, MEMORY_LOW, MEMORY_HIGH];
        if level == Level::Container {
            named.push(MEMORY_SWAP_MAX);
        }
        for name in named {
            out.insert(name.to_string(), Value::Null);
        }
    }
    for (name, value) in files(config, version) {
        let v = match value {
            FileValue::Int(i) => Value::from(i),
            FileValue::Text(t) => Value::from(t),
        };
        out.insert(name.to_string(), v);
    }
    out
}

/// Computes the answer for a parsed input: `kubepods`, `burstable`, `besteffort` and one
/// entry per pod with its containers (init containers are not listed).
pub fn plan(input: &CgroupsInput) -> Result<Value, InputError> {
    let node = input.node.settings()?;
    let v = node.version;
    let (burstable, best_effort) = qos_tiers(&node, &input.pods);
    let mut pods = Map::new();
    for (i, pod) in input.pods.iter().enumerate() {
        let mut entry = Map::new();
        entry.insert("qos".into(), Value::from(pod.qos.as_str()));
        entry.insert("cgroup".into(), Value::from(pod_cgroup(pod)));
        entry.extend(settings_object(&pod_config(&node, pod), v, Level::Group));
        let mut containers = Map::new();
        for c in &pod.containers {
            let mut settings =
                settings_object(&container_config(&node, pod, c), v, Level::Container);
            let adj = oom_score_adj(pod, c, node.memory_capacity).ok_or_else(|| {
                invalid(
                    "node.memoryCapacity",
                    format!(
                        "missing or zero; it is needed for the oomScoreAdj of burstable pod {} (pods[{i}])",
                        pod.name
                    ),
                )
            })?;
            settings.insert("oomScoreAdj".into(), Value::from(adj));
            containers.insert(c.name.clone(), Value::Object(settings));
        }
        entry.insert("containers".into(), Value::Object(containers));
        pods.insert(pod.name.clone(), Value::Object(entry));
    }
    let mut out = Map::new();
    out.insert(
        "kubepods".into(),
        Value::Object(settings_object(
            &kubepods_with_pods(&node, &input.pods),
            v,
            Level::Group,
        )),
    );
    out.insert(
        "burstable".into(),
        Value::Object(settings_object(&burstable, v, Level::Group)),
    );
    out.insert(
        "besteffort".into(),
        Value::Object(settings_object(&best_effort, v, Level::Group)),
    );
    out.insert("pods".into(), Value::Object(pods));
    Ok(Value::Object(out))
}

/// Parses a JSON document and answers it; a malformed document is an [`InputError`].
pub fn run(bytes: &[u8]) -> Result<Value, InputError> {
    let input: CgroupsInput = parse(bytes)?;
    plan(&input)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(node: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({"node": node, "pods": [
            {"metadata": {"name": "g", "namespace": "ns", "uid": "1"}, "spec": {"containers": [
                {"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                            "limits": {"cpu": "1", "memory": "1Gi"}}}]}},
            {"metadata": {"name": "b", "namespace": "ns", "uid": "2"}, "spec": {"containers": [
                {"name": "c", "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}]}}
        ]}))
        .unwrap()
    }

    #[test]
    fn full_answer_on_v1() {
        let out = run(&doc(json!({"cgroupVersion": 1,
            "allocatable": {"cpu": "4", "memory": "8Gi"}, "qosReserved": {"memory": "100%"},
            "memoryCapacity": "8Gi"})))
        .unwrap();
        assert_eq!(
            out["kubepods"],
            json!({"cpu.shares": 4096, "memory.limit_in_bytes": 8589934592_i64})
        );
        assert_eq!(
            out["burstable"],
            json!({"cpu.shares": 512, "memory.limit_in_bytes": 7516192768_i64})
        );
        assert_eq!(
            out["besteffort"],
            json!({"cpu.shares": 2, "memory.limit_in_bytes": 6979321856_i64})
        );
        assert_eq!(out["pods"]["ns/g"]["qos"], "Guaranteed");
        assert_eq!(out["pods"]["ns/g"]["cgroup"], "kubepods/pod1");
        assert_eq!(out["pods"]["ns/g"]["cpu.cfs_quota_us"], 100000);
        assert_eq!(out["pods"]["ns/g"]["containers"]["c"]["oomScoreAdj"], -997);
        assert_eq!(out["pods"]["ns/b"]["cgroup"], "kubepods/burstable/pod2");
        assert!(out["pods"]["ns/b"].get("memory.limit_in_bytes").is_none());
        assert_eq!(out["pods"]["ns/b"]["containers"]["c"]["cpu.shares"], 512);
        assert_eq!(
            out["pods"]["ns/b"]["containers"]["c"]["cpu.cfs_period_us"],
            100000
        );
        assert!(out["pods"]["ns/b"]["containers"]["c"]
            .get("cpu.cfs_quota_us")
            .is_none());
        assert_eq!(out["pods"]["ns/b"]["containers"]["c"]["oomScoreAdj"], 938);
    }

    #[test]
    fn v2_files() {
        let out = run(&doc(
            json!({"cgroupVersion": 2, "allocatable": {"cpu": "4", "memory": "8Gi"},
            "memoryCapacity": "8Gi", "cpuCFSQuotaPeriod": "50ms"}),
        ))
        .unwrap();
        assert_eq!(out["pods"]["ns/g"]["cpu.max"], "50000 50000");
        assert_eq!(out["pods"]["ns/g"]["memory.max"], 1073741824);
        assert_eq!(
            out["pods"]["ns/b"]["containers"]["c"]["cpu.max"],
            "max 50000"
        );
        // No qosReserved: the tiers get no memory limit.
        assert!(out["burstable"].get("memory.max").is_none());
        // singleProcessOOMKill unset on v2: containers are OOM groups, pods are not.
        assert_eq!(
            out["pods"]["ns/b"]["containers"]["c"]["memory.oom.group"],
            1
        );
        assert!(out["pods"]["ns/b"].get("memory.oom.group").is_none());
    }

    #[test]
    fn memory_qos_and_swap_files_on_v2() {
        let out = run(&doc(json!({"cgroupVersion": 2,
            "allocatable": {"cpu": "4", "memory": "8Gi"}, "memoryCapacity": "8Gi",
            "featureGates": {"MemoryQoS": true}, "memoryThrottlingFactor": 0.5,
            "memorySwap": {"swapBehavior": "LimitedSwap"}, "swapCapacity": "2Gi"})))
        .unwrap();
        // kubepods: Guaranteed + Burstable requests; burstable: its own; besteffort: none.
        assert_eq!(out["kubepods"]["memory.min"], 1610612736_i64);
        assert_eq!(out["burstable"]["memory.min"], 536870912_i64);
        assert_eq!(out["besteffort"]["memory.min"], Value::Null);
        for entry in ["kubepods", "burstable", "besteffort"] {
            assert_eq!(out[entry]["memory.high"], Value::Null, "{entry}");
            assert_eq!(out[entry]["memory.low"], Value::Null, "{entry}");
            assert!(out[entry].get("memory.swap.max").is_none(), "{entry}");
        }
        let g = &out["pods"]["ns/g"];
        assert_eq!(g["memory.min"], 1073741824_i64);
        assert_eq!(g["memory.high"], Value::Null);
        // The Guaranteed container: memory.min, no memory.high, no swap.
        assert_eq!(g["containers"]["c"]["memory.min"], 1073741824_i64);
        assert_eq!(g["containers"]["c"]["memory.high"], Value::Null);
        assert_eq!(g["containers"]["c"]["memory.swap.max"], 0);
        // The Burstable one (512Mi, no limit): memory.high halfway to allocatable, and
        // 512Mi / 8Gi of the 2Gi of swap.
        let b = &out["pods"]["ns/b"]["containers"]["c"];
        assert_eq!(b["memory.min"], 536870912_i64);
        assert_eq!(
            b["memory.high"],
            (512_i64 << 20) + ((8_i64 << 30) - (512 << 20)) / 2
        );
        assert_eq!(b["memory.swap.max"], 134217728_i64);
        assert_eq!(b["memory.low"], Value::Null);
    }

    #[test]
    fn without_the_gate_v2_names_the_files_null_and_swap_zero() {
        let out = run(&doc(json!({"cgroupVersion": 2,
            "allocatable": {"cpu": "4", "memory": "8Gi"}, "memoryCapacity": "8Gi"})))
        .unwrap();
        assert_eq!(out["kubepods"]["memory.min"], Value::Null);
        let b = &out["pods"]["ns/b"]["containers"]["c"];
        assert_eq!(b["memory.min"], Value::Null);
        assert_eq!(b["memory.high"], Value::Null);
        // NoSwap, the default: the kubelet still writes memory.swap.max 0 on v2.
        assert_eq!(b["memory.swap.max"], 0);
        // v1 has none of these files, so none are named.
        let v1 = run(&doc(json!({"cgroupVersion": 1, "memoryCapacity": "8Gi",
            "featureGates": {"MemoryQoS": true}, "memorySwap": {"swapBehavior": "LimitedSwap"}})))
        .unwrap();
        let c = &v1["pods"]["ns/b"]["containers"]["c"];
        for f in ["memory.min", "memory.low", "memory.high", "memory.swap.max"] {
            assert!(c.get(f).is_none(), "{f}");
            assert!(v1["kubepods"].get(f).is_none(), "{f}");
        }
    }

    #[test]
    fn bad_memory_qos_settings_are_input_errors() {
        for (node, path) in [
            (
                json!({"memoryThrottlingFactor": 0}),
                "node.memoryThrottlingFactor: ",
            ),
            (
                json!({"memoryThrottlingFactor": 1.01}),
                "node.memoryThrottlingFactor: ",
            ),
            (
                json!({"memorySwap": {"swapBehavior": "Unlimited"}}),
                "node.memorySwap.swapBehavior: ",
            ),
            (
                json!({"featureGates": {"NodeSwap": false}}),
                "node.featureGates.NodeSwap: ",
            ),
            (json!({"swapCapacity": "-1Gi"}), "node.swapCapacity: "),
        ] {
            let e = run(&doc(node.clone())).unwrap_err().to_string();
            assert!(e.starts_with(path), "{node}: {e}");
        }
    }

    #[test]
    fn bad_node_settings_are_input_errors() {
        let e = run(&doc(json!({"cgroupVersion": 3})))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("node.cgroupVersion: "), "{e}");
        let e = run(&doc(json!({"qosReserved": {"memory": "150%"}})))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("node.qosReserved.memory: "), "{e}");
        let e = run(&doc(json!({"qosReserved": {"cpu": "10%"}})))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("node.qosReserved.cpu: "), "{e}");
        let e = run(&doc(json!({"cpuCFSQuotaPeriod": "2s"})))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("node.cpuCFSQuotaPeriod: "), "{e}");
        let e = run(&doc(json!({"allocatable": {"memory": "-1Gi"}})))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("node.allocatable.memory: "), "{e}");
        let e = run(&doc(json!({"allocatable": {"memory": "12Qi"}})))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("node.allocatable.memory: invalid quantity \"12Qi\""),
            "{e}"
        );
        let e = run(&doc(
            json!({"cgroupVersion": 1, "singleProcessOOMKill": false}),
        ))
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("node.singleProcessOOMKill: "), "{e}");
        // A burstable pod needs the memory capacity for its oom_score_adj.
        let e = run(&doc(json!({}))).unwrap_err().to_string();
        assert!(e.starts_with("node.memoryCapacity: "), "{e}");
    }
}
