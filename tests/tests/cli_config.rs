//! `reactor config`: defaults print and re-validate; malformed files exit 2 naming the field.

use std::process::Command;

use reactor_tests::reactor_bin;

fn reactor(args: &[&str]) -> std::process::Output {
    Command::new(reactor_bin())
        .args(args)
        .output()
        .expect("run reactor")
}

#[test]
fn defaults_validate_with_check() {
    let out = reactor(&["config", "defaults"]);
    assert!(out.status.success());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("defaults.yaml");
    std::fs::write(&file, &out.stdout).unwrap();
    let check = reactor(&["config", "check", file.to_str().unwrap()]);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[test]
fn malformed_config_exits_2_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    for (text, field) in [
        ("sense:\n  kernelMagic: true\n", "kernelMagic"),
        ("housekeepingInterval: -10s\n", "housekeepingInterval"),
        ("sense:\n  psiWindow: 0s\n", "sense.psiWindow"),
        (
            "imageGCHighThresholdPercent: 101\n",
            "imageGCHighThresholdPercent",
        ),
    ] {
        let file = dir.path().join("bad.yaml");
        std::fs::write(&file, text).unwrap();
        let out = reactor(&["config", "check", file.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(err.contains(field), "{text}: {err}");
    }
}
