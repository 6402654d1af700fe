//! The files in `examples/` are the README tour's: its node config checks, and on a real
//! agent (root, cgroup v1 memory hierarchy) its Guaranteed sleeper is admitted as Guaranteed
//! and its BestEffort hog is evicted before the kernel's OOM killer, as the tour says. Where
//! the machine grants no CAP_SYS_RESOURCE (the development ones), the sleeper's start is
//! refused, as `node_pods.rs` checks too: the kubelet's -997 `oom_score_adj` needs it.

use std::path::{Path, PathBuf};
use std::process::Command;

use reactor_tests::agent::TestAgent;
use reactor_tests::{is_root, reactor_bin, require};
use serde_json::Value;

/// Whether this process may set a negative `oom_score_adj` (CAP_SYS_RESOURCE, bit 24 of
/// `CapEff`); the development machines grant root without it.
fn has_cap_sys_resource() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name)
}

#[test]
fn the_tour_s_config_checks() {
    let out = Command::new(reactor_bin())
        .args(["config", "check"])
        .arg(example("reactor.yaml"))
        .output()
        .expect("reactor config check");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).ends_with(": ok\n"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_tour_s_pods_run_and_the_hog_is_evicted_before_the_oom_killer() {
    if !require(is_root(), "root, to create cgroups and run pods")
        || !require(
            Path::new("/sys/fs/cgroup/memory/memory.oom_control").exists(),
            "cgroup v1 memory hierarchy under /sys/fs/cgroup",
        )
    {
        return;
    }
    // The tour's node (examples/reactor.yaml) with the test's own paths and cgroup root.
    let agent = TestAgent::start(
        "examples",
        "node: {memoryCapacity: 1Gi}\n\
         evictionHard: {memory.available: 256Mi}\n\
         sense: {ebpf: true, psi: false, memcgThreshold: true}\n",
    );
    let apply = |file: &str| {
        let out = agent.cli(&[
            "pod",
            "apply",
            "--json",
            "-f",
            example(file).to_str().expect("utf-8 path"),
        ]);
        assert!(
            out.status.success(),
            "apply {file}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).expect("apply JSON")
    };
    let sleeper = apply("sleeper.yaml");
    assert_eq!(sleeper["qos"], "Guaranteed", "{sleeper}");
    let hog = apply("hog.yaml");
    assert_eq!(hog["qos"], "BestEffort", "{hog}");
    agent.wait("the hog to be evicted", || {
        agent
            .pod("default/hog")
            .is_some_and(|p| p["phase"] == "Failed")
    });
    let hog = agent.pod("default/hog").expect("the hog");
    assert_eq!(hog["reason"], "Evicted", "{hog}");
    let sleeper = agent.pod("default/sleeper").unwrap_or(Value::Null);
    if has_cap_sys_resource() {
        assert_eq!(
            sleeper["phase"],
            "Running",
            "the Guaranteed sleeper is untouched: {sleeper}\n{}",
            agent.log()
        );
    } else {
        // The -997 oom_score_adj the kubelet gives a Guaranteed container needs
        // CAP_SYS_RESOURCE; without it the process runtime refuses the start and says why.
        assert_eq!(
            sleeper["containers"][0]["reason"], "StartError",
            "{sleeper}"
        );
        assert!(
            agent.log().contains("needs CAP_SYS_RESOURCE"),
            "{}",
            agent.log()
        );
    }
    let oom = agent.read("memory", "kubepods", "memory.oom_control");
    assert!(oom.lines().any(|l| l == "oom_kill 0"), "{oom}");
}
