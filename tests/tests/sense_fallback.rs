//! The sense layer without eBPF, on the real kernel: memcg notifications and PSI triggers
//! must both report pressure that a test drives inside its own 64 MiB v1 memory cgroup, and
//! `reactor watch --json` must print those events as parseable JSON lines.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use reactor::config::Config;
use reactor::sense::{Kind, MemcgTarget, Sense, SenseOptions, Source};
use reactor_tests::{is_root, memhog_bin, reactor_bin, require, TestMemcg, MEMCG_V1_ROOT};

const LIMIT: u64 = 64 << 20;
const THRESHOLD: u64 = 32 << 20;

fn require_kernel() -> bool {
    require(is_root(), "root for cgroup v1 memory and PSI triggers")
        && require(
            Path::new(MEMCG_V1_ROOT)
                .join("cgroup.event_control")
                .exists(),
            "the cgroup v1 memory controller",
        )
        && require(
            Path::new("/proc/pressure/memory").exists(),
            "PSI (/proc/pressure/memory)",
        )
}

/// A disk-backed file the cgroup's page cache cannot hold next to the hog (tmpfs would be
/// unreclaimable shmem): written from inside the cgroup so its pages are charged there.
fn make_cache_file(cg: &mut TestMemcg, dir: &Path) -> PathBuf {
    let file = dir.join("working-set.bin");
    cg.spawn(Command::new("dd").args([
        "if=/dev/zero",
        &format!("of={}", file.display()),
        "bs=1M",
        "count=64",
        "status=none",
    ]))
    .expect("spawn dd");
    let statuses = cg.wait_all(Duration::from_secs(60));
    assert!(
        statuses
            .last()
            .copied()
            .flatten()
            .is_some_and(|s| s.success()),
        "dd wrote the working set: {statuses:?}"
    );
    file
}

/// Memory pressure inside `cg`, in three steps: a hog holds 52 of the 64 MiB (crossing the
/// threshold), a reader streams a 64 MiB file through the ~12 MiB left so the cgroup reclaims
/// and refaults its page cache (memory stall the PSI trigger counts), and once the PSI
/// trigger has been seen (or the reader is done) a second hog goes past the limit (OOM kill).
fn drive_pressure(cg: &mut TestMemcg, file: &Path, psi_seen: &AtomicBool) {
    let first = cg.wait_all(Duration::ZERO).len();
    cg.spawn(Command::new(memhog_bin()).args(["52", "0", "120"]))
        .expect("spawn holding hog");
    std::thread::sleep(Duration::from_millis(500));
    let script = format!(
        "for i in $(seq 40); do cat '{}' > /dev/null; done",
        file.display()
    );
    cg.spawn(Command::new("sh").args(["-c", &script]))
        .expect("spawn reader");
    let reader = first + 1;
    let started = Instant::now();
    while !psi_seen.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(20) {
        if cg.wait_all(Duration::ZERO)[reader].is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cg.spawn(Command::new(memhog_bin()).args(["256", "0", "120"]))
        .expect("spawn OOM hog");
}

#[test]
fn memcg_and_psi_report_pressure_without_ebpf() {
    if !require_kernel() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut cg = TestMemcg::new("fallback", LIMIT).expect("create test memcg");
    let cg_path = cg.path.clone();
    let cgroup = cg.cgroup.clone();
    let dir = tempfile::tempdir_in("/var/tmp").expect("temp dir on disk");
    let file = make_cache_file(&mut cg, dir.path());

    let mut opts = SenseOptions::from_config(
        &Config::default(),
        vec![MemcgTarget {
            cgroup: cgroup.clone(),
            threshold_bytes: Some(THRESHOLD),
        }],
    );
    opts.ebpf = false;
    opts.poll = false;

    let psi_seen = Arc::new(AtomicBool::new(false));
    let (sense, events, cg) = runtime.block_on(async {
        let mut sense = Sense::start(&opts).expect("sense starts");
        let report = sense.report().clone();
        assert!(report.has(Source::Psi), "{report:?}");
        assert!(report.has(Source::MemcgThreshold), "{report:?}");
        assert!(!report.has(Source::Ebpf), "{report:?}");
        assert!(
            report
                .missing
                .iter()
                .any(|m| m.source == Source::Ebpf && m.reason.contains("switched off")),
            "{report:?}"
        );

        let flag = psi_seen.clone();
        let workload = std::thread::spawn(move || {
            drive_pressure(&mut cg, &file, &flag);
            cg
        });

        let mut events = Vec::new();
        let (mut crossed_up, mut oom, mut psi) = (false, false, false);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !(crossed_up && oom && psi) {
            let next = tokio::time::timeout_at(deadline, sense.next()).await;
            let Ok(Some(r)) = next else {
                break;
            };
            let e = &r.event;
            match (&e.source, &e.kind) {
                (Source::MemcgThreshold, Kind::ThresholdCrossed { usage_bytes, .. }) => {
                    assert_eq!(e.cgroup.as_deref(), Some(cgroup.as_str()));
                    crossed_up |= usage_bytes.is_some_and(|u| u >= THRESHOLD);
                }
                (Source::MemcgThreshold, Kind::OomKill { .. }) => {
                    assert_eq!(e.cgroup.as_deref(), Some(cgroup.as_str()));
                    oom = true;
                }
                (Source::MemcgThreshold, Kind::MemcgEvent { item, .. }) if item == "oom" => {
                    oom = true;
                }
                (Source::Psi, Kind::PsiTrigger { .. }) => {
                    psi = true;
                    psi_seen.store(true, Ordering::SeqCst);
                }
                _ => {}
            }
            events.push(r);
        }
        psi_seen.store(true, Ordering::SeqCst);
        let cg = workload.join().expect("workload thread");
        (sense, events, cg)
    });
    let lag = sense.lag().clone();
    runtime.block_on(sense.shutdown());
    drop(cg);

    let summary: Vec<String> = events
        .iter()
        .map(|r| format!("{} {} {}", r.event.source, r.event.kind, r.lag_ns))
        .collect();
    let has = |pred: &dyn Fn(&reactor::sense::Received) -> bool| events.iter().any(pred);
    assert!(
        has(
            &|r| matches!(r.event.kind, Kind::ThresholdCrossed { usage_bytes: Some(u), .. } if u >= THRESHOLD)
        ),
        "threshold eventfd reported the crossing: {summary:#?}"
    );
    assert!(
        has(&|r| r.event.source == Source::MemcgThreshold
            && matches!(
                &r.event.kind,
                Kind::OomKill { .. } | Kind::MemcgEvent { .. }
            )),
        "OOM eventfd reported the OOM: {summary:#?}"
    );
    assert!(
        has(&|r| r.event.source == Source::Psi
            && matches!(&r.event.kind, Kind::PsiTrigger { level, .. } if level == "some" || level == "full")),
        "PSI trigger fired: {summary:#?}"
    );
    for source in [Source::MemcgThreshold, Source::Psi] {
        let h = lag.histogram(source).expect("lag recorded");
        assert!(h.count() > 0, "{source}");
        assert!(h.snapshot(source).max_ns >= h.snapshot(source).p50_ns);
    }
    assert!(!cg_path.exists(), "test cgroup removed");
}

/// A cgroup v2 directory of the unified hierarchy, removed on drop.
struct V2Cgroup(PathBuf);

impl Drop for V2Cgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            if std::fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// On this hybrid node the memory controller is on v1, but every v2 cgroup still has its own
/// `memory.pressure`. Processes limited by a v1 memcg and placed in a v2 cgroup thrash; a
/// per-cgroup trigger armed through the v2 path must fire and name that cgroup.
#[test]
fn cgroup_v2_memory_pressure_trigger_fires() {
    let unified = Path::new("/sys/fs/cgroup/unified");
    if !require_kernel()
        || !require(
            unified.join("cgroup.procs").exists(),
            "cgroup2 at /sys/fs/cgroup/unified",
        )
    {
        return;
    }
    let v2_name = format!("/reactor-test-v2psi-{}", std::process::id());
    let v2 = V2Cgroup(unified.join(&v2_name[1..]));
    std::fs::create_dir(&v2.0).expect("create v2 cgroup");
    let mut cg = TestMemcg::new("v2psi", LIMIT).expect("create test memcg");
    let dir = tempfile::tempdir_in("/var/tmp").expect("temp dir on disk");
    let file = make_cache_file(&mut cg, dir.path());

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut opts = SenseOptions::from_config(
        &Config::default(),
        vec![MemcgTarget {
            cgroup: v2_name.clone(),
            threshold_bytes: None,
        }],
    );
    opts.ebpf = false;
    opts.memcg = false;
    opts.poll = false;
    opts.hierarchy = Some(reactor::sense::MemoryHierarchy::V2(unified.to_path_buf()));

    let procs = v2.0.join("cgroup.procs");
    let stop = Arc::new(AtomicBool::new(false));
    let stop_workload = stop.clone();
    let fired = runtime.block_on(async {
        let mut sense = Sense::start(&opts).expect("sense starts");
        let report = sense.report().clone();
        assert!(
            report.attached.iter().any(|a| a.source == Source::Psi
                && a.what
                    .contains(&format!("{}/memory.pressure", v2.0.display()))),
            "{report:?}"
        );
        let workload = std::thread::spawn(move || {
            let stop = stop_workload;
            let hog = cg
                .spawn(Command::new(memhog_bin()).args(["52", "0", "120"]))
                .expect("spawn holding hog");
            std::fs::write(&procs, hog.to_string()).expect("hog joins the v2 cgroup");
            std::thread::sleep(Duration::from_millis(500));
            // The reader joins the v2 cgroup itself before it starts reading.
            let script = format!(
                "echo $$ > '{}'; for i in $(seq 40); do cat '{}' > /dev/null; done",
                procs.display(),
                file.display()
            );
            cg.spawn(Command::new("sh").args(["-c", &script]))
                .expect("spawn reader");
            let started = Instant::now();
            while !stop.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(50));
            }
            cg
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut fired = None;
        while let Ok(Some(r)) = tokio::time::timeout_at(deadline, sense.next()).await {
            if r.event.cgroup.as_deref() == Some(v2_name.as_str()) {
                fired = Some(r);
                break;
            }
        }
        sense.shutdown().await;
        stop.store(true, Ordering::SeqCst);
        // Ends the workload (kills the hog and reader) once the thread hands the cgroup back.
        drop(workload.join().expect("workload thread"));
        fired
    });
    let r = fired.expect("the v2 cgroup's memory.pressure trigger fired");
    assert_eq!(r.event.source, Source::Psi);
    assert!(matches!(r.event.kind, Kind::PsiTrigger { .. }), "{r:?}");
}

/// Kills the watched process on drop if the test fails before it stops it.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn lines_of(stream: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

#[test]
fn watch_json_prints_memcg_events_and_lag_summary() {
    if !require_kernel() {
        return;
    }
    let mut cg = TestMemcg::new("watch", LIMIT).expect("create test memcg");
    let mut watch = ChildGuard(
        Command::new(reactor_bin())
            .args([
                "watch",
                "--json",
                "--no-ebpf",
                "--cgroup",
                &cg.cgroup,
                "--threshold",
                "32Mi",
                "--interval",
                "1s",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start reactor watch"),
    );
    let stdout = lines_of(watch.0.stdout.take().unwrap());
    let stderr = lines_of(watch.0.stderr.take().unwrap());

    let parse = |line: &str| -> serde_json::Value {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?} is not JSON: {e}"));
        let source = v["source"].as_str().expect("source named");
        assert!(
            ["ebpf", "psi", "memcg-threshold", "poll"].contains(&source),
            "{line}"
        );
        assert!(v["lag_ns"].as_u64().is_some(), "{line}");
        assert!(v["at_ns"].as_u64().is_some(), "{line}");
        assert!(v["kind"]["type"].as_str().is_some(), "{line}");
        v
    };

    // The first tick comes right after every source attached.
    let first = stdout
        .recv_timeout(Duration::from_secs(30))
        .expect("a first event from reactor watch");
    parse(&first);

    cg.spawn(Command::new(memhog_bin()).args(["256", "0", "60"]))
        .expect("spawn hog");
    let (mut crossed, mut oom) = (false, false);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = vec![first];
    while !(crossed && oom) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = stdout.recv_timeout(left) else {
            break;
        };
        let v = parse(&line);
        if v["source"] == "memcg-threshold" {
            assert_eq!(v["cgroup"].as_str(), Some(cg.cgroup.as_str()), "{line}");
            crossed |= v["kind"]["type"] == "threshold-crossed"
                && v["kind"]["threshold_bytes"] == THRESHOLD;
            oom |= v["kind"]["type"] == "oom-kill"
                || (v["kind"]["type"] == "memcg-event" && v["kind"]["item"] == "oom");
        }
        seen.push(line);
    }
    assert!(crossed, "threshold crossing printed: {seen:#?}");
    assert!(oom, "OOM printed: {seen:#?}");

    let pid = rustix::process::Pid::from_child(&watch.0);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = watch.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "watch stops on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let err: Vec<String> = stderr.try_iter().collect();
    let text = err.join("\n");
    assert!(text.contains("detection lag per source:"), "{text}");
    assert!(
        err.iter()
            .any(|l| l.trim_start().starts_with("memcg-threshold") && l.contains("p99=")),
        "{text}"
    );
    assert!(text.contains("eBPF") || text.contains("ebpf"), "{text}");
}

/// The loop moves a v1 usage threshold as the page cache moves; the registration (which waits
/// for an RCU grace period in the kernel) runs off the runtime's thread, and the threshold
/// then fires at its new level. A current-thread runtime, like the reactor loop's one
/// worker: the sense tasks share it.
#[test]
fn a_moved_v1_threshold_fires_at_its_new_level() {
    if !require_kernel() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut cg = TestMemcg::new("fallback-move", 256 << 20).expect("create test memcg");
    let target = MemcgTarget {
        cgroup: cg.cgroup.clone(),
        threshold_bytes: Some(200 << 20),
    };
    let mut opts = SenseOptions::from_config(&Config::default(), vec![target.clone()]);
    opts.ebpf = false;
    opts.psi = false;
    opts.poll = false;
    let moved_to: u64 = 24 << 20;
    runtime.block_on(async {
        let mut sense = Sense::start(&opts).expect("sense starts");
        sense
            .memcg_thresholds()
            .set(&target, reactor::sense::memcg::Level::usage(moved_to));
        // Let the registration finish before usage passes the new level.
        tokio::time::sleep(Duration::from_millis(500)).await;
        cg.spawn(Command::new(memhog_bin()).args(["48", "200", "30"]))
            .expect("memhog starts");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let mut crossed = None;
        while crossed.is_none() {
            let Ok(Some(r)) = tokio::time::timeout_at(deadline, sense.next()).await else {
                break;
            };
            if let Kind::ThresholdCrossed {
                threshold_bytes,
                usage_bytes,
                ..
            } = r.event.kind
            {
                crossed = Some((threshold_bytes, usage_bytes));
            }
        }
        cg.kill_all();
        let _ = sense.shutdown().await;
        let (threshold, usage) = crossed.expect("a threshold-crossed event within 20 s");
        assert_eq!(threshold, Some(moved_to), "the event names the moved level");
        assert!(
            usage.is_some_and(|u| u >= moved_to && u < 200 << 20),
            "usage at the event is past the new level, far below the old: {usage:?}"
        );
    });
}
