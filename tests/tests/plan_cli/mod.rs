//! Running `reactor plan <what>` on a JSON document, through a file or stdin.

use std::io::Write;
use std::process::{Command, Stdio};

use reactor_tests::{keep_fuzz_seed, reactor_bin};
use serde_json::Value;

/// What one run of the binary gave back.
pub struct Outcome {
    /// The exit code.
    pub code: Option<i32>,
    /// stdout parsed as JSON (null when the run failed).
    pub json: Value,
    /// stderr.
    pub stderr: String,
}

/// Runs `reactor plan <what> --input FILE` with the document written to a temp file.
pub fn plan_file(what: &str, input: &[u8]) -> Outcome {
    keep_seed(what, input);
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("in.json");
    std::fs::write(&file, input).expect("write input");
    let out = Command::new(reactor_bin())
        .args(["plan", what, "--input", file.to_str().expect("utf-8 path")])
        .output()
        .expect("run reactor");
    outcome(out)
}

/// Runs `reactor plan <what> --input -` with the document on stdin.
pub fn plan_stdin(what: &str, input: &[u8]) -> Outcome {
    keep_seed(what, input);
    let mut child = Command::new(reactor_bin())
        .args(["plan", what, "--input", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn reactor");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input)
        .expect("write stdin");
    outcome(child.wait_with_output().expect("wait reactor"))
}

/// Runs a plan on a JSON value and insists it succeeds.
pub fn plan_ok(what: &str, input: &Value) -> Value {
    let out = plan_file(what, input.to_string().as_bytes());
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    out.json
}

/// Runs a plan that must be refused: exit 2 and exactly one line on stderr, returned.
pub fn plan_refused(what: &str, input: &[u8]) -> String {
    let out = plan_file(what, input);
    assert_eq!(
        out.code,
        Some(2),
        "stdout: {} stderr: {}",
        out.json,
        out.stderr
    );
    assert_eq!(
        out.stderr.trim_end().lines().count(),
        1,
        "one line: {:?}",
        out.stderr
    );
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    out.stderr
}

/// Keeps the input as a seed of the `plan` fuzz target (`cargo xtask fuzz --seeds`): the
/// plan's name, a newline, the document.
fn keep_seed(what: &str, input: &[u8]) {
    let mut seed = format!("{what}\n").into_bytes();
    seed.extend_from_slice(input);
    keep_fuzz_seed("plan", &seed);
}

fn outcome(out: std::process::Output) -> Outcome {
    let json = if out.status.success() {
        serde_json::from_slice(&out.stdout).expect("stdout is JSON")
    } else {
        Value::Null
    };
    Outcome {
        code: out.status.code(),
        json,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
