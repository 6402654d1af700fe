//! `reactor run`: refuses bad config before attaching anything (exit 2, one line), and on a
//! good one logs the attach report and every event with its lag, then stops cleanly on
//! SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use reactor_tests::{is_root, memhog_bin, reactor_bin, require, ChildGuard, TestMemcg};

#[test]
fn bad_config_or_flags_exit_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (text, args, needle)) in [
        ("sense:\n  psiWindow: 20s\n", &[][..], "sense.psiWindow"),
        ("log:\n  format: xml\n", &[], "log.format"),
        ("log:\n  level: \"a=b=c\"\n", &[], "log.level"),
        (
            "evictionHard:\n  memory.available: 12Qi\n",
            &[],
            "memory.available",
        ),
        ("dryRun: \"yes\"\n", &[], "config key dryRun:"),
        ("", &["--interval", "0s"], "--interval"),
        ("", &["--threshold", "1Mi"], "--threshold"),
        ("", &["--cgroup", "/a/../b"], "--cgroup"),
    ]
    .into_iter()
    .enumerate()
    {
        let file = dir.path().join(format!("bad{i}.yaml"));
        std::fs::write(&file, text).unwrap();
        for command in ["run", "watch"] {
            let out = Command::new(reactor_bin())
                .args([command, "--config", file.to_str().unwrap()])
                .args(args)
                .stdin(Stdio::null())
                .output()
                .expect("run reactor");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{command} {text:?} {args:?}: {err}"
            );
            assert_eq!(err.trim_end().lines().count(), 1, "{err}");
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }
}

#[test]
fn run_logs_events_with_lag_and_stops_on_sigterm() {
    if !require(is_root(), "root for cgroup v1 memory notifications") {
        return;
    }
    let mut cg = TestMemcg::new("run", 64 << 20).expect("create test memcg");
    let _roots = reactor_tests::cgroup_root::create_other_v1_roots(&cg.cgroup);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("reactor.yaml");
    // A 64 MiB node rooted at the test cgroup: threshold = 64Mi - 16Mi = 48 MiB.
    std::fs::write(
        &config,
        format!(
            "cgroupRoot: {}\nnode:\n  memoryCapacity: 64Mi\nevictionHard:\n  memory.available: 16Mi\n\
             housekeepingInterval: 1s\nstateDir: {d}\napiSocket: {d}/api.sock\n\
             devicePluginDir: {d}/device-plugins\n\
             sense:\n  ebpf: false\nlog:\n  format: json\n  level: debug\n",
            cg.cgroup,
            d = dir.path().display()
        ),
    )
    .unwrap();
    let mut child = ChildGuard(
        Command::new(reactor_bin())
            .args(["run", "--config", config.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start reactor run"),
    );
    let stderr = child.0.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel::<serde_json::Value>();
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
    let mut wait_for = |what: &str, pred: &dyn Fn(&serde_json::Value) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(v) => {
                    let hit = pred(&v);
                    logs.push(v);
                    if hit {
                        return;
                    }
                }
                Err(_) => panic!("no log line for {what}: {logs:#?}"),
            }
        }
    };
    let message = |v: &serde_json::Value| v["fields"]["message"].as_str().unwrap_or("").to_owned();
    wait_for("the node threshold attached", &|v| {
        message(v) == "sense source attached"
            && v["fields"]["what"]
                .as_str()
                .is_some_and(|w| w.contains("v1 threshold 48Mi on"))
    });
    wait_for("a tick with its lag", &|v| {
        message(v) == "tick" && v["fields"]["lag_ns"].as_u64().is_some()
    });
    cg.spawn(Command::new(memhog_bin()).args(["256", "0", "60"]))
        .expect("spawn hog");
    wait_for("the OOM as a pressure event", &|v| {
        message(v) == "pressure event"
            && v["fields"]["source"] == "memcg-threshold"
            && v["fields"]["kind"]
                .as_str()
                .is_some_and(|k| k.starts_with("oom-kill") || k.starts_with("memcg-event oom"))
            && v["fields"]["lag_ns"].as_u64().is_some()
    });

    let pid = rustix::process::Pid::from_child(&child.0);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    wait_for("the clean stop", &|v| message(v) == "stopped");
    let status = child.wait_exit("reactor run after SIGTERM", Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    reactor_tests::cgroup_root::remove_agent_tree(&cg.cgroup);
    assert!(
        logs.iter()
            .any(|v| message(v) == "detection lag" && v["fields"]["source"] == "memcg-threshold"),
        "lag summary logged: {logs:#?}"
    );
}
