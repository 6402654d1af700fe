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

use std::time::Duration;

use super::pods::{ActivePod, EvictionStatus, PodControl};
use super::record::{Action, Decision, RankedPod};
use super::Reactor;
use crate::act::cgroups::CgroupPath;
use crate::decide::pod::PodInfo;
use crate::decide::pressure::{threshold_met_text, Reclaim};
use crate::decide::rank::{charged, eviction_message, first_for_memory, rank};
use crate::decide::signal::{FsLayout, Resource};
use crate::decide::summary::{MemoryStats, PodRef, PodStats};
use crate::decide::thresholds::pod_grace_period_seconds;
use crate::observe::{ContainerCgroup, PodCgroup, PodReads, Signals};
use crate::sense::monotonic_ns;

/// What a bounded memory search read: each pod cgroup's path, its usage, and the working
/// sets it asked for.
type MemoryReads = (Vec<String>, Vec<Option<u64>>, Vec<Option<Option<u64>>>);

impl<P: PodControl + 'static> Reactor<P> {
    /// Ranks, evicts the first non-critical pod and waits for its memory to be released;
    /// fills in `decision`. Returns whether a pod was evicted.
    pub(super) async fn evict_one(
        &mut self,
        reclaim: &Reclaim,
        met: &[usize],
        signals: &Signals,
        layout: FsLayout,
        decision: &mut Decision,
    ) -> bool {
        let pods = self.pods.pods();
        let root = self.settings.cgroup_root.trim_end_matches('/').to_string();
        let resource = reclaim.signal.resource();
        // Memory: the victim from every pod's usage and the fewest working sets
        // (`first_for_memory`), nothing copied per pod but its cgroup's path; the full
        // ranking for the record is completed after the kill. Other signals: the full
        // ranking first, as the kubelet does.
        let (victim, memory_reads) = if resource == Resource::Memory {
            let paths: Vec<String> = pods.iter().map(|p| pod_cgroup_path(&root, p)).collect();
            let usage = self
                .observer
                .pod_memory_usages(paths.iter().map(String::as_str));
            let observer = &mut self.observer;
            let (victim, asked) = first_for_memory(
                &pods,
                |p| &p.info,
                &usage,
                |i| observer.pod_working_set(&paths[i]),
            );
            (victim, Some((paths, usage, asked)))
        } else {
            let cgroups: Vec<PodCgroup> = pods.iter().map(|p| pod_cgroup(&root, p)).collect();
            let infos: Vec<PodInfo> = pods.iter().map(|p| p.info.clone()).collect();
            let problems = self.observer.observe_pods_for(
                &cgroups,
                PodReads::ranking(resource),
                &mut self.summary,
            );
            for p in problems {
                tracing::debug!(error = %p, "pod statistics left out of the ranking");
            }
            if charged(reclaim.signal, layout).is_some_and(|c| c.rootfs) {
                self.add_writable_layers().await;
            }
            let order = rank(reclaim.signal, layout, &infos, &self.summary.index());
            decision.ranking = self.ranked(&order, &infos);
            let victim = order.iter().copied().find(|&i| !infos[i].is_critical());
            (victim, None)
        };
        let Some(victim) = victim else {
            if let Some(reads) = memory_reads {
                self.rank_memory_for_record(reclaim, layout, &pods, reads, decision);
            }
            decision.action = Action::NothingToEvict;
            return false;
        };
        let pod = &pods[victim];
        let info = &pod.info;
        let Some(threshold) = self.settings.thresholds.get(reclaim.threshold) else {
            return false;
        };
        let grace = pod_grace_period_seconds(
            threshold,
            self.settings.max_pod_grace_period,
            pod.termination_grace_period,
        )
        .max(0);
        // The victim's own figures for its message (per container, for memory): one pod's
        // reads, where reading them for every pod would have delayed the kill.
        let problems = self.observer.observe_pods_for(
            &[pod_cgroup(&root, pod)],
            PodReads::message(resource),
            &mut self.victim,
        );
        for p in problems {
            tracing::debug!(error = %p, "the victim's statistics left out of its message");
        }
        // For memory the pod's own working set is the one the search read.
        if let (Some((_, _, asked)), Some(stats)) = (&memory_reads, self.victim.pods.first_mut()) {
            stats.memory = asked[victim].flatten().map(|ws| MemoryStats {
                working_set_bytes: Some(ws),
            });
        }
        let observations = signals.observations();
        let text = threshold_met_text(&self.settings.thresholds, met, &observations, resource);
        let message = eviction_message(
            resource,
            info,
            self.victim.pods.first(),
            text.as_ref().map(|(q, a)| (q.as_str(), a.as_str())),
        );
        let status = EvictionStatus::evicted(message.message.clone(), message.annotations.clone());
        let uid = info.uid.clone();
        // With grace 0 the victim's teardown starts with the kill below: the charge
        // programs come off their tracepoint meanwhile, which every page it gives back
        // would otherwise fire twice; queued here, done on the switch's own thread, so
        // the kill does not wait for it. The loop does not look again before the release
        // below, and the programs are back before it does (see `ChargeSwitch`).
        let paused = match &self.charge_switch {
            Some(switch) if grace == 0 => {
                switch.pause();
                true
            }
            _ => false,
        };
        let result = self
            .pods
            .evict(&uid, Duration::from_secs(grace.unsigned_abs()), status)
            .await;
        // Off the reaction's path now: the rest of the memory ranking, for the record.
        if let Some(reads) = memory_reads {
            self.rank_memory_for_record(reclaim, layout, &pods, reads, decision);
        }
        let (killed_at, error) = match &result {
            Ok(e) => (e.killed_at_ns, None),
            Err(e) => (None, Some(e.to_string())),
        };
        decision.decide_to_kill_ns = killed_at.map(|k| k.saturating_sub(decision.observed_at_ns));
        let waking = decision
            .wake
            .event
            .as_ref()
            .filter(|_| !decision.wake.timer);
        if let (Some(k), Some(ev)) = (killed_at, waking) {
            let lag = k.saturating_sub(ev.at_ns);
            decision.reaction_lag_ns = Some(lag);
            if let Some(m) = &self.metrics {
                m.observe_reaction_lag(ev.source, lag as f64 / 1e9);
            }
        }
        if let (Some(m), true) = (&self.metrics, result.is_ok()) {
            m.record_eviction(reclaim.signal, info.qos);
        }
        let released = self.wait_released(&pod.cgroup).await;
        if let (Some(k), true) = (killed_at, released) {
            decision.release_ns = Some(monotonic_ns().saturating_sub(k));
        }
        if let (true, Some(switch)) = (paused, &self.charge_switch) {
            if let Err(e) = switch.resume() {
                tracing::warn!(error = %e, "eBPF: charge programs not back after the eviction");
            }
        }
        decision.action = Action::Evicted {
            uid,
            pod: info.name.clone(),
            signal: reclaim.signal.name().to_string(),
            qos: info.qos.as_str().to_string(),
            grace_seconds: grace,
            message: message.message,
            annotations: message.annotations,
            released,
            error,
        };
        result.is_ok()
    }

    /// Opens the memory usage file of every running pod (and closes the ones of pods gone)
    /// as the pods change, so the bounded memory search at an eviction re-reads open files
    /// instead of opening one per pod between the kernel's event and the kill.
    pub(super) fn warm_pods(&mut self) {
        let root = self.settings.cgroup_root.trim_end_matches('/').to_string();
        let pods = self.pods.pods();
        self.observer
            .keep_pod_usage_open(pods.iter().map(|p| pod_cgroup_path(&root, p)));
    }

    /// The decision's ranking (its first `ranking_top` pods) from `order`.
    fn ranked(&self, order: &[usize], infos: &[PodInfo]) -> Vec<RankedPod> {
        let index = self.summary.index();
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
    fn rank_memory_for_record(
        &mut self,
        reclaim: &Reclaim,
        layout: FsLayout,
        pods: &[ActivePod],
        (paths, usage, asked): MemoryReads,
        decision: &mut Decision,
    ) {
        self.summary.pods.clear();
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
            self.summary.pods.push(PodStats {
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
        let order = rank(reclaim.signal, layout, &listed, &self.summary.index());
        decision.ranking = self.ranked(&order, &listed);
    }

    /// Puts the runtime's writable-layer figures into the pods' container statistics
    /// (where the observer found none), for a disk signal that charges writable layers.
    async fn add_writable_layers(&mut self) {
        let layers = self.pods.writable_layers().await;
        for pod in &mut self.summary.pods {
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

    /// Waits, bounded by `release_wait`, for the pod cgroup to hold no process (a removed
    /// cgroup counts as empty).
    async fn wait_released(&self, cgroup: &CgroupPath) -> bool {
        let deadline = tokio::time::Instant::now() + self.settings.release_wait;
        loop {
            if !self.cgroups.exists(cgroup) || self.cgroups.is_empty(cgroup).unwrap_or(false) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// A pod cgroup's path in the hierarchy, as the observer names it.
fn pod_cgroup_path(root: &str, pod: &ActivePod) -> String {
    let mut path = String::with_capacity(root.len() + 64);
    path.push_str(root);
    for name in pod.cgroup.names() {
        path.push('/');
        path.push_str(name);
    }
    path
}

/// A pod's cgroups as the observer names them (paths in the hierarchy).
fn pod_cgroup(root: &str, pod: &ActivePod) -> PodCgroup {
    PodCgroup {
        uid: pod.info.uid.clone(),
        name: pod.info.name.clone(),
        namespace: String::new(),
        cgroup: pod_cgroup_path(root, pod),
        containers: pod
            .containers
            .iter()
            .map(|c| ContainerCgroup {
                name: c.name.clone(),
                cgroup: c.cgroup.clone(),
                ephemeral_dir: None,
            })
            .collect(),
    }
}
