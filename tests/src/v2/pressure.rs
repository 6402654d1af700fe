//! Eviction before the OOM killer on a small v2 node, and the eBPF usage threshold.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::agent::{apply, follow_events, pod, start};
use super::{counter, wait_until, CACHE_FILE, MOUNT};
use crate::cgroup_root::TestCgroupRoot;
use crate::{memhog_bin, reactor_bin, ChildGuard};

/// A 320 MiB file beside [`CACHE_FILE`]: read once, it fills a 256 MiB kubepods with page
/// cache.
pub const CACHE_FULL_FILE: &str = "/mnt/host/cache-full.bin";

/// A 256 MiB node (kubepods `memory.max` = allocatable = 256 MiB) evicting below 96 MiB
/// available, eBPF off: PSI on `kubepods/memory.pressure` and `memory.events` wake the loop;
/// the tick is off, so no poll can take the credit. A Burstable pod keeps re-reading a 96 MiB
/// file (page cache, as on a real node), then a BestEffort hog grows past the node. v2 has no
/// usage-threshold notification: the wake-up comes when the kernel starts reclaiming that
/// cache at the limit (`max` in `memory.events`, stall in `memory.pressure`), and the agent
/// must evict the hog before the cache is gone and the OOM killer runs.
pub fn eviction_before_oom_without_ebpf() -> String {
    assert!(
        std::path::Path::new(CACHE_FILE).exists(),
        "{CACHE_FILE} is missing: the guest's 9p share is not mounted"
    );
    let reader = format!("while true; do cat {CACHE_FILE} > /dev/null; done");
    eviction_before_oom(
        "v2-evict",
        "{ebpf: false, psi: true, memcgThreshold: true, poll: false}",
        &reader,
        &["psi", "memcg-threshold"],
    )
}

/// The same node with eBPF alone (no PSI, no `memory.events`, no tick) and no page cache to
/// buy time: the in-kernel usage threshold on kubepods, the byte-threshold notification v2
/// does not have, wakes the loop before usage reaches `memory.max`.
pub fn eviction_before_oom_woken_by_ebpf_threshold() -> String {
    eviction_before_oom(
        "v2-evict-ebpf",
        "{ebpf: true, psi: false, memcgThreshold: false, poll: false}",
        "sleep 3600",
        &["ebpf"],
    )
}

/// A Burstable pod running `keeper` (a shell command) beside a BestEffort hog that grows
/// past the 256 MiB node; the hog must be evicted, not OOM-killed, by a decision one of
/// `woken_by` woke.
fn eviction_before_oom(name: &str, sense: &str, keeper: &str, woken_by: &[&str]) -> String {
    let agent = start(
        name,
        &format!(
            "log: {{level: info, format: json}}\n\
             node: {{memoryCapacity: 256Mi, cpuCapacity: '2'}}\n\
             evictionHard: {{allocatableMemory.available: 96Mi}}\n\
             sense: {sense}\n"
        ),
    );
    let (_events_child, events) = follow_events(&agent);
    let reader = vec!["/bin/sh".to_string(), "-c".into(), keeper.to_string()];
    apply(
        &agent,
        &pod(
            "reader",
            &[("app", reader, json!({"requests": {"memory": "16Mi"}}))],
        ),
    );
    if keeper.contains(CACHE_FILE) {
        let stat = agent.v2_dir("kubepods").join("memory.stat");
        wait_until(
            "the reader's page cache in kubepods",
            120,
            || counter(&stat, "file") >= 80 << 20,
            || super::read(&stat),
        );
    }
    let hog = hog_ended(&agent);
    let oom_kills = counter(&agent.v2_dir("kubepods").join("memory.events"), "oom_kill");
    assert_eq!(
        oom_kills,
        0,
        "the kernel's OOM killer acted first in kubepods; hog: {hog}\nlog:\n{}",
        agent.log()
    );
    assert_eq!(hog["reason"], "Evicted", "{hog}");
    // The hog's figure as it was evicted (over 100 MiB on this node), not its remains.
    let message = hog["message"].as_str().unwrap_or_default();
    let usage = crate::message_container_usage(message, "app").unwrap_or(0);
    assert!(usage >= 64 << 20, "{message}");
    let reader = agent.pod("default/reader").unwrap_or(Value::Null);
    assert_eq!(
        reader["phase"], "Running",
        "the reader is untouched: {reader}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let eviction = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(e) if e["kind"] == "eviction" => break e,
            Ok(_) => {}
            Err(_) => panic!("no eviction event: {}", agent.log()),
        }
    };
    let log = agent.log();
    let decision = log
        .lines()
        .find(|l| l.contains("eviction decision") && l.contains("evicted"))
        .unwrap_or_else(|| panic!("no eviction decision in the log:\n{log}"));
    let source: Value = serde_json::from_str::<Value>(decision)
        .map(|v| v["fields"]["source"].clone())
        .unwrap_or(Value::Null);
    let woke = source.as_str().unwrap_or_default().to_string();
    assert!(
        woken_by.contains(&woke.as_str()),
        "the eviction was woken by {woke:?}, not by one of {woken_by:?}: {decision}\npressure events:\n{}",
        log.lines()
            .filter(|l| l.contains("pressure event"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    format!("eviction: {eviction}\ndecision: {decision}")
}

/// Applies a BestEffort hog allocating 400 MiB at 32 MiB/s (past any node of the suite) and
/// waits for it to end, evicted or OOM-killed; returns its pod as listed then.
fn hog_ended(agent: &crate::agent::TestAgent) -> Value {
    super::reclaim::start_hog(agent);
    wait_until(
        "the BestEffort hog to be evicted or OOM-killed",
        300,
        || {
            agent
                .pod("default/hog")
                .is_some_and(|p| p["phase"] == "Failed")
        },
        || agent.log(),
    );
    agent.pod("default/hog").unwrap_or(Value::Null)
}

/// `reactor watch` with only the eBPF source and a 100 MiB threshold on a v2 memcg: a
/// 150 MiB allocation inside it yields a `threshold-crossed` event from `ebpf`.
pub fn ebpf_usage_threshold() -> String {
    let root = TestCgroupRoot::v2_at(std::path::Path::new(MOUNT), "ebpf-threshold")
        .expect("create a cgroup");
    let dir = root.dirs[0].clone();
    std::fs::write(dir.join("memory.max"), (512u64 << 20).to_string()).expect("memory.max");
    let cgroup = format!("/{}", root.name);
    let mut watch = ChildGuard(
        Command::new(reactor_bin())
            .args([
                "watch",
                "--json",
                "--no-psi",
                "--no-memcg",
                "--no-poll",
                "--cgroup",
            ])
            .arg(&cgroup)
            .args(["--threshold", "100Mi"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start reactor watch"),
    );
    let stdout = watch.0.stdout.take().expect("watch stdout");
    let (tx, rx) = mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if tx.send(v).is_err() {
                    break;
                }
            }
        }
    });
    // Give the programs time to attach under emulation, then allocate inside the cgroup.
    std::thread::sleep(Duration::from_secs(20));
    let _hog = ChildGuard(
        crate::spawn_in_cgroup(
            &dir,
            Command::new(memhog_bin())
                .args(["150", "0", "3600"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .expect("start memhog"),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        if let Ok(e) = rx.recv_timeout(Duration::from_millis(200)) {
            let line = e.to_string();
            if e["kind"]["type"] == "threshold-crossed" && e["source"] == "ebpf" {
                assert_eq!(e["cgroup"], cgroup.as_str(), "the watched cgroup: {line}");
                assert_eq!(e["kind"]["threshold_bytes"], 100u64 << 20, "{line}");
                let usage = e["kind"]["usage_bytes"].as_u64().unwrap_or(0);
                assert!(usage >= 100 << 20, "usage {usage} below the level: {line}");
                return format!("event: {line}");
            }
            seen.push(line);
        }
    }
    panic!("no threshold-crossed event from ebpf; saw {seen:?}");
}

/// Issue 42 on a real v2 memory controller: a 256 MiB node whose kubepods a pod filled with
/// page cache (a 320 MiB file read once: kubepods at `memory.max`, nearly all of it inactive
/// file) is calm: `reactor status` shows the charge program off for kubepods, its usage
/// within reach only by page cache. Then, with eBPF the only source (no PSI, no
/// `memory.events`, no tick), a BestEffort hog that grows by reclaiming that cache is
/// evicted before the kernel's OOM killer, by a decision the eBPF source woke.
pub fn cache_full_kubepods_is_calm() -> String {
    assert!(
        std::path::Path::new(CACHE_FULL_FILE).exists(),
        "{CACHE_FULL_FILE} is missing: the guest's 9p share is not mounted"
    );
    let lru = super::reclaim::ClassicLru::new();
    let agent = start(
        "v2-cache-full",
        "log: {level: info, format: json}\n\
         node: {memoryCapacity: 256Mi, cpuCapacity: '2'}\n\
         evictionHard: {allocatableMemory.available: 96Mi}\n\
         sense: {ebpf: true, psi: false, memcgThreshold: false, poll: false}\n",
    );
    // Pages cached by an earlier check stay charged to its (removed) cgroups: drop them so
    // the file's cache is charged here (the guest is the suite's machine).
    std::fs::write("/proc/sys/vm/drop_caches", "1").expect("drop the guest's page cache");
    let filler = vec![
        "/bin/sh".to_string(),
        "-c".into(),
        format!("cat {CACHE_FULL_FILE} > /dev/null; exec sleep 3600"),
    ];
    apply(
        &agent,
        &pod(
            "filler",
            &[("app", filler, json!({"requests": {"memory": "16Mi"}}))],
        ),
    );
    let kubepods = agent.v2_dir("kubepods");
    let stat = kubepods.join("memory.stat");
    let usage = || {
        super::read(&kubepods.join("memory.current"))
            .trim()
            .parse::<u64>()
            .unwrap_or(0)
    };
    wait_until(
        "kubepods full of the filler's page cache",
        300,
        || usage() >= 240 << 20 && counter(&stat, "inactive_file") >= 200 << 20,
        || super::read(&stat),
    );
    let charge = || agent.charge_watch("kubepods");
    wait_until(
        "the status to show kubepods within reach only by page cache",
        120,
        || charge().is_some_and(|w| w["state"] == "cached"),
        || format!("{:?}\n{}", charge(), agent.log()),
    );
    std::thread::sleep(Duration::from_secs(5));
    let calm = charge().unwrap_or(Value::Null);
    assert_eq!(
        (&calm["on"], &calm["state"]),
        (&json!(false), &json!("cached")),
        "a kubepods full of page cache armed the charge program: {calm}\n{}",
        super::read(&stat)
    );
    let hog = hog_ended(&agent);
    let oom_kills = counter(&kubepods.join("memory.events"), "oom_kill");
    assert_eq!(
        oom_kills,
        0,
        "the kernel's OOM killer acted first in kubepods; hog: {hog}\nlog:\n{}",
        agent.log()
    );
    assert_eq!(hog["reason"], "Evicted", "{hog}");
    let log = agent.log();
    let decision = log
        .lines()
        .find(|l| l.contains("eviction decision") && l.contains("evicted"))
        .unwrap_or_else(|| panic!("no eviction decision in the log:\n{log}"));
    let source = serde_json::from_str::<Value>(decision)
        .map(|v| v["fields"]["source"].clone())
        .unwrap_or(Value::Null);
    assert_eq!(source, "ebpf", "the eviction's wake-up: {decision}");
    format!("calm: {calm}\ndecision: {decision}\n{}", lru.note())
}
