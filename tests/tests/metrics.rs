//! `reactor run` serves its Prometheus metrics: the agent runs as a process with eBPF on, a
//! memory hog OOMs in a test memcg that is the agent's `cgroupRoot`, and a scrape of
//! `/metrics` over HTTP shows every family, the events and detection lags of the sources that
//! fired, and the kernel OOM kill. SIGTERM ends the agent cleanly and closes the endpoint.
//!
//! Needs root, tracefs and BTF; in CI (`CI=true`) a missing piece fails instead of skipping.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use reactor::record::metrics::{FAMILIES, FAMILIES_AFTER_FIRST_USE};
use reactor::sense::ebpf::tracefs;
use reactor_tests::exposition::{has_family, sample};
use reactor_tests::{is_root, memhog_bin, reactor_bin, require, ChildGuard, TestMemcg};
use serde_json::Value;

fn can_run() -> bool {
    require(is_root(), "root (eBPF and cgroup v1 memory notifications)")
        && require(
            tracefs::root().is_some(),
            "tracefs mounted at /sys/kernel/tracing (cargo xtask setup mounts it)",
        )
        && require(
            std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
            "kernel BTF at /sys/kernel/btf/vmlinux",
        )
        && require(
            memhog_bin().exists() && reactor_bin().exists(),
            "the reactor and memhog binaries (cargo build --workspace --bins)",
        )
}

/// One HTTP/1.1 GET over a plain TCP connection: (status line, body).
fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(String, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or((response.as_str(), ""));
    let status = head.lines().next().unwrap_or("").to_string();
    Ok((status, body.to_string()))
}

/// Sum of every sample of `name` whose labels include all of `labels`.
fn sum_where(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix('{')?;
            let (set, value) = rest.split_once("} ")?;
            labels
                .iter()
                .all(|want| set.split(',').any(|have| have == *want))
                .then(|| value.trim().parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

#[test]
fn run_serves_metrics_that_count_an_oom_and_stops_on_sigterm() {
    if !can_run() {
        return;
    }
    let mut cg = TestMemcg::new("metrics", 64 << 20).expect("create test memcg");
    // The agent builds its pod tree below cgroupRoot in every v1 hierarchy.
    let _roots = reactor_tests::cgroup_root::create_other_v1_roots(&cg.cgroup);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("reactor.yaml");
    // Port 0: the kernel picks a free port and the agent logs the address it bound.
    // `log.format: plain` is overridden by `--log-format json` below.
    std::fs::write(
        &config,
        format!(
            "cgroupRoot: {}\nnode:\n  memoryCapacity: 64Mi\nevictionHard:\n  memory.available: 16Mi\n\
             housekeepingInterval: 1s\nstateDir: {d}\napiSocket: {d}/api.sock\n\
             devicePluginDir: {d}/device-plugins\nmetricsAddress: 127.0.0.1:0\n\
             sense:\n  ebpf: true\nlog:\n  format: plain\n  level: info\n",
            cg.cgroup,
            d = dir.path().display()
        ),
    )
    .unwrap();
    let mut child = ChildGuard(
        Command::new(reactor_bin())
            .args(["run", "--config", config.to_str().unwrap()])
            .args(["--log-format", "json"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start reactor run"),
    );
    let stderr = child.0.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let v = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("log line {line:?} is not JSON: {e}"));
            if tx.send(v).is_err() {
                break;
            }
        }
    });
    let mut logs = Vec::new();
    let mut wait_for = |what: &str, pred: &dyn Fn(&Value) -> bool| -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(v) => {
                    let hit = pred(&v);
                    logs.push(v.clone());
                    if hit {
                        return v;
                    }
                }
                Err(_) => panic!("no log line for {what}: {logs:#?}"),
            }
        }
    };
    let message = |v: &Value| v["fields"]["message"].as_str().unwrap_or("").to_owned();

    let listening = wait_for("the metrics endpoint", &|v| {
        message(v) == "metrics endpoint listening"
    });
    let addr: SocketAddr = listening["fields"]["address"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("address in {listening}"));
    assert_ne!(addr.port(), 0);
    wait_for("the agent running", &|v| message(v) == "reactor running");

    let (status, health) = http_get(addr, "/healthz").expect("GET /healthz");
    assert!(status.contains(" 200 "), "{status}");
    assert_eq!(health.trim(), "ok");

    // Before any pressure: every family whose labels are known is already there; the
    // rejection and device families wait for their first use (the signal families appear
    // with the reactor loop's first pass, which may or may not have run yet).
    let (status, before) = http_get(addr, "/metrics").expect("GET /metrics");
    assert!(status.contains(" 200 "), "{status}");
    for family in FAMILIES {
        if FAMILIES_AFTER_FIRST_USE.contains(&family) {
            if !family.starts_with("reactor_eviction_") {
                assert!(!has_family(&before, family), "{family}:\n{before}");
            }
        } else {
            assert!(has_family(&before, family), "{family}:\n{before}");
        }
    }
    assert_eq!(
        sample(&before, r#"reactor_sense_source_attached{source="ebpf"}"#),
        Some(1.0),
        "{before}"
    );
    assert_eq!(
        sample(
            &before,
            r#"reactor_sense_source_attached{source="memcg-threshold"}"#
        ),
        Some(1.0),
        "{before}"
    );
    let ooms_before = sample(&before, "reactor_oom_kills_total").expect("oom counter");

    cg.spawn(Command::new(memhog_bin()).args(["256", "0", "60"]))
        .expect("spawn hog");
    let ours = cg.cgroup.clone();
    // The v1 OOM eventfd can wake before the kill is counted in memory.oom_control; then the
    // memcg source reports `memcg-event oom` rather than `oom-kill` (eBPF sees the victim).
    let is_oom_in_ours = move |v: &Value, source: &str| {
        message(v) == "pressure event"
            && v["fields"]["source"] == source
            && v["fields"]["cgroup"] == ours.as_str()
            && v["fields"]["kind"].as_str().is_some_and(|k| {
                k.starts_with("oom-kill") || (source != "ebpf" && k.starts_with("memcg-event oom"))
            })
    };
    // The two sources report the kill in either order: wait until both have.
    let ebpf_oom = std::cell::RefCell::new(None::<Value>);
    let memcg_oom = std::cell::Cell::new(false);
    wait_for("the OOM from eBPF and from the memcg notification", &|v| {
        if is_oom_in_ours(v, "ebpf") {
            *ebpf_oom.borrow_mut() = Some(v.clone());
        }
        if is_oom_in_ours(v, "memcg-threshold") {
            memcg_oom.set(true);
        }
        ebpf_oom.borrow().is_some() && memcg_oom.get()
    });
    let oom_event = ebpf_oom.take().unwrap_or_default();
    // The structured line carries the lag as fields.
    assert!(
        oom_event["fields"]["lag_ns"].as_u64().is_some(),
        "{oom_event}"
    );
    assert!(
        oom_event["fields"]["at_ns"].as_u64().is_some(),
        "{oom_event}"
    );

    // Events are recorded before they are logged, so the scrape already shows them.
    let (_, after) = http_get(addr, "/metrics").expect("GET /metrics after the OOM");
    for family in FAMILIES
        .iter()
        .filter(|f| !FAMILIES_AFTER_FIRST_USE.contains(f))
    {
        assert!(has_family(&after, family), "{family}:\n{after}");
    }
    assert!(
        sample(
            &after,
            r#"reactor_pressure_events_total{source="ebpf",kind="oom-kill"}"#
        )
        .is_some_and(|n| n >= 1.0),
        "{after}"
    );
    assert!(
        sum_where(
            &after,
            "reactor_pressure_events_total",
            &[r#"source="memcg-threshold""#]
        ) >= 1.0,
        "{after}"
    );
    for source in ["ebpf", "memcg-threshold"] {
        let count = sample(
            &after,
            &format!(r#"reactor_detection_lag_seconds_count{{source="{source}"}}"#),
        );
        assert!(count.is_some_and(|n| n >= 1.0), "{source}: {after}");
        let inf = sample(
            &after,
            &format!(r#"reactor_detection_lag_seconds_bucket{{le="+Inf",source="{source}"}}"#),
        );
        assert_eq!(inf, count, "{source}: +Inf bucket equals the count");
    }
    // The reactor loop observed the node's signals with their threshold.
    assert!(
        sample(
            &after,
            r#"reactor_eviction_signal_value{signal="memory.available"}"#
        )
        .is_some(),
        "{after}"
    );
    assert_eq!(
        sample(
            &after,
            r#"reactor_eviction_threshold{signal="memory.available",type="hard"}"#
        ),
        Some(f64::from(16u32 << 20)),
        "{after}"
    );
    let ooms_after = sample(&after, "reactor_oom_kills_total").expect("oom counter");
    assert!(
        ooms_after > ooms_before,
        "{ooms_before} -> {ooms_after}:\n{after}"
    );

    let pid = rustix::process::Pid::from_child(&child.0);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    wait_for("the clean stop", &|v| message(v) == "stopped");
    let status = child.wait_exit("reactor run after SIGTERM", Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(),
        "the endpoint is closed after the agent stopped"
    );
}

#[test]
fn a_bad_or_taken_metrics_address_is_one_line_naming_it() {
    if !require(
        reactor_bin().exists(),
        "the reactor binary (cargo build --workspace --bins)",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Bad text: input error before anything attaches.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "metricsAddress: \"nohost\"\n").unwrap();
    let out = Command::new(reactor_bin())
        .args(["run", "--config", bad.to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .expect("run reactor");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("metricsAddress") && err.contains("nohost"),
        "{err}"
    );

    // A taken port: a runtime error naming the address, before the sense layer starts.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let cfg = dir.path().join("taken.yaml");
    std::fs::write(&cfg, format!("metricsAddress: \"{addr}\"\n")).unwrap();
    let out = Command::new(reactor_bin())
        .args(["run", "--config", cfg.to_str().unwrap()])
        .args(["--no-ebpf", "--no-psi", "--no-memcg"])
        .stdin(Stdio::null())
        .output()
        .expect("run reactor");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let last = err.trim_end().lines().last().unwrap_or("");
    assert!(
        last.starts_with("error: ") && last.contains(&addr.to_string()),
        "{err}"
    );
    assert!(last.contains("metricsAddress"), "{err}");
    assert!(!err.contains("sense source attached"), "{err}");
}
