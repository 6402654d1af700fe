//! The `Runtime` seam: what the agent asks of whatever runs its pods' containers.
//!
//! Why a trait: the agent runs pods through CRI (containerd, CRI-O) where a node has one, and
//! through the local [process runtime](super::process) where it has none; eviction,
//! preemption and the API must not care which. The trait speaks the agent's own types, not
//! CRI's wire types — the CRI implementation converts at its edge.
//!
//! The split of work with the caller (the pod lifecycle): the caller admits the pod,
//! creates the pod cgroup `kubepods[/qos]/pod<uid>` and writes its values; the runtime
//! creates one cgroup per container below it (named after the container), writes the
//! container's values, starts, supervises, restarts and stops the containers, and removes
//! the container cgroups on stop. The caller removes the pod cgroup afterwards.
//!
//! The methods return `impl Future + Send` rather than being `async fn` so implementations
//! can be driven from any tokio task.

use std::future::Future;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::cgroups::{CgroupError, CgroupPath, Resources};
use crate::record::checkpoint::CheckpointError;

/// `spec.restartPolicy`: what to do when a container exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum RestartPolicy {
    /// Restart whatever the exit (the default, as in Kubernetes).
    #[default]
    Always,
    /// Restart only after a non-zero exit (an OOM kill included).
    OnFailure,
    /// Never restart.
    Never,
}

impl RestartPolicy {
    /// Whether a container that ended with `exit_code` is started again.
    pub(crate) fn restarts(self, exit_code: i32) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Never => false,
        }
    }
}

/// A device node a device plugin allocated to a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Its path inside the container.
    pub container_path: String,
    /// Its path on the host.
    pub host_path: String,
    /// cgroup device permissions: some of `r`, `w`, `m`.
    pub permissions: String,
}

/// A host path a device plugin allocated to a container, bind-mounted into it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BindMount {
    /// Where it appears inside the container.
    pub container_path: String,
    /// What is mounted, on the host.
    pub host_path: String,
    /// Whether the container may only read it.
    pub read_only: bool,
}

/// One container, as the runtime needs it: already resolved from the pod spec (env merged
/// with device allocations, cgroup values and `oom_score_adj` computed by `decide`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ContainerSpec {
    /// `spec.containers[].name`; also the name of its cgroup below the pod's.
    pub name: String,
    /// The image (CRI pulls and runs it; the process runtime has no images and ignores it).
    pub image: String,
    /// `command` (the entrypoint); the process runtime requires it.
    pub command: Vec<String>,
    /// `args`, appended to `command`.
    pub args: Vec<String>,
    /// Environment, in order: device plugins' allocations, then the pod spec's `env`; a
    /// later entry wins.
    pub env: Vec<(String, String)>,
    /// The container cgroup's values.
    pub resources: Resources,
    /// The kernel OOM killer's bias for this container's processes (-1000..=1000).
    pub oom_score_adj: i32,
    /// Device nodes from device plugins' allocations. Only a container runtime can create
    /// device nodes in a container's own `/dev`; the process runtime's processes see the
    /// host's `/dev` and ignore this.
    #[serde(default)]
    pub devices: Vec<DeviceNode>,
    /// Bind mounts from device plugins' allocations; the process runtime has no mount
    /// namespace per container and ignores them.
    #[serde(default)]
    pub mounts: Vec<BindMount>,
    /// Annotations from device plugins' allocations, passed to the container runtime (CDI
    /// and runtime hooks read them); the process runtime ignores them.
    #[serde(default)]
    pub annotations: Vec<(String, String)>,
    /// An init container (`spec.initContainers`, not a sidecar). Init containers come first
    /// in [`PodSpec::containers`], in the order they run; each must exit 0 before the next
    /// one and the app containers start (a failed one is restarted unless the pod's
    /// `restartPolicy` is `Never`, which fails the pod). The process runtime runs them; the
    /// CRI runtime refuses them for now.
    #[serde(default)]
    pub init: bool,
}

/// One pod to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    /// `metadata.uid`: the key everything else uses.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// The pod cgroup the caller created (`kubepods[/qos]/pod<uid>`).
    pub cgroup: CgroupPath,
    /// `spec.restartPolicy`.
    pub restart_policy: RestartPolicy,
    /// `spec.containers`, started in order.
    pub containers: Vec<ContainerSpec>,
    /// The `v1.Pod` as the pod manager admitted it, kept with the runtime's own state (the
    /// process runtime's checkpoint, the CRI sandbox's annotation) so the pod can be
    /// re-admitted from the node itself when the pod checkpoint is lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document: Option<serde_json::Value>,
}

/// Why a runtime refuses a container by its own rule (an image for CRI, a command for
/// processes): one line naming the container, which [`PodSpec::validate`] makes the pod's
/// `InvalidPod` reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ContainerRefused(pub String);

impl PodSpec {
    /// The checks every runtime makes before it touches the node — a uid, container names
    /// that are set and unique, `oom_score_adj` in the kernel's range — plus `container`, the
    /// runtime's own rule for each container (an image for CRI, a command for processes).
    /// The error is the runtime's `InvalidPod` with one line naming what is wrong.
    pub fn validate(
        &self,
        container: impl Fn(&ContainerSpec) -> Result<(), ContainerRefused>,
    ) -> Result<(), RuntimeError> {
        let invalid = |reason: String| RuntimeError::InvalidPod {
            pod: self.full_name(),
            reason,
        };
        if self.uid.is_empty() {
            return Err(invalid("metadata.uid is empty".into()));
        }
        let init = self.init_count();
        if self.containers[init..].iter().any(|c| c.init) {
            return Err(invalid(
                "init containers must come before the app containers".into(),
            ));
        }
        if init > 0 && init == self.containers.len() {
            return Err(invalid("init containers but no app containers".into()));
        }
        let mut names = std::collections::BTreeSet::new();
        for c in &self.containers {
            if c.name.is_empty() || !names.insert(&c.name) {
                return Err(invalid(format!(
                    "container name {:?} is empty or used twice",
                    c.name
                )));
            }
            container(c).map_err(|e| invalid(e.0))?;
            if !(-1000..=1000).contains(&c.oom_score_adj) {
                return Err(invalid(format!(
                    "container {:?}: oom_score_adj {} is outside -1000..=1000",
                    c.name, c.oom_score_adj
                )));
            }
        }
        Ok(())
    }

    /// How many init containers lead [`Self::containers`].
    pub(crate) fn init_count(&self) -> usize {
        self.containers.iter().take_while(|c| c.init).count()
    }

    /// `namespace/name`, as pods are named in output.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// How a container run ended (the kubelet's `ContainerStateTerminated`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Terminated {
    /// The exit code; `128 + n` after signal `n`, as container runtimes report it.
    pub exit_code: i32,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
    /// `Completed`, `Error`, `OOMKilled`, or `ContainerStatusUnknown` when the process ended
    /// while the agent was not watching and its status could not be read.
    pub reason: String,
    /// Details for people (why a start failed); empty otherwise.
    pub message: String,
    /// When this run started.
    pub started_at: SystemTime,
    /// When it ended (as observed).
    pub finished_at: SystemTime,
}

/// A container's current state (the kubelet's `ContainerState`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ContainerState {
    /// Not running: being created, or waiting out a back-off.
    Waiting {
        /// `ContainerCreating`, `CrashLoopBackOff`, `RunContainerError`.
        reason: String,
        /// Details for people.
        message: String,
    },
    /// Running.
    Running {
        /// The container's main process.
        pid: u32,
        /// When this run started.
        started_at: SystemTime,
    },
    /// Ended and not (yet) restarted.
    Terminated(Terminated),
}

/// One container's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    /// The container's name.
    pub name: String,
    /// Its state now.
    pub state: ContainerState,
    /// How many times it was restarted.
    pub restart_count: u32,
    /// How the previous run ended.
    pub last_termination: Option<Terminated>,
}

/// `status.phase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PodPhase {
    /// Accepted, containers not yet started.
    Pending,
    /// At least one container is running or will be restarted.
    Running,
    /// Every container ended with exit code 0 and none will restart.
    Succeeded,
    /// Every container ended, at least one in failure, and none will restart.
    Failed,
}

/// A container ended on its own (not stopped by the agent): what `record` turns into an
/// event — an OOM kill (`reason == "OOMKilled"`), a crash, a completion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerExit {
    /// The pod's uid.
    pub uid: String,
    /// `namespace/name`.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// The container cgroup the run was in (where an OOM kill was counted).
    pub cgroup: CgroupPath,
    /// How the run ended.
    pub terminated: Terminated,
    /// Whether the restart policy starts it again.
    pub restarting: bool,
}

/// A pod's status as the runtime sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// The pod cgroup.
    pub cgroup: CgroupPath,
    /// The phase derived from the containers.
    pub phase: PodPhase,
    /// Per container, in spec order.
    pub containers: Vec<ContainerStatus>,
}

/// The pod phase the kubelet derives from container states and the restart policy.
pub(crate) fn pod_phase(containers: &[ContainerStatus]) -> PodPhase {
    let mut all_terminated = true;
    let mut any_failed = false;
    let mut any_started = false;
    for c in containers {
        match &c.state {
            ContainerState::Terminated(t) => {
                any_started = true;
                any_failed |= t.exit_code != 0;
            }
            ContainerState::Running { .. } => {
                any_started = true;
                all_terminated = false;
            }
            ContainerState::Waiting { .. } => {
                any_started |= c.restart_count > 0 || c.last_termination.is_some();
                all_terminated = false;
            }
        }
    }
    if all_terminated && !containers.is_empty() {
        // A container that will restart is Waiting, never Terminated, so all-terminated
        // means no restarts are coming, whatever the policy.
        if any_failed {
            PodPhase::Failed
        } else {
            PodPhase::Succeeded
        }
    } else if any_started {
        PodPhase::Running
    } else {
        PodPhase::Pending
    }
}

/// Why a runtime call failed. The API maps these to gRPC codes in one place:
/// `NotFound`, `AlreadyExists`, `InvalidArgument` (`InvalidPod`), `Unavailable`, `Internal`
/// (`Cri` among others).
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// No pod with this uid.
    #[error("pod {uid} is not known to the runtime")]
    NotFound {
        /// The uid asked for.
        uid: String,
    },
    /// A pod with this uid runs already.
    #[error("pod {uid} ({name}) is already running")]
    AlreadyExists {
        /// The uid.
        uid: String,
        /// `namespace/name`.
        name: String,
    },
    /// The pod cannot be run by this runtime as specified.
    #[error("pod {pod}: {reason}")]
    InvalidPod {
        /// `namespace/name`.
        pod: String,
        /// What is wrong.
        reason: String,
    },
    /// A cgroup operation failed.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// The runtime's state could not be saved or read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A system call on a process failed.
    #[error("{what}: {source}")]
    Io {
        /// What the runtime was doing.
        what: String,
        /// The kernel's error.
        source: std::io::Error,
    },
    /// The container runtime answered a call with an error (CRI runtime only; a runtime
    /// that cannot be reached is [`RuntimeError::Unavailable`] instead).
    #[error("container runtime: {0}")]
    Cri(#[from] super::cri::CriError),
    /// The runtime itself cannot be reached (CRI endpoint down).
    #[error("runtime unavailable: {reason}")]
    Unavailable {
        /// Why.
        reason: String,
    },
}

/// What runs pods: CRI or the local process runtime.
pub trait Runtime: Send + Sync {
    /// Creates the container cgroups, writes their values and starts every container of
    /// `pod`; returns once all are started (or waiting in back-off). Supervision (restarts
    /// by the restart policy with the kubelet's back-off, exit codes, OOM kills) continues
    /// in the background.
    fn run_pod(&self, pod: PodSpec) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Stops every container of the pod — SIGTERM to each container's processes, SIGKILL
    /// after `grace` (zero: SIGKILL at once) — waits until the container cgroups are empty,
    /// removes them and forgets the pod. Returns the pod's final status.
    fn stop_pod(
        &self,
        uid: &str,
        grace: Duration,
    ) -> impl Future<Output = Result<PodStatus, RuntimeError>> + Send;

    /// Fences pod `uid`, synchronously: from this moment none of its containers is started
    /// again, whatever its restart policy, and a later [`Runtime::stop_pod`] finishes the
    /// stop. The first step of a stop, taken on its own by an eviction that SIGKILLs the
    /// pod's processes itself (the reactor loop's kill, `node::manager`): the kill must not
    /// wait for anything the runtime awaits, and what it kills must not come back. A pod
    /// the runtime does not know is left alone. Default: nothing to fence (a runtime that
    /// restarts nothing on its own).
    fn fence(&self, uid: &str) {
        let _ = uid;
    }

    /// The running container processes of pod `uid` the runtime holds pidfds for (its own
    /// children), each with a pidfd of its own: the eviction's kill signals these first,
    /// before it lists the pod cgroup for any others, so the containers' main processes die
    /// without waiting for a cgroupfs walk. Default: none known (the runtime's processes are
    /// another daemon's children, CRI), and the walk finds them all.
    fn known_processes(&self, uid: &str) -> Vec<crate::act::kill::KnownProcess> {
        let _ = uid;
        Vec::new()
    }

    /// The pod's status now.
    fn pod_status(&self, uid: &str)
        -> impl Future<Output = Result<PodStatus, RuntimeError>> + Send;

    /// Every pod the runtime runs, including those re-adopted after an agent restart.
    fn list_pods(&self) -> impl Future<Output = Result<Vec<PodStatus>, RuntimeError>> + Send;

    /// What each running container of pod `uid` has written to its writable layer, keyed
    /// by container name, where the runtime measures it
    /// (CRI `ContainerStats.writable_layer`). Eviction ranks pods by it under disk pressure
    /// on the filesystem holding the writable layers (seed 003). A runtime that does not
    /// measure it reports nothing, and its pods are ranked on their requests alone.
    fn writable_layers(
        &self,
        uid: &str,
    ) -> impl Future<
        Output = Result<
            std::collections::BTreeMap<String, crate::decide::summary::FsStats>,
            RuntimeError,
        >,
    > + Send {
        let _ = uid;
        std::future::ready(Ok(std::collections::BTreeMap::new()))
    }

    /// The `v1.Pod` pod `uid` was run with ([`PodSpec::document`]), when the runtime has it:
    /// how the pod manager re-admits a pod it lost (a damaged checkpoint) that still runs.
    fn pod_document(&self, uid: &str) -> Option<serde_json::Value> {
        let _ = uid;
        None
    }

    /// Each running container of pod `uid` by name, with its cgroup's directory name below
    /// the pod cgroup, for a runtime that does not name container cgroups after the
    /// containers (CRI: by container id). `None`: the cgroups are the container names.
    fn container_cgroups(&self, uid: &str) -> Option<std::collections::BTreeMap<String, String>> {
        let _ = uid;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(code: i32) -> ContainerState {
        ContainerState::Terminated(Terminated {
            exit_code: code,
            signal: None,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            message: String::new(),
            started_at: SystemTime::UNIX_EPOCH,
            finished_at: SystemTime::UNIX_EPOCH,
        })
    }

    fn status(state: ContainerState, restarts: u32) -> ContainerStatus {
        ContainerStatus {
            name: "c".into(),
            state,
            restart_count: restarts,
            last_termination: None,
        }
    }

    #[test]
    fn phases() {
        assert_eq!(
            pod_phase(&[status(term(0), 0), status(term(0), 0)]),
            PodPhase::Succeeded
        );
        assert_eq!(
            pod_phase(&[status(term(0), 0), status(term(2), 0)]),
            PodPhase::Failed
        );
        let waiting = ContainerState::Waiting {
            reason: "ContainerCreating".into(),
            message: String::new(),
        };
        assert_eq!(pod_phase(&[status(waiting.clone(), 0)]), PodPhase::Pending);
        assert_eq!(pod_phase(&[status(waiting, 3)]), PodPhase::Running);
        let running = ContainerState::Running {
            pid: 1,
            started_at: SystemTime::UNIX_EPOCH,
        };
        assert_eq!(
            pod_phase(&[status(running, 0), status(term(1), 0)]),
            PodPhase::Running
        );
    }

    #[test]
    fn restart_policy() {
        assert!(RestartPolicy::Always.restarts(0));
        assert!(!RestartPolicy::OnFailure.restarts(0));
        assert!(RestartPolicy::OnFailure.restarts(137));
        assert!(!RestartPolicy::Never.restarts(1));
    }
}
