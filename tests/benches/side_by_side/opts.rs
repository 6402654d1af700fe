//! The bench's options, parsed from the command line by `main.rs` and read by every part.

use std::path::PathBuf;

/// Options from the command line.
pub struct Opts {
    /// The short run for CI.
    pub quick: bool,
    /// `--json`: where the figures go as JSON.
    pub json: Option<PathBuf>,
    /// `--markdown`: where the tables go.
    pub markdown: Option<PathBuf>,
    /// `--only`: the parts to run; the default set when `None`.
    pub only: Option<Vec<String>>,
    /// BestEffort allocation rates of the OOM part, MiB/s.
    pub oom_rates: Option<Vec<u64>>,
    /// Repetitions per mode and rate of the OOM part.
    pub oom_reps: Option<usize>,
    /// The OOM part's modes to run, by short name (`oom::MODE_KEYS`); all when `None`.
    pub oom_modes: Option<Vec<String>>,
    /// The OOM part's variants to run (`oom::VARIANT_KEYS`: the node as it is, and full of
    /// page cache); both when `None`.
    pub oom_variants: Option<Vec<String>>,
    /// Leave the victims' memory to their exit paths (no `process_mrelease`), to compare.
    pub no_mrelease: bool,
    /// The OOM part's loops run with `memoryReclaim.enabled` (on v1 the agent turns it off
    /// at start, as a user's would be).
    pub memory_reclaim: bool,
    /// The OOM part's loops re-read every 1 ms near a threshold even where an armed eBPF slot
    /// watches it (`kernel_watched_poll` = `close_poll`), to compare with the default.
    pub close_watch_always: bool,
    /// Repetitions per scenario and loop of the concurrent-pressure part.
    pub concurrent_reps: Option<usize>,
    /// How long the soak runs, minutes.
    pub soak_minutes: Option<f64>,
}
