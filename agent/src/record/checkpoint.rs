//! Checkpoints: one serde value per file, written atomically and refused when damaged.
//!
//! Why this shape: the agent must come back from a crash or a power cut with the state it
//! acted on (which pods it runs, which devices it handed out, which images it has seen).
//! A half-written file must never be mistaken for state, and a damaged one must never be
//! silently thrown away — an operator may need it to understand what happened.
//!
//! - **Atomic**: the value is written to a temp file in the same directory, the file is
//!   fsynced, renamed over the target, and the directory is fsynced so the rename itself
//!   survives a power cut. A reader sees the old file or the new one, never a mix.
//! - **Versioned JSON with a checksum**: the file is one JSON object
//!   `{"kind": K, "version": V, "crc32": "xxxxxxxx", "data": …}`. The CRC-32 covers the
//!   canonical serialization of `data` (sorted keys), so a file edited by hand, truncated or
//!   bit-flipped is caught even where it still parses.
//! - **Refused, kept aside**: a load that finds a damaged file renames it to
//!   `<name>.corrupt` (replacing an older one) and returns a one-line error; the caller
//!   starts from empty state and says so. An absent file is `Ok(None)`, not an error.
//!
//! ```no_run
//! use reactor::record::checkpoint::Checkpoint;
//! # fn main() -> Result<(), reactor::record::checkpoint::CheckpointError> {
//! let pods = Checkpoint::new("/var/lib/reactor/pods.json", "pods", 1);
//! pods.save(&vec!["default/web".to_string()])?;
//! let back: Option<Vec<String>> = pods.load()?;
//! # Ok(()) }
//! ```

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Why a checkpoint could not be written or read. Each variant renders as one line naming
/// the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file system refused an operation.
    #[error("checkpoint {path}: {op}: {source}")]
    Io {
        /// The file or directory the operation was on.
        path: PathBuf,
        /// What the agent was doing ("write temp file", "rename", ...).
        op: &'static str,
        /// The error from the kernel.
        source: std::io::Error,
    },
    /// The value could not be turned into JSON (a map with non-string keys, say).
    #[error("checkpoint {path}: cannot serialize: {source}")]
    Serialize {
        /// The checkpoint file.
        path: PathBuf,
        /// The serializer's complaint.
        source: serde_json::Error,
    },
    /// The file is damaged (truncated, not JSON, checksum mismatch, wrong shape); it was
    /// moved aside to `kept_at` for inspection.
    #[error("checkpoint {path} is corrupt ({reason}); kept as {kept_at}")]
    Corrupt {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
        /// Where the damaged file now is.
        kept_at: PathBuf,
    },
    /// The file is intact but belongs to another kind or version of state; it is left in
    /// place, since a newer agent may still read it.
    #[error("checkpoint {path} holds {found_kind} version {found_version}, this agent reads {kind} version {version}")]
    Incompatible {
        /// The checkpoint file.
        path: PathBuf,
        /// The kind in the file.
        found_kind: String,
        /// The version in the file.
        found_version: u32,
        /// The kind this reader expects.
        kind: String,
        /// The version this reader expects.
        version: u32,
    },
}

/// One checkpoint file holding one kind of state at one format version.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    path: PathBuf,
    kind: String,
    version: u32,
}

#[derive(Serialize, serde::Deserialize)]
struct Envelope {
    kind: String,
    version: u32,
    crc32: String,
    data: serde_json::Value,
}

fn crc_of(data: &serde_json::Value) -> String {
    // serde_json's Value keeps object keys sorted, so this is the canonical form whatever
    // order the writer's struct fields had.
    let bytes = serde_json::to_vec(data).unwrap_or_default();
    format!("{:08x}", crc32fast::hash(&bytes))
}

impl Checkpoint {
    /// A checkpoint at `path` holding state of `kind` in format `version`. Nothing is read or
    /// written until [`save`](Self::save) or [`load`](Self::load).
    pub fn new(path: impl Into<PathBuf>, kind: &str, version: u32) -> Checkpoint {
        Checkpoint {
            path: path.into(),
            kind: kind.to_string(),
            version,
        }
    }

    /// The file this checkpoint lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where a damaged file is kept: `<name>.corrupt` beside it.
    pub fn corrupt_path(&self) -> PathBuf {
        let mut name = self.path.file_name().unwrap_or_default().to_os_string();
        name.push(".corrupt");
        self.path.with_file_name(name)
    }

    fn io(&self, path: &Path, op: &'static str) -> impl FnOnce(std::io::Error) -> CheckpointError {
        let path = path.to_path_buf();
        move |source| CheckpointError::Io { path, op, source }
    }

    /// Writes `value` atomically: temp file in the same directory, fsync, rename over the
    /// target, fsync the directory. The directory must exist.
    pub fn save<T: Serialize>(&self, value: &T) -> Result<(), CheckpointError> {
        let data = serde_json::to_value(value).map_err(|source| CheckpointError::Serialize {
            path: self.path.clone(),
            source,
        })?;
        let envelope = Envelope {
            kind: self.kind.clone(),
            version: self.version,
            crc32: crc_of(&data),
            data,
        };
        let bytes = serde_json::to_vec(&envelope).map_err(|source| CheckpointError::Serialize {
            path: self.path.clone(),
            source,
        })?;
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(self.path.file_name().unwrap_or_default());
        tmp_name.push(format!(".tmp-{}", std::process::id()));
        let tmp = dir.join(tmp_name);
        let result = (|| {
            let mut file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)
                .map_err(self.io(&tmp, "create temp file"))?;
            file.write_all(&bytes)
                .map_err(self.io(&tmp, "write temp file"))?;
            file.sync_all().map_err(self.io(&tmp, "fsync temp file"))?;
            std::fs::rename(&tmp, &self.path).map_err(self.io(&self.path, "rename temp file"))?;
            File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(self.io(&dir, "fsync directory"))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// Reads the state back. `Ok(None)` when there is no file; an error (after moving the
    /// file aside to [`corrupt_path`](Self::corrupt_path)) when it is damaged.
    pub fn load<T: DeserializeOwned>(&self) -> Result<Option<T>, CheckpointError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(CheckpointError::Io {
                    path: self.path.clone(),
                    op: "read",
                    source,
                })
            }
        };
        let envelope: Envelope = match serde_json::from_slice(&bytes) {
            Ok(e) => e,
            Err(e) => return Err(self.set_aside(format!("not a checkpoint: {e}"))),
        };
        let found = crc_of(&envelope.data);
        if found != envelope.crc32 {
            return Err(self.set_aside(format!(
                "checksum {found} does not match the recorded {}",
                envelope.crc32
            )));
        }
        if envelope.kind != self.kind || envelope.version != self.version {
            return Err(CheckpointError::Incompatible {
                path: self.path.clone(),
                found_kind: envelope.kind,
                found_version: envelope.version,
                kind: self.kind.clone(),
                version: self.version,
            });
        }
        match serde_path_to_error::deserialize(envelope.data) {
            Ok(v) => Ok(Some(v)),
            Err(e) => Err(self.set_aside(format!("data at {}: {}", e.path(), e.inner()))),
        }
    }

    fn set_aside(&self, reason: String) -> CheckpointError {
        let kept_at = self.corrupt_path();
        if let Err(source) = std::fs::rename(&self.path, &kept_at) {
            return CheckpointError::Io {
                path: self.path.clone(),
                op: "move corrupt file aside",
                source,
            };
        }
        CheckpointError::Corrupt {
            path: self.path.clone(),
            reason: reason.replace('\n', " "),
            kept_at,
        }
    }

    /// Deletes the checkpoint (a missing file is fine).
    pub fn remove(&self) -> Result<(), CheckpointError> {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CheckpointError::Io {
                path: self.path.clone(),
                op: "remove",
                source: e,
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::collections::BTreeMap;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Pods {
        uids: Vec<String>,
        restarts: BTreeMap<String, u32>,
    }

    fn sample() -> Pods {
        Pods {
            uids: vec!["a1".into(), "b2".into()],
            restarts: [("a1/web".to_string(), 3)].into_iter().collect(),
        }
    }

    #[test]
    fn round_trip_and_absent() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("pods.json"), "pods", 1);
        assert_eq!(cp.load::<Pods>().unwrap(), None);
        cp.save(&sample()).unwrap();
        assert_eq!(cp.load::<Pods>().unwrap(), Some(sample()));
        // Only the checkpoint is left: the temp file was renamed.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
        cp.remove().unwrap();
        assert_eq!(cp.load::<Pods>().unwrap(), None);
    }

    #[test]
    fn every_truncation_is_refused_and_kept_aside() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("pods.json"), "pods", 1);
        cp.save(&sample()).unwrap();
        let full = std::fs::read(cp.path()).unwrap();
        for len in 0..full.len() {
            std::fs::write(cp.path(), &full[..len]).unwrap();
            let err = cp.load::<Pods>().unwrap_err();
            match &err {
                CheckpointError::Corrupt { kept_at, .. } => {
                    assert_eq!(kept_at, &cp.corrupt_path());
                    assert_eq!(std::fs::read(kept_at).unwrap(), &full[..len]);
                }
                other => panic!("offset {len}: expected Corrupt, got {other}"),
            }
            assert!(!err.to_string().contains('\n'), "one line: {err}");
            assert!(!cp.path().exists(), "bad file moved aside at offset {len}");
        }
    }

    #[test]
    fn flipped_byte_fails_the_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("pods.json"), "pods", 1);
        cp.save(&sample()).unwrap();
        let text = std::fs::read_to_string(cp.path()).unwrap();
        std::fs::write(cp.path(), text.replace("\"a1\"", "\"a7\"")).unwrap();
        let err = cp.load::<Pods>().unwrap_err().to_string();
        assert!(err.contains("checksum"), "{err}");
        assert!(cp.corrupt_path().exists());
    }

    #[test]
    fn wrong_shape_names_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("pods.json"), "pods", 1);
        cp.save(&serde_json::json!({"uids": [1], "restarts": {}}))
            .unwrap();
        let err = cp.load::<Pods>().unwrap_err().to_string();
        assert!(err.contains("uids[0]"), "{err}");
    }

    #[test]
    fn other_version_is_left_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pods.json");
        Checkpoint::new(&path, "pods", 2).save(&sample()).unwrap();
        let err = Checkpoint::new(&path, "pods", 1)
            .load::<Pods>()
            .unwrap_err();
        assert!(matches!(
            err,
            CheckpointError::Incompatible {
                found_version: 2,
                ..
            }
        ));
        assert!(path.exists());
    }

    #[test]
    fn save_into_missing_directory_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("nope/pods.json"), "pods", 1);
        let err = cp.save(&sample()).unwrap_err().to_string();
        assert!(
            err.contains("nope") && err.contains("create temp file"),
            "{err}"
        );
    }
}
