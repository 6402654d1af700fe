//! Starting, watching and ending one container process: the fork into its cgroups with
//! `oom_score_adj` set before exec, the pidfd that reports its exit, how a run ended (exit
//! code, signal, OOM kill), and the SIGTERM/SIGKILL sequence of a stop. Kept apart from the
//! supervision loop so the raw-syscall code (the `pre_exec` hook) stands on its own.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use tokio::io::unix::AsyncFd;

use super::{Inner, Proc};
use crate::act::cgroups::CgroupPath;
use crate::act::runtime::{ContainerSpec, PodSpec, Terminated};

/// The PATH a container gets when its env sets none (containerd's default).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long a stop waits for SIGKILLed processes to be gone before giving up.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// The start time of `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Registers a pidfd with tokio's reactor for readability (= the process exited).
pub(super) fn watch_pidfd(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the `OwnedFd` is open, is moved into the `AsyncFd` and stays owned (and open)
    // by it for the `AsyncFd`'s whole life; its raw fd never changes.
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(std::io::Error::from)
}

pub(super) fn to_pid(pid: u32) -> Option<rustix::process::Pid> {
    i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
}

fn signal_group(pid: u32, signal: rustix::process::Signal) {
    if let Some(p) = to_pid(pid) {
        // ESRCH: the group is gone already, which is what we want.
        let _ = rustix::process::kill_process_group(p, signal);
    }
}

impl Inner {
    /// Kills whatever is left in a container cgroup (only this runtime puts processes
    /// there: leftovers are from a run whose record was lost in a crash) and waits until
    /// it is empty.
    pub(super) async fn clear_cgroup(&self, cgroup: &CgroupPath) {
        let deadline = Instant::now() + KILL_WAIT;
        loop {
            let left = self.cgroups.procs_recursive(cgroup).unwrap_or_default();
            if left.is_empty() {
                return;
            }
            for pid in left {
                if let Some(p) = to_pid(pid) {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                }
            }
            if Instant::now() > deadline {
                tracing::warn!(cgroup = %cgroup, "processes still in the container cgroup after SIGKILL");
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Starts one run of a container in its cgroup.
    pub(super) fn start(
        &self,
        pod: &PodSpec,
        c: &ContainerSpec,
        run: u32,
    ) -> Result<Proc, Terminated> {
        let started_at = SystemTime::now();
        let failed = |message: String| {
            tracing::warn!(pod = %pod.full_name(), container = %c.name, %message, "container did not start");
            Terminated {
                exit_code: 128,
                signal: None,
                reason: "StartError".into(),
                message,
                started_at,
                finished_at: SystemTime::now(),
            }
        };
        let cgroup = Self::container_cgroup(pod, c).map_err(|e| failed(e.to_string()))?;
        let oom_kills_at_start = self.cgroups.oom_kills(&cgroup).unwrap_or(0);
        let mut procs: Vec<OwnedFd> = Vec::new();
        for file in self.cgroups.procs_files(&cgroup) {
            let fd = rustix::fs::open(
                &file,
                rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| failed(format!("open {}: {e}", file.display())))?;
            procs.push(fd);
        }
        let log_dir = self
            .log_dir
            .join(format!("{}_{}_{}", pod.namespace, pod.name, pod.uid))
            .join(&c.name);
        let log = std::fs::create_dir_all(&log_dir)
            .and_then(|()| std::fs::File::create(log_dir.join(format!("{run}.log"))))
            .map_err(|e| failed(format!("log file in {}: {e}", log_dir.display())))?;
        let err_log = log
            .try_clone()
            .map_err(|e| failed(format!("log file: {e}")))?;

        let argv: Vec<&String> = c.command.iter().chain(&c.args).collect();
        let Some((program, args)) = argv.split_first() else {
            return Err(failed("no command".into()));
        };
        let mut cmd = std::process::Command::new(program);
        cmd.args(args)
            .env_clear()
            .env("PATH", DEFAULT_PATH)
            .envs(c.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err_log);
        let fds: Vec<RawFd> = procs.iter().map(|f| f.as_raw_fd()).collect();
        let oom = c.oom_score_adj.to_string().into_bytes();
        // SAFETY: between fork and exec the hook only makes raw system calls (write, open,
        // close, setsid) on values prepared before the fork; it allocates nothing and takes
        // no locks. The raw fds stay open in the parent (`procs`) until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                for fd in &fds {
                    let fd = std::os::fd::BorrowedFd::borrow_raw(*fd);
                    rustix::io::write(fd, b"0")?;
                }
                let adj = rustix::fs::open(
                    c"/proc/self/oom_score_adj",
                    rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )?;
                rustix::io::write(&adj, &oom)?;
                drop(adj);
                rustix::process::setsid()?;
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::PermissionDenied && c.oom_score_adj < 0 {
                " (or: a negative oom_score_adj needs CAP_SYS_RESOURCE)"
            } else {
                ""
            };
            failed(format!("start {program:?}: {e}{hint}"))
        })?;
        drop(procs);
        let pid = child.id();
        let pidfd = to_pid(pid)
            .ok_or_else(|| failed(format!("pid {pid} out of range")))
            .and_then(|p| {
                rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty())
                    .map_err(|e| failed(format!("pidfd_open({pid}): {e}")))
            })
            .and_then(|fd| watch_pidfd(fd).map_err(|e| failed(format!("watch pid {pid}: {e}"))));
        let pidfd = match pidfd {
            Ok(fd) => fd,
            Err(t) => {
                let mut child = child;
                let _ = child.kill();
                let _ = child.wait();
                return Err(t);
            }
        };
        tracing::info!(pod = %pod.full_name(), container = %c.name, pid, "container started");
        Ok(Proc {
            pid,
            pidfd,
            child: Some(child),
            started_at,
            oom_kills_at_start,
        })
    }

    /// How a finished run ended.
    pub(super) fn finish(&self, cgroup: &CgroupPath, mut proc: Proc) -> Terminated {
        // The pidfd said the process exited, so reaping does not block; a child that is
        // somehow still there (a stop that gave up waiting) is reaped off the async threads.
        let status = match proc.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(Some(status))) => Some(status),
            Some(_) => {
                if let Some(mut child) = proc.child.take() {
                    tokio::task::spawn_blocking(move || child.wait());
                }
                None
            }
            None => None,
        };
        let oom = self
            .cgroups
            .oom_kills(cgroup)
            .is_ok_and(|n| n > proc.oom_kills_at_start);
        let (exit_code, signal) = match status {
            Some(s) => match (s.code(), s.signal()) {
                (Some(code), _) => (code, None),
                (None, Some(sig)) => (128 + sig, Some(sig)),
                (None, None) => (128, None),
            },
            None => (137, None),
        };
        let reason = if oom && exit_code != 0 {
            "OOMKilled"
        } else if status.is_none() {
            "ContainerStatusUnknown"
        } else if exit_code == 0 {
            "Completed"
        } else {
            "Error"
        };
        Terminated {
            exit_code,
            signal,
            reason: reason.to_string(),
            message: String::new(),
            started_at: proc.started_at,
            finished_at: SystemTime::now(),
        }
    }

    /// SIGTERM to the container's process group, SIGKILL to it and to everything in the
    /// container cgroup after `grace`, then wait until the cgroup is empty.
    pub(super) async fn terminate(&self, cgroup: &CgroupPath, proc: &Proc, grace: Duration) {
        let mut main_gone = false;
        if !grace.is_zero() {
            signal_group(proc.pid, rustix::process::Signal::TERM);
            main_gone = tokio::time::timeout(grace, proc.exited()).await.is_ok();
        }
        if !main_gone {
            // The leader is alive (or an unreaped child), so its pid still names this group.
            signal_group(proc.pid, rustix::process::Signal::KILL);
        }
        // The leader's exit is the common case's last event: wait for it on the pidfd
        // rather than polling. Whatever is left — the group after its leader exited, or
        // processes that left the group — is then found through the container cgroup, never
        // by a pid that may have been reused.
        let _ = tokio::time::timeout(KILL_WAIT, proc.exited()).await;
        self.clear_cgroup(cgroup).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_ticks_of_self() {
        let me = std::process::id();
        let t = start_ticks(me).unwrap();
        assert_eq!(start_ticks(me), Some(t));
        assert_eq!(start_ticks(u32::MAX), None);
    }
}
