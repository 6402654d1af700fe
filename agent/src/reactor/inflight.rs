//! Evictions in flight: the loop starts an eviction and keeps going (issue 23).
//!
//! The runtime's stop (a grace period, then SIGKILL, then the pod cgroup removed) runs on a
//! task of its own ([`Evictions::launch`]) that reports back when it ends; the loop never
//! awaits it. Until the victim is gone it is part of the loop's state ([`InFlight`], held by
//! [`Evictions`]): every pass reads what memory it still holds, and the rules of
//! [`crate::decide::inflight`] say which met thresholds it stands for. Each eviction makes
//! two records: one at the kill (or, for a grace period, when the stop starts), made by
//! `evict_one`, and one when the victim's memory is back — with the release time — or, at
//! the bound, with what it still holds ([`Released`], which [`Evictions::track`] hands the
//! loop to emit).
//!
//! The eBPF charge programs come off their tracepoint while a victim killed at grace 0 is
//! torn down (every page it gives back would otherwise fire them twice, see
//! [`crate::sense::ebpf::charge_switch::ChargeSwitch`]); [`Evictions::hold_charges`] is the
//! one place that pauses and resumes them, and they are back once every such victim is
//! released or past its bound — never held for a victim that will not die.
//!
//! [`Evictions`] reads the node only through [`VictimLooks`], so its rules are tested here
//! on looks made up for them.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::pods::{ActivePod, EvictError, Evicted, EvictionStatus, PodControl};
use super::settings::ReactorSettings;
use crate::act::cgroups::{CgroupManager, CgroupPath};
use crate::decide::inflight::Victim;
use crate::decide::signal::{Resource, Signal};
use crate::observe::cgroupfs::anon_slack_bytes;
use crate::observe::Observer;
use crate::sense::ebpf::charge_switch::ChargeSwitch;

/// One eviction in flight.
pub(super) struct InFlight {
    /// The victim as it was ranked (its cgroup, to watch it empty and to escalate).
    pub(super) pod: ActivePod,
    /// The signal it was evicted for.
    pub(super) signal: Signal,
    /// The grace period it was given.
    grace: Duration,
    /// Its eviction message (the pod's status message), for an escalation's record.
    pub(super) message: String,
    /// `CLOCK_MONOTONIC` ns when the eviction started.
    started_ns: u64,
    /// When its processes got SIGKILL: at once for grace 0 or an escalation, when the stop
    /// reports it for a grace period; `None` before.
    killed_at_ns: Option<u64>,
    /// Its memory usage at the decision, bytes: the most it is counted for.
    expected_bytes: u64,
    /// Its memory usage as last read (capped by `expected_bytes`), bytes.
    pending_bytes: u64,
    /// Whether the charge programs are held off for it.
    holds_charges: bool,
    /// The runtime's stop's end: what it killed, or why it failed.
    stop: Option<Result<Evicted, EvictError>>,
    /// `CLOCK_MONOTONIC` ns when the stop ended.
    stop_ended_ns: Option<u64>,
    /// Whether its memory is back: its pod cgroup gone, or empty with its usage no longer
    /// falling ([`memory_back`]).
    released: bool,
    /// Its pod cgroup's memory usage at the last look (memory victims), bytes.
    last_usage_bytes: Option<u64>,
    /// When it last gave memory back: its bound runs from then or its kill deadline.
    progress: Progress,
    /// Its pod cgroup's path as the observer names it, for those looks (made once).
    usage_path: String,
    /// Whether its second record (released, or still pending at the bound) was made.
    reported: bool,
}

/// What the loop knows of a victim as it starts its eviction.
pub(super) struct Started {
    /// The victim as it was ranked.
    pub(super) pod: ActivePod,
    /// The signal it is evicted for.
    pub(super) signal: Signal,
    /// The grace period it is given.
    pub(super) grace: Duration,
    /// Its eviction message.
    pub(super) message: String,
    /// `CLOCK_MONOTONIC` ns when the eviction started.
    pub(super) started_ns: u64,
    /// When its processes got SIGKILL (grace 0), `None` for a grace period.
    pub(super) killed_at_ns: Option<u64>,
    /// Its memory usage at the decision, bytes (0: not a memory eviction, or unread).
    pub(super) expected_bytes: u64,
    /// Its pod cgroup's path as the observer names it.
    pub(super) usage_path: String,
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
    fn stuck(&self, now_ns: u64, bound: Duration) -> bool {
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

    /// One look at it through `looks`: whether it is released, what it still holds.
    fn look(&mut self, looks: &mut impl VictimLooks, now_ns: u64) {
        let cg = &self.pod.cgroup;
        let gone = !looks.exists(cg);
        let empty = gone || looks.is_empty(cg);
        let usage = if gone || self.signal.resource() != Resource::Memory {
            None
        } else {
            looks.usage(&self.usage_path)
        };
        // An empty cgroup still holding anonymous memory is a victim whose address space is
        // still being freed, whether or not its usage fell since the last look; read only
        // then (one `memory.stat`).
        let anon = match usage {
            Some(u) if empty && !gone && u >= STILL_FALLING_BYTES => looks.anon(&self.usage_path),
            _ => None,
        };
        self.released = empty && memory_back(self.last_usage_bytes, usage, anon);
        self.last_usage_bytes = usage;
        self.progress.look(usage, now_ns);
        self.pending_bytes = if self.released {
            0
        } else {
            usage.unwrap_or(0).min(self.expected_bytes)
        };
    }
}

/// What tracking a victim reads of the node: its pod cgroup and its memory.
pub(super) trait VictimLooks {
    /// Whether the pod cgroup still exists.
    fn exists(&mut self, cgroup: &CgroupPath) -> bool;
    /// Whether it holds no process (`false` when it cannot be read).
    fn is_empty(&mut self, cgroup: &CgroupPath) -> bool;
    /// Its memory usage (`path`: as the observer names it), `None` when unreadable.
    fn usage(&mut self, path: &str) -> Option<u64>;
    /// The anonymous memory still charged to it, `None` when unreadable.
    fn anon(&mut self, path: &str) -> Option<u64>;
}

/// The looks the loop makes: the cgroup writer for the cgroup, the observer for the memory.
pub(super) struct NodeLooks<'a> {
    pub(super) cgroups: &'a CgroupManager,
    pub(super) observer: &'a mut Observer,
}

impl VictimLooks for NodeLooks<'_> {
    fn exists(&mut self, cgroup: &CgroupPath) -> bool {
        self.cgroups.exists(cgroup)
    }

    fn is_empty(&mut self, cgroup: &CgroupPath) -> bool {
        self.cgroups.is_empty(cgroup).unwrap_or(false)
    }

    fn usage(&mut self, path: &str) -> Option<u64> {
        // The pod's usage counter the observer keeps open (`warm_pods`): one `pread` per
        // look, no path walk and no `memory.stat`.
        self.observer.pod_memory_usages([path]).pop().flatten()
    }

    fn anon(&mut self, path: &str) -> Option<u64> {
        self.observer.pod_anon(path)
    }
}

/// The end of a stop, sent back by its task.
pub(super) struct StopEnded {
    uid: String,
    result: Result<Evicted, EvictError>,
}

/// The evictions in flight and what follows them: the victims, the charge programs held off
/// while victims are torn down, the stop tasks' reports, and the pause of disk thresholds
/// after a disk eviction.
pub(super) struct Evictions {
    /// The victims, in the order they were evicted.
    victims: Vec<InFlight>,
    /// Takes the eBPF charge programs off while a victim the loop killed is torn down (see
    /// [`ChargeSwitch`]); `None` without them.
    charge_switch: Option<ChargeSwitch>,
    /// How many victims in flight hold the charge programs off.
    charge_holds: usize,
    /// When [`Evictions::track`] last read the victims: the rules judge them as of then
    /// ([`Evictions::victims`]), so a victim counts as past its bound only once `track` has
    /// seen it so and its record is out, never first in a decision read a moment later.
    tracked_ns: u64,
    /// Whether the last pass found its thresholds covered by the victims in flight (and
    /// recorded it): the passes after it that find the same are not recorded again.
    covered_said: bool,
    /// After a disk eviction, `CLOCK_MONOTONIC` ns until which disk thresholds are not
    /// acted on; 0 when none.
    disk_hold_until_ns: u64,
    /// Where stop tasks report their end, and where the loop takes it.
    stop_tx: mpsc::UnboundedSender<StopEnded>,
    stop_rx: mpsc::UnboundedReceiver<StopEnded>,
    /// How long a killed victim may hold memory before it counts for nothing
    /// (`victim_bound`).
    bound: Duration,
    /// The re-read period while a killed victim is before its bound (`close_poll`).
    close_poll: Duration,
    /// The loop's housekeeping interval.
    housekeeping: Duration,
    /// How long a serial eviction waits for the memory after the stop (`release_wait`).
    release_wait: Duration,
}

impl Evictions {
    /// None in flight, with the timings of `settings`.
    pub(super) fn new(settings: &ReactorSettings) -> Evictions {
        let (stop_tx, stop_rx) = mpsc::unbounded_channel();
        Evictions {
            victims: Vec::new(),
            charge_switch: None,
            charge_holds: 0,
            tracked_ns: 0,
            covered_said: false,
            disk_hold_until_ns: 0,
            stop_tx,
            stop_rx,
            bound: settings.victim_bound,
            close_poll: settings.close_poll,
            housekeeping: settings.housekeeping,
            release_wait: settings.release_wait,
        }
    }

    /// The charge programs' switch, once the sense layer has them.
    pub(super) fn set_charge_switch(&mut self, switch: Option<ChargeSwitch>) {
        self.charge_switch = switch;
    }

    /// Whether no eviction is in flight.
    pub(super) fn is_empty(&self) -> bool {
        self.victims.is_empty()
    }

    /// Where pod `uid`'s eviction is in flight, if it is.
    pub(super) fn position(&self, uid: &str) -> Option<usize> {
        self.victims.iter().position(|f| f.pod.info.uid == uid)
    }

    /// Whether pod `uid`'s eviction is in flight.
    pub(super) fn contains(&self, uid: &str) -> bool {
        self.position(uid).is_some()
    }

    /// The victim in flight `at` ([`Evictions::position`]).
    pub(super) fn get(&self, at: usize) -> &InFlight {
        &self.victims[at]
    }

    /// The victims in their grace period evicted for `resource`: what a hard threshold may
    /// escalate.
    pub(super) fn graceful(&self, resource: Resource) -> impl Iterator<Item = &ActivePod> {
        self.victims
            .iter()
            .filter(move |f| f.graceful() && f.signal.resource() == resource)
            .map(|f| &f.pod)
    }

    /// Starts the runtime's stop of `uid` on a task of its own (`killed`: the kill made
    /// already, for grace 0); its end comes back to [`Evictions::next_stop`].
    pub(super) fn launch<P: PodControl + 'static>(
        &self,
        pods: &Arc<P>,
        uid: String,
        grace: Duration,
        status: EvictionStatus,
        killed: Option<Evicted>,
    ) {
        let pods = Arc::clone(pods);
        let tx = self.stop_tx.clone();
        tokio::spawn(async move {
            let result = pods.evict(&uid, grace, status, killed).await;
            let _ = tx.send(StopEnded { uid, result });
        });
    }

    /// Puts a victim in flight. Killed at grace 0, it holds the charge programs off (the
    /// caller paused them before the kill with [`Evictions::hold_charges`]).
    pub(super) fn push(&mut self, s: Started) {
        let holds_charges = s.grace.is_zero() && self.charge_switch.is_some();
        self.victims.push(InFlight {
            pod: s.pod,
            signal: s.signal,
            grace: s.grace,
            message: s.message,
            started_ns: s.started_ns,
            killed_at_ns: s.killed_at_ns,
            expected_bytes: s.expected_bytes,
            pending_bytes: s.expected_bytes,
            holds_charges,
            stop: None,
            stop_ended_ns: None,
            released: false,
            last_usage_bytes: None,
            progress: Progress::new(s.expected_bytes),
            usage_path: s.usage_path,
            reported: false,
        });
    }

    /// The victim `at`, in its grace period, was killed now (hard before soft); the caller
    /// paused the charge programs before the kill.
    pub(super) fn escalated(&mut self, at: usize, killed_at_ns: Option<u64>) {
        let holds = self.charge_switch.is_some();
        let f = &mut self.victims[at];
        f.killed_at_ns = killed_at_ns;
        f.holds_charges = holds;
    }

    /// The next stop task's report (pending while none has ended).
    pub(super) async fn next_stop(&mut self) -> Option<StopEnded> {
        self.stop_rx.recv().await
    }

    /// Takes in the end of a stop, at `now_ns`; the caller tracks the victims next.
    pub(super) fn stop_ended(&mut self, ended: StopEnded, now_ns: u64) {
        let Some(f) = self
            .victims
            .iter_mut()
            .find(|f| f.pod.info.uid == ended.uid)
        else {
            return;
        };
        if f.killed_at_ns.is_none() {
            f.killed_at_ns = ended.result.as_ref().ok().and_then(|e| e.killed_at_ns);
        }
        if let Err(e) = &ended.result {
            tracing::warn!(pod = %f.pod.info.name, uid = %ended.uid, error = %e, "eviction: the runtime's stop failed");
        }
        f.stop = Some(ended.result);
        f.stop_ended_ns = Some(now_ns);
    }

    /// The victims in flight as the rules see them, as of the last [`Evictions::track`]: a
    /// victim whose bound passed since counts as stuck only once the next `track` has
    /// recorded it (seen in CI: the decision that evicted the next pod for a frozen victim
    /// came a millisecond before the record saying the victim was not gone).
    pub(super) fn victims(&self) -> Vec<Victim> {
        self.victims
            .iter()
            .map(|f| Victim {
                resource: f.signal.resource(),
                killed: f.killed_at_ns.is_some(),
                stuck: f.stuck(self.tracked_ns, self.bound),
                pending_bytes: if f.released { 0 } else { f.pending_bytes },
            })
            .collect()
    }

    /// Reads every victim in flight through `looks`: released (its cgroup empty or gone),
    /// what memory it still holds, past its bound; returns each one's second record when it
    /// is due (for the loop to emit), gives the charge programs back when no victim needs
    /// them off, and forgets the victims that are gone.
    pub(super) fn track(&mut self, now_ns: u64, looks: &mut impl VictimLooks) -> Vec<Released> {
        self.tracked_ns = now_ns;
        let bound = self.bound;
        let mut records = Vec::new();
        for f in &mut self.victims {
            if !f.released {
                f.look(looks, now_ns);
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
                error: f
                    .stop
                    .as_ref()
                    .and_then(|s| s.as_ref().err().map(ToString::to_string)),
            });
        }
        for r in &records {
            if !r.released {
                tracing::warn!(pod = %r.pod, uid = %r.uid, pending_bytes = r.pending_bytes, bound = ?bound, "eviction: the victim is not gone past its bound; its memory no longer counts as coming back and the next pod is evicted if a threshold is still met");
            }
        }
        // Charge programs: held off only while a victim killed at grace 0 is being torn
        // down, never past its release or its bound.
        let mut give_back = false;
        for f in &mut self.victims {
            if f.holds_charges && (f.released || f.stuck(now_ns, bound)) {
                f.holds_charges = false;
                give_back = true;
            }
        }
        if give_back {
            self.hold_charges(false);
        }
        // A victim that will not die stays in flight (counted for nothing) until it is gone.
        self.victims.retain(|f| !f.gone());
        records
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
    pub(super) fn recheck(&self, now_ns: u64) -> Option<Duration> {
        let bound = self.bound;
        self.victims
            .iter()
            .filter(|f| !f.released || f.stop.is_none())
            .map(|f| {
                if f.released {
                    // Waiting for the stop's report only: it comes on the channel.
                    return self.housekeeping;
                }
                let due = f.bound_ns(bound).saturating_sub(now_ns);
                let poll = if f.killed_at_ns.is_some() && !f.stuck(now_ns, bound) {
                    self.close_poll
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

    /// Whether a serial eviction still waits at `now_ns` (`serialEvictions`, the kubelet's
    /// way): a stop not ended, or a victim's memory not back within `release_wait` of its
    /// stop's end.
    pub(super) fn waiting_serially(&self, now_ns: u64) -> bool {
        self.victims.iter().any(|f| match f.stop_ended_ns {
            None => true,
            Some(at) => {
                !f.released && Duration::from_nanos(now_ns.saturating_sub(at)) < self.release_wait
            }
        })
    }

    /// Notes whether this pass found its thresholds covered by the victims in flight;
    /// returns whether the pass before it did (and was recorded).
    pub(super) fn note_covered(&mut self, covered: bool) -> bool {
        std::mem::replace(&mut self.covered_said, covered)
    }

    /// Holds disk thresholds off until `until_ns` (after a disk eviction).
    pub(super) fn hold_disk(&mut self, until_ns: u64) {
        self.disk_hold_until_ns = until_ns;
    }

    /// `CLOCK_MONOTONIC` ns until which disk thresholds are held off (0: none).
    pub(super) fn disk_hold_until_ns(&self) -> u64 {
        self.disk_hold_until_ns
    }
}

/// An eviction's second record: its victim's memory back, or still held at its bound.
pub(super) struct Released {
    pub(super) uid: String,
    pub(super) pod: String,
    pub(super) released: bool,
    pub(super) release_ns: Option<u64>,
    pub(super) pending_bytes: Option<u64>,
    pub(super) error: Option<String>,
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

#[cfg(test)]
mod evictions_tests {
    use super::*;
    use crate::act::runtime::RestartPolicy;
    use crate::config::Config;
    use crate::decide::pod::PodInfo;

    const MS: u64 = 1_000_000;

    /// Looks made up for a test: one victim's cgroup and memory as the test sets them.
    #[derive(Default)]
    struct Looks {
        gone: bool,
        empty: bool,
        usage: Option<u64>,
        anon: Option<u64>,
    }

    impl VictimLooks for Looks {
        fn exists(&mut self, _: &CgroupPath) -> bool {
            !self.gone
        }
        fn is_empty(&mut self, _: &CgroupPath) -> bool {
            self.empty
        }
        fn usage(&mut self, _: &str) -> Option<u64> {
            self.usage
        }
        fn anon(&mut self, _: &str) -> Option<u64> {
            self.anon
        }
    }

    fn evictions() -> Evictions {
        Evictions::new(&ReactorSettings::from_config(&Config::default()).unwrap())
    }

    fn started(uid: &str, grace: Duration, killed_at_ns: Option<u64>) -> Started {
        let info = PodInfo::from_json(serde_json::json!({
            "metadata": {"name": uid, "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "c"}]}
        }))
        .unwrap();
        Started {
            pod: ActivePod {
                info,
                cgroup: CgroupPath::parse(&format!("kubepods/pod{uid}")).unwrap(),
                containers: Vec::new(),
                restart_policy: RestartPolicy::Never,
                termination_grace_period: None,
            },
            signal: Signal::MemoryAvailable,
            grace,
            message: "evicted".into(),
            started_ns: 10 * MS,
            killed_at_ns,
            expected_bytes: 100 << 20,
            usage_path: format!("/kubepods/pod{uid}"),
        }
    }

    #[test]
    fn a_killed_victim_is_released_once_its_cgroup_is_empty_and_its_memory_back() {
        let mut e = evictions();
        e.push(started("a", Duration::ZERO, Some(10 * MS)));
        assert!(e.contains("a") && !e.is_empty());
        let mut looks = Looks {
            usage: Some(80 << 20),
            ..Looks::default()
        };
        assert!(e.track(11 * MS, &mut looks).is_empty(), "still running");
        let v = e.victims();
        assert_eq!(v.len(), 1);
        assert!(v[0].killed && !v[0].stuck);
        assert_eq!(v[0].pending_bytes, 80 << 20, "what it holds now");
        // Empty, its anonymous memory gone and its usage steady: back.
        looks.empty = true;
        looks.anon = Some(0);
        let records = e.track(13 * MS, &mut looks);
        assert_eq!(records.len(), 1);
        assert!(records[0].released);
        assert_eq!(records[0].release_ns, Some(3 * MS), "from its kill");
        assert_eq!(e.victims()[0].pending_bytes, 0);
        // In flight until the stop reports.
        assert!(!e.is_empty());
        assert_eq!(e.recheck(13 * MS), Some(e.housekeeping));
        e.stop_ended(
            StopEnded {
                uid: "a".into(),
                result: Ok(Evicted::default()),
            },
            14 * MS,
        );
        assert!(e.track(14 * MS, &mut looks).is_empty(), "one record each");
        assert!(e.is_empty(), "gone");
    }

    #[test]
    fn a_victim_past_its_bound_counts_for_nothing_only_once_tracked() {
        let mut e = evictions();
        let bound = e.bound;
        e.push(started("a", Duration::ZERO, Some(0)));
        let mut looks = Looks {
            usage: Some(100 << 20),
            ..Looks::default()
        };
        let past = nanos(bound) + MS;
        assert!(e.track(MS, &mut looks).is_empty());
        assert!(!e.victims()[0].stuck, "as of the last track");
        assert_eq!(e.recheck(MS), Some(e.close_poll), "timed while killed");
        let records = e.track(past, &mut looks);
        assert_eq!(records.len(), 1);
        assert!(!records[0].released);
        assert_eq!(records[0].pending_bytes, Some(100 << 20));
        assert!(e.victims()[0].stuck);
        assert_eq!(e.recheck(past), Some(Duration::from_millis(50)));
        assert!(e.track(past + MS, &mut looks).is_empty(), "said once");
    }

    #[test]
    fn a_graceful_victim_can_be_escalated_and_waits_serially_for_its_stop() {
        let mut e = evictions();
        e.push(started("a", Duration::from_secs(30), None));
        assert_eq!(
            e.graceful(Resource::Memory)
                .map(|p| p.info.uid.as_str())
                .collect::<Vec<_>>(),
            ["a"]
        );
        assert_eq!(e.graceful(Resource::EphemeralStorage).count(), 0);
        assert!(e.waiting_serially(MS), "its stop has not ended");
        let at = e.position("a").unwrap();
        e.escalated(at, Some(20 * MS));
        assert!(!e.get(at).graceful());
        assert!(e.victims()[0].killed);
        // No charge programs here: holding them is a no-op, and nothing is held.
        e.hold_charges(true);
        assert_eq!(e.charge_holds, 0);
        assert!(!e.note_covered(true));
        assert!(e.note_covered(false));
    }
}
