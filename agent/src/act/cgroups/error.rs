//! Why a cgroup operation failed: one error for the writer over both versions, each variant
//! naming the file or directory (and a write its value), so one log line is enough to
//! reproduce the problem by hand.

use std::path::PathBuf;
use std::time::Duration;

/// Why a cgroup operation failed. Every variant names the file or directory, and writes
/// carry the value, so one log line is enough to reproduce the problem by hand.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A cgroup name that could escape its parent or that the kernel would refuse.
    #[error("bad cgroup name {name:?}: {reason}")]
    BadName {
        /// The offending name or path.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The mount root does not look like the cgroup version asked for.
    #[error("no cgroup {version} hierarchy at {path}: {reason}")]
    NoHierarchy {
        /// "v1" or "v2".
        version: &'static str,
        /// Where the agent looked.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// Writing a value failed.
    #[error("write {value:?} to {path}: {source}{hint}", hint = write_hint(source))]
    Write {
        /// The cgroup file.
        path: PathBuf,
        /// The value that was refused.
        value: String,
        /// The kernel's error.
        source: std::io::Error,
    },
    /// The kernel could not reclaim enough to bring usage under a lowered memory limit
    /// (v1 `EBUSY`): raise the limit, or stop work in the cgroup first.
    #[error("write {value:?} to {path}: memory usage {usage} bytes is above the new limit and the kernel could not reclaim it (EBUSY)")]
    LimitBelowUsage {
        /// The `memory.limit_in_bytes` file.
        path: PathBuf,
        /// The limit that was refused.
        value: String,
        /// The cgroup's usage when the write failed.
        usage: u64,
    },
    /// Reading a file or directory failed.
    #[error("read {path}: {source}")]
    Read {
        /// The cgroup file or directory.
        path: PathBuf,
        /// The kernel's error.
        source: std::io::Error,
    },
    /// A cgroup file held something other than what the kernel writes there.
    #[error("{path}: unexpected content {text:?}")]
    Parse {
        /// The cgroup file.
        path: PathBuf,
        /// The text that did not parse.
        text: String,
    },
    /// mkdir failed.
    #[error("create cgroup {path}: {source}")]
    Create {
        /// The cgroup directory.
        path: PathBuf,
        /// The kernel's error.
        source: std::io::Error,
    },
    /// rmdir failed for a reason other than tasks still draining.
    #[error("remove cgroup {path}: {source}")]
    Remove {
        /// The cgroup directory.
        path: PathBuf,
        /// The kernel's error.
        source: std::io::Error,
    },
    /// The cgroup still had tasks when the removal gave up waiting.
    #[error("remove cgroup {path}: still busy after {waited:?}, pids inside: {pids:?}")]
    Busy {
        /// The cgroup directory.
        path: PathBuf,
        /// The pids found inside when giving up (empty: the kernel was still draining).
        pids: Vec<u32>,
        /// How long removal retried.
        waited: Duration,
    },
}

fn write_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::NotFound => {
            " (the file does not exist: controller not enabled for this cgroup?)"
        }
        _ => "",
    }
}
