//! `reactor plan preempt`: the binary decides critical-pod preemption for realistic pods as
//! the kubelet's admission handler would, and refuses malformed input with exit 2.

mod kubectl;

use std::io::Write;
use std::process::{Command, Stdio};

use kubectl::{container, pod};
use reactor_tests::reactor_bin;
use serde_json::{json, Value};

fn plan(input: &Value) -> (Option<i32>, Value, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("in.json");
    std::fs::write(
        &file,
        serde_json::to_vec_pretty(input).expect("serialize input"),
    )
    .expect("write input");
    let out = Command::new(reactor_bin())
        .args([
            "plan",
            "preempt",
            "--input",
            file.to_str().expect("utf-8 path"),
        ])
        .output()
        .expect("run reactor");
    let stdout: Value = if out.status.success() {
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

/// A node with a mix of tiers: two best-effort, two burstable, two guaranteed, one
/// system-cluster-critical and one static pod.
fn running() -> Vec<Value> {
    vec![
        pod(
            "web",
            "cache-be",
            "u1",
            Some(0),
            None,
            vec![container("c", json!({}), json!({}))],
            "BestEffort",
        ),
        pod(
            "web",
            "batch-be",
            "u2",
            Some(0),
            None,
            vec![container("c", json!({}), json!({}))],
            "BestEffort",
        ),
        pod(
            "web",
            "api-1",
            "u3",
            Some(1000),
            Some("high"),
            vec![container(
                "c",
                res("500m", "512Mi"),
                json!({"memory": "1Gi"}),
            )],
            "Burstable",
        ),
        pod(
            "web",
            "api-2",
            "u4",
            Some(1000),
            Some("high"),
            vec![container("c", res("250m", "1Gi"), json!({}))],
            "Burstable",
        ),
        pod(
            "db",
            "pg-0",
            "u5",
            Some(0),
            None,
            vec![container("c", res("2", "4Gi"), res("2", "4Gi"))],
            "Guaranteed",
        ),
        pod(
            "db",
            "redis-0",
            "u6",
            Some(0),
            None,
            vec![container("c", res("1", "2Gi"), res("1", "2Gi"))],
            "Guaranteed",
        ),
        pod(
            "kube-system",
            "coredns-1",
            "u7",
            Some(2000000000),
            Some("system-cluster-critical"),
            vec![container(
                "c",
                res("100m", "70Mi"),
                json!({"memory": "170Mi"}),
            )],
            "Burstable",
        ),
    ]
}

fn critical_admit() -> Value {
    let mut p = pod(
        "kube-system",
        "kube-proxy-x",
        "u9",
        Some(2000001000),
        Some("system-node-critical"),
        vec![container("c", res("100m", "64Mi"), json!({}))],
        "Burstable",
    );
    p["status"] = json!({"phase": "Pending"});
    p
}

#[test]
fn burstable_pods_go_before_guaranteed_ones() {
    let input = json!({
        "pods": running(),
        "admit": critical_admit(),
        "failures": [{"type": "InsufficientResource", "resource": "memory",
                      "requested": "1Gi", "used": "7680Mi", "capacity": "8Gi"}]
    });
    let (code, out, err) = plan(&input);
    assert_eq!(code, Some(0), "{err}");
    // 512Mi short: api-1 (512Mi) covers it exactly; coredns (critical, lower priority than the
    // node-critical pod) is a candidate too but farther away.
    assert_eq!(
        out,
        json!({"admit": true, "preempt": ["web/api-1"], "reasons": [], "error": null})
    );
}

#[test]
fn large_shortage_reaches_into_guaranteed_pods() {
    let input = json!({
        "pods": running(),
        "admit": critical_admit(),
        "failures": [
            {"type": "InsufficientResource", "resource": "memory", "requested": "4Gi", "used": "8Gi", "capacity": "8Gi"},
            {"type": "InsufficientResource", "resource": "cpu", "requested": "1", "used": "4", "capacity": "4"}]
    });
    let (code, out, err) = plan(&input);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out["admit"], true);
    let victims: Vec<&str> = out["preempt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    // Burstable (incl. coredns) free 1.5Gi+70Mi and 850m; 2.5Gi-70Mi and 150m must come from
    // guaranteed pods: pg-0 alone covers both. Then with pg-0 gone, nothing more is needed.
    assert_eq!(victims, vec!["db/pg-0"]);
}

#[test]
fn non_critical_pod_keeps_its_reasons() {
    let mut admit = pod(
        "web",
        "new",
        "u10",
        Some(1000),
        Some("high"),
        vec![container("c", res("1", "1Gi"), json!({}))],
        "Burstable",
    );
    admit["status"] = json!({});
    let input = json!({
        "pods": running(),
        "admit": admit,
        "failures": [
            {"type": "InsufficientResource", "resource": "cpu", "requested": "1", "used": "4", "capacity": "4"},
            {"type": "Other", "reason": "node(s) had untolerated taint {dedicated: gpu}"}]
    });
    let (code, out, _) = plan(&input);
    assert_eq!(code, Some(0));
    assert_eq!(
        out,
        json!({"admit": false, "preempt": [],
        "reasons": ["Insufficient cpu", "node(s) had untolerated taint {dedicated: gpu}"], "error": null})
    );
}

#[test]
fn critical_pod_with_a_non_resource_failure_is_refused() {
    let input = json!({
        "pods": running(),
        "admit": critical_admit(),
        "failures": [
            {"type": "InsufficientResource", "resource": "cpu", "requested": "1", "used": "4", "capacity": "4"},
            {"type": "Other", "reason": "NodeAffinity"}]
    });
    let (code, out, _) = plan(&input);
    assert_eq!(code, Some(0));
    assert_eq!(
        out,
        json!({"admit": false, "preempt": [], "reasons": ["NodeAffinity"], "error": null})
    );
}

#[test]
fn impossible_shortage_is_an_error_in_the_answer() {
    let input = json!({
        "pods": running(),
        "admit": critical_admit(),
        "failures": [{"type": "InsufficientResource", "resource": "nvidia.com/gpu",
                      "requested": 1, "used": 4, "capacity": 4}]
    });
    let (code, out, _) = plan(&input);
    assert_eq!(code, Some(0));
    assert_eq!(out["admit"], false);
    assert_eq!(out["preempt"], json!([]));
    let e = out["error"].as_str().unwrap();
    assert!(
        e.contains("no set of running pods found to reclaim resources")
            && e.contains("nvidia.com/gpu"),
        "{e}"
    );
}

#[test]
fn static_admit_preempts_and_reads_stdin() {
    let mut admit = critical_admit();
    admit["metadata"]["annotations"] = json!({"kubernetes.io/config.source": "file"});
    admit["spec"].as_object_mut().unwrap().remove("priority");
    admit["spec"]
        .as_object_mut()
        .unwrap()
        .remove("priorityClassName");
    let input = json!({
        "pods": running(),
        "admit": admit,
        "failures": [{"type": "InsufficientResource", "resource": "pods", "requested": 1, "used": 110, "capacity": 110}]
    });
    let mut child = Command::new(reactor_bin())
        .args(["plan", "preempt", "--input", "-", "--compact"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.trim_end().lines().count(), 1, "compact: {text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    // One pod is enough and best-effort pods come first; coredns (critical) is no candidate
    // for a static pod without a priority.
    let victims = v["preempt"].as_array().unwrap();
    assert_eq!(victims.len(), 1);
    assert!(victims[0].as_str().unwrap().ends_with("-be"), "{v}");
}

#[test]
fn malformed_input_exits_2_with_one_line_naming_the_field() {
    let mut bad_pods = running();
    bad_pods[2]["spec"]["containers"][0]["resources"]["requests"]["memory"] = json!("12Qi");
    for (input, field) in [
        (
            json!({"pods": bad_pods, "admit": critical_admit(), "failures": []}),
            "pods[2].spec.containers[0].resources.requests.memory",
        ),
        (
            json!({"pods": [], "admit": critical_admit(), "failures": [{"type": "Nope"}]}),
            "failures[0]",
        ),
        (json!({"pods": [], "failures": []}), "admit"),
        (
            json!({"pods": [{"metadata": {"name": "x"}, "spec": {"priority": "high"}}], "admit": critical_admit()}),
            "pods[0].spec.priority",
        ),
    ] {
        let (code, _, err) = plan(&input);
        assert_eq!(code, Some(2), "{input}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(err.contains(field), "{field}: {err}");
    }
    let out = Command::new(reactor_bin())
        .args(["plan", "preempt", "--input", "/nonexistent/x.json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
