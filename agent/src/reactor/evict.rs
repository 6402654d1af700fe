//! Evicting one pod: rank the running pods for the signal, kill the first non-critical one
//! and wait (bounded) for its memory to come back.
//!
//! Everything between the decision and the SIGKILL is on the reaction's path, and every
//! cgroup file read there costs tens of microseconds, per pod. So for memory the victim is
//! found from each pod's usage counter and as few working sets (`memory.stat`) as can
//! decide it ([`first_for_memory`]: usage is never below the working set), and the full
//! ranking the decision records is completed after the kill; other signals read what their
//! ranking compares ([`PodReads::ranking`]) for every pod first. The victim's message
//! details (each container's usage) are read for it alone, before the kill, so the message
//! gives the figures it was evicted for.
//!
//! The same pick serves the kill at the crossing: the pod an eviction would take now is the
//! one staged for the kernel to kill when a hard threshold is crossed, and a kill the kernel
//! made there completes here as an eviction (the last `impl` block; the staging's rules are
//! [`super::crossing`]'s).

use std::time::Duration;

use crate::sense::ThreadCpu;

use super::crossing::Forced;
use super::decision::{Action, Decision, RankedPod};
use super::inflight::Started;
use super::pods::{pod_cgroup_path, ActivePod, ActivePods, EvictionStatus, PodControl};
use super::Reactor;
use crate::decide::eviction_message::eviction_message;
use crate::decide::inflight::{hard_choice, HardChoice};
use crate::decide::pod::PodInfo;
use crate::decide::pressure::Observations;
use crate::decide::pressure::{threshold_met_text, Reclaim};
use crate::decide::rank::{charged, first_for_memory, rank};
use crate::decide::signal::{FsLayout, Resource};
use crate::decide::summary::{MemoryStats, PodRef, PodStats};
use crate::decide::thresholds::pod_grace_period_seconds;
use crate::observe::{PodCgroup, PodReads, Signals};
use crate::sense::ebpf::threshold::cgroup_level;
use crate::sense::monotonic_ns;

/// What a bounded memory search read: each pod cgroup's path, its usage, and the working
/// sets it asked for.
pub(super) type MemoryReads = (Vec<String>, Vec<Option<u64>>, Vec<Option<Option<u64>>>);

/// The victim a pass chose, with what the choice read: what a dry run records instead of
/// the eviction (`Reactor::would_evict`).
pub(super) struct Chosen<'a> {
    pub(super) reclaim: &'a Reclaim,
    pub(super) met: &'a [usize],
    pub(super) signals: &'a Signals,
    pub(super) layout: FsLayout,
    pub(super) pods: &'a ActivePods,
    pub(super) victim: usize,
    pub(super) memory_reads: Option<MemoryReads>,
}

/// The victim a pass picked ([`Reactor::pick`]): the pods it was picked among, its place
/// there, and what a memory search read.
pub(super) struct Pick {
    pods: ActivePods,
    victim: usize,
    memory_reads: Option<MemoryReads>,
}

impl<P: PodControl + 'static> Reactor<P> {
    /// Ranks and starts evicting the first non-critical pod (the kill itself, for grace 0,
    /// is made here; the runtime's stop runs off the loop, see [`super::inflight`]); fills in
    /// `decision`. Pods whose eviction is in flight are not ranked again, except, for a hard
    /// threshold, the ones still in their grace period: if one of them ranks first its stop
    /// becomes a SIGKILL now (hard before soft). Returns whether a pod was evicted or
    /// escalated. With `forced`, the victim is the pod the kernel killed at the crossing,
    /// and nothing is evicted when it is not a candidate.
    pub(super) async fn evict_one(
        &mut self,
        reclaim: &Reclaim,
        met: &[usize],
        signals: &Signals,
        layout: FsLayout,
        decision: &mut Decision,
        forced: Option<Forced>,
    ) -> bool {
        let Some(pick) = self.pick(reclaim, layout, decision, forced.as_ref()).await else {
            return false;
        };
        // A dry run records the eviction instead of making it (`dry_run`); nothing is in
        // flight there, so nothing is escalated either.
        if self.settings.dry_run {
            let choice = Chosen {
                reclaim,
                met,
                signals,
                layout,
                pods: &pick.pods,
                victim: pick.victim,
                memory_reads: pick.memory_reads,
            };
            self.would_evict(choice, decision);
            return false;
        }
        if let Some(at) = self.evictions.position(&pick.pods[pick.victim].info.uid) {
            if let Some(reads) = pick.memory_reads {
                self.rank_memory_for_record(reclaim, layout, &pick.pods, reads, decision);
            }
            return self.escalate(at, reclaim, decision);
        }
        self.launch(pick, reclaim, met, signals, layout, decision, forced)
    }

    /// Picks the pod to evict for `reclaim`: for memory, from every pod's usage and the
    /// fewest working sets (`first_for_memory`), nothing copied per pod but its cgroup's
    /// path, the full ranking for the record completed after the kill; for other signals,
    /// the full ranking first, as the kubelet does, written into `decision`. With `forced`
    /// the pick is the kernel's victim, if it is a candidate. `None` when there is nothing
    /// to evict (`decision` then says so, with its ranking).
    async fn pick(
        &mut self,
        reclaim: &Reclaim,
        layout: FsLayout,
        decision: &mut Decision,
        forced: Option<&Forced>,
    ) -> Option<Pick> {
        let resource = reclaim.signal.resource();
        let pods = self.candidates(reclaim.hard, resource);
        let (victim, memory_reads) = if resource == Resource::Memory {
            let (paths, usage) = self.pod_usages(&pods);
            let at = forced.and_then(|f| pods.iter().position(|p| p.info.uid == f.uid));
            let (victim, asked) = match at {
                Some(i) => {
                    let mut asked = vec![None; pods.len()];
                    asked[i] = Some(self.observer.pod_working_set(&paths[i]));
                    (Some(i), asked)
                }
                // The kernel's victim is not a candidate (in flight already, or gone): its
                // kill stands for no other pod.
                None if forced.is_some() => (None, vec![None; pods.len()]),
                None => self.first_by_memory(&pods, &paths, &usage),
            };
            (victim, Some((paths, usage, asked)))
        } else {
            let root = self.settings.cgroup_root.trim_end_matches('/').to_string();
            let cgroups: Vec<PodCgroup> = pods.iter().map(|p| p.cgroups(&root)).collect();
            let infos: Vec<PodInfo> = pods.iter().map(|p| p.info.clone()).collect();
            let problems = self.observer.observe_pods_for(
                &cgroups,
                PodReads::ranking(resource),
                &mut self.figures.ranking,
            );
            for p in problems {
                tracing::debug!(error = %p, "pod statistics left out of the ranking");
            }
            if charged(reclaim.signal, layout).is_some_and(|c| c.rootfs) {
                self.add_writable_layers().await;
            }
            let order = rank(
                reclaim.signal,
                layout,
                &infos,
                &self.figures.ranking.index(),
            );
            decision.ranking = self.ranked(&order, &infos);
            // The first non-critical pod; one whose graceful eviction is in flight (listed
            // only for a hard threshold) is escalated by the caller.
            let in_flight = |i: usize| self.evictions.contains(&infos[i].uid);
            let victim =
                hard_choice(&order, |i| infos[i].is_critical(), in_flight).map(|c| match c {
                    HardChoice::Escalate(i) | HardChoice::Evict(i) => i,
                });
            (victim, None)
        };
        let Some(victim) = victim else {
            if let Some(reads) = memory_reads {
                self.rank_memory_for_record(reclaim, layout, &pods, reads, decision);
            }
            decision.action = Action::NothingToEvict;
            return None;
        };
        Some(Pick {
            pods,
            victim,
            memory_reads,
        })
    }

    /// Starts evicting the pod `pick` found, not in flight yet: reads its figures for its
    /// message (before the kill), kills it now for grace 0 (through [`PodControl::kill_now`],
    /// with the charge programs held off while it is torn down, see `inflight`), starts the
    /// runtime's stop on a task of its own and puts the victim in flight; then completes the
    /// record off the reaction's path. Returns whether a pod was evicted.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &mut self,
        pick: Pick,
        reclaim: &Reclaim,
        met: &[usize],
        signals: &Signals,
        layout: FsLayout,
        decision: &mut Decision,
        mut forced: Option<Forced>,
    ) -> bool {
        let Pick {
            pods,
            victim,
            memory_reads,
        } = pick;
        let resource = reclaim.signal.resource();
        let pod = &pods[victim];
        let info = &pod.info;
        let Some(grace) = self.eviction_grace(reclaim, pod) else {
            return false;
        };
        let uid = info.uid.clone();
        let expected_bytes = memory_reads
            .as_ref()
            .and_then(|(_, usage, _)| usage[victim])
            .unwrap_or(0);
        // The victim's own figures for its message (per container, for memory): one pod's
        // reads, not every pod's, and before the kill. After it they would be the victim's
        // remains: a killed process's memory is uncharged as it is freed, and the reaper
        // frees it at once (a v2 guest run once reported 112Ki for a hog of 200 MiB). The
        // reads cost tens of microseconds, a few KiB of the fastest hog's growth.
        // A kill at the crossing: the figures read at the pod's staging, before the kill.
        let root = self.settings.cgroup_root.trim_end_matches('/');
        let staged = forced.as_mut().and_then(|f| f.figures.take());
        let from_staging = staged.is_some();
        let problems = match staged {
            Some(figures) => {
                self.figures.victim.pods.clear();
                self.figures.victim.pods.push(figures);
                Vec::new()
            }
            None => self.observer.observe_pods_for(
                &[pod.cgroups(root)],
                PodReads::message(resource),
                &mut self.figures.victim,
            ),
        };
        // With grace 0 the kill is made here, on the loop's task, as soon as the victim is
        // known, and the charge programs are held off while the victim is torn down (see
        // `inflight`); the rest of the stop (the runtime's, the status, the cgroup) runs on a
        // task of its own.
        let killed = if grace == 0 {
            self.evictions.hold_charges(true);
            self.pods.kill_now(&uid)
        } else {
            None
        };
        for p in problems {
            tracing::debug!(error = %p, "the victim's statistics left out of its message");
        }
        // For memory the pod's own working set is the one the search read (before the kill),
        // or the staging's.
        if let (false, Some((_, _, asked)), Some(stats)) = (
            from_staging,
            &memory_reads,
            self.figures.victim.pods.first_mut(),
        ) {
            stats.memory = asked[victim].flatten().map(|ws| MemoryStats {
                working_set_bytes: Some(ws),
            });
        }
        let kernel_kill_ns = forced.as_ref().map(|f| f.killed_at_ns);
        let observations = forced.map_or_else(|| signals.observations(), |f| f.observations);
        let text = threshold_met_text(&self.settings.thresholds, met, &observations, resource);
        let message = eviction_message(
            resource,
            info,
            self.figures.victim.pods.first(),
            text.as_ref().map(|(q, a)| (q.as_str(), a.as_str())),
        );
        let status = EvictionStatus::evicted(message.message.clone(), message.annotations.clone());
        // A graceful eviction is noted too: its event goes out with this pass's decision,
        // before the pod manager writes its stop ahead.
        if killed.is_some() || grace > 0 {
            self.pods.note_eviction(&uid, &status);
        }
        let started_ns = monotonic_ns();
        self.evictions.launch(
            &self.pods,
            uid.clone(),
            Duration::from_secs(grace.unsigned_abs()),
            status,
            killed,
        );
        self.evictions.push(Started {
            pod: pod.clone(),
            signal: reclaim.signal,
            grace: Duration::from_secs(grace.unsigned_abs()),
            message: message.message.clone(),
            started_ns,
            killed_at_ns: if grace == 0 {
                Some(
                    kernel_kill_ns
                        .or(killed.and_then(|k| k.killed_at_ns))
                        .unwrap_or(started_ns),
                )
            } else {
                None
            },
            expected_bytes,
            usage_path: pod_cgroup_path(self.settings.cgroup_root.trim_end_matches('/'), pod),
        });
        // Off the reaction's path now: the rest of the memory ranking, for the record.
        if let Some(reads) = memory_reads {
            self.rank_memory_for_record(reclaim, layout, &pods, reads, decision);
        }
        match kernel_kill_ns {
            // The kill came before the pass: no pass → kill figures.
            Some(at) => self.time_kill(Some(at), None, None, decision),
            None => {
                let killed_at = killed.and_then(|k| k.killed_at_ns);
                let cpu = killed.and_then(|k| k.killed_cpu);
                self.time_kill(killed_at, killed_at, cpu, decision);
            }
        }
        if let Some(m) = &self.out.metrics {
            m.record_eviction(reclaim.signal, info.qos);
        }
        decision.action = Action::Evicted {
            uid,
            pod: info.name.clone(),
            signal: reclaim.signal.name().to_string(),
            qos: info.qos.as_str().to_string(),
            grace_seconds: grace,
            message: message.message,
            annotations: message.annotations,
            released: false,
            error: None,
            escalated: false,
        };
        true
    }

    /// Each pod's cgroup path and memory usage counter (`None`: gone or unreadable), read
    /// through the files kept open for it.
    pub(super) fn pod_usages(&mut self, pods: &ActivePods) -> (Vec<String>, Vec<Option<u64>>) {
        let root = self.settings.cgroup_root.trim_end_matches('/');
        let paths: Vec<String> = pods.iter().map(|p| pod_cgroup_path(root, p)).collect();
        let usage = self
            .observer
            .pod_memory_usages(paths.iter().map(String::as_str));
        (paths, usage)
    }

    /// The first pod of `pods` to evict for memory by the bounded search from their usages
    /// ([`first_for_memory`]), with the working sets it read.
    pub(super) fn first_by_memory(
        &mut self,
        pods: &ActivePods,
        paths: &[String],
        usage: &[Option<u64>],
    ) -> (Option<usize>, Vec<Option<Option<u64>>>) {
        let observer = &mut self.observer;
        first_for_memory(
            pods,
            |p| &p.info,
            usage,
            |i| observer.pod_working_set(&paths[i]),
        )
    }

    /// The grace period, in seconds, `pod` gets when evicted for `reclaim`'s threshold (the
    /// kubelet's rule: 0 for a hard threshold, else the pod's own capped by
    /// `evictionMaxPodGracePeriod`); `None` when the threshold is not configured. An eviction
    /// and a dry run's record of one give the same.
    pub(super) fn eviction_grace(&self, reclaim: &Reclaim, pod: &ActivePod) -> Option<i64> {
        let threshold = self.settings.thresholds.get(reclaim.threshold)?;
        Some(
            pod_grace_period_seconds(
                threshold,
                self.settings.max_pod_grace_period,
                pod.termination_grace_period,
            )
            .max(0),
        )
    }

    /// The pods to rank: the running ones whose eviction is not in flight, and for a hard
    /// threshold the ones in their grace period too (listed last, so ties keep the running
    /// pods first). With nothing in flight, the running pods as shared (no copy on the
    /// reaction's path).
    pub(super) fn candidates(&self, hard: bool, resource: Resource) -> ActivePods {
        let running = self.pods.pods();
        if self.evictions.is_empty() {
            return running;
        }
        let mut pods: Vec<ActivePod> = running
            .iter()
            .filter(|p| !self.evictions.contains(&p.info.uid))
            .cloned()
            .collect();
        if hard {
            pods.extend(self.evictions.graceful(resource).cloned());
        }
        pods.into()
    }

    /// Hard before soft: SIGKILL now to the victim in flight `at`, in its grace period and
    /// first in the ranking for a hard threshold. The runtime's stop under way (told
    /// already, so nothing restarts the processes) then ends at once.
    fn escalate(&mut self, at: usize, reclaim: &Reclaim, decision: &mut Decision) -> bool {
        self.evictions.hold_charges(true);
        let f = self.evictions.get(at);
        let killed = self.pods.escalate(&f.pod.info.uid, &f.pod.cgroup);
        let (uid, pod, qos, message) = (
            f.pod.info.uid.clone(),
            f.pod.info.name.clone(),
            f.pod.info.qos.as_str().to_string(),
            f.message.clone(),
        );
        self.evictions.escalated(at, killed.killed_at_ns);
        tracing::info!(%pod, %uid, killed = killed.killed, "eviction escalated: a hard threshold is met during the pod's grace period");
        self.time_kill(
            killed.killed_at_ns,
            killed.killed_at_ns,
            killed.killed_cpu,
            decision,
        );
        decision.action = Action::Evicted {
            uid,
            pod,
            signal: reclaim.signal.name().to_string(),
            qos,
            grace_seconds: 0,
            message,
            annotations: Default::default(),
            released: false,
            error: None,
            escalated: true,
        };
        true
    }

    /// Puts the kill's times on the decision: from the waking kernel event to `killed_at`
    /// (also on the metrics); from the signals read to `pass_killed_at`, the pass's own kill
    /// (`None` for a kill the kernel made at the crossing, before the pass); and the loop
    /// thread's CPU time from the pass's start to `kill_cpu` (its CPU clock at the kill),
    /// when both were read on the same thread.
    fn time_kill(
        &self,
        killed_at: Option<u64>,
        pass_killed_at: Option<u64>,
        kill_cpu: Option<ThreadCpu>,
        decision: &mut Decision,
    ) {
        decision.decide_to_kill_ns =
            pass_killed_at.map(|k| k.saturating_sub(decision.observed_at_ns));
        decision.decide_to_kill_cpu_ns = kill_cpu.and_then(|c| c.since(self.pass_cpu?));
        let waking = decision
            .wake
            .event
            .as_ref()
            .filter(|_| !decision.wake.timer);
        if let (Some(k), Some(ev)) = (killed_at, waking) {
            let lag = k.saturating_sub(ev.at_ns);
            decision.reaction_lag_ns = Some(lag);
            if let Some(m) = &self.out.metrics {
                m.observe_reaction_lag(ev.source, lag as f64 / 1e9);
            }
        }
    }

    /// Opens the memory usage file and `memory.stat` of every running pod and of each of
    /// its containers (and closes the ones of pods gone) as the pods change, so the bounded
    /// memory search and the victim's message at an eviction re-read open files instead of
    /// opening them between the kernel's event and the kill.
    pub(super) fn warm_pods(&mut self) {
        let root = self.settings.cgroup_root.trim_end_matches('/').to_string();
        let pods = self.pods.pods();
        let cgroups: Vec<PodCgroup> = pods.iter().map(|p| p.cgroups(&root)).collect();
        self.observer
            .keep_pod_usage_open(cgroups.iter().map(|c| c.cgroup.as_str()));
        self.observer
            .keep_container_files_open(cgroups.iter().flat_map(PodCgroup::container_paths));
    }

    /// The decision's ranking (its first `ranking_top` pods) from `order`.
    fn ranked(&self, order: &[usize], infos: &[PodInfo]) -> Vec<RankedPod> {
        let index = self.figures.ranking.index();
        order
            .iter()
            .take(self.settings.ranking_top)
            .map(|&i| {
                let p = &infos[i];
                RankedPod {
                    uid: p.uid.clone(),
                    name: p.name.clone(),
                    qos: p.qos.as_str().to_string(),
                    priority: p.priority_or_zero(),
                    working_set_bytes: index
                        .get(p.uid.as_str())
                        .and_then(|s| s.memory)
                        .and_then(|m| m.working_set_bytes),
                    critical: p.is_critical(),
                }
            })
            .collect()
    }

    /// Completes a bounded memory search into the full ranking for the record: the working
    /// sets read before the kill are kept, the other pods' read now. A pod without statistics
    /// at the decision stays without; one that had them but is gone now is left out of the
    /// record (it was not what the decision compared). A pod that grew in the meantime may
    /// rank differently from how it would have before the kill; the victim was chosen on the
    /// figures read then.
    pub(super) fn rank_memory_for_record(
        &mut self,
        reclaim: &Reclaim,
        layout: FsLayout,
        pods: &[ActivePod],
        (paths, usage, asked): MemoryReads,
        decision: &mut Decision,
    ) {
        self.figures.ranking.pods.clear();
        let mut listed = Vec::with_capacity(pods.len());
        for (i, (path, known)) in paths.iter().zip(asked).enumerate() {
            let info = &pods[i].info;
            let ws = match (usage[i], known) {
                (None, _) => {
                    listed.push(info.clone());
                    continue;
                }
                (Some(_), Some(ws)) => ws,
                (Some(_), None) => self.observer.pod_working_set(path),
            };
            let Some(ws) = ws else { continue };
            listed.push(info.clone());
            self.figures.ranking.pods.push(PodStats {
                pod_ref: PodRef {
                    uid: info.uid.clone(),
                    name: info.name.clone(),
                    namespace: String::new(),
                },
                memory: Some(MemoryStats {
                    working_set_bytes: Some(ws),
                }),
                ..PodStats::default()
            });
        }
        let order = rank(
            reclaim.signal,
            layout,
            &listed,
            &self.figures.ranking.index(),
        );
        decision.ranking = self.ranked(&order, &listed);
    }

    /// Puts the runtime's writable-layer figures into the pods' container statistics
    /// (where the observer found none), for a disk signal that charges writable layers.
    async fn add_writable_layers(&mut self) {
        let layers = self.pods.writable_layers().await;
        for pod in &mut self.figures.ranking.pods {
            let Some(of_pod) = layers.get(&pod.pod_ref.uid) else {
                continue;
            };
            for c in &mut pod.containers {
                if c.rootfs.is_none() {
                    c.rootfs = of_pod.get(&c.name).copied();
                }
            }
        }
    }
}

/// The loop's side of killing at the crossing ([`super::crossing`]): the victim staged is the
/// one an eviction would pick now, and a kill the kernel made there completes as an eviction.
impl<P: PodControl + 'static> Reactor<P> {
    /// Stages the pod a hard memory threshold would evict now, or clears the stage (see
    /// [`super::crossing`] for when).
    pub(super) fn stage_victim(&mut self) {
        if !self.crossing.staging() {
            return;
        }
        let ready = self.crossing.ready(
            self.evictions.is_empty(),
            self.close.kernel_watch().attached(),
        );
        let victim = if ready {
            self.first_memory_victim().and_then(|pod| {
                let id = self.observer.cgroup_id(&pod.cgroup)?;
                let level = cgroup_level(&pod.cgroup);
                Some((pod, id, level))
            })
        } else {
            None
        };
        let staged = self
            .crossing
            .stage(victim.as_ref().map(|(_, id, level)| (*id, *level)));
        if let (true, Some((pod, id, _))) = (staged, victim) {
            self.read_figures(&pod);
            self.crossing.remember(id, pod.uid);
        }
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

    /// Reads the staged pod's message figures ([`super::crossing`]): its working set and each
    /// container's usage, one pod's files.
    fn read_figures(&mut self, pod: &PodCgroup) {
        let reads = PodReads {
            pod_memory: true,
            ..PodReads::message(Resource::Memory)
        };
        let problems = self.observer.observe_pods_for(
            std::slice::from_ref(pod),
            reads,
            self.crossing.figures_mut(&pod.uid),
        );
        for p in problems {
            tracing::debug!(error = %p, "the staged pod's figures left out of its message");
        }
    }

    /// Whether this pass leaves the crossing of `reclaim`'s threshold, as it read it, to the
    /// kernel's check ([`super::crossing::Crossing::leaves`]): the charge programs watch
    /// its cgroup at its level, a victim staged for it within the stage's age, nothing in
    /// flight.
    pub(super) fn leaves_to_kernel(
        &mut self,
        reclaim: &Reclaim,
        observations: &Observations,
        since: Option<u64>,
    ) -> bool {
        let (thresholds, close, cgroups) = (
            &self.settings.thresholds,
            &self.close,
            self.observer.settings(),
        );
        let watched = || {
            let threshold = thresholds.get(reclaim.threshold)?;
            let capacity = observations.get(reclaim.signal)?.capacity?;
            Some(close.watches(threshold, capacity, cgroups))
        };
        self.crossing.leaves(
            reclaim,
            self.evictions.is_empty(),
            || watched().unwrap_or(false),
            since,
            monotonic_ns(),
        )
    }

    /// Completes the eviction a kill at the crossing began ([`super::crossing`]); fills in
    /// `decision`. Returns the reclaim it stands for when the pod was evicted.
    pub(super) async fn complete_crossing_kill(
        &mut self,
        signals: &Signals,
        decision: &mut Decision,
    ) -> Option<Reclaim> {
        let observations = signals.observations();
        let done = self
            .crossing
            .take_kill(&self.settings.thresholds, &observations)?;
        let uid = &done.forced.uid;
        // The loop may have evicted the pod already, woken by another source's record of the
        // same crossing before the kernel's kill record was taken: the kill is then part of
        // that eviction.
        if self.evictions.contains(uid) {
            return None;
        }
        if !self.pods.pods().iter().any(|p| p.info.uid == *uid) {
            tracing::warn!(pid = done.pid, %uid, "the pod killed at the crossing is no longer running; nothing to complete");
            return None;
        }
        decision.killed_at_crossing = Some(done.pid);
        decision.crossing_kill = Some(done.figures);
        let layout = signals.fs_layout().unwrap_or_default();
        let reclaim = done.reclaim;
        let evicted = self
            .evict_one(
                &reclaim,
                &[reclaim.threshold],
                signals,
                layout,
                decision,
                Some(done.forced),
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
