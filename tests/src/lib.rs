//! Shared helpers for the integration tests: the rule on skipping, and temp roots that clean
//! up after themselves.
//!
//! Tests that need root and a real kernel run in CI (`CI=true`) and must not skip there; on a
//! developer machine without root they print why they skip and pass.

use std::path::PathBuf;

/// Whether the tests run in CI, where every kernel test must run.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Returns `true` when the test may go on; otherwise prints why it skips. Panics in CI, where
/// a skip would hide a broken kernel path.
pub fn require(condition: bool, what: &str) -> bool {
    if condition {
        return true;
    }
    if in_ci() {
        panic!("required in CI but missing: {what}");
    }
    eprintln!("skipping: {what}");
    false
}

/// Whether the test process runs as root.
pub fn is_root() -> bool {
    // SAFETY-free check: /proc/self/status carries the effective uid.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// The `reactor` binary built for this test run.
pub fn reactor_bin() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    target.join(profile).join("reactor")
}
