//! Listing the pods: the owner task builds each [`PodView`] from its records, the runtime's
//! statuses and the pod cgroups' memory use, ranked for `memory.available` as
//! `decide::rank` ranks. Kept apart from the view types (`node::view`), which the manager
//! and the API name, so that the types do not depend on the owner task's state.

use std::collections::BTreeMap;

use super::manager::{Actor, Entry};
use super::pod_record::PodSource;
use super::view::PodView;
use crate::act::cgroups::MemoryUsage;
use crate::act::runtime::Runtime;
use crate::decide::pod::PodInfo;

impl<R: Runtime + 'static> Actor<R> {
    pub(super) fn view(
        &self,
        e: &Entry,
        memory: Option<MemoryUsage>,
        rank: Option<u32>,
    ) -> PodView {
        PodView {
            uid: e.record.uid.clone(),
            namespace: e.record.namespace.clone(),
            name: e.record.name.clone(),
            info: e.info.clone(),
            cgroup: e.record.cgroup.clone(),
            phase: e.record.phase,
            reason: e.record.reason.clone(),
            message: e.record.message.clone(),
            containers: e.record.containers.clone(),
            oom_score_adj: e.record.oom_score_adj.clone(),
            grace_period_seconds: e.record.grace_period_seconds,
            memory,
            oom_kills: None,
            memory_rank: rank,
            is_static: matches!(e.record.source, PodSource::File { .. }),
            stopping: e.stopping || self.killing.contains(&e.record.uid),
        }
    }

    /// Refreshes every live pod's status from the runtime, reads memory use from the pod
    /// cgroups, ranks the running pods for `memory.available`.
    pub(super) async fn list(&mut self) -> Vec<PodView> {
        match self.rt.list_pods().await {
            Ok(statuses) => {
                for s in statuses {
                    let killed = self.killing.contains(&s.uid);
                    if let Some(e) = self.pods.get_mut(&s.uid) {
                        // A pod being stopped keeps its phase until the stop ends it with
                        // its reason: its containers' end is the stop's doing.
                        if !e.record.ended_by_agent && !e.stopping && !killed {
                            e.record.phase = s.phase;
                            e.record.containers = s.containers;
                        }
                    }
                }
            }
            Err(e) => tracing::warn!("runtime list_pods: {e}"),
        }
        let mut memory = BTreeMap::new();
        let mut ooms = BTreeMap::new();
        for e in self.pods.values() {
            if let (false, Some(cg)) = (e.record.ended_by_agent, &e.record.cgroup) {
                if let Ok(m) = self.cgroups.memory_usage(cg) {
                    memory.insert(e.record.uid.clone(), m);
                }
                if let Ok(n) = self.cgroups.oom_kills(cg) {
                    ooms.insert(e.record.uid.clone(), n);
                }
            }
        }
        let ranks = memory_ranks(
            self.pods
                .values()
                .filter(|e| memory.contains_key(&e.record.uid) && !e.record.is_terminal())
                .map(|e| &e.info),
            &memory,
        );
        let mut views: Vec<PodView> = self
            .pods
            .values()
            .map(|e| {
                let mut v = self.view(
                    e,
                    memory.get(&e.record.uid).copied(),
                    ranks.get(&e.record.uid).copied(),
                );
                v.oom_kills = ooms.get(&e.record.uid).copied();
                v
            })
            .collect();
        views.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        views
    }
}

/// Ranks `pods` for `memory.available` by their working sets (`decide::rank`), 1 = first.
fn memory_ranks<'a>(
    pods: impl Iterator<Item = &'a PodInfo>,
    memory: &BTreeMap<String, MemoryUsage>,
) -> BTreeMap<String, u32> {
    use crate::decide::rank::rank;
    use crate::decide::signal::{FsLayout, Signal};
    use crate::decide::summary::{MemoryStats, PodStats, StatsIndex};
    let pods: Vec<PodInfo> = pods.cloned().collect();
    let stats: Vec<PodStats> = pods
        .iter()
        .map(|p| {
            let mut s = PodStats::default();
            s.pod_ref.uid = p.uid.clone();
            s.memory = Some(MemoryStats {
                working_set_bytes: memory.get(&p.uid).map(|m| m.working_set_bytes),
            });
            s
        })
        .collect();
    let mut index = StatsIndex::default();
    for s in &stats {
        index.insert(s.pod_ref.uid.as_str(), s);
    }
    rank(Signal::MemoryAvailable, FsLayout::Shared, &pods, &index)
        .into_iter()
        .enumerate()
        .map(|(place, i)| (pods[i].uid.clone(), place as u32 + 1))
        .collect()
}
