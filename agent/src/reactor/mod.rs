//! The reactor loop: live node-pressure eviction, driven by kernel events.
//!
//! sense → observe → decide → act → record, once per wake-up:
//!
//! 1. Wake on every [`PressureEvent`] (a storm of them is drained
//!    and becomes one evaluation), on the housekeeping tick, or on a timer of its own (a
//!    grace period or a condition's transition period running out, or a memory signal close
//!    to a threshold, which is then re-read every few milliseconds).
//! 2. Observe the signals ([`crate::observe`]) and run one eviction-manager pass with the same
//!    function `reactor plan pressure` uses ([`crate::decide::pressure::pass`]), keeping its
//!    state between passes.
//! 3. For a disk signal, reclaim node-level resources first (dead containers, unused images:
//!    the steps seed 003 lists for the filesystem layout observed), re-observe, and stop
//!    there if that resolved the threshold with its minimum reclaim. Memory has no
//!    node-level reclaim, as in the kubelet. The `containerfs` thresholds follow the layout
//!    too.
//! 4. Evict one pod, the first non-critical one in [`crate::decide::rank::rank`]'s order, with
//!    grace 0 for a hard threshold and the capped pod grace for a soft one; the pod ends
//!    `Failed`/`Evicted` with the kubelet's message. Wait (bounded) for its pod cgroup to
//!    empty — its memory is then given back — and evaluate again at once; after a disk
//!    eviction disk thresholds wait one housekeeping interval (the runtime frees the
//!    victim's writable layer on its own time).
//! 5. Record: one [`Decision`] on a broadcast channel and one log line per decision; kernel
//!    OOM kills are mapped to their pod and container and recorded as `OOMKilled`.
//!
//! The loop owns its state (one task); pods are reached through [`PodControl`]. It owns the
//! [`Sense`] too while it runs — every event passes through it first — so whoever else wants
//! the raw events (metrics, the API's event stream, the per-event log line) registers a tap
//! ([`Reactor::with_tap`]) instead of reading the sense layer beside it; [`Reactor::run`]
//! hands the sense layer back when it ends, for its lag statistics.

mod evict;
pub mod oom;
pub mod pods;
pub mod reclaim;
pub mod record;
pub mod status;
pub mod thread;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{broadcast, watch};

use crate::act::cgroups::CgroupManager;
use crate::config::Config;
use crate::decide::pressure::{pass, thresholds_met, EvictionState};
use crate::decide::signal::NodeCondition;
use crate::decide::signal::{FsLayout, Signal};
use crate::decide::summary::Summary;
use crate::decide::thresholds::{
    format_quantity, parse_thresholds, with_containerfs_thresholds, EvictionSettings, Threshold,
    ThresholdError,
};
use crate::observe::{Observer, Signals};
use crate::record::metrics::{Metrics, SignalThresholds};
use crate::sense::ebpf::charge_switch::ChargeSwitch;
use crate::sense::memcg::MemcgThresholds;
use crate::sense::{monotonic_ns, Kind, MemcgTarget, PressureEvent, Received, Sense};

pub use pods::{
    ActivePod, EvictError, Evicted, EvictionStatus, PodContainer, PodControl, RuntimePods,
};
pub use reclaim::{reclaim_steps, NodeReclaim, NodeReclaimed, ReclaimSteps};
pub use record::{Action, Decision, RankedPod, SignalValue, Wake};
pub use status::{ConditionState, NodePressure, SignalState, ThresholdState};

/// The kubelet's default `evictionPressureTransitionPeriod`, which also replaces a zero.
const DEFAULT_TRANSITION: Duration = Duration::from_secs(300);

/// How the loop behaves; built from the config once.
#[derive(Clone, Debug)]
pub struct ReactorSettings {
    /// The eviction thresholds, hard first, with the `containerfs` ones derived for `layout`.
    pub thresholds: Vec<Threshold>,
    /// The thresholds as configured, which `thresholds` is derived from: `containerfs`
    /// thresholds cannot be configured (seed 003) but follow the filesystem layout, which is
    /// only known once the filesystems are observed.
    pub configured: Vec<Threshold>,
    /// The filesystem layout the `containerfs` thresholds were derived for.
    pub layout: FsLayout,
    /// `evictionPressureTransitionPeriod`.
    pub transition_period: Duration,
    /// `evictionMaxPodGracePeriod`, seconds.
    pub max_pod_grace_period: i64,
    /// The housekeeping interval: the longest the loop sleeps without an event.
    pub housekeeping: Duration,
    /// How long to wait for an evicted pod's cgroup to empty before deciding again.
    pub release_wait: Duration,
    /// How often to re-read the signals while a memory signal is close to a threshold.
    pub close_poll: Duration,
    /// How many pods of the ranking each decision records.
    pub ranking_top: usize,
    /// `cgroupRoot` (as a path in the hierarchy): events from cgroups outside it are not
    /// this node's.
    pub cgroup_root: String,
    /// Wait for each eviction to finish and its memory to come back before the next pass:
    /// the kubelet's behaviour, kept so the bench can compare a "kubelet-like" loop with one
    /// that keeps observing and deciding while evictions are in flight. Default `false`.
    /// (The loop is serial either way until evictions in flight are implemented; until then
    /// this is read by nobody.)
    pub serial_evictions: bool,
}

impl ReactorSettings {
    /// The settings a config file asks for.
    pub fn from_config(config: &Config) -> Result<ReactorSettings, ThresholdError> {
        let settings = EvictionSettings {
            hard: config.eviction_hard.clone(),
            soft: config.eviction_soft.clone(),
            soft_grace_period: config.eviction_soft_grace_period.clone(),
            minimum_reclaim: config.eviction_minimum_reclaim.clone(),
            merge_defaults: config.merge_default_eviction_settings,
            enforce_allocatable_pods: config.enforce_node_allocatable.iter().any(|e| e == "pods"),
        };
        let parsed = parse_thresholds(&settings)?;
        let (thresholds, _) = with_containerfs_thresholds(&parsed, FsLayout::Shared);
        let transition = config.eviction_pressure_transition_period.0;
        Ok(ReactorSettings {
            thresholds,
            configured: parsed,
            layout: FsLayout::Shared,
            transition_period: if transition.is_zero() {
                DEFAULT_TRANSITION
            } else {
                transition
            },
            max_pod_grace_period: config.eviction_max_pod_grace_period,
            housekeeping: config.housekeeping_interval.0,
            release_wait: Duration::from_secs(10),
            close_poll: Duration::from_millis(1),
            ranking_top: 5,
            cgroup_root: if config.cgroup_root.is_empty() {
                "/".to_string()
            } else {
                config.cgroup_root.clone()
            },
            serial_evictions: false,
        })
    }
}

impl ReactorSettings {
    /// Derives the `containerfs` thresholds for `layout` as seed 003 says: those of `nodefs`
    /// when one filesystem holds everything or the image filesystem is split, those of
    /// `imagefs` when a separate image filesystem also holds the writable layers. The other
    /// thresholds keep their place (the derived ones come last). Returns whether anything
    /// changed.
    pub fn set_layout(&mut self, layout: FsLayout) -> bool {
        if layout == self.layout {
            return false;
        }
        let (thresholds, _) = with_containerfs_thresholds(&self.configured, layout);
        self.layout = layout;
        let changed = thresholds != self.thresholds;
        self.thresholds = thresholds;
        changed
    }
}

/// The memcg notifications the loop needs: for each memory threshold, a usage threshold on
/// the cgroup the signal is measured on (the node cgroup for `memory.available`, kubepods for
/// the allocatable signal) at the level where the threshold is met — the kubelet's memory
/// threshold notifier. Usage counts page cache the working set does not, so the crossing can
/// come a little before the threshold is met; the loop then watches closely (`close_poll`).
pub fn memcg_targets(settings: &ReactorSettings, observer: &Observer) -> Vec<MemcgTarget> {
    let capacity = observer.memory_capacity();
    let allocatable = capacity.saturating_sub(observer.settings().reserved_memory);
    let mut out: Vec<MemcgTarget> = Vec::new();
    for t in &settings.thresholds {
        let (cgroup, total) = match t.signal {
            Signal::MemoryAvailable => (observer.settings().node_cgroup.clone(), capacity),
            Signal::AllocatableMemoryAvailable => {
                (observer.settings().kubepods_cgroup.clone(), allocatable)
            }
            _ => continue,
        };
        let total_q =
            crate::decide::quantity::Quantity::from_units(i64::try_from(total).unwrap_or(i64::MAX));
        let level = u64::try_from(t.level(total_q, false).value()).unwrap_or(0);
        let usage_at = total.saturating_sub(level);
        if usage_at == 0 {
            continue;
        }
        let target = MemcgTarget {
            cgroup,
            threshold_bytes: Some(usage_at),
        };
        if !out.contains(&target) {
            out.push(target);
        }
    }
    out
}

/// A running loop's outputs.
#[derive(Clone)]
pub struct ReactorHandle {
    decisions: broadcast::Sender<Decision>,
    conditions: watch::Receiver<Vec<String>>,
    pressure: watch::Receiver<Option<NodePressure>>,
}

impl ReactorHandle {
    /// Every decision from now on (the API's event stream subscribes here).
    pub fn subscribe(&self) -> broadcast::Receiver<Decision> {
        self.decisions.subscribe()
    }

    /// The node conditions the loop reports now (`MemoryPressure`, `DiskPressure`, ...).
    pub fn conditions(&self) -> watch::Receiver<Vec<String>> {
        self.conditions.clone()
    }

    /// The signals, thresholds and conditions as the loop's last pass saw them (`None`
    /// before the first pass): what `reactor status` shows.
    pub fn pressure(&self) -> watch::Receiver<Option<NodePressure>> {
        self.pressure.clone()
    }
}

/// The loop's state; see the module doc. Run it with [`Reactor::run`] or [`spawn`].
pub struct Reactor<P> {
    settings: ReactorSettings,
    observer: Observer,
    pods: Arc<P>,
    cgroups: CgroupManager,
    reclaimer: Option<Arc<dyn NodeReclaim>>,
    state: EvictionState,
    summary: Summary,
    /// The victim's statistics, read for its eviction message.
    victim: Summary,
    decisions: broadcast::Sender<Decision>,
    conditions: watch::Sender<Vec<String>>,
    pressure: watch::Sender<Option<NodePressure>>,
    transitions: status::Transitions,
    seq: u64,
    unprevented_ooms: u64,
    oom_counts: BTreeMap<(String, String), u64>,
    /// The first kernel event of the current pressure episode (since the last evaluation
    /// that found nothing met and nothing close): what a timer-woken decision answers to.
    episode: Option<PressureEvent>,
    close: bool,
    tap: Option<EventTap>,
    metrics: Option<Arc<Metrics>>,
    /// The memcg usage thresholds, moved by the inactive file pages on every pass.
    thresholds: MemcgThresholds,
    /// Takes the eBPF charge programs off while a victim the loop killed is torn down
    /// (`evict_one`; see [`ChargeSwitch`]).
    charge_switch: Option<ChargeSwitch>,
    /// After a disk eviction, `CLOCK_MONOTONIC` ns until which disk thresholds are not
    /// acted on (see [`Reactor::disk_held`]); 0 when none.
    disk_hold_until_ns: u64,
}

/// What [`Reactor::with_tap`] takes: called with every event the loop receives.
pub type EventTap = Box<dyn Fn(&Received) + Send + Sync>;

/// Waits for the next change of the pods; never resolves without a change feed (or once
/// the feed has closed), so it can sit in a `select!` unconditionally.
async fn next_change<T>(changes: &mut Option<watch::Receiver<T>>) -> Option<()> {
    if let Some(rx) = changes {
        if rx.changed().await.is_ok() {
            return Some(());
        }
    }
    std::future::pending().await
}

/// Polls a future once; `None` when it is not ready (it is dropped).
async fn poll_once<F: Future>(fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| Poll::Ready(ready(fut.as_mut().poll(cx)))).await
}

fn ready<T>(p: Poll<T>) -> Option<T> {
    match p {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

impl<P: PodControl + 'static> Reactor<P> {
    /// A loop over `observer`'s signals and `pods`; `cgroups` is the writer rooted at
    /// `cgroupRoot` (to watch victims' cgroups empty and read OOM kill counters);
    /// `reclaimer` frees node-level disk resources (none: evict at once).
    pub fn new(
        settings: ReactorSettings,
        observer: Observer,
        pods: Arc<P>,
        cgroups: CgroupManager,
        reclaimer: Option<Arc<dyn NodeReclaim>>,
    ) -> Reactor<P> {
        Reactor {
            settings,
            observer,
            pods,
            cgroups,
            reclaimer,
            state: EvictionState::default(),
            summary: Summary::default(),
            victim: Summary::default(),
            decisions: broadcast::channel(1024).0,
            conditions: watch::channel(Vec::new()).0,
            pressure: watch::channel(None).0,
            transitions: status::Transitions::default(),
            seq: 0,
            unprevented_ooms: 0,
            oom_counts: BTreeMap::new(),
            episode: None,
            close: false,
            tap: None,
            metrics: None,
            thresholds: MemcgThresholds::default(),
            charge_switch: None,
            disk_hold_until_ns: 0,
        }
    }

    /// Calls `tap` with every event the loop receives (ticks and other nodes' cgroups
    /// included), before the loop folds them: the agent's event counters, event stream and
    /// per-event log line hang here. It runs on the loop's task, so it must be quick.
    pub fn with_tap(mut self, tap: impl Fn(&Received) + Send + Sync + 'static) -> Reactor<P> {
        self.tap = Some(Box::new(tap));
        self
    }

    /// Keeps `metrics` up to date: signal values and thresholds on every pass, node
    /// conditions, evictions by signal and QoS, reaction lag by the waking event's source.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Reactor<P> {
        self.metrics = Some(metrics);
        self
    }

    /// The outputs, to subscribe before running.
    pub fn handle(&self) -> ReactorHandle {
        ReactorHandle {
            decisions: self.decisions.clone(),
            conditions: self.conditions.subscribe(),
            pressure: self.pressure.subscribe(),
        }
    }

    /// Runs until every sense source stops or `shutdown` turns `true`; hands the sense layer
    /// back (to be shut down and asked for its lag statistics).
    pub async fn run(mut self, mut sense: Sense, mut shutdown: watch::Receiver<bool>) -> Sense {
        self.baseline_oom_counts();
        self.thresholds = sense.memcg_thresholds();
        self.charge_switch = sense.charge_switch();
        let mut pods_changed = self.pods.changes();
        self.warm_pods();
        loop {
            if *shutdown.borrow() {
                return sense;
            }
            let sleep = self.next_recheck();
            let first = tokio::select! {
                biased;
                r = sense.next() => match r {
                    Some(r) => Some(r),
                    None => return sense,
                },
                () = tokio::time::sleep(sleep) => None,
                _ = shutdown.changed() => return sense,
                Some(()) = next_change(&mut pods_changed) => {
                    self.warm_pods();
                    continue;
                }
            };
            let mut received: Vec<Received> = first.into_iter().collect();
            self.drain(&mut sense, &mut received).await;
            let Some(wake) = self.take_events(received) else {
                continue;
            };
            self.evaluate(wake, &mut sense).await;
        }
    }

    /// Takes every event already waiting.
    async fn drain(&mut self, sense: &mut Sense, into: &mut Vec<Received>) {
        while let Some(Some(r)) = poll_once(sense.next()).await {
            into.push(r);
        }
    }

    /// Records OOM kills among `received` and folds the rest into one wake-up; `None` when
    /// nothing among them concerns this node.
    fn take_events(&mut self, received: Vec<Received>) -> Option<Wake> {
        if received.is_empty() {
            return Some(Wake {
                event: self.episode.clone(),
                timer: true,
                detection_lag_ns: None,
                coalesced: 0,
            });
        }
        let mut wake: Option<(PressureEvent, u64)> = None;
        let mut coalesced = 0;
        for r in received {
            if let Some(tap) = &self.tap {
                tap(&r);
            }
            if !self.is_ours(&r.event) {
                continue;
            }
            if let Kind::OomKill { pid, comm, .. } = &r.event.kind {
                self.record_oom(&r, *pid, comm.clone());
            }
            coalesced += 1;
            if record::is_kernel_event(&r.event) && self.episode.is_none() {
                self.episode = Some(r.event.clone());
            }
            // The wake-up is the earliest kernel event of the batch (ticks only when alone).
            let better = match &wake {
                None => true,
                Some((w, _)) => {
                    let (wk, rk) = (
                        record::is_kernel_event(w),
                        record::is_kernel_event(&r.event),
                    );
                    (rk && !wk) || (rk == wk && r.event.at_ns < w.at_ns)
                }
            };
            if better {
                wake = Some((r.event, r.lag_ns));
            }
        }
        let (event, lag) = wake?;
        Some(Wake {
            event: Some(event),
            timer: false,
            detection_lag_ns: Some(lag),
            coalesced,
        })
    }

    fn is_ours(&self, event: &PressureEvent) -> bool {
        concerns_node(&self.settings.cgroup_root, event)
    }

    /// The longest the loop may sleep: the housekeeping interval, cut short by a grace period
    /// or a condition's transition period running out, or by close watch.
    fn next_recheck(&self) -> Duration {
        let now = i128::from(monotonic_ns());
        let mut wait = i128::try_from(self.settings.housekeeping.as_nanos()).unwrap_or(i128::MAX);
        if self.close {
            wait = wait.min(i128::try_from(self.settings.close_poll.as_nanos()).unwrap_or(0));
        }
        let held = i128::from(self.disk_hold_until_ns) - now;
        if held > 0 {
            wait = wait.min(held + 1);
        }
        for (&i, &at) in &self.state.first_observed_at {
            if let Some(t) = self.settings.thresholds.get(i) {
                let due = at + i128::from(t.grace_period_nanos) - now;
                if due > 0 {
                    wait = wait.min(due);
                }
            }
        }
        let transition = i128::try_from(self.settings.transition_period.as_nanos()).unwrap_or(0);
        for &at in self.state.conditions_last_observed_at.values() {
            let due = at + transition - now;
            if due > 0 {
                wait = wait.min(due + 1);
            }
        }
        Duration::from_nanos(u64::try_from(wait.max(0)).unwrap_or(u64::MAX))
    }

    /// One evaluation, and the ones an eviction leads to at once.
    async fn evaluate(&mut self, mut wake: Wake, sense: &mut Sense) {
        loop {
            let signals = self.observer.observe();
            self.move_thresholds(&signals);
            if let Some(layout) = signals.fs_layout() {
                self.follow_layout(layout);
            }
            let observations = signals.observations();
            let now = i128::from(signals.monotonic_ns);
            let transition =
                i128::try_from(self.settings.transition_period.as_nanos()).unwrap_or(i128::MAX);
            let (next, result) = pass(
                &self.settings.thresholds,
                &self.state,
                &observations,
                now,
                transition,
            );
            self.state = next;
            self.close = self.is_close(&signals);
            self.record_metrics(&observations, &result.conditions);
            self.pressure.send_replace(Some(status::snapshot(
                &self.settings.thresholds,
                &self.state,
                &observations,
                &result.conditions,
                &mut self.transitions,
                &signals,
            )));
            // The episode ends when no threshold is met (grace periods aside) and no memory
            // signal is close; node conditions may linger for their transition period.
            if self.state.first_observed_at.is_empty() && !self.close {
                self.episode = None;
            }
            let conditions: Vec<String> = result
                .conditions
                .iter()
                .map(|c| c.name().to_string())
                .collect();
            let conditions_changed = *self.conditions.borrow() != conditions;
            if conditions_changed {
                self.conditions.send_replace(conditions.clone());
            }
            let met: Vec<String> = result
                .met
                .iter()
                .filter_map(|&i| self.settings.thresholds.get(i).map(ToString::to_string))
                .collect();
            let mut decision = Decision {
                seq: 0,
                wake: wake.clone(),
                observed_at_ns: signals.monotonic_ns,
                signals: signal_values(&signals),
                met,
                conditions,
                ranking: Vec::new(),
                action: Action::None,
                reaction_lag_ns: None,
                decide_to_kill_ns: None,
                release_ns: None,
                unprevented_ooms: self.unprevented_ooms,
            };
            let reclaim = result
                .reclaim
                .filter(|r| !self.disk_held(r.signal, signals.monotonic_ns));
            let Some(reclaim) = reclaim else {
                if !decision.met.is_empty() || conditions_changed {
                    self.emit(decision);
                }
                return;
            };
            let layout = signals.fs_layout().unwrap_or_default();
            let steps = reclaim::reclaim_steps(reclaim.signal, layout);
            if steps.any() {
                if let Some(reclaimer) = self.reclaimer.clone() {
                    let outcome = reclaimer.reclaim_steps(steps).await;
                    let again = self.observer.observe().observations();
                    // As the kubelet: every threshold, grace periods ignored and minimum
                    // reclaim enforced, must be clear for the reclaim to stand in for an
                    // eviction.
                    let resolved = thresholds_met(
                        &self.settings.thresholds,
                        0..self.settings.thresholds.len(),
                        &again,
                        true,
                    )
                    .is_empty();
                    let mut d = decision.clone();
                    d.action = match outcome {
                        Ok(r) => Action::Reclaimed {
                            freed_bytes: r.freed_bytes,
                            resolved,
                            error: None,
                        },
                        Err(e) => Action::Reclaimed {
                            freed_bytes: 0,
                            resolved,
                            error: Some(e),
                        },
                    };
                    self.emit(d);
                    if resolved {
                        return;
                    }
                }
            }
            let evicted = self
                .evict_one(&reclaim, &result.met, &signals, layout, &mut decision)
                .await;
            self.emit(decision);
            if !evicted {
                return;
            }
            if reclaim::reclaims_node_level(reclaim.signal) {
                self.disk_hold_until_ns = monotonic_ns().saturating_add(
                    u64::try_from(self.settings.housekeeping.as_nanos()).unwrap_or(u64::MAX),
                );
            }
            // Events that came in while the victim was going are folded into the next pass,
            // which runs at once (OOM kills among them are still recorded).
            let mut received = Vec::new();
            self.drain(sense, &mut received).await;
            wake = match self.take_events(received) {
                Some(w) if !w.timer => w,
                _ => Wake {
                    event: self.episode.clone(),
                    timer: true,
                    detection_lag_ns: None,
                    coalesced: 0,
                },
            };
        }
    }

    /// Whether a threshold on `signal` must wait: for one housekeeping interval after a disk
    /// eviction, disk thresholds are not acted on. The victim's space comes back only when
    /// the runtime drops its writable layer and logs, on its own time (containerd's garbage
    /// collector), so a disk signal observed at once — or on the next memory event — still
    /// looks met and the next pod would be evicted for nothing. The kubelet gets the same
    /// pause from acting only on disk statistics newer than its last decision, which it
    /// refreshes at the housekeeping interval. Memory and pids are never held.
    fn disk_held(&self, signal: Signal, now_ns: u64) -> bool {
        reclaim::reclaims_node_level(signal) && now_ns < self.disk_hold_until_ns
    }

    /// Re-derives the `containerfs` thresholds when the observed filesystem layout is not
    /// the one they were derived for (at the first observation, or when an image
    /// filesystem is mounted or unmounted). The state of the derived thresholds starts over;
    /// the configured ones keep theirs.
    fn follow_layout(&mut self, layout: FsLayout) {
        let kept = self
            .settings
            .thresholds
            .iter()
            .filter(|t| {
                !matches!(
                    t.signal,
                    Signal::ContainerFsAvailable | Signal::ContainerFsInodesFree
                )
            })
            .count();
        if !self.settings.set_layout(layout) {
            return;
        }
        tracing::info!(?layout, thresholds = ?self.settings.thresholds.iter().map(ToString::to_string).collect::<Vec<_>>(), "containerfs thresholds follow the filesystem layout");
        self.state.first_observed_at.retain(|&i, _| i < kept);
        self.state.thresholds_met.retain(|&i| i < kept);
    }

    /// Whether a memory signal is within a margin of a threshold (a quarter of its level, at
    /// least 16 MiB): then the loop re-reads every `close_poll` rather than trusting the next
    /// notification to come in time.
    fn is_close(&self, signals: &Signals) -> bool {
        let observations = signals.observations();
        self.settings.thresholds.iter().any(|t| {
            if !t.signal.is_memory() {
                return false;
            }
            let Some(obs) = observations.get(t.signal) else {
                return false;
            };
            let capacity = obs
                .capacity
                .unwrap_or(crate::decide::quantity::Quantity::ZERO);
            let level = t.level(capacity, false).value();
            let margin = (level / 4).max(16 << 20);
            obs.available.value() < level.saturating_add(margin)
        })
    }

    /// Reads each container's OOM kill counter as the starting point.
    fn baseline_oom_counts(&mut self) {
        for p in self.pods.pods().iter() {
            for c in &p.containers {
                let key = (p.info.uid.clone(), c.name.clone());
                if self.oom_counts.contains_key(&key) {
                    continue;
                }
                let n = p
                    .cgroup
                    .join(&c.cgroup)
                    .ok()
                    .and_then(|cg| self.cgroups.oom_kills(&cg).ok())
                    .unwrap_or(0);
                self.oom_counts.insert(key, n);
            }
        }
    }

    /// Records a kernel OOM kill: mapped to a pod and container by the event's cgroup, or,
    /// when the event names only a parent cgroup (memcg notification), by the containers
    /// whose kill counters moved. Counted as pressure the agent did not prevent.
    fn record_oom(&mut self, r: &Received, pid: Option<u32>, comm: Option<String>) {
        let pods = self.pods.pods();
        let mut hits: Vec<(Option<&ActivePod>, Option<String>)> = Vec::new();
        let mapped = r.event.cgroup.as_deref().and_then(oom::pod_of_cgroup);
        if let Some((uid, container)) = mapped {
            let pod = pods.iter().find(|p| p.info.uid == uid);
            // The event names the container's cgroup; records name the container.
            let named = |p: &ActivePod, dir: &str| {
                p.containers
                    .iter()
                    .find(|c| c.cgroup == dir)
                    .map_or_else(|| dir.to_string(), |c| c.name.clone())
            };
            if let (Some(p), Some(c)) = (pod, container) {
                let key = (p.info.uid.clone(), named(p, c));
                let now = p
                    .cgroup
                    .join(c)
                    .ok()
                    .and_then(|cg| self.cgroups.oom_kills(&cg).ok())
                    .unwrap_or(0);
                let known = self.oom_counts.get(&key).copied().unwrap_or(0);
                self.oom_counts.insert(key, now.max(known + 1));
            }
            let name = match (pod, container) {
                (Some(p), Some(c)) => Some(named(p, c)),
                (None, c) => c.map(str::to_string),
                (Some(_), None) => None,
            };
            hits.push((pod, name));
        } else {
            let mut seen = BTreeSet::new();
            for p in pods.iter() {
                for c in &p.containers {
                    let Some(now) = p
                        .cgroup
                        .join(&c.cgroup)
                        .ok()
                        .and_then(|cg| self.cgroups.oom_kills(&cg).ok())
                    else {
                        continue;
                    };
                    let key = (p.info.uid.clone(), c.name.clone());
                    let known = self.oom_counts.get(&key).copied().unwrap_or(0);
                    if now > known && seen.insert(key.clone()) {
                        self.oom_counts.insert(key, now);
                        hits.push((Some(p), Some(c.name.clone())));
                    }
                }
            }
        }
        // An OOM in a cgroup no pod owns (or already counted through another source) is
        // left to the log.
        if hits.is_empty() {
            tracing::debug!(cgroup = ?r.event.cgroup, "kernel OOM kill with no new pod container kill");
            return;
        }
        for (pod, container) in hits {
            self.unprevented_ooms += 1;
            let restarting = pod.map(|p| p.restart_policy.restarts(137));
            let d = Decision {
                seq: 0,
                wake: Wake {
                    event: Some(r.event.clone()),
                    timer: false,
                    detection_lag_ns: Some(r.lag_ns),
                    coalesced: 1,
                },
                observed_at_ns: monotonic_ns(),
                signals: Vec::new(),
                met: Vec::new(),
                conditions: self.conditions.borrow().clone(),
                ranking: Vec::new(),
                action: Action::OomKilled {
                    uid: pod.map(|p| p.info.uid.clone()),
                    pod: pod.map(|p| p.info.name.clone()),
                    container,
                    pid,
                    comm: comm.clone(),
                    restarting,
                    reason: "OOMKilled".to_string(),
                },
                reaction_lag_ns: None,
                decide_to_kill_ns: None,
                release_ns: None,
                unprevented_ooms: self.unprevented_ooms,
            };
            self.emit(d);
        }
    }

    /// Keeps each memcg usage threshold where the working set meets its level: the base
    /// (`capacity - level`, armed at start) plus the cgroup's inactive file pages now, as the
    /// kubelet's threshold notifier does, so the kernel's notification comes when the
    /// threshold is met rather than a page cache earlier. Every change is passed on: the
    /// eBPF slot follows it page for page (one map write), the v1 registration only by
    /// [`crate::sense::memcg::V1_MOVE_STEP_BYTES`] or more.
    fn move_thresholds(&self, signals: &Signals) {
        let settings = self.observer.settings();
        for target in self.thresholds.targets() {
            let Some(base) = target.threshold_bytes else {
                continue;
            };
            let memory = if target.cgroup == settings.node_cgroup {
                signals.memory
            } else if target.cgroup == settings.kubepods_cgroup {
                signals.allocatable_memory
            } else {
                None
            };
            let Some(m) = memory else {
                continue;
            };
            self.thresholds.set(
                target,
                crate::sense::memcg::working_set_level(base, m.inactive_file_bytes),
            );
        }
    }

    /// Puts this pass's signal values, thresholds and node conditions on the metrics.
    fn record_metrics(
        &self,
        observations: &crate::decide::pressure::Observations,
        on: &[NodeCondition],
    ) {
        let Some(m) = &self.metrics else {
            return;
        };
        for &signal in &Signal::ALL {
            let Some(o) = observations.get(signal) else {
                continue;
            };
            let capacity = o
                .capacity
                .unwrap_or(crate::decide::quantity::Quantity::ZERO);
            let level = |hard: bool| {
                self.settings
                    .thresholds
                    .iter()
                    .find(|t| t.signal == signal && (t.grace_period_nanos == 0) == hard)
                    .map(|t| t.level(capacity, false).value() as f64)
            };
            m.set_signal(
                signal,
                o.available.value() as f64,
                SignalThresholds {
                    hard: level(true),
                    soft: level(false),
                },
            );
        }
        for c in status::CONDITIONS {
            m.set_condition(c, on.contains(&c));
        }
    }

    fn emit(&mut self, mut d: Decision) {
        self.seq += 1;
        d.seq = self.seq;
        d.log();
        let _ = self.decisions.send(d);
    }
}

/// Whether an event concerns the node whose pods live below `cgroup_root`: unattributed
/// ones (PSI, ticks, drops) do, and so does anything in a cgroup at or below the root. The
/// eBPF programs see the whole machine; what happens in other cgroups is not this node's
/// pressure.
pub fn concerns_node(cgroup_root: &str, event: &PressureEvent) -> bool {
    let root = cgroup_root.trim_end_matches('/');
    match &event.cgroup {
        None => true,
        Some(_) if root.is_empty() => true,
        Some(c) => c == root || c.starts_with(&format!("{root}/")),
    }
}

fn signal_values(signals: &Signals) -> Vec<SignalValue> {
    let observations = signals.observations();
    Signal::ALL
        .iter()
        .filter_map(|&s| {
            let o = observations.get(s)?;
            let bytes = s.resource().is_bytes();
            Some(SignalValue {
                signal: s.name().to_string(),
                available: format_quantity(o.available, bytes),
                capacity: o.capacity.map(|c| format_quantity(c, bytes)),
            })
        })
        .collect()
}

/// Starts the loop on its own task: the agent's one call to bring eviction up. The task
/// gives the sense layer back when the loop ends.
pub fn spawn<P: PodControl + 'static>(
    reactor: Reactor<P>,
    sense: Sense,
    shutdown: watch::Receiver<bool>,
) -> (ReactorHandle, tokio::task::JoinHandle<Sense>) {
    let handle = reactor.handle();
    let task = tokio::spawn(reactor.run(sense, shutdown));
    (handle, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(hard: &[(&str, &str)]) -> ReactorSettings {
        let config = Config {
            eviction_hard: hard
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Config::default()
        };
        ReactorSettings::from_config(&config).unwrap()
    }

    fn names(s: &ReactorSettings) -> Vec<String> {
        s.thresholds.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn containerfs_thresholds_follow_the_observed_layout() {
        let mut s = settings(&[("nodefs.available", "1Gi"), ("imagefs.available", "2Gi")]);
        // Until the filesystems are observed: one shared filesystem, nodefs's thresholds.
        assert_eq!(s.layout, FsLayout::Shared);
        assert_eq!(
            names(&s),
            [
                "nodefs.available<1Gi",
                "imagefs.available<2Gi",
                "containerfs.available<1Gi"
            ]
        );
        // A separate image filesystem holding the writable layers: imagefs's.
        assert!(s.set_layout(FsLayout::ImageFs));
        assert_eq!(
            names(&s)[..2],
            ["nodefs.available<1Gi", "imagefs.available<2Gi"],
            "configured thresholds keep their place"
        );
        assert_eq!(names(&s)[2], "containerfs.available<2Gi");
        assert!(!s.set_layout(FsLayout::ImageFs), "no change");
        // A split image filesystem: the writable layers are back with nodefs.
        assert!(s.set_layout(FsLayout::ImageFsContainerFs));
        assert_eq!(names(&s)[2], "containerfs.available<1Gi");
        // Nothing on imagefs configured: a separate imagefs derives nothing for containerfs.
        let mut s = settings(&[("memory.available", "100Mi")]);
        let before = names(&s);
        assert!(!s.set_layout(FsLayout::ImageFs));
        assert_eq!(names(&s), before);
        assert!(
            before.iter().all(|t| !t.starts_with("containerfs")),
            "{before:?}"
        );
        assert_eq!(s.layout, FsLayout::ImageFs);
    }
}
