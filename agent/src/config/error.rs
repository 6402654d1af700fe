//! Why a config file cannot be used, in one line: the error every part of the config's
//! reading returns (the parent's parse and checks, the kubelet keys set aside, the memory and
//! PSI checks).

use std::path::PathBuf;

/// A config file that cannot be used: where, and why, in one line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not YAML/JSON.
    #[error("config is not valid YAML: {0}")]
    Syntax(String),
    /// A key is unknown or a value has the wrong form or range. Both parts are printed with
    /// control characters escaped: a key is the file's own text, and a YAML key may hold a
    /// line break, which would split the one-line error (found by the `config` fuzz target).
    #[error(
        "config key {}: {}",
        crate::decide::printable(key),
        crate::decide::printable(reason)
    )]
    Invalid {
        /// The key path, dotted (`sense.psiWindow`).
        key: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl ConfigError {
    pub(super) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }
}
