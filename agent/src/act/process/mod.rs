//! The process runtime: runs each container's `command`/`args` as a plain process tree in
//! its container cgroup, for nodes (and tests) without a container runtime.
//!
//! How, and why that way:
//! - **Started without copying the agent** (`vfork`): `clone(CLONE_VM | CLONE_VFORK)` as
//!   `posix_spawn` does, not `fork`, whose page-table copy and copy-on-write faults the
//!   reactor loop's thread paid for every pod an API client applied. The child runs only
//!   system calls prepared before the clone; see that module.
//! - **Into the cgroup before exec.** The cgroups' `cgroup.procs` files (one per v1
//!   hierarchy) are opened before the clone; before exec the child writes `0` to each (the
//!   kernel reads "0" as "the writing process"), so not one page of the program is charged
//!   elsewhere.
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

mod runtime_impl;
mod spawn;
mod state;
mod supervise;
mod vfork;

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::cgroups::{CgroupManager, CgroupPath};
use super::runtime::{
    pod_phase, ContainerExit, ContainerSpec, ContainerState, ContainerStatus, PodPhase, PodSpec,
    PodStatus, RestartPolicy, RuntimeError, Terminated,
};
use crate::decide::backoff::BackOffPolicy;
use crate::record::checkpoint::Checkpoint;

pub use state::{recode_checkpoint, CHECKPOINT_KIND, CHECKPOINT_VERSION};

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
    /// Each pod's stop signal again, under a lock of its own: `pods` is held across the
    /// checkpoint's writes (fsyncs), and an eviction's [`Runtime::fence`] must never wait
    /// for a disk — measured under API load, it did, for up to 1.3 ms.
    stops: Mutex<BTreeMap<String, StopSignal>>,
    /// Each pod's running container processes (by container index) with a pidfd of their
    /// own, for [`Runtime::known_processes`]; held while the supervisor watches the
    /// process, under a lock of its own for the same reason as `stops`.
    held: Mutex<BTreeMap<String, HeldProcesses>>,
    exits: tokio::sync::broadcast::Sender<ContainerExit>,
}

/// A pod's running container processes by container index: pid and a pidfd of its own.
type HeldProcesses = BTreeMap<usize, (u32, OwnedFd)>;

/// A pod's stop request (`None`: running; `Some(grace)`: stop with that grace), watched by
/// its supervisors.
type StopSignal = Arc<watch::Sender<Option<Duration>>>;

impl Inner {
    /// Holds a pidfd of container `idx`'s process while it runs ([`Runtime::known_processes`]);
    /// one that cannot be duplicated is left to the cgroup walk.
    fn hold(&self, uid: &str, idx: usize, proc: &Proc) {
        if let Ok(fd) = proc.pidfd.get_ref().try_clone() {
            lock(&self.held)
                .entry(uid.to_string())
                .or_default()
                .insert(idx, (proc.pid, fd));
        }
    }

    /// Lets container `idx`'s process go: it exited or was stopped.
    fn release(&self, uid: &str, idx: usize) {
        let mut held = lock(&self.held);
        if let Some(pod) = held.get_mut(uid) {
            pod.remove(&idx);
            if pod.is_empty() {
                held.remove(uid);
            }
        }
    }

    /// A new pod's stop signal, registered for [`Runtime::fence`].
    fn new_stop(&self, uid: &str) -> (StopSignal, watch::Receiver<Option<Duration>>) {
        let (stop, rx) = watch::channel(None);
        let stop = Arc::new(stop);
        lock(&self.stops).insert(uid.to_string(), Arc::clone(&stop));
        (stop, rx)
    }
}

struct PodEntry {
    spec: PodSpec,
    containers: Vec<ContainerRecord>,
    stop: StopSignal,
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
    /// Started by this agent (not re-adopted), so its exit status is ours to reap.
    child: bool,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn waiting(reason: &str, message: String) -> ContainerState {
    ContainerState::Waiting {
        reason: reason.to_string(),
        message,
    }
}

impl Inner {
    fn mono(&self) -> Duration {
        self.origin.elapsed()
    }

    fn container_cgroup(pod: &PodSpec, c: &ContainerSpec) -> Result<CgroupPath, RuntimeError> {
        Ok(pod.cgroup.join(&c.name)?)
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
}

impl ProcessRuntime {
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
