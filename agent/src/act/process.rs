//! The process runtime: runs each container's `command`/`args` as a plain process tree in
//! its container cgroup, for nodes (and tests) without a container runtime.
//!
//! How, and why that way:
//! - **Into the cgroup before exec.** The cgroups' `cgroup.procs` files (one per v1
//!   hierarchy) are opened before the fork; between fork and exec the child writes `0` to
//!   each (the kernel reads "0" as "the writing process"), so not one page of the program is
//!   charged elsewhere. The hook allocates nothing and takes no locks, as required after
//!   `fork` in a threaded program.
//! - **`oom_score_adj` before exec**, written by the child to `/proc/self/oom_score_adj`:
//!   race-free — the value is in force before the container's code runs, and inherited by
//!   everything it forks.
//! - **Own session** (`setsid`), so the container's process group is its pid and a stop
//!   reaches the whole tree; whatever escaped the group is SIGKILLed through the container
//!   cgroup's `cgroup.procs` after the grace period.
//! - **Exit detection by pidfd** (Linux ≥ 5.3): a pidfd turns readable when its process
//!   exits, for children and non-children alike, and tokio's `AsyncFd` waits on it. For a
//!   child the status is then reaped; a process re-adopted after an agent restart is not our
//!   child, so its exit code cannot be read and is reported as the kubelet reports a lost
//!   container (`ContainerStatusUnknown`, 137) — unless the cgroup's OOM-kill counter rose.
//! - **OOM kills**: the container cgroup's kill counter (v1 `memory.oom_control` `oom_kill`,
//!   v2 `memory.events`) is read when a run starts and when it ends; a rise with a non-zero
//!   exit is `OOMKilled` (exit 137), as containerd reports it.
//! - **Restarts** follow `restartPolicy` with the kubelet's back-off
//!   ([`BackOffPolicy`], injectable so tests use milliseconds).
//! - **Re-adoption**: the runtime checkpoints every pod with each container's pid and start
//!   time (field 22 of `/proc/<pid>/stat`). [`ProcessRuntime::open`] reads it back and, for a
//!   pid still in its container cgroup with the same start time (checked again after
//!   `pidfd_open`, so a reused pid cannot slip in), keeps supervising without a restart.
//!   Dropping a [`ProcessRuntime`] stops supervising but kills nothing, as an agent crash
//!   would.
//!
//! - **Init containers** (flagged `init`, first in the pod's container list) run one at a
//!   time, each supervised until it exits 0 (restarted with the back-off after a failure,
//!   unless `restartPolicy` is `Never`, which fails the pod); only then do the app
//!   containers start, waiting as `PodInitializing` meanwhile. The pod's status lists the
//!   app containers only. A restarted agent resumes at the first init container that has
//!   not succeeded (re-adopting it if it is still running).
//!
//! Output goes to `<stateDir>/logs/<namespace>_<name>_<uid>/<container>/<restart>.log`.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::cgroups::{CgroupManager, CgroupPath, DEFAULT_REMOVE_WAIT};
use super::runtime::{
    pod_phase, ContainerExit, ContainerSpec, ContainerState, ContainerStatus, PodPhase, PodSpec,
    PodStatus, RestartPolicy, Runtime, RuntimeError, Terminated,
};
use crate::decide::backoff::{BackOffEntry, BackOffPolicy};
use crate::record::checkpoint::Checkpoint;
use crate::record::state_file::{Generation, Notices};

/// The PATH a container gets when its env sets none (containerd's default).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The checkpoint's kind and format version.
const CHECKPOINT_KIND: &str = "process-runtime";
const CHECKPOINT_VERSION: u32 = 1;
/// How long a stop waits for SIGKILLed processes to be gone before giving up.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// How many container exits a slow subscriber may fall behind by before it misses some
/// (it is told how many it missed).
const EXIT_EVENTS: usize = 1024;

/// What the process runtime needs.
#[derive(Debug, Clone)]
pub struct ProcessRuntimeConfig {
    /// The cgroup writer, rooted at the agent's `cgroupRoot`.
    pub cgroups: CgroupManager,
    /// Where the runtime keeps its checkpoint and container logs (the config's `stateDir`).
    pub state_dir: PathBuf,
    /// Restart back-off (the kubelet's 10 s doubling to 5 min unless a test says otherwise).
    pub backoff: BackOffPolicy,
}

/// The process runtime; see the module doc.
pub struct ProcessRuntime {
    inner: Arc<Inner>,
}

struct Inner {
    cgroups: CgroupManager,
    backoff: BackOffPolicy,
    checkpoint: Checkpoint,
    log_dir: PathBuf,
    origin: Instant,
    pods: Mutex<BTreeMap<String, PodEntry>>,
    exits: tokio::sync::broadcast::Sender<ContainerExit>,
}

struct PodEntry {
    spec: PodSpec,
    containers: Vec<ContainerRecord>,
    stop: watch::Sender<Option<Duration>>,
    tasks: Vec<JoinHandle<()>>,
}

/// What is checkpointed per container.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerRecord {
    status: ContainerStatus,
    pid: Option<u32>,
    start_ticks: Option<u64>,
    oom_kills_at_start: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SavedPod {
    spec: PodSpec,
    containers: Vec<ContainerRecord>,
}

/// A running container process.
struct Proc {
    pid: u32,
    pidfd: AsyncFd<OwnedFd>,
    child: Option<std::process::Child>,
    started_at: SystemTime,
    oom_kills_at_start: u64,
}

impl Proc {
    async fn exited(&self) {
        // A pidfd only ever becomes readable when the process has exited; an error here
        // means the fd is unusable, and treating that as an exit lets the caller look.
        let _ = self.pidfd.readable().await;
    }
}

/// How a container's supervision begins.
enum First {
    /// Started by the supervisor: record it.
    Started(Proc),
    /// Started by `run_pod` or re-adopted: already recorded.
    Running(Proc),
    Failed(Terminated),
    Restart,
}

fn lock(m: &Mutex<BTreeMap<String, PodEntry>>) -> MutexGuard<'_, BTreeMap<String, PodEntry>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn waiting(reason: &str, message: String) -> ContainerState {
    ContainerState::Waiting {
        reason: reason.to_string(),
        message,
    }
}

/// The start time of `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Registers a pidfd with tokio's reactor for readability (= the process exited).
fn watch_pidfd(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the `OwnedFd` is open, is moved into the `AsyncFd` and stays owned (and open)
    // by it for the `AsyncFd`'s whole life; its raw fd never changes.
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(std::io::Error::from)
}

fn to_pid(pid: u32) -> Option<rustix::process::Pid> {
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
    fn mono(&self) -> Duration {
        self.origin.elapsed()
    }

    fn container_cgroup(pod: &PodSpec, c: &ContainerSpec) -> Result<CgroupPath, RuntimeError> {
        Ok(pod.cgroup.join(&c.name)?)
    }

    fn save(&self, pods: &BTreeMap<String, PodEntry>) -> Result<(), RuntimeError> {
        let saved: Vec<SavedPod> = pods
            .values()
            .map(|p| SavedPod {
                spec: p.spec.clone(),
                containers: p.containers.clone(),
            })
            .collect();
        self.checkpoint.save(&saved)?;
        Ok(())
    }

    /// Changes one container's record and checkpoints the result.
    fn update(&self, uid: &str, idx: usize, f: impl FnOnce(&mut ContainerRecord)) {
        self.change(uid, idx, true, f);
    }

    /// Changes one container's record; with `persist` the checkpoint is written (two
    /// fsyncs: the cost the hot paths avoid where a later save covers them).
    fn change(&self, uid: &str, idx: usize, persist: bool, f: impl FnOnce(&mut ContainerRecord)) {
        let mut pods = lock(&self.pods);
        if let Some(rec) = pods.get_mut(uid).and_then(|p| p.containers.get_mut(idx)) {
            f(rec);
        }
        if persist {
            if let Err(e) = self.save(&pods) {
                tracing::warn!(error = %e, "process runtime: checkpoint not saved");
            }
        }
    }

    /// Kills whatever is left in a container cgroup (only this runtime puts processes
    /// there: leftovers are from a run whose record was lost in a crash) and waits until
    /// it is empty.
    async fn clear_cgroup(&self, cgroup: &CgroupPath) {
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

    fn status_of(entry: &PodEntry) -> PodStatus {
        let init = entry.spec.init_count();
        let containers: Vec<ContainerStatus> = entry
            .containers
            .iter()
            .skip(init)
            .map(|c| c.status.clone())
            .collect();
        // An init container that failed for good (the pod never restarts) fails the pod,
        // as in the kubelet; otherwise the app containers decide.
        let init_failed = entry.spec.restart_policy == RestartPolicy::Never
            && entry.containers.iter().take(init).any(
                |c| matches!(&c.status.state, ContainerState::Terminated(t) if t.exit_code != 0),
            );
        PodStatus {
            uid: entry.spec.uid.clone(),
            namespace: entry.spec.namespace.clone(),
            name: entry.spec.name.clone(),
            cgroup: entry.spec.cgroup.clone(),
            phase: if init_failed {
                PodPhase::Failed
            } else {
                pod_phase(&containers)
            },
            containers,
        }
    }

    /// Whether init container `idx` of pod `uid` has run to completion (exit 0).
    fn succeeded(&self, uid: &str, idx: usize) -> bool {
        lock(&self.pods)
            .get(uid)
            .and_then(|p| p.containers.get(idx))
            .is_some_and(
                |r| matches!(&r.status.state, ContainerState::Terminated(t) if t.exit_code == 0),
            )
    }

    /// Starts one run of a container in its cgroup.
    fn start(&self, pod: &PodSpec, c: &ContainerSpec, run: u32) -> Result<Proc, Terminated> {
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

    /// Takes over a process left by a previous agent, if it is still the same process.
    fn adopt(&self, cgroup: &CgroupPath, rec: &ContainerRecord) -> Option<Proc> {
        let (pid, ticks) = (rec.pid?, rec.start_ticks?);
        let ContainerState::Running { started_at, .. } = rec.status.state else {
            return None;
        };
        if !self.cgroups.procs(cgroup).ok()?.contains(&pid) || start_ticks(pid)? != ticks {
            return None;
        }
        let fd =
            rustix::process::pidfd_open(to_pid(pid)?, rustix::process::PidfdFlags::empty()).ok()?;
        // The pid could have been reused between the check and the open: check again now
        // that the fd pins the process.
        if start_ticks(pid)? != ticks {
            return None;
        }
        Some(Proc {
            pid,
            pidfd: watch_pidfd(fd).ok()?,
            child: None,
            started_at,
            oom_kills_at_start: rec.oom_kills_at_start,
        })
    }

    /// How a finished run ended.
    fn finish(&self, cgroup: &CgroupPath, mut proc: Proc) -> Terminated {
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
    async fn terminate(&self, cgroup: &CgroupPath, proc: &Proc, grace: Duration) {
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

    fn record_running(&self, uid: &str, idx: usize, proc: &Proc, persist: bool) {
        let ticks = start_ticks(proc.pid);
        self.change(uid, idx, persist, |r| {
            r.status.state = ContainerState::Running {
                pid: proc.pid,
                started_at: proc.started_at,
            };
            r.pid = Some(proc.pid);
            r.start_ticks = ticks;
            r.oom_kills_at_start = proc.oom_kills_at_start;
        });
    }
}

/// Waits until a stop is asked for; returns its grace period.
async fn stop_requested(rx: &mut watch::Receiver<Option<Duration>>) -> Duration {
    loop {
        if let Some(grace) = *rx.borrow_and_update() {
            return grace;
        }
        if rx.changed().await.is_err() {
            return Duration::ZERO;
        }
    }
}

/// Supervises container `idx` of pod `uid` until it is stopped or ends for good.
async fn supervise(
    inner: Arc<Inner>,
    pod: PodSpec,
    idx: usize,
    first: First,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    let Some(spec) = pod.containers.get(idx).cloned() else {
        return;
    };
    let Ok(cgroup) = Inner::container_cgroup(&pod, &spec) else {
        return;
    };
    let mut backoff: Option<BackOffEntry> = None;
    let mut next = first;
    loop {
        let ended = match std::mem::replace(&mut next, First::Restart) {
            First::Failed(t) => t,
            First::Started(proc) => {
                inner.record_running(&pod.uid, idx, &proc, true);
                next = First::Running(proc);
                continue;
            }
            First::Running(proc) => {
                tokio::select! {
                    () = proc.exited() => inner.finish(&cgroup, proc),
                    grace = stop_requested(&mut stop) => {
                        inner.terminate(&cgroup, &proc, grace).await;
                        let t = inner.finish(&cgroup, proc);
                        // stop_pod saves once all containers are down.
                        inner.change(&pod.uid, idx, false, |r| {
                            r.status.state = ContainerState::Terminated(t);
                            r.pid = None;
                        });
                        return;
                    }
                }
            }
            First::Restart => {
                let run = {
                    let pods = lock(&inner.pods);
                    pods.get(&pod.uid)
                        .and_then(|p| p.containers.get(idx))
                        .map_or(0, |r| r.status.restart_count)
                };
                next = match inner.start(&pod, &spec, run) {
                    Ok(p) => First::Started(p),
                    Err(t) => First::Failed(t),
                };
                continue;
            }
        };
        tracing::info!(pod = %pod.full_name(), container = %spec.name, exit_code = ended.exit_code, reason = %ended.reason, "container ended");
        let finished = inner.mono();
        let restarting = pod.restart_policy.restarts(ended.exit_code) && stop.borrow().is_none();
        // No subscriber is fine: the status keeps the same facts.
        let _ = inner.exits.send(ContainerExit {
            uid: pod.uid.clone(),
            pod: pod.full_name(),
            container: spec.name.clone(),
            cgroup: cgroup.clone(),
            terminated: ended.clone(),
            restarting,
        });
        if !restarting {
            inner.update(&pod.uid, idx, |r| {
                r.status.state = ContainerState::Terminated(ended);
                r.pid = None;
            });
            return;
        }
        let delay = inner.backoff.on_exit(&mut backoff, finished);
        inner.update(&pod.uid, idx, |r| {
            r.status.state = if delay.is_zero() {
                ContainerState::Terminated(ended.clone())
            } else {
                waiting(
                    "CrashLoopBackOff",
                    format!(
                        "back-off {delay:?} restarting failed container={} pod={}",
                        spec.name,
                        pod.full_name()
                    ),
                )
            };
            r.status.last_termination = Some(ended);
            r.pid = None;
        });
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stop_requested(&mut stop) => {
                inner.update(&pod.uid, idx, |r| {
                    if let Some(t) = r.status.last_termination.clone() {
                        r.status.state = ContainerState::Terminated(t);
                    }
                });
                return;
            }
        }
        inner.update(&pod.uid, idx, |r| r.status.restart_count += 1);
    }
}

/// Aborts the app containers' supervisors when [`initialize`] is dropped (the runtime
/// dropped without a stop, as in an agent crash), as the runtime's drop aborts the others.
struct AbortOnDrop(Vec<JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// Runs a pod that has init containers: each init container in order, supervised until it
/// exits 0 (its restarts on failure follow the back-off; with `restartPolicy: Never` a
/// failure ends the pod's start), then supervises the app containers until they end.
/// `firsts` holds, per container, how its supervision begins (`None`: nothing to do, e.g.
/// an init container that already succeeded before an agent restart).
async fn initialize(
    inner: Arc<Inner>,
    pod: PodSpec,
    mut firsts: Vec<Option<First>>,
    stop: watch::Receiver<Option<Duration>>,
) {
    let init = pod.init_count();
    // An init container is restarted after a failure unless the pod never restarts, and
    // never after it succeeded, whatever the pod's policy.
    let init_pod = PodSpec {
        restart_policy: match pod.restart_policy {
            RestartPolicy::Never => RestartPolicy::Never,
            RestartPolicy::Always | RestartPolicy::OnFailure => RestartPolicy::OnFailure,
        },
        ..pod.clone()
    };
    for idx in 0..init {
        if let Some(first) = firsts.get_mut(idx).and_then(Option::take) {
            supervise(inner.clone(), init_pod.clone(), idx, first, stop.clone()).await;
        }
        if stop.borrow().is_some() {
            return;
        }
        if !inner.succeeded(&pod.uid, idx) {
            tracing::info!(pod = %pod.full_name(), container = %pod.containers[idx].name, "init container failed; the app containers are not started");
            return;
        }
    }
    let mut apps = AbortOnDrop(
        firsts
            .into_iter()
            .enumerate()
            .skip(init)
            .filter_map(|(i, f)| {
                f.map(|f| tokio::spawn(supervise(inner.clone(), pod.clone(), i, f, stop.clone())))
            })
            .collect(),
    );
    // Awaited here so that stopping the pod, which awaits this task, awaits them too.
    for t in &mut apps.0 {
        let _ = t.await;
    }
}

fn validate(pod: &PodSpec) -> Result<(), RuntimeError> {
    pod.validate(|c| {
        if pod.cgroup.join(&c.name).is_err() {
            return Err(format!("container name {:?} cannot name a cgroup", c.name));
        }
        if c.command.is_empty() {
            return Err(format!(
                "container {:?}: the process runtime has no images, so it needs a command",
                c.name
            ));
        }
        Ok(())
    })
}

/// How often a checkpoint whose last write failed (a full disk) is written again.
const SAVE_RETRY: Duration = Duration::from_secs(2);

/// Writes the checkpoint again while its last write failed, so the state on disk catches up
/// once space returns even when nothing changes; ends with the runtime.
async fn retry_saves(inner: std::sync::Weak<Inner>) {
    loop {
        tokio::time::sleep(SAVE_RETRY).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.checkpoint.is_failing() {
            let pods = lock(&inner.pods);
            let _ = inner.save(&pods);
        }
    }
}

impl ProcessRuntime {
    /// Opens the runtime: reads its checkpoint under `state_dir` and re-adopts every
    /// container process still running from a previous agent (see the module doc). Must be
    /// called inside a tokio runtime. A damaged checkpoint never stops it: the file is set
    /// aside and the previous generation (or nothing) is used; processes the runtime no
    /// longer knows are left to the pod manager's recovery (`node::recover`).
    pub async fn open(config: ProcessRuntimeConfig) -> Result<ProcessRuntime, RuntimeError> {
        Self::open_with(config, Notices::default()).await
    }

    /// [`Self::open`], sending what happens to the checkpoint file (set aside, failed
    /// writes) to `notices`.
    pub async fn open_with(
        config: ProcessRuntimeConfig,
        notices: Notices,
    ) -> Result<ProcessRuntime, RuntimeError> {
        std::fs::create_dir_all(&config.state_dir).map_err(|source| RuntimeError::Io {
            what: format!("create state dir {}", config.state_dir.display()),
            source,
        })?;
        let inner = Arc::new(Inner {
            checkpoint: Checkpoint::new(
                config.state_dir.join("process-runtime.json"),
                CHECKPOINT_KIND,
                CHECKPOINT_VERSION,
            )
            .with_notices(notices),
            log_dir: config.state_dir.join("logs"),
            cgroups: config.cgroups,
            backoff: config.backoff,
            origin: Instant::now(),
            pods: Mutex::new(BTreeMap::new()),
            exits: tokio::sync::broadcast::channel(EXIT_EVENTS).0,
        });
        let loaded = inner.checkpoint.load();
        // The previous generation is older than what happened last: a pod in it may have been
        // stopped since. Only its live processes are trusted; a pod none of whose processes
        // runs is forgotten rather than started again (the pod manager restarts the pods it
        // knows and the runtime lost).
        let stale = loaded.generation == Generation::Previous;
        let saved: Vec<SavedPod> = loaded.value.unwrap_or_default();
        for pod in saved {
            let (stop, stop_rx) = watch::channel(None);
            let mut firsts = Vec::new();
            let mut containers = pod.containers;
            // A record missing from the file (it should not be) starts from scratch.
            containers.truncate(pod.spec.containers.len());
            for c in &pod.spec.containers[containers.len()..] {
                containers.push(ContainerRecord {
                    status: ContainerStatus {
                        name: c.name.clone(),
                        state: waiting("ContainerCreating", String::new()),
                        restart_count: 0,
                        last_termination: None,
                    },
                    pid: None,
                    start_ticks: None,
                    oom_kills_at_start: 0,
                });
            }
            for (c, rec) in pod.spec.containers.iter().zip(containers.iter_mut()) {
                let cgroup = Inner::container_cgroup(&pod.spec, c)?;
                let first = match &rec.status.state {
                    ContainerState::Terminated(_) => None,
                    ContainerState::Waiting { .. } => {
                        // It was waiting out a back-off after a run that ended: this start
                        // is that restart.
                        if rec.status.last_termination.is_some() {
                            rec.status.restart_count += 1;
                        }
                        Some(First::Restart)
                    }
                    ContainerState::Running { started_at, .. } => match inner.adopt(&cgroup, rec) {
                        Some(p) => {
                            tracing::info!(pod = %pod.spec.full_name(), container = %c.name, pid = p.pid, "container re-adopted");
                            Some(First::Running(p))
                        }
                        None => Some(First::Failed(Terminated {
                            exit_code: 137,
                            signal: None,
                            reason: "ContainerStatusUnknown".into(),
                            message: "the process was gone when the agent came back".into(),
                            started_at: *started_at,
                            finished_at: SystemTime::now(),
                        })),
                    },
                };
                firsts.push(first);
            }
            if stale && !firsts.iter().any(|f| matches!(f, Some(First::Running(_)))) {
                tracing::warn!(pod = %pod.spec.full_name(), "pod from the previous checkpoint generation has no live process: forgotten");
                continue;
            }
            let uid = pod.spec.uid.clone();
            let spec = pod.spec.clone();
            let init = spec.init_count();
            lock(&inner.pods).insert(
                uid.clone(),
                PodEntry {
                    spec: pod.spec,
                    containers,
                    stop,
                    tasks: Vec::new(),
                },
            );
            let tasks: Vec<JoinHandle<()>> = if init > 0 {
                vec![tokio::spawn(initialize(
                    inner.clone(),
                    spec,
                    firsts,
                    stop_rx,
                ))]
            } else {
                firsts
                    .into_iter()
                    .enumerate()
                    .filter_map(|(i, f)| {
                        f.map(|f| {
                            tokio::spawn(supervise(
                                inner.clone(),
                                spec.clone(),
                                i,
                                f,
                                stop_rx.clone(),
                            ))
                        })
                    })
                    .collect()
            };
            if let Some(entry) = lock(&inner.pods).get_mut(&uid) {
                entry.tasks = tasks;
            }
        }
        tokio::spawn(retry_saves(Arc::downgrade(&inner)));
        Ok(ProcessRuntime { inner })
    }

    /// The cgroup writer this runtime uses.
    pub fn cgroups(&self) -> &CgroupManager {
        &self.inner.cgroups
    }

    /// Where container output goes for one run of one container.
    pub fn log_path(&self, pod: &PodSpec, container: &str, run: u32) -> PathBuf {
        self.inner
            .log_dir
            .join(format!("{}_{}_{}", pod.namespace, pod.name, pod.uid))
            .join(container)
            .join(format!("{run}.log"))
    }

    /// Every container that ends on its own from now on (crashes, completions, OOM kills),
    /// for the event stream; stops the agent asked for are not included.
    pub fn subscribe_exits(&self) -> tokio::sync::broadcast::Receiver<ContainerExit> {
        self.inner.exits.subscribe()
    }

    /// The checkpoint file.
    pub fn checkpoint_path(&self) -> &Path {
        self.inner.checkpoint.path()
    }
}

impl Drop for ProcessRuntime {
    /// Stops supervising (as an agent crash would) and kills nothing: the next
    /// [`ProcessRuntime::open`] re-adopts the processes.
    fn drop(&mut self) {
        for entry in lock(&self.inner.pods).values() {
            for task in &entry.tasks {
                task.abort();
            }
        }
    }
}

impl Runtime for ProcessRuntime {
    async fn run_pod(&self, pod: PodSpec) -> Result<(), RuntimeError> {
        validate(&pod)?;
        let inner = &self.inner;
        if let Some(existing) = lock(&inner.pods).get(&pod.uid) {
            return Err(RuntimeError::AlreadyExists {
                uid: pod.uid.clone(),
                name: existing.spec.full_name(),
            });
        }
        // Container cgroups first, so the processes start inside them.
        let mut created = Vec::new();
        for c in &pod.containers {
            let cgroup = Inner::container_cgroup(&pod, c)?;
            let made = inner
                .cgroups
                .create(&cgroup)
                .and_then(|()| inner.cgroups.apply(&cgroup, &c.resources));
            created.push(cgroup);
            if let Err(e) = made {
                for cg in &created {
                    let _ = inner.cgroups.remove(cg, DEFAULT_REMOVE_WAIT);
                }
                return Err(e.into());
            }
        }
        let (stop, stop_rx) = watch::channel(None);
        let init = pod.init_count();
        let containers = pod
            .containers
            .iter()
            .enumerate()
            .map(|(i, c)| ContainerRecord {
                status: ContainerStatus {
                    name: c.name.clone(),
                    state: if i < init || init == 0 {
                        waiting("ContainerCreating", String::new())
                    } else {
                        waiting("PodInitializing", String::new())
                    },
                    restart_count: 0,
                    last_termination: None,
                },
                pid: None,
                start_ticks: None,
                oom_kills_at_start: 0,
            })
            .collect();
        lock(&inner.pods).insert(
            pod.uid.clone(),
            PodEntry {
                spec: pod.clone(),
                containers,
                stop,
                tasks: Vec::new(),
            },
        );
        let mut tasks = Vec::new();
        if init > 0 {
            // The init containers run one after the other, then the app containers: all of
            // it in one task, which `stop_pod` awaits like any supervisor.
            for cg in &created {
                inner.clear_cgroup(cg).await;
            }
            let firsts = pod
                .containers
                .iter()
                .map(|_| Some(First::Restart))
                .collect();
            tasks.push(tokio::spawn(initialize(
                inner.clone(),
                pod.clone(),
                firsts,
                stop_rx.clone(),
            )));
        } else {
            for (i, c) in pod.containers.iter().enumerate() {
                if let Some(cg) = created.get(i) {
                    inner.clear_cgroup(cg).await;
                }
                let first = match inner.start(&pod, c, 0) {
                    Ok(p) => {
                        // Recorded before returning, so a status right after run_pod shows
                        // it; saved once below for all containers.
                        inner.record_running(&pod.uid, i, &p, false);
                        First::Running(p)
                    }
                    Err(t) => First::Failed(t),
                };
                tasks.push(tokio::spawn(supervise(
                    inner.clone(),
                    pod.clone(),
                    i,
                    first,
                    stop_rx.clone(),
                )));
            }
        }
        let saved = {
            let mut pods = lock(&inner.pods);
            if let Some(entry) = pods.get_mut(&pod.uid) {
                entry.tasks = tasks;
            }
            inner.save(&pods)
        };
        if let Err(e) = saved {
            // Processes the checkpoint does not know would be orphans after a restart: undo.
            let _ = self.stop_pod(&pod.uid, Duration::ZERO).await;
            return Err(e);
        }
        Ok(())
    }

    async fn stop_pod(&self, uid: &str, grace: Duration) -> Result<PodStatus, RuntimeError> {
        let inner = &self.inner;
        let (tasks, spec) = {
            let mut pods = lock(&inner.pods);
            let entry = pods.get_mut(uid).ok_or_else(|| RuntimeError::NotFound {
                uid: uid.to_string(),
            })?;
            entry.stop.send_replace(Some(grace));
            (std::mem::take(&mut entry.tasks), entry.spec.clone())
        };
        for task in tasks {
            let _ = task.await;
        }
        for c in &spec.containers {
            let cgroup = Inner::container_cgroup(&spec, c)?;
            inner.cgroups.remove(&cgroup, DEFAULT_REMOVE_WAIT)?;
        }
        let mut pods = lock(&inner.pods);
        let entry = pods.remove(uid).ok_or_else(|| RuntimeError::NotFound {
            uid: uid.to_string(),
        })?;
        // The pod is stopped whether or not this is written (a full disk): the failure is
        // reported by the checkpoint and the write retried until it succeeds.
        let _ = inner.save(&pods);
        Ok(Inner::status_of(&entry))
    }

    fn fence(&self, uid: &str) {
        // A stop with grace 0 asked now: the supervisors restart nothing from here on
        // (`supervise` checks it before every restart) and kill what still runs.
        if let Some(entry) = lock(&self.inner.pods).get(uid) {
            entry.stop.send_if_modified(|stop| {
                let first = stop.is_none();
                if first {
                    *stop = Some(Duration::ZERO);
                }
                first
            });
        }
    }

    async fn pod_status(&self, uid: &str) -> Result<PodStatus, RuntimeError> {
        lock(&self.inner.pods)
            .get(uid)
            .map(Inner::status_of)
            .ok_or_else(|| RuntimeError::NotFound {
                uid: uid.to_string(),
            })
    }

    async fn list_pods(&self) -> Result<Vec<PodStatus>, RuntimeError> {
        Ok(lock(&self.inner.pods)
            .values()
            .map(Inner::status_of)
            .collect())
    }

    fn pod_document(&self, uid: &str) -> Option<serde_json::Value> {
        lock(&self.inner.pods)
            .get(uid)
            .and_then(|p| p.spec.document.clone())
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

    #[test]
    fn validation_names_the_problem() {
        let pod = |c: ContainerSpec| PodSpec {
            uid: "u".into(),
            namespace: "default".into(),
            name: "p".into(),
            cgroup: CgroupPath::pod(None, "u").unwrap(),
            restart_policy: Default::default(),
            containers: vec![c],
            document: None,
        };
        let c = ContainerSpec {
            name: "web".into(),
            image: String::new(),
            command: vec![],
            args: vec![],
            env: vec![],
            resources: Default::default(),
            oom_score_adj: 0,
            ..Default::default()
        };
        let err = validate(&pod(c.clone())).unwrap_err().to_string();
        assert!(err.contains("needs a command"), "{err}");
        let bad = ContainerSpec {
            name: "..".into(),
            command: vec!["x".into()],
            ..c.clone()
        };
        assert!(validate(&pod(bad))
            .unwrap_err()
            .to_string()
            .contains("cannot name a cgroup"));
        let bad = ContainerSpec {
            oom_score_adj: 1001,
            command: vec!["x".into()],
            ..c.clone()
        };
        assert!(validate(&pod(bad))
            .unwrap_err()
            .to_string()
            .contains("outside"));
        // Init containers lead the list and need an app container after them.
        let init = ContainerSpec {
            name: "setup".into(),
            command: vec!["x".into()],
            init: true,
            ..c.clone()
        };
        let app = ContainerSpec {
            command: vec!["x".into()],
            ..c
        };
        let mut p = pod(init.clone());
        let err = validate(&p).unwrap_err().to_string();
        assert!(err.contains("no app containers"), "{err}");
        p.containers = vec![app.clone(), init.clone()];
        let err = validate(&p).unwrap_err().to_string();
        assert!(err.contains("must come before"), "{err}");
        p.containers = vec![init, app];
        validate(&p).unwrap();
    }
}
