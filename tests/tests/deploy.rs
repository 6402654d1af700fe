//! The deployment is the systemd unit (`deploy/systemd/reactor.service`): the agent is the
//! node's own agent. These tests check that the unit is what systemd will accept and that it
//! runs commands the agent has, offline (no systemd needs to be running).

use std::path::Path;
use std::process::Command;

use reactor_tests::{reactor_bin, require};

const UNIT: &str = include_str!("../../deploy/systemd/reactor.service");
/// Where the unit expects the binary; the tests point it at the one just built.
const INSTALLED: &str = "/usr/bin/reactor";
/// The config the Debian package installs as /etc/reactor/config.yaml.
const PACKAGED_CONFIG: &str = include_str!("../../deploy/debian/config.yaml");
/// The first systemd that knows `DelegateSubgroup=` (Debian trixie has 257; bookworm, 252).
const DELEGATE_SUBGROUP_SINCE: u32 = 254;

/// The version `systemd-analyze --version` names ("systemd 252 (252.38-1~deb12u1)").
fn analyze_version() -> u32 {
    let out = Command::new(ANALYZE)
        .arg("--version")
        .output()
        .expect("run systemd-analyze --version");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("systemd-analyze --version: {text}"))
}
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
    let mut unit = UNIT.replace(INSTALLED, bin.to_str().expect("utf-8 path"));
    let dir = tempfile::tempdir().expect("temp dir");
    if analyze_version() < DELEGATE_SUBGROUP_SINCE {
        // An older systemd (this host's) knows every key but `DelegateSubgroup=`: it must say
        // exactly that, and the rest is verified without it. The guest's systemd (Debian
        // trixie) runs the unit as it is (`cargo xtask vm-test --systemd`).
        let (ok, said) = verify(dir.path(), "reactor.service", &unit);
        let lines: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(
            ok && lines.len() == 1 && lines[0].contains("DelegateSubgroup"),
            "systemd-analyze {} on the unit: {said}",
            analyze_version()
        );
        eprintln!(
            "systemd-analyze {} predates DelegateSubgroup= ({DELEGATE_SUBGROUP_SINCE}): \
             verifying the rest without it",
            analyze_version()
        );
        unit = unit.replace("\nDelegateSubgroup=agent\n", "\n");
    }

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
fn packaged_config_passes_the_unit_s_start_check_and_roots_at_the_delegated_cgroup() {
    // The unit's ExecStartPre checks the config the package installs.
    assert!(UNIT.contains("ExecStartPre=/usr/bin/reactor config check /etc/reactor/config.yaml"));
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, PACKAGED_CONFIG).expect("write config");
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
    // The cgroup the unit delegates: reactor.service in system.slice (no `Slice=`), with the
    // agent's own process in its `agent` child, outside the tree it builds.
    assert!(UNIT.contains("\nDelegate=yes\n") && UNIT.contains("\nDelegateSubgroup=agent\n"));
    assert!(!UNIT.contains("\nSlice="));
    assert!(
        PACKAGED_CONFIG
            .lines()
            .any(|l| l == "cgroupRoot: /system.slice/reactor.service"),
        "the packaged config's cgroupRoot is the unit's delegated cgroup"
    );
}
