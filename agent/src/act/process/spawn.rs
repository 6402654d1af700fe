//! Starting, watching and ending one container process: its start into its cgroups with
//! `oom_score_adj` set before exec (the clone itself is [`super::vfork`]'s), the pidfd that
//! reports its exit, how a run ended (exit code, signal, OOM kill), and the SIGTERM/SIGKILL
//! sequence of a stop.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant, SystemTime};

use tokio::io::unix::AsyncFd;

use super::{vfork, Inner, Proc};
use crate::act::cgroups::CgroupPath;
use crate::act::runtime::{ContainerSpec, PodSpec, Terminated};

/// The PATH a container gets when its env sets none (containerd's default).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long a stop waits for SIGKILLed processes to be gone before giving up.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// The start time of `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
pub(crate) fn start_ticks(pid: u32) -> Option<u64> {
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
        let Some(program) = argv.first() else {
            return Err(failed("no command".into()));
        };
        // The container's environment: a default PATH unless its env sets one; a key given
        // twice keeps its last value, as the kubelet's env list does.
        let mut env: Vec<(String, String)> = vec![("PATH".into(), DEFAULT_PATH.into())];
        for (k, v) in &c.env {
            match env.iter_mut().find(|(key, _)| key == k) {
                Some(entry) => entry.1.clone_from(v),
                None => env.push((k.clone(), v.clone())),
            }
        }
        let path_var = env[0].1.as_str();
        let path = vfork::resolve(program, path_var).ok_or_else(|| {
            failed(format!(
                "start {program:?}: not found in PATH {path_var:?} (os error {})",
                libc::ENOENT
            ))
        })?;
        let stdin =
            std::fs::File::open("/dev/null").map_err(|e| failed(format!("/dev/null: {e}")))?;
        let plan = vfork::Plan::new(
            vfork::Program {
                path: &path,
                argv: &argv,
                env: &env,
            },
            stdin.into(),
            log.into(),
            err_log.into(),
            procs,
            c.oom_score_adj,
        )
        .map_err(|e| failed(format!("start {program:?}: {e}")))?;
        let (pid, pidfd) = vfork::spawn(&plan).map_err(|e| {
            let hint = if e.step == vfork::Step::OomScoreAdj && c.oom_score_adj < 0 {
                " (a negative oom_score_adj needs CAP_SYS_RESOURCE)"
            } else {
                ""
            };
            failed(format!("start {program:?}: {e}{hint}"))
        })?;
        // The fds the child needed (its stdio, the cgroup files) close with the plan.
        drop(plan);
        let pidfd = match watch_pidfd(pidfd) {
            Ok(fd) => fd,
            Err(e) => {
                // Without a watch the run cannot be supervised: end it, and reap it (an
                // unreaped child keeps its pid, so the pid still names it).
                if let Some(p) = to_pid(pid) {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                    let _ =
                        rustix::process::waitpid(Some(p), rustix::process::WaitOptions::empty());
                }
                return Err(failed(format!("watch pid {pid}: {e}")));
            }
        };
        tracing::info!(pod = %pod.full_name(), container = %c.name, pid, "container started");
        Ok(Proc {
            pid,
            pidfd,
            child: true,
            started_at,
            oom_kills_at_start,
        })
    }

    /// How a finished run ended.
    pub(super) fn finish(&self, cgroup: &CgroupPath, proc: Proc) -> Terminated {
        // The pidfd said the process exited, so reaping does not block; a child that is
        // somehow still there (a stop that gave up waiting) is reaped off the async threads.
        let status = if proc.child {
            let status = vfork::reap(proc.pidfd.get_ref(), false);
            if status.is_none() {
                if let Ok(fd) = proc.pidfd.get_ref().try_clone() {
                    tokio::task::spawn_blocking(move || vfork::reap(&fd, true));
                }
            }
            status
        } else {
            None
        };
        let oom = self
            .cgroups
            .oom_kills(cgroup)
            .is_ok_and(|n| n > proc.oom_kills_at_start);
        let (exit_code, signal) = match status {
            Some(vfork::Ended::Code(code)) => (code, None),
            Some(vfork::Ended::Signal(sig)) => (128 + sig, Some(sig)),
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
