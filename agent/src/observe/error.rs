//! Why a signal could not be read. A file of its own, not in `mod.rs`: every reader of
//! `observe` returns it, and `mod.rs` uses the readers, so an error defined there would make
//! each reader and `mod.rs` use each other (a circle `cargo xtask house` reports).

use std::path::{Path, PathBuf};

/// Why a signal could not be read; each names the file or setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// A file or directory could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error from the kernel.
        #[source]
        source: std::io::Error,
    },
    /// A file held something other than what the kernel writes there.
    #[error("{path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// No hierarchy under the cgroupfs mount has the memory controller.
    #[error("no cgroup memory controller under {mount} (neither v2 with memory nor a v1 memory hierarchy)")]
    NoMemoryController {
        /// The cgroupfs mount point searched.
        mount: PathBuf,
    },
    /// A cgroup path that would leave the hierarchy.
    #[error("cgroup path {cgroup:?} climbs out of the hierarchy")]
    BadCgroup {
        /// The path given.
        cgroup: String,
    },
    /// A config value the observer cannot use.
    #[error("config key {key}: {reason}")]
    Config {
        /// The config key path.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl ObserveError {
    pub(super) fn io(path: &Path, source: std::io::Error) -> ObserveError {
        ObserveError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(super) fn parse(path: &Path, reason: String) -> ObserveError {
        ObserveError::Parse {
            path: path.to_path_buf(),
            reason,
        }
    }
}
