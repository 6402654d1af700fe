//! The kill journal: one line per eviction whose processes were killed before its stop was
//! written ahead to the pod checkpoint.
//!
//! Why: an eviction's SIGKILL comes first ([`super::PodManager::kill_now`] kills from the
//! reactor loop's own thread), and the write-ahead stop record, an fsync'd checkpoint, is
//! left to the owner task, which may first finish an apply that 50 API clients queued. An
//! agent killed in between used to find the pod's containers dead and no stop recorded,
//! and started the pod again: the eviction was undone. Now the kill is noted here right
//! after the signal, with a plain append and no fsync: the note survives the agent's own
//! death (the kernel keeps the written page), which is the case in question, while a power
//! loss takes the pods with it anyway. At start, a note for a pod the checkpoint shows
//! neither ended nor stopping becomes that pod's stop intent, which recovery completes
//! (`node::recover`): the pod ends evicted. The journal is emptied once the checkpoint holds
//! every noted stop, so it stays a few lines long.
//!
//! A journal that cannot be opened or written is logged and the eviction goes on: the note
//! narrows a window, it never holds a kill up.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::pod_record::{PodRecord, StopIntent};

/// The journal's file name in `stateDir`.
pub const FILE_NAME: &str = "evictions.journal";

/// One noted kill: the pod and the status its eviction gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KillNote {
    /// `metadata.uid`.
    pub uid: String,
    /// `status.reason` (`Evicted`).
    pub reason: String,
    /// `status.message`.
    pub message: String,
}

/// The open journal, shared by the eviction's kill (appends) and the owner task (empties).
pub struct KillJournal {
    path: PathBuf,
    file: Mutex<Option<File>>,
}

impl KillJournal {
    /// Opens (creating) `<state_dir>/evictions.journal` for appending.
    pub fn open(state_dir: &Path) -> KillJournal {
        let path = state_dir.join(FILE_NAME);
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .inspect_err(|e| {
                tracing::error!(path = %path.display(), "kill journal not opened, an agent killed mid-eviction may restart the pod: {e}");
            })
            .ok();
        KillJournal {
            path,
            file: Mutex::new(file),
        }
    }

    fn file(&self) -> std::sync::MutexGuard<'_, Option<File>> {
        self.file.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends the kill of pod `uid` for an eviction with `reason` and `message` as one
    /// JSON line (one `write`).
    pub fn note(&self, uid: &str, reason: &str, message: &str) {
        let note = KillNote {
            uid: uid.to_string(),
            reason: reason.to_string(),
            message: message.to_string(),
        };
        let Some(line) = Self::line(&note) else {
            return;
        };
        if let Some(f) = self.file().as_mut() {
            if let Err(e) = f.write_all(&line) {
                tracing::error!(path = %self.path.display(), uid = %note.uid, "kill not noted in the journal: {e}");
            }
        }
    }

    /// Empties the journal unless `pending()` says a noted kill may not be in the checkpoint
    /// yet. `pending` is asked under the journal's lock, so a kill noted after it answered
    /// is appended after the truncation and kept.
    pub(crate) fn clear_unless(&self, pending: impl FnOnce() -> bool) {
        let guard = self.file();
        let Some(f) = guard.as_ref() else {
            return;
        };
        if pending() {
            return;
        }
        if let Err(e) = f.set_len(0) {
            tracing::warn!(path = %self.path.display(), "kill journal not emptied: {e}");
        }
    }

    /// The notes in `<state_dir>/evictions.journal`; a line that does not parse (cut short
    /// by a crash of the machine) is logged and skipped, a missing file is no notes.
    pub fn read(state_dir: &Path) -> Vec<KillNote> {
        let path = state_dir.join(FILE_NAME);
        let text = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => {
                tracing::error!(path = %path.display(), "kill journal unreadable, ignored: {e}");
                return Vec::new();
            }
        };
        Self::parse(&text, &path)
    }

    /// The notes in a journal's bytes, as [`read`](Self::read) finds them; `path` only names
    /// the file in the log. Public so the fuzz targets (`fuzz/`) reach the journal's parser
    /// without a file.
    pub fn parse(text: &[u8], path: &Path) -> Vec<KillNote> {
        text.split(|&b| b == b'\n')
            .enumerate()
            .filter(|(_, line)| !line.is_empty())
            .filter_map(|(i, line)| {
                serde_json::from_slice(line)
                    .inspect_err(|e| {
                        tracing::warn!(path = %path.display(), line = i + 1, "kill journal line unreadable, skipped: {e}");
                    })
                    .ok()
            })
            .collect()
    }

    /// The line [`note`](Self::note) appends for `note`, newline included.
    pub fn line(note: &KillNote) -> Option<Vec<u8>> {
        let mut line = serde_json::to_vec(note).ok()?;
        line.push(b'\n');
        Some(line)
    }
}

/// Gives each pod that a note names, and that the checkpoint shows neither ended nor
/// stopping, the eviction's stop intent: the agent died between the kill and the
/// write-ahead record, and recovery finishes the eviction.
pub(super) fn stops_from_notes(records: &mut [PodRecord], notes: &[KillNote]) {
    for note in notes {
        let Some(r) = records.iter_mut().find(|r| r.uid == note.uid) else {
            continue;
        };
        if r.stopping.is_some() || r.ended_by_agent || r.is_terminal() {
            continue;
        }
        tracing::warn!(pod = %r.full_name(), uid = %r.uid, "killed for eviction before the stop was recorded: the eviction is finished");
        r.stopping = Some(StopIntent::Evict {
            reason: note.reason.clone(),
            message: note.message.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(uid: &str) -> KillNote {
        KillNote {
            uid: uid.into(),
            reason: "Evicted".into(),
            message: "The node was low on resource: memory.".into(),
        }
    }

    fn note_in(j: &KillJournal, uid: &str) {
        let n = note(uid);
        j.note(&n.uid, &n.reason, &n.message);
    }

    #[test]
    fn notes_are_read_back_in_order_and_a_torn_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        assert!(KillJournal::read(dir.path()).is_empty());
        let j = KillJournal::open(dir.path());
        note_in(&j, "a");
        note_in(&j, "b");
        // A line cut short, then garbage, then a good line again.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join(FILE_NAME))
            .unwrap();
        f.write_all(b"{\"uid\":\"c\",\"rea\n\x00\xff\n").unwrap();
        note_in(&j, "d");
        let uids: Vec<String> = KillJournal::read(dir.path())
            .into_iter()
            .map(|n| n.uid)
            .collect();
        assert_eq!(uids, ["a", "b", "d"]);
        assert_eq!(KillJournal::read(dir.path())[0], note("a"));
    }

    #[test]
    fn the_journal_is_emptied_only_when_nothing_is_pending() {
        let dir = tempfile::tempdir().unwrap();
        let j = KillJournal::open(dir.path());
        note_in(&j, "a");
        j.clear_unless(|| true);
        assert_eq!(KillJournal::read(dir.path()).len(), 1);
        j.clear_unless(|| false);
        assert!(KillJournal::read(dir.path()).is_empty());
        // Appends after a truncation start at the beginning again.
        note_in(&j, "b");
        assert_eq!(KillJournal::read(dir.path()), [note("b")]);
    }

    #[test]
    fn an_unopenable_journal_notes_nothing_and_does_not_fail() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(FILE_NAME)).unwrap();
        let j = KillJournal::open(dir.path());
        note_in(&j, "a");
        j.clear_unless(|| false);
        assert!(KillJournal::read(dir.path()).is_empty());
    }
}
