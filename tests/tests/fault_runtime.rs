//! Issue 15, faults in the agent's peers: a real `reactor run` while its container runtime
//! (a private containerd) is SIGKILLed in the middle of an eviction and while image-GC rounds
//! run, and while a device plugin (the real `sample-device-plugin`) is SIGKILLed inside
//! `Allocate`. Each test asserts that nothing is lost and the agent keeps serving:
//! - eviction: the victim's processes still end (the agent kills the pod cgroup itself), the
//!   pod ends Failed/Evicted exactly once, and once containerd is back the runtime state
//!   converges (sandbox gone, pod cgroup removed);
//! - image GC: the rounds during the outage fail with an `image_gc` event, the image records
//!   checkpoint keeps every record unchanged, and a round after the restart succeeds;
//! - device plugin: the pod is refused as the kubelet refuses it when `Allocate` fails
//!   (`UnexpectedAdmissionError`, "Allocate failed due to …, which is unexpected"; the
//!   kubelet does not retry), no device stays allocated, and once the plugin is back a pod
//!   asking for every device is admitted.
//!
//! Every process is killed by its pid; every wait has a generous deadline (no timed asserts).
#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns: a failed setup should panic with its backtrace"
)]

mod devices_common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use devices_common::{Plugin, R};
use reactor::act::cri::SandboxFilter;
use reactor::images::records::StoredRecords;
use reactor::record::checkpoint::Checkpoint;
use reactor_tests::agent::TestAgent;
use reactor_tests::containerd::block_on_own_runtime;
use reactor_tests::exposition::sample;
use reactor_tests::{
    containerd_available, is_root, memhog_bin, reactor_bin, require, Containerd, TestImage,
};
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;

fn cri_ready() -> bool {
    require(
        containerd_available(),
        "root, containerd, runc and busybox-static for the CRI tests",
    ) && require(
        Path::new("/sys/fs/cgroup/memory/memory.oom_control").exists(),
        "cgroup v1 memory hierarchy",
    ) && require(
        memhog_bin().exists() && reactor_bin().exists(),
        "the reactor and memhog binaries (cargo build --workspace --bins)",
    )
}

/// Receives events until one satisfies `want`; panics naming `what` after 60 s.
fn next_event(rx: &mpsc::Receiver<Value>, what: &str, want: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(e) if want(&e) => return e,
            Ok(_) => {}
            Err(_) => panic!("no event: {what}"),
        }
    }
}

/// SIGKILLs containerd by its pid and reaps it; shims and containers keep running.
fn kill_containerd(ctd: &mut Containerd) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(ctd.pid()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    // Reaps the dead daemon (its SIGTERM reaches a zombie).
    ctd.stop_daemon();
}

/// Asserts that the agent still answers `reactor status` (it keeps serving through a fault).
fn assert_serving(agent: &TestAgent) {
    let status = agent.cli(&["status", "--json"]);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
}

/// Every pid in the cgroups below `dir`, at any depth.
fn procs_below(dir: &Path) -> Vec<u32> {
    let mut out: Vec<u32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            out.extend(procs_below(&e.path()));
        }
    }
    out
}

const EVICT_NODE: &str = "node: {memoryCapacity: 512Mi, cpuCapacity: '2'}\n\
                          evictionHard: {allocatableMemory.available: 128Mi}\n\
                          housekeepingInterval: 1s\n\
                          sense: {ebpf: true, psi: false, memcgThreshold: true}\n";

#[test]
fn containerd_killed_during_an_eviction_the_pod_still_ends_evicted_once_and_converges() {
    if !cri_ready() {
        return;
    }
    const IMAGE: &str = "localhost/reactor/fault-memhog:1";
    let mut ctd = Containerd::start("fault-evict").expect("start containerd");
    let image = TestImage::busybox(IMAGE, 0)
        .with_host_binary(&memhog_bin())
        .expect("memhog and its libraries");
    ctd.build_and_import(&image)
        .expect("import the memhog image");
    let agent = TestAgent::start(
        "fault-evict",
        &format!(
            "{EVICT_NODE}runtime: {{kind: cri, endpoint: '{}'}}\n",
            ctd.endpoint()
        ),
    );
    let (_events_child, events) = agent.follow_events(Some("eviction"));

    // A BestEffort pod that waits for the test's go (a file in its root) and then allocates
    // 600 MiB at 350 MiB/s on a node with 384 MiB before the threshold.
    let uid = "fault-hog";
    agent.apply_ok(&json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hog", "namespace": "default", "uid": uid},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                 "containers": [{"name": "app", "image": IMAGE, "command": ["sh", "-c",
                     "while [ ! -e /go ]; do sleep 0.1; done; exec /bin/memhog 600 350"]}]}
    }));
    let pod_dir = agent.cgroup_dir("memory", &format!("kubepods/besteffort/pod{uid}"));
    let shell = || {
        procs_below(&pod_dir).into_iter().find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("/go"))
        })
    };
    agent.wait("the container's shell in the pod cgroup", || {
        shell().is_some()
    });
    let pid = shell().unwrap();

    // The runtime dies; then the pressure comes, and the eviction runs without it.
    kill_containerd(&mut ctd);
    std::fs::write(format!("/proc/{pid}/root/go"), b"").expect("the go file");
    agent.wait("the hog to end Failed/Evicted", || {
        agent
            .pod("default/hog")
            .is_some_and(|p| p["phase"] == "Failed")
    });
    let hog = agent.pod("default/hog").unwrap();
    assert_eq!(hog["reason"], "Evicted", "{hog}\n{}", agent.log());
    // It was the outage path: the runtime's stop failed and the agent's own SIGKILL ended it.
    assert!(
        agent.log().contains("runtime failed to stop the pod"),
        "{}",
        agent.log()
    );
    agent.wait("every process of the pod to end", || {
        procs_below(&pod_dir).is_empty()
    });
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the container's process is gone"
    );
    // The agent kept serving through the outage.
    assert_serving(&agent);

    // containerd back: the agent stops and removes the sandbox and the pod cgroup.
    ctd.start_daemon().expect("restart containerd");
    let endpoint = ctd.endpoint();
    let sandboxes = || {
        let endpoint = endpoint.clone();
        block_on_own_runtime(async move {
            let client =
                reactor::act::cri::CriClient::connect(&endpoint, Default::default()).await?;
            client
                .list_pod_sandboxes(&SandboxFilter {
                    labels: BTreeMap::from([(
                        "io.kubernetes.pod.uid".to_string(),
                        uid.to_string(),
                    )]),
                    ..Default::default()
                })
                .await
        })
    };
    agent.wait("the sandbox removed once containerd is back", || {
        sandboxes().is_ok_and(|s| s.is_empty())
    });
    agent.wait("the pod cgroup removed", || !pod_dir.exists());

    // Exactly one eviction: one event, one count, the pod still listed Failed/Evicted.
    let first = next_event(&events, "the eviction event", |e| e["kind"] == "eviction");
    assert_eq!(first["event"]["pod"], "default/hog", "{first}");
    std::thread::sleep(Duration::from_secs(2));
    let more: Vec<Value> = events.try_iter().collect();
    assert!(more.is_empty(), "evicted again: {more:?}");
    let text = agent.scrape();
    let evictions: f64 = text
        .lines()
        .filter(|l| l.starts_with("reactor_evictions_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(evictions, 1.0, "{text}");
    let hog = agent.pod("default/hog").unwrap();
    assert_eq!(
        (&hog["phase"], &hog["reason"]),
        (&json!("Failed"), &json!("Evicted"))
    );
}

/// The image records as checkpointed: id → (first detected, size).
fn records(state: &Path) -> BTreeMap<String, (Option<i64>, u64)> {
    let loaded = Checkpoint::new(
        state.join(reactor::images::manager::CHECKPOINT_FILE),
        "image-records",
        1,
    )
    .load();
    // Nothing set aside: the current generation loaded as written.
    assert!(
        loaded.notices.is_empty(),
        "image records checkpoint: {:?}",
        loaded.notices
    );
    let stored: StoredRecords = loaded.value.expect("image records checkpoint written");
    stored
        .images
        .into_iter()
        .map(|(id, r)| (id, (r.first_detected_ns, r.size_bytes)))
        .collect()
}

#[test]
fn containerd_killed_during_image_gc_rounds_loses_no_record_and_the_next_round_succeeds() {
    if !cri_ready() {
        return;
    }
    let mut ctd = Containerd::start_on_tmpfs("fault-gc", 96 * MIB).expect("start containerd");
    let images: Vec<_> = ["a", "b"]
        .iter()
        .map(|n| {
            ctd.build_and_import(&TestImage::busybox(
                &format!("localhost/reactor/fault-gc-{n}:1"),
                4 * MIB,
            ))
            .expect("import an image")
        })
        .collect();
    // Rounds every second that free nothing (young images, usage under the threshold).
    let agent = TestAgent::start(
        "fault-gc",
        &format!(
            "runtime: {{kind: cri, endpoint: '{}'}}\n\
             imageGCHighThresholdPercent: 99\nimageGCLowThresholdPercent: 98\n\
             imageMinimumGCAge: 1h\nimageGC: {{period: 1s, listRefresh: 1s}}\n",
            ctd.endpoint()
        ),
    );
    let state = agent.dir.path().join("state");
    let (_events_child, events) = agent.follow_events(Some("image_gc"));
    let finished = |e: &Value| e["event"]["reason"] == "" && e["event"]["trigger"] == "periodic";
    next_event(&events, "a periodic round that ran to its end", finished);
    agent.wait("both images in the records checkpoint", || {
        let r = records(&state);
        images.iter().all(|i| r.contains_key(&i.id))
    });
    let before = records(&state);

    // containerd dies while rounds run every second; the next rounds fail.
    kill_containerd(&mut ctd);
    let failed = next_event(&events, "a failed round", |e| {
        e["event"]["reason"] == "RoundFailed" || e["event"]["reason"] == "ImageGCFailed"
    });
    assert!(
        !failed["event"]["message"].as_str().unwrap_or("").is_empty(),
        "{failed}"
    );
    assert_eq!(
        records(&state),
        before,
        "records lost or changed by the failed rounds"
    );
    assert_serving(&agent);

    // containerd back: a round runs to its end again and every record is still there.
    ctd.start_daemon().expect("restart containerd");
    next_event(&events, "a round after the restart", finished);
    let after = records(&state);
    for (id, (first, size)) in &before {
        assert_eq!(
            after.get(id),
            Some(&(*first, *size)),
            "record of {id} after the restart"
        );
    }
    let text = agent.scrape();
    let failures = sample(&text, "reactor_image_gc_failures_total").unwrap_or(0.0);
    assert!(failures >= 1.0, "{text}");
}

const DEVICE_NODE: &str =
    "node: {memoryCapacity: 1Gi, cpuCapacity: '2'}\nevictionHard: {memory.available: 100Mi}\n";

/// A pod asking for `devices` of [`R`] that sleeps.
fn device_pod(name: &str, devices: u32) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "app", "command": ["/bin/sleep", "600"],
                                    "resources": {"limits": {R: devices.to_string()}}}]}})
}

/// `reactor_devices_allocated{resource=R}` from `/metrics`.
fn allocated(agent: &TestAgent) -> Option<f64> {
    sample(
        &agent.scrape(),
        &format!(r#"reactor_devices_allocated{{resource="{R}"}}"#),
    )
}

/// [`R`]'s allocatable count in `reactor status --json`.
fn allocatable(agent: &TestAgent) -> Option<String> {
    let out = agent.cli(&["status", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v["allocatable"][R].as_str().map(str::to_string)
}

#[test]
fn a_device_plugin_killed_during_allocate_refuses_the_pod_and_leaks_no_device() {
    if !require(is_root(), "root, to create cgroups and run pods")
        || !require(
            Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists(),
            "cgroup v1 memory hierarchy",
        )
        || !require(
            reactor_bin().exists() && devices_common::plugin_bin().exists(),
            "the reactor and sample-device-plugin binaries (cargo build --workspace --bins)",
        )
    {
        return;
    }
    let agent = TestAgent::start("fault-dev", DEVICE_NODE);
    let plugin_dir: PathBuf = agent.dir.path().join("device-plugins");
    // Allocate waits 60 s after journaling `allocating`: the test kills the plugin there.
    let mut slow = Plugin::start_in(
        &plugin_dir,
        agent.dir.path(),
        R,
        2,
        &["--allocate-delay-ms", "60000"],
    );
    agent.wait("two devices allocatable", || {
        allocatable(&agent).as_deref() == Some("2")
    });

    let refused = std::thread::scope(|s| {
        let applying = s.spawn(|| agent.apply("first.json", &device_pod("first", 2).to_string()));
        agent.wait("Allocate in flight at the plugin", || {
            slow.journal().contains("allocating dev-0,dev-1")
        });
        slow.kill();
        applying.join().unwrap()
    });
    assert!(
        !refused.status.success(),
        "a pod whose Allocate failed is refused: {}",
        String::from_utf8_lossy(&refused.stdout)
    );
    let answer: Value = serde_json::from_slice(&refused.stdout).unwrap_or_else(|_| {
        panic!(
            "apply answered no document: {}{}",
            String::from_utf8_lossy(&refused.stdout),
            String::from_utf8_lossy(&refused.stderr)
        )
    });
    assert_eq!(answer["admitted"], false, "{answer}");
    assert_eq!(answer["reason"], "UnexpectedAdmissionError", "{answer}");
    let message = answer["message"].as_str().unwrap();
    assert!(
        message.starts_with("Allocate failed due to ")
            && message.ends_with(", which is unexpected"),
        "{message}"
    );
    let first = agent.pod("default/first").unwrap();
    assert_eq!(
        (&first["phase"], &first["reason"]),
        (&json!("Failed"), &json!("UnexpectedAdmissionError")),
        "{first}"
    );
    // Nothing is held by the refused pod, and the agent serves on.
    agent.wait("no device allocated", || allocated(&agent) == Some(0.0));

    // The plugin back (no delay): a pod asking for every device fits, so none leaked.
    let plugin = Plugin::start_in(&plugin_dir, agent.dir.path(), R, 2, &[]);
    agent.wait("two devices allocatable again", || {
        allocatable(&agent).as_deref() == Some("2")
    });
    let second = agent.apply_ok(&device_pod("second", 2));
    assert_eq!(second["admitted"], true, "{second}");
    agent.wait("both devices allocated to the second pod", || {
        allocated(&agent) == Some(2.0)
    });
    assert!(plugin.journal().contains("allocate dev-0,dev-1"));
}
