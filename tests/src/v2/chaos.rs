//! The chaos run's short mode on cgroup v2 (issue 41; the invariants are in
//! docs/reliability.md): the seeded mix of pods, pressure, freezes and agent SIGKILLs that
//! `cargo xtask chaos` plays on the v1 host, here on the guest's smaller node
//! ([`crate::chaos::GUEST`]: 384 MiB, the schedule's sizes halved), with every invariant
//! checked throughout. What differs from the host: the unified hierarchy (OOM kills read
//! from `memory.events.local`, freezes by `cgroup.freeze`), Guaranteed pods in the mix
//! (root here may set their `oom_score_adj`), page-cache pods that read the 9p share's
//! clean file (the guest's own filesystems are in memory), and no containerd.

use std::path::PathBuf;

use super::pressure::CACHE_FULL_FILE;
use super::MOUNT;
use crate::chaos::{run, Options};

/// The schedule's seed: the one `cargo xtask test` plays on the host too.
pub const SEED: u64 = 41;
/// How long the schedule runs (emulated time: the guest runs it about 17 times slower, so
/// fewer actions get done than are scheduled, and the report says how many).
pub const MINUTES: f64 = 1.5;

/// Plays the short run and returns its report; panics with the report, every violation and
/// the last actions when an invariant broke.
pub fn short_run() -> String {
    let opts = Options {
        seed: SEED,
        minutes: MINUTES,
        containerd: false,
        keep_going: true,
        v2: Some((PathBuf::from(MOUNT), PathBuf::from(CACHE_FULL_FILE))),
    };
    match run(&opts) {
        Ok(out) => out.report(SEED),
        Err(out) => panic!(
            "{}chaos: violations:\n  {}\nchaos: the last actions:\n  {}",
            out.report(SEED),
            out.tally.violations.join("\n  "),
            out.last.join("\n  ")
        ),
    }
}
