//! What the pod manager keeps per pod, and writes to its checkpoint on every change so a
//! restarted agent knows which pods it admitted and what became of them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::act::cgroups::CgroupPath;
use crate::act::runtime::{ContainerStatus, PodPhase};

/// The checkpoint's kind tag and version.
pub const CHECKPOINT_KIND: &str = "reactor-pods";
/// Bumped when [`PodRecord`] changes incompatibly.
pub const CHECKPOINT_VERSION: u32 = 1;

/// Where a pod came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PodSource {
    /// `ApplyPod` over the API.
    Api,
    /// A static manifest file.
    File {
        /// The manifest.
        path: PathBuf,
        /// A hash of its content, so an edited manifest replaces the pod.
        hash: u32,
    },
}

/// One pod on the node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRecord {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// The v1.Pod as admitted (namespace and uid filled in).
    pub document: serde_json::Value,
    /// Where it came from.
    pub source: PodSource,
    /// The pod cgroup (empty path for a pod that was never admitted).
    pub cgroup: Option<CgroupPath>,
    /// `spec.terminationGracePeriodSeconds`.
    pub grace_period_seconds: i64,
    /// `status.phase` as last known.
    pub phase: PodPhase,
    /// `status.reason` set by the agent (`OutOfmemory`, `Preempting`, `Evicted`), or empty.
    pub reason: String,
    /// `status.message` set by the agent.
    pub message: String,
    /// Whether the agent ended the pod (rejected, preempted, evicted): then the phase is
    /// final and the runtime is not asked about it again.
    pub ended_by_agent: bool,
    /// Container states as last known.
    pub containers: Vec<ContainerStatus>,
    /// `oom_score_adj` per container, as given to the runtime.
    pub oom_score_adj: BTreeMap<String, i32>,
}

impl PodRecord {
    /// `namespace/name`.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Succeeded or Failed: no longer counted by admission or the QoS tiers.
    pub fn is_terminal(&self) -> bool {
        matches!(self.phase, PodPhase::Succeeded | PodPhase::Failed)
    }
}
