//! KEP-5394's PSI node conditions through `reactor run` on the host's cgroup v1: with the
//! gate on, `reactor status` lists the four after the eviction conditions and shows the
//! figures read (the system's from `/proc/pressure`; kubepods' are not read on v1, which has
//! no per-cgroup PSI), and `/metrics` carries each condition; with the gate off (the
//! default) none of it appears. The stall that turns one True is the v2 guest's check
//! (`tests/src/v2/psi_conditions.rs`).
use std::path::Path;

use reactor_tests::agent::TestAgent;
use reactor_tests::exposition::sample;
use reactor_tests::{is_root, reactor_bin, require};
use serde_json::Value;

const PSI: [&str; 4] = [
    "SystemMemoryContentionPressure",
    "SystemDiskContentionPressure",
    "KubepodsMemoryContentionPressure",
    "KubepodsDiskContentionPressure",
];

fn ready() -> bool {
    require(is_root(), "root, to create cgroups")
        && require(
            Path::new("/sys/fs/cgroup/memory/memory.oom_control").exists(),
            "cgroup v1 memory hierarchy under /sys/fs/cgroup",
        )
        && require(
            Path::new("/proc/pressure/memory").exists(),
            "PSI (/proc/pressure/memory)",
        )
        && require(
            reactor_bin().exists(),
            "the reactor binary (cargo build --workspace --bins)",
        )
}

fn status(agent: &TestAgent) -> Value {
    let out = agent.cli(&["status", "--json"]);
    assert!(
        out.status.success(),
        "status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status JSON")
}

fn types(status: &Value) -> Vec<String> {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["type"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn the_gate_lists_the_psi_conditions_and_their_figures_on_v1() {
    if !ready() {
        return;
    }
    // Thresholds at 100 % (every task stalled for the whole minute): the conditions are
    // listed and False on a host that is working, whatever else runs on it.
    let agent = TestAgent::start(
        "agent-psi-v1",
        "node: {memoryCapacity: 512Mi}\nhousekeepingInterval: 1s\n\
         featureGates: {PSINodeCondition: true}\n\
         systemMemoryContentionThreshold: 100\nsystemDiskContentionThreshold: 100\n\
         kubepodsMemoryContentionThreshold: 100\nkubepodsDiskContentionThreshold: 100\n",
    );
    let mut s = status(&agent);
    agent.wait("the first pass's conditions", || {
        s = status(&agent);
        !types(&s).is_empty()
    });
    let mut want = vec!["MemoryPressure", "DiskPressure", "PIDPressure"];
    want.extend(PSI);
    assert_eq!(types(&s), want, "{s}");
    for c in s["conditions"].as_array().unwrap() {
        assert_eq!(c["status"], "False", "{s}");
    }
    let psi = s["psi"].as_array().expect("psi figures");
    let by = |source: &str| {
        psi.iter()
            .find(|p| p["source"] == source)
            .unwrap_or_else(|| panic!("no {source} in {s}"))
            .clone()
    };
    // The system's figures are the kernel's, read; kubepods' cannot be on v1.
    let kernel = std::fs::read_to_string("/proc/pressure/memory").unwrap();
    let memory = by("system.memory");
    assert!(
        memory["full"]["avg60"].as_f64().is_some(),
        "system.memory not read: {memory} (kernel: {kernel})"
    );
    assert_eq!(memory["threshold"], 100.0);
    assert!(by("system.io")["full"].is_object(), "{s}");
    assert!(by("kubepods.memory")["full"].is_null(), "{s}");
    assert!(by("kubepods.io")["full"].is_null(), "{s}");
    let text = agent.scrape();
    for c in PSI {
        assert_eq!(
            sample(
                &text,
                &format!(r#"reactor_node_condition{{condition="{c}"}}"#)
            ),
            Some(0.0),
            "{c}: {text}"
        );
    }
    // The plain status shows a line per figure.
    let out = agent.cli(&["status"]);
    let plain = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "{}",
        plain
            .lines()
            .filter(|l| l.starts_with("psi ") || l.contains("Contention"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        plain.contains("psi system.memory (SystemMemoryContentionPressure): full avg10 ")
            && plain.contains("psi kubepods.io (KubepodsDiskContentionPressure): not read"),
        "{plain}"
    );
}

#[test]
fn without_the_gate_no_psi_condition_appears() {
    if !ready() {
        return;
    }
    let agent = TestAgent::start(
        "agent-psi-off",
        "node: {memoryCapacity: 512Mi}\nhousekeepingInterval: 1s\n",
    );
    let mut s = status(&agent);
    agent.wait("the first pass's conditions", || {
        s = status(&agent);
        !types(&s).is_empty()
    });
    assert_eq!(types(&s), ["MemoryPressure", "DiskPressure", "PIDPressure"]);
    assert_eq!(s["psi"], Value::Array(Vec::new()), "{s}");
    let text = agent.scrape();
    assert!(!text.contains("ContentionPressure"), "{text}");
}
