//! What the pod manager keeps per pod, and writes to its checkpoint on every change so a
//! restarted agent knows which pods it admitted and what became of them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::act::cgroups::CgroupPath;
use crate::act::runtime::{ContainerState, ContainerStatus, PodPhase, Terminated};

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
    /// A stop under way (eviction, removal, preemption), written before the stop begins so
    /// an agent killed halfway finishes it after the restart instead of starting the pod
    /// again — an eviction is never undone nor done twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopping: Option<StopIntent>,
    /// Set for a pod found running on the node with no spec to re-admit it from
    /// (`node::recover`): it is listed, ranked and evicted like any pod, and removed when
    /// its grace period ends unless a pod with its uid or name is applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orphan: Option<Orphan>,
}

/// What a stop under way will leave behind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StopIntent {
    /// The pod ends `Failed` with this reason and message (eviction).
    Evict {
        /// `status.reason`.
        reason: String,
        /// `status.message`.
        message: String,
    },
    /// The pod ends `Failed`, preempted for a critical pod.
    Preempt {
        /// The critical pod's uid.
        preemptor: String,
    },
    /// The pod leaves the node.
    Remove {
        /// Why (`api`, `static-manifest-removed`, `orphan-grace-period`).
        cause: String,
    },
}

/// How an orphan was found and when it goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Orphan {
    /// Where it was found (`cgroup /kubepods/besteffort/pod<uid>`, `process runtime`).
    pub found_in: String,
    /// When its grace period ends, Unix seconds.
    pub remove_at_unix: u64,
}

impl PodRecord {
    /// Ends every container the record still has running, once the pod's processes were
    /// killed with no word from the runtime (it had forgotten the pod, or was down): as the
    /// kubelet says of a container it cannot find, `ContainerStatusUnknown`, exit code 137.
    /// Nothing refreshes an ended pod's containers afterwards, so without this `pod ls`
    /// showed an evicted pod's container running for good.
    pub(crate) fn end_unknown_containers(&mut self) {
        let now = std::time::SystemTime::now();
        for c in &mut self.containers {
            if let ContainerState::Running { started_at, .. } = c.state {
                c.state = ContainerState::Terminated(Terminated {
                    exit_code: 137,
                    signal: Some(9),
                    reason: "ContainerStatusUnknown".into(),
                    message: "ended while the runtime could not say".into(),
                    started_at,
                    finished_at: now,
                });
            }
        }
    }

    /// `namespace/name`.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Succeeded or Failed: no longer counted by admission or the QoS tiers.
    pub fn is_terminal(&self) -> bool {
        matches!(self.phase, PodPhase::Succeeded | PodPhase::Failed)
    }
}
