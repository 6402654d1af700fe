//! PSI triggers: the kernel wakes us when memory stall time crosses a threshold in a window.
//!
//! A trigger is a line `"<some|full> <stall µs> <window µs>"` written to
//! `/proc/pressure/memory` (node-wide) or, on cgroup v2, a cgroup's `memory.pressure`; the
//! file descriptor then polls `POLLPRI` each time the trigger fires (at most once per window).
//! This is how Android's lmkd and systemd-oomd hear about pressure, and it needs no root on
//! kernels ≥ 6.5 as long as the window is a multiple of 2 s. The fd is waited on through
//! tokio's [`AsyncFd`] with [`Interest::PRIORITY`], so no thread sits in `poll(2)`.
//!
//! Minimum kernel: 5.2 for triggers on `/proc/pressure`, 5.2 for cgroup v2 `memory.pressure`.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc;

use super::clock::monotonic_ns;
use super::event::{Kind, PressureEvent, Source};
use super::fd::register_fd;

/// The node-wide memory pressure file.
pub(crate) const PROC_PRESSURE_MEMORY: &str = "/proc/pressure/memory";

/// Which stall a trigger watches: `some` (at least one task stalled) or `full` (all
/// non-idle tasks stalled at once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// At least one task stalled on memory.
    Some,
    /// Every non-idle task stalled on memory at the same time.
    Full,
}

impl Level {
    /// The word the kernel uses.
    pub fn name(self) -> &'static str {
        match self {
            Level::Some => "some",
            Level::Full => "full",
        }
    }
}

/// Builds the trigger string the kernel expects, NUL-terminated: the kernel's write handler
/// drops the buffer's last byte, so without the NUL it would cut the window's last digit.
pub(crate) fn trigger_bytes(level: Level, stall: Duration, window: Duration) -> Vec<u8> {
    let mut text = format!(
        "{} {} {}",
        level.name(),
        stall.as_micros(),
        window.as_micros()
    )
    .into_bytes();
    text.push(0);
    text
}

/// One line of a pressure file: the running averages (percent) and the total stall (µs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct PressureLine {
    /// Percent of the last 10 s some/all tasks were stalled.
    pub avg10: f64,
    /// Percent over the last 60 s.
    pub avg60: f64,
    /// Percent over the last 300 s.
    pub avg300: f64,
    /// Total stall time since boot (or since the cgroup was made), microseconds.
    pub total_us: u64,
}

/// A parsed pressure file (`/proc/pressure/memory`, `memory.pressure`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Pressure {
    /// The `some` line.
    pub some: PressureLine,
    /// The `full` line (absent for CPU pressure on older kernels).
    pub full: Option<PressureLine>,
}

impl Pressure {
    /// The line for one level.
    pub fn line(&self, level: Level) -> Option<PressureLine> {
        match level {
            Level::Some => Some(self.some),
            Level::Full => self.full,
        }
    }
}

/// A pressure file that does not have the kernel's format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed pressure file: {0}")]
pub(crate) struct PressureParseError(String);

/// Parses the text of a pressure file.
pub(crate) fn parse_pressure(text: &str) -> Result<Pressure, PressureParseError> {
    let mut some = None;
    let mut full = None;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut words = line.split_whitespace();
        let level = words.next().unwrap_or_default();
        let mut parsed = PressureLine {
            avg10: f64::NAN,
            avg60: f64::NAN,
            avg300: f64::NAN,
            total_us: 0,
        };
        let mut seen = 0;
        for word in words {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| PressureParseError(format!("{word:?} is not key=value")))?;
            let bad = || PressureParseError(format!("{key}={value:?} is not a number"));
            match key {
                "avg10" => parsed.avg10 = value.parse().map_err(|_| bad())?,
                "avg60" => parsed.avg60 = value.parse().map_err(|_| bad())?,
                "avg300" => parsed.avg300 = value.parse().map_err(|_| bad())?,
                "total" => parsed.total_us = value.parse().map_err(|_| bad())?,
                _ => continue,
            }
            seen += 1;
        }
        if seen != 4 {
            return Err(PressureParseError(format!(
                "line {line:?} lacks avg10/avg60/avg300/total"
            )));
        }
        match level {
            "some" => some = Some(parsed),
            "full" => full = Some(parsed),
            other => {
                return Err(PressureParseError(format!("unknown level {other:?}")));
            }
        }
    }
    let some = some.ok_or_else(|| PressureParseError("no \"some\" line".into()))?;
    Ok(Pressure { some, full })
}

/// An armed trigger, ready to run as a task.
pub(crate) struct PsiWatch {
    fd: AsyncFd<OwnedFd>,
    path: PathBuf,
    cgroup: Option<String>,
    level: Level,
}

/// Why a PSI trigger could not be armed, for the attach report: one line naming the file and
/// what the kernel's errno most likely means.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PsiError {
    /// The pressure file could not be opened.
    #[error("{}", open_reason(path, *errno))]
    Open {
        /// The pressure file.
        path: PathBuf,
        /// The kernel's errno.
        #[source]
        errno: Errno,
    },
    /// The kernel refused the trigger written to it.
    #[error("kernel refused trigger {trigger:?} on {}: errno {} {errno}{}", path.display(), errno.raw_os_error(), refusal_hint(*errno))]
    Refused {
        /// The trigger as written (`"some 150000 1000000"`).
        trigger: String,
        /// The pressure file.
        path: PathBuf,
        /// The kernel's errno.
        #[source]
        errno: Errno,
    },
    /// The trigger's fd could not join the runtime's poller.
    #[error("cannot register {} with epoll: {source}", path.display())]
    RegisterFd {
        /// The pressure file.
        path: PathBuf,
        /// The error from the runtime.
        #[source]
        source: std::io::Error,
    },
}

fn open_reason(path: &Path, e: Errno) -> String {
    match e {
        Errno::NOENT => format!("{} absent (kernel without PSI?)", path.display()),
        Errno::ACCESS | Errno::PERM => format!("{} not writable: {e} (not root?)", path.display()),
        Errno::OPNOTSUPP => format!(
            "{}: PSI is disabled (psi=0 on the kernel command line)",
            path.display()
        ),
        _ => format!("cannot open {}: {e}", path.display()),
    }
}

fn refusal_hint(e: Errno) -> &'static str {
    match e {
        Errno::INVAL => " (window must be 500ms..10s and the stall at most the window)",
        Errno::PERM | Errno::ACCESS => {
            " (unprivileged triggers need a window that is a multiple of 2s)"
        }
        Errno::OPNOTSUPP => " (PSI is disabled)",
        Errno::BUSY => " (a trigger is already armed on this fd)",
        _ => "",
    }
}

/// Opens `path` and arms a trigger on it. The error is the reason, for the attach report.
///
/// Must be called inside a tokio runtime (the fd is registered with its reactor).
pub(crate) fn arm(
    path: &Path,
    cgroup: Option<String>,
    level: Level,
    stall: Duration,
    window: Duration,
) -> Result<PsiWatch, PsiError> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDWR | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| PsiError::Open {
        path: path.to_path_buf(),
        errno,
    })?;
    let trigger = trigger_bytes(level, stall, window);
    let shown = String::from_utf8_lossy(&trigger[..trigger.len() - 1]).into_owned();
    if let Err(errno) = rustix::io::write(&fd, &trigger) {
        return Err(PsiError::Refused {
            trigger: shown,
            path: path.to_path_buf(),
            errno,
        });
    }
    let fd = register_fd(fd, Interest::PRIORITY).map_err(|source| PsiError::RegisterFd {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(PsiWatch {
        fd,
        path: path.to_path_buf(),
        cgroup,
        level,
    })
}

impl PsiWatch {
    /// What this watch is, for the attach report.
    pub(crate) fn describe(&self) -> String {
        format!("{} trigger on {}", self.level.name(), self.path.display())
    }

    /// Waits for the trigger and sends one event per firing until the receiver is gone or
    /// the file goes away (the cgroup was removed).
    pub(crate) async fn run(self, tx: mpsc::Sender<PressureEvent>) {
        loop {
            let mut guard = match self.fd.ready(Interest::PRIORITY).await {
                Ok(guard) => guard,
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "PSI trigger wait failed; source stops");
                    return;
                }
            };
            let at_ns = monotonic_ns();
            let ready = guard.ready();
            guard.clear_ready();
            // A firing trigger only ever sets POLLPRI; POLLERR means the trigger or its file is
            // gone (the cgroup was removed, PSI was switched off), and it would never fire again.
            if ready.is_error() {
                tracing::warn!(path = %self.path.display(), "PSI trigger file reported an error (cgroup removed?); source stops");
                return;
            }
            let total_us = std::fs::read_to_string(&self.path)
                .ok()
                .and_then(|text| parse_pressure(&text).ok())
                .and_then(|p| p.line(self.level))
                .map(|l| l.total_us);
            let event = PressureEvent {
                at_ns,
                woke_ns: Some(at_ns),
                source: Source::Psi,
                cgroup: self.cgroup.clone(),
                kind: Kind::PsiTrigger {
                    level: self.level.name().to_string(),
                    total_us,
                },
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
    fn trigger_is_nul_terminated_in_microseconds() {
        assert_eq!(
            trigger_bytes(
                Level::Some,
                Duration::from_millis(5),
                Duration::from_secs(2)
            ),
            b"some 5000 2000000\0"
        );
        assert_eq!(
            trigger_bytes(
                Level::Full,
                Duration::from_micros(150_500),
                Duration::from_secs(10)
            ),
            b"full 150500 10000000\0"
        );
    }

    #[test]
    fn parses_proc_pressure_memory() {
        let p = parse_pressure(
            "some avg10=1.25 avg60=0.00 avg300=0.00 total=278\nfull avg10=0.50 avg60=0.10 avg300=0.00 total=190\n",
        )
        .unwrap();
        assert_eq!(p.some.total_us, 278);
        assert_eq!(p.some.avg10, 1.25);
        assert_eq!(p.line(Level::Full).unwrap().total_us, 190);
        assert_eq!(p.full.unwrap().avg60, 0.10);
    }

    #[test]
    fn some_only_file_has_no_full() {
        let p = parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n").unwrap();
        assert!(p.full.is_none());
    }

    #[test]
    fn refuses_malformed_pressure() {
        for bad in [
            "",
            "some avg10=x avg60=0 avg300=0 total=1",
            "some avg10=0 avg60=0 avg300=0",
            "half avg10=0 avg60=0 avg300=0 total=1",
            "some avg10",
        ] {
            assert!(parse_pressure(bad).is_err(), "{bad:?}");
        }
    }
}
