//! `reactor plan cgroups`: the binary gives the kubelet's cgroup values for realistic pods on
//! cgroup v1 and v2 (seed 004's node among them), and refuses malformed input with exit 2.

mod kubectl;

use std::process::Command;

use kubectl::{container, pod};
use reactor_tests::reactor_bin;
use serde_json::{json, Value};

fn plan(input: &Value) -> (Option<i32>, Value, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("in.json");
    std::fs::write(&file, serde_json::to_vec(input).expect("serialize input"))
        .expect("write input");
    let out = Command::new(reactor_bin())
        .args([
            "plan",
            "cgroups",
            "--input",
            file.to_str().expect("utf-8 path"),
        ])
        .output()
        .expect("run reactor");
    let stdout = if out.status.success() {
        serde_json::from_slice(&out.stdout).expect("stdout is JSON")
    } else {
        Value::Null
    };
    (
        out.status.code(),
        stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn res(cpu: &str, mem: &str) -> Value {
    json!({"cpu": cpu, "memory": mem})
}

const GI: i64 = 1 << 30;

/// Seed 004: a 3-cpu, 8Gi node with one pod per QoS class and `qosReserved: memory=100%`.
fn seed_pods() -> Vec<Value> {
    vec![
        pod(
            "default",
            "pod-guaranteed-1",
            "aaaa-1",
            Some(0),
            None,
            vec![container("container3", res("1", "1Gi"), res("1", "1Gi"))],
            "Guaranteed",
        ),
        pod(
            "default",
            "pod-burstable-1",
            "bbbb-2",
            Some(0),
            None,
            vec![
                container("container1", res("1", "1Gi"), res("1", "1Gi")),
                container("container2", res("1", "1Gi"), res("2", "2Gi")),
            ],
            "Burstable",
        ),
        pod(
            "default",
            "pod-besteffort-1",
            "cccc-3",
            Some(0),
            None,
            vec![container("container4", json!({}), json!({}))],
            "BestEffort",
        ),
    ]
}

fn seed_node(version: u8) -> Value {
    json!({"cgroupVersion": version, "allocatable": {"cpu": "3", "memory": "8Gi"},
           "qosReserved": {"memory": "100%"}, "enforceCPULimits": true,
           "cpuCFSQuotaPeriod": "100ms", "memoryCapacity": "8Gi"})
}

#[test]
fn seed_004_node_on_cgroup_v1() {
    let (code, out, err) = plan(&json!({"node": seed_node(1), "pods": seed_pods()}));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out["kubepods"],
        json!({"cpu.shares": 3072, "memory.limit_in_bytes": 8 * GI})
    );
    assert_eq!(
        out["burstable"],
        json!({"cpu.shares": 2048, "memory.limit_in_bytes": 7 * GI})
    );
    assert_eq!(
        out["besteffort"],
        json!({"cpu.shares": 2, "memory.limit_in_bytes": 5 * GI})
    );
    assert_eq!(
        out["pods"]["default/pod-guaranteed-1"],
        json!({"qos": "Guaranteed", "cgroup": "kubepods/podaaaa-1",
               "cpu.shares": 1024, "cpu.cfs_quota_us": 100000, "cpu.cfs_period_us": 100000,
               "memory.limit_in_bytes": GI,
               "containers": {"container3": {"cpu.shares": 1024, "cpu.cfs_quota_us": 100000,
                   "cpu.cfs_period_us": 100000, "memory.limit_in_bytes": GI, "oomScoreAdj": -997}}})
    );
    assert_eq!(
        out["pods"]["default/pod-burstable-1"],
        json!({"qos": "Burstable", "cgroup": "kubepods/burstable/podbbbb-2",
               "cpu.shares": 2048, "cpu.cfs_quota_us": 300000, "cpu.cfs_period_us": 100000,
               "memory.limit_in_bytes": 3 * GI,
               "containers": {
                   "container1": {"cpu.shares": 1024, "cpu.cfs_quota_us": 100000,
                       "cpu.cfs_period_us": 100000, "memory.limit_in_bytes": GI, "oomScoreAdj": 875},
                   "container2": {"cpu.shares": 1024, "cpu.cfs_quota_us": 200000,
                       "cpu.cfs_period_us": 100000, "memory.limit_in_bytes": 2 * GI, "oomScoreAdj": 875}}})
    );
    assert_eq!(
        out["pods"]["default/pod-besteffort-1"],
        json!({"qos": "BestEffort", "cgroup": "kubepods/besteffort/podcccc-3", "cpu.shares": 2,
               "containers": {"container4": {"cpu.shares": 2, "cpu.cfs_period_us": 100000, "oomScoreAdj": 1000}}})
    );
}

#[test]
fn seed_004_node_on_cgroup_v2() {
    let (code, out, err) = plan(&json!({"node": seed_node(2), "pods": seed_pods()}));
    assert_eq!(code, Some(0), "{err}");
    // Without the MemoryQoS gate the v2 memory files are named, null: left to the kernel.
    let unset = json!({"memory.min": null, "memory.low": null, "memory.high": null});
    let with_unset = |mut v: Value| {
        v.as_object_mut()
            .unwrap()
            .extend(unset.as_object().unwrap().clone());
        v
    };
    assert_eq!(
        out["kubepods"],
        with_unset(json!({"cpu.weight": 118, "memory.max": 8 * GI}))
    );
    assert_eq!(
        out["burstable"],
        with_unset(json!({"cpu.weight": 79, "memory.max": 7 * GI}))
    );
    assert_eq!(
        out["besteffort"],
        with_unset(json!({"cpu.weight": 1, "memory.max": 5 * GI}))
    );
    let b = &out["pods"]["default/pod-burstable-1"];
    assert_eq!(b["cpu.weight"], 79);
    assert_eq!(b["cpu.max"], "300000 100000");
    assert_eq!(b["memory.max"], 3 * GI);
    assert_eq!(b["containers"]["container2"]["cpu.max"], "200000 100000");
    assert_eq!(b["containers"]["container2"]["cpu.weight"], 39);
    let e = &out["pods"]["default/pod-besteffort-1"];
    assert_eq!(
        e["containers"]["container4"],
        with_unset(
            json!({"cpu.weight": 1, "cpu.max": "max 100000", "memory.oom.group": 1,
            "memory.swap.max": 0, "oomScoreAdj": 1000})
        )
    );
    assert!(b.get("cpu.shares").is_none() && b.get("memory.limit_in_bytes").is_none());
    // The kubelet's singleProcessOOMKill default on v2: every container is an OOM group;
    // set to true, no container is.
    assert_eq!(b["containers"]["container1"]["memory.oom.group"], 1);
    assert!(b.get("memory.oom.group").is_none());
    let mut single = seed_node(2);
    single["singleProcessOOMKill"] = json!(true);
    let (code, out, err) = plan(&json!({"node": single, "pods": seed_pods()}));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out["pods"]["default/pod-burstable-1"]["containers"]["container1"]
            .get("memory.oom.group")
            .is_none()
    );
}

/// The seed's node on v2 with `MemoryQoS` and LimitedSwap: the kubelet's `memory.min` on
/// kubepods (Guaranteed + Burstable requests), the burstable tier and each pod, its
/// `memory.high` on the one container whose request is below its limit, and swap for that
/// container alone (the other Burstable container's request equals its limit).
#[test]
fn seed_004_node_with_memory_qos_and_limited_swap() {
    let mut node = seed_node(2);
    node["featureGates"] = json!({"MemoryQoS": true});
    node["memorySwap"] = json!({"swapBehavior": "LimitedSwap"});
    node["swapCapacity"] = json!("1Gi");
    let (code, out, err) = plan(&json!({"node": node, "pods": seed_pods()}));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out["kubepods"]["memory.min"], 3 * GI);
    assert_eq!(out["burstable"]["memory.min"], 2 * GI);
    assert_eq!(out["besteffort"]["memory.min"], Value::Null);
    let g = &out["pods"]["default/pod-guaranteed-1"];
    assert_eq!(g["memory.min"], GI);
    assert_eq!(g["containers"]["container3"]["memory.min"], GI);
    assert_eq!(g["containers"]["container3"]["memory.high"], Value::Null);
    assert_eq!(g["containers"]["container3"]["memory.swap.max"], 0);
    let b = &out["pods"]["default/pod-burstable-1"];
    assert_eq!(b["memory.min"], 2 * GI);
    assert_eq!(b["memory.high"], Value::Null);
    let c1 = &b["containers"]["container1"];
    assert_eq!(c1["memory.high"], Value::Null);
    assert_eq!(c1["memory.swap.max"], 0);
    let c2 = &b["containers"]["container2"];
    assert_eq!(c2["memory.min"], GI);
    // 1Gi + 0.9 × 1Gi = 2040109465.6, floored and rounded down to a 4 KiB page.
    assert_eq!(c2["memory.high"], 2_040_107_008_i64);
    // 1Gi of the 8Gi machine: an eighth of the 1Gi of swap.
    assert_eq!(c2["memory.swap.max"], GI / 8);
    let e = &out["pods"]["default/pod-besteffort-1"]["containers"]["container4"];
    assert_eq!(e["memory.min"], Value::Null);
    assert_eq!(e["memory.swap.max"], 0);
    // A bad factor is a one-line input error naming the field.
    let mut bad = seed_node(2);
    bad["memoryThrottlingFactor"] = json!(2);
    let (code, _, err) = plan(&json!({"node": bad, "pods": seed_pods()}));
    assert_eq!(code, Some(2));
    assert!(
        err.starts_with("error: node.memoryThrottlingFactor: ")
            && err.trim_end().lines().count() == 1,
        "{err}"
    );
}

#[test]
fn sidecars_overhead_custom_period_and_node_critical_pods() {
    let mut sidecar_pod = pod(
        "mesh",
        "app",
        "dddd-4",
        Some(0),
        None,
        vec![container("app", res("500m", "256Mi"), res("1", "512Mi"))],
        "Burstable",
    );
    let mut side = container("proxy", res("100m", "64Mi"), res("200m", "128Mi"));
    side["restartPolicy"] = json!("Always");
    sidecar_pod["spec"]["initContainers"] =
        json!([side, container("migrate", res("1", "1Gi"), res("1", "1Gi"))]);
    sidecar_pod["spec"]["overhead"] = json!({"cpu": "50m", "memory": "32Mi"});
    let node_critical = pod(
        "kube-system",
        "kube-proxy-abc",
        "eeee-5",
        Some(2000001000),
        Some("system-node-critical"),
        vec![container("kube-proxy", json!({"cpu": "100m"}), json!({}))],
        "Burstable",
    );
    let input = json!({
        "node": {"cgroupVersion": 1, "allocatable": {"cpu": "3500m", "memory": "7Gi"},
                 "cpuCFSQuotaPeriod": "50ms", "memoryCapacity": "8Gi"},
        "pods": [sidecar_pod, node_critical]
    });
    let (code, out, err) = plan(&input);
    assert_eq!(code, Some(0), "{err}");
    // Requests: running app+proxy = 600m; migrate runs with proxy: 1100m → 1100m + 50m overhead.
    // Burstable tier: 1150m + 100m (kube-proxy) = 1250m → 1280 shares. No qosReserved: no limit.
    assert_eq!(out["burstable"], json!({"cpu.shares": 1280}));
    assert_eq!(out["kubepods"]["cpu.shares"], 3584);
    let p = &out["pods"]["mesh/app"];
    assert_eq!(p["cpu.shares"], 1177);
    // Limits: app+proxy 1200m, migrate+proxy 1200m → 1200m + 50m; over a 50ms period.
    assert_eq!(p["cpu.cfs_quota_us"], 62500);
    assert_eq!(p["cpu.cfs_period_us"], 50000);
    // Memory: app+proxy 640Mi vs migrate+proxy 1152Mi → 1152Mi + 32Mi.
    assert_eq!(p["memory.limit_in_bytes"], 1184 * (1 << 20));
    // Init containers, sidecars included, are not listed.
    assert_eq!(p["containers"].as_object().unwrap().len(), 1);
    assert_eq!(p["containers"]["app"]["cpu.cfs_quota_us"], 50000);
    assert_eq!(p["containers"]["app"]["oomScoreAdj"], 969);
    let k = &out["pods"]["kube-system/kube-proxy-abc"];
    assert_eq!(k["qos"], "Burstable");
    assert_eq!(k["containers"]["kube-proxy"]["oomScoreAdj"], -997);
    assert!(k.get("cpu.cfs_quota_us").is_none());
}

#[test]
fn malformed_input_exits_2_with_one_line_naming_the_field() {
    let mut bad = seed_pods();
    bad[1]["spec"]["containers"][1]["resources"]["limits"]["cpu"] = json!("2 cores");
    for (input, field) in [
        (
            json!({"node": seed_node(1), "pods": bad}),
            "pods[1].spec.containers[1].resources.limits.cpu",
        ),
        (
            json!({"node": {"cgroupVersion": 3}, "pods": []}),
            "node.cgroupVersion",
        ),
        (
            json!({"node": {"qosReserved": {"memory": "101%"}}, "pods": []}),
            "node.qosReserved.memory",
        ),
        (
            json!({"node": {"cpuCFSQuotaPeriod": "fast"}, "pods": []}),
            "node.cpuCFSQuotaPeriod",
        ),
        (json!({"pods": []}), "node"),
    ] {
        let (code, _, err) = plan(&input);
        assert_eq!(code, Some(2), "{input}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(err.contains(field), "{field}: {err}");
    }
}
