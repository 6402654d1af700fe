//! Killing at the crossing (`killAtCrossing`): the loop's half of
//! [`crate::sense::ebpf::stage`].
//!
//! **Staging.** After every pass that evicts nothing, when the running pods change, and when
//! the charge programs come on (a watched cgroup is near its level), the loop finds the pod a
//! hard memory threshold would evict now — the same bounded search over the same candidates
//! as an eviction ([`first_for_memory`]) — and stages its cgroup for the kernel. While the
//! programs are on, the loop passes at least every `kernel_watched_poll` and stages anew, and
//! the kernel holds a staging for two of those intervals at most (`STAGE_AGE_POLLS`): a
//! ranking older than that kills nothing. (A kubelet ranks from statistics up to its
//! housekeeping interval old.) Nothing is staged while an eviction is in flight (a second
//! kill is [`crate::decide::inflight`]'s call, made by the loop) or while the programs are
//! off.
//!
//! **Completing.** A threshold record whose crossing killed the staged victim's process is an
//! eviction begun. The next pass completes it before anything else, for the hard threshold
//! whose level the kernel saw crossed and with what was available then
//! ([`crate::decide::crossing`]): the pod's other processes are killed, the runtime stops it,
//! its status and message are the eviction's, and it is in flight as any victim, its kill
//! time the kernel's. It is completed even when the pass reads the threshold clear again
//! (the victim's memory already coming back): a pod is never left half-killed and
//! unrecorded. The pod's containers are fenced against restarts only when the loop reaches
//! them, a few hundred microseconds after the kill; the victim's own exit takes longer.
//!
//! **Its figures.** The eviction message gives the figures the victim was ranked on at its
//! last staging (its working set and each container's usage), not figures read after the
//! kill: by then the reaper has uncharged the victim's memory (a v2 guest run once reported
//! 116Ki for a hog evicted at 160 MiB). A staging kills nothing once older than
//! `STAGE_AGE_POLLS` re-rankings, so those figures are at most that old, as a kubelet's
//! message gives the statistics it ranked on.

use std::time::Duration;

use crate::decide::crossing::{crossing_reclaim, leave_to_kernel, AtCrossing, Defer};
use crate::decide::pressure::{Observations, Reclaim};
use crate::decide::signal::Signal;
use crate::decide::summary::{PodStats, Summary};
use crate::decide::thresholds::Threshold;
use crate::reactor::decision::CrossingKillFigures;
use crate::sense::ebpf::stage::VictimStage;
use crate::sense::{monotonic_ns, Kind, MemcgTarget, PressureEvent};

/// How many of the loop's re-rankings while the charge programs are on (one every
/// `kernel_watched_poll`) a staging outlives in the kernel: a ranking older than that kills
/// nothing (the loop's timer held off, or the programs were off and the stage left behind),
/// and the crossing is the loop's to act on.
const STAGE_AGE_POLLS: u32 = 2;

/// How far past a hard memory level a pass's reading may be and still be left to the
/// kernel's check: the page cache one reclaim pass may hold off the LRU while still charged
/// (2–4 MiB batches were seen at 150–350 MiB/s), with room.
const LEFT_TO_KERNEL_BYTES: u64 = 8 << 20;

/// The longest a crossing is left to the kernel, from the first pass that left it: a hog
/// at 150 MiB/s grows through a 4 MiB reclaim batch in 27 ms, and one that the kernel does
/// not catch grows at most this long past the loop's reading (17.5 MiB at 350 MiB/s, well
/// inside any hard threshold's margin to the limit).
const LEFT_TO_KERNEL_FOR: std::time::Duration = std::time::Duration::from_millis(50);

/// How many recent stagings are remembered to name the pod of a kill record (a record may
/// come after the loop staged another pod).
const REMEMBERED: usize = 8;

/// The loop's staging state and its rules: what is staged, since when, for which
/// thresholds' slots, and a kill the kernel made there for the next pass to complete.
#[derive(Debug, Default)]
pub(super) struct Crossing {
    /// The kernel's stage, with `killAtCrossing` and the charge programs attached.
    stage: Option<VictimStage>,
    /// The hard memory thresholds' targets: the slots whose crossing may kill.
    hard: Vec<MemcgTarget>,
    /// How long the kernel holds a staging (and the loop counts one as fresh):
    /// [`STAGE_AGE_POLLS`] re-rankings.
    age: Duration,
    /// Recently staged pods: cgroup id → pod uid, newest last.
    staged: Vec<(u64, String)>,
    /// A kill the kernel made, for the next pass to complete.
    pending: Option<CrossingKill>,
    /// The staged pod's figures for its message (working set, each container's usage), as
    /// read at its last staging; `figures_of` names the pod.
    figures: Summary,
    figures_of: Option<String>,
    /// When a victim was last staged (`CLOCK_MONOTONIC`; `None`: none is staged).
    staged_at_ns: Option<u64>,
    /// When the first of the passes that left the crossing they read to the kernel ran
    /// ([`crate::decide::crossing::leave_to_kernel`]); `None` once a pass does not.
    left_since_ns: Option<u64>,
    /// A failed map write was said (once).
    failed_said: bool,
}

/// An eviction whose victim and kill were the kernel's, at a hard threshold's crossing: the
/// pod is not searched for, its kill time is the kernel's, and its message gives what was
/// available at the crossing.
pub(super) struct Forced {
    /// The pod whose process was killed.
    pub(super) uid: String,
    /// The observations with the signal's `available` at the crossing.
    pub(super) observations: Observations,
    /// When the kernel killed it (`CLOCK_MONOTONIC`).
    pub(super) killed_at_ns: u64,
    /// Its figures as read at its staging, before the kill (`None`: not read then; they
    /// are read now, the victim's remains).
    pub(super) figures: Option<PodStats>,
}

/// A kill at the crossing ready to be completed as an eviction ([`Crossing::take_kill`]).
pub(super) struct Completion {
    /// The hard threshold the kernel saw crossed, as the eviction's reclaim.
    pub(super) reclaim: Reclaim,
    /// The victim, its kill and its figures.
    pub(super) forced: Forced,
    /// The process the kernel killed.
    pub(super) pid: u32,
    /// What the kernel saw at the crossing, for the record.
    pub(super) figures: CrossingKillFigures,
}

/// A kill the charge program made at a crossing.
#[derive(Clone, Debug)]
struct CrossingKill {
    /// The kernel's timestamp of the crossing, which the kill followed in the same program.
    at_ns: u64,
    pid: u32,
    cgroup_id: u64,
    /// The signal of the watched cgroup that crossed.
    signal: Option<Signal>,
    at: AtCrossing,
}

impl Crossing {
    /// Staging on `stage` (the kernel's, with `killAtCrossing` and the charge programs) for
    /// the slots of `hard`, re-ranked every `kernel_watched_poll` while the programs are on.
    pub(super) fn start(
        &mut self,
        stage: Option<VictimStage>,
        hard: Vec<MemcgTarget>,
        kernel_watched_poll: Duration,
    ) {
        self.stage = stage;
        self.hard = hard;
        self.age = kernel_watched_poll.saturating_mul(STAGE_AGE_POLLS);
    }

    /// Whether the loop stages victims at all.
    pub(super) fn staging(&self) -> bool {
        self.stage.is_some()
    }

    /// Whether a victim may be staged now: nothing in flight (a second kill is
    /// [`crate::decide::inflight`]'s call, made by the loop), no kill waiting to be
    /// completed, the charge programs on, a hard memory threshold to kill at.
    pub(super) fn ready(&self, nothing_in_flight: bool, programs_on: bool) -> bool {
        nothing_in_flight && self.pending.is_none() && programs_on && !self.hard.is_empty()
    }

    /// Stages the victim whose cgroup has this id and level, or clears the stage (`None`).
    /// Returns whether a victim is staged now: the caller then reads its figures
    /// ([`Crossing::figures_mut`]) and names its pod ([`Crossing::remember`]). A failed
    /// write is said once and stages nothing.
    pub(super) fn stage(&mut self, victim: Option<(u64, u32)>) -> bool {
        let Some(stage) = &self.stage else {
            return false;
        };
        match stage.stage(victim, &self.hard, self.age) {
            Ok(staged) => {
                self.staged_at_ns = staged.then(monotonic_ns);
                staged
            }
            Err(e) => {
                if !std::mem::replace(&mut self.failed_said, true) {
                    tracing::warn!(error = %e, "no victim staged for a kill at the crossing; the loop makes every kill");
                }
                false
            }
        }
    }

    /// Where the staged pod `uid`'s figures for its message are read into.
    pub(super) fn figures_mut(&mut self, uid: &str) -> &mut Summary {
        self.figures_of = Some(uid.to_string());
        &mut self.figures
    }

    /// How often the loop must re-rank while the charge programs are on (`attached`): every
    /// `kernel_watched_poll`; `None` when it stages nothing.
    pub(super) fn restage_every(
        &self,
        attached: bool,
        kernel_watched_poll: Duration,
    ) -> Option<Duration> {
        (self.stage.is_some() && attached).then_some(kernel_watched_poll)
    }

    /// Names the pod `uid` staged at cgroup id `id`, for a kill record that comes later.
    pub(super) fn remember(&mut self, id: u64, uid: String) {
        if self
            .staged
            .last()
            .is_some_and(|(i, u)| *i == id && *u == uid)
        {
            return;
        }
        self.staged.retain(|(i, _)| *i != id);
        self.staged.push((id, uid));
        if self.staged.len() > REMEMBERED {
            self.staged.remove(0);
        }
    }

    fn uid_of(&self, id: u64) -> Option<String> {
        self.staged
            .iter()
            .rev()
            .find(|(i, _)| *i == id)
            .map(|(_, u)| u.clone())
    }

    /// Whether a kill at the crossing waits to be completed.
    pub(super) fn pending(&self) -> bool {
        self.pending.is_some()
    }

    /// When the first of the passes that left the crossing to the kernel ran, taken: a
    /// crossing earlier passes left stays left only while this pass leaves it too.
    pub(super) fn take_left_since(&mut self) -> Option<u64> {
        self.left_since_ns.take()
    }

    /// When a crossing left to the kernel is read again (`CLOCK_MONOTONIC`), if one is.
    pub(super) fn left_until_ns(&self) -> Option<u64> {
        let bound = u64::try_from(LEFT_TO_KERNEL_FOR.as_nanos()).unwrap_or(u64::MAX);
        self.left_since_ns.map(|s| s.saturating_add(bound))
    }

    /// The figures read at `uid`'s last staging, if it was the last pod staged.
    fn figures_for(&self, uid: &str) -> Option<PodStats> {
        (self.figures_of.as_deref() == Some(uid))
            .then(|| self.figures.pods.first().cloned())
            .flatten()
    }

    /// Whether this pass leaves the crossing of `reclaim`'s threshold, as it read it, to the
    /// kernel's check ([`leave_to_kernel`]) at `now_ns`: a victim staged for it within the
    /// stage's age, nothing in flight, and the charge programs watching its cgroup at its
    /// level (`watched`, asked last). `since`: when the first of the passes before it that
    /// left it ran; noted again when this one does.
    pub(super) fn leaves(
        &mut self,
        reclaim: &Reclaim,
        nothing_in_flight: bool,
        watched: impl FnOnce() -> bool,
        since: Option<u64>,
        now_ns: u64,
    ) -> bool {
        let max_age = u64::try_from(self.age.as_nanos()).unwrap_or(u64::MAX);
        let staged = self
            .staged_at_ns
            .is_some_and(|at| now_ns.saturating_sub(at) < max_age);
        let ready = staged && nothing_in_flight && self.pending.is_none() && watched();
        let defer = Defer {
            allowance_bytes: LEFT_TO_KERNEL_BYTES,
            for_ns: u64::try_from(LEFT_TO_KERNEL_FOR.as_nanos()).unwrap_or(u64::MAX),
        };
        let left = leave_to_kernel(reclaim, ready, since, now_ns, defer);
        if left {
            self.left_since_ns = Some(since.unwrap_or(now_ns));
            tracing::debug!(signal = %reclaim.signal.name(), available = %reclaim.available, "the crossing read is left to the kernel's check");
        }
        left
    }

    /// Takes note of a record whose crossing killed the staged victim's process; the
    /// watched cgroups `node_cgroup` and `kubepods_cgroup` name the signal that crossed.
    pub(super) fn note_kill(
        &mut self,
        event: &PressureEvent,
        node_cgroup: &str,
        kubepods_cgroup: &str,
    ) {
        let Kind::ThresholdCrossed {
            killed: Some(killed),
            usage_bytes,
            threshold_bytes,
        } = &event.kind
        else {
            return;
        };
        if let Some(stage) = &self.stage {
            stage.killed();
        }
        self.staged_at_ns = None;
        let signal = match event.cgroup.as_deref() {
            Some(c) if c == node_cgroup => Some(Signal::MemoryAvailable),
            Some(c) if c == kubepods_cgroup => Some(Signal::AllocatableMemoryAvailable),
            _ => None,
        };
        self.pending = Some(CrossingKill {
            at_ns: event.at_ns,
            pid: killed.pid,
            cgroup_id: killed.cgroup_id,
            signal,
            at: AtCrossing {
                usage_bytes: usage_bytes.unwrap_or(0),
                level_bytes: threshold_bytes.unwrap_or(0),
            },
        });
    }

    /// Takes the kill waiting to be completed, as the eviction it begins: for the hard
    /// threshold of `thresholds` whose level the kernel saw crossed, with what was available
    /// then ([`crossing_reclaim`] over `observations`). `None` when none waits, or when the
    /// kill was not a staged pod's under a hard memory threshold (said: the pass decides
    /// alone).
    pub(super) fn take_kill(
        &mut self,
        thresholds: &[Threshold],
        observations: &Observations,
    ) -> Option<Completion> {
        let kill = self.pending.take()?;
        let uid = self.uid_of(kill.cgroup_id);
        let reclaim = kill
            .signal
            .and_then(|s| crossing_reclaim(thresholds, s, observations, kill.at));
        let (Some(uid), Some((reclaim, then))) = (uid, reclaim) else {
            tracing::warn!(
                pid = kill.pid,
                cgroup_id = kill.cgroup_id,
                "a process killed at the crossing is not a staged pod's under a hard memory threshold; the pass decides alone"
            );
            return None;
        };
        Some(Completion {
            reclaim,
            forced: Forced {
                figures: self.figures_for(&uid),
                uid,
                observations: then,
                killed_at_ns: kill.at_ns,
            },
            pid: kill.pid,
            figures: CrossingKillFigures {
                at_ns: kill.at_ns,
                usage_bytes: kill.at.usage_bytes,
                level_bytes: kill.at.level_bytes,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_stagings_name_a_kill_record_s_pod() {
        let mut c = Crossing::default();
        for i in 0..10u64 {
            c.remember(i, format!("pod-{i}"));
        }
        assert_eq!(c.uid_of(9).as_deref(), Some("pod-9"));
        assert_eq!(c.uid_of(2).as_deref(), Some("pod-2"));
        assert_eq!(c.uid_of(1), None, "only the last {REMEMBERED} are kept");
        // A cgroup id staged again for another pod (a new cgroup at a reused inode) names
        // the newer pod.
        c.remember(5, "pod-new".into());
        assert_eq!(c.uid_of(5).as_deref(), Some("pod-new"));
        assert_eq!(c.staged.iter().filter(|(i, _)| *i == 5).count(), 1);
    }

    fn kill_record(cgroup: &str, cgroup_id: u64) -> PressureEvent {
        PressureEvent {
            at_ns: 7,
            woke_ns: None,
            source: crate::sense::Source::Ebpf,
            cgroup: Some(cgroup.to_string()),
            kind: Kind::ThresholdCrossed {
                threshold_bytes: Some(900),
                usage_bytes: Some(1000),
                killed: Some(crate::sense::KilledAtCrossing { pid: 42, cgroup_id }),
            },
        }
    }

    #[test]
    fn a_kill_record_waits_for_the_next_pass_and_stops_the_staging() {
        let mut c = Crossing {
            hard: vec![MemcgTarget {
                cgroup: "/kubepods".into(),
                threshold_bytes: Some(900),
            }],
            ..Crossing::default()
        };
        assert!(c.ready(true, true));
        assert!(!c.ready(false, true), "an eviction in flight");
        assert!(!c.ready(true, false), "the charge programs off");
        c.remember(3, "pod-a".into());
        c.staged_at_ns = Some(1);
        c.note_kill(&kill_record("/kubepods", 3), "/", "/kubepods");
        assert!(c.pending());
        assert_eq!(c.staged_at_ns, None, "the staging is spent");
        assert!(!c.ready(true, true), "a kill waits to be completed");
        // No threshold to complete it for: taken all the same, and the pass decides alone.
        assert!(c.take_kill(&[], &Observations::default()).is_none());
        assert!(!c.pending());
        // A record that killed nothing is not a kill.
        let mut quiet = kill_record("/kubepods", 3);
        quiet.kind = Kind::ThresholdCrossed {
            threshold_bytes: Some(900),
            usage_bytes: Some(1000),
            killed: None,
        };
        c.note_kill(&quiet, "/", "/kubepods");
        assert!(!c.pending());
    }

    #[test]
    fn nothing_is_left_to_the_kernel_without_a_fresh_staging() {
        let mut c = Crossing::default();
        c.start(None, Vec::new(), Duration::from_millis(100));
        assert!(!c.staging());
        assert_eq!(c.restage_every(true, Duration::from_millis(100)), None);
        let zero = crate::decide::quantity::Quantity::ZERO;
        let reclaim = Reclaim {
            threshold: 0,
            signal: Signal::MemoryAvailable,
            resource: crate::decide::signal::Resource::Memory,
            reclaim_to: zero,
            threshold_quantity: zero,
            available: zero,
            hard: true,
        };
        assert!(!c.leaves(&reclaim, true, || true, None, 1_000));
        assert_eq!(c.left_until_ns(), None);
        // Staged too long ago (past two re-rankings): the loop acts itself.
        c.staged_at_ns = Some(1_000);
        assert!(!c.leaves(&reclaim, true, || true, None, 1_000 + 200_000_000));
        assert_eq!(c.take_left_since(), None);
    }
}
