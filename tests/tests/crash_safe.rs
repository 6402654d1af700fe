//! Crash-safe state and orphans, through a real `reactor run` (process runtime, real
//! cgroupfs): the agent starts whatever its state files say, says what it found, and shows
//! every pod that runs on the node.
//!
//! - the two scenarios of issue 15's "Why": a pod's agent SIGKILLed and `pods.json` cut in
//!   half — the next start comes up and shows the pod, and so does the start after it;
//! - a pod whose spec is lost everywhere is an orphan: listed, ranked, removed after
//!   `orphanGracePeriod`, or replaced by a pod applied under its name;
//! - every state file truncated, zeroed, garbage, a directory, a FIFO, another version;
//! - `stateDir` on a small tmpfs that fills up and gets space back;
//! - SIGKILL of the agent at 24 seeded points while pods are admitted, removed and evicted.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns: a failed setup should panic with its backtrace"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use reactor::node::journal::{self, KillJournal};
use reactor_tests::agent::TestAgent;
use reactor_tests::{is_root, memhog_bin, reactor_bin, require, ChildGuard};
use rustix::process::Signal;
use serde_json::{json, Value};

fn ready() -> bool {
    require(
        is_root(),
        "root, to create cgroups, run pods and mount a tmpfs",
    ) && require(
        Path::new("/sys/fs/cgroup/memory/memory.oom_control").exists(),
        "cgroup v1 memory hierarchy under /sys/fs/cgroup",
    ) && require(
        memhog_bin().exists() && reactor_bin().exists(),
        "the reactor and memhog binaries (cargo build --workspace --bins)",
    )
}

fn sleeper(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"terminationGracePeriodSeconds": 2,
                    "containers": [{"name": "app", "command": ["sleep", "3600"],
                                    "resources": {"requests": {"memory": "8Mi"}}}]}})
}

fn hog(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
                    "containers": [{"name": "app",
                                    "command": [memhog_bin().display().to_string(), "600", "400"]}]}})
}

/// Events received within `within` that match `pred`, waiting until one does.
fn wait_event(
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

fn recovery<'a>(action: &'a str, file: &'a str) -> impl FnMut(&Value) -> bool + 'a {
    move |e| {
        e["kind"] == "recovery"
            && e["event"]["action"] == action
            && e["event"]["file"].as_str().unwrap_or("").ends_with(file)
    }
}

fn state_dir(agent: &TestAgent) -> PathBuf {
    agent.dir.path().join("state")
}

/// The pods `pod ls` shows by `namespace/name`, panicking on a name shown twice.
fn listed(agent: &TestAgent) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for p in agent.pods() {
        let name = format!(
            "{}/{}",
            p["namespace"].as_str().unwrap(),
            p["name"].as_str().unwrap()
        );
        assert!(out.insert(name.clone(), p).is_none(), "{name} listed twice");
    }
    out
}

/// Pod cgroups under the agent's `kubepods` with processes in them, by uid.
fn busy_pod_cgroups(agent: &TestAgent) -> BTreeMap<String, Vec<u32>> {
    let mut out = BTreeMap::new();
    for tier in ["", "burstable", "besteffort"] {
        let dir = agent.cgroup_dir("memory", &format!("kubepods/{tier}"));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(uid) = name.strip_prefix("pod") else {
                continue;
            };
            let mut pids = Vec::new();
            for sub in walk(&e.path()) {
                pids.extend(
                    std::fs::read_to_string(sub.join("cgroup.procs"))
                        .unwrap_or_default()
                        .lines()
                        .filter_map(|l| l.trim().parse::<u32>().ok()),
                );
            }
            if !pids.is_empty() {
                out.insert(uid.to_string(), pids);
            }
        }
    }
    out
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.filter_map(Result::ok) {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(walk(&e.path()));
            }
        }
    }
    out
}

/// Every process in a pod cgroup belongs to a pod `pod ls` shows.
fn assert_no_hidden_process(agent: &TestAgent, pods: &BTreeMap<String, Value>) {
    let uids: BTreeSet<&str> = pods.values().filter_map(|p| p["uid"].as_str()).collect();
    for (uid, pids) in busy_pod_cgroups(agent) {
        assert!(
            uids.contains(uid.as_str()),
            "processes {pids:?} in pod cgroup pod{uid}, which pod ls does not show: {pods:?}\n{}",
            agent.log()
        );
    }
}

/// Applies a sleeper pod per name and waits until `pod ls` shows each running (once).
fn run_sleepers(agent: &TestAgent, names: &[&str]) {
    for name in names {
        agent.apply_ok(&sleeper(name));
    }
    agent.wait("the pods to run", || {
        let p = listed(agent);
        names.iter().all(|n| {
            p.get(&format!("default/{n}"))
                .is_some_and(|p| p["phase"] == "Running")
        })
    });
}

fn files_named(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_truncated_pod_checkpoint_neither_stops_the_agent_nor_hides_its_pod() {
    if !ready() {
        return;
    }
    let mut agent = TestAgent::start("crash-why", "");
    run_sleepers(&agent, &["web"]);
    let before = agent.pod("default/web").unwrap();
    let cgroup = before["cgroup"].as_str().unwrap().trim_start_matches('/');
    let pids = agent.procs(&format!("{cgroup}/app"));
    assert_eq!(pids.len(), 1, "{before}");

    // The agent SIGKILLed, its checkpoint cut in half (a power loss, a full disk).
    agent.kill(Signal::KILL);
    let pods_json = state_dir(&agent).join("pods.json");
    let full = std::fs::read(&pods_json).unwrap();
    std::fs::write(&pods_json, &full[..full.len() / 2]).unwrap();

    // It starts (restart panics if it exits), says what happened, and shows the pod.
    agent.restart();
    let (_f, events) = agent.follow_events(None);
    let set_aside = wait_event(
        &events,
        Duration::from_secs(10),
        recovery("set-aside", "pods.json"),
    )
    .unwrap_or_else(|| panic!("no set-aside event for pods.json: {}", agent.log()));
    let message = set_aside["event"]["message"].as_str().unwrap();
    assert!(message.contains("kept as"), "{message}");
    let log = agent.log();
    assert!(
        log.lines()
            .any(|l| l.contains("pods.json") && l.contains("set-aside")),
        "one log line names the file: {log}"
    );
    let kept = files_named(&state_dir(&agent), "pods.json.corrupt-");
    assert_eq!(kept.len(), 1, "the damaged file is kept");
    assert_eq!(std::fs::read(&kept[0]).unwrap(), &full[..full.len() / 2]);

    let pods = listed(&agent);
    let web = &pods["default/web"];
    assert_eq!(web["uid"], before["uid"], "{web}");
    assert_eq!(web["phase"], "Running", "{web}");
    assert_eq!(
        agent.procs(&format!("{cgroup}/app")),
        pids,
        "the same process, re-adopted, not restarted"
    );
    assert_no_hidden_process(&agent, &pods);

    // The start after that: the pod is still there, once, and still the same process.
    agent.kill(Signal::KILL);
    agent.restart();
    let pods = listed(&agent);
    assert_eq!(pods["default/web"]["uid"], before["uid"]);
    assert_eq!(pods["default/web"]["phase"], "Running");
    assert_eq!(agent.procs(&format!("{cgroup}/app")), pids);
    assert_no_hidden_process(&agent, &pods);
    let out = agent.cli(&["pod", "rm", "default/web", "--grace", "0"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The state an agent SIGKILLed inside an eviction leaves: the victim's processes killed
/// and the kill noted in the kill journal, its stop not yet in `pods.json`. The restarted
/// agent ends the pod evicted instead of starting it again, and a note it cannot use (an
/// unknown pod, a torn line) does not stop it.
#[test]
fn a_kill_noted_before_its_stop_was_recorded_ends_the_pod_evicted_after_a_restart() {
    if !ready() {
        return;
    }
    let mut agent = TestAgent::start("crash-note", "");
    run_sleepers(&agent, &["victim", "bystander"]);
    let victim = agent.pod("default/victim").unwrap();
    let uid = victim["uid"].as_str().unwrap().to_string();
    let cgroup = victim["cgroup"]
        .as_str()
        .unwrap()
        .trim_start_matches('/')
        .to_string();
    let bystander = agent.pod("default/bystander").unwrap();
    let bystander_cgroup = bystander["cgroup"]
        .as_str()
        .unwrap()
        .trim_start_matches('/');
    let bystander_pids = agent.procs(&format!("{bystander_cgroup}/app"));

    agent.kill(Signal::KILL);
    for pid in agent.procs(&format!("{cgroup}/app")) {
        let pid = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
        let _ = rustix::process::kill_process(pid, Signal::KILL);
    }
    agent.wait("the victim's processes to be gone", || {
        agent.procs(&format!("{cgroup}/app")).is_empty()
    });
    let message = "The node was low on resource: memory. Threshold quantity: 128Mi.";
    let journal = KillJournal::open(&state_dir(&agent));
    journal.note("no-such-pod", "Evicted", message);
    std::fs::OpenOptions::new()
        .append(true)
        .open(state_dir(&agent).join(journal::FILE_NAME))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"{\"uid\":\"tor\n"))
        .unwrap();
    journal.note(&uid, "Evicted", message);
    drop(journal);

    agent.restart();
    let pods = listed(&agent);
    let v = &pods["default/victim"];
    assert_eq!(
        (&v["uid"], &v["phase"], &v["reason"], &v["message"]),
        (
            &json!(uid),
            &json!("Failed"),
            &json!("Evicted"),
            &json!(message)
        ),
        "the eviction is finished, not undone: {v}\n{}",
        agent.log()
    );
    assert!(
        agent.procs(&format!("{cgroup}/app")).is_empty(),
        "the victim was started again"
    );
    assert_eq!(pods["default/bystander"]["phase"], "Running");
    assert_eq!(
        agent.procs(&format!("{bystander_cgroup}/app")),
        bystander_pids,
        "the bystander is re-adopted, untouched"
    );
    assert_no_hidden_process(&agent, &pods);
    // The stop is in the checkpoint now, so the journal was emptied.
    let left = std::fs::metadata(state_dir(&agent).join(journal::FILE_NAME)).unwrap();
    assert_eq!(
        left.len(),
        0,
        "the journal is emptied once the stops are recorded"
    );
    let out = agent.cli(&["pod", "rm", "default/bystander", "--grace", "0"]);
    assert!(out.status.success());
}

#[test]
fn a_pod_whose_spec_is_lost_everywhere_is_an_orphan_until_its_grace_period_ends() {
    if !ready() {
        return;
    }
    let mut agent = TestAgent::start("crash-orphan", "orphanGracePeriod: 8s\n");
    run_sleepers(&agent, &["lost", "again"]);
    let lost_uid = agent.pod("default/lost").unwrap()["uid"].clone();
    agent.kill(Signal::KILL);
    // Both the pod checkpoint and the process runtime's state, both generations: garbage.
    let state = state_dir(&agent);
    for f in [
        "pods.json",
        "pods.json.prev",
        "process-runtime.json",
        "process-runtime.json.prev",
    ] {
        if state.join(f).exists() {
            std::fs::write(state.join(f), b"\x00garbage\xff").unwrap();
        }
    }
    agent.restart();
    let (_f, events) = agent.follow_events(None);
    let pods = listed(&agent);
    assert_no_hidden_process(&agent, &pods);
    let lost = &pods["default/lost"];
    assert_eq!(
        lost["uid"], lost_uid,
        "named from its log directory: {lost}"
    );
    assert_eq!(
        (&lost["phase"], &lost["reason"]),
        (&json!("Running"), &json!("Orphaned"))
    );
    let message = lost["message"].as_str().unwrap();
    assert!(
        message.contains("cgroup /kubepods/") && message.contains("removed in"),
        "{message}"
    );
    assert_eq!(
        lost["qos"], "BestEffort",
        "ranked as a pod with no requests: {lost}"
    );
    assert!(
        lost["evictionRank"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["rank"].as_u64().is_some_and(|n| n >= 1))),
        "it ranks for eviction: {lost}"
    );
    assert!(
        wait_event(&events, Duration::from_secs(5), |e| e["kind"] == "recovery"
            && e["event"]["action"] == "orphaned")
        .is_some()
    );

    // A pod applied under an orphan's name takes its place: listed once, running.
    let old_again = pods["default/again"]["uid"].clone();
    assert_eq!(pods["default/again"]["reason"], "Orphaned");
    agent.apply_ok(&sleeper("again"));
    let pods = listed(&agent);
    let again = &pods["default/again"];
    assert_ne!(again["uid"], old_again, "{again}");
    assert_eq!(again["reason"], "", "{again}");
    assert_no_hidden_process(&agent, &pods);
    assert!(!busy_pod_cgroups(&agent).contains_key(old_again.as_str().unwrap()));

    // The other one goes when its grace period ends: processes killed, cgroup removed.
    let removed = wait_event(&events, Duration::from_secs(20), |e| {
        e["kind"] == "removed" && e["event"]["uid"] == lost_uid
    })
    .unwrap_or_else(|| panic!("orphan not removed: {}", agent.log()));
    assert_eq!(removed["event"]["cause"], "orphan-grace-period");
    let pods = listed(&agent);
    assert!(!pods.contains_key("default/lost"), "{pods:?}");
    assert!(!busy_pod_cgroups(&agent).contains_key(lost_uid.as_str().unwrap()));
    assert_no_hidden_process(&agent, &pods);
}

/// `dryRun`: an orphan past its grace period is kept, not removed. One `orphan-kept`
/// recovery event says it would have been removed; it stays listed and its process runs on.
#[test]
fn a_dry_run_keeps_an_orphan_past_its_grace_period() {
    if !ready() {
        return;
    }
    let mut agent = TestAgent::start("crash-orphan-dry", "orphanGracePeriod: 1s\ndryRun: true\n");
    run_sleepers(&agent, &["lost"]);
    let lost_uid = agent.pod("default/lost").unwrap()["uid"].clone();
    agent.kill(Signal::KILL);
    let state = state_dir(&agent);
    for f in [
        "pods.json",
        "pods.json.prev",
        "process-runtime.json",
        "process-runtime.json.prev",
    ] {
        if state.join(f).exists() {
            std::fs::write(state.join(f), b"\x00garbage\xff").unwrap();
        }
    }
    agent.restart();
    let (_f, events) = agent.follow_events(None);
    let kept = wait_event(&events, Duration::from_secs(20), |e| {
        e["kind"] == "recovery" && e["event"]["action"] == "orphan-kept"
    })
    .unwrap_or_else(|| panic!("no orphan-kept event: {}", agent.log()));
    assert_eq!(kept["event"]["uid"], lost_uid, "{kept}");
    // Past its grace period: still there, running, said once.
    let later = wait_event(&events, Duration::from_secs(3), |e| {
        e["kind"] == "removed" || (e["kind"] == "recovery" && e["event"]["action"] == "orphan-kept")
    });
    assert!(later.is_none(), "{later:?}");
    let pods = listed(&agent);
    let lost = &pods["default/lost"];
    assert_eq!(
        (&lost["phase"], &lost["reason"]),
        (&json!("Running"), &json!("Orphaned")),
        "{lost}"
    );
    assert!(
        busy_pod_cgroups(&agent).contains_key(lost_uid.as_str().unwrap()),
        "its process runs on"
    );
}

/// How a state file is damaged.
#[derive(Clone, Copy, Debug)]
enum Damage {
    Truncated,
    Zeroed,
    Garbage,
    Directory,
    Fifo,
    FutureVersion,
}

fn damage(path: &Path, how: Damage) {
    let bytes = std::fs::read(path).unwrap();
    std::fs::remove_file(path).unwrap();
    match how {
        Damage::Truncated => std::fs::write(path, &bytes[..bytes.len() / 3]).unwrap(),
        Damage::Zeroed => std::fs::write(path, vec![0u8; bytes.len()]).unwrap(),
        Damage::Garbage => {
            let mut x: u32 = 0x1234_5678;
            let junk: Vec<u8> = (0..bytes.len())
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            std::fs::write(path, junk).unwrap();
        }
        Damage::Directory => {
            std::fs::create_dir(path).unwrap();
            std::fs::write(path.join("inside"), b"x").unwrap();
        }
        Damage::Fifo => {
            assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
        }
        Damage::FutureVersion => {
            let text = String::from_utf8(bytes).unwrap();
            let newer = text.replacen("\"version\":1", "\"version\":99", 1);
            assert_ne!(newer, text, "{text}");
            std::fs::write(path, newer).unwrap();
        }
    }
}

#[test]
fn every_state_file_damaged_every_way_the_agent_starts_says_so_and_writes_again() {
    if !ready() {
        return;
    }
    let mut agent = TestAgent::start("crash-damage", "");
    // A device plugin, so the device manager has a checkpoint (it registers again after
    // every restart, which writes it again).
    let _plugin = ChildGuard(
        Command::new(reactor_bin().with_file_name("sample-device-plugin"))
            .args(["--count", "2", "--dir"])
            .arg(agent.dir.path().join("device-plugins"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let device_checkpoint = state_dir(&agent).join("device-manager/kubelet_internal_checkpoint");
    agent.wait("the device checkpoint", || device_checkpoint.is_file());
    run_sleepers(&agent, &["keep"]);
    let uid = agent.pod("default/keep").unwrap()["uid"].clone();
    let state = state_dir(&agent);
    let device_dir = state.join("device-manager");
    for (round, how) in [
        Damage::Truncated,
        Damage::Zeroed,
        Damage::Garbage,
        Damage::Directory,
        Damage::Fifo,
        Damage::FutureVersion,
    ]
    .into_iter()
    .enumerate()
    {
        agent.kill(Signal::KILL);
        let mut files = vec![
            (state.clone(), "pods.json"),
            (state.clone(), "process-runtime.json"),
        ];
        // The device checkpoint is the kubelet's format, which has no version.
        if !matches!(how, Damage::FutureVersion) {
            files.push((device_dir.clone(), "kubelet_internal_checkpoint"));
        }
        for (dir, f) in &files {
            damage(&dir.join(f), how);
        }
        agent.restart();
        let (_f, events) = agent.follow_events(None);
        let mut seen = Vec::new();
        for (dir, f) in &files {
            let e = match seen.iter().find(|e| recovery("set-aside", f)(e)) {
                Some(e) => Value::clone(e),
                None => wait_event(&events, Duration::from_secs(10), |e| {
                    seen.push(e.clone());
                    recovery("set-aside", f)(e)
                })
                .unwrap_or_else(|| panic!("{how:?}: no set-aside event for {f}: {}", agent.log())),
            };
            let message = e["event"]["message"].as_str().unwrap();
            let tag = if matches!(how, Damage::FutureVersion) {
                "unsupported-"
            } else {
                "corrupt-"
            };
            assert!(
                message.contains(&format!("{f}.{tag}")),
                "{how:?}: {message}"
            );
            let expected = if matches!(how, Damage::FutureVersion) {
                1
            } else {
                round + 1
            };
            assert_eq!(
                files_named(dir, &format!("{f}.{tag}")).len(),
                expected,
                "{how:?}: every damaged {f} is kept"
            );
            assert!(
                agent
                    .log()
                    .lines()
                    .any(|l| l.contains(*f) && l.contains("set-aside")),
                "{how:?}: a log line names {f}"
            );
        }
        let pods = listed(&agent);
        assert_eq!(pods["default/keep"]["uid"], uid, "{how:?}: {pods:?}");
        assert_eq!(pods["default/keep"]["phase"], "Running", "{how:?}");
        assert_no_hidden_process(&agent, &pods);
        // A change writes new checkpoints in place of the damaged ones.
        let name = format!("new-{round}");
        agent.apply_ok(&sleeper(&name));
        agent.wait("the device checkpoint written again", || {
            device_checkpoint.is_file()
        });
        for (dir, f) in &files[..2] {
            let text = std::fs::read_to_string(dir.join(f))
                .unwrap_or_else(|e| panic!("{how:?}: {f} written again: {e}"));
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["version"], 1, "{how:?}: {f}");
        }
        assert!(std::fs::read_to_string(state.join("pods.json"))
            .unwrap()
            .contains(&name));
        let out = agent.cli(&["pod", "rm", &format!("default/{name}"), "--grace", "0"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A tmpfs mounted for one test, unmounted (lazily) on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount a tmpfs at {}", at.display());
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the filesystem of `dir` with one file until it refuses.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write as _;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0x55u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
    path
}

#[test]
fn a_full_state_filesystem_is_reported_and_checkpoints_resume_when_space_returns() {
    if !ready() {
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let state = base.path().join("state");
    let tmpfs = Tmpfs::mount(&state, "2m");
    let mut agent = TestAgent::start("crash-full", &format!("stateDir: {}\n", state.display()));
    let (_f, events) = agent.follow_events(None);
    run_sleepers(&agent, &["early"]);
    let filler = fill(&state);

    // Removing a pod changes the checkpoint: the write fails, is reported, the agent serves.
    let out = agent.cli(&["pod", "rm", "default/early", "--grace", "0"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let failed = wait_event(
        &events,
        Duration::from_secs(10),
        recovery("write-failed", "pods.json"),
    )
    .unwrap_or_else(|| panic!("no write-failed event: {}", agent.log()));
    let message = failed["event"]["message"].as_str().unwrap();
    assert!(message.contains("No space left on device"), "{message}");
    assert!(agent
        .log()
        .lines()
        .any(|l| l.contains("write-failed") && l.contains("pods.json")));
    assert!(
        std::fs::read_to_string(state.join("pods.json"))
            .unwrap()
            .contains("early"),
        "the last good checkpoint is still in place"
    );
    // Still serving: list, status, and an admission (refused cleanly: the process runtime
    // will not start processes it could not find again after a crash).
    assert!(!listed(&agent).contains_key("default/early"));
    let status = agent.cli(&["status", "--json"]);
    assert!(status.status.success());
    let out = agent.apply("full.json", &sleeper("during").to_string());
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() || said.contains("No space left on device"),
        "{said}"
    );
    assert_no_hidden_process(&agent, &listed(&agent));

    // Space returns: the checkpoint is written again without any further change.
    std::fs::remove_file(&filler).unwrap();
    let back = wait_event(
        &events,
        Duration::from_secs(15),
        recovery("write-recovered", "pods.json"),
    )
    .unwrap_or_else(|| panic!("no write-recovered event: {}", agent.log()));
    assert_eq!(back["event"]["action"], "write-recovered");
    assert!(!std::fs::read_to_string(state.join("pods.json"))
        .unwrap()
        .contains("\"early\""));
    agent.kill(Signal::KILL);
    agent.restart();
    let pods = listed(&agent);
    assert!(
        !pods.contains_key("default/early"),
        "{pods:?}\n{}",
        agent.log()
    );
    assert_no_hidden_process(&agent, &pods);
    drop(agent);
    drop(tmpfs);
}

/// 24 SIGKILLs at seeded points while pods are admitted, removed and evicted (a memory hog on
/// a 512 MiB node). After each restart: every pod whose admission was answered is listed
/// exactly once unless its removal was answered, every process in a pod cgroup belongs to a
/// listed pod, and no pod is evicted twice or comes back after its eviction.
#[test]
fn sigkill_at_random_points_loses_no_pod_and_evicts_nothing_twice() {
    if !ready() {
        return;
    }
    const RUNS: usize = 24;
    let mut agent = TestAgent::start(
        "crash-kill",
        "node: {memoryCapacity: 512Mi, cpuCapacity: '2'}\n\
         evictionHard: {allocatableMemory.available: 128Mi}\n\
         housekeepingInterval: 1s\n\
         orphanGracePeriod: 1h\n\
         sense: {ebpf: false, psi: false, memcgThreshold: true}\n",
    );
    // xorshift, seeded: the same delays every run, spread over the whole operation window.
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut admitted: BTreeSet<String> = BTreeSet::new();
    let mut removed: BTreeSet<String> = BTreeSet::new();
    let mut remove_asked: BTreeSet<String> = BTreeSet::new();
    let mut evictions: BTreeMap<String, usize> = BTreeMap::new();
    let mut evicted_uids: BTreeSet<String> = BTreeSet::new();
    let mut faults = 0;
    let started = Instant::now();
    for run in 0..RUNS {
        let delay = Duration::from_millis(next() % 1500);
        let (events_child, events) = agent.follow_events(None);
        let socket = agent.socket.clone();
        let dir = agent.dir.path().to_path_buf();
        let older = run.checked_sub(2).map(|r| format!("a{r}"));
        let ops = std::thread::spawn(move || {
            let cli = |args: &[&str]| {
                Command::new(reactor_bin())
                    .args(args)
                    .arg("--socket")
                    .arg(&socket)
                    .stdin(Stdio::null())
                    .output()
                    .unwrap()
            };
            let apply = |doc: Value| {
                let name = doc["metadata"]["name"].as_str().unwrap().to_string();
                let path = dir.join(format!("{name}.json"));
                std::fs::write(&path, doc.to_string()).unwrap();
                let out = cli(&["pod", "apply", "--json", "-f", path.to_str().unwrap()]);
                let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
                (name, v["admitted"] == true)
            };
            let mut done = Vec::new();
            done.push(("admit", apply(sleeper(&format!("a{run}")))));
            done.push(("admit", apply(hog(&format!("h{run}")))));
            if let Some(old) = older {
                let out = cli(&["pod", "rm", &format!("default/{old}"), "--grace", "0"]);
                done.push(("rm-asked", (old.clone(), true)));
                done.push(("rm", (old, out.status.success())));
            }
            done
        });
        std::thread::sleep(delay);
        agent.kill(Signal::KILL);
        faults += 1;
        for (what, (name, ok)) in ops.join().unwrap() {
            match (what, ok) {
                ("admit", true) => {
                    admitted.insert(name);
                }
                ("rm-asked", _) => {
                    remove_asked.insert(name);
                }
                ("rm", true) => {
                    removed.insert(name);
                }
                _ => {}
            }
        }
        drop(events_child);
        for e in events.try_iter() {
            if e["kind"] == "eviction" {
                *evictions
                    .entry(e["event"]["uid"].as_str().unwrap().to_string())
                    .or_default() += 1;
            }
        }
        agent.restart();
        let pods = listed(&agent);
        for name in &admitted {
            let full = format!("default/{name}");
            if removed.contains(name) {
                assert!(
                    !pods.contains_key(&full),
                    "run {run}: removed {full} is back"
                );
            } else if !remove_asked.contains(name) {
                assert!(
                    pods.contains_key(&full),
                    "run {run} (kill after {delay:?}): admitted {full} is lost: {pods:?}\n{}",
                    agent.log()
                );
            }
        }
        assert_no_hidden_process(&agent, &pods);
        for p in pods.values() {
            let uid = p["uid"].as_str().unwrap().to_string();
            // An eviction announced is never undone, even by a kill before its record.
            assert!(
                !evictions.contains_key(&uid) || p["reason"] == "Evicted",
                "run {run}: evicted pod {uid} was started again: {p}"
            );
            if p["reason"] == "Evicted" {
                evicted_uids.insert(uid);
            } else if evicted_uids.contains(&uid) {
                panic!("run {run}: evicted pod came back: {p}");
            }
        }
    }
    for (uid, n) in &evictions {
        assert_eq!(*n, 1, "pod {uid} evicted {n} times");
    }
    eprintln!(
        "{RUNS} runs, {faults} SIGKILLs, {} pods admitted, {} removed, {} evicted, 0 lost, in {:?}",
        admitted.len(),
        removed.len(),
        evicted_uids.len(),
        started.elapsed()
    );
    assert!(
        !evicted_uids.is_empty(),
        "the hogs were evicted at least once"
    );
}
