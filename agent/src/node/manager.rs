//! The pod manager: one task owns the pods (see the module doc of [`super`]).
//!
//! # The API for the reactor loop
//!
//! - [`PodManager::pods`] lists every pod with what eviction needs: the decision rules' view
//!   ([`PodInfo`]: QoS, requests, priority, criticality), the pod cgroup, phase, container
//!   states, grace period and the current memory working set.
//! - [`PodManager::evict_killed`] evicts one pod (killed first by [`PodManager::kill_now`]
//!   when its grace is 0) with a status (`Failed`, the given reason and
//!   message — `Evicted` and the kubelet's eviction message for the loop) after the given
//!   grace, removes its pod cgroup and recomputes the QoS tiers; the pod stays listed as
//!   Failed (as the kubelet leaves an evicted pod object) until it is removed. With grace 0
//!   the pod's processes get SIGKILL from the owner task itself, right after the runtime
//!   was told to stop (so nothing restarts them) and before the stop is written ahead to
//!   the checkpoint (so the disk never delays the kill; the kill journal, `node::journal`,
//!   notes it in between, for an agent that dies there), and the moment is reported back
//!   (`act::kill::begin_kill`, the first half of the `stop_and_kill` the runtime-only
//!   adapter uses; see `node::stop`).
//! - [`PodManager::active`] is the loop's hot-path view: the running pods with their cgroups,
//!   republished by the owner task after every change, read without a round trip.
//! - [`PodManager::events`] is the hub the loop publishes its own events on (evictions with
//!   their reaction time).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::document::{self, Checked, Format};
use super::events::EventHub;
use super::journal::{stops_from_notes, KillJournal};
use super::pod_record::{PodRecord, PodSource, CHECKPOINT_KIND, CHECKPOINT_VERSION};
use super::runtime_view::{RuntimeView, View};
use super::settings::NodePlan;
pub use super::view::Removed;
pub(crate) use super::view::{container_state, phase_name};
pub use super::view::{Applied, EvictedPod, PodView, RemoveTarget};
use super::NodeError;
use crate::act::cgroups::{CgroupManager, CgroupPath, Resources};
use crate::act::kill::{kill_cgroup_now, Evicted};
use crate::act::runtime::{RestartPolicy, Runtime, RuntimeError};
use crate::decide::cgroups::qos_tiers;
use crate::decide::memory_qos;
use crate::decide::pod::PodInfo;
use crate::devices::DeviceManager;
use crate::reactor::pods::{ActivePod, ActivePods, PodContainer};
use crate::record::checkpoint::Checkpoint;
use crate::record::state_file::Generation;

/// The kubelet's status message for a pod preempted by a critical pod.
pub(crate) const PREEMPTION_MESSAGE: &str = "Preempted in order to admit critical pod";
/// The kubelet's status reason for it (`events.PreemptContainer`).
pub(crate) const PREEMPTION_REASON: &str = "Preempting";

/// Commands queued to the owner task.
const QUEUE: usize = 256;
/// Evictions and stop completions, queued apart from the API's commands and taken first:
/// however many applies and lists clients have queued, the reactor loop's eviction (and the
/// news that a pod stopped, which it waits for) is next in line, never behind them.
const URGENT_QUEUE: usize = 64;
/// How often a pod the runtime failed to stop is tried again.
pub(super) const STOP_RETRY: Duration = Duration::from_secs(1);
/// How often the owner task retries a failed checkpoint write and looks for orphans past
/// their grace period.
const TICK: Duration = Duration::from_secs(1);

pub(super) type Reply<T> = oneshot::Sender<Result<T, NodeError>>;

pub(super) enum After {
    Remove {
        reply: Option<Reply<Removed>>,
        cause: String,
    },
    Evict {
        reason: String,
        message: String,
        /// The kill the caller made itself before asking ([`PodManager::kill_now`], for grace
        /// 0): the stop must not kill again, and reports this kill.
        killed: Option<Evicted>,
        reply: Reply<EvictedPod>,
    },
    Preempted {
        preemptor: String,
    },
}

pub(super) enum Command {
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
        killed: Option<Evicted>,
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
        killed: Evicted,
        after: After,
    },
}

/// The handle everything else uses; cheap to clone.
#[derive(Clone)]
pub struct PodManager {
    tx: mpsc::Sender<Command>,
    urgent: mpsc::Sender<Command>,
    pub(super) active: watch::Receiver<ActivePods>,
    pub(super) runtime: Arc<dyn RuntimeView>,
    killing: Killing,
    journal: Arc<KillJournal>,
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
    /// How long a pod found running without a spec stays before it is removed
    /// (`orphanGracePeriod`; see `node::orphans`).
    pub orphan_grace_period: Duration,
    /// `dryRun`: a critical pod that needs others preempted is refused, and the preemption
    /// is recorded (marked a dry run), not made; an orphan past its grace period is kept
    /// (an `orphan-kept` recovery event), not removed.
    pub dry_run: bool,
}

impl PodManager {
    /// Loads the pod checkpoint (a damaged one is set aside and the previous generation, or
    /// nothing, used: never a reason not to start), builds the QoS tree, re-adopts the pods
    /// the runtime still runs (restarting by their restart policy the ones it lost; killing
    /// nothing a known pod runs), rebuilds what the checkpoint lost from the node
    /// (`node::recover`), and starts the owner task.
    pub async fn start<R: Runtime + 'static>(
        config: PodManagerConfig<R>,
    ) -> Result<PodManager, NodeError> {
        let checkpoint = Checkpoint::new(
            config.state_dir.join("pods.json"),
            CHECKPOINT_KIND,
            CHECKPOINT_VERSION,
        )
        .with_notices(super::events::notices_to(&config.events));
        let loaded = checkpoint.load();
        let stale = loaded.generation == Generation::Previous;
        let mut records: Vec<PodRecord> = loaded.value.unwrap_or_default();
        let notes = KillJournal::read(&config.state_dir);
        stops_from_notes(&mut records, &notes);
        let journal = Arc::new(KillJournal::open(&config.state_dir));
        let mut plan = config.plan;
        config
            .cgroups
            .ensure_pod_tree(&Resources::from(&plan.kubepods()))?;
        // Asked of the kernel once the pod tree exists (`kubepods/memory.swap.max`): without
        // swap accounting no container gets a swap file, as the kubelet does.
        plan.cgroups.swap_controller = config.cgroups.swap_controller_available();
        let plan = Arc::new(plan);
        let (tx, rx) = mpsc::channel(QUEUE);
        let (urgent, urgent_rx) = mpsc::channel(URGENT_QUEUE);
        let (active_tx, active) = watch::channel(ActivePods::from([]));
        let runtime: Arc<dyn RuntimeView> = Arc::new(View(Arc::clone(&config.runtime)));
        let killing = Killing::default();
        let mut actor = Actor {
            rt: config.runtime,
            cgroups: config.cgroups.clone(),
            plan: Arc::clone(&plan),
            checkpoint,
            devices: config.devices,
            events: config.events.clone(),
            pods: BTreeMap::new(),
            pending: BTreeMap::new(),
            orphan_grace: config.orphan_grace_period,
            dry_run: config.dry_run,
            orphans_kept: Default::default(),
            state_dir: config.state_dir.clone(),
            tx: urgent.downgrade(),
            killing: killing.clone(),
            journal: Arc::clone(&journal),
            active: active_tx,
        };
        actor.reconcile(records, stale).await?;
        // The noted kills are stops in the checkpoint now (once it is written).
        journal.clear_unless(|| actor.checkpoint.is_failing());
        actor.publish_active();
        tokio::spawn(actor.run(rx, urgent_rx));
        Ok(PodManager {
            tx,
            urgent,
            active,
            runtime,
            killing,
            journal,
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
    pub(crate) async fn apply(&self, bytes: &[u8], format: Format) -> Result<Applied, NodeError> {
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
    pub(crate) async fn remove(
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

    /// Evicts pod `uid` after `grace` and marks it `Failed` with `reason` and `message` (the
    /// reactor loop's eviction: `Evicted` and the kubelet's message). Its cgroup is removed
    /// and the tiers recomputed; the pod stays listed, Failed.
    ///
    /// With grace 0 the caller has killed already, in its own task, before anything is
    /// queued ([`PodManager::kill_now`]; `killed` is its result, `None` when it killed
    /// nothing): the reactor loop's SIGKILL never waits for the owner task to finish an apply
    /// or a list that 50 API clients may have queued ahead of it. This is the bookkeeping
    /// (the stop written ahead, the runtime's stop, the status, the cgroup), left by the loop
    /// to a task it does not await.
    pub(crate) async fn evict_killed(
        &self,
        uid: &str,
        grace: Duration,
        reason: &str,
        message: &str,
        killed: Option<Evicted>,
    ) -> Result<EvictedPod, NodeError> {
        self.ask(|reply| Command::Evict {
            uid: uid.to_string(),
            grace,
            reason: reason.to_string(),
            message: message.to_string(),
            killed,
            reply,
        })
        .await
    }

    /// SIGKILLs every process in the cgroup of running pod `uid` at once, after fencing it
    /// in the runtime ([`Runtime::fence`]: nothing it kills is restarted), and reaps their
    /// memory; `None` when the pod is not running (unknown, ended or being stopped: the
    /// owner task answers for it). Synchronous, and it takes only locks that are never held
    /// across I/O (the fence's, the pods watch's), so the kill costs the caller
    /// microseconds whatever the owner task or the runtime is doing.
    ///
    /// The caller notes the kill in the kill journal right after it
    /// ([`PodManager::note_eviction`]), once the eviction's message is composed.
    pub(crate) fn kill_now(&self, uid: &str) -> Option<Evicted> {
        let cgroup = self
            .active
            .borrow()
            .iter()
            .find(|p| p.info.uid == uid)
            .map(|p| p.cgroup.clone())?;
        // Until the owner task takes the eviction, a list must not show the pod ended by
        // its dead containers (Failed with no reason): it is being stopped.
        self.killing.insert(uid);
        self.runtime.fence(uid);
        let known = self.runtime.known_processes(uid);
        Some(kill_cgroup_now(&self.cgroups, &cgroup, known))
    }

    /// Hard before soft: SIGKILL now to every process in `cgroup`, pod `uid`'s, whose
    /// graceful eviction is under way (its runtime was told to stop already, so nothing
    /// restarts them): the loop's escalation, through its port.
    pub(crate) fn escalate(&self, uid: &str, cgroup: &CgroupPath) -> Evicted {
        let _ = uid;
        kill_cgroup_now(&self.cgroups, cgroup, Vec::new())
    }

    /// Notes an eviction begun, the kill [`PodManager::kill_now`] made or a graceful one, in
    /// the kill journal ([`KillJournal`]) with its `reason` and `message`, so an agent
    /// killed before the owner task's write-ahead record still ends the pod evicted after
    /// its restart, instead of starting it again or evicting it a second time. The pod
    /// counts as being killed until the owner task takes the eviction, so no other command
    /// clears the journal first. The loop calls it right after the kill (or, for a grace,
    /// before the stop is queued), once the message is composed (the victim's figures are
    /// read before the SIGKILL; composing the text is not).
    pub(crate) fn note_eviction(&self, uid: &str, reason: &str, message: &str) {
        self.killing.insert(uid);
        self.journal.note(uid, reason, message);
    }

    /// Replaces the set of static pods with the manifests read from `staticPodPath`
    /// (path, content hash, document): new ones are admitted, missing or changed ones
    /// removed (a changed one comes back on the next sync).
    pub(crate) async fn sync_static(&self, manifests: Vec<(PathBuf, u32, serde_json::Value)>) {
        let _ = self.tx.send(Command::StaticSync { manifests }).await;
    }

    /// The pods running now (admitted, not ended, not being stopped) with their cgroups, as
    /// the owner task last published them: the reactor loop reads this on every decision,
    /// so it costs a reference count (a copy only where the runtime names container cgroups
    /// its own way, CRI), never a round trip through the owner's queue.
    pub(crate) fn active(&self) -> ActivePods {
        let published = self.active.borrow().clone();
        let named: Vec<Option<BTreeMap<String, String>>> = published
            .iter()
            .map(|p| self.runtime.container_cgroups(&p.info.uid))
            .collect();
        if named.iter().all(Option::is_none) {
            return published;
        }
        let mut pods = published.to_vec();
        for (p, cgroups) in pods.iter_mut().zip(named) {
            let Some(cgroups) = cgroups else { continue };
            for c in &mut p.containers {
                if let Some(dir) = cgroups.get(&c.name) {
                    c.cgroup.clone_from(dir);
                }
            }
        }
        pods.into()
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

/// The uids of pods whose processes the reactor loop killed ([`PodManager::kill_now`]) and
/// whose eviction the owner task has not taken yet: shown as being stopped meanwhile.
#[derive(Clone, Default)]
pub(super) struct Killing(Arc<std::sync::Mutex<BTreeSet<String>>>);

impl Killing {
    fn set(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(&self, uid: &str) {
        self.set().insert(uid.to_string());
    }

    fn remove(&self, uid: &str) {
        self.set().remove(uid);
    }

    /// Whether pod `uid` was killed and its eviction not yet taken.
    pub(super) fn contains(&self, uid: &str) -> bool {
        self.set().contains(uid)
    }

    /// Whether any pod was killed and its eviction not yet taken.
    pub(super) fn any(&self) -> bool {
        !self.set().is_empty()
    }
}

pub(super) struct Entry {
    pub(super) record: PodRecord,
    pub(super) info: PodInfo,
    pub(super) stopping: bool,
}

pub(super) struct Pending {
    pub(super) checked: Box<Checked>,
    pub(super) source: PodSource,
    pub(super) victims: BTreeSet<String>,
    pub(super) preempted: Vec<String>,
    pub(super) reply: Option<Reply<Applied>>,
}

pub(super) struct Actor<R> {
    pub(super) rt: Arc<R>,
    pub(super) cgroups: CgroupManager,
    pub(super) plan: Arc<NodePlan>,
    pub(super) checkpoint: Checkpoint,
    pub(super) devices: Option<Arc<DeviceManager>>,
    pub(super) events: EventHub,
    pub(super) pods: BTreeMap<String, Entry>,
    /// How long an orphan stays before it is removed (`orphanGracePeriod`).
    pub(super) orphan_grace: Duration,
    /// `dryRun` (see [`PodManagerConfig::dry_run`]).
    pub(super) dry_run: bool,
    /// In a dry run, the orphans past their grace period said already (`orphan-kept`).
    pub(super) orphans_kept: std::collections::BTreeSet<String>,
    /// `stateDir`, where the process runtime's log directories name lost pods.
    pub(super) state_dir: PathBuf,
    pub(super) pending: BTreeMap<String, Pending>,
    /// The urgent queue, for the stop tasks' completions.
    pub(super) tx: mpsc::WeakSender<Command>,
    /// Pods killed by [`PodManager::kill_now`] whose eviction this task has not taken yet.
    pub(super) killing: Killing,
    /// Where kills are noted until the checkpoint holds their stops.
    pub(super) journal: Arc<KillJournal>,
    pub(super) active: watch::Sender<ActivePods>,
}

pub(super) fn reply<T>(tx: Option<Reply<T>>, value: Result<T, NodeError>) {
    if let Some(tx) = tx {
        let _ = tx.send(value);
    }
}

impl<R: Runtime + 'static> Actor<R> {
    async fn run(mut self, mut rx: mpsc::Receiver<Command>, mut urgent: mpsc::Receiver<Command>) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let cmd = tokio::select! {
                biased;
                Some(cmd) = urgent.recv() => cmd,
                cmd = rx.recv() => match cmd {
                    Some(cmd) => cmd,
                    None => return,
                },
                _ = tick.tick() => {
                    // A checkpoint whose last write failed (a full disk) is written again
                    // until it succeeds; orphans past their grace period go.
                    if self.checkpoint.is_failing() {
                        self.save();
                    }
                    self.expire_orphans();
                    self.publish_active();
                    continue;
                }
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
                    killed,
                    reply: tx,
                } => {
                    // From here the pod's own `stopping` (or its absence) says it.
                    self.killing.remove(&uid);
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
                                killed,
                                reply: tx,
                            },
                        );
                    }
                    // The stop is in the checkpoint now: the journal may go, unless another
                    // kill waits for this task or the checkpoint was not written.
                    self.journal
                        .clear_unless(|| self.killing.any() || self.checkpoint.is_failing());
                }
                Command::List { reply: tx } => {
                    let views = self.list().await;
                    let _ = tx.send(views);
                }
                Command::StaticSync { manifests } => self.sync_static(manifests).await,
                Command::Stopped {
                    uid,
                    status,
                    killed,
                    after,
                } => self.stopped(uid, status, killed, after).await,
            }
            self.publish_active();
        }
    }

    /// Republishes the running pods for [`PodManager::active`] when they changed.
    pub(super) fn publish_active(&self) {
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
            if old[..] == active[..] {
                false
            } else {
                *old = active.into();
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
    pub(super) fn holding(&self) -> Vec<&PodInfo> {
        self.pods
            .values()
            .filter(|e| !e.record.is_terminal() && e.record.cgroup.is_some())
            .map(|e| &e.info)
            .chain(self.pending.values().map(|p| &p.checked.info))
            .collect()
    }

    pub(super) fn save(&self) {
        let records: Vec<&PodRecord> = self.pods.values().map(|e| &e.record).collect();
        if let Err(e) = self.checkpoint.save(&records) {
            tracing::error!("pod checkpoint: {e}");
        }
    }

    pub(super) fn update_tiers(&self) -> Result<(), NodeError> {
        let infos: Vec<PodInfo> = self
            .pods
            .values()
            .filter(|e| !e.record.is_terminal() && e.record.cgroup.is_some())
            .map(|e| e.info.clone())
            .collect();
        let (mut burstable, besteffort) = qos_tiers(&self.plan.cgroups, &infos);
        let memory = self.plan.cgroups.memory_node();
        if memory_qos::enforced(&memory) {
            // The kubelet's Guaranteed tier is `kubepods` itself: its `memory.min` covers the
            // Guaranteed and Burstable requests. Where the kubelet leaves a tier's unset (no
            // requests left), 0 is written here instead, so a protection for pods that are
            // gone does not outlive them.
            let (kubepods_min, _) = memory_qos::qos_memory_min(&memory, &infos);
            let kubepods = Resources {
                memory_min: Some(kubepods_min.unwrap_or(0)),
                ..Resources::default()
            };
            self.cgroups.apply(&CgroupPath::kubepods(), &kubepods)?;
            burstable.memory_min = Some(burstable.memory_min.unwrap_or(0));
        }
        let clamped = self
            .cgroups
            .update_qos_tiers(&Resources::from(&burstable), &Resources::from(&besteffort))?;
        for c in clamped {
            tracing::warn!(cgroup = %c.cgroup, wanted = c.wanted, set = c.set, "QoS tier memory limit set to its usage (wanted limit below usage)");
        }
        Ok(())
    }

    pub(super) fn active_uids(&self) -> BTreeSet<String> {
        self.pods
            .values()
            .filter(|e| !e.record.is_terminal())
            .map(|e| e.record.uid.clone())
            .collect()
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
}
