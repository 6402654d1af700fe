//! What a person reads from the CLI: `reactor status` in kubectl's units everywhere (no raw
//! byte counts, the sources lines included), `pod apply` judging the file before it needs an
//! agent, and a failed connection saying its cause once.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use reactor_tests::agent::TestAgent;
use reactor_tests::{is_root, reactor_bin, require};

fn reactor(args: &[&str]) -> Output {
    Command::new(reactor_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run reactor")
}

/// The longest run of ASCII digits in `text`, with the line it is on.
fn longest_number(text: &str) -> (usize, &str) {
    let mut best = (0, "");
    for line in text.lines() {
        let mut run = 0;
        for c in line.chars() {
            run = if c.is_ascii_digit() { run + 1 } else { 0 };
            if run > best.0 {
                best = (run, line);
            }
        }
    }
    best
}

#[test]
fn longest_number_finds_the_byte_count() {
    assert_eq!(
        longest_number("a 12\nsource x: v1 threshold 968884224 bytes\nb"),
        (9, "source x: v1 threshold 968884224 bytes")
    );
    assert_eq!(longest_number("threshold ~924Mi").0, 3);
}

/// The real agent on a modelled 1Gi node with the memcg threshold on: its v1 notification is
/// armed at a level of about 10^9 bytes, which the sources line used to print as a raw
/// count. Nothing in the text may be a number of 9 digits or more.
#[test]
fn status_prints_no_raw_byte_counts() {
    if !require(is_root(), "root, to create cgroups and run the agent")
        || !require(
            Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists(),
            "cgroup v1 memory hierarchy",
        )
    {
        return;
    }
    let agent = TestAgent::start(
        "cli-human-status",
        "node: {memoryCapacity: 1Gi, cpuCapacity: '2'}\n\
         sense:\n  ebpf: false\n  psi: false\n  memcgThreshold: true\n",
    );
    let text = |args: &[&str]| {
        let out = agent.cli(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let mut out = String::new();
    agent.wait("the loop's first pass and the threshold source", || {
        out = text(&["status"]);
        out.contains("signal memory.available") && out.contains("v1 threshold")
    });
    let (digits, line) = longest_number(&out);
    assert!(
        digits < 9,
        "a {digits}-digit number in `reactor status`: {line:?}\n{out}"
    );
    // The JSON keeps the exact integers: the same status does carry the big numbers.
    let json = text(&["status", "--json"]);
    assert!(longest_number(&json).0 >= 9, "{json}");
}

/// A bad file with no agent anywhere: the answer is the file's mistake (exit 2), not that
/// the socket is missing.
#[test]
fn pod_apply_judges_the_file_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("no-agent.sock");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\nspec:\n  containers:\n  \
         - name: main\n    resources: {limits: {memory: 12XB}}\n",
    )
    .unwrap();
    let out = reactor(&[
        "pod",
        "apply",
        "-f",
        bad.to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("bad.yaml") && stderr.contains("\"12XB\""),
        "{stderr}"
    );
    assert!(!stderr.contains("cannot reach the agent"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    // A good file does get as far as the socket.
    let good = dir.path().join("good.yaml");
    std::fs::write(
        &good,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: good}\nspec:\n  containers:\n  \
         - name: main\n    command: [sleep, '1']\n",
    )
    .unwrap();
    let out = reactor(&[
        "pod",
        "apply",
        "-f",
        good.to_str().unwrap(),
        "--socket",
        socket.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot reach the agent"), "{stderr}");
}

/// The connection's cause appears once: tonic's connect error prints its inner error and
/// hands it out as its source as well.
#[test]
fn a_failed_connection_says_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("no-agent.sock");
    for args in [
        vec!["pod", "ls"],
        vec!["status"],
        vec!["pod", "rm", "default/x"],
    ] {
        let mut args = args;
        args.extend(["--socket", socket.to_str().unwrap()]);
        let out = reactor(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        let cause = "No such file or directory (os error 2)";
        assert_eq!(
            stderr.matches(cause).count(),
            1,
            "{args:?} should say {cause:?} once: {stderr}"
        );
        assert!(stderr.contains(socket.to_str().unwrap()), "{stderr}");
    }
}
