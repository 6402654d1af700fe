//! Issue 7 through the front door: the real sample device plugin next to a real `reactor run`
//! (process runtime, its own cgroup root, device-plugin and state directories in a temp dir).
//! The plugin registers on the agent's `kubelet.sock`; `reactor status` and `/metrics` show
//! its devices; pods applied with `reactor pod apply` get distinct devices and the plugin's
//! environment (each container writes its environment to a file this test reads); a pod
//! that does not fit is refused with the kubelet's reason; health flips, a killed plugin and
//! its grace period show in status and metrics; a restarted agent keeps every assignment.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns: a failed setup should panic with its backtrace"
)]

mod devices_common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use devices_common::{plugin_bin, Plugin, R};
use reactor_tests::agent::TestAgent;
use reactor_tests::{is_root, reactor_bin, require};
use serde_json::{json, Value};

const NODE: &str =
    "node: {memoryCapacity: 1Gi, cpuCapacity: '2'}\nevictionHard: {memory.available: 100Mi}\n";

fn ready() -> bool {
    require(is_root(), "root, to create cgroups and run pods")
        && require(
            Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists(),
            "cgroup v1 memory hierarchy",
        )
        && require(
            reactor_bin().exists() && plugin_bin().exists(),
            "the reactor and sample-device-plugin binaries (cargo build --workspace --bins)",
        )
}

fn plugin_dir(agent: &TestAgent) -> PathBuf {
    agent.dir.path().join("device-plugins")
}

fn start_plugin(agent: &TestAgent, count: u32, extra: &[&str]) -> Plugin {
    Plugin::start_in(&plugin_dir(agent), agent.dir.path(), R, count, extra)
}

/// `reactor status --json`.
fn status(agent: &TestAgent) -> Value {
    let out = agent.cli(&["status", "--json"]);
    assert!(
        out.status.success(),
        "status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `reactor status` (text).
fn status_text(agent: &TestAgent) -> String {
    let out = agent.cli(&["status"]);
    assert!(
        out.status.success(),
        "status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// [`R`]'s (capacity, allocatable) in `reactor status --json`, if it is reported.
fn counts(agent: &TestAgent) -> Option<(String, String)> {
    let s = status(agent);
    let cap = s["capacity"][R].as_str()?.to_string();
    let alloc = s["allocatable"][R].as_str()?.to_string();
    Some((cap, alloc))
}

fn wait_counts(agent: &TestAgent, capacity: u32, allocatable: u32) {
    let want = Some((capacity.to_string(), allocatable.to_string()));
    agent.wait(
        &format!("{R} capacity {capacity}, allocatable {allocatable} in reactor status"),
        || counts(agent) == want,
    );
}

/// The value of the sample line `series` (exact name and labels) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// [`R`]'s device gauges from `/metrics`: (healthy, unhealthy, allocated).
fn device_gauges(agent: &TestAgent) -> Option<(f64, f64, f64)> {
    let text = agent.scrape();
    Some((
        sample(
            &text,
            &format!(r#"reactor_devices{{resource="{R}",health="healthy"}}"#),
        )?,
        sample(
            &text,
            &format!(r#"reactor_devices{{resource="{R}",health="unhealthy"}}"#),
        )?,
        sample(
            &text,
            &format!(r#"reactor_devices_allocated{{resource="{R}"}}"#),
        )?,
    ))
}

fn wait_gauges(agent: &TestAgent, healthy: u32, unhealthy: u32, allocated: u32) {
    let want = Some((
        f64::from(healthy),
        f64::from(unhealthy),
        f64::from(allocated),
    ));
    agent.wait(
        &format!("/metrics: {R} healthy {healthy}, unhealthy {unhealthy}, allocated {allocated}"),
        || device_gauges(agent) == want,
    );
}

/// Where pod `name`'s container writes its environment.
fn env_file(agent: &TestAgent, name: &str) -> PathBuf {
    agent.dir.path().join(format!("env-{name}"))
}

/// A container asking for `devices` of [`R`] that writes its environment to
/// `env_file(agent, key)` (atomically, so a reader never sees half of it), then runs `then`.
fn env_container(agent: &TestAgent, name: &str, key: &str, devices: u32, then: &str) -> Value {
    let script = format!(
        "env > {o}.tmp && mv {o}.tmp {o} && {then}",
        o = env_file(agent, key).display()
    );
    json!({"name": name, "command": ["sh", "-c", script],
           "resources": {"limits": {R: devices.to_string()}}})
}

/// A pod whose container asks for `devices` of [`R`], writes its environment to
/// [`env_file`] and sleeps.
fn device_pod(agent: &TestAgent, name: &str, uid: &str, devices: u32) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "uid": uid},
           "spec": {"terminationGracePeriodSeconds": 1, "containers": [
               env_container(agent, "app", name, devices, "exec sleep 600")]}})
}

/// `reactor pod apply --json` on `doc`: (exit success, the JSON answer, stderr).
fn apply(agent: &TestAgent, doc: &Value) -> (bool, Value, String) {
    let name = doc["metadata"]["name"].as_str().unwrap();
    let out = agent.apply(&format!("{name}.json"), &doc.to_string());
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let answer = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.success(), answer, stderr)
}

fn apply_admitted(agent: &TestAgent, doc: &Value) {
    let (ok, answer, stderr) = apply(agent, doc);
    assert!(ok && answer["admitted"] == true, "{answer} {stderr}");
}

/// The environment pod `name`'s container saw, once it has written it.
fn container_env(agent: &TestAgent, name: &str) -> BTreeMap<String, String> {
    let file = env_file(agent, name);
    agent.wait(&format!("{name} to write its environment"), || {
        file.exists()
    });
    std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The devices the plugin gave pod `name`, from its container's `SAMPLE_DEVICES`; checks
/// `SAMPLE_RESOURCE` too.
fn container_devices(agent: &TestAgent, name: &str) -> BTreeSet<String> {
    let env = container_env(agent, name);
    assert_eq!(
        env.get("SAMPLE_RESOURCE").map(String::as_str),
        Some(R),
        "{name}: {env:?}"
    );
    let devices = env
        .get("SAMPLE_DEVICES")
        .unwrap_or_else(|| panic!("{name} has no SAMPLE_DEVICES: {env:?}"));
    devices.split(',').map(str::to_string).collect()
}

/// The device lists the plugin served calls for, from its journal: `what` is `allocate` or
/// `prestart`.
fn journal(plugin: &Plugin, what: &str) -> Vec<BTreeSet<String>> {
    plugin
        .journal()
        .lines()
        .filter_map(|l| l.strip_prefix(what)?.strip_prefix(' '))
        .map(|ids| ids.split(',').map(str::to_string).collect())
        .collect()
}

fn allocations(plugin: &Plugin) -> Vec<BTreeSet<String>> {
    journal(plugin, "allocate")
}

fn assert_refused_for_devices(agent: &TestAgent, doc: &Value, requested: u32, available: u32) {
    let (ok, answer, stderr) = apply(agent, doc);
    // The node said no: a runtime failure (exit 1) naming the reason, and the answer on stdout.
    assert!(!ok, "apply of a pod that does not fit succeeded: {answer}");
    assert!(
        stderr.contains("rejected: UnexpectedAdmissionError"),
        "apply: {stderr}"
    );
    assert_eq!(answer["admitted"], false, "{answer}");
    assert_eq!(answer["reason"], "UnexpectedAdmissionError", "{answer}");
    let message = format!(
        "Allocate failed due to requested number of devices unavailable for {R}. \
         Requested: {requested}, Available: {available}, which is unexpected"
    );
    assert_eq!(answer["message"], message.as_str(), "{answer}");
    let name = doc["metadata"]["name"].as_str().unwrap();
    let pod = agent.pod(&format!("default/{name}")).unwrap();
    assert_eq!(pod["phase"], "Failed", "{pod}");
    assert_eq!(pod["reason"], "UnexpectedAdmissionError", "{pod}");
}

#[test]
fn plugin_devices_reach_status_pods_metrics_and_go_away_with_the_plugin() {
    if !ready() {
        return;
    }
    let agent = TestAgent::start(
        "devagent-main",
        &format!("{NODE}devicePluginGracePeriod: 5s\n"),
    );
    // Before any plugin: no device resource, no device series.
    assert_eq!(counts(&agent), None);
    assert_eq!(device_gauges(&agent), None);

    // The plugin asks for PreStartContainer, which the agent calls before the containers start.
    let mut plugin = start_plugin(&agent, 4, &["--pre-start"]);
    wait_counts(&agent, 4, 4);
    let text = status_text(&agent);
    assert!(
        text.contains(&format!("resource {R}: allocatable 4, capacity 4")),
        "{text}"
    );
    wait_gauges(&agent, 4, 0, 0);

    // Two pods of two devices each: distinct devices, the plugin's envs in the containers.
    apply_admitted(&agent, &device_pod(&agent, "dev-a", "uid-dev-a", 2));
    apply_admitted(&agent, &device_pod(&agent, "dev-b", "uid-dev-b", 2));
    let a = container_devices(&agent, "dev-a");
    let b = container_devices(&agent, "dev-b");
    assert_eq!((a.len(), b.len()), (2, 2), "{a:?} {b:?}");
    assert!(a.is_disjoint(&b), "{a:?} vs {b:?}");
    let all: BTreeSet<String> = (0..4).map(|i| format!("dev-{i}")).collect();
    assert_eq!(a.union(&b).cloned().collect::<BTreeSet<_>>(), all);
    assert_eq!(allocations(&plugin), vec![a.clone(), b.clone()]);
    assert_eq!(journal(&plugin, "prestart"), vec![a.clone(), b.clone()]);
    // Allocated devices stay allocatable (they are healthy); the gauge counts them held.
    wait_counts(&agent, 4, 4);
    wait_gauges(&agent, 4, 0, 4);

    // No healthy device is free: a third pod is refused as the kubelet refuses it.
    assert_refused_for_devices(&agent, &device_pod(&agent, "dev-c", "uid-dev-c", 1), 1, 0);
    assert_eq!(
        allocations(&plugin).len(),
        2,
        "no Allocate for a refused pod"
    );

    // A device turned unhealthy shrinks allocatable, not capacity; healthy again restores it.
    plugin.set_health("dev-3", false);
    wait_counts(&agent, 4, 3);
    wait_gauges(&agent, 3, 1, 4);
    let text = status_text(&agent);
    assert!(
        text.contains(&format!("resource {R}: allocatable 3, capacity 4")),
        "{text}"
    );
    plugin.set_health("dev-3", true);
    wait_counts(&agent, 4, 4);
    wait_gauges(&agent, 4, 0, 4);

    // The plugin killed: every device unhealthy at once, then after the grace period the
    // resource is deleted from capacity, allocatable and the metrics.
    plugin.kill();
    wait_counts(&agent, 4, 0);
    agent.wait("the resource deleted after its grace period", || {
        let s = status(&agent);
        s["capacity"].get(R).is_none() && s["allocatable"].get(R).is_none()
    });
    agent.wait("the device series to leave /metrics", || {
        !agent.scrape().contains(R)
    });
    assert!(agent.log().contains("resource deleted"), "{}", agent.log());
    // The pods that held devices keep running.
    for name in ["dev-a", "dev-b"] {
        let pod = agent.pod(&format!("default/{name}")).unwrap();
        assert_eq!(pod["phase"], "Running", "{pod}");
    }
}

#[test]
fn a_restarted_agent_keeps_every_assignment_from_its_checkpoint() {
    if !ready() {
        return;
    }
    let mut agent = TestAgent::start("devagent-restart", NODE);
    let plugin = start_plugin(&agent, 4, &[]);
    wait_counts(&agent, 4, 4);
    apply_admitted(&agent, &device_pod(&agent, "keep-a", "uid-keep-a", 2));
    let a = container_devices(&agent, "keep-a");
    wait_gauges(&agent, 4, 0, 2);
    let checkpoint = agent
        .dir
        .path()
        .join("state/device-manager/kubelet_internal_checkpoint");
    let written = std::fs::read_to_string(&checkpoint).unwrap();
    assert!(written.contains("uid-keep-a"), "{written}");

    agent.kill(rustix::process::Signal::TERM);
    agent.restart();
    // The plugin sees kubelet.sock re-created and registers again by itself.
    wait_counts(&agent, 4, 4);
    // The assignment came back from the checkpoint: two devices held, before any new pod.
    wait_gauges(&agent, 4, 0, 2);
    assert_eq!(
        agent.pod("default/keep-a").unwrap()["phase"],
        "Running",
        "the pod outlives the agent"
    );

    // A new pod gets the other two devices, never one of keep-a's.
    apply_admitted(&agent, &device_pod(&agent, "keep-b", "uid-keep-b", 2));
    let b = container_devices(&agent, "keep-b");
    assert_eq!(b.len(), 2);
    assert!(a.is_disjoint(&b), "{a:?} vs {b:?}");
    assert_eq!(allocations(&plugin), vec![a.clone(), b]);
    wait_gauges(&agent, 4, 0, 4);
    // And nothing is left for a third.
    assert_refused_for_devices(&agent, &device_pod(&agent, "keep-c", "uid-keep-c", 1), 1, 0);

    // A removed pod's devices are free at once (the gauge drops) and go to the next pod.
    let out = agent.cli(&["pod", "rm", "default/keep-a", "--grace", "0"]);
    assert!(
        out.status.success(),
        "pod rm: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_gauges(&agent, 4, 0, 2);
    apply_admitted(&agent, &device_pod(&agent, "keep-d", "uid-keep-d", 2));
    assert_eq!(container_devices(&agent, "keep-d"), a);
}

#[test]
fn an_init_containers_devices_are_reused_by_the_app_container() {
    if !ready() {
        return;
    }
    let agent = TestAgent::start("devagent-init", NODE);
    let plugin = start_plugin(&agent, 4, &[]);
    wait_counts(&agent, 4, 4);

    // The seed's walk-through: the init container gets two devices and exits; the app
    // container, asking for one, is given one of those instead of a new one.
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "init-reuse", "namespace": "default", "uid": "uid-init-reuse"},
        "spec": {"terminationGracePeriodSeconds": 1,
            "initContainers": [env_container(&agent, "setup", "init-reuse-setup", 2, "true")],
            "containers": [env_container(&agent, "app", "init-reuse", 1, "exec sleep 600")]}});
    apply_admitted(&agent, &pod);
    let init = container_devices(&agent, "init-reuse-setup");
    let app = container_devices(&agent, "init-reuse");
    assert_eq!((init.len(), app.len()), (2, 1), "{init:?} {app:?}");
    assert!(app.is_subset(&init), "app {app:?} not from init {init:?}");
    assert_eq!(allocations(&plugin), vec![init.clone(), app.clone()]);
    agent.wait("init-reuse running once its init container is done", || {
        agent
            .pod("default/init-reuse")
            .is_some_and(|p| p["phase"] == "Running")
    });
    // The init container's surplus device stays with the pod until it ends (the
    // kubelet's behaviour, kept): two devices held, two left for others.
    wait_gauges(&agent, 4, 0, 2);
    apply_admitted(&agent, &device_pod(&agent, "init-next", "uid-init-next", 2));
    let next = container_devices(&agent, "init-next");
    assert!(next.is_disjoint(&init), "{next:?} vs {init:?}");
    assert_refused_for_devices(
        &agent,
        &device_pod(&agent, "init-more", "uid-init-more", 1),
        1,
        0,
    );

    // The pod ends: all of its devices, the surplus included, are free again.
    let out = agent.cli(&["pod", "rm", "default/init-reuse", "--grace", "0"]);
    assert!(
        out.status.success(),
        "pod rm: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_gauges(&agent, 4, 0, 2);
}
