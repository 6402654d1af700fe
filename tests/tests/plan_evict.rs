//! `reactor plan evict`: the binary ranks kubectl-shaped pods against a Summary API document
//! the way the kubelet's eviction manager does, and refuses malformed input with exit 2.

mod plan_cli;

use plan_cli::{plan_ok, plan_refused, plan_stdin};
use serde_json::{json, Value};

const MI: u64 = 1 << 20;

#[allow(clippy::too_many_arguments)]
fn pod(
    ns: &str,
    name: &str,
    uid: &str,
    priority: Option<i64>,
    annotations: Value,
    containers: Value,
    volumes: Value,
) -> Value {
    let mut spec = json!({"containers": containers, "volumes": volumes, "restartPolicy": "Always"});
    if let Some(p) = priority {
        spec["priority"] = json!(p);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": uid, "annotations": annotations,
                     "labels": {"app": name}},
        "spec": spec,
        "status": {"phase": "Running"}
    })
}

fn container(name: &str, requests: Value, limits: Value) -> Value {
    json!({"name": name, "image": "registry.k8s.io/pause:3.10",
           "resources": {"requests": requests, "limits": limits}})
}

fn node_pods() -> Vec<Value> {
    vec![
        pod(
            "kube-system",
            "kube-proxy-x7k2p",
            "uid-proxy",
            Some(2_000_001_000),
            json!({}),
            json!([container(
                "kube-proxy",
                json!({"cpu": "100m", "memory": "50Mi"}),
                json!({})
            )]),
            json!([]),
        ),
        pod(
            "kube-system",
            "etcd-node1",
            "uid-etcd",
            Some(2_000_001_000),
            json!({"kubernetes.io/config.source": "file", "kubernetes.io/config.hash": "abc"}),
            json!([container(
                "etcd",
                json!({"cpu": "100m", "memory": "100Mi"}),
                json!({})
            )]),
            json!([]),
        ),
        pod(
            "default",
            "web-1",
            "uid-web-1",
            Some(0),
            json!({}),
            json!([container(
                "nginx",
                json!({"memory": "256Mi"}),
                json!({"memory": "1Gi"})
            )]),
            json!([{"name": "cache", "emptyDir": {}}]),
        ),
        pod(
            "default",
            "web-2",
            "uid-web-2",
            Some(0),
            json!({}),
            json!([container(
                "nginx",
                json!({"memory": "256Mi"}),
                json!({"memory": "1Gi"})
            )]),
            json!([{"name": "cache", "emptyDir": {}}]),
        ),
        pod(
            "batch",
            "job-x",
            "uid-job",
            Some(-10),
            json!({}),
            json!([container("work", json!({}), json!({}))]),
            json!([{"name": "scratch", "emptyDir": {}}, {"name": "tmpfs", "emptyDir": {"medium": "Memory"}}]),
        ),
        pod(
            "default",
            "db",
            "uid-db",
            Some(1000),
            json!({}),
            json!([container(
                "postgres",
                json!({"cpu": "1", "memory": "1Gi"}),
                json!({"cpu": "1", "memory": "1Gi"})
            )]),
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": "db"}}]),
        ),
        pod(
            "monitoring",
            "agent",
            "uid-agent",
            None,
            json!({}),
            json!([container("agent", json!({"memory": "10Mi"}), json!({}))]),
            json!([]),
        ),
    ]
}

fn fs(used: u64, inodes: u64) -> Value {
    json!({"time": "2026-11-22T10:00:00Z", "availableBytes": 1u64 << 34, "capacityBytes": 1u64 << 35,
           "usedBytes": used, "inodesFree": 100000, "inodes": 200000, "inodesUsed": inodes})
}

fn stats(
    ns: &str,
    name: &str,
    uid: &str,
    ws: u64,
    containers: Value,
    volumes: Value,
    procs: u64,
) -> Value {
    json!({
        "podRef": {"name": name, "namespace": ns, "uid": uid},
        "startTime": "2026-11-22T09:00:00Z",
        "cpu": {"time": "2026-11-22T10:00:00Z", "usageNanoCores": 1000000},
        "memory": {"time": "2026-11-22T10:00:00Z", "workingSetBytes": ws, "usageBytes": ws + 4096, "rssBytes": ws / 2},
        "containers": containers,
        "volume": volumes,
        "ephemeral-storage": fs(0, 0),
        "process_stats": {"process_count": procs}
    })
}

fn cstats(name: &str, rootfs: u64, logs: u64) -> Value {
    json!({"name": name, "startTime": "2026-11-22T09:00:00Z",
           "rootfs": fs(rootfs, rootfs / 4096), "logs": fs(logs, logs / 4096)})
}

fn summary() -> Value {
    json!({
        "node": {"nodeName": "node1", "memory": {"availableBytes": 50 * MI, "workingSetBytes": 3900 * MI},
                 "fs": fs(0, 0), "runtime": {"imageFs": fs(0, 0)},
                 "rlimit": {"maxpid": 32768, "curproc": 400}},
        "pods": [
            stats("kube-system", "kube-proxy-x7k2p", "uid-proxy", 80 * MI, json!([cstats("kube-proxy", 4096, 4096)]), json!([]), 12),
            stats("kube-system", "etcd-node1", "uid-etcd", 90 * MI, json!([cstats("etcd", 8192, 4096)]), json!([]), 30),
            stats("default", "web-1", "uid-web-1", 600 * MI,
                  json!([cstats("nginx", 20 * MI, 300 * MI)]),
                  json!([{"name": "cache", "usedBytes": 10 * MI, "inodesUsed": 10}]), 9),
            stats("default", "web-2", "uid-web-2", 300 * MI,
                  json!([cstats("nginx", 900 * MI, MI)]),
                  json!([{"name": "cache", "usedBytes": 10 * MI, "inodesUsed": 10}]), 9),
            stats("batch", "job-x", "uid-job", 100 * MI,
                  json!([cstats("work", 8 * MI, 8 * MI)]),
                  json!([{"name": "scratch", "usedBytes": 400 * MI, "inodesUsed": 90000},
                         {"name": "tmpfs", "usedBytes": 2000 * MI, "inodesUsed": 5}]), 150),
            stats("default", "db", "uid-db", 800 * MI,
                  json!([cstats("postgres", 100 * MI, 50 * MI)]),
                  json!([{"name": "data", "usedBytes": 50000 * MI, "inodesUsed": 500000}]), 40)
        ]
    })
}

fn order(signal: &str, filesystems: Option<&str>) -> Vec<String> {
    let mut input = json!({"signal": signal, "pods": node_pods(), "summary": summary()});
    if let Some(f) = filesystems {
        input["filesystems"] = json!(f);
    }
    let out = plan_ok("evict", &input);
    assert_eq!(out["signal"], json!(signal));
    out["order"]
        .as_array()
        .expect("order is a list")
        .iter()
        .map(|v| v.as_str().expect("names").to_string())
        .collect()
}

#[test]
fn memory_pressure_ranks_like_the_kubelet() {
    // No stats first; then over-request pods by priority, larger excess first; then the rest
    // by priority. Critical and static pods are listed where they rank.
    let expected = [
        "monitoring/agent",
        "batch/job-x",
        "default/web-1",
        "default/web-2",
        "kube-system/kube-proxy-x7k2p",
        "default/db",
        "kube-system/etcd-node1",
    ];
    assert_eq!(order("memory.available", None), expected);
    assert_eq!(order("allocatableMemory.available", None), expected);
}

#[test]
fn nodefs_on_one_filesystem_charges_rootfs_logs_and_local_volumes() {
    // web-2: 900+1+10 Mi; web-1: 20+300+10; job-x: 8+8+400 (the memory emptyDir and the PVC
    // are not local ephemeral storage); db: 150 (its PVC is not charged).
    let got = order("nodefs.available", Some("shared"));
    assert_eq!(
        got,
        [
            "monitoring/agent",
            "batch/job-x",
            "default/web-2",
            "default/web-1",
            "default/db",
            "kube-system/etcd-node1",
            "kube-system/kube-proxy-x7k2p",
        ]
    );
    assert_eq!(order("nodefs.available", None), got);
}

#[test]
fn separate_imagefs_splits_what_each_signal_charges() {
    // nodefs: logs + volumes; web-1 (310Mi) now beats web-2 (11Mi).
    let nodefs = order("nodefs.available", Some("imagefs"));
    let pos = |v: &[String], n: &str| v.iter().position(|x| x == n).expect(n);
    assert!(pos(&nodefs, "default/web-1") < pos(&nodefs, "default/web-2"));
    // imagefs and containerfs: writable layers only; web-2 (900Mi) first among priority 0.
    for signal in ["imagefs.available", "containerfs.available"] {
        let got = order(signal, Some("imagefs"));
        assert!(
            pos(&got, "default/web-2") < pos(&got, "default/web-1"),
            "{signal}: {got:?}"
        );
        assert_eq!(got[0], "monitoring/agent");
    }
}

#[test]
fn split_image_filesystem_charges_nothing_to_imagefs() {
    // containerfs/nodefs charge everything but images, like one shared filesystem.
    assert_eq!(
        order("containerfs.available", Some("imagefs+containerfs")),
        order("nodefs.available", Some("shared"))
    );
    // imagefs: no pod usage is charged; the pod without stats still goes first, then nobody
    // exceeds and priority decides (the two critical pods tie: either order).
    let got = order("imagefs.available", Some("imagefs+containerfs"));
    let tied = |range: std::ops::Range<usize>| {
        let mut names: Vec<&str> = got[range].iter().map(String::as_str).collect();
        names.sort_unstable();
        names
    };
    assert_eq!(&got[..2], ["monitoring/agent", "batch/job-x"]);
    assert_eq!(tied(2..4), ["default/web-1", "default/web-2"]);
    assert_eq!(got[4], "default/db");
    assert_eq!(
        tied(5..7),
        ["kube-system/etcd-node1", "kube-system/kube-proxy-x7k2p"]
    );
}

#[test]
fn inodes_rank_by_inode_usage() {
    let got = order("nodefs.inodesFree", None);
    assert_eq!(&got[..2], ["monitoring/agent", "batch/job-x"]);
}

#[test]
fn pid_pressure_ranks_by_priority_then_process_count() {
    // Priority first (no "exceeds" step: nobody requests pids), then pods without stats,
    // then more processes first.
    assert_eq!(
        order("pid.available", None),
        [
            "batch/job-x",
            "monitoring/agent",
            "default/web-1",
            "default/web-2",
            "default/db",
            "kube-system/etcd-node1",
            "kube-system/kube-proxy-x7k2p",
        ]
    );
}

#[test]
fn kubelet_ties_may_come_in_any_order_but_all_pods_are_listed() {
    let pods: Vec<Value> = (0..4)
        .map(|i| {
            pod(
                "t",
                &format!("p{i}"),
                &format!("u{i}"),
                Some(0),
                json!({}),
                json!([]),
                json!([]),
            )
        })
        .collect();
    let out = plan_ok(
        "evict",
        &json!({"signal": "memory.available", "pods": pods}),
    );
    let mut got: Vec<&str> = out["order"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    got.sort_unstable();
    assert_eq!(got, ["t/p0", "t/p1", "t/p2", "t/p3"]);
}

#[test]
fn reads_stdin() {
    let input = json!({"signal": "memory.available", "pods": node_pods(), "summary": summary()});
    let out = plan_stdin("evict", input.to_string().as_bytes());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.json["order"][0], json!("monitoring/agent"));
}

#[test]
fn malformed_input_exits_2_naming_the_field() {
    let good = json!({"signal": "memory.available", "pods": node_pods(), "summary": summary()});
    let mut cases: Vec<(Vec<u8>, &str)> = Vec::new();
    let mut bad_signal = good.clone();
    bad_signal["signal"] = json!("memory.free");
    cases.push((bad_signal.to_string().into_bytes(), "signal"));
    let mut bad_fs = good.clone();
    bad_fs["filesystems"] = json!("btrfs");
    cases.push((bad_fs.to_string().into_bytes(), "filesystems"));
    let mut bad_quantity = good.clone();
    bad_quantity["pods"][2]["spec"]["containers"][0]["resources"]["requests"]["memory"] =
        json!("12Qi");
    cases.push((
        bad_quantity.to_string().into_bytes(),
        "pods[2].spec.containers[0].resources.requests.memory",
    ));
    let mut negative = good.clone();
    negative["summary"]["pods"][1]["memory"]["workingSetBytes"] = json!(-5);
    cases.push((
        negative.to_string().into_bytes(),
        "summary.pods[1].memory.workingSetBytes",
    ));
    let mut no_pods = good.clone();
    no_pods.as_object_mut().expect("object").remove("pods");
    cases.push((no_pods.to_string().into_bytes(), "pods"));
    let text = good.to_string();
    cases.push((text.as_bytes()[..text.len() / 2].to_vec(), "EOF"));
    cases.push((b"not json".to_vec(), "expected"));
    for (input, needle) in cases {
        let err = plan_refused("evict", &input);
        assert!(err.contains(needle), "{needle}: {err}");
    }
}
