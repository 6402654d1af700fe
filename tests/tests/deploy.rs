//! The deployment is the systemd unit (`deploy/systemd/reactor.service`): the agent is the
//! node's own agent. These tests check that the unit is what systemd will accept and that it
//! runs commands the agent has, offline (no systemd needs to be running).

use std::path::Path;
use std::process::Command;

use reactor_tests::{reactor_bin, require};

const UNIT: &str = include_str!("../../deploy/systemd/reactor.service");
/// Where the unit expects the binary; the tests point it at the one just built.
const INSTALLED: &str = "/usr/local/bin/reactor";
const ANALYZE: &str = "/usr/bin/systemd-analyze";

/// `systemd-analyze verify` on `text` written as `<dir>/<name>`: its exit status and
/// everything it printed. It exits 0 on many problems it only warns about ("Unknown key …,
/// ignoring"), so a clean unit is one that passes and prints nothing.
fn verify(dir: &Path, name: &str, text: &str) -> (bool, String) {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write unit");
    let out = Command::new(ANALYZE)
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .expect("run systemd-analyze");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[test]
fn systemd_unit_verifies_offline() {
    if !require(
        Path::new(ANALYZE).exists(),
        "systemd-analyze (Debian's systemd; `cargo xtask setup` installs it)",
    ) {
        return;
    }
    let bin = reactor_bin();
    assert!(bin.exists(), "build the agent first: {}", bin.display());
    assert!(UNIT.contains(INSTALLED), "the unit runs {INSTALLED}");
    let unit = UNIT.replace(INSTALLED, bin.to_str().expect("utf-8 path"));
    let dir = tempfile::tempdir().expect("temp dir");

    let (ok, said) = verify(dir.path(), "reactor.service", &unit);
    assert!(
        ok && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );

    // The check bites: a misspelt key, a bad value and a missing binary are each reported.
    for (what, bad) in [
        ("misspelt key", unit.replace("\nRestart=", "\nRestrat=")),
        (
            "bad value",
            unit.replace("CPUSchedulingPolicy=fifo", "CPUSchedulingPolicy=fast"),
        ),
        (
            "missing binary",
            UNIT.replace(INSTALLED, "/nonexistent/reactor"),
        ),
    ] {
        let (ok, said) = verify(dir.path(), "reactor.service", &bad);
        assert!(
            !ok || !said.trim().is_empty(),
            "{what}: systemd-analyze said nothing"
        );
    }
}

#[test]
fn systemd_unit_runs_existing_subcommands() {
    let exec: Vec<&str> = UNIT
        .lines()
        .filter(|l| l.starts_with("ExecStart"))
        .collect();
    assert_eq!(exec.len(), 2);
    for line in exec {
        // The subcommand words (up to the first flag or path) must name a real subcommand;
        // `--help` proves clap knows it without needing the files the unit points at.
        let words: Vec<&str> = line
            .split_whitespace()
            .skip(1)
            .take_while(|a| !a.starts_with('-') && !a.starts_with('/'))
            .collect();
        assert!(!words.is_empty(), "{line}");
        let out = Command::new(reactor_bin())
            .args(&words)
            .arg("--help")
            .output()
            .expect("run reactor");
        assert!(
            out.status.success(),
            "{line}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn config_the_unit_tells_to_install_passes_its_start_check() {
    // The unit's header: `reactor config defaults > /etc/reactor/config.yaml`; its
    // ExecStartPre: `reactor config check /etc/reactor/config.yaml`.
    assert!(UNIT.contains("reactor config defaults > /etc/reactor/config.yaml"));
    assert!(
        UNIT.contains("ExecStartPre=/usr/local/bin/reactor config check /etc/reactor/config.yaml")
    );
    let out = Command::new(reactor_bin())
        .args(["config", "defaults"])
        .output()
        .expect("run reactor");
    assert!(out.status.success());
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, &out.stdout).expect("write config");
    let out = Command::new(reactor_bin())
        .args(["config", "check"])
        .arg(&file)
        .output()
        .expect("run reactor");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
