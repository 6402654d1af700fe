//! The reactor loop: live node-pressure eviction, driven by kernel events.
//!
//! sense → observe → decide → act → record, once per wake-up:
//!
//! 1. Wake on every [`PressureEvent`] (a storm of them is drained
//!    and becomes one evaluation), on the housekeeping tick, or on a timer of its own (a
//!    grace period or a condition's transition period running out, or a memory signal close
//!    to a threshold, which is then re-read every few milliseconds).
//! 2. Observe the signals ([`crate::observe`]) and run one eviction-manager pass with the same
//!    function `reactor plan pressure` uses ([`crate::decide::pressure::pass_with_psi`]), keeping its
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

mod close;
mod crossing;
pub mod decision;
mod dry_run;
mod evict;
mod inflight;
mod memory_reclaim;
pub(crate) mod oom;
mod outbox;
pub mod pods;
pub mod reclaim;
mod runtime_pods;
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
use crate::decide::signal::NodeCondition;
use crate::decide::signal::{FsLayout, Signal};
use crate::decide::summary::Summary;
use crate::decide::thresholds::format_quantity;
use crate::observe::{Observer, Signals};
use crate::record::metrics::{Metrics, SignalThresholds};
use crate::sense::{monotonic_ns, Kind, PressureEvent, Received, Sense};

pub use decision::SignalValue;
pub use decision::{Action, CrossingKillFigures, Decision, MemoryReclaim, Wake};
pub use pods::{ActivePod, Evicted, PodContainer, PodControl};
pub use reclaim::NodeReclaim;
pub use runtime_pods::RuntimePods;
pub use settings::{memcg_targets, ReactorSettings};
pub use status::NodePressure;

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
///
/// Its parts own their state and their rules: the evictions in flight
/// ([`inflight::Evictions`]), the crossing staging ([`crossing::Crossing`]), the close watch
/// ([`close::CloseWatch`]) and what the loop hands out ([`outbox::Outbox`]). What is left
/// here is what every pass reads and the eviction manager's own state.
pub struct Reactor<P> {
    settings: ReactorSettings,
    observer: Observer,
    pods: Arc<P>,
    cgroups: CgroupManager,
    reclaimer: Option<Arc<dyn NodeReclaim>>,
    state: EvictionState,
    figures: PodFigures,
    /// The loop thread's CPU time as this pass began to observe (for the decision's
    /// `decide_to_kill_cpu_ns`).
    pass_cpu: Option<crate::sense::ThreadCpu>,
    /// Each container's OOM kill counter as last read, by pod uid and container name.
    oom_counts: BTreeMap<(String, String), u64>,
    /// The first kernel event of the current pressure episode (since the last evaluation
    /// that found nothing met and nothing close): what a timer-woken decision answers to.
    episode: Option<PressureEvent>,
    close: close::CloseWatch,
    evictions: inflight::Evictions,
    crossing: crossing::Crossing,
    /// With `dryRun`, the would-be evictions of the open pressure episodes ([`dry_run`]).
    dry_run: crate::decide::dry_run::DryRunLedger,
    out: outbox::Outbox,
}

/// The pods' figures a pass reads, kept between passes so that their buffers are reused
/// rather than allocated on the way to a kill.
#[derive(Default)]
struct PodFigures {
    /// The pods' statistics a ranking compares.
    ranking: Summary,
    /// The victim's statistics, read for its eviction message.
    victim: Summary,
}

/// How many turns of the runtime a pass the timer started gives the drain task to hand on a
/// kernel record already in the ring buffer ([`Reactor::kernel_record_with_timer`]). A turn
/// polls the I/O driver, which is what wakes the drain task, and counts no wall time: a
/// thread starved of the CPU between turns (a loaded node, or one coming back from being
/// stopped) still gives the drain its turn, where a wait in milliseconds could run out
/// before the thread was scheduled at all. One turn is enough when nothing else is slow.
const KERNEL_RECORD_TURNS: usize = 4;

/// After [`KERNEL_RECORD_TURNS`], the longest the pass still waits for the record: only a
/// record the drain hands to its resolver (a cgroup it has not named yet, looked up on a
/// blocking thread) takes longer, and this bound is short beside the timer periods (1 ms
/// close, 100 ms kernel-watched).
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
        let transitions = status::Transitions::new(&settings.psi);
        let evictions = inflight::Evictions::new(&settings);
        Reactor {
            settings,
            observer,
            pods,
            cgroups,
            reclaimer,
            state: EvictionState::default(),
            figures: PodFigures::default(),
            pass_cpu: None,
            oom_counts: BTreeMap::new(),
            episode: None,
            close: close::CloseWatch::default(),
            evictions,
            crossing: crossing::Crossing::default(),
            dry_run: Default::default(),
            out: outbox::Outbox::new(transitions),
        }
    }

    /// Calls `tap` with every event the loop receives (ticks and other nodes' cgroups
    /// included), before the loop folds them: the agent's event counters, event stream and
    /// per-event log line hang here. It runs on the loop's task, so it must be quick.
    pub fn with_tap(mut self, tap: impl Fn(&Received) + Send + Sync + 'static) -> Reactor<P> {
        self.out.tap = Some(Box::new(tap));
        self
    }

    /// Keeps `metrics` up to date: signal values and thresholds on every pass, node
    /// conditions, evictions by signal and QoS, reaction lag by the waking event's source.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Reactor<P> {
        self.out.metrics = Some(metrics);
        self
    }

    /// The outputs, to subscribe before running.
    pub fn handle(&self) -> ReactorHandle {
        ReactorHandle {
            decisions: self.out.decisions.clone(),
            conditions: self.out.conditions.subscribe(),
            pressure: self.out.pressure.subscribe(),
        }
    }

    /// Runs until every sense source stops or `shutdown` turns `true`; hands the sense layer
    /// back (to be shut down and asked for its lag statistics).
    pub(crate) async fn run(
        mut self,
        mut sense: Sense,
        mut shutdown: watch::Receiver<bool>,
    ) -> Sense {
        self.baseline_oom_counts();
        self.check_memory_reclaim();
        self.close
            .start(sense.kernel_watch(), sense.memcg_thresholds());
        self.evictions.set_charge_switch(sense.charge_switch());
        if self.settings.kill_at_crossing && self.settings.memory_reclaim.is_some() {
            // Reclaim first means the loop decides at the crossing whether page cache can
            // stand in for a pod; a kill in the kernel would pre-empt it.
            tracing::info!("killAtCrossing is off while memoryReclaim is on: every kill is the loop's, after its reclaim");
        } else if self.settings.kill_at_crossing && self.settings.dry_run {
            // A dry run never stages a victim: the charge program's thresholds still fire
            // and wake the loop, but it kills nothing.
            tracing::info!("dry run: no victim is staged for a kill at the crossing");
        } else if self.settings.kill_at_crossing {
            self.crossing.start(
                sense.victim_stage(),
                settings::hard_memcg_targets(&self.settings, &self.observer),
                self.settings.kernel_watched_poll,
            );
        }
        let near = self.close.kernel_watch().clone();
        let staging = self.crossing.staging();
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
                Some(ended) = self.evictions.next_stop() => Woke::StopEnded(ended),
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
    /// its drain task not yet run ([`Sense::kernel_record_waiting`]). Gives the drain
    /// [`KERNEL_RECORD_TURNS`] turns of the runtime, then waits at most
    /// [`KERNEL_RECORD_WAIT`]: the pass is then the record's, with the kernel's timestamp.
    async fn kernel_record_with_timer(sense: &mut Sense) -> Option<Received> {
        if !sense.kernel_record_waiting() {
            return None;
        }
        for _ in 0..KERNEL_RECORD_TURNS {
            // A yield wakes this task again only after the runtime has polled its driver
            // and run every task that made ready, the drain among them.
            tokio::task::yield_now().await;
            if let Some(r) = poll_once(sense.next()).await {
                return r;
            }
        }
        tokio::time::timeout(KERNEL_RECORD_WAIT, sense.next())
            .await
            .ok()
            .flatten()
    }

    /// Counts a pass the timer started while a memory signal was close to a threshold.
    fn count_close_reread(&self) {
        let Some(watch) = self.close.reread_label() else {
            return;
        };
        if let Some(m) = &self.out.metrics {
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
            if let Some(tap) = &self.out.tap {
                tap(&r);
            }
            if !self.is_ours(&r.event) {
                continue;
            }
            if let Kind::OomKill { pid, comm, .. } = &r.event.kind {
                self.record_oom(&r, *pid, comm.clone());
            }
            let watched = self.observer.settings();
            self.crossing
                .note_kill(&r.event, &watched.node_cgroup, &watched.kubepods_cgroup);
            coalesced += 1;
            if decision::is_kernel_event(&r.event) && self.episode.is_none() {
                self.episode = Some(r.event.clone());
            }
            // The wake-up is the earliest kernel event of the batch (ticks only when alone).
            let better = match &wake {
                None => true,
                Some((w, _)) => {
                    let (wk, rk) = (
                        decision::is_kernel_event(w),
                        decision::is_kernel_event(&r.event),
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
        let close = self.close.recheck_every(
            self.settings.close_poll,
            self.settings.kernel_watched_poll,
            !self.dry_run.is_empty(),
        );
        if let Some(every) = close {
            wait = wait.min(i128::try_from(every.as_nanos()).unwrap_or(0));
        }
        let held = i128::from(self.evictions.disk_hold_until_ns()) - now;
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
        let attached = self.close.kernel_watch().attached();
        if let Some(every) = self
            .crossing
            .restage_every(attached, self.settings.kernel_watched_poll)
        {
            wait = wait.min(i128::try_from(every.as_nanos()).unwrap_or(0));
        }
        // A crossing left to the kernel is read again when its time is up.
        if let Some(due) = self.crossing.left_until_ns() {
            wait = wait.min((i128::from(due) - now).max(0) + 1);
        }
        if let Some(d) = self.evictions.recheck(u64::try_from(now).unwrap_or(0)) {
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
            self.close
                .move_thresholds(&signals, self.observer.settings());
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
            self.close.assess(
                &self.settings.thresholds,
                &observations,
                self.observer.settings(),
            );
            // The episode ends when no threshold is met (grace periods aside) and no memory
            // signal is close; node conditions may linger for their transition period.
            if self.state.first_observed_at.is_empty()
                && self.close.closeness() == close::Closeness::Far
            {
                self.episode = None;
            }
            // Only whether the conditions changed is asked before the act; their names, the
            // met thresholds' text and the signals' figures (tens of microseconds of
            // formatting) are written into the record after it, off the path to the SIGKILL.
            let conditions_changed = !self
                .out
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
                self.out.unprevented_ooms,
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
                self.out.conditions.send_replace(condition_names(&result));
            }
            self.record_metrics(&observations, &result.conditions);
            let mut snapshot = status::snapshot(
                &self.settings.thresholds,
                &self.state,
                &observations,
                &result.conditions,
                &mut self.out.transitions,
                &signals,
            );
            snapshot.dry_run = self.settings.dry_run;
            snapshot.would_evict = status::would_evict(self.dry_run.current(), &signals);
            self.out.pressure.send_replace(Some(snapshot));
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
                self.evictions.hold_disk(monotonic_ns().saturating_add(
                    u64::try_from(self.settings.housekeeping.as_nanos()).unwrap_or(u64::MAX),
                ));
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
        let left_since = self.crossing.take_left_since();
        // A kill the kernel made at a hard threshold's crossing is completed first, whatever
        // this pass read (`crossing`).
        if self.crossing.pending() {
            if let Some(r) = self.complete_crossing_kill(signals, &mut decision).await {
                return (Some(decision), Some(r));
            }
        }
        // With evictions in flight, only the thresholds their victims do not stand for call
        // for another (`decide::inflight`); with none, the pass's choice.
        let reclaim = if self.evictions.is_empty() {
            result.reclaim
        } else {
            let victims = self.evictions.victims();
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
        let said = self.evictions.note_covered(covered);
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
                        error: Some(e.to_string()),
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
        if matches!(decision.action, Action::NothingToEvict) {
            let ranked = decision.ranking.iter().map(|p| p.uid.clone()).collect();
            let said = self.out.nothing_to_evict_said(
                reclaim.signal.name(),
                ranked,
                signals.monotonic_ns,
                self.settings.housekeeping,
            );
            // A change of the node conditions is always recorded.
            if said && !conditions_changed {
                return (None, None);
            }
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
        reclaim::reclaims_node_level(signal) && now_ns < self.evictions.disk_hold_until_ns()
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

    /// Puts this pass's signal values, thresholds and node conditions on the metrics.
    fn record_metrics(
        &self,
        observations: &crate::decide::pressure::Observations,
        on: &[NodeCondition],
    ) {
        let Some(m) = &self.out.metrics else {
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
        for &c in self.out.transitions.listed() {
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

    fn emit(&mut self, d: Decision) {
        self.out.emit(d);
    }

    /// Reads every victim in flight ([`inflight::Evictions::track`]) and emits the second
    /// records that are due.
    fn track(&mut self, now_ns: u64) {
        let mut looks = inflight::NodeLooks {
            cgroups: &self.cgroups,
            observer: &mut self.observer,
        };
        for r in self.evictions.track(now_ns, &mut looks) {
            let action = Action::Released {
                uid: r.uid,
                pod: r.pod,
                released: r.released,
                pending_bytes: r.pending_bytes,
                error: r.error,
            };
            let mut d = self.out.record(Wake::timer(None), monotonic_ns(), action);
            d.release_ns = r.release_ns;
            self.emit(d);
        }
    }

    /// Takes in the end of a stop, and looks at the victims.
    fn stop_ended(&mut self, ended: inflight::StopEnded) {
        let now = monotonic_ns();
        self.evictions.stop_ended(ended, now);
        self.track(now);
    }

    /// The kubelet's way (`serialEvictions`): waits for every eviction in flight to end and
    /// its memory to come back (bounded by `release_wait` after the stop) before the next
    /// pass.
    async fn wait_serially(&mut self) {
        loop {
            let now = monotonic_ns();
            self.track(now);
            if !self.evictions.waiting_serially(now) {
                return;
            }
            let ended = tokio::select! {
                Some(ended) = self.evictions.next_stop() => Some(ended),
                () = tokio::time::sleep(self.settings.close_poll) => None,
            };
            if let Some(ended) = ended {
                self.stop_ended(ended);
            }
        }
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
