//! What the API and the reactor loop see of the pods: [`PodView`] and the answers to apply,
//! remove and evict, built by the owner task from its records, the runtime's statuses and
//! the pod cgroups' memory use (ranked for `memory.available` as `decide::rank` ranks).

use std::collections::BTreeMap;

use super::manager::{Actor, Entry};
use super::record::PodSource;
use crate::act::cgroups::{CgroupPath, MemoryUsage};
use crate::act::runtime::{ContainerState, ContainerStatus, PodPhase, Runtime};
use crate::decide::pod::PodInfo;
use crate::reactor::pods::Evicted;

/// A pod as the API and the reactor loop see it.
#[derive(Clone, Debug, PartialEq)]
pub struct PodView {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// The decision rules' view: QoS, requests, priority, criticality.
    pub info: PodInfo,
    /// The pod cgroup below the agent's cgroup root (none for a pod never admitted).
    pub cgroup: Option<CgroupPath>,
    /// `status.phase`.
    pub phase: PodPhase,
    /// `status.reason`.
    pub reason: String,
    /// `status.message`.
    pub message: String,
    /// Container states, in spec order.
    pub containers: Vec<ContainerStatus>,
    /// `oom_score_adj` per container.
    pub oom_score_adj: BTreeMap<String, i32>,
    /// `spec.terminationGracePeriodSeconds`.
    pub grace_period_seconds: i64,
    /// Memory use of the pod cgroup now (running pods only).
    pub memory: Option<MemoryUsage>,
    /// OOM kills counted in the pod cgroup.
    pub oom_kills: Option<u64>,
    /// Rank for `memory.available` among the running pods (1 = evicted first), by
    /// `decide::rank` over the working sets read now.
    pub memory_rank: Option<u32>,
    /// Whether the pod came from a static manifest.
    pub is_static: bool,
    /// Whether the pod is being stopped right now.
    pub stopping: bool,
}

impl PodView {
    /// `namespace/name`.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The answer to an apply.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// The pod (admitted or refused).
    pub pod: PodView,
    /// Whether it was admitted and started.
    pub admitted: bool,
    /// `namespace/name` of pods preempted for it.
    pub preempted: Vec<String>,
}

/// The answer to a removal.
#[derive(Clone, Debug, PartialEq)]
pub struct Removed {
    /// The pod as it was when it stopped.
    pub pod: PodView,
}

/// Which pod to remove.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoveTarget {
    /// By `namespace/name`.
    Name {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// By uid.
    Uid(String),
}

impl std::fmt::Display for RemoveTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoveTarget::Name { namespace, name } => write!(f, "{namespace}/{name}"),
            RemoveTarget::Uid(uid) => write!(f, "with uid {uid}"),
        }
    }
}

/// The answer to an eviction.
#[derive(Clone, Debug, PartialEq)]
pub struct EvictedPod {
    /// The pod as it ended (`Failed`, with the reason and message given).
    pub pod: PodView,
    /// The kill: when SIGKILL went to its processes (grace 0; with a grace period, when the
    /// runtime reported them stopped), how many the agent signalled and reaped.
    pub killed: Evicted,
}

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

/// The pod's phase word as the API prints it.
pub fn phase_name(phase: PodPhase) -> &'static str {
    match phase {
        PodPhase::Pending => "Pending",
        PodPhase::Running => "Running",
        PodPhase::Succeeded => "Succeeded",
        PodPhase::Failed => "Failed",
    }
}

/// A container state's word and reason as the API prints them.
pub fn container_state(c: &ContainerStatus) -> (&'static str, String) {
    match &c.state {
        ContainerState::Waiting { reason, .. } => ("waiting", reason.clone()),
        ContainerState::Running { .. } => ("running", String::new()),
        ContainerState::Terminated(t) => ("terminated", t.reason.clone()),
    }
}
