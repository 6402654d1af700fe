//! Reclaim first, for memory too (`memoryReclaim`, issue 24), on a real v2 memory
//! controller: a pod whose working set crosses the threshold only because of its own warm
//! page cache is evicted kubelet-exact and kept with the option on (the kernel drops the
//! cache through `memory.reclaim`); an anonymous hog is still evicted before the OOM killer,
//! its decision showing reclaim skipped or bounded; with both, the hog goes and the reader
//! stays. What reclaim freed and how long it took is checked in the decision record (the
//! agent's JSON log), `reactor events` and `/metrics`.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::agent::{apply, follow_events, pod, start};
use super::{counter, wait_until, CACHE_FILE};
use crate::agent::TestAgent;
use crate::exposition::sample;
use crate::memhog_bin;

/// A 160 MiB node (kubepods `memory.max` 160 MiB) evicting below 96 MiB allocatable
/// available: a reader holding the 96 MiB file hot has a working set over 64 MiB, so the
/// threshold is met by page cache alone, with no limit pressure to make the kernel drop it.
/// Every sense source and a 1 s tick; reclaim bounded by 5 s of guest time (TCG is slow).
fn cache_node(enabled: bool) -> String {
    format!(
        "log: {{level: info, format: json}}\n\
         node: {{memoryCapacity: 160Mi, cpuCapacity: '2'}}\n\
         evictionHard: {{allocatableMemory.available: 96Mi}}\n\
         housekeepingInterval: 1s\n\
         sense: {{ebpf: true, psi: true, memcgThreshold: true, poll: true}}\n\
         memoryReclaim: {{enabled: {enabled}, timeout: 5s}}\n"
    )
}

/// The 256 MiB node of the eviction-before-OOM checks (96 MiB threshold), option on.
const HOG_NODE: &str = "log: {level: info, format: json}\n\
     node: {memoryCapacity: 256Mi, cpuCapacity: '2'}\n\
     evictionHard: {allocatableMemory.available: 96Mi}\n\
     housekeepingInterval: 1s\n\
     sense: {ebpf: true, psi: true, memcgThreshold: true, poll: true}\n\
     memoryReclaim: {enabled: true, timeout: 5s}\n";

/// A Burstable pod re-reading the 96 MiB file for ever: its pages, read again and again,
/// sit on the active file list (counted in the working set).
fn start_reader(agent: &TestAgent) {
    assert!(
        std::path::Path::new(CACHE_FILE).exists(),
        "{CACHE_FILE} is missing: the guest's 9p share is not mounted"
    );
    // Pages of the file left cached by an earlier check stay charged to that check's
    // (removed) cgroups: reading them again would charge nothing here. Drop them so the
    // reader's cache is its own (the guest is the suite's machine).
    std::fs::write("/proc/sys/vm/drop_caches", "1").expect("drop the guest's page cache");
    let reader = vec![
        "/bin/sh".to_string(),
        "-c".into(),
        format!("while true; do cat {CACHE_FILE} > /dev/null; done"),
    ];
    apply(
        agent,
        &pod(
            "reader",
            &[("app", reader, json!({"requests": {"memory": "16Mi"}}))],
        ),
    );
}

/// `/sys/kernel/mm/lru_gen/enabled`: the multi-generational LRU, when the kernel has it.
const LRU_GEN: &str = "/sys/kernel/mm/lru_gen/enabled";

/// The classic active/inactive LRU for the length of a check, restored on drop. Under the
/// multi-generational LRU, `active_file`/`inactive_file` in `memory.stat` are generations
/// (file pages read with `read(2)` stay in the old ones until reclaim ages them), so page
/// cache does not reach the working set the way kubernetes#43916 describes; the checks
/// model the LRU that issue is about. The guest is the suite's own machine.
pub(super) struct ClassicLru(Option<String>);

impl ClassicLru {
    pub(super) fn new() -> ClassicLru {
        let was = std::fs::read_to_string(LRU_GEN)
            .ok()
            .map(|s| s.trim().to_string());
        if let Some(w) = &was {
            if w != "0x0000" {
                std::fs::write(LRU_GEN, "n").unwrap_or_else(|e| panic!("{LRU_GEN}: {e}"));
            }
        }
        ClassicLru(was)
    }

    pub(super) fn note(&self) -> String {
        match &self.0 {
            None => "no lru_gen in this kernel".to_string(),
            Some(w) => format!("lru_gen was {w}, off for the check"),
        }
    }
}

impl Drop for ClassicLru {
    fn drop(&mut self) {
        if let Some(w) = &self.0 {
            if w != "0x0000" {
                let _ = std::fs::write(LRU_GEN, "y");
            }
        }
    }
}

/// Waits for the reader's cache to be active file pages in kubepods (what the working set
/// counts), at least 64 MiB.
fn wait_active_cache(agent: &TestAgent) {
    let stat = agent.v2_dir("kubepods").join("memory.stat");
    wait_until(
        "the reader's page cache active in kubepods",
        180,
        || counter(&stat, "active_file") >= 64 << 20,
        || super::read(&stat),
    );
}

/// A BestEffort pod allocating 400 MiB at 32 MiB/s: past any node here.
pub(super) fn start_hog(agent: &TestAgent) {
    let hog = vec![
        memhog_bin().display().to_string(),
        "400".into(),
        "32".into(),
    ];
    apply(agent, &pod("hog", &[("app", hog, json!({}))]));
}

/// Every decision record in the agent's JSON log, whole (timestamp and fields).
fn decision_lines(agent: &TestAgent) -> Vec<Value> {
    agent
        .log()
        .lines()
        .filter(|l| l.contains("eviction decision"))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

/// A decision field that holds JSON text (`action`, `memory_reclaim`), parsed.
fn json_field(record: &Value, key: &str) -> Option<Value> {
    record["fields"][key]
        .as_str()
        .and_then(|s| serde_json::from_str::<Value>(s).ok())
}

/// Every decision record in the agent's JSON log: `(action, memoryReclaim)`, both parsed.
fn decisions(agent: &TestAgent) -> Vec<(Value, Option<Value>)> {
    decision_lines(agent)
        .iter()
        .map(|v| {
            (
                json_field(v, "action").unwrap_or(Value::Null),
                json_field(v, "memory_reclaim"),
            )
        })
        .collect()
}

/// The evictions and their second records, one line each: when, what, which pod, and
/// for a second record whether the victim was gone (`released=false`: past its bound) and
/// how long after its kill — what a failure needs first (the whole log follows it).
fn eviction_timeline(agent: &TestAgent) -> String {
    decision_lines(agent)
        .iter()
        .filter_map(|v| {
            let a = json_field(v, "action")?;
            let f = &v["fields"];
            (a["type"] == "evicted" || a["type"] == "released").then(|| {
                format!(
                    "{} seq {} {} {} released={} release={} met={}",
                    v["timestamp"].as_str().unwrap_or("?"),
                    f["seq"],
                    a["type"],
                    a["pod"],
                    a["released"],
                    f["release"],
                    f["met"]
                )
            })
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn evictions(agent: &TestAgent) -> Vec<(Value, Option<Value>)> {
    decisions(agent)
        .into_iter()
        .filter(|(a, _)| a["type"] == "evicted")
        .collect()
}

fn oom_kills(agent: &TestAgent) -> u64 {
    counter(&agent.v2_dir("kubepods").join("memory.events"), "oom_kill")
}

/// Kubelet-exact (option off): the reader's warm cache meets the threshold and the reader
/// is evicted for it.
pub fn file_cache_evicted_kubelet_exact() -> String {
    let lru = ClassicLru::new();
    let agent = start("v2-reclaim-off", &cache_node(false));
    start_reader(&agent);
    wait_active_cache(&agent);
    wait_until(
        "the reader to be evicted for its page cache",
        300,
        || {
            agent
                .pod("default/reader")
                .is_some_and(|p| p["phase"] == "Failed")
        },
        || agent.log(),
    );
    let reader = agent.pod("default/reader").unwrap_or(Value::Null);
    assert_eq!(reader["reason"], "Evicted", "{reader}");
    assert_eq!(oom_kills(&agent), 0, "{}", agent.log());
    let e = evictions(&agent);
    assert!(
        e.iter().all(|(_, m)| m.is_none()),
        "no memory reclaim with the option off: {e:?}"
    );
    format!("{}; reader evicted: {}", lru.note(), reader["message"])
}

/// Option on: the same pod is not evicted; the kernel drops its cache through
/// `memory.reclaim`, a decision records the reclaim resolved (available back above the
/// threshold), and the event stream and `/metrics` show what it freed and how long it took.
pub fn file_cache_reclaimed_not_evicted() -> String {
    let lru = ClassicLru::new();
    let agent = start("v2-reclaim-on", &cache_node(true));
    let (_events_child, events) = follow_events(&agent);
    start_reader(&agent);
    let mut resolved: Option<Value> = None;
    wait_until(
        "a memory reclaim that resolved the threshold",
        300,
        || {
            resolved = decisions(&agent).into_iter().find_map(|(a, m)| {
                (a["type"] == "reclaimed" && m.as_ref()?["outcome"] == "resolved")
                    .then(|| m.unwrap_or(Value::Null))
            });
            resolved.is_some()
                || agent
                    .pod("default/reader")
                    .is_some_and(|p| p["phase"] == "Failed")
        },
        || agent.log(),
    );
    let record = resolved.unwrap_or_else(|| {
        panic!(
            "the reader was evicted, not reclaimed: {:?}\n{}",
            agent.pod("default/reader"),
            agent.log()
        )
    });
    // The record: what was short, what was asked and freed, how long, and available after.
    let n = |k: &str| record[k].as_u64().unwrap_or(0);
    assert!(n("steps") >= 1, "{record}");
    assert!(n("freedBytes") > 0, "{record}");
    assert!(n("tookNs") > 0, "{record}");
    assert!(
        n("requestedBytes") >= n("shortfallBytes").min(256 << 20),
        "{record}"
    );
    assert!(n("activeFileBytes") >= n("shortfallBytes"), "{record}");
    assert!(
        n("availableAfterBytes") >= 96 << 20,
        "available recovered above the 96Mi threshold: {record}"
    );
    assert_eq!(record["signal"], "allocatableMemory.available", "{record}");
    // Keep the reader hot a while longer: it is never evicted (reclaim again if need be).
    std::thread::sleep(Duration::from_secs(20));
    let reader = agent.pod("default/reader").unwrap_or(Value::Null);
    assert_eq!(reader["phase"], "Running", "{reader}\n{}", agent.log());
    let e = evictions(&agent);
    assert!(e.is_empty(), "nothing evicted with the option on: {e:?}");
    assert_eq!(oom_kills(&agent), 0, "{}", agent.log());
    // `reactor events`: the memory_reclaim event with the same figures.
    let deadline = Instant::now() + Duration::from_secs(30);
    let event = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(e) if e["kind"] == "memory_reclaim" && e["event"]["outcome"] == "resolved" => {
                break e
            }
            Ok(_) => {}
            Err(_) => panic!("no memory_reclaim event: {}", agent.log()),
        }
    };
    assert!(
        event["event"]["freedBytes"].as_u64().unwrap_or(0) > 0,
        "{event}"
    );
    assert!(
        event["event"]["tookNanos"].as_u64().unwrap_or(0) > 0,
        "{event}"
    );
    // `/metrics`.
    let text = agent.scrape();
    let resolved_count =
        sample(&text, "reactor_memory_reclaims_total{outcome=\"resolved\"}").unwrap_or(0.0);
    assert!(resolved_count >= 1.0, "{text}");
    assert!(
        sample(&text, "reactor_memory_reclaimed_bytes_total").unwrap_or(0.0) > 0.0,
        "{text}"
    );
    assert!(
        sample(&text, "reactor_memory_reclaim_duration_seconds_count").unwrap_or(0.0) >= 1.0,
        "{text}"
    );
    format!(
        "{}\nrecord: {record}\nevent: {event}\nresolved reclaims: {resolved_count}",
        lru.note()
    )
}

/// Option on, an anonymous hog alone: reclaim cannot help (no file pages to cover the
/// shortfall), so it is skipped or bounded and the hog is evicted before the OOM killer.
pub fn anonymous_hog_still_evicted() -> String {
    let agent = start("v2-reclaim-hog", HOG_NODE);
    start_hog(&agent);
    wait_until(
        "the hog to be evicted or OOM-killed",
        300,
        || {
            agent
                .pod("default/hog")
                .is_some_and(|p| p["phase"] == "Failed")
        },
        || agent.log(),
    );
    let hog = agent.pod("default/hog").unwrap_or(Value::Null);
    assert_eq!(
        oom_kills(&agent),
        0,
        "OOM killer first: {hog}\n{}",
        agent.log()
    );
    assert_eq!(hog["reason"], "Evicted", "{hog}");
    let e = evictions(&agent);
    let (_, record) = e
        .first()
        .unwrap_or_else(|| panic!("no eviction decision: {}", agent.log()));
    let record = record
        .clone()
        .unwrap_or_else(|| panic!("the eviction has no memoryReclaim record: {e:?}"));
    let outcome = record["outcome"].as_str().unwrap_or_default();
    assert!(
        ["skipped", "bounded", "short"].contains(&outcome),
        "reclaim skipped or bounded before the hog's eviction: {record}"
    );
    format!("eviction's memoryReclaim: {record}")
}

/// Option on, both: the hog is evicted, the reader is not.
pub fn hog_evicted_reader_kept() -> String {
    let lru = ClassicLru::new();
    let agent = start("v2-reclaim-both", HOG_NODE);
    start_reader(&agent);
    wait_active_cache(&agent);
    start_hog(&agent);
    wait_until(
        "the hog to be evicted or OOM-killed",
        300,
        || {
            agent
                .pod("default/hog")
                .is_some_and(|p| p["phase"] == "Failed")
        },
        || agent.log(),
    );
    let hog = agent.pod("default/hog").unwrap_or(Value::Null);
    assert_eq!(
        oom_kills(&agent),
        0,
        "OOM killer first: {hog}\n{}",
        agent.log()
    );
    assert_eq!(hog["reason"], "Evicted", "{hog}");
    let reader = agent.pod("default/reader").unwrap_or(Value::Null);
    let timeline = eviction_timeline(&agent);
    assert_eq!(
        reader["phase"],
        "Running",
        "{reader}\nevictions:\n{timeline}\n{}",
        agent.log()
    );
    let e = evictions(&agent);
    assert_eq!(e.len(), 1, "only the hog evicted: {timeline}");
    let records: Vec<String> = decisions(&agent)
        .into_iter()
        .filter_map(|(a, m)| Some(format!("{} {}", a["type"], m?)))
        .collect();
    format!(
        "{}; evictions:\n{timeline}\nmemory reclaims:\n{}",
        lru.note(),
        records.join("\n")
    )
}
