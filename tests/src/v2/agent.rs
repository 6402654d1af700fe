//! `reactor run` on the v2 guest: a [`TestAgent`] rooted in the unified hierarchy, pod
//! documents, `reactor plan cgroups` on the same pods, and the agent's event stream.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;

use serde_json::{json, Value};

use super::MOUNT;
use crate::agent::TestAgent;
use crate::{reactor_bin, ChildGuard};

/// Starts the agent below its own cgroup root of the guest's v2 hierarchy.
pub fn start(name: &str, extra: &str) -> TestAgent {
    TestAgent::start_v2(Path::new(MOUNT), name, extra)
}

/// A pod document: one container per `(name, command, resources)`.
pub fn pod(name: &str, containers: &[(&str, Vec<String>, Value)]) -> Value {
    let containers: Vec<Value> = containers
        .iter()
        .map(|(c, command, resources)| {
            json!({"name": c, "command": command, "resources": resources})
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
                    "containers": containers}})
}

/// `sleep 3600` as a container command.
pub fn sleeper() -> Vec<String> {
    vec!["/bin/sleep".into(), "3600".into()]
}

/// Applies `doc` and returns it with the uid the agent gave the pod (what `plan cgroups`
/// needs to name the same cgroups).
pub fn apply(agent: &TestAgent, doc: &Value) -> Value {
    let answer = agent.apply_ok(doc);
    let uid = answer["uid"]
        .as_str()
        .unwrap_or_else(|| panic!("no uid in the apply answer: {answer}"));
    let mut doc = doc.clone();
    doc["metadata"]["uid"] = json!(uid);
    doc
}

/// `reactor plan cgroups` for a v2 node with these pods.
pub fn plan_cgroups(node: &Value, pods: &[Value]) -> Value {
    let input = json!({"node": node, "pods": pods});
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("plan.json");
    std::fs::write(&file, input.to_string()).expect("write plan input");
    let out = Command::new(reactor_bin())
        .args(["plan", "cgroups", "--input"])
        .arg(&file)
        .output()
        .expect("run reactor plan cgroups");
    assert!(
        out.status.success(),
        "plan cgroups: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("plan cgroups JSON")
}

/// The cgroup files of one plan entry (`cpu.weight`, `memory.max`, ...) that differ from
/// what the kernel shows in `dir`, one line each; empty when all match.
pub fn mismatches(settings: &Value, dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Some(map) = settings.as_object() else {
        return vec![format!("{}: plan entry is not an object", dir.display())];
    };
    for (file, want) in map.iter().filter(|(k, _)| k.contains('.')) {
        let want = match want {
            Value::String(s) => s.clone(),
            // Null: the kubelet leaves the file alone, so it holds the kernel's default.
            Value::Null => match kernel_default(file) {
                Some(d) => d.to_string(),
                None => {
                    out.push(format!(
                        "{}/{file}: plan null, no default known",
                        dir.display()
                    ));
                    continue;
                }
            },
            other => other.to_string(),
        };
        match std::fs::read_to_string(dir.join(file)) {
            Ok(got) if got.trim() == want => {}
            Ok(got) => out.push(format!(
                "{}/{file}: plan {want:?}, kernel {:?}",
                dir.display(),
                got.trim()
            )),
            Err(e) => out.push(format!("{}/{file}: plan {want:?}, {e}", dir.display())),
        }
    }
    out
}

/// What a v2 memory file holds when nothing wrote it (a new cgroup): `memory.min` and
/// `memory.low` protect nothing, `memory.high` and `memory.swap.max` do not limit.
pub fn kernel_default(file: &str) -> Option<&'static str> {
    match file {
        "memory.min" | "memory.low" => Some("0"),
        "memory.high" | "memory.swap.max" => Some("max"),
        _ => None,
    }
}

/// Every file of the plan (kubepods, the QoS tiers, each pod and container) against the
/// agent's cgroup tree.
pub fn tree_mismatches(agent: &TestAgent, plan: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for (entry, cgroup) in [
        ("kubepods", "kubepods"),
        ("burstable", "kubepods/burstable"),
        ("besteffort", "kubepods/besteffort"),
    ] {
        out.extend(mismatches(&plan[entry], &agent.v2_dir(cgroup)));
    }
    for (_, p) in plan["pods"].as_object().into_iter().flatten() {
        let cgroup = p["cgroup"].as_str().unwrap_or_default();
        out.extend(mismatches(p, &agent.v2_dir(cgroup)));
        for (c, settings) in p["containers"].as_object().into_iter().flatten() {
            out.extend(mismatches(
                settings,
                &agent.v2_dir(&format!("{cgroup}/{c}")),
            ));
        }
    }
    out
}

/// The pids in a v2 cgroup (not its descendants).
pub fn procs(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// `reactor events --json` beside the test, its lines on a channel.
pub fn follow_events(agent: &TestAgent) -> (ChildGuard, mpsc::Receiver<Value>) {
    let mut child = ChildGuard(
        Command::new(reactor_bin())
            .args(["events", "--json", "--socket"])
            .arg(&agent.socket)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start reactor events"),
    );
    let stdout = child.0.stdout.take().expect("events stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                break;
            };
            if tx.send(v).is_err() {
                break;
            }
        }
    });
    (child, rx)
}
