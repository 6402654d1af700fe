//! The pods seam: what the reactor loop needs from whatever manages pods on the node.
//!
//! The loop ranks and evicts pods but does not own them: the node's pod manager (admission,
//! API, status) does. [`PodControl`] is the narrow interface between the two — list the
//! active pods with their cgroups, and evict one with a grace period and the status the pod
//! must end in. [`super::RuntimePods`] (`runtime_pods.rs`) implements it directly over a
//! runtime and the cgroup writer, for nodes (and tests) without a pod manager.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::act::cgroups::{CgroupError, CgroupPath};
use crate::act::runtime::{RestartPolicy, RuntimeError};
use crate::decide::pod::PodInfo;
use crate::decide::summary::FsStats;
use crate::observe::{ContainerCgroup, PodCgroup};

/// What an eviction's kill did: the port's answer, made by [`crate::act::kill`].
pub use crate::act::kill::Evicted;

/// A pod that runs on the node now, as the loop ranks and evicts it.
#[derive(Clone, Debug, PartialEq)]
pub struct ActivePod {
    /// What ranking and the eviction message need (uid, name, QoS, priority, requests).
    pub info: PodInfo,
    /// The pod cgroup, relative to `cgroupRoot` (`kubepods/besteffort/pod<uid>`).
    pub cgroup: CgroupPath,
    /// The containers and their cgroups below the pod cgroup, to read per-container stats
    /// and to map an OOM kill to a container.
    pub containers: Vec<PodContainer>,
    /// `spec.restartPolicy`, to record whether an OOM-killed container comes back.
    pub restart_policy: RestartPolicy,
    /// `spec.terminationGracePeriodSeconds`, which caps a soft eviction's grace period.
    pub termination_grace_period: Option<i64>,
}

/// The running pods as the loop reads them: shared, so handing them to the loop on every
/// decision is a reference count, not a copy of every pod.
pub type ActivePods = Arc<[ActivePod]>;

/// A container of an active pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodContainer {
    /// The container's name in the pod spec: what messages and records say.
    pub name: String,
    /// Its cgroup's directory name below the pod cgroup: the name itself for the process
    /// runtime, the container id for a CRI runtime (which changes when it restarts).
    pub cgroup: String,
}

impl PodContainer {
    /// A container whose cgroup is named after it (the process runtime's layout).
    pub fn named(name: &str) -> PodContainer {
        PodContainer {
            name: name.to_string(),
            cgroup: name.to_string(),
        }
    }
}

/// The status an evicted pod ends in (the kubelet's `Failed` / `Evicted` with its message).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EvictionStatus {
    /// `status.phase`: always `Failed`.
    pub phase: String,
    /// `status.reason`: always `Evicted`.
    pub reason: String,
    /// `status.message`: the kubelet's eviction message.
    pub message: String,
    /// The event annotations (`offending_containers`, `starved_resource`, ...).
    pub annotations: BTreeMap<String, String>,
}

impl EvictionStatus {
    /// `Failed` / `Evicted` with `message`.
    pub(crate) fn evicted(
        message: String,
        annotations: BTreeMap<String, String>,
    ) -> EvictionStatus {
        EvictionStatus {
            phase: "Failed".to_string(),
            reason: "Evicted".to_string(),
            message,
            annotations,
        }
    }
}

/// Why an eviction failed.
#[derive(Debug, thiserror::Error)]
pub enum EvictError {
    /// The runtime refused or failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A cgroup could not be read or removed.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
}

/// The pod manager as the reactor loop sees it. Implemented by the node's pod manager, and
/// by [`super::RuntimePods`] where there is none.
pub trait PodControl: Send + Sync {
    /// The pods running now (admitted, not terminated), with their cgroups.
    fn pods(&self) -> ActivePods;

    /// The eviction's SIGKILL for grace 0, synchronous, from the caller: every process of
    /// running pod `uid` is killed now (after the runtime is told not to restart them), and
    /// what was killed, with the kill time, is returned; `None` when the pod is not running
    /// here. The loop calls it before [`PodControl::evict`] (with the result), so the kill and
    /// its record are made on the loop's own task and the rest of the stop runs off it. It
    /// needs no status: the eviction's message is composed after the kill, off the
    /// reaction's path (from the victim's figures read just before it), and told with
    /// [`PodControl::note_eviction`].
    /// Default: `None` (the stop kills).
    fn kill_now(&self, uid: &str) -> Option<Evicted> {
        let _ = uid;
        None
    }

    /// The status of the eviction the loop has just begun, told as soon as it is composed
    /// (before [`PodControl::evict`], and before the decision goes out), for what must
    /// outlive the agent itself: the node's kill journal. A graceful eviction is told too:
    /// an agent killed before the pod manager wrote the stop ahead would otherwise forget an
    /// eviction its event stream had announced, and evict the pod again after its restart,
    /// with a new grace. Default: nothing.
    fn note_eviction(&self, uid: &str, status: &EvictionStatus) {
        let _ = (uid, status);
    }

    /// Hard before soft: SIGKILL now to every process in `cgroup` (pod `uid`'s), whose
    /// graceful eviction is under way. The runtime was told to stop already (so nothing
    /// restarts what dies), and the stop under way then ends at once. Synchronous, from the
    /// loop's task, like [`PodControl::kill_now`]; the kill is [`crate::act::kill`]'s.
    fn escalate(&self, uid: &str, cgroup: &CgroupPath) -> Evicted;

    /// Stops the pod `uid` — SIGKILL at once when `grace` is zero, SIGTERM then SIGKILL after
    /// `grace` otherwise — and sets its status to `status`. `killed` is the kill
    /// [`PodControl::kill_now`] made already (the stop then does not kill again, and reports
    /// that kill). Returns once the runtime has stopped the containers; the loop runs it on
    /// a task of its own and never awaits it.
    fn evict(
        &self,
        uid: &str,
        grace: Duration,
        status: EvictionStatus,
        killed: Option<Evicted>,
    ) -> impl Future<Output = Result<Evicted, EvictError>> + Send;

    /// A feed that changes whenever the running pods do, where the implementation has one:
    /// the loop then prepares its reads of new pods ahead of any eviction. Default: none.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<ActivePods>> {
        None
    }

    /// What the pods' containers have written to their writable layers, by pod uid, then by
    /// container name, where the runtime measures it: disk-pressure ranking charges it to the pod (seed 003). Asked only on disk
    /// pressure. Default: nothing known.
    fn writable_layers(
        &self,
    ) -> impl Future<Output = BTreeMap<String, BTreeMap<String, FsStats>>> + Send {
        std::future::ready(BTreeMap::new())
    }
}

/// Asks `fetch` for each pod's writable layers and keeps the pods it knows something about;
/// a pod the runtime cannot measure is left out of the disk figures (ranked as a pod without
/// statistics) and logged at debug.
pub(crate) async fn writable_layers_of<F, Fut>(
    uids: Vec<String>,
    fetch: F,
) -> BTreeMap<String, BTreeMap<String, FsStats>>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<BTreeMap<String, FsStats>, RuntimeError>>,
{
    let mut out = BTreeMap::new();
    for uid in uids {
        match fetch(uid.clone()).await {
            Ok(layers) if !layers.is_empty() => {
                out.insert(uid, layers);
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(%uid, error = %e, "writable layer statistics"),
        }
    }
    out
}

impl ActivePod {
    /// The pod's cgroups as the observer names them: paths in the hierarchy below `root`
    /// (the cgroup root, no trailing `/`).
    pub fn cgroups(&self, root: &str) -> PodCgroup {
        PodCgroup {
            uid: self.info.uid.clone(),
            name: self.info.name.clone(),
            namespace: String::new(),
            cgroup: pod_cgroup_path(root, self),
            containers: self
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
}

/// A pod cgroup's path in the hierarchy, as the observer names it.
pub(crate) fn pod_cgroup_path(root: &str, pod: &ActivePod) -> String {
    let mut path = String::with_capacity(root.len() + 64);
    path.push_str(root);
    for name in pod.cgroup.names() {
        path.push('/');
        path.push_str(name);
    }
    path
}
