//! Kernel OOM kills on v2: `memory.oom.group` takes the whole container, and the agent maps
//! the kill (from `memory.events`, or from eBPF) to its pod and container.

use std::fmt::Write as _;
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::agent::{apply, follow_events, pod, procs, start};
use super::counter;
use crate::memhog_bin;

/// What one OOM scenario saw, kept for the checks that read it.
#[derive(Clone, Debug)]
struct Seen {
    /// `memory.oom.group` of the container cgroup while it ran.
    oom_group: String,
    /// The container's two pids (the shell's `sleep` child, and the hog it became).
    pids: Vec<u32>,
    /// Whether both were gone after the kill.
    all_gone: bool,
    /// `memory.events` of the node's kubepods after the kill.
    oom_kill: u64,
    oom_group_kill: u64,
    /// The agent's `oom_kill` events (`reactor events --json`).
    events: Vec<Value>,
    /// The pod as `reactor pod ls --json` shows it at the end.
    pod: Value,
    /// The container cgroup's path in the hierarchy.
    container_cgroup: String,
    /// The agent's log (JSON lines).
    log: String,
    /// `reactor status --json` sources.
    sources: Value,
}

static WITHOUT_EBPF: Mutex<Option<Seen>> = Mutex::new(None);
static WITH_EBPF: Mutex<Option<Seen>> = Mutex::new(None);

/// Runs the scenario once per mode: a Burstable pod whose one container is a shell that
/// starts `sleep` and then becomes a hog past its 32 MiB limit.
fn scenario(ebpf: bool) -> Seen {
    let slot = if ebpf { &WITH_EBPF } else { &WITHOUT_EBPF };
    let mut guard = slot.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(seen) = guard.as_ref() {
        return seen.clone();
    }
    let extra = format!(
        "log: {{level: info, format: json}}\n\
         node: {{memoryCapacity: 512Mi, cpuCapacity: '2'}}\n\
         sense: {{ebpf: {ebpf}, psi: false, memcgThreshold: true}}\n"
    );
    let agent = start(if ebpf { "v2-oom-ebpf" } else { "v2-oom" }, &extra);
    let (_events_child, events) = follow_events(&agent);
    let script = format!(
        "/bin/sleep 3600 & exec {} 200 0 3600",
        memhog_bin().display()
    );
    let doc = apply(
        &agent,
        &pod(
            "oomer",
            &[(
                "app",
                vec!["/bin/sh".into(), "-c".into(), script],
                json!({"requests": {"memory": "16Mi"}, "limits": {"memory": "32Mi"}}),
            )],
        ),
    );
    let uid = doc["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let container_cgroup = format!("kubepods/burstable/pod{uid}/app");
    let dir = agent.v2_dir(&container_cgroup);
    let mut pids = Vec::new();
    let mut oom_group = String::new();
    // Both processes appear, then the kernel kills both.
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Ok(g) = std::fs::read_to_string(dir.join("memory.oom.group")) {
            oom_group = g.trim().to_string();
        }
        let now = procs(&dir);
        if now.len() > pids.len() {
            pids = now;
        }
        if pids.len() >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let gone = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
            s.rsplit(") ").next().is_some_and(|r| r.starts_with('Z'))
        })
    };
    let mut all_gone = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if pids.len() >= 2 && pids.iter().all(gone) {
            all_gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let events_file = agent.v2_dir("kubepods").join("memory.events");
    let oom_kill = counter(&events_file, "oom_kill");
    let oom_group_kill = counter(&events_file, "oom_group_kill");
    let mut oom_events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        match events.recv_timeout(Duration::from_millis(200)) {
            Ok(e) if e["kind"] == "oom_kill" => oom_events.push(e),
            Ok(_) => {}
            Err(mpsc::RecvTimeoutError::Timeout) if !oom_events.is_empty() => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let status = agent.cli(&["status", "--json"]);
    let sources = serde_json::from_slice::<Value>(&status.stdout)
        .map(|v| v["sources"].clone())
        .unwrap_or(Value::Null);
    let seen = Seen {
        oom_group,
        pids,
        all_gone,
        oom_kill,
        oom_group_kill,
        events: oom_events,
        pod: agent.pod("default/oomer").unwrap_or(Value::Null),
        container_cgroup: format!("/{}/{container_cgroup}", agent.root.name),
        log: agent.log(),
        sources,
    };
    *guard = Some(seen.clone());
    seen
}

/// The agent's `oom_kill` events name the pod and the container.
fn assert_mapped(seen: &Seen) {
    assert!(
        seen.events
            .iter()
            .any(|e| e["event"]["pod"]["name"] == "oomer" || e["event"]["pod"] == "default/oomer"),
        "no oom_kill event for default/oomer: {:?}\nlog:\n{}",
        seen.events,
        seen.log
    );
    assert!(
        seen.events.iter().any(|e| e["event"]["container"] == "app"),
        "no oom_kill event naming container app: {:?}",
        seen.events
    );
}

/// `memory.oom.group` is 1 on the container cgroup, so the OOM kill takes both of its
/// processes (the hog and the `sleep` beside it), as the kubelet's default on v2 does.
pub fn group_kills_whole_container() -> String {
    let seen = scenario(false);
    assert_eq!(seen.oom_group, "1", "memory.oom.group of the container");
    assert!(
        seen.pids.len() >= 2,
        "the container never had two processes: {seen:?}"
    );
    assert!(
        seen.all_gone,
        "pids {:?} are not all gone after the OOM kill: {seen:?}",
        seen.pids
    );
    assert!(
        seen.oom_kill >= 2,
        "kubepods oom_kill {} (want both processes)",
        seen.oom_kill
    );
    assert!(
        seen.oom_group_kill >= 1,
        "kubepods oom_group_kill {}",
        seen.oom_group_kill
    );
    format!(
        "pids {:?} killed; kubepods memory.events oom_kill {} oom_group_kill {}",
        seen.pids, seen.oom_kill, seen.oom_group_kill
    )
}

/// With eBPF off, the OOM kill is read from `memory.events` (`oom_kill`) and mapped to the pod
/// and container; the pod's container ends `OOMKilled`.
pub fn kill_from_memory_events() -> String {
    let seen = scenario(false);
    assert_mapped(&seen);
    assert!(
        seen.log.lines().any(|l| l.contains("pressure event")
            && l.contains("memcg-threshold")
            && l.contains("oom-kill")),
        "no oom-kill pressure event from memcg-threshold in the log:\n{}",
        seen.log
    );
    let containers = seen.pod["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        containers.iter().any(|c| c["reason"] == "OOMKilled"),
        "the container is not OOMKilled: {}",
        seen.pod
    );
    let mut notes = String::new();
    let _ = write!(notes, "events: {:?}", seen.events);
    notes
}

/// With eBPF on, the agent's programs attach in the guest (BTF, tracepoints) and the
/// `mark_victim` program reports the kill with the victim's own container cgroup.
pub fn kill_from_ebpf() -> String {
    let seen = scenario(true);
    let ebpf = seen
        .sources
        .as_array()
        .and_then(|s| s.iter().find(|x| x["name"] == "ebpf"))
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(
        ebpf["attached"], true,
        "the eBPF source did not attach: {ebpf}\nlog:\n{}",
        seen.log
    );
    assert_mapped(&seen);
    let from_ebpf: Vec<&str> = seen
        .log
        .lines()
        .filter(|l| {
            l.contains("pressure event") && l.contains("\"ebpf\"") && l.contains("oom-kill")
        })
        .collect();
    assert!(
        from_ebpf.iter().any(|l| l.contains(&seen.container_cgroup)),
        "no eBPF oom-kill event naming {}: {from_ebpf:?}\nlog:\n{}",
        seen.container_cgroup,
        seen.log
    );
    format!(
        "{} eBPF oom-kill events, first: {:?}",
        from_ebpf.len(),
        from_ebpf.first()
    )
}
