//! What the API and the reactor loop see of the pods: [`PodView`] and the answers to apply,
//! remove and evict. The owner task builds them (`node::listing`); these types sit below the
//! manager so the manager, its handle and the API can name them without importing the
//! owner task's state.

use std::collections::BTreeMap;

use crate::act::cgroups::{CgroupPath, MemoryUsage};
use crate::act::kill::Evicted;
use crate::act::runtime::{ContainerState, ContainerStatus, PodPhase};
use crate::decide::pod::PodInfo;

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

/// The pod's phase word as the API prints it.
pub(crate) fn phase_name(phase: PodPhase) -> &'static str {
    match phase {
        PodPhase::Pending => "Pending",
        PodPhase::Running => "Running",
        PodPhase::Succeeded => "Succeeded",
        PodPhase::Failed => "Failed",
    }
}

/// A container state's word and reason as the API prints them.
pub(crate) fn container_state(c: &ContainerStatus) -> (&'static str, String) {
    match &c.state {
        ContainerState::Waiting { reason, .. } => ("waiting", reason.clone()),
        ContainerState::Running { .. } => ("running", String::new()),
        ContainerState::Terminated(t) => ("terminated", t.reason.clone()),
    }
}
