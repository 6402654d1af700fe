//! Killing processes and giving their memory back at once: the signal and the reap, by
//! pidfd, below the pod-level kill of [`super`].
//!
//! SIGKILL only marks a process dying: its memory comes back when its own exit path tears
//! down the address space, in the victim's context — on a busy node whenever the scheduler
//! gets to it (normal priority, often behind the very pod that made the pressure), at the
//! pace of one task freeing its pages. `process_mrelease(2)` (Linux 5.15+) lets the killer
//! reap a dying process's memory itself, in its own context (the agent's, `SCHED_FIFO` as
//! deployed), as Android's lmkd does after its kills. The victim still exits on its own;
//! only the memory no longer waits for it.
//!
//! Each process is addressed through a pidfd (`pidfd_open`, Linux 5.3+), so the signal and
//! the reap reach exactly the process that was listed, never a recycled pid. Every process
//! is signalled before any is reaped, so no kill waits behind another's reaping.
//!
//! Where the kernel lacks a call, the old way is used without noise: no pidfd → `kill(2)`
//! by pid; `process_mrelease` refused with `ENOSYS` (or `EPERM` from a seccomp filter) →
//! not tried again in this process, said once at debug. A process the call cannot reap
//! (`EINVAL`: its memory is shared with a process that is not dying) is left to its exit
//! path, logged at debug.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::io::Errno;
use rustix::process::{kill_process, pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};

/// What a kill did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Killed {
    /// Processes sent SIGKILL.
    pub killed: usize,
    /// Of those, processes whose memory `process_mrelease` reaped before returning, or, from
    /// [`Signalled::reap_aside`] on a runtime, handed to the reaper thread.
    pub reaped: usize,
}

/// Set once the kernel has said it has no `process_mrelease` (or forbids it), or by
/// [`set_reaping`]`(false)`.
static MRELEASE_MISSING: AtomicBool = AtomicBool::new(false);

/// Turns the reap after SIGKILL off (or back on) for this process: for measuring what it
/// buys (`cargo xtask bench -- --no-mrelease`); the agent never turns it off.
pub fn set_reaping(on: bool) {
    MRELEASE_MISSING.store(!on, Ordering::Relaxed);
}

/// Sends SIGKILL to each of `pids` (thread-group ids) and then reaps each one's memory with
/// `process_mrelease` where the kernel has it. Pids already gone are skipped.
pub fn kill_and_reap(pids: &[u32]) -> Killed {
    kill_all(pids).reap()
}

/// Processes sent SIGKILL, held by their pidfds until [`Signalled::reap`].
#[derive(Debug, Default)]
pub struct Signalled {
    killed: usize,
    dying: Vec<OwnedFd>,
    /// The pids signalled, so a later list of the same processes signals none twice.
    pids: Vec<u32>,
}

/// A process its holder already has a pidfd for (a runtime's container process): it can be
/// signalled without being looked up first.
#[derive(Debug)]
pub struct KnownProcess {
    /// Its thread-group id.
    pub pid: u32,
    /// A pidfd of its own (duplicated from the holder's).
    pub pidfd: OwnedFd,
}

/// Sends SIGKILL to each of `known` through its pidfd: no cgroup or `/proc` read first, so
/// it is the quickest kill there is. Exited ones are skipped.
pub fn kill_known(known: Vec<KnownProcess>) -> Signalled {
    let mut out = Signalled::default();
    for k in known {
        if pidfd_send_signal(&k.pidfd, Signal::KILL).is_ok() {
            out.killed += 1;
            out.pids.push(k.pid);
            out.dying.push(k.pidfd);
        }
    }
    out
}

/// Sends SIGKILL to each of `pids` (thread-group ids); pids already gone are skipped. The
/// caller takes the kill time, then calls [`Signalled::reap`].
pub fn kill_all(pids: &[u32]) -> Signalled {
    let mut out = Signalled {
        killed: 0,
        dying: Vec::with_capacity(pids.len()),
        pids: Vec::with_capacity(pids.len()),
    };
    out.kill_rest(pids);
    out
}

impl Signalled {
    /// Sends SIGKILL to those of `pids` not signalled already (by [`kill_known`]).
    pub(crate) fn kill_rest(&mut self, pids: &[u32]) {
        for &raw in pids {
            if self.pids.contains(&raw) {
                continue;
            }
            let Some(pid) = i32::try_from(raw).ok().and_then(Pid::from_raw) else {
                continue;
            };
            match pidfd_open(pid, PidfdFlags::empty()) {
                Ok(fd) => {
                    if pidfd_send_signal(&fd, Signal::KILL).is_ok() {
                        self.killed += 1;
                        self.pids.push(raw);
                        self.dying.push(fd);
                    }
                }
                // Gone already: nothing to kill.
                Err(Errno::SRCH) => {}
                // No pidfds (before 5.3) or refused: the pid itself.
                Err(_) => {
                    if kill_process(pid, Signal::KILL).is_ok() {
                        self.killed += 1;
                        self.pids.push(raw);
                    }
                }
            }
        }
    }

    /// How many processes were sent SIGKILL.
    pub(crate) fn killed(&self) -> usize {
        self.killed
    }

    /// Reaps every signalled process's memory on a blocking thread of the current tokio
    /// runtime (on the reactor loop's, one on the loop's priority), or in this thread where
    /// there is no runtime; `reaped` is then the processes handed to the reaper.
    ///
    /// Freeing a few hundred MiB takes `process_mrelease` about as long as the victim's own
    /// exit path (10-20 ms here), and the loop must not look away for that long: another pod
    /// can cross a threshold meanwhile, and the victim's release is itself something the
    /// loop watches (`reactor::inflight`).
    pub(crate) fn reap_aside(self) -> Killed {
        let handed = if MRELEASE_MISSING.load(Ordering::Relaxed) {
            0
        } else {
            self.dying.len()
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) if handed > 0 => {
                let killed = self.killed;
                rt.spawn_blocking(move || {
                    let k = self.reap();
                    tracing::debug!(killed = k.killed, reaped = k.reaped, "victims reaped");
                });
                Killed {
                    killed,
                    reaped: handed,
                }
            }
            _ => self.reap(),
        }
    }

    /// Reaps every signalled process's memory with `process_mrelease`, in this thread (it
    /// blocks while the kernel frees the pages: that is the work the victims' exit paths
    /// would otherwise do later).
    pub(crate) fn reap(self) -> Killed {
        let mut out = Killed {
            killed: self.killed,
            reaped: 0,
        };
        for fd in &self.dying {
            if MRELEASE_MISSING.load(Ordering::Relaxed) {
                break;
            }
            match process_mrelease(fd) {
                Ok(()) => out.reaped += 1,
                Err(e) => match mrelease_failure(e) {
                    Failure::Missing => {
                        if !MRELEASE_MISSING.swap(true, Ordering::Relaxed) {
                            tracing::debug!(
                                error = %e,
                                "process_mrelease unavailable: victims' memory comes back as \
                                 they exit"
                            );
                        }
                    }
                    Failure::ThisProcess => {
                        tracing::debug!(error = %e, "process_mrelease: left to the exit path");
                    }
                },
            }
        }
        out
    }
}

/// How a `process_mrelease` error is taken.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// The kernel has no such call, or a filter forbids it: stop trying.
    Missing,
    /// This process only (not dying after all, memory shared, already reaped, lock contended).
    ThisProcess,
}

fn mrelease_failure(e: Errno) -> Failure {
    if e == Errno::NOSYS || e == Errno::PERM {
        Failure::Missing
    } else {
        Failure::ThisProcess
    }
}

/// `process_mrelease(pidfd, 0)`: frees the address space of the dying process `pidfd` names
/// now, in this thread. Returns at once (success) when it has already exited.
fn process_mrelease(pidfd: &OwnedFd) -> Result<(), Errno> {
    // SAFETY: the call takes an fd and a flags word and touches no memory of ours; the fd
    // stays open for the call's duration (borrowed from an `OwnedFd`).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_process_mrelease,
            libc::c_long::from(pidfd.as_raw_fd()),
            0 as libc::c_long,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(Errno::from_raw_os_error(
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_missing_call_stops_further_tries() {
        assert_eq!(mrelease_failure(Errno::NOSYS), Failure::Missing);
        assert_eq!(mrelease_failure(Errno::PERM), Failure::Missing);
        for e in [Errno::INVAL, Errno::AGAIN, Errno::INTR, Errno::SRCH] {
            assert_eq!(mrelease_failure(e), Failure::ThisProcess, "{e}");
        }
    }

    #[test]
    fn pids_that_do_not_exist_are_skipped() {
        // Far above pid_max (4194304 at most), so no process can have them.
        assert_eq!(kill_and_reap(&[0, 999_999_999]), Killed::default());
    }
}
