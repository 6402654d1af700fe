//! Dry run (`dryRun`): the loop observes and decides as always, and where it would act it
//! records instead.
//!
//! - **Evictions.** The victim is chosen as for a real eviction (the same bounded search,
//!   the same candidates) and its message composed from the same figures; instead of the
//!   kill, an [`Action::WouldEvict`] record, once per pod per pressure episode
//!   ([`crate::decide::dry_run`]), counted in `reactor_dry_run_evictions_total`. Nothing
//!   enters the evictions in flight, so no pass waits on a victim that never dies, and a
//!   pass that finds the pod already recorded records nothing.
//! - **Kill at the crossing.** No victim is ever staged, so the charge program never kills;
//!   its thresholds still fire and wake the loop.
//! - **Reclaim first.** `memoryReclaim` writes nothing to `memory.reclaim`: the record says
//!   what the first step would have asked for (outcome `dry-run`), and the eviction that
//!   would follow if reclaim did not suffice is recorded as above. The disk path's node-level
//!   reclaim asks the image GC manager, which in a dry run deletes nothing and says what it
//!   would have deleted. Each runs once per episode of its threshold.
//!
//! While some episode is open, a memory signal close to a threshold is re-read every
//! `kernel_watched_poll` rather than every `close_poll`: the real agent's victim would be
//! gone, and re-reading a node that stays past its threshold every millisecond would only
//! cost the node CPU.

use super::decision::{Action, Decision};
use super::evict::Chosen;
use super::pods::PodControl;
use super::Reactor;
use crate::decide::dry_run::WouldEvict;
use crate::decide::eviction_message::eviction_message;
use crate::decide::pressure::{threshold_met_text, Reclaim};
use crate::decide::summary::MemoryStats;
use crate::observe::PodReads;
use crate::sense::monotonic_ns;

impl<P: PodControl + 'static> Reactor<P> {
    /// Records the eviction the pass chose instead of making it (see the module doc);
    /// fills in `decision`: [`Action::WouldEvict`] when the pod is recorded now,
    /// [`Action::None`] when it was recorded in this episode already.
    pub(super) fn would_evict(&mut self, choice: Chosen<'_>, decision: &mut Decision) {
        let Chosen {
            reclaim,
            met,
            signals,
            layout,
            pods,
            victim,
            memory_reads,
        } = choice;
        let pod = &pods[victim];
        let info = &pod.info;
        if self.dry_run.recorded(&info.uid) {
            decision.action = Action::None;
            return;
        }
        let Some(grace) = self.eviction_grace(reclaim, pod) else {
            return;
        };
        let resource = reclaim.signal.resource();
        let root = self.settings.cgroup_root.trim_end_matches('/').to_string();
        let problems = self.observer.observe_pods_for(
            &[pod.cgroups(&root)],
            PodReads::message(resource),
            &mut self.figures.victim,
        );
        for p in problems {
            tracing::debug!(error = %p, "the victim's statistics left out of its message");
        }
        if let (Some((_, _, asked)), Some(stats)) =
            (&memory_reads, self.figures.victim.pods.first_mut())
        {
            stats.memory = asked[victim].flatten().map(|ws| MemoryStats {
                working_set_bytes: Some(ws),
            });
        }
        let observations = signals.observations();
        let text = threshold_met_text(&self.settings.thresholds, met, &observations, resource);
        let message = eviction_message(
            resource,
            info,
            self.figures.victim.pods.first(),
            text.as_ref().map(|(q, a)| (q.as_str(), a.as_str())),
        );
        self.dry_run.record(WouldEvict {
            uid: info.uid.clone(),
            pod: info.name.clone(),
            threshold: reclaim.threshold,
            signal: reclaim.signal.name().to_string(),
            message: message.message.clone(),
            at_ns: monotonic_ns(),
        });
        if let Some(reads) = memory_reads {
            self.rank_memory_for_record(reclaim, layout, pods, reads, decision);
        }
        if let Some(m) = &self.out.metrics {
            m.record_dry_run_eviction(reclaim.signal, info.qos);
        }
        decision.action = Action::WouldEvict {
            uid: info.uid.clone(),
            pod: info.name.clone(),
            signal: reclaim.signal.name().to_string(),
            qos: info.qos.as_str().to_string(),
            grace_seconds: grace,
            message: message.message,
            annotations: message.annotations,
        };
    }

    /// Ends the dry run's episodes this pass closes: pods whose threshold is no longer met,
    /// and pods no longer running.
    pub(super) fn end_dry_run_episodes(&mut self, met: &[usize]) {
        if self.dry_run.is_empty() {
            return;
        }
        let running = self.pods.pods();
        let ended = self
            .dry_run
            .end_episodes(met, |uid| running.iter().any(|p| p.info.uid == uid));
        for w in ended {
            tracing::info!(pod = %w.pod, uid = %w.uid, signal = %w.signal, "dry run: the pressure episode of a would-be eviction ended");
        }
    }

    /// A dry-run pass's record: a would-be eviction is recorded once per episode; a pass
    /// that found its pod recorded already is recorded only when the conditions changed. A
    /// disk threshold then waits one housekeeping interval, as after a real disk eviction:
    /// the disk ranking (every pod's figures, the runtime's writable layers) is not re-run
    /// on every pass of an episode that cannot change it.
    pub(super) fn dry_run_record(
        &mut self,
        reclaim: &Reclaim,
        decision: Decision,
        conditions_changed: bool,
    ) -> Option<Decision> {
        if super::reclaim::reclaims_node_level(reclaim.signal) {
            self.evictions.hold_disk(monotonic_ns().saturating_add(
                u64::try_from(self.settings.housekeeping.as_nanos()).unwrap_or(u64::MAX),
            ));
        }
        let new = !matches!(decision.action, Action::None);
        (new || conditions_changed).then_some(decision)
    }

    /// Whether a dry run recorded an episode for threshold `index` already: its node-level
    /// or memory reclaim is then not asked again.
    pub(super) fn dry_run_episode_open(&self, index: usize) -> bool {
        self.settings.dry_run && self.dry_run.current().iter().any(|w| w.threshold == index)
    }
}
