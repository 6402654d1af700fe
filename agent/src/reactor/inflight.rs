//! Evictions in flight: the loop starts an eviction and keeps going (issue 23).
//!
//! The runtime's stop (a grace period, then SIGKILL, then the pod cgroup removed) runs on a
//! task of its own ([`Reactor::launch`]) that reports back when it ends; the loop never
//! awaits it. Until the victim is gone it is part of the loop's state ([`InFlight`]): every
//! pass reads what memory it still holds, and the rules of [`crate::decide::inflight`] say
//! which met thresholds it stands for. Each eviction makes two records: one at the kill (or,
//! for a grace period, when the stop starts), made by `evict_one`, and one here when the
//! victim's memory is back — with the release time — or, at the bound, with what it still
//! holds.
//!
//! The eBPF charge programs come off their tracepoint while a victim killed at grace 0 is
//! torn down (every page it gives back would otherwise fire them twice, see
//! [`crate::sense::ebpf::charge_switch::ChargeSwitch`]); [`Reactor::hold_charges`] is the one
//! place that pauses and resumes them, and they are back once every such victim is released
//! or past its bound — never held for a victim that will not die.

use std::time::Duration;

use tokio::sync::mpsc;

use super::pods::{ActivePod, Evicted, EvictionStatus, PodControl};
use super::record::{Action, Decision, Wake};
use super::Reactor;
use crate::decide::inflight::Victim;
use crate::decide::signal::{Resource, Signal};
use crate::observe::cgroupfs::anon_slack_bytes;
use crate::sense::monotonic_ns;

/// One eviction in flight.
pub(super) struct InFlight {
    /// The victim as it was ranked (its cgroup, to watch it empty and to escalate).
    pub(super) pod: ActivePod,
    /// The signal it was evicted for.
    pub(super) signal: Signal,
    /// The grace period it was given.
    pub(super) grace: Duration,
    /// Its eviction message (the pod's status message), for an escalation's record.
    pub(super) message: String,
    /// `CLOCK_MONOTONIC` ns when the eviction started.
    pub(super) started_ns: u64,
    /// When its processes got SIGKILL: at once for grace 0 or an escalation, when the stop
    /// reports it for a grace period; `None` before.
    pub(super) killed_at_ns: Option<u64>,
    /// Its memory usage at the decision, bytes: the most it is counted for.
    pub(super) expected_bytes: u64,
    /// Its memory usage as last read (capped by `expected_bytes`), bytes.
    pub(super) pending_bytes: u64,
    /// Whether the charge programs are held off for it.
    pub(super) holds_charges: bool,
    /// The runtime's stop's end: what it killed, or why it failed.
    pub(super) stop: Option<Result<Evicted, String>>,
    /// `CLOCK_MONOTONIC` ns when the stop ended.
    pub(super) stop_ended_ns: Option<u64>,
    /// Whether its memory is back: its pod cgroup gone, or empty with its usage no longer
    /// falling ([`memory_back`]).
    pub(super) released: bool,
    /// Its pod cgroup's memory usage at the last look (memory victims), bytes.
    pub(super) last_usage_bytes: Option<u64>,
    /// When it last gave memory back: its bound runs from then or its kill deadline.
    pub(super) progress: Progress,
    /// Its pod cgroup's path as the observer names it, for those looks (made once).
    pub(super) usage_path: String,
    /// Whether its second record (released, or still pending at the bound) was made.
    pub(super) reported: bool,
}

impl InFlight {
    /// When it should be dead: its kill, or the end of its grace period.
    fn kill_deadline_ns(&self) -> u64 {
        self.killed_at_ns
            .unwrap_or_else(|| self.started_ns.saturating_add(nanos(self.grace)))
    }

    /// When it is past its bound if not released by then ([`Progress::bound_ns`]).
    fn bound_ns(&self, bound: Duration) -> u64 {
        self.progress.bound_ns(self.kill_deadline_ns(), bound)
    }

    /// Whether it is not released and past its bound, or was found so before (reported):
    /// once the next pod has been evicted for it, it stays counted for nothing until it is
    /// gone.
    pub(super) fn stuck(&self, now_ns: u64, bound: Duration) -> bool {
        !self.released && (self.reported || now_ns >= self.bound_ns(bound))
    }

    /// Whether it is in its grace period: SIGTERM sent, no SIGKILL yet.
    pub(super) fn graceful(&self) -> bool {
        self.killed_at_ns.is_none() && !self.released && self.stop.is_none()
    }

    /// Whether it is gone: the stop ended and its cgroup emptied.
    fn gone(&self) -> bool {
        self.released && self.stop.is_some()
    }
}

/// The end of a stop, sent back by its task.
pub(super) struct StopEnded {
    uid: String,
    result: Result<Evicted, String>,
}

/// The channel stop tasks report on.
pub(super) fn stop_channel() -> (
    mpsc::UnboundedSender<StopEnded>,
    mpsc::UnboundedReceiver<StopEnded>,
) {
    mpsc::unbounded_channel()
}

impl<P: PodControl + 'static> Reactor<P> {
    /// Starts the runtime's stop of `uid` on a task of its own (`killed`: the kill made
    /// already, for grace 0); its end comes back on the stop channel.
    pub(super) fn launch(
        &self,
        uid: String,
        grace: Duration,
        status: EvictionStatus,
        killed: Option<Evicted>,
    ) {
        let pods = std::sync::Arc::clone(&self.pods);
        let tx = self.stop_tx.clone();
        tokio::spawn(async move {
            let result = pods
                .evict(&uid, grace, status, killed)
                .await
                .map_err(|e| e.to_string());
            let _ = tx.send(StopEnded { uid, result });
        });
    }

    /// Takes in the end of a stop.
    pub(super) fn stop_ended(&mut self, ended: StopEnded) {
        let now = monotonic_ns();
        if let Some(f) = self
            .in_flight
            .iter_mut()
            .find(|f| f.pod.info.uid == ended.uid)
        {
            if f.killed_at_ns.is_none() {
                f.killed_at_ns = ended.result.as_ref().ok().and_then(|e| e.killed_at_ns);
            }
            if let Err(e) = &ended.result {
                tracing::warn!(pod = %f.pod.info.name, uid = %ended.uid, error = %e, "eviction: the runtime's stop failed");
            }
            f.stop = Some(ended.result);
            f.stop_ended_ns = Some(now);
        }
        self.track(now);
    }

    /// The victims in flight as the rules see them, as of the last [`Reactor::track`]: a
    /// victim whose bound passed since counts as stuck only once the next `track` has
    /// recorded it (seen in CI: the decision that evicted the next pod for a frozen victim
    /// came a millisecond before the record saying the victim was not gone).
    pub(super) fn victims(&self) -> Vec<Victim> {
        self.in_flight
            .iter()
            .map(|f| Victim {
                resource: f.signal.resource(),
                killed: f.killed_at_ns.is_some(),
                stuck: f.stuck(self.tracked_ns, self.settings.victim_bound),
                pending_bytes: if f.released { 0 } else { f.pending_bytes },
            })
            .collect()
    }

    /// Reads every victim in flight: released (its cgroup empty or gone), what memory it
    /// still holds, past its bound; makes each one's second record when it is due, gives
    /// the charge programs back when no victim needs them off, and forgets the victims that
    /// are gone.
    pub(super) fn track(&mut self, now_ns: u64) {
        self.tracked_ns = now_ns;
        let bound = self.settings.victim_bound;
        let mut records = Vec::new();
        for f in &mut self.in_flight {
            if !f.released {
                let cg = &f.pod.cgroup;
                let gone = !self.cgroups.exists(cg);
                let empty = gone || self.cgroups.is_empty(cg).unwrap_or(false);
                let usage = if gone || f.signal.resource() != Resource::Memory {
                    None
                } else {
                    // The pod's usage counter the observer keeps open (`warm_pods`): one
                    // `pread` per look, no path walk and no `memory.stat`.
                    self.observer
                        .pod_memory_usages([f.usage_path.as_str()])
                        .pop()
                        .flatten()
                };
                // An empty cgroup still holding anonymous memory is a victim whose address
                // space is still being freed, whether or not its usage fell since the last
                // look; read only then (one `memory.stat`).
                let anon = match usage {
                    Some(u) if empty && !gone && u >= STILL_FALLING_BYTES => {
                        self.observer.pod_anon(&f.usage_path)
                    }
                    _ => None,
                };
                f.released = empty && memory_back(f.last_usage_bytes, usage, anon);
                f.last_usage_bytes = usage;
                f.progress.look(usage, now_ns);
                f.pending_bytes = if f.released {
                    0
                } else {
                    usage.unwrap_or(0).min(f.expected_bytes)
                };
            }
            let stuck = f.stuck(now_ns, bound);
            if f.reported || !(f.released || stuck) {
                continue;
            }
            f.reported = true;
            records.push(Released {
                uid: f.pod.info.uid.clone(),
                pod: f.pod.info.name.clone(),
                released: f.released,
                release_ns: f
                    .killed_at_ns
                    .filter(|_| f.released)
                    .map(|k| now_ns.saturating_sub(k)),
                pending_bytes: (!f.released).then_some(f.pending_bytes),
                error: f.stop.as_ref().and_then(|s| s.as_ref().err().cloned()),
            });
        }
        for r in records {
            if !r.released {
                tracing::warn!(pod = %r.pod, uid = %r.uid, pending_bytes = r.pending_bytes, bound = ?bound, "eviction: the victim is not gone past its bound; its memory no longer counts as coming back and the next pod is evicted if a threshold is still met");
            }
            self.emit_released(r);
        }
        // Charge programs: held off only while a victim killed at grace 0 is being torn
        // down, never past its release or its bound.
        let mut give_back = false;
        for f in &mut self.in_flight {
            if f.holds_charges && (f.released || f.stuck(now_ns, bound)) {
                f.holds_charges = false;
                give_back = true;
            }
        }
        if give_back {
            self.hold_charges(false);
        }
        // A victim that will not die stays in flight (counted for nothing) until it is gone.
        self.in_flight.retain(|f| !f.gone());
    }

    /// The one place the charge programs are paused and resumed: `on` for a victim killed
    /// at grace 0 now (paused with the first such victim), `false` when one no longer needs
    /// them off (resumed when none does).
    pub(super) fn hold_charges(&mut self, on: bool) {
        let Some(switch) = &self.charge_switch else {
            return;
        };
        if on {
            self.charge_holds += 1;
            if self.charge_holds == 1 {
                switch.pause();
            }
            return;
        }
        self.charge_holds = self.charge_holds.saturating_sub(1);
        if self.charge_holds == 0 {
            if let Err(e) = switch.resume() {
                tracing::warn!(error = %e, "eBPF: charge programs not back after the eviction");
            }
        }
    }

    /// How soon the victims in flight must be looked at again: every `close_poll` while a
    /// killed victim is before its bound (its release is timed by it), every 50 ms
    /// otherwise (a graceful victim, or one past its bound), and at the bound.
    pub(super) fn in_flight_recheck(&self, now_ns: u64) -> Option<Duration> {
        let bound = self.settings.victim_bound;
        self.in_flight
            .iter()
            .filter(|f| !f.released || f.stop.is_none())
            .map(|f| {
                if f.released {
                    // Waiting for the stop's report only: it comes on the channel.
                    return self.settings.housekeeping;
                }
                let due = f.bound_ns(bound).saturating_sub(now_ns);
                let poll = if f.killed_at_ns.is_some() && !f.stuck(now_ns, bound) {
                    self.settings.close_poll
                } else {
                    Duration::from_millis(50)
                };
                if due > 0 {
                    poll.min(Duration::from_nanos(due))
                } else {
                    poll
                }
            })
            .min()
    }

    /// The kubelet's way (`serialEvictions`): waits for every eviction in flight to end and
    /// its memory to come back (bounded by `release_wait` after the stop) before the next
    /// pass.
    pub(super) async fn wait_serially(&mut self) {
        loop {
            let now = monotonic_ns();
            self.track(now);
            let waiting = self.in_flight.iter().any(|f| match f.stop_ended_ns {
                None => true,
                Some(at) => {
                    !f.released
                        && Duration::from_nanos(now.saturating_sub(at)) < self.settings.release_wait
                }
            });
            if !waiting {
                return;
            }
            let ended = tokio::select! {
                Some(ended) = self.stop_rx.recv() => Some(ended),
                () = tokio::time::sleep(self.settings.close_poll) => None,
            };
            if let Some(ended) = ended {
                self.stop_ended(ended);
            }
        }
    }

    /// The second record of an eviction.
    fn emit_released(&mut self, r: Released) {
        let action = Action::Released {
            uid: r.uid,
            pod: r.pod,
            released: r.released,
            pending_bytes: r.pending_bytes,
            error: r.error,
        };
        let conditions = self.conditions.borrow().clone();
        let mut d = Decision::new(
            Wake::timer(None),
            monotonic_ns(),
            conditions,
            action,
            self.unprevented_ooms,
        );
        d.release_ns = r.release_ns;
        self.emit(d);
    }
}

/// What a second record says.
struct Released {
    uid: String,
    pod: String,
    released: bool,
    release_ns: Option<u64>,
    pending_bytes: Option<u64>,
    error: Option<String>,
}

/// How far a victim's usage must fall below where it last did for it to count as giving
/// memory back (its bound starts again): a victim must give back at least this much per
/// bound to stay counted, so a trickle of pages does not hold the next eviction off.
const PROGRESS_BYTES: u64 = 1 << 20;

/// The latest a victim's giving back can put its bound, after its kill deadline: the
/// kubelet's own wait for an evicted pod to be cleaned up (`podCleanupTimeout`). A victim
/// stuck in D state whose page cache the kernel takes back a little at a time gives memory
/// back for as long as it has cache, and must not hold the next eviction off for that long.
const PROGRESS_CAP: Duration = Duration::from_secs(30);

/// When a victim in flight last gave memory back, which is where its bound runs from.
///
/// A victim of tens of GiB, or one on a slow machine (a 150 MiB hog took 1.2-1.8 s from
/// SIGKILL to an empty cgroup in the emulated v2 guest, 2.8 s with the host busy), is still
/// handing its pages back when a bound counted from the kill runs out; the next pod was
/// then evicted for memory already on its way back. So the bound runs from the kill
/// deadline or the victim's last fall of [`PROGRESS_BYTES`], whichever is later, and never
/// past [`PROGRESS_CAP`] after the kill deadline. A frozen cgroup or a process in D state
/// that gives nothing back is past its bound `bound` after its kill, as before.
#[derive(Clone, Copy, Debug)]
pub(super) struct Progress {
    /// Its usage at the last fall (at the decision to begin with), bytes.
    mark_bytes: u64,
    /// When that fall was seen (`CLOCK_MONOTONIC` ns); `None` before the first.
    at_ns: Option<u64>,
}

impl Progress {
    /// From the victim's usage at the decision.
    pub(super) fn new(usage_bytes: u64) -> Progress {
        Progress {
            mark_bytes: usage_bytes,
            at_ns: None,
        }
    }

    /// One look at its usage (`None`: its cgroup is gone, or not a memory victim).
    fn look(&mut self, usage: Option<u64>, now_ns: u64) {
        if let Some(u) = usage {
            if u.saturating_add(PROGRESS_BYTES) <= self.mark_bytes {
                self.mark_bytes = u;
                self.at_ns = Some(now_ns);
            }
        }
    }

    /// When a victim with this progress and `kill_deadline_ns` is past `bound`.
    fn bound_ns(&self, kill_deadline_ns: u64, bound: Duration) -> u64 {
        let latest = kill_deadline_ns.saturating_add(nanos(PROGRESS_CAP.max(bound)));
        kill_deadline_ns
            .max(self.at_ns.unwrap_or(0))
            .saturating_add(nanos(bound))
            .min(latest)
    }
}

/// `d` in nanoseconds, saturating (the monotonic clock's unit here).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// How far an empty pod cgroup's usage may still fall between two looks (about a
/// millisecond apart while a killed victim is in flight) for its memory to count as back.
const STILL_FALLING_BYTES: u64 = 1 << 20;

/// Whether an empty pod cgroup's memory is back, from its usage at the last look and now
/// (`None`: gone, or not a memory eviction) and the anonymous memory still charged to it
/// (`None`: not read). A victim leaves its cgroup before its memory is all uncharged: with
/// `process_mrelease` the agent's reaper may still be tearing down the address space after
/// the process has exited, so "empty" alone let the loop count the victim's memory as no
/// longer coming back and evict a second pod for it while its pages were still being freed
/// (seen in the v2 guest, 80 MiB still charged 100 ms after the cgroup emptied). Nor is a
/// usage that did not fall between two looks enough: the teardown may not have begun (seen
/// under systemd in the v2 guest: the cgroup empty with all 160 MiB still charged, unmoved
/// for 40 ms of looks, then falling over 300 ms; the loop evicted the Guaranteed pod beside
/// it). Anonymous memory in a cgroup with no process is only ever on its way back, so the
/// memory is back once it is gone, and then once the usage, page cache the cgroup leaves
/// behind, stops falling. An empty cgroup's usage otherwise only moves by reclaim of that
/// page cache, slowly. Usage already under the falling step cannot fall by it any more, so
/// it counts as back at once rather than at the next look, a millisecond later.
fn memory_back(before: Option<u64>, now: Option<u64>, anon: Option<u64>) -> bool {
    match (before, now) {
        (_, None) => true,
        (_, Some(n)) if n < STILL_FALLING_BYTES => true,
        _ if anon.is_some_and(|a| a >= anon_slack_bytes()) => false,
        (None, Some(_)) => false,
        (Some(b), Some(n)) => b.saturating_sub(n) < STILL_FALLING_BYTES,
    }
}

#[cfg(test)]
mod memory_back_tests {
    use super::*;

    #[test]
    fn memory_is_back_once_the_usage_stops_falling() {
        assert!(
            memory_back(None, None, None),
            "gone, or not a memory eviction"
        );
        assert!(
            !memory_back(None, Some(10 << 20), None),
            "first look: not known yet"
        );
        assert!(
            memory_back(None, Some(300 << 10), None),
            "first look, under the falling step: cannot fall by it any more"
        );
        assert!(
            memory_back(Some(200 << 20), Some(300 << 10), None),
            "fell to under the falling step"
        );
        assert!(
            !memory_back(Some(200 << 20), Some(120 << 20), None),
            "still falling"
        );
        assert!(
            memory_back(Some(120 << 20), Some(120 << 20), None),
            "steady"
        );
        assert!(
            memory_back(Some(3 << 20), Some((2 << 20) + 512), None),
            "page cache trickle"
        );
    }

    #[test]
    fn anonymous_memory_in_an_empty_cgroup_is_still_coming_back() {
        let held = 160 << 20;
        assert!(
            !memory_back(Some(held), Some(held), Some(held - (200 << 10))),
            "teardown not begun: the usage did not fall, the anonymous memory is all there"
        );
        assert!(
            !memory_back(Some(held), Some(held), Some(anon_slack_bytes())),
            "at the statistics' slack it still counts as held"
        );
        assert!(
            memory_back(Some(held), Some(held), Some(anon_slack_bytes() - 1)),
            "page cache left behind, the anonymous memory gone: back"
        );
        assert!(
            memory_back(Some(held), Some(300 << 10), Some(held)),
            "a usage under the falling step is back whatever the statistics still say"
        );
        assert!(memory_back(None, None, Some(held)), "gone");
    }
}

#[cfg(test)]
mod progress_tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(2);
    const S: u64 = 1_000_000_000;

    #[test]
    fn a_victim_giving_memory_back_stays_within_its_bound() {
        let killed = 10 * S;
        let mut p = Progress::new(150 << 20);
        assert_eq!(p.bound_ns(killed, BOUND), 12 * S, "from the kill at first");
        p.look(Some(120 << 20), killed + S);
        p.look(Some(60 << 20), killed + 2 * S - 1);
        assert_eq!(
            p.bound_ns(killed, BOUND),
            14 * S - 1,
            "still falling at the bound: it runs from the last fall"
        );
        p.look(Some(60 << 20), killed + 3 * S);
        assert_eq!(
            p.bound_ns(killed, BOUND),
            14 * S - 1,
            "no fall, no new bound"
        );
    }

    #[test]
    fn giving_back_holds_the_bound_off_for_30_s_at_most() {
        let killed = 10 * S;
        let mut p = Progress::new(4 << 30);
        // A victim in D state whose cache the kernel takes back, 1 MiB a second.
        for i in 1..=60u64 {
            p.look(Some((4 << 30) - (i << 20)), killed + i * S);
        }
        assert_eq!(
            p.bound_ns(killed, BOUND),
            40 * S,
            "the kubelet's 30 s cleanup wait"
        );
        assert_eq!(
            Progress::new(1 << 20).bound_ns(killed, Duration::from_secs(60)),
            70 * S,
            "a bound longer than the cap stands"
        );
    }

    #[test]
    fn a_victim_giving_nothing_back_is_past_its_bound_two_seconds_after_its_kill() {
        let killed = 10 * S;
        let mut p = Progress::new(300 << 20);
        for i in 1..2000 {
            // A frozen victim: a page here and there, never 1 MiB below the mark.
            p.look(Some((300 << 20) - (i % 7) * 4096), killed + i * 1_000_000);
        }
        p.look(None, killed + S);
        assert_eq!(p.bound_ns(killed, BOUND), 12 * S);
        let grace_end = 40 * S;
        let mut p = Progress::new(300 << 20);
        p.look(Some(200 << 20), 20 * S);
        assert_eq!(
            p.bound_ns(grace_end, BOUND),
            42 * S,
            "a fall during the grace period does not shorten the bound"
        );
    }
}
