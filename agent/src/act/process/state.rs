//! The runtime's own state on disk and its re-adoption: every change to a container's
//! record is checkpointed (pid, start time, OOM-kill count at start), a failed write is
//! retried until it succeeds, and [`ProcessRuntime::open`] reads the checkpoint back and
//! keeps supervising the processes that are still the ones it started.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::task::JoinHandle;

use super::spawn::{start_ticks, to_pid, watch_pidfd};
use super::supervise::{initialize, supervise};
use super::{
    lock, waiting, ContainerRecord, First, Inner, PodEntry, Proc, ProcessRuntime,
    ProcessRuntimeConfig, SavedPod, EXIT_EVENTS,
};
use crate::act::cgroups::CgroupPath;
use crate::act::runtime::{ContainerState, ContainerStatus, RuntimeError, Terminated};
use crate::record::checkpoint::Checkpoint;
use crate::record::state_file::{Generation, Notices, Refusal};

/// The checkpoint's kind tag (public, with the version, for the fuzz targets in `fuzz/`).
pub const CHECKPOINT_KIND: &str = "process-runtime";
/// The checkpoint's format version.
pub const CHECKPOINT_VERSION: u32 = 1;

/// Decodes `bytes` as [`ProcessRuntime::open`] decodes `process-runtime.json`, and encodes
/// what they held again as the runtime's next save would. Public
/// for the fuzz targets (`fuzz/`): the saved records are private to the runtime, and this
/// reaches the runtime's own decoder without a file. The agent does not call it.
pub fn recode_checkpoint(bytes: &[u8]) -> Result<Vec<u8>, Refusal> {
    let cp = Checkpoint::new("process-runtime.json", CHECKPOINT_KIND, CHECKPOINT_VERSION);
    let saved: Vec<SavedPod> = cp.decode(bytes)?;
    cp.encode(&saved)
        .map_err(|e| Refusal::Damaged(e.to_string().replace('\n', " ")))
}

impl Inner {
    pub(super) fn save(&self, pods: &BTreeMap<String, PodEntry>) -> Result<(), RuntimeError> {
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
    pub(super) fn update(&self, uid: &str, idx: usize, f: impl FnOnce(&mut ContainerRecord)) {
        self.change(uid, idx, true, f);
    }

    /// Changes one container's record; with `persist` the checkpoint is written (two
    /// fsyncs: the cost the hot paths avoid where a later save covers them).
    pub(super) fn change(
        &self,
        uid: &str,
        idx: usize,
        persist: bool,
        f: impl FnOnce(&mut ContainerRecord),
    ) {
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
            child: false,
            started_at,
            oom_kills_at_start: rec.oom_kills_at_start,
        })
    }

    pub(super) fn record_running(&self, uid: &str, idx: usize, proc: &Proc, persist: bool) {
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
            stops: Mutex::new(BTreeMap::new()),
            held: Mutex::new(BTreeMap::new()),
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
            let (stop, stop_rx) = inner.new_stop(&pod.spec.uid);
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
}
