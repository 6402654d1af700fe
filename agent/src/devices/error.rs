//! The device manager's errors, and the one place they become gRPC statuses for a plugin.

use std::path::PathBuf;

use super::allocate::PlanError;
use super::checkpoint::CheckpointError;
use super::types::Insufficient;

/// What went wrong in the device manager.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The registration socket could not be served.
    #[error("cannot serve device-plugin registration on {path}: {source}")]
    Serve {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The plugin's socket could not be dialed (the kubelet's wording).
    #[error("failed to dial device plugin: {0}")]
    Dial(String),
    /// The allocation rules refused.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The resource has no connected plugin (it went away, or the agent restarted and the
    /// plugin has not registered again yet).
    #[error("device plugin for {0} is not connected")]
    NotConnected(String),
    /// A plugin call failed.
    #[error("device plugin for {resource}: {call} failed: {message}")]
    Rpc {
        /// Resource.
        resource: String,
        /// The RPC.
        call: &'static str,
        /// What the plugin said.
        message: String,
    },
    /// `Allocate` answered without a container response.
    #[error("no containers return in allocation response from device plugin for {0}")]
    EmptyResponse(String),
    /// The checkpoint could not be written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

impl From<Insufficient> for DeviceError {
    fn from(e: Insufficient) -> Self {
        DeviceError::Plan(PlanError::Insufficient(e))
    }
}

impl DeviceError {
    /// The one place domain errors become gRPC statuses for a plugin.
    pub(crate) fn to_status(&self) -> tonic::Status {
        match self {
            DeviceError::Dial(_) | DeviceError::Rpc { .. } | DeviceError::NotConnected(_) => {
                tonic::Status::unavailable(self.to_string())
            }
            DeviceError::Plan(_) => tonic::Status::failed_precondition(self.to_string()),
            _ => tonic::Status::internal(self.to_string()),
        }
    }

    pub(super) fn rpc(resource: &str, call: &'static str, status: tonic::Status) -> Self {
        DeviceError::Rpc {
            resource: resource.to_string(),
            call,
            message: status.message().to_string(),
        }
    }
}
