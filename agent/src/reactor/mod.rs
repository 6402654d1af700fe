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
//!    node-level reclaim, as in the kubelet, unless `memoryReclaim.enabled` (cgroup v2):
//!    then page cache is reclaimed from kubepods first, bounded, when its active file pages
//!    can cover the shortfall ([`crate::decide::memory_reclaim`]). The `containerfs` thresholds follow the
//!    layout too.
//! 4. Complete first an eviction the kernel began at a hard threshold's crossing: with
//!    `killAtCrossing`, the loop stages the pod it would evict first while a watched cgroup
//!    is near its level, and the eBPF charge program kills that pod's process at the crossing
//!    when it is the one charging (`reactor::crossing`). Otherwise,
//!    evict one pod, the first non-critical one in [`crate::decide::rank::rank`]'s order, with
//!    grace 0 for a hard threshold and the capped pod grace for a soft one; the pod ends
//!    `Failed`/`Evicted` with the kubelet's message. The eviction is started, not awaited:
//!    the kill (grace 0) is made on the loop's task, the runtime's stop runs on its own, and
//!    the victim stays in the loop's state until it is gone (`reactor::inflight`). Every pass goes
//!    on deciding meanwhile, by [`crate::decide::inflight`]: victims dying count as memory
//!    already freed, a hard threshold never waits behind a graceful eviction (the victim's
//!    stop becomes a SIGKILL if it ranks first, else the first pod goes at grace 0), and a
//!    victim not gone past its bound counts for nothing. After a disk eviction disk
//!    thresholds wait one housekeeping interval (the runtime frees the victim's writable
//!    layer on its own time). `serial_evictions` keeps the kubelet's way: wait for each
//!    victim before the next pass.
//! 5. Record: one [`Decision`] on a broadcast channel and one log line per decision (an
//!    eviction makes two: at the kill, and when its memory is back or at its bound); kernel
//!    OOM kills are mapped to their pod and container and recorded as `OOMKilled`.
//!
//! The loop owns its state (one task); pods are reached through [`PodControl`]. It owns the
//! [`Sense`] too while it runs — every event passes through it first — so whoever else wants
//! the raw events (metrics, the API's event stream, the per-event log line) registers a tap
//! ([`Reactor::with_tap`]) instead of reading the sense layer beside it; [`Reactor::run`]
//! hands the sense layer back when it ends, for its lag statistics.

mod crossing;
mod dry_run;
mod evict;
mod inflight;
mod memory_reclaim;
pub mod oom;
pub mod pods;
pub mod reclaim;
pub mod record;
mod settings;
pub mod status;
pub mod thread;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{broadcast, watch};

use crate::act::cgroups::CgroupManager;
use crate::decide::inflight::uncovered;
use crate::decide::pressure::{
    pass_with_psi, pick_reclaim, reclaim_of, thresholds_met, EvictionState, Observations,
    PassResult, Reclaim,
};
use crate::decide::quantity::Quantity;
use crate::decide::signal::NodeCondition;
use crate::decide::signal::{FsLayout, Signal};
use crate::decide::summary::Summary;
use crate::decide::thresholds::{format_quantity, Threshold};
use crate::observe::{Observer, Signals};
use crate::record::metrics::{Metrics, SignalThresholds};
use crate::sense::ebpf::charge_switch::ChargeSwitch;
use crate::sense::ebpf::kernel_watch::KernelWatch;
use crate::sense::memcg::MemcgThresholds;
use crate::sense::{monotonic_ns, Kind, PressureEvent, Received, Sense};

pub use pods::{
    ActivePod, EvictError, Evicted, EvictionStatus, PodContainer, PodControl, RuntimePods,
};
pub use reclaim::{reclaim_steps, NodeReclaim, NodeReclaimed, ReclaimSteps};
pub use record::{
    Action, CrossingKillFigures, Decision, MemoryReclaim, RankedPod, SignalValue, Wake,
};
pub use settings::{memcg_targets, ReactorSettings};
pub use status::{ConditionState, NodePressure, SignalState, ThresholdState};

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
    /// The loop thread's CPU time as this pass began to observe (for the decision's
    /// `decide_to_kill_cpu_ns`).
    pass_cpu: Option<crate::sense::ThreadCpu>,
    unprevented_ooms: u64,
    oom_counts: BTreeMap<(String, String), u64>,
    /// The first kernel event of the current pressure episode (since the last evaluation
    /// that found nothing met and nothing close): what a timer-woken decision answers to.
    episode: Option<PressureEvent>,
    close: CloseWatch,
    /// Which watched cgroups the kernel checks at their working-set level now.
    kernel_watch: KernelWatch,
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
    /// The evictions in flight (see [`inflight`]).
    in_flight: Vec<inflight::InFlight>,
    /// How many victims in flight hold the charge programs off.
    charge_holds: usize,
    /// When [`Reactor::track`] last read the victims in flight: the rules judge them as of
    /// then ([`Reactor::victims`]), so a victim counts as past its bound only once `track`
    /// has seen it so and its record is out, never first in a decision read a moment later.
    tracked_ns: u64,
    /// Whether the last pass found its thresholds covered by the victims in flight (and
    /// recorded it): the passes after it that find the same are not recorded again.
    covered_said: bool,
    /// The victim staged for a kill at the crossing, and a kill the kernel made there for
    /// the next pass to complete ([`crossing`]).
    crossing: crossing::Crossing,
    /// Where stop tasks report their end, and where the loop takes it.
    stop_tx: tokio::sync::mpsc::UnboundedSender<inflight::StopEnded>,
    stop_rx: tokio::sync::mpsc::UnboundedReceiver<inflight::StopEnded>,
    /// With `dryRun`, the would-be evictions of the open pressure episodes ([`dry_run`]).
    dry_run: crate::decide::dry_run::DryRunLedger,
}

/// How closely the loop re-reads the memory signals between events ([`Reactor::close_watch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CloseWatch {
    /// No memory signal is close to a threshold: the housekeeping interval.
    Far,
    /// Close only to thresholds the kernel checks at their working-set level itself:
    /// `kernel_watched_poll`, a net under the kernel's record.
    KernelWatched,
    /// Close to a threshold nothing in the kernel watches at its crossing: `close_poll`.
    Close,
}

/// How far above a threshold's working-set level a kernel slot may sit and still count as
/// watching it: the charge program checks every page near an armed level (every 16 pages per
/// CPU farther away), and a slot's level is rounded up to a page.
const KERNEL_WATCH_SLACK_BYTES: u64 = 64 << 10;

/// The longest a pass the timer started waits for a kernel record already in the ring
/// buffer ([`Reactor::kernel_record_with_timer`]): one turn of the runtime is enough (the
/// drain task is ready), so this bound only matters if the drain task is stuck, and it is
/// short beside the timer periods (1 ms close, 100 ms kernel-watched).
const KERNEL_RECORD_WAIT: Duration = Duration::from_millis(2);

/// What woke the loop.
enum Woke {
    /// A sense event, or the re-check timer (`None`).
    Sense(Option<Received>),
    /// An eviction's stop ended.
    StopEnded(inflight::StopEnded),
    /// The running pods changed.
    Pods,
    /// The eBPF charge programs came on: a watched cgroup is near its level.
    Near,
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
        let (stop_tx, stop_rx) = inflight::stop_channel();
        let transitions = status::Transitions::new(&settings.psi);
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
            transitions,
            seq: 0,
            pass_cpu: None,
            unprevented_ooms: 0,
            oom_counts: BTreeMap::new(),
            episode: None,
            close: CloseWatch::Far,
            kernel_watch: KernelWatch::default(),
            tap: None,
            metrics: None,
            thresholds: MemcgThresholds::default(),
            charge_switch: None,
            disk_hold_until_ns: 0,
            in_flight: Vec::new(),
            charge_holds: 0,
            tracked_ns: 0,
            covered_said: false,
            crossing: crossing::Crossing::default(),
            stop_tx,
            stop_rx,
            dry_run: Default::default(),
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
        self.check_memory_reclaim();
        self.thresholds = sense.memcg_thresholds();
        self.charge_switch = sense.charge_switch();
        self.kernel_watch = sense.kernel_watch();
        if self.settings.kill_at_crossing && self.settings.memory_reclaim.is_some() {
            // Reclaim first means the loop decides at the crossing whether page cache can
            // stand in for a pod; a kill in the kernel would pre-empt it.
            tracing::info!("killAtCrossing is off while memoryReclaim is on: every kill is the loop's, after its reclaim");
        } else if self.settings.kill_at_crossing && self.settings.dry_run {
            // A dry run never stages a victim: the charge program's thresholds still fire
            // and wake the loop, but it kills nothing.
            tracing::info!("dry run: no victim is staged for a kill at the crossing");
        } else if self.settings.kill_at_crossing {
            self.crossing.stage = sense.victim_stage();
            self.crossing.hard = settings::hard_memcg_targets(&self.settings, &self.observer);
        }
        let near = self.kernel_watch.clone();
        let staging = self.crossing.stage.is_some();
        let mut pods_changed = self.pods.changes();
        self.warm_pods();
        // The first pass runs at once, as the kubelet's eviction manager synchronizes as soon
        // as it starts: a node already under pressure is acted on without waiting for an
        // event or a tick, and each memcg threshold is moved to where the working set meets
        // its level (the page cache counted) before the first crossing can come. Until then
        // a threshold stands at its base and would fire a page cache early.
        self.evaluate(Wake::timer(None), &mut sense).await;
        loop {
            if *shutdown.borrow() {
                return sense;
            }
            let sleep = self.next_recheck();
            // Shutdown comes first: the loop ends at once whatever is in flight; the stops
            // under way are the pod manager's, written ahead, and a restarted agent
            // finishes them.
            let woke = tokio::select! {
                biased;
                _ = shutdown.changed() => return sense,
                r = sense.next() => match r {
                    Some(r) => Woke::Sense(Some(r)),
                    None => return sense,
                },
                Some(ended) = self.stop_rx.recv() => Woke::StopEnded(ended),
                () = tokio::time::sleep(sleep) => Woke::Sense(None),
                Some(()) = next_change(&mut pods_changed) => Woke::Pods,
                () = near.came_on(), if staging => Woke::Near,
            };
            let (first, timed) = match woke {
                Woke::Sense(None) => {
                    self.count_close_reread();
                    (Self::kernel_record_with_timer(&mut sense).await, true)
                }
                Woke::Sense(first) => (first, false),
                Woke::StopEnded(ended) => {
                    self.stop_ended(ended);
                    continue;
                }
                Woke::Pods => {
                    self.warm_pods();
                    self.stage_victim();
                    continue;
                }
                Woke::Near => {
                    self.stage_victim();
                    continue;
                }
            };
            let mut received: Vec<Received> = first.into_iter().collect();
            self.drain(&mut sense, &mut received).await;
            // The timer's pass runs even when the record it waited for is another node's.
            let wake = match self.take_events(received) {
                Some(wake) => wake,
                None if timed => Wake::timer(self.episode.clone()),
                None => continue,
            };
            self.evaluate(wake, &mut sense).await;
        }
    }

    /// A kernel record that was due with the timer: when the thread comes back from being
    /// held off the CPU past the timer's period, the record may still be in the ring buffer,
    /// its drain task not yet run ([`Sense::kernel_record_waiting`]). Waits for it at most
    /// [`KERNEL_RECORD_WAIT`]: the pass is then the record's, with the kernel's timestamp.
    async fn kernel_record_with_timer(sense: &mut Sense) -> Option<Received> {
        if !sense.kernel_record_waiting() {
            return None;
        }
        tokio::time::timeout(KERNEL_RECORD_WAIT, sense.next())
            .await
            .ok()
            .flatten()
    }

    /// Counts a pass the timer started while a memory signal was close to a threshold.
    fn count_close_reread(&self) {
        let watch = match self.close {
            CloseWatch::Far => return,
            CloseWatch::KernelWatched => "kernel_watched",
            CloseWatch::Close => "close",
        };
        if let Some(m) = &self.metrics {
            m.count_close_reread(watch);
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
            return Some(Wake::timer(self.episode.clone()));
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
            self.note_crossing_kill(&r.event);
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
        let close = match self.close {
            CloseWatch::Far => None,
            CloseWatch::KernelWatched => Some(self.settings.kernel_watched_poll),
            // A dry run with an episode open re-reads no faster than the kernel-watched net
            // (`dry_run`).
            CloseWatch::Close if !self.dry_run.is_empty() => Some(
                self.settings
                    .close_poll
                    .max(self.settings.kernel_watched_poll),
            ),
            CloseWatch::Close => Some(self.settings.close_poll),
        };
        if let Some(every) = close {
            wait = wait.min(i128::try_from(every.as_nanos()).unwrap_or(0));
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
        // The victim staged for a kill at the crossing is re-ranked at least this often
        // while the charge programs are on.
        if self.crossing.stage.is_some() && self.kernel_watch.attached() {
            let every = self.settings.kernel_watched_poll;
            wait = wait.min(i128::try_from(every.as_nanos()).unwrap_or(0));
        }
        // A crossing left to the kernel is read again when its time is up.
        if let Some(due) = self.crossing.left_until_ns() {
            wait = wait.min((i128::from(due) - now).max(0) + 1);
        }
        if let Some(d) = self.in_flight_recheck(u64::try_from(now).unwrap_or(0)) {
            wait = wait.min(i128::try_from(d.as_nanos()).unwrap_or(0));
        }
        Duration::from_nanos(u64::try_from(wait.max(0)).unwrap_or(u64::MAX))
    }

    /// One evaluation, and the ones an eviction leads to at once.
    async fn evaluate(&mut self, mut wake: Wake, sense: &mut Sense) {
        loop {
            self.pass_cpu = Some(crate::sense::ThreadCpu::now());
            // The victims in flight are read before the node is: a victim seen released
            // after the node's figures were read would no longer stand for memory those
            // figures still counted, and a second pod would be evicted for it (seen in the
            // v2 guest: the hog's release read between the observation and the act, and the
            // reader evicted for the hog's 160 MiB). Read first, a victim not yet released
            // stands for what it still holds, which the figures read after it can only
            // overstate.
            self.track(monotonic_ns());
            let signals = self.observer.observe();
            self.move_thresholds(&signals);
            if let Some(layout) = signals.fs_layout() {
                self.follow_layout(layout);
            }
            let observations = signals.observations();
            let now = i128::from(signals.monotonic_ns);
            let transition =
                i128::try_from(self.settings.transition_period.as_nanos()).unwrap_or(i128::MAX);
            let (next, result) = pass_with_psi(
                &self.settings.thresholds,
                &self.settings.psi,
                &self.state,
                &observations,
                now,
                transition,
            );
            self.state = next;
            self.end_dry_run_episodes(&result.met);
            self.close = self.close_watch(&signals);
            // The episode ends when no threshold is met (grace periods aside) and no memory
            // signal is close; node conditions may linger for their transition period.
            if self.state.first_observed_at.is_empty() && self.close == CloseWatch::Far {
                self.episode = None;
            }
            // Only whether the conditions changed is asked before the act; their names, the
            // met thresholds' text and the signals' figures (tens of microseconds of
            // formatting) are written into the record after it, off the path to the SIGKILL.
            let conditions_changed = !self
                .conditions
                .borrow()
                .iter()
                .map(String::as_str)
                .eq(result.conditions.iter().map(|c| c.name()));
            let mut decision = Decision::new(
                wake.clone(),
                signals.monotonic_ns,
                Vec::new(),
                Action::None,
                self.unprevented_ooms,
            );
            decision.dry_run = self.settings.dry_run;
            // The act first; the metrics and the status snapshot of this pass after it, off
            // the path from the kernel's event to the SIGKILL, and before its decision is
            // emitted (a reader of the decision finds the status that goes with it).
            let (decided, acted) = self
                .act(
                    &result,
                    &observations,
                    &signals,
                    decision,
                    conditions_changed,
                )
                .await;
            if conditions_changed {
                self.conditions.send_replace(condition_names(&result));
            }
            self.record_metrics(&observations, &result.conditions);
            let mut snapshot = status::snapshot(
                &self.settings.thresholds,
                &self.state,
                &observations,
                &result.conditions,
                &mut self.transitions,
                &signals,
            );
            snapshot.dry_run = self.settings.dry_run;
            snapshot.would_evict = status::would_evict(self.dry_run.current(), &signals);
            self.pressure.send_replace(Some(snapshot));
            if let Some(mut d) = decided {
                self.describe(&mut d, &result, &signals);
                self.emit(d);
            }
            let Some(reclaim) = acted else {
                self.stage_victim();
                return;
            };
            if self.settings.serial_evictions {
                self.wait_serially().await;
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
                _ => Wake::timer(self.episode.clone()),
            };
        }
    }

    /// The pass's act: the reclaim or eviction its met thresholds call for. Returns the
    /// pass's decision for the caller to emit, if it is to be recorded (a reclaim's own
    /// decision before an eviction is emitted here), and the reclaim an eviction was made
    /// for (the loop then looks again at once), `None` when nothing was evicted.
    async fn act(
        &mut self,
        result: &PassResult,
        observations: &Observations,
        signals: &Signals,
        mut decision: Decision,
        conditions_changed: bool,
    ) -> (Option<Decision>, Option<Reclaim>) {
        // A crossing earlier passes left to the kernel stays left only while this pass
        // leaves it too.
        let left_since = self.crossing.left_since_ns.take();
        // A kill the kernel made at a hard threshold's crossing is completed first, whatever
        // this pass read (`crossing`).
        if self.crossing.pending() {
            if let Some(r) = self.complete_crossing_kill(signals, &mut decision).await {
                return (Some(decision), Some(r));
            }
        }
        // With evictions in flight, only the thresholds their victims do not stand for call
        // for another (`decide::inflight`); with none, the pass's choice.
        let reclaim = if self.in_flight.is_empty() {
            result.reclaim
        } else {
            let victims = self.victims();
            let open = uncovered(
                &self.settings.thresholds,
                &result.met,
                observations,
                &victims,
            );
            pick_reclaim(&self.settings.thresholds, &open)
                .and_then(|i| reclaim_of(&self.settings.thresholds, i, observations))
        };
        // A pass whose thresholds the victims in flight stand for is recorded once, not on
        // every re-read while they go.
        let covered = result.reclaim.is_some() && reclaim.is_none();
        let said = std::mem::replace(&mut self.covered_said, covered);
        let reclaim = reclaim.filter(|r| !self.disk_held(r.signal, signals.monotonic_ns));
        // A hard memory crossing the kernel is about to check at its level, with the victim
        // staged, is left to it for a moment (`crossing`); recorded only with the conditions.
        let left = reclaim
            .as_ref()
            .is_some_and(|r| self.leaves_to_kernel(r, observations, left_since));
        let Some(reclaim) = reclaim.filter(|_| !left) else {
            let repeat = covered && said;
            let record = (!result.met.is_empty() && !repeat && !left) || conditions_changed;
            return (record.then_some(decision), None);
        };
        // memoryReclaim (issue 24, opt-in, v2): page cache first, bounded; see
        // `memory_reclaim`. Resolved: nothing to evict. Otherwise the record rides on the
        // eviction decision below.
        let episode_open = self.dry_run_episode_open(reclaim.threshold);
        let memory_reclaim = (!episode_open)
            .then(|| self.reclaim_memory_first(&reclaim, signals))
            .flatten();
        if let Some(m) = memory_reclaim {
            let resolved = m.outcome == "resolved";
            decision.memory_reclaim = Some(m);
            if resolved {
                decision.action = Action::Reclaimed {
                    freed_bytes: decision
                        .memory_reclaim
                        .as_ref()
                        .map_or(0, |m| m.freed_bytes),
                    resolved: true,
                    error: None,
                };
                return (Some(decision), None);
            }
        }
        let layout = signals.fs_layout().unwrap_or_default();
        let steps = reclaim::reclaim_steps(reclaim.signal, layout);
        if steps.any() && !episode_open {
            if let Some(reclaimer) = self.reclaimer.clone() {
                let outcome = reclaimer.reclaim_steps(steps).await;
                let again = self.observer.observe().observations();
                // As the kubelet: every threshold, grace periods ignored and minimum reclaim
                // enforced, must be clear for the reclaim to stand in for an eviction.
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
                if resolved {
                    return (Some(d), None);
                }
                self.describe(&mut d, result, signals);
                self.emit(d);
            }
        }
        let evicted = self
            .evict_one(&reclaim, &result.met, signals, layout, &mut decision, None)
            .await;
        if self.settings.dry_run {
            return (
                self.dry_run_record(&reclaim, decision, conditions_changed),
                None,
            );
        }
        (Some(decision), evicted.then_some(reclaim))
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

    /// How closely to re-read the memory signals: a memory signal is close when it is within
    /// a margin of a threshold (a quarter of its level, at least 16 MiB). Close to a
    /// threshold the kernel checks at its working-set level itself (an armed eBPF slot that
    /// follows the page cache, [`KernelWatch`]), the kernel's record wakes the loop at the
    /// crossing and re-reading every `close_poll` would only race it; close to any other,
    /// the loop re-reads every `close_poll` rather than trusting the next notification to
    /// come in time.
    fn close_watch(&self, signals: &Signals) -> CloseWatch {
        let observations = signals.observations();
        let mut watch = CloseWatch::Far;
        for t in &self.settings.thresholds {
            if !matches!(
                t.signal,
                Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable
            ) {
                continue;
            }
            let Some(obs) = observations.get(t.signal) else {
                continue;
            };
            let capacity = obs
                .capacity
                .unwrap_or(crate::decide::quantity::Quantity::ZERO);
            let level = t.level(capacity, false).value();
            let margin = (level / 4).max(16 << 20);
            if obs.available.value() >= level.saturating_add(margin) {
                continue;
            }
            if self.kernel_watches(t, capacity) {
                watch = CloseWatch::KernelWatched;
            } else {
                return CloseWatch::Close;
            }
        }
        watch
    }

    /// Whether the kernel checks memory threshold `t` itself (an armed eBPF slot following
    /// the page cache on its cgroup, at or below the working set where it is met:
    /// `capacity - level`).
    fn kernel_watches(&self, t: &Threshold, capacity: Quantity) -> bool {
        let settings = self.observer.settings();
        let cgroup = match t.signal {
            Signal::MemoryAvailable => &settings.node_cgroup,
            Signal::AllocatableMemoryAvailable => &settings.kubepods_cgroup,
            _ => return false,
        };
        let level = t.level(capacity, false).value();
        let working_set = u64::try_from(capacity.value().saturating_sub(level)).unwrap_or(0);
        self.kernel_watch
            .watches(cgroup, working_set, KERNEL_WATCH_SLACK_BYTES)
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
                crate::sense::memcg::Level::working_set(base, m.inactive_file_bytes),
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
        for &c in self.transitions.listed() {
            m.set_condition(c, on.contains(&c));
        }
    }

    /// Writes a pass's figures into its record: the met thresholds, the conditions and
    /// every signal's value. Called after the act, just before the record is emitted.
    fn describe(&self, d: &mut Decision, result: &PassResult, signals: &Signals) {
        d.met = result
            .met
            .iter()
            .filter_map(|&i| self.settings.thresholds.get(i).map(ToString::to_string))
            .collect();
        d.conditions = condition_names(result);
        d.signals = signal_values(signals);
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

fn condition_names(result: &PassResult) -> Vec<String> {
    result
        .conditions
        .iter()
        .map(|c| c.name().to_string())
        .collect()
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
