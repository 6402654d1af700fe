//! The pod manager: one task owns the pods (see the module doc of [`super`]).
//!
//! # The API for the reactor loop
//!
//! - [`PodManager::pods`] lists every pod with what eviction needs: the decision rules' view
//!   ([`PodInfo`]: QoS, requests, priority, criticality), the pod cgroup, phase, container
//!   states, grace period and the current memory working set.
//! - [`PodManager::evict`] kills one pod with a status (`Failed`, the given reason and
//!   message — `Evicted` and the kubelet's eviction message for the loop) after the given
//!   grace, removes its pod cgroup and recomputes the QoS tiers; the pod stays listed as
//!   Failed (as the kubelet leaves an evicted pod object) until it is removed. With grace 0
//!   the pod's processes get SIGKILL from the stopping task itself, right after the runtime
//!   was told to stop (so nothing restarts them), and the moment is reported back
//!   (`reactor::pods::stop_and_kill`, shared with the runtime-only adapter).
//! - [`PodManager::active`] is the loop's hot-path view: the running pods with their cgroups,
//!   republished by the owner task after every change, read without a round trip.
//! - [`PodManager::events`] is the hub the loop publishes its own events on (evictions with
//!   their reaction time).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1 as k8s;
use tokio::sync::{mpsc, oneshot, watch};

use super::admit::{fit, is_extended, rejection};
use super::document::{self, Checked, Format};
use super::events::{EventHub, NodeEventKind};
use super::record::{PodRecord, PodSource, CHECKPOINT_KIND, CHECKPOINT_VERSION};
use super::settings::NodePlan;
use super::NodeError;
use crate::act::cgroups::{CgroupManager, CgroupPath, MemoryUsage, Resources, DEFAULT_REMOVE_WAIT};
use crate::act::pod_spec::pod_spec;
use crate::act::runtime::{
    ContainerState, ContainerStatus, PodPhase, PodSpec, RestartPolicy, Runtime, RuntimeError,
};
use crate::decide::cgroups::{pod_config, qos_tiers};
use crate::decide::pod::PodInfo;
use crate::decide::preempt::{handle_admission_failure, AdmitFailure};
use crate::decide::summary::FsStats;
use crate::devices::{ContainerRequest, DeviceManager, PodRequest};
use crate::reactor::pods::{
    stop_and_kill, writable_layers_of, ActivePod, EvictError, Evicted, EvictionStatus,
    PodContainer, PodControl,
};
use crate::record::checkpoint::Checkpoint;

mod admission;

/// The kubelet's status message for a pod preempted by a critical pod.
pub const PREEMPTION_MESSAGE: &str = "Preempted in order to admit critical pod";
/// The kubelet's status reason for it (`events.PreemptContainer`).
pub const PREEMPTION_REASON: &str = "Preempting";
/// How often a pod the runtime failed to stop is tried again.
const STOP_RETRY: Duration = Duration::from_secs(1);

/// Commands queued to the owner task.
const QUEUE: usize = 256;
/// Evictions and stop completions, queued apart from the API's commands and taken first:
/// however many applies and lists clients have queued, the reactor loop's eviction (and the
/// news that a pod stopped, which it waits for) is next in line, never behind them.
const URGENT_QUEUE: usize = 64;

/// A pod as the API and the reactor loop see it.
#[derive(Clone, Debug, PartialEq)]
pub struct PodView {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// The decision rules' view: QoS, requests, priority, criticality.
    pub info: PodInfo,
    /// The pod cgroup below the agent's cgroup root (none for a pod never admitted).
    pub cgroup: Option<CgroupPath>,
    /// `status.phase`.
    pub phase: PodPhase,
    /// `status.reason`.
    pub reason: String,
    /// `status.message`.
    pub message: String,
    /// Container states, in spec order.
    pub containers: Vec<ContainerStatus>,
    /// `oom_score_adj` per container.
    pub oom_score_adj: BTreeMap<String, i32>,
    /// `spec.terminationGracePeriodSeconds`.
    pub grace_period_seconds: i64,
    /// Memory use of the pod cgroup now (running pods only).
    pub memory: Option<MemoryUsage>,
    /// OOM kills counted in the pod cgroup.
    pub oom_kills: Option<u64>,
    /// Rank for `memory.available` among the running pods (1 = evicted first), by
    /// `decide::rank` over the working sets read now.
    pub memory_rank: Option<u32>,
    /// Whether the pod came from a static manifest.
    pub is_static: bool,
    /// Whether the pod is being stopped right now.
    pub stopping: bool,
}

impl PodView {
    /// `namespace/name`.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The answer to an apply.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// The pod (admitted or refused).
    pub pod: PodView,
    /// Whether it was admitted and started.
    pub admitted: bool,
    /// `namespace/name` of pods preempted for it.
    pub preempted: Vec<String>,
}

/// The answer to a removal.
#[derive(Clone, Debug, PartialEq)]
pub struct Removed {
    /// The pod as it was when it stopped.
    pub pod: PodView,
}

/// Which pod to remove.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoveTarget {
    /// By `namespace/name`.
    Name {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// By uid.
    Uid(String),
}

impl std::fmt::Display for RemoveTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoveTarget::Name { namespace, name } => write!(f, "{namespace}/{name}"),
            RemoveTarget::Uid(uid) => write!(f, "with uid {uid}"),
        }
    }
}

type Reply<T> = oneshot::Sender<Result<T, NodeError>>;

enum After {
    Remove {
        reply: Option<Reply<Removed>>,
        cause: String,
    },
    Evict {
        reason: String,
        message: String,
        reply: Reply<EvictedPod>,
    },
    Preempted {
        preemptor: String,
    },
}

enum Command {
    Apply {
        checked: Box<Checked>,
        source: PodSource,
        reply: Option<Reply<Applied>>,
    },
    Remove {
        target: RemoveTarget,
        grace: Option<Duration>,
        reply: Reply<Removed>,
    },
    Evict {
        uid: String,
        grace: Duration,
        reason: String,
        message: String,
        reply: Reply<EvictedPod>,
    },
    List {
        reply: oneshot::Sender<Vec<PodView>>,
    },
    StaticSync {
        manifests: Vec<(PathBuf, u32, serde_json::Value)>,
    },
    Stopped {
        uid: String,
        status: Result<Option<crate::act::runtime::PodStatus>, RuntimeError>,
        killed_at_ns: Option<u64>,
        killed: usize,
        reaped: usize,
        after: After,
    },
}

/// The answer to an eviction.
#[derive(Clone, Debug, PartialEq)]
pub struct EvictedPod {
    /// The pod as it ended (`Failed`, with the reason and message given).
    pub pod: PodView,
    /// `CLOCK_MONOTONIC` ns when its processes were sent SIGKILL by the agent (grace 0), or
    /// when the runtime reported them stopped (a grace period); `None` when nothing ran.
    pub killed_at_ns: Option<u64>,
    /// How many processes the agent itself sent SIGKILL (grace 0).
    pub killed: usize,
    /// Of those, how many had their memory reaped by `process_mrelease` (Linux 5.15+).
    pub reaped: usize,
}

/// The handle everything else uses; cheap to clone.
#[derive(Clone)]
pub struct PodManager {
    tx: mpsc::Sender<Command>,
    urgent: mpsc::Sender<Command>,
    active: watch::Receiver<Vec<ActivePod>>,
    runtime: Arc<dyn RuntimeView>,
    events: EventHub,
    plan: Arc<NodePlan>,
    cgroups: CgroupManager,
}

/// What [`PodManager::start`] needs.
pub struct PodManagerConfig<R> {
    /// The runtime pods run in.
    pub runtime: Arc<R>,
    /// The cgroup writer at the agent's `cgroupRoot`.
    pub cgroups: CgroupManager,
    /// The node model.
    pub plan: NodePlan,
    /// Where the pod checkpoint lives (`<stateDir>/pods.json`).
    pub state_dir: PathBuf,
    /// The device manager, for extended resources.
    pub devices: Option<Arc<DeviceManager>>,
    /// Where events go.
    pub events: EventHub,
}

impl PodManager {
    /// Loads the pod checkpoint, builds the QoS tree, re-adopts the pods the runtime still
    /// runs (restarting by their restart policy the ones it lost; killing nothing), and
    /// starts the owner task.
    pub async fn start<R: Runtime + 'static>(
        config: PodManagerConfig<R>,
    ) -> Result<PodManager, NodeError> {
        let checkpoint = Checkpoint::new(
            config.state_dir.join("pods.json"),
            CHECKPOINT_KIND,
            CHECKPOINT_VERSION,
        );
        let records: Vec<PodRecord> = checkpoint.load()?.unwrap_or_default();
        let plan = Arc::new(config.plan);
        config
            .cgroups
            .ensure_pod_tree(&Resources::from(&plan.kubepods()))?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let (urgent, urgent_rx) = mpsc::channel(URGENT_QUEUE);
        let (active_tx, active) = watch::channel(Vec::new());
        let runtime: Arc<dyn RuntimeView> = Arc::new(View(Arc::clone(&config.runtime)));
        let mut actor = Actor {
            rt: config.runtime,
            cgroups: config.cgroups.clone(),
            plan: Arc::clone(&plan),
            checkpoint,
            devices: config.devices,
            events: config.events.clone(),
            pods: BTreeMap::new(),
            pending: BTreeMap::new(),
            tx: urgent.downgrade(),
            active: active_tx,
        };
        actor.reconcile(records).await?;
        actor.publish_active();
        tokio::spawn(actor.run(rx, urgent_rx));
        Ok(PodManager {
            tx,
            urgent,
            active,
            runtime,
            events: config.events,
            plan,
            cgroups: config.cgroups,
        })
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, NodeError> {
        let (reply, rx) = oneshot::channel();
        let cmd = make(reply);
        let queue = if matches!(cmd, Command::Evict { .. }) {
            &self.urgent
        } else {
            &self.tx
        };
        queue.send(cmd).await.map_err(|_| NodeError::Stopped)?;
        rx.await.map_err(|_| NodeError::Stopped)?
    }

    /// Parses, checks and admits a pod document (JSON or YAML); see the module doc of
    /// [`super`] for the order of things. A refusal for resources is an `Ok` answer with
    /// `admitted: false` and the kubelet's reason and message; bad input is an error.
    pub async fn apply(&self, bytes: &[u8], format: Format) -> Result<Applied, NodeError> {
        let value = document::parse(bytes, format)?;
        let checked = document::check(value, &self.plan.runtime_kind, false, document::new_uid)?;
        self.ask(|reply| Command::Apply {
            checked: Box::new(checked),
            source: PodSource::Api,
            reply: Some(reply),
        })
        .await
    }

    /// Stops a pod (SIGTERM, SIGKILL after `grace` or its own grace period), removes its
    /// cgroup, gives the QoS tiers its memory back, and forgets it.
    pub async fn remove(
        &self,
        target: RemoveTarget,
        grace: Option<Duration>,
    ) -> Result<Removed, NodeError> {
        self.ask(|reply| Command::Remove {
            target,
            grace,
            reply,
        })
        .await
    }

    /// Every pod, sorted by namespace and name.
    pub async fn pods(&self) -> Result<Vec<PodView>, NodeError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::List { reply })
            .await
            .map_err(|_| NodeError::Stopped)?;
        rx.await.map_err(|_| NodeError::Stopped)
    }

    /// Kills pod `uid` after `grace` and marks it `Failed` with `reason` and `message` (the
    /// reactor loop's eviction: `Evicted` and the kubelet's message). Its cgroup is removed
    /// and the tiers recomputed; the pod stays listed, Failed.
    pub async fn evict(
        &self,
        uid: &str,
        grace: Duration,
        reason: &str,
        message: &str,
    ) -> Result<EvictedPod, NodeError> {
        self.ask(|reply| Command::Evict {
            uid: uid.to_string(),
            grace,
            reason: reason.to_string(),
            message: message.to_string(),
            reply,
        })
        .await
    }

    /// Replaces the set of static pods with the manifests read from `staticPodPath`
    /// (path, content hash, document): new ones are admitted, missing or changed ones
    /// removed (a changed one comes back on the next sync).
    pub(crate) async fn sync_static(&self, manifests: Vec<(PathBuf, u32, serde_json::Value)>) {
        let _ = self.tx.send(Command::StaticSync { manifests }).await;
    }

    /// The pods running now (admitted, not ended, not being stopped) with their cgroups, as
    /// the owner task last published them: the reactor loop reads this on every decision,
    /// so it costs a clone, not a round trip through the owner's queue.
    pub fn active(&self) -> Vec<ActivePod> {
        let mut pods = self.active.borrow().clone();
        for p in &mut pods {
            if let Some(cgroups) = self.runtime.container_cgroups(&p.info.uid) {
                for c in &mut p.containers {
                    if let Some(dir) = cgroups.get(&c.name) {
                        c.cgroup.clone_from(dir);
                    }
                }
            }
        }
        pods
    }

    /// The event hub: subscribe to what happens, or publish (the reactor loop's evictions).
    pub fn events(&self) -> &EventHub {
        &self.events
    }

    /// The node model (capacity, allocatable, cgroup settings).
    pub fn plan(&self) -> &NodePlan {
        &self.plan
    }

    /// The cgroup writer.
    pub fn cgroups(&self) -> &CgroupManager {
        &self.cgroups
    }
}

struct Entry {
    record: PodRecord,
    info: PodInfo,
    stopping: bool,
}

struct Pending {
    checked: Box<Checked>,
    source: PodSource,
    victims: BTreeSet<String>,
    preempted: Vec<String>,
    reply: Option<Reply<Applied>>,
}

struct Actor<R> {
    rt: Arc<R>,
    cgroups: CgroupManager,
    plan: Arc<NodePlan>,
    checkpoint: Checkpoint,
    devices: Option<Arc<DeviceManager>>,
    events: EventHub,
    pods: BTreeMap<String, Entry>,
    pending: BTreeMap<String, Pending>,
    /// The urgent queue, for the stop tasks' completions.
    tx: mpsc::WeakSender<Command>,
    active: watch::Sender<Vec<ActivePod>>,
}

fn reply<T>(tx: Option<Reply<T>>, value: Result<T, NodeError>) {
    if let Some(tx) = tx {
        let _ = tx.send(value);
    }
}

impl<R: Runtime + 'static> Actor<R> {
    async fn run(mut self, mut rx: mpsc::Receiver<Command>, mut urgent: mpsc::Receiver<Command>) {
        loop {
            let cmd = tokio::select! {
                biased;
                Some(cmd) = urgent.recv() => cmd,
                Some(cmd) = rx.recv() => cmd,
                else => break,
            };
            match cmd {
                Command::Apply {
                    checked,
                    source,
                    reply: tx,
                } => {
                    let mut tx = tx;
                    if let Some(result) = self.apply(checked, source, &mut tx).await {
                        reply(tx, result);
                    }
                }
                Command::Remove {
                    target,
                    grace,
                    reply: tx,
                } => match self.find(&target) {
                    Err(e) => reply(Some(tx), Err(e)),
                    Ok(uid) => self.begin_stop(
                        &uid,
                        grace,
                        After::Remove {
                            reply: Some(tx),
                            cause: "api".into(),
                        },
                    ),
                },
                Command::Evict {
                    uid,
                    grace,
                    reason,
                    message,
                    reply: tx,
                } => {
                    if !self.pods.contains_key(&uid) {
                        let _ = tx.send(Err(NodeError::NotFound(format!("with uid {uid}"))));
                    } else if self.pods.get(&uid).is_some_and(|e| e.stopping) {
                        let _ = tx.send(Err(NodeError::Stopping(format!("with uid {uid}"))));
                    } else {
                        self.begin_stop(
                            &uid,
                            Some(grace),
                            After::Evict {
                                reason,
                                message,
                                reply: tx,
                            },
                        );
                    }
                }
                Command::List { reply: tx } => {
                    let views = self.list().await;
                    let _ = tx.send(views);
                }
                Command::StaticSync { manifests } => self.sync_static(manifests).await,
                Command::Stopped {
                    uid,
                    status,
                    killed_at_ns,
                    killed,
                    reaped,
                    after,
                } => {
                    self.stopped(uid, status, (killed_at_ns, killed, reaped), after)
                        .await
                }
            }
            self.publish_active();
        }
    }

    /// Republishes the running pods for [`PodManager::active`] when they changed.
    fn publish_active(&self) {
        let active: Vec<ActivePod> = self
            .pods
            .values()
            .filter(|e| !e.stopping && !e.record.ended_by_agent && !e.record.is_terminal())
            .filter_map(|e| {
                let cgroup = e.record.cgroup.clone()?;
                let restart_policy = match e
                    .record
                    .document
                    .pointer("/spec/restartPolicy")
                    .and_then(serde_json::Value::as_str)
                {
                    Some("OnFailure") => RestartPolicy::OnFailure,
                    Some("Never") => RestartPolicy::Never,
                    _ => RestartPolicy::Always,
                };
                Some(ActivePod {
                    info: e.info.clone(),
                    cgroup,
                    containers: e
                        .info
                        .containers
                        .iter()
                        .map(|c| PodContainer::named(&c.name))
                        .collect(),
                    restart_policy,
                    termination_grace_period: Some(e.record.grace_period_seconds),
                })
            })
            .collect();
        self.active.send_if_modified(|old| {
            if *old == active {
                false
            } else {
                *old = active;
                true
            }
        });
    }

    fn find(&self, target: &RemoveTarget) -> Result<String, NodeError> {
        let uid = match target {
            RemoveTarget::Uid(uid) => self.pods.contains_key(uid).then(|| uid.clone()),
            RemoveTarget::Name { namespace, name } => self
                .pods
                .values()
                .find(|e| &e.record.namespace == namespace && &e.record.name == name)
                .map(|e| e.record.uid.clone()),
        }
        .ok_or_else(|| NodeError::NotFound(target.to_string()))?;
        if self.pods.get(&uid).is_some_and(|e| e.stopping) {
            return Err(NodeError::Stopping(target.to_string()));
        }
        Ok(uid)
    }

    /// Pods holding resources: admitted, not terminal (pending critical pods included).
    fn holding(&self) -> Vec<&PodInfo> {
        self.pods
            .values()
            .filter(|e| !e.record.is_terminal() && e.record.cgroup.is_some())
            .map(|e| &e.info)
            .chain(self.pending.values().map(|p| &p.checked.info))
            .collect()
    }

    fn save(&self) {
        let records: Vec<&PodRecord> = self.pods.values().map(|e| &e.record).collect();
        if let Err(e) = self.checkpoint.save(&records) {
            tracing::error!("pod checkpoint: {e}");
        }
    }

    fn update_tiers(&self) -> Result<(), NodeError> {
        let infos: Vec<PodInfo> = self
            .pods
            .values()
            .filter(|e| !e.record.is_terminal() && e.record.cgroup.is_some())
            .map(|e| e.info.clone())
            .collect();
        let (burstable, besteffort) = qos_tiers(&self.plan.cgroups, &infos);
        let clamped = self
            .cgroups
            .update_qos_tiers(&Resources::from(&burstable), &Resources::from(&besteffort))?;
        for c in clamped {
            tracing::warn!(cgroup = %c.cgroup, wanted = c.wanted, set = c.set, "QoS tier memory limit set to its usage (wanted limit below usage)");
        }
        Ok(())
    }

    fn spec_for(
        &self,
        checked: &Checked,
        device_env: &BTreeMap<String, Vec<(String, String)>>,
    ) -> Result<PodSpec, NodeError> {
        let k8s_pod: k8s::Pod = serde_json::from_value(checked.document.clone())
            .map_err(|e| NodeError::Invalid(format!("pod document: {e}")))?;
        pod_spec(&k8s_pod, &checked.info, &self.plan.cgroups, device_env)
            .map_err(|e| NodeError::Invalid(e.to_string()))
    }

    fn begin_stop(&mut self, uid: &str, grace: Option<Duration>, after: After) {
        let Some(entry) = self.pods.get_mut(uid) else {
            return;
        };
        entry.stopping = true;
        let grace = grace.unwrap_or_else(|| {
            Duration::from_secs(u64::try_from(entry.record.grace_period_seconds).unwrap_or(0))
        });
        let cgroup = entry.record.cgroup.clone();
        let live = !entry.record.ended_by_agent;
        let rt = Arc::clone(&self.rt);
        let cgroups = self.cgroups.clone();
        let tx = self.tx.clone();
        let uid = uid.to_string();
        tokio::spawn(async move {
            let (mut killed_at_ns, mut killed, mut reaped) = (None, 0, 0);
            let status = if live {
                let (status, evicted) =
                    stop_and_kill(&*rt, &uid, grace, cgroup.as_ref(), &cgroups).await;
                (killed_at_ns, killed, reaped) =
                    (evicted.killed_at_ns, evicted.killed, evicted.reaped);
                match status {
                    Ok(s) => Ok(Some(s)),
                    Err(RuntimeError::NotFound { .. }) => Ok(None),
                    Err(e) => Err(e),
                }
            } else {
                Ok(None)
            };
            let status = match (status, cgroup) {
                (Ok(s), Some(cg)) if live => {
                    let removed = tokio::task::spawn_blocking(move || {
                        cgroups.remove_pod_cgroup(&cg, DEFAULT_REMOVE_WAIT)
                    })
                    .await;
                    match removed {
                        Ok(Ok(())) => Ok(s),
                        Ok(Err(e)) => Err(RuntimeError::Cgroup(e)),
                        Err(e) => Err(RuntimeError::Unavailable {
                            reason: format!("cgroup removal task: {e}"),
                        }),
                    }
                }
                (s, _) => s,
            };
            if let Some(tx) = tx.upgrade() {
                let _ = tx
                    .send(Command::Stopped {
                        uid,
                        status,
                        killed_at_ns,
                        killed,
                        reaped,
                        after,
                    })
                    .await;
            }
        });
    }

    async fn stopped(
        &mut self,
        uid: String,
        status: Result<Option<crate::act::runtime::PodStatus>, RuntimeError>,
        (killed_at_ns, killed, reaped): (Option<u64>, usize, usize),
        after: After,
    ) {
        let failed = status.as_ref().err().map(ToString::to_string);
        if let Some(e) = self.pods.get_mut(&uid) {
            e.stopping = false;
            if let Ok(Some(s)) = &status {
                e.record.containers = s.containers.clone();
            }
        }
        match after {
            After::Remove { reply: tx, cause } => {
                if let Some(err) = failed {
                    reply(
                        tx,
                        Err(NodeError::Runtime(RuntimeError::Unavailable {
                            reason: err,
                        })),
                    );
                    return;
                }
                let Some(entry) = self.pods.remove(&uid) else {
                    return;
                };
                if let Err(e) = self.update_tiers() {
                    tracing::error!("QoS tiers after removing {uid}: {e}");
                }
                self.save();
                self.release_devices().await;
                tracing::info!(pod = %entry.record.full_name(), %uid, %cause, "pod removed");
                self.events.publish(NodeEventKind::Removed {
                    pod: entry.record.full_name(),
                    uid: uid.clone(),
                    cause,
                });
                let view = self.view(&entry, None, None);
                reply(tx, Ok(Removed { pod: view }));
            }
            After::Evict {
                reason,
                message,
                reply: tx,
            } => {
                if let Some(err) = failed {
                    if killed == 0 {
                        let _ = tx.send(Err(NodeError::Runtime(RuntimeError::Unavailable {
                            reason: err,
                        })));
                        return;
                    }
                    // The runtime failed (down, or died mid-stop), but the agent SIGKILLed
                    // the pod's processes itself: the eviction happened. The pod ends
                    // Evicted now, once, and the runtime is told to stop it when it answers
                    // again, so its sandbox and cgroups do not outlive the outage.
                    tracing::warn!(pod = %uid, "eviction: processes killed, but the runtime failed to stop the pod ({err}); retrying the stop in the background");
                    self.finish_stop_later(&uid);
                }
                self.end(&uid, reason, message);
                self.release_devices().await;
                let view = self.pods.get(&uid).map(|e| self.view(e, None, None));
                let _ = tx.send(
                    view.map(|pod| EvictedPod {
                        pod,
                        killed_at_ns,
                        killed,
                        reaped,
                    })
                    .ok_or_else(|| NodeError::NotFound(uid.clone())),
                );
            }
            After::Preempted { preemptor } => {
                if let Some(err) = failed {
                    if let Some(p) = self.pending.remove(&preemptor) {
                        reply(
                            p.reply,
                            Err(NodeError::Runtime(RuntimeError::Unavailable {
                                reason: format!("preempting {uid}: {err}"),
                            })),
                        );
                    }
                    return;
                }
                self.end(&uid, PREEMPTION_REASON.into(), PREEMPTION_MESSAGE.into());
                self.release_devices().await;
                let done = match self.pending.get_mut(&preemptor) {
                    Some(p) => {
                        p.victims.remove(&uid);
                        p.victims.is_empty()
                    }
                    None => false,
                };
                if done {
                    if let Some(p) = self.pending.remove(&preemptor) {
                        let result = self.admit(p.checked, p.source, p.preempted).await;
                        reply(p.reply, result);
                    }
                }
            }
        }
    }

    /// Frees the devices of pods that are no longer active (removed, evicted, preempted) as
    /// soon as they stop, rather than at the next allocation as the kubelet does, so node
    /// status and the device metrics do not count devices nobody holds. The next
    /// allocation would free them anyway; a failure here is only logged.
    async fn release_devices(&self) {
        if let Some(devices) = &self.devices {
            if let Err(e) = devices.remove_inactive_pods(&self.active_uids()).await {
                tracing::error!("freeing the devices of stopped pods: {e}");
            }
        }
    }

    /// Stops pod `uid` through the runtime in the background, retrying every
    /// [`STOP_RETRY`] until the runtime stops it or no longer knows it, then removes its pod
    /// cgroup: what an eviction during a runtime outage leaves behind (the processes are dead
    /// already; the sandbox, its records and the cgroups are not).
    fn finish_stop_later(&self, uid: &str) {
        let Some(cgroup) = self.pods.get(uid).and_then(|e| e.record.cgroup.clone()) else {
            return;
        };
        let (rt, cgroups, uid) = (Arc::clone(&self.rt), self.cgroups.clone(), uid.to_string());
        tokio::spawn(async move {
            loop {
                match rt.stop_pod(&uid, Duration::ZERO).await {
                    Ok(_) | Err(RuntimeError::NotFound { .. }) => break,
                    Err(e) => tracing::debug!(pod = %uid, "stop retry: {e}"),
                }
                tokio::time::sleep(STOP_RETRY).await;
            }
            let removed = tokio::task::spawn_blocking(move || {
                cgroups.remove_pod_cgroup(&cgroup, DEFAULT_REMOVE_WAIT)
            })
            .await;
            match removed {
                Ok(Ok(())) => {
                    tracing::info!(pod = %uid, "runtime back: evicted pod stopped and its cgroup removed")
                }
                Ok(Err(e)) => tracing::error!(pod = %uid, "removing the evicted pod's cgroup: {e}"),
                Err(e) => tracing::error!(pod = %uid, "cgroup removal task: {e}"),
            }
        });
    }

    /// Marks a stopped pod Failed with `reason`/`message` and gives its memory back to the
    /// tiers.
    fn end(&mut self, uid: &str, reason: String, message: String) {
        if let Some(e) = self.pods.get_mut(uid) {
            e.record.phase = PodPhase::Failed;
            e.record.reason = reason;
            e.record.message = message;
            e.record.ended_by_agent = true;
        }
        if let Err(e) = self.update_tiers() {
            tracing::error!("QoS tiers after ending {uid}: {e}");
        }
        self.save();
    }

    fn view(&self, e: &Entry, memory: Option<MemoryUsage>, rank: Option<u32>) -> PodView {
        PodView {
            uid: e.record.uid.clone(),
            namespace: e.record.namespace.clone(),
            name: e.record.name.clone(),
            info: e.info.clone(),
            cgroup: e.record.cgroup.clone(),
            phase: e.record.phase,
            reason: e.record.reason.clone(),
            message: e.record.message.clone(),
            containers: e.record.containers.clone(),
            oom_score_adj: e.record.oom_score_adj.clone(),
            grace_period_seconds: e.record.grace_period_seconds,
            memory,
            oom_kills: None,
            memory_rank: rank,
            is_static: matches!(e.record.source, PodSource::File { .. }),
            stopping: e.stopping,
        }
    }

    /// Refreshes every live pod's status from the runtime, reads memory use from the pod
    /// cgroups, ranks the running pods for `memory.available`.
    async fn list(&mut self) -> Vec<PodView> {
        match self.rt.list_pods().await {
            Ok(statuses) => {
                for s in statuses {
                    if let Some(e) = self.pods.get_mut(&s.uid) {
                        if !e.record.ended_by_agent {
                            e.record.phase = s.phase;
                            e.record.containers = s.containers;
                        }
                    }
                }
            }
            Err(e) => tracing::warn!("runtime list_pods: {e}"),
        }
        let mut memory = BTreeMap::new();
        let mut ooms = BTreeMap::new();
        for e in self.pods.values() {
            if let (false, Some(cg)) = (e.record.ended_by_agent, &e.record.cgroup) {
                if let Ok(m) = self.cgroups.memory_usage(cg) {
                    memory.insert(e.record.uid.clone(), m);
                }
                if let Ok(n) = self.cgroups.oom_kills(cg) {
                    ooms.insert(e.record.uid.clone(), n);
                }
            }
        }
        let ranks = memory_ranks(
            self.pods
                .values()
                .filter(|e| memory.contains_key(&e.record.uid) && !e.record.is_terminal())
                .map(|e| &e.info),
            &memory,
        );
        let mut views: Vec<PodView> = self
            .pods
            .values()
            .map(|e| {
                let mut v = self.view(
                    e,
                    memory.get(&e.record.uid).copied(),
                    ranks.get(&e.record.uid).copied(),
                );
                v.oom_kills = ooms.get(&e.record.uid).copied();
                v
            })
            .collect();
        views.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        views
    }

    async fn sync_static(&mut self, manifests: Vec<(PathBuf, u32, serde_json::Value)>) {
        let wanted: BTreeMap<&PathBuf, u32> = manifests.iter().map(|(p, h, _)| (p, *h)).collect();
        let gone: Vec<String> = self
            .pods
            .values()
            .filter(|e| !e.stopping)
            .filter_map(|e| match &e.record.source {
                PodSource::File { path, hash } if wanted.get(path) != Some(hash) => {
                    Some(e.record.uid.clone())
                }
                _ => None,
            })
            .collect();
        for uid in gone {
            self.begin_stop(
                &uid,
                None,
                After::Remove {
                    reply: None,
                    cause: "static-manifest-removed".into(),
                },
            );
        }
        for (path, hash, doc) in manifests {
            let known =
                self.pods.values().any(
                    |e| matches!(&e.record.source, PodSource::File { path: p, .. } if *p == path),
                ) || self
                    .pending
                    .values()
                    .any(|p| matches!(&p.source, PodSource::File { path: q, .. } if *q == path));
            if known {
                continue;
            }
            let uid = format!("static-{hash:08x}");
            let checked = match document::check(doc, &self.plan.runtime_kind, true, || uid) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(manifest = %path.display(), "static pod refused: {e}");
                    continue;
                }
            };
            let source = PodSource::File {
                path: path.clone(),
                hash,
            };
            match self.apply(Box::new(checked), source, &mut None).await {
                Some(Err(NodeError::AlreadyExists(_))) => {}
                Some(Err(e)) => {
                    tracing::warn!(manifest = %path.display(), "static pod refused: {e}")
                }
                _ => {}
            }
        }
    }

    /// At start: pods in the checkpoint whose runtime pods exist are kept as they are; live
    /// ones the runtime lost are started again by their restart policy (`Never`: marked
    /// Failed). Nothing is killed.
    async fn reconcile(&mut self, records: Vec<PodRecord>) -> Result<(), NodeError> {
        let running: BTreeSet<String> = self
            .rt
            .list_pods()
            .await?
            .into_iter()
            .map(|s| s.uid)
            .collect();
        let mut restart = Vec::new();
        for record in records {
            let info = match PodInfo::from_json(record.document.clone()) {
                Ok(i) => i,
                Err(e) => {
                    tracing::error!(pod = %record.full_name(), "checkpointed pod unreadable, dropped: {e}");
                    continue;
                }
            };
            let live = !record.ended_by_agent && record.cgroup.is_some() && !record.is_terminal();
            if live && !running.contains(&record.uid) {
                restart.push(record.uid.clone());
            }
            self.pods.insert(
                record.uid.clone(),
                Entry {
                    record,
                    info,
                    stopping: false,
                },
            );
        }
        for uid in restart {
            let Some(e) = self.pods.get(&uid) else {
                continue;
            };
            let policy = e
                .record
                .document
                .pointer("/spec/restartPolicy")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("Always");
            if policy == "Never" {
                if let Some(e) = self.pods.get_mut(&uid) {
                    e.record.phase = PodPhase::Failed;
                    e.record.reason = "ContainerStatusUnknown".into();
                    e.record.message =
                        "The pod's containers were gone when the agent restarted".into();
                    e.record.ended_by_agent = true;
                }
                continue;
            }
            let checked = Checked {
                document: e.record.document.clone(),
                namespace: e.record.namespace.clone(),
                name: e.record.name.clone(),
                uid: uid.clone(),
                info: e.info.clone(),
                grace_period_seconds: e.record.grace_period_seconds,
            };
            let cgroup = e.record.cgroup.clone();
            let started = async {
                let spec = self.spec_for(&checked, &BTreeMap::new())?;
                if let Some(cg) = &cgroup {
                    self.cgroups.create_pod_cgroup(
                        cg,
                        &Resources::from(&pod_config(&self.plan.cgroups, &checked.info)),
                    )?;
                }
                self.rt.run_pod(spec).await?;
                Ok::<(), NodeError>(())
            }
            .await;
            match started {
                Ok(()) => {
                    tracing::info!(pod = %checked.name, %uid, "pod missing from the runtime after restart: started again")
                }
                Err(err) => {
                    tracing::error!(pod = %checked.name, %uid, "pod could not be restarted: {err}");
                    if let Some(e) = self.pods.get_mut(&uid) {
                        e.record.phase = PodPhase::Failed;
                        e.record.reason = "ContainerStatusUnknown".into();
                        e.record.message =
                            format!("could not be restarted after an agent restart: {err}");
                        e.record.ended_by_agent = true;
                    }
                }
            }
        }
        self.update_tiers()?;
        self.save();
        Ok(())
    }
}

/// Ranks `pods` for `memory.available` by their working sets (`decide::rank`), 1 = first.
fn memory_ranks<'a>(
    pods: impl Iterator<Item = &'a PodInfo>,
    memory: &BTreeMap<String, MemoryUsage>,
) -> BTreeMap<String, u32> {
    use crate::decide::rank::rank;
    use crate::decide::signal::{FsLayout, Signal};
    use crate::decide::summary::{MemoryStats, PodStats, StatsIndex};
    let pods: Vec<PodInfo> = pods.cloned().collect();
    let stats: Vec<PodStats> = pods
        .iter()
        .map(|p| {
            let mut s = PodStats::default();
            s.pod_ref.uid = p.uid.clone();
            s.memory = Some(MemoryStats {
                working_set_bytes: memory.get(&p.uid).map(|m| m.working_set_bytes),
            });
            s
        })
        .collect();
    let mut index = StatsIndex::default();
    for s in &stats {
        index.insert(s.pod_ref.uid.as_str(), s);
    }
    rank(Signal::MemoryAvailable, FsLayout::Shared, &pods, &index)
        .into_iter()
        .enumerate()
        .map(|(place, i)| (pods[i].uid.clone(), place as u32 + 1))
        .collect()
}

/// The pod's phase word as the API prints it.
pub fn phase_name(phase: PodPhase) -> &'static str {
    match phase {
        PodPhase::Pending => "Pending",
        PodPhase::Running => "Running",
        PodPhase::Succeeded => "Succeeded",
        PodPhase::Failed => "Failed",
    }
}

/// A container state's word and reason as the API prints them.
pub fn container_state(c: &ContainerStatus) -> (&'static str, String) {
    match &c.state {
        ContainerState::Waiting { reason, .. } => ("waiting", reason.clone()),
        ContainerState::Running { .. } => ("running", String::new()),
        ContainerState::Terminated(t) => ("terminated", t.reason.clone()),
    }
}

/// The reactor loop drives eviction through the pod manager, so an evicted pod ends with its
/// status recorded, checkpointed and published like any other change on the node.
impl PodControl for PodManager {
    fn pods(&self) -> Vec<ActivePod> {
        self.active()
    }

    async fn evict(
        &self,
        uid: &str,
        grace: Duration,
        status: EvictionStatus,
    ) -> Result<Evicted, EvictError> {
        let done = PodManager::evict(self, uid, grace, &status.reason, &status.message)
            .await
            .map_err(|e| match e {
                NodeError::Runtime(r) => EvictError::Runtime(r),
                NodeError::Cgroup(c) => EvictError::Cgroup(c),
                NodeError::NotFound(_) => EvictError::Runtime(RuntimeError::NotFound {
                    uid: uid.to_string(),
                }),
                other => EvictError::Runtime(RuntimeError::Unavailable {
                    reason: other.to_string(),
                }),
            })?;
        Ok(Evicted {
            killed_at_ns: done.killed_at_ns,
            killed: done.killed,
            reaped: done.reaped,
        })
    }

    async fn writable_layers(&self) -> BTreeMap<String, BTreeMap<String, FsStats>> {
        let uids: Vec<String> = self
            .active
            .borrow()
            .iter()
            .map(|p| p.info.uid.clone())
            .collect();
        writable_layers_of(uids, |uid| async move {
            self.runtime.writable_layers(&uid).await
        })
        .await
    }
}

/// The boxed future [`RuntimeView::writable_layers`] returns.
type LayersFuture<'a> = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = Result<BTreeMap<String, FsStats>, RuntimeError>>
            + Send
            + 'a,
    >,
>;

/// What the reactor loop asks of the runtime outside the owner task (it must not queue
/// behind admissions): container cgroup names and writable-layer figures. Object safe, so
/// the cloneable [`PodManager`] handle holds any runtime.
trait RuntimeView: Send + Sync {
    fn container_cgroups(&self, uid: &str) -> Option<BTreeMap<String, String>>;
    fn writable_layers<'a>(&'a self, uid: &'a str) -> LayersFuture<'a>;
}

struct View<R>(Arc<R>);

impl<R: Runtime> RuntimeView for View<R> {
    fn container_cgroups(&self, uid: &str) -> Option<BTreeMap<String, String>> {
        self.0.container_cgroups(uid)
    }

    fn writable_layers<'a>(&'a self, uid: &'a str) -> LayersFuture<'a> {
        Box::pin(self.0.writable_layers(uid))
    }
}
