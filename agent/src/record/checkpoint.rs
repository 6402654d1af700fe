//! Checkpoints: one serde value per file, versioned, checksummed, and crash-safe through
//! [`StateFile`].
//!
//! Why this shape: the agent must come back from a crash or a power cut with the state it
//! acted on (which pods it runs, which devices it handed out, which images it has seen).
//! A half-written file must never be mistaken for state, a damaged one must never be
//! silently thrown away — an operator may need it to understand what happened — and no
//! state file may ever keep the agent from starting.
//!
//! - **Crash-safe, two generations**: writes go through [`StateFile`], which keeps the last
//!   good generation as `<name>.prev` and replaces the file atomically (temp file, fsync,
//!   rename, fsync of the directory).
//! - **Versioned JSON with a checksum**: the file is one JSON object
//!   `{"kind": K, "version": V, "crc32": "xxxxxxxx", "data": …}`. The CRC-32 covers the
//!   canonical serialization of `data` (sorted keys), so a file edited by hand, truncated or
//!   bit-flipped is caught even where it still parses.
//! - **Never refused**: a load falls back current → previous → empty; a damaged file or one
//!   of another version is set aside (renamed, kept) with a log line and a notice. An absent
//!   file is simply empty state.
//!
//! ```no_run
//! use reactor::record::checkpoint::Checkpoint;
//! # fn main() -> Result<(), reactor::record::checkpoint::CheckpointError> {
//! let pods = Checkpoint::new("/var/lib/reactor/pods.json", "pods", 1);
//! let back: Vec<String> = pods.load().value.unwrap_or_default();
//! pods.save(&back)?;
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::state_file::{Loaded, Notices, Refusal, StateFile, WriteError};

/// Why a checkpoint could not be written. Each variant renders as one line naming the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file system refused the write (a full disk, a missing directory, ...).
    #[error(transparent)]
    Write(#[from] WriteError),
    /// The value could not be turned into JSON (a map with non-string keys, say).
    #[error("checkpoint {path}: cannot serialize: {source}")]
    Serialize {
        /// The checkpoint file.
        path: PathBuf,
        /// The serializer's complaint.
        source: serde_json::Error,
    },
}

/// One checkpoint file holding one kind of state at one format version. Clones share the
/// file's state (which generation is good, whether writes are failing).
#[derive(Debug, Clone)]
pub struct Checkpoint {
    file: StateFile,
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
            file: StateFile::new(path),
            kind: kind.to_string(),
            version,
        }
    }

    /// Sends what happens to the file (set aside, failed writes) to `notices` as well as
    /// the log.
    pub fn with_notices(mut self, notices: Notices) -> Checkpoint {
        self.file = self.file.with_notices(notices);
        self
    }

    /// The file this checkpoint lives in.
    pub(crate) fn path(&self) -> &Path {
        self.file.path()
    }

    /// Whether the last save failed (the owner retries while it does).
    pub(crate) fn is_failing(&self) -> bool {
        self.file.is_failing()
    }

    /// Writes `value` as the new generation (see [`StateFile::write`]). The directory must
    /// exist.
    pub fn save<T: Serialize>(&self, value: &T) -> Result<(), CheckpointError> {
        let bytes = self.encode(value)?;
        self.file.write(&bytes)?;
        Ok(())
    }

    /// The bytes [`save`](Self::save) writes for `value`: the envelope with its checksum.
    /// Public, like [`decode`](Self::decode), so the fuzz targets (`fuzz/`) can run the
    /// checkpoint format both ways without a file.
    pub fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, CheckpointError> {
        let ser = |source| CheckpointError::Serialize {
            path: self.path().to_path_buf(),
            source,
        };
        let data = serde_json::to_value(value).map_err(ser)?;
        let envelope = Envelope {
            kind: self.kind.clone(),
            version: self.version,
            crc32: crc_of(&data),
            data,
        };
        serde_json::to_vec(&envelope).map_err(ser)
    }

    /// Reads the state back from the newest usable generation; never fails (see the
    /// module doc). `value` is `None` for empty state.
    pub fn load<T: DeserializeOwned>(&self) -> Loaded<T> {
        self.file.load(|bytes| self.decode(bytes))
    }

    /// What [`load`](Self::load) makes of one generation's bytes: the envelope checked
    /// (checksum, kind, version), then the data. Public so the fuzz targets (`fuzz/`) reach
    /// the exact decoder a load uses, without a file.
    pub fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, Refusal> {
        let envelope: Envelope = serde_json::from_slice(bytes)
            .map_err(|e| Refusal::Damaged(printable(&format!("not a checkpoint: {e}"))))?;
        let found = crc_of(&envelope.data);
        if found != envelope.crc32 {
            return Err(Refusal::Damaged(format!(
                "checksum {found} does not match the recorded {:?}",
                envelope.crc32
            )));
        }
        if envelope.kind != self.kind {
            return Err(Refusal::Damaged(format!(
                "holds {:?}, not {:?}",
                envelope.kind, self.kind
            )));
        }
        if envelope.version != self.version {
            return Err(Refusal::OtherVersion(format!(
                "holds {} version {}, this agent reads version {}",
                envelope.kind, envelope.version, self.version
            )));
        }
        serde_path_to_error::deserialize(envelope.data).map_err(|e| {
            Refusal::Damaged(printable(&format!("data at {}: {}", e.path(), e.inner())))
        })
    }

    /// Deletes the checkpoint and its previous generation (a missing file is fine).
    #[cfg(test)]
    pub(crate) fn remove(&self) -> Result<(), CheckpointError> {
        Ok(self.file.remove()?)
    }
}

/// `text` on one line as written: line breaks become spaces and other control characters
/// are escaped. A refusal quotes the file's own keys and strings, which may hold anything
/// (the `checkpoint_images` fuzz target found a key with a carriage return).
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' => " ".to_string(),
            c if c.is_control() => c.escape_default().to_string(),
            c => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::state_file::Generation;
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

    fn kept(dir: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains(".corrupt-"))
            .collect()
    }

    #[test]
    fn round_trip_and_absent() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("pods.json"), "pods", 1);
        assert_eq!(cp.load::<Pods>().value, None);
        cp.save(&sample()).unwrap();
        assert_eq!(cp.load::<Pods>().value, Some(sample()));
        // Only the checkpoint is left: the temp file was renamed.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
        cp.remove().unwrap();
        assert_eq!(cp.load::<Pods>().value, None);
    }

    #[test]
    fn every_truncation_is_set_aside_and_the_previous_generation_used() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("pods.json"), "pods", 1);
        cp.save(&Pods {
            uids: vec![],
            restarts: BTreeMap::new(),
        })
        .unwrap();
        cp.save(&sample()).unwrap();
        let full = std::fs::read(cp.path()).unwrap();
        let prev = std::fs::read(cp.file.prev_path()).unwrap();
        for len in 0..full.len() {
            std::fs::write(cp.path(), &full[..len]).unwrap();
            let loaded = Checkpoint::new(cp.path(), "pods", 1).load::<Pods>();
            assert_eq!(loaded.generation, Generation::Previous, "offset {len}");
            assert_eq!(loaded.value.unwrap().uids.len(), 0);
            let k = kept(dir.path());
            assert_eq!(k.len(), 1, "offset {len}");
            assert_eq!(std::fs::read(&k[0]).unwrap(), &full[..len]);
            std::fs::remove_file(&k[0]).unwrap();
            assert!(loaded.notices.iter().all(|n| !n.message.contains('\n')));
            assert!(!cp.path().exists(), "bad file moved aside at offset {len}");
            assert_eq!(std::fs::read(cp.file.prev_path()).unwrap(), prev);
        }
    }

    #[test]
    fn flipped_byte_fails_the_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("pods.json"), "pods", 1);
        cp.save(&sample()).unwrap();
        let text = std::fs::read_to_string(cp.path()).unwrap();
        std::fs::write(cp.path(), text.replace("\"a1\"", "\"a7\"")).unwrap();
        let loaded = cp.load::<Pods>();
        assert_eq!(loaded.value, None);
        assert!(loaded.notices[0].message.contains("checksum"), "{loaded:?}");
        assert_eq!(kept(dir.path()).len(), 1);
    }

    #[test]
    fn wrong_shape_names_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path().join("pods.json"), "pods", 1);
        cp.save(&serde_json::json!({"uids": [1], "restarts": {}}))
            .unwrap();
        let loaded = cp.load::<Pods>();
        assert!(loaded.notices[0].message.contains("uids[0]"), "{loaded:?}");
    }

    #[test]
    fn refusals_quoting_the_file_stay_on_one_line() {
        // Found by the checkpoint_images fuzz target: a key holding a carriage return was
        // quoted raw in the "data at" refusal.
        let cp = Checkpoint::new("image-records.json", "image-records", 1);
        let data = serde_json::json!({"images": {"sha256:a": {"x\ry": true}}});
        let err = cp.decode::<Pods>(&cp.encode(&data).unwrap()).unwrap_err();
        let Refusal::Damaged(text) = err else {
            panic!("{err:?}")
        };
        assert!(text.starts_with("data at"), "{text}");
        assert!(!text.contains(['\r', '\n']), "{text:?}");
        // The recorded checksum is the file's text too.
        let bad_crc = br#"{"kind":"pods","version":1,"crc32":"a\r\nb","data":{}}"#;
        let err = cp.decode::<Pods>(bad_crc).unwrap_err();
        let Refusal::Damaged(text) = err else {
            panic!("{err:?}")
        };
        assert!(text.starts_with("checksum"), "{text}");
        assert!(!text.contains(['\r', '\n']), "{text:?}");
    }

    #[test]
    fn other_version_is_set_aside_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pods.json");
        Checkpoint::new(&path, "pods", 2).save(&sample()).unwrap();
        let written = std::fs::read(&path).unwrap();
        let cp = Checkpoint::new(&path, "pods", 1);
        let loaded = cp.load::<Pods>();
        assert_eq!(loaded.value, None);
        assert!(
            loaded.notices[0].message.contains("version 2"),
            "{loaded:?}"
        );
        cp.save(&sample()).unwrap();
        let aside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains(".unsupported-"))
            .collect();
        assert_eq!(aside.len(), 1);
        assert_eq!(std::fs::read(&aside[0]).unwrap(), written);
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
        assert!(cp.is_failing());
    }
}
