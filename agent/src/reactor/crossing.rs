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

use super::evict::Forced;
use super::pods::PodControl;
use super::Reactor;
use crate::decide::crossing::{crossing_reclaim, leave_to_kernel, AtCrossing, Defer};
use crate::decide::pressure::{Observations, Reclaim};
use crate::decide::signal::{Resource, Signal};
use crate::decide::summary::{PodStats, Summary};
use crate::observe::{PodCgroup, PodReads, Signals};
use crate::reactor::record::{Action, CrossingKillFigures, Decision};
use crate::sense::ebpf::stage::VictimStage;
use crate::sense::ebpf::threshold::cgroup_level;
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

/// The loop's staging state.
#[derive(Debug, Default)]
pub(super) struct Crossing {
    /// The kernel's stage, with `killAtCrossing` and the charge programs attached.
    pub(super) stage: Option<VictimStage>,
    /// The hard memory thresholds' targets: the slots whose crossing may kill.
    pub(super) hard: Vec<MemcgTarget>,
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
    pub(super) left_since_ns: Option<u64>,
    /// A failed map write was said (once).
    failed_said: bool,
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
    fn remember(&mut self, id: u64, uid: String) {
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
}

impl<P: PodControl + 'static> Reactor<P> {
    /// Stages the pod a hard memory threshold would evict now, or clears the stage (see the
    /// module doc for when).
    pub(super) fn stage_victim(&mut self) {
        let Some(stage) = self.crossing.stage.clone() else {
            return;
        };
        let ready = self.in_flight.is_empty()
            && !self.crossing.pending()
            && self.kernel_watch.attached()
            && !self.crossing.hard.is_empty();
        let victim = if ready {
            self.first_memory_victim().and_then(|pod| {
                let id = self.observer.cgroup_id(&pod.cgroup)?;
                let level = cgroup_level(&pod.cgroup);
                Some((pod, id, level))
            })
        } else {
            None
        };
        match stage.stage(
            victim.as_ref().map(|(_, id, level)| (*id, *level)),
            &self.crossing.hard,
            self.stage_age(),
        ) {
            Ok(staged) => {
                self.crossing.staged_at_ns = staged.then(monotonic_ns);
                if let (true, Some((pod, id, _))) = (staged, victim) {
                    self.read_figures(&pod);
                    self.crossing.remember(id, pod.uid);
                }
            }
            Err(e) => {
                if !std::mem::replace(&mut self.crossing.failed_said, true) {
                    tracing::warn!(error = %e, "no victim staged for a kill at the crossing; the loop makes every kill");
                }
            }
        }
    }

    /// How long the kernel holds a staging (and the loop counts one as fresh).
    fn stage_age(&self) -> std::time::Duration {
        self.settings
            .kernel_watched_poll
            .saturating_mul(STAGE_AGE_POLLS)
    }

    /// Whether this pass leaves the crossing of `reclaim`'s threshold, as it read it, to the
    /// kernel's check ([`leave_to_kernel`]): the charge programs watch its cgroup at its
    /// level, a victim staged for it within the stage's age, nothing in flight. `since`: when
    /// the first of the passes before it that left it ran; noted again when this one does.
    pub(super) fn leaves_to_kernel(
        &mut self,
        reclaim: &Reclaim,
        observations: &Observations,
        since: Option<u64>,
    ) -> bool {
        let now = monotonic_ns();
        let max_age = u64::try_from(self.stage_age().as_nanos()).unwrap_or(u64::MAX);
        let staged = self
            .crossing
            .staged_at_ns
            .is_some_and(|at| now.saturating_sub(at) < max_age);
        let watched = || {
            let threshold = self.settings.thresholds.get(reclaim.threshold)?;
            let capacity = observations.get(reclaim.signal)?.capacity?;
            Some(self.kernel_watches(threshold, capacity))
        };
        let ready = staged
            && self.in_flight.is_empty()
            && !self.crossing.pending()
            && watched().unwrap_or(false);
        let defer = Defer {
            allowance_bytes: LEFT_TO_KERNEL_BYTES,
            for_ns: u64::try_from(LEFT_TO_KERNEL_FOR.as_nanos()).unwrap_or(u64::MAX),
        };
        let left = leave_to_kernel(reclaim, ready, since, now, defer);
        if left {
            self.crossing.left_since_ns = Some(since.unwrap_or(now));
            tracing::debug!(signal = %reclaim.signal.name(), available = %reclaim.available, "the crossing read is left to the kernel's check");
        }
        left
    }

    /// The pod a hard memory threshold would evict now, with its cgroups: the bounded
    /// search an eviction makes.
    fn first_memory_victim(&mut self) -> Option<PodCgroup> {
        let pods = self.candidates(true, Resource::Memory);
        let (paths, usage) = self.pod_usages(&pods);
        let (victim, _) = self.first_by_memory(&pods, &paths, &usage);
        let root = self.settings.cgroup_root.trim_end_matches('/');
        victim.map(|i| pods[i].cgroups(root))
    }

    /// Reads the staged pod's message figures (see the module doc): its working set and
    /// each container's usage, one pod's files.
    fn read_figures(&mut self, pod: &PodCgroup) {
        let reads = PodReads {
            pod_memory: true,
            ..PodReads::message(Resource::Memory)
        };
        let problems = self.observer.observe_pods_for(
            std::slice::from_ref(pod),
            reads,
            &mut self.crossing.figures,
        );
        for p in problems {
            tracing::debug!(error = %p, "the staged pod's figures left out of its message");
        }
        self.crossing.figures_of = Some(pod.uid.clone());
    }

    /// Takes note of a record whose crossing killed the staged victim's process.
    pub(super) fn note_crossing_kill(&mut self, event: &PressureEvent) {
        let Kind::ThresholdCrossed {
            killed: Some(killed),
            usage_bytes,
            threshold_bytes,
        } = &event.kind
        else {
            return;
        };
        if let Some(stage) = &self.crossing.stage {
            stage.killed();
        }
        self.crossing.staged_at_ns = None;
        let settings = self.observer.settings();
        let signal = match event.cgroup.as_deref() {
            Some(c) if c == settings.node_cgroup => Some(Signal::MemoryAvailable),
            Some(c) if c == settings.kubepods_cgroup => Some(Signal::AllocatableMemoryAvailable),
            _ => None,
        };
        self.crossing.pending = Some(CrossingKill {
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

    /// Completes the eviction a kill at the crossing began (see the module doc); fills in
    /// `decision`. Returns the reclaim it stands for when the pod was evicted.
    pub(super) async fn complete_crossing_kill(
        &mut self,
        signals: &Signals,
        decision: &mut Decision,
    ) -> Option<Reclaim> {
        let kill = self.crossing.pending.take()?;
        let observations = signals.observations();
        let uid = self.crossing.uid_of(kill.cgroup_id);
        let reclaim = kill
            .signal
            .and_then(|s| crossing_reclaim(&self.settings.thresholds, s, &observations, kill.at));
        let (Some(uid), Some((reclaim, then))) = (uid, reclaim) else {
            tracing::warn!(
                pid = kill.pid,
                cgroup_id = kill.cgroup_id,
                "a process killed at the crossing is not a staged pod's under a hard memory threshold; the pass decides alone"
            );
            return None;
        };
        // The loop may have evicted the pod already, woken by another source's record of the
        // same crossing before the kernel's kill record was taken: the kill is then part of
        // that eviction.
        if self.in_flight.iter().any(|f| f.pod.info.uid == uid) {
            return None;
        }
        if !self.pods.pods().iter().any(|p| p.info.uid == uid) {
            tracing::warn!(pid = kill.pid, %uid, "the pod killed at the crossing is no longer running; nothing to complete");
            return None;
        }
        decision.killed_at_crossing = Some(kill.pid);
        decision.crossing_kill = Some(CrossingKillFigures {
            at_ns: kill.at_ns,
            usage_bytes: kill.at.usage_bytes,
            level_bytes: kill.at.level_bytes,
        });
        let layout = signals.fs_layout().unwrap_or_default();
        let forced = Forced {
            figures: self.crossing.figures_for(&uid),
            uid,
            observations: then,
            killed_at_ns: kill.at_ns,
        };
        let evicted = self
            .evict_one(
                &reclaim,
                &[reclaim.threshold],
                signals,
                layout,
                decision,
                Some(forced),
            )
            .await;
        if !evicted {
            // The pass goes on as if no kill had been made at the crossing.
            decision.killed_at_crossing = None;
            decision.crossing_kill = None;
            decision.action = Action::None;
            decision.ranking.clear();
        }
        evicted.then_some(reclaim)
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
}
