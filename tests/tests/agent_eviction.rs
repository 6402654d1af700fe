//! The reactor loop inside the real agent: `reactor run` on a modelled 512 MiB node (its own
//! cgroup root, kubepods limited to the allocatable memory), pods applied through the agent
//! API and run by the process runtime, pressure from a BestEffort pod allocating fast. What a
//! user sees is checked where the user sees it: `reactor pod ls`, `reactor events`, the log,
//! and `/metrics` scraped over HTTP.
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reactor::record::metrics::FAMILIES;
use reactor_tests::agent::TestAgent;
use reactor_tests::exposition::{has_family, sample};
use reactor_tests::{
    is_root, memhog_bin, message_container_usage, reactor_bin, require, spawn_in_cgroup, ChildGuard,
};
use serde_json::{json, Value};

/// [`ready`], and kernel BTF for the eBPF sources.
fn ready_with_btf() -> bool {
    ready()
        && require(
            Path::new("/sys/kernel/btf/vmlinux").exists(),
            "kernel BTF at /sys/kernel/btf/vmlinux (eBPF)",
        )
}

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

/// A 512 MiB node whose pods may use all of it (no reservations: kubepods is limited to
/// 512 MiB), evicting when less than 128 MiB of it is left; eBPF and the memcg notification
/// wake the loop, the tick is the fallback; the agent's threads run SCHED_FIFO.
const NODE: &str = "node: {memoryCapacity: 512Mi, cpuCapacity: '2'}\n\
                    evictionHard: {allocatableMemory.available: 128Mi}\n\
                    housekeepingInterval: 1s\n\
                    realtimePriority: 10\n\
                    sense: {ebpf: true, psi: false, memcgThreshold: true}\n";

/// Every thread of `pid`: its name, scheduling policy and real-time priority
/// (`/proc/<pid>/task/*/stat` fields 2, 41 and 40; policy 0 normal, 1 FIFO).
fn threads(pid: u32) -> Vec<(String, u32, u32)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter_map(|stat| {
            // Fields after the command (which may hold spaces) start after the last ')'.
            let comm = stat[stat.find('(')? + 1..stat.rfind(')')?].to_string();
            let rest = &stat[stat.rfind(')')? + 2..];
            let mut fields = rest.split_whitespace().skip(37);
            let priority = fields.next()?.parse().ok()?;
            let policy = fields.next()?.parse().ok()?;
            Some((comm, policy, priority))
        })
        .collect()
}

/// The scheduling policy of every thread of `pid`.
fn policies(pid: u32) -> Vec<u32> {
    threads(pid).into_iter().map(|(_, p, _)| p).collect()
}

/// Applies a BestEffort hog allocating 600 MiB at 350 MiB/s, waits for it to end and checks
/// the agent evicted it; returns its pod as listed then.
fn hog_evicted(agent: &TestAgent) -> Value {
    agent.apply_ok(&pod("hog", json!({}), &["600", "350"]));
    agent.wait("the BestEffort pod to be evicted", || {
        agent
            .pod("default/hog")
            .is_some_and(|p| p["phase"] == "Failed")
    });
    let hog = agent.pod("default/hog").expect("the hog is listed");
    assert_eq!(hog["reason"], "Evicted", "{hog}");
    hog
}

fn pod(name: &str, resources: Value, args: &[&str]) -> Value {
    let mut command = vec![memhog_bin().display().to_string()];
    command.extend(args.iter().map(|a| a.to_string()));
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"terminationGracePeriodSeconds": 5, "restartPolicy": "Never",
                    "containers": [{"name": "app", "command": command, "resources": resources}]}})
}

#[test]
fn the_agent_evicts_the_besteffort_hog_before_the_oom_killer_and_reports_it_everywhere() {
    if !ready() {
        return;
    }
    let agent = TestAgent::start("agent-evict", NODE);
    let plugin_dir = agent.dir.path().join("device-plugins");
    let _plugin = ChildGuard(
        Command::new(reactor_bin().with_file_name("sample-device-plugin"))
            .args(["--count", "2", "--dir"])
            .arg(&plugin_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (_events_child, events) = agent.follow_events(None);

    // A Burstable pod using 48 MiB of its 64 MiB request, and a pod refused for asking more
    // memory than the node has (an admission rejection for the metrics).
    agent.apply_ok(&pod(
        "steady",
        json!({"requests": {"memory": "64Mi"}, "limits": {"memory": "128Mi"}}),
        &["48", "0"],
    ));
    let out = agent.apply(
        "too-big.json",
        &pod(
            "too-big",
            json!({"requests": {"memory": "1Gi"}}),
            &["1", "0"],
        )
        .to_string(),
    );
    assert!(!out.status.success(), "a refused pod is a failed apply");
    let refused: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&refused["admitted"], &refused["reason"]),
        (&json!(false), &json!("OutOfmemory")),
        "{refused}"
    );
    agent.wait("the Burstable pod to hold its memory", || {
        agent
            .pod("default/steady")
            .and_then(|p| p["memoryWorkingSetBytes"].as_u64())
            .is_some_and(|ws| ws >= 40 << 20)
    });

    // 600 MiB at 350 MiB/s: the node runs out of allocatable memory in about a second.
    let started = Instant::now();
    agent.apply_ok(&pod("hog", json!({}), &["600", "350"]));
    agent.wait("the BestEffort pod to be evicted", || {
        agent
            .pod("default/hog")
            .is_some_and(|p| p["phase"] == "Failed")
    });
    let hog = agent.pod("default/hog").unwrap();
    eprintln!("evicted {:?} after the hog started", started.elapsed());
    assert_eq!(hog["reason"], "Evicted", "{hog}");
    let message = hog["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "The node was low on resource: memory. Threshold quantity: 128Mi, available: "
        ),
        "{message}"
    );
    // The hog's figure as it was evicted (over 250 MiB on this node), not its remains.
    let usage = message_container_usage(message, "app").unwrap_or(0);
    assert!(usage >= 128 << 20, "{message}");
    // The agent, not the kernel, ended it: the container was not OOM-killed.
    for c in hog["containers"].as_array().unwrap() {
        assert_ne!(c["reason"], "OOMKilled", "{hog}");
    }
    let steady = agent.pod("default/steady").unwrap();
    assert_eq!(steady["phase"], "Running", "the Burstable pod is untouched");
    // The reactor loop's own thread runs SCHED_FIFO at realtimePriority; every other agent
    // thread (API, pod manager, the main thread) and the pods it started keep normal
    // scheduling.
    let agent_threads = threads(agent.pid());
    let loop_threads: Vec<_> = agent_threads
        .iter()
        .filter(|(comm, _, _)| comm == "reactor-loop")
        .collect();
    assert!(!loop_threads.is_empty(), "{agent_threads:?}");
    for (comm, policy, priority) in &agent_threads {
        let want = if comm == "reactor-loop" {
            (1, 10)
        } else {
            (0, 0)
        };
        assert_eq!(
            (*policy, *priority),
            want,
            "thread {comm}: {agent_threads:?}"
        );
    }
    let steady_cgroup = steady["cgroup"].as_str().unwrap().trim_start_matches('/');
    let steady_pids = agent.procs(&format!("{steady_cgroup}/app"));
    assert!(!steady_pids.is_empty(), "{steady}");
    for pid in steady_pids {
        assert_eq!(
            policies(pid),
            [0],
            "pod process {pid} keeps normal scheduling"
        );
    }

    // The event stream carries the eviction with its message and reaction time.
    let deadline = Instant::now() + Duration::from_secs(10);
    let eviction = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let e = events
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no eviction event: {}", agent.log()));
        if e["kind"] == "eviction" {
            break e;
        }
    };
    assert_eq!(eviction["event"]["pod"], "default/hog", "{eviction}");
    assert_eq!(
        eviction["event"]["signal"], "allocatableMemory.available",
        "{eviction}"
    );
    assert_eq!(eviction["event"]["message"], message, "{eviction}");
    assert_eq!(eviction["event"]["gracePeriodSeconds"], 0, "{eviction}");
    // The reaction time is from the kernel event that woke the decision; -1 when the loop's
    // own close watch (re-reading the signals every millisecond near the threshold) saw the
    // crossing first and no kernel event was involved.
    assert!(
        eviction["event"]["reactionNanos"]
            .as_i64()
            .is_some_and(|n| n >= -1),
        "{eviction}"
    );
    // A kill the kernel made at the crossing (killAtCrossing) names its process, and a
    // kernel record is behind it, so it is timed.
    let pid = eviction["event"]["killedAtCrossingPid"].as_u64();
    assert!(pid.is_some(), "{eviction}");
    if pid != Some(0) {
        assert!(
            eviction["event"]["reactionNanos"]
                .as_i64()
                .is_some_and(|n| n >= 0),
            "{eviction}"
        );
    }

    // One log line explains the decision.
    let log = agent.log();
    assert!(
        log.lines().any(|l| l.contains("eviction decision")
            && l.contains(r#""type":"evicted""#)
            && l.contains(r#""pod":"default/hog""#)),
        "{log}"
    );

    // Every family is on /metrics after the scenario, with this eviction counted.
    agent.wait("the device plugin's gauges", || {
        agent
            .scrape()
            .contains(r#"reactor_devices{resource="vendor.example/dev",health="healthy"} 2"#)
    });
    let text = agent.scrape();
    for family in FAMILIES {
        assert!(has_family(&text, family), "{family}:\n{text}");
    }
    assert_eq!(
        sample(
            &text,
            r#"reactor_evictions_total{signal="allocatableMemory.available",qos="BestEffort"}"#
        ),
        Some(1.0),
        "{text}"
    );
    // A decision woken by a kernel event is timed from it; one the close watch woke first
    // has no kernel event to time from (its reaction is -1 on the event stream).
    let timed = eviction["event"]["reactionNanos"]
        .as_i64()
        .is_some_and(|n| n >= 0);
    let reactions: f64 = ["ebpf", "psi", "memcg-threshold", "poll"]
        .iter()
        .filter_map(|s| {
            sample(
                &text,
                &format!(r#"reactor_reaction_lag_seconds_count{{source="{s}"}}"#),
            )
        })
        .sum();
    assert_eq!(reactions, if timed { 1.0 } else { 0.0 }, "{text}");
    assert_eq!(
        sample(
            &text,
            r#"reactor_eviction_threshold{signal="allocatableMemory.available",type="hard"}"#
        ),
        Some(f64::from(128u32 << 20)),
        "{text}"
    );
    assert!(
        sample(
            &text,
            r#"reactor_eviction_signal_value{signal="allocatableMemory.available"}"#
        )
        .is_some(),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"reactor_pod_admissions_total{result="rejected"}"#),
        Some(1.0),
        "{text}"
    );
}

/// `reactor status --json` says what the API says: the same conditions, signals with their
/// thresholds, sources, capacity and eviction order as `NodeStatus` and `ListPods` return to
/// a gRPC client of the agent's socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_json_matches_the_api() {
    if !ready() {
        return;
    }
    // One pass at start and the next a minute later: the status holds still while compared.
    let agent = TestAgent::start(
        "agent-status",
        "node: {memoryCapacity: 512Mi, cpuCapacity: '2'}\n\
         evictionHard: {allocatableMemory.available: 128Mi, pid.available: '100'}\n\
         evictionSoft: {memory.available: 10%}\n\
         evictionSoftGracePeriod: {memory.available: 1m30s}\n\
         evictionMinimumReclaim: {allocatableMemory.available: 32Mi}\n\
         housekeepingInterval: 60s\n",
    );
    agent.apply_ok(&pod(
        "small",
        json!({"requests": {"memory": "16Mi"}, "limits": {"memory": "64Mi"}}),
        &["8", "0"],
    ));
    agent.apply_ok(&pod("tiny", json!({}), &["4", "0"]));
    agent.wait("both pods to hold memory", || {
        agent.pods().iter().all(|p| {
            p["memoryWorkingSetBytes"]
                .as_u64()
                .is_some_and(|ws| ws >= 2 << 20)
        })
    });

    let channel = reactor::devices::dial_unix(&agent.socket).await.unwrap();
    let mut api = reactor_proto::reactor_v1::agent_client::AgentClient::new(channel);
    let status = api
        .node_status(reactor_proto::reactor_v1::NodeStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    let pods = api
        .list_pods(reactor_proto::reactor_v1::ListPodsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .pods;
    let out = agent.cli(&["status", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();

    // The loop has run its first pass: all three conditions, all false.
    let conditions: Vec<Value> = status
        .conditions
        .iter()
        .map(|c| {
            json!({"type": c.r#type, "status": c.status, "reason": c.reason,
                   "message": c.message, "lastTransitionUnixNanos": c.last_transition_unix_nanos})
        })
        .collect();
    assert_eq!(cli["conditions"], json!(conditions));
    assert_eq!(
        status
            .conditions
            .iter()
            .map(|c| (c.r#type.as_str(), c.status.as_str()))
            .collect::<Vec<_>>(),
        [
            ("MemoryPressure", "False"),
            ("DiskPressure", "False"),
            ("PIDPressure", "False")
        ]
    );
    let signals: Vec<Value> = status
        .signals
        .iter()
        .map(|s| {
            json!({"name": s.name, "available": s.available, "capacity": s.capacity,
                   "observedUnixNanos": s.observed_unix_nanos,
                   "thresholds": s.thresholds.iter().map(|t| json!({
                       "kind": t.kind, "value": t.value, "resolved": t.resolved,
                       "gracePeriod": t.grace_period, "minimumReclaim": t.minimum_reclaim,
                       "met": t.met, "metSinceUnixNanos": t.met_since_unix_nanos,
                   })).collect::<Vec<_>>()})
        })
        .collect();
    assert_eq!(cli["signals"], json!(signals));
    // Each configured threshold is there, resolved against the signal's capacity.
    let threshold = |signal: &str| -> Value {
        cli["signals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == signal)
            .unwrap_or_else(|| panic!("{signal} in {cli}"))["thresholds"][0]
            .clone()
    };
    let alloc = threshold("allocatableMemory.available");
    assert_eq!(
        (
            &alloc["kind"],
            &alloc["value"],
            &alloc["minimumReclaim"],
            &alloc["met"]
        ),
        (
            &json!("hard"),
            &json!("128Mi"),
            &json!("32Mi"),
            &json!(false)
        ),
        "{alloc}"
    );
    let soft = threshold("memory.available");
    assert_eq!(
        (&soft["kind"], &soft["value"], &soft["gracePeriod"]),
        (&json!("soft"), &json!("10%"), &json!("1m30s")),
        "{soft}"
    );
    assert_eq!(threshold("pid.available")["value"], "100");

    let sources: Vec<Value> = status
        .sources
        .iter()
        .map(|x| json!({"name": x.name, "attached": x.attached, "reason": x.reason}))
        .collect();
    assert_eq!(cli["sources"], json!(sources));
    let resources = status.resources.unwrap_or_default();
    for (key, map) in [
        ("capacity", &resources.capacity),
        ("allocatable", &resources.allocatable),
    ] {
        let want: serde_json::Map<String, Value> = map
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        assert_eq!(cli[key], Value::Object(want), "{key}");
    }
    assert_eq!(cli["cgroupVersion"], status.cgroup_version);
    assert_eq!(cli["cgroupRoot"], status.cgroup_root);

    // The eviction order is ListPods' memory ranking: the BestEffort pod first.
    let mut ranked: Vec<(u32, String)> = pods
        .iter()
        .filter_map(|p| {
            let r = p
                .eviction_rank
                .iter()
                .find(|r| r.signal == "memory.available")?;
            let name = p.pod.as_ref()?;
            Some((r.rank, format!("{}/{}", name.namespace, name.name)))
        })
        .collect();
    ranked.sort();
    let next: Vec<(u32, String)> = cli["nextToEvict"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                u32::try_from(n["rank"].as_u64().unwrap()).unwrap(),
                n["pod"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(next, ranked);
    assert_eq!(
        next.first().map(|(_, n)| n.as_str()),
        Some("default/tiny"),
        "{cli}"
    );
    assert_eq!(cli["nextToEvict"][0]["qos"], "BestEffort", "{cli}");
}

/// `memoryReclaim.enabled` on the host's cgroup v1: there is no `memory.reclaim`, so the
/// option does nothing but say so once at start, and the BestEffort hog is evicted before
/// the OOM killer exactly as with the option off, with no reclaim in its decision.
#[test]
fn memory_reclaim_on_v1_warns_once_and_eviction_is_unchanged() {
    if !ready() {
        return;
    }
    let agent = TestAgent::start(
        "agent-reclaim-v1",
        &format!("{NODE}memoryReclaim: {{enabled: true, timeout: 50ms}}\n"),
    );
    let hog = hog_evicted(&agent);
    for c in hog["containers"].as_array().unwrap() {
        assert_ne!(c["reason"], "OOMKilled", "{hog}");
    }
    // The decision is logged once the victim's cgroup has emptied, after its phase shows.
    agent.wait("the eviction decision in the log", || {
        agent
            .log()
            .lines()
            .any(|l| l.contains("eviction decision") && l.contains(r#""type":"evicted""#))
    });
    let log = agent.log();
    let warnings = log
        .lines()
        .filter(|l| l.contains("memoryReclaim.enabled has no effect on cgroup v1"))
        .count();
    assert_eq!(warnings, 1, "one warning at start:\n{log}");
    let evicted: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("eviction decision") && l.contains(r#""type":"evicted""#))
        .collect();
    assert!(!evicted.is_empty(), "{log}");
    for l in &evicted {
        assert!(
            !l.contains("memory_reclaim=") && !l.contains("outcome"),
            "no reclaim on v1: {l}"
        );
    }
    let text = agent.scrape();
    for outcome in reactor::record::metrics::MEMORY_RECLAIM_OUTCOMES {
        assert_eq!(
            sample(
                &text,
                &format!(r#"reactor_memory_reclaims_total{{outcome="{outcome}"}}"#)
            ),
            Some(0.0),
            "{text}"
        );
    }
}

/// The agent held off the CPU (SIGSTOP) while a workload crosses the eviction level, then let
/// go: the kernel's record of the crossing and the loop's timer are both due when its thread
/// comes back, and the pass they start is the record's (`source: ebpf`, with the kernel's
/// timestamp), not the timer's. A pod held close to the level keeps the loop's close watch
/// (every 100 ms) running and the charge programs attached; the crossing is made by a
/// process the test puts in kubepods itself, since the stopped agent cannot start a pod.
#[test]
fn a_crossing_recorded_while_the_agent_was_held_off_wakes_its_own_pass() {
    if !ready_with_btf() {
        return;
    }
    let agent = TestAgent::start(
        "agent-held-off",
        "log: {level: info, format: json}\n\
         node: {memoryCapacity: 512Mi, cpuCapacity: '2'}\n\
         evictionHard: {allocatableMemory.available: 128Mi}\n\
         housekeepingInterval: 1s\n\
         sense: {ebpf: true, psi: false, memcgThreshold: false, poll: false}\n",
    );
    // 360 MiB of the 512: 152 MiB available, within the close watch's margin of the 128 MiB
    // level and the charge programs' reach of it.
    agent.apply_ok(&pod("base", json!({}), &["360", "0"]));
    agent.wait("the pod close to the level", || {
        agent
            .pod("default/base")
            .and_then(|p| p["memoryWorkingSetBytes"].as_u64())
            .is_some_and(|ws| ws >= 355 << 20)
    });
    // A housekeeping pass (1 s) puts the loop on close watch.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        agent
            .pod("default/base")
            .is_some_and(|p| p["phase"] == "Running"),
        "nothing evicted before the crossing: {}",
        agent.log()
    );

    let spike_dir = agent.cgroup_dir("memory", "kubepods/held-off-spike");
    std::fs::create_dir(&spike_dir).expect("the spike's cgroup");
    let pid = rustix::process::Pid::from_raw(i32::try_from(agent.pid()).expect("pid"))
        .expect("the agent's pid");
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).expect("SIGSTOP");
    let spike = ChildGuard(
        spawn_in_cgroup(
            &spike_dir,
            Command::new(memhog_bin())
                .args(["48", "0", "3600"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .expect("start the spike"),
    );
    let usage = spike_dir.join("memory.usage_in_bytes");
    let started = Instant::now();
    while std::fs::read_to_string(&usage)
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .is_none_or(|u| u < 47 << 20)
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the spike never reached 47 MiB"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Past the level, with the agent still stopped: its close watch is overdue too.
    std::thread::sleep(Duration::from_millis(300));
    rustix::process::kill_process(pid, rustix::process::Signal::CONT).expect("SIGCONT");

    agent.wait("the pod to be evicted", || {
        agent
            .pod("default/base")
            .is_some_and(|p| p["phase"] == "Failed")
    });
    let evicted =
        |l: &&str| l.contains("eviction decision") && l.contains(r#"\"type\":\"evicted\""#);
    agent.wait("the eviction decision in the log", || {
        agent.log().lines().any(|l| evicted(&l))
    });
    drop(spike);
    let _ = std::fs::remove_dir(&spike_dir);
    let log = agent.log();
    let decision = log.lines().find(evicted).unwrap_or_default();
    let fields = serde_json::from_str::<Value>(decision)
        .map(|v| v["fields"].clone())
        .unwrap_or(Value::Null);
    assert_eq!(
        fields["source"],
        "ebpf",
        "the pass is the kernel record's, not the timer's: {decision}\nthen:\n{}",
        log.lines()
            .filter(|l| l.contains("pressure event") || l.contains("eviction decision"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_ne!(fields["detection_lag"], "-", "{decision}");
}

/// Issue 42: a node whose kubepods has filled with page cache is a calm node. A file written
/// once (768 MiB through a 512 MiB kubepods) leaves kubepods at its limit, nearly all of it
/// inactive file, its working set far from the level: the charge program stays off its
/// tracepoint, and `reactor status` says why. A BestEffort hog then grows by reclaiming
/// that cache (usage flat at the limit, the working set rising): the program comes on as the
/// working set nears the level and the hog is evicted before any kernel OOM kill.
#[test]
fn a_node_full_of_page_cache_is_calm_and_its_hog_is_still_evicted_before_the_oom_killer() {
    if !ready_with_btf() {
        return;
    }
    let agent = TestAgent::start(
        "agent-cache-full",
        "node: {memoryCapacity: 512Mi, cpuCapacity: '2'}\n\
         evictionHard: {allocatableMemory.available: 128Mi}\n\
         sense: {ebpf: true, psi: false, memcgThreshold: true}\n",
    );
    // The cache's writer runs in a cgroup of its own under kubepods and exits: what it
    // leaves is clean page cache charged to kubepods.
    let writer_dir = agent.cgroup_dir("memory", "kubepods/cache-writer");
    std::fs::create_dir(&writer_dir).expect("the writer's cgroup");
    let _file = reactor_tests::fill_page_cache(&writer_dir, 768 << 20)
        .expect("filling kubepods with page cache");
    let _ = std::fs::remove_dir(&writer_dir);
    let stat = agent.read("memory", "kubepods", "memory.stat");
    let value = |key: &str| {
        reactor::observe::cgroupfs::stat_value(&stat, key)
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("{key} in kubepods' memory.stat: {stat}"))
    };
    let (usage, inactive) = (
        agent
            .read("memory", "kubepods", "memory.usage_in_bytes")
            .trim()
            .parse::<u64>()
            .expect("kubepods' usage"),
        value("total_inactive_file"),
    );
    // At its limit, and its working set (usage - inactive file) far from the 384 MiB level:
    // more than the 64 MiB least reach below it, so only the page cache brings its usage
    // near. How much of the cache the kernel counts inactive varies with what reclaim did
    // during the fill (a refault it judges recent goes straight to the active list): a CI run
    // under the suite's load read half of it active, and the program must stay off all the
    // same.
    let working_set = usage.saturating_sub(inactive);
    assert!(
        usage >= 480 << 20 && working_set <= 300 << 20,
        "kubepods should be full of page cache, its working set far from the level: usage \
         {usage}, inactive file {inactive}"
    );
    eprintln!(
        "kubepods: usage {} MiB, {:.0} % of it inactive file",
        usage >> 20,
        inactive as f64 * 100.0 / usage.max(1) as f64
    );

    // The status says the program is off for kubepods, and why; it stays off.
    let charge = || agent.charge_watch("kubepods");
    agent.wait("the status to report kubepods' charge program", || {
        charge().is_some_and(|w| w["state"] == "cached")
    });
    std::thread::sleep(Duration::from_secs(2));
    let watch = charge().expect("kubepods watched");
    assert_eq!(
        (&watch["on"], &watch["state"]),
        (&json!(false), &json!("cached")),
        "a kubepods full of page cache armed the charge program: {watch}"
    );
    let out = agent.cli(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.starts_with("charge program /")
            && l.contains("/kubepods: off (")
            && l.contains("inactive page cache")),
        "{text}"
    );

    // 600 MiB at 350 MiB/s, every page of it reclaimed from the cache.
    hog_evicted(&agent);
    let oom = agent.read("memory", "kubepods", "memory.oom_control");
    assert!(
        oom.lines().any(|l| l == "oom_kill 0"),
        "the kernel's OOM killer ran before the agent evicted: {oom}\n{}",
        agent.log()
    );
}
