//! Bugs the chaos run (`cargo xtask chaos`, docs/reliability.md) found, each replayed here
//! as the one scenario that shows it, through a real `reactor run` on the real kernel.
//!
//! - Seed 20261128, at 259 s: a pod that ignores SIGTERM was being evicted with grace when
//!   the agent was SIGKILLed. The restarted agent finished the eviction (killed the pod's
//!   processes, ended it `Failed`/`Evicted`) but kept the container states of its checkpoint,
//!   so `pod ls` showed the evicted pod's container still `running`, for good.
//! - Seed 20261128 again, at 370 s (with the fix above): a pod evicted at grace 0, its memory
//!   back and its cgroup removed, when the agent was SIGKILLed before the stop was written.
//!   The restarted agent finished the eviction from its kill journal, but the runtime no
//!   longer knew the pod, its stop answered nothing, and `pod ls` kept showing the
//!   container `running`.
//! - Seed 5 under containerd, at 146 s (with both fixes above): a pod evicted while
//!   containerd was down. The agent killed its processes itself, but the runtime's stop
//!   failed and the record kept its container `running`, in `pod ls`, for good.
//! - Seed 2, at 107 s: a graceful eviction cut short by a hard threshold came on `reactor
//!   events` as a second eviction of the pod, like the first in every field but the grace
//!   (the metrics counted one, the decision record said `escalated`): a client could not
//!   tell an escalation from an eviction made twice.
//! - `--containerd` seed 5, with freezes left on by a harness fault: a memory threshold met
//!   with nothing left to evict made a `nothingToEvict` record on every pass, about 200 a
//!   second, each crossing and close re-read waking one.
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use reactor::node::journal::KillJournal;
use reactor::record::checkpoint::Checkpoint;
use reactor_tests::agent::TestAgent;
use reactor_tests::{
    containerd_available, is_root, memhog_bin, reactor_bin, require, Containerd, TestImage,
};
use rustix::process::Signal;
use serde_json::{json, Value};

fn ready() -> bool {
    require(is_root(), "root, to create cgroups and run pods")
        && require(
            Path::new("/sys/fs/cgroup/memory/memory.oom_control").exists(),
            "cgroup v1 memory hierarchy under /sys/fs/cgroup",
        )
        && require(
            memhog_bin().exists() && reactor_bin().exists(),
            "the reactor and memhog binaries (cargo build --workspace --bins)",
        )
}

/// A 512 MiB node whose soft threshold (300Mi for 1 s) evicts with up to 60 s of grace.
const NODE: &str = "node: {memoryCapacity: 512Mi, cpuCapacity: '2'}\n\
                    evictionHard: {memory.available: 100Mi}\n\
                    evictionSoft: {memory.available: 300Mi}\n\
                    evictionSoftGracePeriod: {memory.available: 1s}\n\
                    evictionMaxPodGracePeriod: 60\n\
                    housekeepingInterval: 1s\n\
                    sense: {ebpf: true, psi: false, memcgThreshold: true}\n";

fn next_event(
    rx: &mpsc::Receiver<Value>,
    within: Duration,
    mut pred: impl FnMut(&Value) -> bool,
) -> Option<Value> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(e) if pred(&e) => return Some(e),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
}

#[test]
fn an_eviction_finished_by_the_restarted_agent_leaves_no_container_running_in_pod_ls() {
    if !ready() {
        return;
    }
    let mut agent = TestAgent::start("chaos-finish", NODE);
    let (events_child, events) = agent.follow_events(Some("eviction"));
    // 230 MiB in a pod that ignores SIGTERM, 60 s of grace: the soft threshold is met and
    // its graceful eviction stays under way.
    let hog = format!("trap '' TERM; exec {} 230 0", memhog_bin().display());
    agent.apply_ok(&json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "stubborn", "namespace": "default"},
        "spec": {"terminationGracePeriodSeconds": 60, "restartPolicy": "Never",
                 "containers": [{"name": "app", "command": ["/bin/sh", "-c", hog]}]}}));
    let soft = next_event(&events, Duration::from_secs(30), |e| {
        e["event"]["pod"] == "default/stubborn"
    })
    .unwrap_or_else(|| panic!("no soft eviction: {}", agent.log()));
    assert_eq!(soft["event"]["gracePeriodSeconds"], 60, "{soft}");
    // Announced, so already durable: in the kill journal, noted before the event went out,
    // or (once the pod manager wrote its stop ahead and cleared the journal) in pods.json.
    // Without the note an agent killed in between forgot the eviction and made it again
    // after its restart, with a new grace (CI, 2026-11-28).
    let uid = soft["event"]["uid"].as_str().expect("uid").to_string();
    let state = agent.dir.path().join("state");
    let noted = KillJournal::read(&state).iter().any(|n| n.uid == uid);
    let written = std::fs::read_to_string(state.join("pods.json")).is_ok_and(|t| {
        serde_json::from_str::<Value>(&t).is_ok_and(|v| {
            v["data"].as_array().is_some_and(|pods| {
                pods.iter()
                    .any(|p| p["uid"] == uid.as_str() && !p["stopping"].is_null())
            })
        })
    });
    assert!(
        noted || written,
        "an announced eviction is in neither the journal nor pods.json"
    );
    let pod = agent.pod("default/stubborn").expect("listed");
    let cgroup = pod["cgroup"].as_str().expect("its cgroup").to_string();
    assert!(
        !agent.procs(&format!("{cgroup}/app")).is_empty(),
        "it ignores SIGTERM, so it still runs in its grace: {pod}"
    );

    // The agent dies in the middle of the grace period and comes back.
    drop(events_child);
    agent.kill(Signal::KILL);
    agent.restart();
    agent.wait("the restarted agent to finish the eviction", || {
        agent
            .pod("default/stubborn")
            .is_some_and(|p| p["phase"] == "Failed")
    });
    let pod = agent.pod("default/stubborn").expect("listed");
    assert_eq!(pod["reason"], "Evicted", "{pod}");
    assert!(
        agent
            .log()
            .contains("the eviction under way when the agent stopped was finished"),
        "the restart finished it: {}",
        agent.log()
    );
    agent.wait("its processes to be gone", || {
        agent.procs(&format!("{cgroup}/app")).is_empty()
    });
    // What `pod ls` says of its container: not running, now or a little later.
    for _ in 0..10 {
        let pod = agent.pod("default/stubborn").expect("listed");
        let c = &pod["containers"][0];
        assert_ne!(
            c["state"], "running",
            "an evicted pod's container shown running: {pod}"
        );
        assert_eq!(c["state"], "terminated", "{pod}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn an_escalated_graceful_eviction_is_one_eviction_and_its_escalation_on_the_event_stream() {
    if !ready() {
        return;
    }
    let agent = TestAgent::start("chaos-escalate", NODE);
    let (_events_child, events) = agent.follow_events(Some("eviction"));
    // A: 230 MiB, ignores SIGTERM, 60 s of grace: the soft threshold evicts it gracefully.
    let hog = format!("trap '' TERM; exec {} 230 0", memhog_bin().display());
    agent.apply_ok(&json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "a", "namespace": "default"},
        "spec": {"terminationGracePeriodSeconds": 60, "restartPolicy": "Never",
                 "containers": [{"name": "app", "command": ["/bin/sh", "-c", hog]}]}}));
    let soft = next_event(&events, Duration::from_secs(30), |e| {
        e["event"]["pod"] == "default/a"
    })
    .unwrap_or_else(|| panic!("no soft eviction of a: {}", agent.log()));
    assert_eq!(soft["event"]["gracePeriodSeconds"], 60, "{soft}");
    assert_eq!(soft["event"]["escalated"], false, "{soft}");

    // B grows at 50 MiB/s while A is in its grace: the hard threshold (412 MiB used) is met
    // with B near 180 MiB, A (230 MiB) first in the ranking: A's stop is cut short.
    agent.apply_ok(&json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "b", "namespace": "default"},
        "spec": {"terminationGracePeriodSeconds": 0, "restartPolicy": "Never",
                 "containers": [{"name": "app",
                                 "command": [memhog_bin().display().to_string(), "300", "50"]}]}}));
    let hard = next_event(&events, Duration::from_secs(30), |e| {
        e["event"]["pod"] == "default/a"
    })
    .unwrap_or_else(|| panic!("no second record for a: {}", agent.log()));
    assert_eq!(hard["event"]["gracePeriodSeconds"], 0, "{hard}");
    assert_eq!(
        hard["event"]["escalated"], true,
        "the SIGKILL cutting A's grace short says it is an escalation: {hard}"
    );
    agent.wait("a to be stopped", || {
        agent
            .pod("default/a")
            .is_some_and(|p| p["phase"] == "Failed")
    });
    // One eviction on the metrics, as on the stream once escalations are told apart.
    let text = agent.scrape();
    let evictions: f64 = text
        .lines()
        .filter(|l| l.starts_with("reactor_evictions_total{") && l.contains("BestEffort"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let b_evicted = agent
        .pod("default/b")
        .is_some_and(|p| p["reason"] == "Evicted");
    assert_eq!(
        evictions,
        if b_evicted { 2.0 } else { 1.0 },
        "A counted once: {text}"
    );
}

#[test]
fn an_eviction_finished_from_the_kill_journal_of_a_pod_the_runtime_lost_shows_its_container_ended()
{
    if !ready() {
        return;
    }
    let mut agent = TestAgent::start("chaos-journal", "");
    agent.apply_ok(&json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "victim", "namespace": "default"},
        "spec": {"terminationGracePeriodSeconds": 0, "restartPolicy": "Never",
                 "containers": [{"name": "app", "command": ["sleep", "3600"]}]}}));
    agent.wait("the victim to run", || {
        agent
            .pod("default/victim")
            .is_some_and(|p| p["containers"][0]["state"] == "running")
    });
    let victim = agent.pod("default/victim").expect("listed");
    let uid = victim["uid"].as_str().expect("uid").to_string();
    let cgroup = victim["cgroup"]
        .as_str()
        .expect("cgroup")
        .trim_start_matches('/')
        .to_string();

    // What the agent leaves when it dies right after an eviction's kill and the victim's
    // release: the processes gone, the pod cgroup removed, the kill noted, no stop written.
    agent.kill(Signal::KILL);
    for pid in agent.procs(&format!("{cgroup}/app")) {
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
    }
    agent.wait("the victim's processes to be gone", || {
        agent.procs(&format!("{cgroup}/app")).is_empty()
    });
    for dir in &agent.root.dirs {
        let pod = dir.join(&cgroup);
        let _ = std::fs::remove_dir(pod.join("app"));
        let _ = std::fs::remove_dir(&pod);
    }
    // The runtime had finished its part of the stop and written it down: it no longer
    // knows the pod.
    let state = agent.dir.path().join("state");
    let runtime = Checkpoint::new(state.join("process-runtime.json"), "process-runtime", 1);
    let pods: Vec<Value> = runtime.load().value.expect("the runtime's checkpoint");
    let kept: Vec<Value> = pods
        .into_iter()
        .filter(|p| !p.to_string().contains(&uid))
        .collect();
    runtime
        .save(&kept)
        .expect("the runtime's checkpoint without the pod");
    let message = "The node was low on resource: memory. Threshold quantity: 100Mi.";
    KillJournal::open(&state).note(&uid, "Evicted", message);

    agent.restart();
    let pod = agent.pod("default/victim").expect("listed");
    assert_eq!(
        (&pod["phase"], &pod["reason"]),
        (&json!("Failed"), &json!("Evicted")),
        "{pod}\n{}",
        agent.log()
    );
    let c = &pod["containers"][0];
    assert_ne!(
        c["state"], "running",
        "an evicted pod's container shown running: {pod}"
    );
    assert_eq!(c["state"], "terminated", "{pod}");
}

#[test]
fn a_pod_evicted_while_containerd_is_down_shows_its_container_ended() {
    if !ready()
        || !require(
            containerd_available(),
            "root, containerd, runc and busybox-static for the CRI tests",
        )
    {
        return;
    }
    const IMAGE: &str = "localhost/reactor/chaos-found-memhog:1";
    let mut ctd = Containerd::start("chaos-found").expect("start containerd");
    let image = TestImage::busybox(IMAGE, 0)
        .with_host_binary(&memhog_bin())
        .expect("memhog and its libraries");
    ctd.build_and_import(&image)
        .expect("import the memhog image");
    let agent = TestAgent::start(
        "chaos-ctd-down",
        &format!(
            "node: {{memoryCapacity: 512Mi, cpuCapacity: '2'}}\n\
             evictionHard: {{memory.available: 128Mi}}\n\
             housekeepingInterval: 1s\n\
             sense: {{ebpf: true, psi: false, memcgThreshold: true}}\n\
             runtime: {{kind: cri, endpoint: '{}'}}\n",
            ctd.endpoint()
        ),
    );
    // A hog that waits for the go (a file in its root), then allocates past the threshold.
    agent.apply_ok(&json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hog", "namespace": "default"},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                 "containers": [{"name": "app", "image": IMAGE, "command": ["sh", "-c",
                     "while [ ! -e /go ]; do sleep 0.1; done; exec /bin/memhog 600 350"]}]}}));
    agent.wait("the hog's container to run", || {
        agent
            .pod("default/hog")
            .is_some_and(|p| p["containers"][0]["state"] == "running")
    });
    let cgroup = agent.pod("default/hog").expect("listed")["cgroup"]
        .as_str()
        .expect("cgroup")
        .trim_start_matches('/')
        .to_string();
    let pod_dir = agent.cgroup_dir("memory", &cgroup);
    let shell = reactor_tests::chaos::check::pids_below(&pod_dir)
        .into_iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("/go"))
        })
        .expect("the container's shell");

    // containerd dies; then the pressure comes, and the eviction runs without it.
    if let Some(pid) = rustix::process::Pid::from_raw(ctd.pid() as i32) {
        rustix::process::kill_process(pid, Signal::KILL).expect("SIGKILL containerd");
    }
    ctd.stop_daemon();
    std::fs::write(format!("/proc/{shell}/root/go"), b"").expect("the go file");
    agent.wait("the hog to end Failed/Evicted", || {
        agent
            .pod("default/hog")
            .is_some_and(|p| p["phase"] == "Failed")
    });
    agent.wait("its processes to be gone", || {
        reactor_tests::chaos::check::pids_below(&pod_dir).is_empty()
    });
    for _ in 0..5 {
        let pod = agent.pod("default/hog").expect("listed");
        assert_eq!(pod["reason"], "Evicted", "{pod}");
        let c = &pod["containers"][0];
        assert_ne!(
            c["state"], "running",
            "an evicted pod's container shown running: {pod}"
        );
        assert_eq!(c["state"], "terminated", "{pod}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A threshold met with nothing evictable (the only pod, which holds the memory, is
/// critical) is recorded once, not on every pass: the close watch re-reads every 100 ms and
/// each kernel crossing wakes a pass, and each made a record before.
#[test]
fn a_threshold_met_with_nothing_to_evict_is_recorded_once_not_on_every_pass() {
    if !ready() {
        return;
    }
    let agent = TestAgent::start(
        "chaos-nothing",
        "log: {level: info, format: json}\n\
         node: {memoryCapacity: 512Mi, cpuCapacity: '2'}\n\
         evictionHard: {allocatableMemory.available: 128Mi}\n\
         housekeepingInterval: 10s\n\
         sense: {ebpf: true, psi: false, memcgThreshold: true}\n",
    );
    let hog = memhog_bin().display().to_string();
    agent.apply_ok(&json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "critical-hog", "namespace": "kube-system"},
        "spec": {"priority": 2_000_000_000, "restartPolicy": "Never",
                 "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "app", "command": [hog, "420", "50", "3600"]}]}}));
    let nothing = |l: &&str| l.contains("eviction decision") && l.contains("nothingToEvict");
    agent.wait("the first nothingToEvict record", || {
        agent.log().lines().any(|l| nothing(&l))
    });
    // The hog goes on charging for a few seconds after the level (420 MiB at 50 MiB/s),
    // with the loop on close watch: passes many times a second, all with nothing to evict.
    std::thread::sleep(Duration::from_secs(6));
    let log = agent.log();
    let records = log.lines().filter(|l| nothing(l)).count();
    let passes = log.lines().filter(|l| l.contains("pressure event")).count();
    assert!(
        agent
            .pod("kube-system/critical-hog")
            .is_some_and(|p| p["phase"] == "Running"),
        "the critical pod is never evicted: {log}"
    );
    assert_eq!(
        records, 1,
        "one record in 6 s of a met threshold, within one housekeeping interval \
         ({passes} pressure events woke passes meanwhile)"
    );
}
