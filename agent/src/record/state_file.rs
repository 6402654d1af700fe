//! State files that never keep the agent from starting, and never lose what they held.
//!
//! Why: a pressure agent's first duty is to be running. A power cut, a full disk or a hand
//! edit can leave any state file (the pod checkpoint, the process runtime's state, the
//! image records, the device checkpoint) truncated, zeroed, replaced by garbage, unreadable,
//! or written by a newer agent. None of that may stop a start, and none of it may be thrown
//! away: an operator needs the damaged file to understand what happened.
//!
//! One mechanism for every state file, whatever its format (the format's own decoder is an
//! argument, so the kubelet-format device checkpoint shares it with the JSON envelopes of
//! [`super::checkpoint`]):
//!
//! - **Two generations.** Each successful write keeps the file it replaces as
//!   `<name>.prev` — but only a file known to be good (this process loaded it or wrote it),
//!   so a damaged current file never pushes the last good generation out. The write itself
//!   is crash-safe: temp file, fsync, hard link of the current file to `.prev` (renamed into
//!   place), rename of the temp file over the current one, fsync of the directory. At every
//!   instant the current name holds a complete file, old or new.
//! - **Load falls back** current → previous → empty. A file that cannot be used (does not
//!   decode, fails its checksum, is not a regular file, cannot be read, or is of another
//!   version) is renamed aside to `<name>.corrupt-<unix seconds>` (`.unsupported-…` for
//!   another version, so a newer agent can still be pointed at it), never deleted and never
//!   overwritten in place. Each such step is one loud log line naming the file and what was
//!   wrong, and a [`StateNotice`] the agent turns into an event on `reactor events`.
//! - **Failed writes are reported, not fatal.** The first failed write (a full filesystem,
//!   say) is logged and noticed; the owner keeps serving and writes again on its next change
//!   or its periodic retry; the first write that succeeds again is noticed too.
//!
//! Reading opens with `O_NONBLOCK | O_NOFOLLOW` and checks the file is a regular file first,
//! so a FIFO, a device node or a directory put in a state file's place is set aside instead
//! of hanging or confusing the start.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// Why a decoder refused a file's bytes; one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Damaged: truncated, not the format, checksum mismatch, wrong shape.
    Damaged(String),
    /// Intact but of another format version (a newer agent's).
    OtherVersion(String),
}

/// Which generation a load used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Generation {
    /// The current file.
    Current,
    /// `<name>.prev`, the last good generation before it.
    Previous,
    /// Neither: empty state.
    Empty,
}

impl Generation {
    fn words(self) -> &'static str {
        match self {
            Generation::Current => "the current file",
            Generation::Previous => "the previous generation",
            Generation::Empty => "empty state",
        }
    }
}

/// What a load found.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded<T> {
    /// The state, when a generation could be used.
    pub value: Option<T>,
    /// Which one.
    pub generation: Generation,
    /// What was wrong on the way (each already logged and noticed).
    pub notices: Vec<StateNotice>,
}

/// What happened to a state file, for the log and the event stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateNotice {
    /// The state file concerned (the current name).
    pub file: PathBuf,
    /// What happened.
    pub action: NoticeAction,
    /// One line for people: what was wrong, where the file is now, what the agent did.
    pub message: String,
}

/// The kinds of [`StateNotice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoticeAction {
    /// A damaged, unreadable or other-version file was renamed aside.
    SetAside,
    /// The current file was missing or bad and the previous generation was used.
    FellBack,
    /// A write failed (the first of a run of failures).
    WriteFailed,
    /// A write succeeded after failures.
    WriteRecovered,
}

impl NoticeAction {
    /// The word events and metrics use: `set-aside`, `fell-back`, `write-failed`,
    /// `write-recovered`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NoticeAction::SetAside => "set-aside",
            NoticeAction::FellBack => "fell-back",
            NoticeAction::WriteFailed => "write-failed",
            NoticeAction::WriteRecovered => "write-recovered",
        }
    }
}

/// Where notices go besides the log: the agent forwards them to its event stream. Cheap to
/// clone; the default only logs.
#[derive(Clone, Default)]
pub struct Notices(Option<Arc<NoticeFn>>);

/// What a [`Notices`] forwards to.
type NoticeFn = dyn Fn(&StateNotice) + Send + Sync;

impl std::fmt::Debug for Notices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Notices(forwarded)"
        } else {
            "Notices(log only)"
        })
    }
}

impl Notices {
    /// Notices that also go to `f`.
    pub(crate) fn to(f: impl Fn(&StateNotice) + Send + Sync + 'static) -> Notices {
        Notices(Some(Arc::new(f)))
    }

    /// Logs `n` (error for trouble, info for a recovery) and forwards it.
    pub(crate) fn send(&self, n: &StateNotice) {
        let file = n.file.display();
        match n.action {
            NoticeAction::WriteRecovered => {
                tracing::info!(%file, action = n.action.as_str(), "state file: {}", n.message)
            }
            _ => tracing::error!(%file, action = n.action.as_str(), "state file: {}", n.message),
        }
        if let Some(f) = &self.0 {
            f(n);
        }
    }
}

/// Why a write failed; one line naming the file.
#[derive(Debug, thiserror::Error)]
#[error("state file {path}: {op}: {source}")]
pub struct WriteError {
    /// The file or directory the operation was on.
    pub path: PathBuf,
    /// What was being done.
    pub op: &'static str,
    /// The kernel's error.
    pub source: std::io::Error,
}

/// Why a state file could not be read as a plain file; it is then taken as damaged.
#[derive(Debug, thiserror::Error)]
enum Unreadable {
    /// A symbolic link where the file should be (never followed).
    #[error("is a symbolic link")]
    Symlink,
    /// Opening it failed.
    #[error("cannot open: {0}")]
    Open(#[source] std::io::Error),
    /// Its metadata could not be read.
    #[error("cannot stat: {0}")]
    Stat(#[source] std::io::Error),
    /// A directory or another non-regular file.
    #[error("is {0}")]
    NotFile(&'static str),
    /// Reading it failed.
    #[error("cannot read: {0}")]
    Read(#[source] std::io::Error),
}

/// A bad file could not be renamed aside.
#[derive(Debug, thiserror::Error)]
#[error("could not be moved aside: {0}")]
struct NotSetAside(#[source] std::io::Error);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Current {
    /// Neither loaded nor written by this process: taken as good.
    Unknown,
    Good,
    Absent,
    /// Bad and could not be moved aside: never overwritten.
    Stuck,
}

#[derive(Debug)]
struct Tracked {
    current: Current,
    failing: Option<String>,
}

/// One state file with its previous generation; see the module doc. Clones share what they
/// know about the file.
#[derive(Debug, Clone)]
pub(crate) struct StateFile {
    path: PathBuf,
    notices: Notices,
    tracked: Arc<Mutex<Tracked>>,
}

enum Attempt<T> {
    Ok(T),
    Absent,
    Bad(Refusal),
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

impl StateFile {
    /// The state file at `path`; nothing is read or written yet.
    pub fn new(path: impl Into<PathBuf>) -> StateFile {
        StateFile {
            path: path.into(),
            notices: Notices::default(),
            tracked: Arc::new(Mutex::new(Tracked {
                current: Current::Unknown,
                failing: None,
            })),
        }
    }

    /// Sends notices to `notices` as well as the log.
    pub fn with_notices(mut self, notices: Notices) -> StateFile {
        self.notices = notices;
        self
    }

    /// The current file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The previous generation, `<name>.prev`.
    pub(crate) fn prev_path(&self) -> PathBuf {
        with_suffix(&self.path, ".prev")
    }

    fn lock(&self) -> MutexGuard<'_, Tracked> {
        self.tracked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the last write failed (the owner retries while it does).
    pub(crate) fn is_failing(&self) -> bool {
        self.lock().failing.is_some()
    }

    fn read(path: &Path) -> Result<Option<Vec<u8>>, Unreadable> {
        let mut file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(Unreadable::Symlink),
            Err(e) => return Err(Unreadable::Open(e)),
        };
        let meta = file.metadata().map_err(Unreadable::Stat)?;
        if !meta.is_file() {
            let what = if meta.is_dir() {
                "a directory"
            } else {
                "not a regular file"
            };
            return Err(Unreadable::NotFile(what));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
        file.read_to_end(&mut bytes).map_err(Unreadable::Read)?;
        Ok(Some(bytes))
    }

    fn attempt<T>(path: &Path, decode: &impl Fn(&[u8]) -> Result<T, Refusal>) -> Attempt<T> {
        match Self::read(path) {
            Ok(None) => Attempt::Absent,
            Ok(Some(bytes)) => match decode(&bytes) {
                Ok(v) => Attempt::Ok(v),
                Err(r) => Attempt::Bad(r),
            },
            Err(reason) => Attempt::Bad(Refusal::Damaged(reason.to_string())),
        }
    }

    /// Renames a bad file aside; `None` when even that failed (the reason says why).
    fn set_aside(path: &Path, refusal: &Refusal) -> Result<PathBuf, NotSetAside> {
        let tag = match refusal {
            Refusal::Damaged(_) => "corrupt",
            Refusal::OtherVersion(_) => "unsupported",
        };
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut kept = with_suffix(path, &format!(".{tag}-{secs}"));
        let mut n = 1;
        while std::fs::symlink_metadata(&kept).is_ok() {
            kept = with_suffix(path, &format!(".{tag}-{secs}.{n}"));
            n += 1;
        }
        std::fs::rename(path, &kept).map_err(NotSetAside)?;
        if let Some(dir) = path.parent() {
            let _ = File::open(dir).and_then(|d| d.sync_all());
        }
        Ok(kept)
    }

    /// Loads the newest usable generation with `decode`: current, else previous, else
    /// nothing. Never fails; what was wrong is in the result's notices, already logged and
    /// sent.
    pub fn load<T>(&self, decode: impl Fn(&[u8]) -> Result<T, Refusal>) -> Loaded<T> {
        let mut problems: Vec<(PathBuf, String, NoticeAction)> = Vec::new();
        let mut tracked = self.lock();
        let mut out = Loaded {
            value: None,
            generation: Generation::Empty,
            notices: Vec::new(),
        };
        let mut current_missing = false;
        match Self::attempt(&self.path, &decode) {
            Attempt::Ok(v) => {
                tracked.current = Current::Good;
                out.value = Some(v);
                out.generation = Generation::Current;
                return out;
            }
            Attempt::Absent => {
                tracked.current = Current::Absent;
                current_missing = true;
            }
            Attempt::Bad(r) => {
                let reason = match &r {
                    Refusal::Damaged(s) | Refusal::OtherVersion(s) => s.clone(),
                };
                match Self::set_aside(&self.path, &r) {
                    Ok(kept) => {
                        tracked.current = Current::Absent;
                        problems.push((
                            self.path.clone(),
                            format!("{reason}; kept as {}", kept.display()),
                            NoticeAction::SetAside,
                        ));
                    }
                    Err(why) => {
                        tracked.current = Current::Stuck;
                        problems.push((
                            self.path.clone(),
                            format!("{reason}; {why}; it will not be overwritten"),
                            NoticeAction::SetAside,
                        ));
                    }
                }
            }
        }
        let prev = self.prev_path();
        match Self::attempt(&prev, &decode) {
            Attempt::Ok(v) => {
                out.value = Some(v);
                out.generation = Generation::Previous;
                let why = if current_missing {
                    "missing"
                } else {
                    "unusable"
                };
                problems.push((
                    self.path.clone(),
                    format!("{why}; state restored from {}", prev.display()),
                    NoticeAction::FellBack,
                ));
            }
            Attempt::Absent => {}
            Attempt::Bad(r) => {
                let reason = match &r {
                    Refusal::Damaged(s) | Refusal::OtherVersion(s) => s.clone(),
                };
                let kept = Self::set_aside(&prev, &r)
                    .map(|k| format!("kept as {}", k.display()))
                    .unwrap_or_else(|why| why.to_string());
                problems.push((
                    prev.clone(),
                    format!("previous generation {reason}; {kept}"),
                    NoticeAction::SetAside,
                ));
            }
        }
        drop(tracked);
        let then = out.generation.words();
        for (file, message, action) in problems {
            let message = match action {
                NoticeAction::SetAside => format!("{message}; the agent starts from {then}"),
                _ => message,
            };
            let n = StateNotice {
                file,
                action,
                message,
            };
            self.notices.send(&n);
            out.notices.push(n);
        }
        out
    }

    /// Writes `bytes` as the new current generation, keeping a good current file as
    /// `.prev` (see the module doc). The directory must exist. The first failure of a run
    /// and the first success after one are noticed.
    pub(crate) fn write(&self, bytes: &[u8]) -> Result<(), WriteError> {
        let mut tracked = self.lock();
        let result = self.write_locked(&mut tracked, bytes);
        let notice = match (&result, tracked.failing.take()) {
            (Ok(()), Some(_)) => Some(StateNotice {
                file: self.path.clone(),
                action: NoticeAction::WriteRecovered,
                message: "written again after failed writes".to_string(),
            }),
            (Ok(()), None) => None,
            (Err(e), before) => {
                let message = format!(
                    "{}: {}; the agent keeps running and retries",
                    e.op, e.source
                );
                let first = before.as_deref() != Some(message.as_str());
                tracked.failing = Some(message.clone());
                first.then(|| StateNotice {
                    file: self.path.clone(),
                    action: NoticeAction::WriteFailed,
                    message,
                })
            }
        };
        drop(tracked);
        if let Some(n) = notice {
            self.notices.send(&n);
        }
        result
    }

    fn write_locked(&self, tracked: &mut Tracked, bytes: &[u8]) -> Result<(), WriteError> {
        let io = |path: &Path, op: &'static str| {
            let path = path.to_path_buf();
            move |source| WriteError { path, op, source }
        };
        if tracked.current == Current::Stuck {
            // A bad file that could not be moved aside before: try again, and never write
            // over it.
            match Self::set_aside(&self.path, &Refusal::Damaged(String::new())) {
                Ok(_) => tracked.current = Current::Absent,
                Err(why) => {
                    return Err(WriteError {
                        path: self.path.clone(),
                        op: "keep the unusable file",
                        source: std::io::Error::other(why),
                    })
                }
            }
        }
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(self.path.file_name().unwrap_or_default());
        let prev_tmp = dir.join({
            let mut n = tmp_name.clone();
            n.push(format!(".prev-tmp-{}", std::process::id()));
            n
        });
        tmp_name.push(format!(".tmp-{}", std::process::id()));
        let tmp = dir.join(tmp_name);
        let result = (|| {
            let mut file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)
                .map_err(io(&tmp, "create temp file"))?;
            file.write_all(bytes).map_err(io(&tmp, "write temp file"))?;
            file.sync_all().map_err(io(&tmp, "fsync temp file"))?;
            drop(file);
            if matches!(tracked.current, Current::Good | Current::Unknown)
                && std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.is_file())
            {
                let _ = std::fs::remove_file(&prev_tmp);
                std::fs::hard_link(&self.path, &prev_tmp)
                    .map_err(io(&prev_tmp, "link the previous generation"))?;
                std::fs::rename(&prev_tmp, self.prev_path())
                    .map_err(io(&prev_tmp, "rename the previous generation"))?;
            }
            std::fs::rename(&tmp, &self.path).map_err(io(&self.path, "rename temp file"))?;
            File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(io(&dir, "fsync directory"))
        })();
        match &result {
            Ok(()) => tracked.current = Current::Good,
            Err(_) => {
                let _ = std::fs::remove_file(&tmp);
                let _ = std::fs::remove_file(&prev_tmp);
            }
        }
        result
    }

    /// Deletes the current file and its previous generation (a missing file is fine).
    #[cfg(test)]
    pub(crate) fn remove(&self) -> Result<(), WriteError> {
        for p in [self.path.clone(), self.prev_path()] {
            match std::fs::remove_file(&p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(WriteError {
                        path: p,
                        op: "remove",
                        source: e,
                    })
                }
                _ => {}
            }
        }
        self.lock().current = Current::Absent;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(b: &[u8]) -> Result<String, Refusal> {
        let s = std::str::from_utf8(b).map_err(|e| Refusal::Damaged(e.to_string()))?;
        if let Some(v) = s.strip_prefix("v2:") {
            return Err(Refusal::OtherVersion(format!("version 2 ({v})")));
        }
        s.strip_prefix("ok:")
            .map(str::to_string)
            .ok_or_else(|| Refusal::Damaged(format!("not ok: {s:?}")))
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn each_write_keeps_the_last_good_generation() {
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::new(dir.path().join("s"));
        assert_eq!(f.load(decode).generation, Generation::Empty);
        f.write(b"ok:1").unwrap();
        assert!(!f.prev_path().exists());
        f.write(b"ok:2").unwrap();
        f.write(b"ok:3").unwrap();
        assert_eq!(std::fs::read(f.path()).unwrap(), b"ok:3");
        assert_eq!(std::fs::read(f.prev_path()).unwrap(), b"ok:2");
        assert_eq!(names(dir.path()), ["s", "s.prev"]);
    }

    #[test]
    fn a_bad_current_falls_back_to_previous_and_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = Arc::clone(&seen);
        let f = StateFile::new(dir.path().join("s"))
            .with_notices(Notices::to(move |n| s2.lock().unwrap().push(n.clone())));
        f.write(b"ok:1").unwrap();
        f.write(b"ok:2").unwrap();
        std::fs::write(f.path(), b"ok").unwrap();
        let again = StateFile::new(dir.path().join("s")).with_notices(f.notices.clone());
        let loaded = again.load(decode);
        assert_eq!(loaded.value.as_deref(), Some("1"));
        assert_eq!(loaded.generation, Generation::Previous);
        let actions: Vec<_> = seen.lock().unwrap().iter().map(|n| n.action).collect();
        assert_eq!(actions, [NoticeAction::SetAside, NoticeAction::FellBack]);
        let kept: Vec<String> = names(dir.path())
            .into_iter()
            .filter(|n| n.starts_with("s.corrupt-"))
            .collect();
        assert_eq!(kept.len(), 1, "{:?}", names(dir.path()));
        assert_eq!(std::fs::read(dir.path().join(&kept[0])).unwrap(), b"ok");
        // The next write does not push the good previous generation out.
        again.write(b"ok:3").unwrap();
        assert_eq!(std::fs::read(again.prev_path()).unwrap(), b"ok:1");
    }

    #[test]
    fn other_version_directory_and_fifo_are_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::new(dir.path().join("s"));
        std::fs::write(f.path(), b"v2:new").unwrap();
        let l = f.load(decode);
        assert_eq!(l.generation, Generation::Empty);
        assert!(
            l.notices[0].message.contains("version 2"),
            "{:?}",
            l.notices
        );
        assert!(names(dir.path())[0].starts_with("s.unsupported-"));
        std::fs::create_dir(f.path()).unwrap();
        let l = f.load(decode);
        assert!(
            l.notices[0].message.contains("directory"),
            "{:?}",
            l.notices
        );
        assert!(std::process::Command::new("mkfifo")
            .arg(f.path())
            .status()
            .unwrap()
            .success());
        let l = f.load(decode);
        assert!(
            l.notices[0].message.contains("not a regular file"),
            "{:?}",
            l.notices
        );
        f.write(b"ok:x").unwrap();
        assert_eq!(f.load(decode).value.as_deref(), Some("x"));
        assert_eq!(names(dir.path()).len(), 4, "{:?}", names(dir.path()));
    }

    #[test]
    fn failed_writes_are_noticed_once_and_recovery_too() {
        let dir = tempfile::tempdir().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = Arc::clone(&seen);
        let f = StateFile::new(dir.path().join("sub/s"))
            .with_notices(Notices::to(move |n| s2.lock().unwrap().push(n.action)));
        assert!(f.write(b"ok:1").is_err());
        assert!(f.write(b"ok:1").is_err());
        assert!(f.is_failing());
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        f.write(b"ok:1").unwrap();
        assert!(!f.is_failing());
        assert_eq!(
            *seen.lock().unwrap(),
            [NoticeAction::WriteFailed, NoticeAction::WriteRecovered]
        );
    }
}
