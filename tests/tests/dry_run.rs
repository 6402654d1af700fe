//! `dryRun: true` on the real kernel (issue 39): `reactor run` on a modelled 512 MiB node
//! (its own cgroup root, kubepods limited to the allocatable memory), the eBPF sources on, a
//! BestEffort hog growing past the hard threshold. The agent records the eviction it would
//! make — once, with the kubelet's message, marked a dry run — in the event stream, the
//! decision log, `reactor status` and `/metrics`, and kills nothing: the hog keeps running
//! past the point it would have been evicted, and the charge program's staged victim (its
//! `VICTIM` map, read from the kernel by map id) stays empty throughout. A control run
//! without `dryRun` shows the same probe sees a victim staged and the hog evicted.
//!
//! Memory pressure stays inside the test's own kubepods cgroup (its limit is the modelled
//! node's 512 MiB); the hog holds 440 MiB, past the 384 MiB where the threshold is met and
//! under the limit. Should the kernel's OOM killer take it inside that cgroup anyway (the
//! agent does not prevent it in a dry run), that is allowed: the hog is then `OOMKilled`,
//! never `Evicted`.
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reactor_tests::agent::TestAgent;
use reactor_tests::exposition::sample;
use reactor_tests::{is_root, memhog_bin, message_container_usage, reactor_bin, require};
use serde_json::{json, Value};

/// A 512 MiB node whose pods may use all of it, evicting when less than 128 MiB of it is
/// left (kubepods' usage 384 MiB); eBPF and the memcg notification wake the loop.
const NODE: &str = "node: {memoryCapacity: 512Mi, cpuCapacity: '2'}\n\
                    evictionHard: {allocatableMemory.available: 128Mi}\n\
                    housekeepingInterval: 1s\n\
                    sense: {ebpf: true, psi: false, memcgThreshold: true}\n";

/// The size of [`agent_ebpf::StagedVictim`] as the kernel holds it: cgroup id, level, slots,
/// staged at, max age.
const STAGED_VICTIM_BYTES: usize = 32;

fn ready() -> bool {
    require(is_root(), "root, to create cgroups and run pods")
        && require(
            Path::new("/sys/fs/cgroup/memory/memory.oom_control").exists(),
            "cgroup v1 memory hierarchy under /sys/fs/cgroup",
        )
        && require(
            Path::new("/sys/kernel/btf/vmlinux").exists(),
            "kernel BTF at /sys/kernel/btf/vmlinux (eBPF)",
        )
        && require(
            memhog_bin().exists() && reactor_bin().exists(),
            "the reactor and memhog binaries (cargo build --workspace --bins)",
        )
}

/// A BestEffort pod allocating `mib` MiB at `rate` MiB/s, then holding it.
fn hog(mib: u32, rate: u32) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "hog", "namespace": "default"},
           "spec": {"terminationGracePeriodSeconds": 5, "restartPolicy": "Never",
                    "containers": [{"name": "app",
                                    "command": [memhog_bin().display().to_string(),
                                                mib.to_string(), rate.to_string()]}]}})
}

/// The agent's staged-victim map: the BPF map named `VICTIM` among the agent process's own
/// file descriptors (its map ids from `/proc/<pid>/fdinfo`), opened by id.
fn victim_map(agent_pid: u32) -> aya::maps::Array<aya::maps::MapData, [u8; STAGED_VICTIM_BYTES]> {
    let fdinfo = format!("/proc/{agent_pid}/fdinfo");
    let ids: Vec<u32> = std::fs::read_dir(&fdinfo)
        .unwrap_or_else(|e| panic!("{fdinfo}: {e}"))
        .filter_map(Result::ok)
        .filter_map(|f| std::fs::read_to_string(f.path()).ok())
        .filter_map(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("map_id:"))
                .and_then(|id| id.trim().parse().ok())
        })
        .collect();
    let id = ids
        .iter()
        .copied()
        .find(|&id| {
            aya::maps::MapInfo::from_id(id).is_ok_and(|info| info.name_as_str() == Some("VICTIM"))
        })
        .unwrap_or_else(|| panic!("no VICTIM map among the agent's maps {ids:?}"));
    let info = aya::maps::MapInfo::from_id(id).expect("map info");
    assert_eq!(
        info.value_size() as usize,
        STAGED_VICTIM_BYTES,
        "StagedVictim's size"
    );
    let data = aya::maps::MapData::from_id(id).expect("open the VICTIM map by id");
    aya::maps::Array::try_from(aya::maps::Map::Array(data)).expect("VICTIM is an array")
}

/// Reads the staged-victim map every 500 µs on a thread of its own until stopped; counts
/// the reads and the reads that found a victim staged (a non-zero cgroup id).
struct StageProbe {
    stop: Arc<AtomicBool>,
    reads: Arc<AtomicU64>,
    staged: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StageProbe {
    fn start(agent_pid: u32) -> StageProbe {
        let map = victim_map(agent_pid);
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let staged = Arc::new(AtomicU64::new(0));
        let (s, r, st) = (stop.clone(), reads.clone(), staged.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Ok(v) = map.get(&0, 0) {
                    r.fetch_add(1, Ordering::Relaxed);
                    let cgroup_id = u64::from_ne_bytes(v[..8].try_into().unwrap_or([0; 8]));
                    if cgroup_id != 0 {
                        st.fetch_add(1, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_micros(500));
            }
        });
        StageProbe {
            stop,
            reads,
            staged,
            thread: Some(thread),
        }
    }

    /// Stops it: (reads, reads that found a victim staged).
    fn finish(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        (
            self.reads.load(Ordering::Relaxed),
            self.staged.load(Ordering::Relaxed),
        )
    }
}

/// Every event received within `for_`.
fn drain(rx: &std::sync::mpsc::Receiver<Value>, for_: Duration) -> Vec<Value> {
    let deadline = Instant::now() + for_;
    let mut out = Vec::new();
    while let Ok(e) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        out.push(e);
    }
    out
}

#[test]
fn a_dry_run_records_the_hog_it_would_evict_and_kills_nothing() {
    if !ready() {
        return;
    }
    let agent = TestAgent::start("dry-run", &format!("{NODE}dryRun: true\n"));
    let probe = StageProbe::start(agent.pid());
    let (_events_child, events) = agent.follow_events(None);
    agent.apply_ok(&hog(440, 200));

    // The would-be eviction: one event, marked a dry run, with the kubelet's message.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    let would = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let e = events
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no dry-run eviction event: {seen:?}\n{}", agent.log()));
        if e["kind"] == "eviction" {
            break e;
        }
        seen.push(e);
    };
    let recorded_at = Instant::now();
    let ev = &would["event"];
    assert_eq!(ev["dryRun"], true, "{would}");
    assert_eq!(ev["pod"], "default/hog", "{would}");
    assert_eq!(ev["signal"], "allocatableMemory.available", "{would}");
    assert_eq!(ev["gracePeriodSeconds"], 0, "{would}");
    assert_eq!(ev["killedAtCrossingPid"], 0, "{would}");
    let message = ev["message"].as_str().unwrap().to_string();
    assert!(
        message.starts_with(
            "The node was low on resource: memory. Threshold quantity: 128Mi, available: "
        ),
        "{message}"
    );
    let usage_at_record = message_container_usage(&message, "app").unwrap_or(0);
    assert!(usage_at_record >= 128 << 20, "{message}");

    // The hog keeps running past the point it would have been evicted: its working set grows
    // beyond what it used when the record was made (or the kernel's OOM killer takes it in
    // its own cgroup: allowed, never an eviction).
    agent.wait("the hog to grow past its recorded usage", || {
        agent.pod("default/hog").is_some_and(|p| {
            let oom = p["containers"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["reason"] == "OOMKilled"));
            let grew = p["memoryWorkingSetBytes"]
                .as_u64()
                .is_some_and(|ws| i128::from(ws) >= usage_at_record + (32 << 20));
            oom || (p["phase"] == "Running" && grew)
        })
    });
    // Hold the pressure a while: the episode stays open (the hog holds 440 MiB), and the
    // passes in it record nothing more.
    let later = drain(&events, Duration::from_secs(3));
    let hog = agent.pod("default/hog").expect("the hog is listed");
    eprintln!("hog {:?} after the record: {hog}", recorded_at.elapsed());
    assert_ne!(hog["reason"], "Evicted", "{hog}");
    let oom_killed = hog["containers"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["reason"] == "OOMKilled"));
    if !oom_killed {
        assert_eq!(hog["phase"], "Running", "{hog}");
        assert!(
            hog["memoryWorkingSetBytes"]
                .as_u64()
                .is_some_and(|ws| ws >= 400 << 20),
            "{hog}"
        );
    }
    let evictions: Vec<&Value> = later.iter().filter(|e| e["kind"] == "eviction").collect();
    assert!(
        evictions.is_empty(),
        "one record per pod per episode, and no real eviction: {evictions:?}"
    );
    // The eBPF threshold fired (the loop was woken by the kernel) and killed nothing.
    let pressure: Vec<String> = seen
        .iter()
        .chain(&later)
        .filter(|e| e["kind"] == "pressure")
        .filter_map(|e| e["event"]["kind"].as_str().map(str::to_string))
        .collect();
    eprintln!("pressure events: {pressure:?}");
    assert!(
        pressure.iter().any(|k| k.starts_with("threshold-crossed")),
        "{pressure:?}"
    );
    assert!(
        pressure.iter().all(|k| !k.contains("killed-at-crossing")),
        "{pressure:?}"
    );

    // `reactor status`: the dry run, and the open episode's would-be eviction.
    let out = agent.cli(&["status", "--json"]);
    let status: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(status["dryRun"], true, "{status}");
    if !oom_killed {
        let open = status["wouldEvict"].as_array().expect("wouldEvict");
        assert_eq!(open.len(), 1, "{status}");
        assert_eq!(open[0]["pod"], "default/hog", "{status}");
        assert_eq!(open[0]["message"], message.as_str(), "{status}");
    }
    let text = String::from_utf8_lossy(&agent.cli(&["status"]).stdout).to_string();
    assert!(text.contains("dry run: on"), "{text}");

    // The log: the decision, marked, with the would-be eviction; and no staging.
    let log = agent.log();
    assert!(
        log.contains("dry run: no victim is staged for a kill at the crossing"),
        "{log}"
    );
    let decisions: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("eviction decision") && l.contains(r#""type":"wouldEvict""#))
        .collect();
    assert_eq!(decisions.len(), 1, "{log}");
    assert!(decisions[0].contains("dry_run=true"), "{}", decisions[0]);
    assert!(!log.contains(r#""type":"evicted""#), "{log}");

    // The metrics: one would-be eviction, none made.
    let metrics = agent.scrape();
    let series = |family: &str| {
        sample(
            &metrics,
            &format!(r#"{family}{{signal="allocatableMemory.available",qos="BestEffort"}}"#),
        )
    };
    assert_eq!(sample(&metrics, "reactor_dry_run"), Some(1.0), "{metrics}");
    assert_eq!(
        series("reactor_dry_run_evictions_total"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(series("reactor_evictions_total"), Some(0.0), "{metrics}");

    // The charge program's stage was read throughout and never held a victim.
    let (reads, staged) = probe.finish();
    eprintln!("staged-victim map: {reads} reads, {staged} with a victim");
    assert!(reads >= 1000, "the probe read the map {reads} times");
    assert_eq!(staged, 0, "a victim was staged in a dry run");
}

/// The control for the probe above: the same node and hog without `dryRun`. The probe sees a
/// victim staged, and the hog is evicted.
#[test]
fn without_a_dry_run_the_same_probe_sees_the_hog_staged() {
    if !ready() {
        return;
    }
    let agent = TestAgent::start("dry-run-control", NODE);
    let probe = StageProbe::start(agent.pid());
    agent.apply_ok(&hog(440, 200));
    agent.wait("the hog to be evicted", || {
        agent
            .pod("default/hog")
            .is_some_and(|p| p["reason"] == "Evicted")
    });
    let (reads, staged) = probe.finish();
    eprintln!("staged-victim map: {reads} reads, {staged} with a victim");
    assert!(staged >= 1, "{reads} reads, none with a victim staged");
    let metrics = agent.scrape();
    assert_eq!(sample(&metrics, "reactor_dry_run"), Some(0.0), "{metrics}");
}

/// A pod running `sleep` with a memory request (empty: BestEffort).
fn sleeper(name: &str, request: &str, priority: Option<i32>) -> Value {
    let requests = if request.is_empty() {
        json!({})
    } else {
        json!({"memory": request})
    };
    let mut spec = json!({"terminationGracePeriodSeconds": 2,
                          "containers": [{"name": "main", "command": ["sleep", "600"],
                                          "resources": {"requests": requests}}]});
    if let Some(p) = priority {
        spec["priority"] = json!(p);
    }
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default"}, "spec": spec})
}

/// A critical pod that fits only by preempting: in a dry run the preemption is recorded
/// (event, metric), the victim keeps running, and the critical pod is refused with the
/// kubelet's reason, its message naming who would have been preempted.
#[test]
fn a_dry_run_records_the_preemption_and_stops_nothing() {
    if !ready() {
        return;
    }
    // Allocatable for admission: 1Gi - 100Mi (hard eviction threshold) = 924Mi.
    let agent = TestAgent::start(
        "dry-run-preempt",
        "node: {memoryCapacity: 1Gi, cpuCapacity: '2'}\n\
         evictionHard: {memory.available: 100Mi}\ndryRun: true\n",
    );
    let (_events_child, events) = agent.follow_events(Some("preemption"));
    for (name, request) in [("be", ""), ("small", "200Mi"), ("big", "600Mi")] {
        agent.apply_ok(&sleeper(name, request, None));
    }
    let small_cg = agent.pod("default/small").unwrap()["cgroup"]
        .as_str()
        .unwrap()
        .to_string();
    let app = format!("{small_cg}/main");
    agent.wait("small running", || agent.procs(&app).len() == 1);
    let small_pid = agent.procs(&app)[0];

    let out = agent.apply(
        "crit.json",
        &sleeper("crit", "300Mi", Some(2_000_000_000)).to_string(),
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["admitted"], false, "{answer}");
    assert_eq!(answer["reason"], "OutOfmemory", "{answer}");
    assert_eq!(
        answer["message"],
        format!(
            "Node didn't have enough resource: memory, requested: {}, used: {}, capacity: {} \
             (dry run: admitting it would have preempted default/small)",
            300u64 << 20,
            800u64 << 20,
            924u64 << 20
        ),
        "{answer}"
    );
    let e = events
        .recv_timeout(Duration::from_secs(10))
        .expect("a preemption event");
    assert_eq!(e["event"]["dryRun"], true, "{e}");
    assert_eq!(e["event"]["preemptor"], "default/crit", "{e}");
    assert_eq!(e["event"]["victims"], json!(["default/small"]), "{e}");

    // Nothing was stopped.
    std::thread::sleep(Duration::from_millis(500));
    let small = agent.pod("default/small").unwrap();
    assert_eq!(small["phase"], "Running", "{small}");
    assert_eq!(
        agent.procs(&app),
        [small_pid],
        "the victim's process is the same"
    );
    let metrics = agent.scrape();
    assert_eq!(
        sample(&metrics, "reactor_dry_run_preemptions_total"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "reactor_preemptions_total"),
        Some(0.0),
        "{metrics}"
    );
}

/// `reactor run --dry-run` is `dryRun: true`: the agent says so at start and on `/metrics`
/// and in `reactor status`, with the config file saying nothing of it.
#[test]
fn the_run_flag_turns_the_dry_run_on() {
    if !ready() {
        return;
    }
    let agent = TestAgent::start_with_args("dry-run-flag", NODE, &["--dry-run"]);
    let metrics = agent.scrape();
    assert_eq!(sample(&metrics, "reactor_dry_run"), Some(1.0), "{metrics}");
    let out = agent.cli(&["status", "--json"]);
    let status: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(status["dryRun"], true, "{status}");
    let log = agent.log();
    assert!(
        log.contains("dry run: the agent observes and decides"),
        "{log}"
    );
}
