//! Pods on the node: admission, the QoS cgroup hierarchy, the runtime, static pods and the
//! state that survives a restart.
//!
//! One task owns every admitted pod and its status ([`manager`], an actor fed by a channel);
//! the API server, the static-pod watcher and the reactor loop talk to it through the
//! cloneable [`PodManager`] handle. No lock is held across a runtime call: stopping a pod
//! (which can take its whole grace period) runs in its own task and reports back to the
//! owner, so a slow stop never holds up an eviction decision or a `pod ls`.
//!
//! The order on admit is the kubelet's: validate (refuse bad input with the node unchanged),
//! check the resources ([`admit`]), let a critical pod preempt (`decide::preempt`), update the
//! QoS tiers, create the pod cgroup with `decide`'s values, and hand the pod to the runtime.
//! On removal: stop through the runtime, remove the pod cgroup, update the tiers.
//!
//! At start the node is the truth about what runs ([`recover`]): stops under way when the
//! agent died are finished, pods the runtime runs but the checkpoint lost are re-admitted
//! from the spec the runtime kept, and whatever else runs in a pod cgroup is listed as an
//! orphan and removed after `orphanGracePeriod`.

pub mod admit;
mod apply;
mod control;
pub mod document;
pub mod events;
pub mod journal;
mod listing;
pub mod manager;
mod orphans;
pub mod pod_record;
pub mod recover;
mod runtime_view;
pub mod settings;
pub mod static_pods;
mod stop;
pub(crate) mod view;

pub use events::{notices_to, EventHub, NodeEvent, NodeEventKind};
pub use manager::{PodManager, Removed};
pub use manager::{PodView, RemoveTarget};
pub use settings::NodePlan;

use crate::act::cgroups::CgroupError;
use crate::act::runtime::RuntimeError;
use crate::record::checkpoint::CheckpointError;

/// Why a pod operation failed. The API maps each variant to one gRPC code
/// (`api::server::status`), so a client can tell its own mistake from the node's trouble.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The document or request is wrong (bad quantity, missing name, unknown runtime).
    #[error("{0}")]
    Invalid(String),
    /// The document is larger than [`document::MAX_DOCUMENT_BYTES`]; refused unread.
    #[error("pod document is {size} bytes, over the {limit}-byte limit")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A pod with this uid or namespace/name is on the node already.
    #[error("{0}")]
    AlreadyExists(String),
    /// No such pod.
    #[error("no pod {0} on this node")]
    NotFound(String),
    /// The pod is being stopped already.
    #[error("pod {0} is being stopped")]
    Stopping(String),
    /// The runtime failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A cgroup could not be written.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// The pod checkpoint could not be written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The pod manager has stopped (the agent is shutting down).
    #[error("the pod manager is not running")]
    Stopped,
}
