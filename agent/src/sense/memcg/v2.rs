//! cgroup v2: `memory.events` watched with inotify (`IN_MODIFY`, which the kernel raises on
//! every counter change), its `low`/`high`/`max`/`oom`/`oom_kill` deltas made events. v2 has
//! no byte thresholds: a target's threshold is checked against `memory.current` whenever
//! `memory.events` moves.

use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::inotify;
use rustix::io::Errno;
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, watch};

use super::counters::{parse_counters, CountersError, EventCounters};
use super::thresholds::Level;
use crate::sense::clock::monotonic_ns;
use crate::sense::event::{Kind, PressureEvent, Source};
use crate::sense::fd::register_fd;

/// Why `memory.events` could not be watched or read; each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum V2Error {
    /// The file could not be read.
    #[error("cannot read {}: {source} (no v2 memory controller here?)", path.display())]
    Read {
        /// `memory.events`.
        path: PathBuf,
        /// The read's error.
        #[source]
        source: std::io::Error,
    },
    /// The file held something other than counters.
    #[error("{}: {source}", path.display())]
    Parse {
        /// `memory.events`.
        path: PathBuf,
        /// What was wrong.
        #[source]
        source: CountersError,
    },
    /// No inotify instance could be made.
    #[error("inotify_init: {0}")]
    InotifyInit(#[source] Errno),
    /// The watch on the file was refused.
    #[error("inotify watch on {}: {errno}", path.display())]
    Watch {
        /// `memory.events`.
        path: PathBuf,
        /// The kernel's errno.
        #[source]
        errno: Errno,
    },
    /// The inotify fd could not join the runtime's poller.
    #[error("cannot register inotify fd: {0}")]
    RegisterFd(#[source] std::io::Error),
}

/// The `memory.events` items worth an event, by kernel name.
const EVENT_ITEMS: [&str; 5] = ["low", "high", "max", "oom", "oom_group_kill"];

/// What changed between two readings of `memory.events`: one [`Kind::OomKill`] when
/// `oom_kill` moved, one [`Kind::MemcgEvent`] per other item that moved. A counter that went
/// down (the file was recreated) counts from zero.
pub(crate) fn events_delta(before: &EventCounters, now: &EventCounters) -> Vec<Kind> {
    let moved = |key: &str| {
        let n = now.get(key).copied().unwrap_or(0);
        let b = before.get(key).copied().unwrap_or(0);
        if n >= b {
            n - b
        } else {
            n
        }
    };
    let mut kinds = Vec::new();
    if moved("oom_kill") > 0 {
        kinds.push(Kind::OomKill {
            pid: None,
            comm: None,
            rss_bytes: None,
            oom_score_adj: None,
        });
    }
    for item in EVENT_ITEMS {
        let count = moved(item);
        if count > 0 {
            kinds.push(Kind::MemcgEvent {
                item: item.to_string(),
                count,
            });
        }
    }
    kinds
}

fn read_u64_file(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A v2 `memory.events` file watched with inotify.
pub(crate) struct EventsWatch {
    inotify: AsyncFd<OwnedFd>,
    events_file: PathBuf,
    current_file: PathBuf,
    cgroup: String,
    threshold_bytes: Option<u64>,
    /// Where the threshold should be, read at every change.
    moves: Option<watch::Receiver<Level>>,
    last: EventCounters,
}

/// Watches `memory.events` in `dir` (a v2 cgroup directory) for changes.
pub(crate) fn arm_v2_events(
    dir: &Path,
    cgroup: &str,
    threshold_bytes: Option<u64>,
    moves: Option<watch::Receiver<Level>>,
) -> Result<EventsWatch, V2Error> {
    let events_file = dir.join("memory.events");
    let text = std::fs::read_to_string(&events_file).map_err(|source| V2Error::Read {
        path: events_file.clone(),
        source,
    })?;
    let last = parse_counters(&text).map_err(|source| V2Error::Parse {
        path: events_file.clone(),
        source,
    })?;
    let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)
        .map_err(V2Error::InotifyInit)?;
    inotify::add_watch(&fd, &events_file, inotify::WatchFlags::MODIFY).map_err(|errno| {
        V2Error::Watch {
            path: events_file.clone(),
            errno,
        }
    })?;
    let inotify = register_fd(fd, tokio::io::Interest::READABLE).map_err(V2Error::RegisterFd)?;
    Ok(EventsWatch {
        inotify,
        current_file: dir.join("memory.current"),
        events_file,
        cgroup: cgroup.to_string(),
        threshold_bytes,
        moves,
        last,
    })
}

impl EventsWatch {
    /// What this watch is, for the attach report.
    pub(crate) fn describe(&self) -> String {
        match self.threshold_bytes {
            Some(bytes) => format!(
                "inotify on {} (threshold {bytes} bytes checked on change)",
                self.events_file.display()
            ),
            None => format!("inotify on {}", self.events_file.display()),
        }
    }

    /// Sends the counter deltas each time `memory.events` changes, until the receiver is gone
    /// or the file is removed.
    pub(crate) async fn run(mut self, tx: mpsc::Sender<PressureEvent>) {
        let mut buf = [MaybeUninit::<u8>::uninit(); 1024];
        loop {
            let mut guard = match self.inotify.readable().await {
                Ok(guard) => guard,
                Err(e) => {
                    tracing::warn!(cgroup = %self.cgroup, error = %e, "inotify wait failed; watch stops");
                    return;
                }
            };
            let at_ns = monotonic_ns();
            // Drain every queued inotify event; note whether the watch was removed.
            let mut gone = false;
            let mut any = false;
            let drained = guard.try_io(|fd| {
                let mut reader = inotify::Reader::new(fd.get_ref(), &mut buf);
                loop {
                    match reader.next() {
                        Ok(ev) => {
                            any = true;
                            if ev.events().contains(inotify::ReadFlags::IGNORED) {
                                gone = true;
                            }
                        }
                        Err(Errno::AGAIN) if any => return Ok(()),
                        Err(e) => return Err(std::io::Error::from(e)),
                    }
                }
            });
            match drained {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(cgroup = %self.cgroup, error = %e, "inotify read failed; watch stops");
                    return;
                }
                Err(_would_block) => continue,
            }
            let read = std::fs::read_to_string(&self.events_file);
            let now = match read.as_deref().map(parse_counters) {
                Ok(Ok(now)) => now,
                Ok(Err(e)) => {
                    tracing::info!(cgroup = %self.cgroup, reason = %e, "memory.events unreadable (cgroup removed?); watch stops");
                    return;
                }
                Err(e) => {
                    tracing::info!(cgroup = %self.cgroup, reason = %e, "memory.events unreadable (cgroup removed?); watch stops");
                    return;
                }
            };
            let mut kinds = events_delta(&self.last, &now);
            self.last = now;
            if let Some(rx) = &self.moves {
                self.threshold_bytes = Some(rx.borrow().usage_bytes);
            }
            if let Some(bytes) = self.threshold_bytes {
                if let Some(usage) = read_u64_file(&self.current_file) {
                    if usage >= bytes {
                        kinds.push(Kind::ThresholdCrossed {
                            threshold_bytes: Some(bytes),
                            usage_bytes: Some(usage),
                            killed: None,
                        });
                    }
                }
            }
            for kind in kinds {
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
            if gone {
                tracing::info!(cgroup = %self.cgroup, "memory.events removed; watch stops");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_names_what_moved() {
        let before = parse_counters("low 0\nhigh 10\nmax 0\noom 0\noom_kill 0\n").unwrap();
        let now = parse_counters("low 0\nhigh 15\nmax 2\noom 1\noom_kill 1\n").unwrap();
        let kinds = events_delta(&before, &now);
        assert_eq!(
            kinds,
            vec![
                Kind::OomKill {
                    pid: None,
                    comm: None,
                    rss_bytes: None,
                    oom_score_adj: None,
                },
                Kind::MemcgEvent {
                    item: "high".into(),
                    count: 5
                },
                Kind::MemcgEvent {
                    item: "max".into(),
                    count: 2
                },
                Kind::MemcgEvent {
                    item: "oom".into(),
                    count: 1
                },
            ]
        );
        assert!(events_delta(&now, &now).is_empty());
    }

    #[test]
    fn delta_after_reset_counts_from_zero() {
        let before = parse_counters("high 10\n").unwrap();
        let now = parse_counters("high 3\n").unwrap();
        assert_eq!(
            events_delta(&before, &now),
            vec![Kind::MemcgEvent {
                item: "high".into(),
                count: 3
            }]
        );
    }
}
