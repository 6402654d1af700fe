//! cgroup v1: a usage threshold on `memory.usage_in_bytes` and the OOM notification on
//! `memory.oom_control`, each an eventfd registered through `cgroup.event_control`. The
//! kernel signals a threshold eventfd when usage crosses it in *either* direction, so the
//! event carries the usage read at wake-up to tell which. A moving threshold is registered
//! anew on a blocking thread (`V1Registration`) while the old one stays armed.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::event::{eventfd, EventfdFlags};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, watch};

use super::counters::parse_counters;
use super::thresholds::Level;
use crate::sense::clock::monotonic_ns;
use crate::sense::event::{Kind, PressureEvent, Source};
use crate::sense::fd::register_fd;

/// Why a v1 notification could not be registered; each names the cgroup or file at fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum V1Error {
    /// The cgroup's directory does not exist.
    #[error("cgroup {} absent", .0.display())]
    CgroupAbsent(PathBuf),
    /// The file to watch does not exist.
    #[error("{} absent", .0.display())]
    FileAbsent(PathBuf),
    /// The file to watch could not be opened.
    #[error("cannot open {}: {errno}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The kernel's errno.
        #[source]
        errno: Errno,
    },
    /// No eventfd could be made.
    #[error("eventfd: {0}")]
    Eventfd(#[source] Errno),
    /// `cgroup.event_control` refused the registration.
    #[error("kernel refused {line:?} on {}: {source}{}", control.display(), refusal_hint(source))]
    Refused {
        /// The line written (`"<eventfd> <fd> [<bytes>]"`).
        line: String,
        /// The `cgroup.event_control` file.
        control: PathBuf,
        /// The write's error.
        #[source]
        source: std::io::Error,
    },
    /// The eventfd could not join the runtime's poller.
    #[error("cannot register eventfd: {0}")]
    RegisterFd(#[source] std::io::Error),
    /// The blocking thread that registered a moved threshold did not finish.
    #[error("the registering thread failed: {0}")]
    Thread(#[source] tokio::task::JoinError),
}

/// What a refused registration most likely means, for its one line.
fn refusal_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => " (not root?)",
        std::io::ErrorKind::NotFound => " (not a v1 memory cgroup?)",
        _ => "",
    }
}

/// The least move worth a new v1 registration: each one allocates the cgroup's threshold
/// arrays anew and the old eventfd's removal waits for an RCU grace period in the kernel,
/// so a level following the page cache page by page would churn for nothing. Inside the
/// step the v1 notification may come up to this much early and the loop's close watch
/// finishes the approach; the eBPF slot has no such cost and follows every page.
pub(crate) const V1_MOVE_STEP_BYTES: u64 = 1 << 20;

/// Whether a v1 threshold registered at `registered` bytes should move to `want`.
pub(crate) fn v1_moves(registered: u64, want: u64) -> bool {
    registered.abs_diff(want) >= V1_MOVE_STEP_BYTES
}

/// What a v1 eventfd is registered for.
#[derive(Clone, Copy, Debug)]
enum V1Notification {
    Threshold(u64),
    Oom,
}

/// A v1 eventfd registered with `cgroup.event_control`.
pub(crate) struct EventfdWatch {
    eventfd: AsyncFd<OwnedFd>,
    /// The file the notification is registered on (`memory.usage_in_bytes` or
    /// `memory.oom_control`), read through this fd at wake-up.
    watched: OwnedFd,
    dir: PathBuf,
    cgroup: String,
    what: V1Notification,
    /// Where the threshold should be (a threshold watch whose level can move).
    moves: Option<watch::Receiver<Level>>,
}

fn open_ro(path: &Path) -> Result<OwnedFd, V1Error> {
    rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).map_err(|e| match e {
        Errno::NOENT => V1Error::FileAbsent(path.to_path_buf()),
        _ => V1Error::Open {
            path: path.to_path_buf(),
            errno: e,
        },
    })
}

pub(crate) fn register_v1(
    dir: &Path,
    file: &str,
    arg: Option<u64>,
) -> Result<(OwnedFd, OwnedFd), V1Error> {
    if !dir.is_dir() {
        return Err(V1Error::CgroupAbsent(dir.to_path_buf()));
    }
    let watched = open_ro(&dir.join(file))?;
    let efd =
        eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(V1Error::Eventfd)?;
    let line = match arg {
        Some(bytes) => format!("{} {} {bytes}", efd.as_raw_fd(), watched.as_raw_fd()),
        None => format!("{} {}", efd.as_raw_fd(), watched.as_raw_fd()),
    };
    let control = dir.join("cgroup.event_control");
    std::fs::write(&control, &line).map_err(|source| V1Error::Refused {
        line: line.clone(),
        control: control.clone(),
        source,
    })?;
    Ok((efd, watched))
}

/// Registers a v1 usage threshold on a cgroup directory; `moves` re-arms it elsewhere.
pub(crate) fn arm_v1_threshold(
    dir: &Path,
    cgroup: &str,
    threshold_bytes: u64,
    moves: Option<watch::Receiver<Level>>,
) -> Result<EventfdWatch, V1Error> {
    let (efd, watched) = register_v1(dir, "memory.usage_in_bytes", Some(threshold_bytes))?;
    let mut w = EventfdWatch::new(
        efd,
        watched,
        dir,
        cgroup,
        V1Notification::Threshold(threshold_bytes),
    )?;
    w.moves = moves;
    Ok(w)
}

/// Registers the v1 OOM notification on a cgroup directory.
pub(crate) fn arm_v1_oom(dir: &Path, cgroup: &str) -> Result<EventfdWatch, V1Error> {
    let (efd, watched) = register_v1(dir, "memory.oom_control", None)?;
    EventfdWatch::new(efd, watched, dir, cgroup, V1Notification::Oom)
}

/// Reads a cgroup file through an fd we hold open (from offset 0, as the kernel regenerates
/// the text on every read).
fn pread_text(fd: &OwnedFd) -> Option<String> {
    let mut buf = [0u8; 512];
    let n = rustix::io::pread(fd, &mut buf, 0).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// The `oom_kill` count of a `memory.oom_control` text.
fn oom_kills(text: Option<String>) -> u64 {
    text.and_then(|t| parse_counters(&t).ok())
        .and_then(|c| c.get("oom_kill").copied())
        .unwrap_or(0)
}

/// A v1 usage threshold being registered on a blocking thread. Each registration waits for
/// an RCU grace period in the kernel (10-30 ms under load), and the sources share the reactor
/// loop's one runtime thread: made there, it held the loop for that long. Awaited, it gives
/// the new eventfd (registered with the runtime) and the usage file it watches.
pub(crate) struct V1Registration {
    bytes: u64,
    dir: PathBuf,
    task: tokio::task::JoinHandle<Result<(OwnedFd, OwnedFd), V1Error>>,
}

impl V1Registration {
    /// Starts registering a threshold at `bytes` on `dir`'s `memory.usage_in_bytes`.
    pub fn start(dir: &Path, bytes: u64) -> V1Registration {
        let at = dir.to_path_buf();
        V1Registration {
            bytes,
            dir: dir.to_path_buf(),
            task: tokio::task::spawn_blocking(move || {
                register_v1(&at, "memory.usage_in_bytes", Some(bytes))
            }),
        }
    }

    /// The level being registered.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The cgroup directory it is registered on.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl std::future::Future for V1Registration {
    type Output = Result<(AsyncFd<OwnedFd>, OwnedFd), V1Error>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.task).poll(cx).map(|joined| {
            let (efd, watched) = joined.map_err(V1Error::Thread).and_then(|r| r)?;
            let efd =
                register_fd(efd, tokio::io::Interest::READABLE).map_err(V1Error::RegisterFd)?;
            Ok((efd, watched))
        })
    }
}

impl std::fmt::Debug for V1Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("V1Registration")
            .field("bytes", &self.bytes)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// Waits for the registration in flight and gives its level with what it gave; never
/// returns when there is none.
async fn landed(
    moving: &mut Option<V1Registration>,
) -> (u64, Result<(AsyncFd<OwnedFd>, OwnedFd), V1Error>) {
    match moving {
        Some(r) => (r.bytes(), r.await),
        None => std::future::pending().await,
    }
}

impl EventfdWatch {
    fn new(
        efd: OwnedFd,
        watched: OwnedFd,
        dir: &Path,
        cgroup: &str,
        what: V1Notification,
    ) -> Result<EventfdWatch, V1Error> {
        let eventfd =
            register_fd(efd, tokio::io::Interest::READABLE).map_err(V1Error::RegisterFd)?;
        Ok(EventfdWatch {
            eventfd,
            watched,
            dir: dir.to_path_buf(),
            cgroup: cgroup.to_string(),
            what,
            moves: None,
        })
    }

    /// Takes the threshold registered at `bytes` (with its new eventfd) in place of the old
    /// one, whose eventfd is dropped (the kernel removes an event whose eventfd is closed).
    fn rearmed(&mut self, bytes: u64, efd: AsyncFd<OwnedFd>, watched: OwnedFd) {
        self.eventfd = efd;
        self.watched = watched;
        self.what = V1Notification::Threshold(bytes);
    }

    /// Waits for the threshold to move; never returns for a watch that cannot move.
    async fn moved(moves: &mut Option<watch::Receiver<Level>>) -> Option<u64> {
        match moves {
            Some(rx) => match rx.changed().await {
                Ok(()) => Some(rx.borrow_and_update().usage_bytes),
                Err(_) => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }

    /// What this watch is, for the attach report.
    pub(crate) fn describe(&self) -> String {
        match self.what {
            V1Notification::Threshold(bytes) => format!(
                "v1 threshold {} on {}/memory.usage_in_bytes",
                crate::human::bytes(i128::from(bytes)),
                self.dir.display()
            ),
            V1Notification::Oom => {
                format!(
                    "v1 OOM notification on {}/memory.oom_control",
                    self.dir.display()
                )
            }
        }
    }

    /// Sends one event per eventfd wake-up until the receiver is gone or the cgroup is
    /// removed (the kernel signals the eventfd on removal too).
    pub(crate) async fn run(mut self, tx: mpsc::Sender<PressureEvent>) {
        let mut kills_seen = oom_kills(pread_text(&self.watched));
        let mut moves = self.moves.take();
        // A registration runs on a blocking thread ([`V1Registration`]), with the old
        // threshold still armed (and read here) until the new one is in place. Moves that
        // come meanwhile wait in the watch channel; the latest is taken after.
        let mut moving: Option<V1Registration> = None;
        loop {
            let mut guard = tokio::select! {
                ready = self.eventfd.readable() => match ready {
                    Ok(guard) => guard,
                    Err(e) => {
                        tracing::warn!(cgroup = %self.cgroup, error = %e, "memcg eventfd wait failed; watch stops");
                        return;
                    }
                },
                Some(bytes) = Self::moved(&mut moves), if moving.is_none() => {
                    let V1Notification::Threshold(registered) = self.what else {
                        continue;
                    };
                    if !v1_moves(registered, bytes) {
                        continue;
                    }
                    moving = Some(V1Registration::start(&self.dir, bytes));
                    continue;
                }
                (bytes, done) = landed(&mut moving) => {
                    moving = None;
                    match done {
                        Ok((efd, watched)) => self.rearmed(bytes, efd, watched),
                        Err(e) => tracing::warn!(cgroup = %self.cgroup, error = %e, "memcg threshold not moved; the old one stays"),
                    }
                    continue;
                }
            };
            let at_ns = monotonic_ns();
            let mut counter = [0u8; 8];
            match guard.try_io(|fd| {
                rustix::io::read(fd.get_ref(), &mut counter).map_err(std::io::Error::from)
            }) {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(cgroup = %self.cgroup, error = %e, "memcg eventfd read failed; watch stops");
                    return;
                }
                Err(_would_block) => continue,
            }
            if !self.dir.is_dir() {
                tracing::info!(cgroup = %self.cgroup, "cgroup removed; its memcg watch stops");
                return;
            }
            let kind = match self.what {
                V1Notification::Threshold(bytes) => Kind::ThresholdCrossed {
                    threshold_bytes: Some(bytes),
                    usage_bytes: pread_text(&self.watched).and_then(|t| t.trim().parse().ok()),
                    killed: None,
                },
                V1Notification::Oom => {
                    let kills = oom_kills(pread_text(&self.watched));
                    let killed = kills > kills_seen;
                    kills_seen = kills;
                    if killed {
                        Kind::OomKill {
                            pid: None,
                            comm: None,
                            rss_bytes: None,
                            oom_score_adj: None,
                        }
                    } else {
                        Kind::MemcgEvent {
                            item: "oom".to_string(),
                            count: u64::from_ne_bytes(counter),
                        }
                    }
                }
            };
            let event = PressureEvent {
                at_ns,
                woke_ns: Some(at_ns),
                source: Source::MemcgThreshold,
                cgroup: Some(self.cgroup.clone()),
                kind,
            };
            if tx.send(event).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_registrations_move_only_by_a_step() {
        let at = 384 << 20;
        assert!(
            !v1_moves(at, at + (300 << 10)),
            "a page cache's drift stays"
        );
        assert!(!v1_moves(at, at - (1 << 20) + 1));
        assert!(v1_moves(at, at + (1 << 20)));
        assert!(v1_moves(at, at - (1 << 20)));
    }

    #[test]
    fn a_missing_cgroup_is_named() {
        let e = register_v1(Path::new("/nonexistent/cg"), "memory.oom_control", None)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "cgroup /nonexistent/cg absent");
    }
}
