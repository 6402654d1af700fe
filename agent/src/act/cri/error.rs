//! One error for every CRI call, naming the RPC, so a log line says which call failed and the
//! caller can tell "the runtime is down" from "that pod is already gone" from "this runtime is
//! too old for that call".

use std::time::Duration;

/// Why a CRI call failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CriError {
    /// The endpoint is not a `unix://` path the client can dial.
    #[error("invalid CRI endpoint {endpoint:?}: {why}")]
    Endpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        why: String,
    },
    /// The runtime is not listening (socket missing, connection refused, or closed).
    #[error("{rpc}: container runtime unavailable: {message}")]
    Unavailable {
        /// The RPC that was attempted.
        rpc: &'static str,
        /// What the transport said.
        message: String,
    },
    /// The call did not finish within the client's request timeout.
    #[error("{rpc}: no answer from the container runtime within {after:?}")]
    Timeout {
        /// The RPC that was attempted.
        rpc: &'static str,
        /// The timeout that expired.
        after: Duration,
    },
    /// The pod, container or image does not exist.
    #[error("{rpc}: not found: {message}")]
    NotFound {
        /// The RPC that was attempted.
        rpc: &'static str,
        /// The runtime's message.
        message: String,
    },
    /// The runtime does not implement this RPC (an older runtime, e.g. containerd 1.6 for
    /// RPCs added after it): callers fall back instead of failing.
    #[error("{rpc}: not implemented by this container runtime: {message}")]
    Unimplemented {
        /// The RPC that was attempted.
        rpc: &'static str,
        /// The runtime's message.
        message: String,
    },
    /// The request was refused as invalid, by the runtime or before sending it.
    #[error("{rpc}: invalid request: {message}")]
    InvalidArgument {
        /// The RPC that was attempted.
        rpc: &'static str,
        /// What is invalid.
        message: String,
    },
    /// The runtime answered without a field the call needs.
    #[error("{rpc}: incomplete answer from the container runtime: {what}")]
    BadResponse {
        /// The RPC that was answered.
        rpc: &'static str,
        /// What is missing or malformed.
        what: String,
    },
    /// Any other gRPC failure (`Internal`, `Unknown`, …).
    #[error("{rpc}: {code}: {message}")]
    Other {
        /// The RPC that was attempted.
        rpc: &'static str,
        /// The gRPC status code's name.
        code: String,
        /// The runtime's message.
        message: String,
    },
}

/// Whether the status came from the connection rather than from the runtime's answer.
fn transport_failure(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if e.is::<tonic::transport::Error>() || e.is::<std::io::Error>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// The status message followed by its causes, so "transport error" says what broke.
fn error_chain(status: &tonic::Status) -> String {
    let mut out = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        let text = e.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = e.source();
    }
    out
}

impl CriError {
    /// Maps a gRPC status from `rpc` to the error the agent decides on.
    pub(crate) fn from_status(rpc: &'static str, status: &tonic::Status) -> CriError {
        let message = status.message().to_string();
        match status.code() {
            tonic::Code::Unavailable => CriError::Unavailable { rpc, message },
            // A connection that broke under a call (the runtime exited) surfaces from tonic as
            // `Unknown: transport error`; for the agent that is the runtime being down.
            tonic::Code::Unknown if transport_failure(status) => CriError::Unavailable {
                rpc,
                message: error_chain(status),
            },
            tonic::Code::NotFound => CriError::NotFound { rpc, message },
            tonic::Code::Unimplemented => CriError::Unimplemented { rpc, message },
            tonic::Code::InvalidArgument => CriError::InvalidArgument { rpc, message },
            code => CriError::Other {
                rpc,
                code: format!("{code:?}"),
                message,
            },
        }
    }

    /// The RPC the error came from, if it came from one.
    pub fn rpc(&self) -> Option<&'static str> {
        match self {
            CriError::Endpoint { .. } => None,
            CriError::Unavailable { rpc, .. }
            | CriError::Timeout { rpc, .. }
            | CriError::NotFound { rpc, .. }
            | CriError::Unimplemented { rpc, .. }
            | CriError::InvalidArgument { rpc, .. }
            | CriError::BadResponse { rpc, .. }
            | CriError::Other { rpc, .. } => Some(rpc),
        }
    }

    /// Whether the runtime could not be reached at all (down, or hung), as opposed to
    /// answering with an error: the agent then retries later rather than giving up on a pod.
    pub fn is_runtime_down(&self) -> bool {
        matches!(
            self,
            CriError::Unavailable { .. } | CriError::Timeout { .. }
        )
    }

    /// Whether the thing asked about does not exist: for stop/remove this means "done".
    pub fn is_not_found(&self) -> bool {
        matches!(self, CriError::NotFound { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_map_to_kinds_and_keep_the_rpc() {
        let e = CriError::from_status("StopPodSandbox", &tonic::Status::unavailable("gone"));
        assert!(e.is_runtime_down());
        assert_eq!(e.rpc(), Some("StopPodSandbox"));
        assert_eq!(
            e.to_string(),
            "StopPodSandbox: container runtime unavailable: gone"
        );
        let e = CriError::from_status("RuntimeConfig", &tonic::Status::unimplemented("no"));
        assert!(matches!(e, CriError::Unimplemented { .. }) && !e.is_runtime_down());
        let e = CriError::from_status("RemoveImage", &tonic::Status::not_found("x"));
        assert!(e.is_not_found());
        let e = CriError::from_status("Version", &tonic::Status::internal("boom"));
        assert_eq!(e.to_string(), "Version: Internal: boom");
        let broken = tonic::Status::from_error(Box::new(std::io::Error::from(
            std::io::ErrorKind::BrokenPipe,
        )));
        assert_eq!(broken.code(), tonic::Code::Unknown);
        let e = CriError::from_status("ListContainers", &broken);
        assert!(e.is_runtime_down(), "{e}");
        let plain_unknown = tonic::Status::unknown("runtime said so");
        assert!(!CriError::from_status("Version", &plain_unknown).is_runtime_down());
    }
}
