//! What the client subcommands (`pod`, `status`, `events`) share: where the socket is, how to
//! dial it, and how a gRPC status becomes an exit code.

use std::path::PathBuf;

use clap::Args;
use reactor_proto::reactor_v1::agent_client::AgentClient;
use tonic::transport::Channel;

use super::Failure;

/// Where the agent listens.
#[derive(Args, Debug, Clone)]
pub(crate) struct SocketArgs {
    /// The agent's API socket (default: `apiSocket` of `--config`, else
    /// /run/reactor/reactor.sock).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// A config file to take `apiSocket` from.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

impl SocketArgs {
    fn path(&self) -> Result<PathBuf, Failure> {
        if let Some(p) = &self.socket {
            return Ok(p.clone());
        }
        Ok(super::watch::load_config(self.config.as_ref())?.api_socket)
    }

    /// Dials the agent.
    pub(crate) async fn connect(&self) -> Result<AgentClient<Channel>, Failure> {
        let path = self.path()?;
        let channel = reactor::devices::dial_unix(&path).await.map_err(|e| {
            Failure::Runtime(anyhow::anyhow!(
                "cannot reach the agent at {}: {}",
                path.display(),
                reactor::human::error_chain(&e)
            ))
        })?;
        Ok(AgentClient::new(channel)
            .max_decoding_message_size(reactor::api::server::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(reactor::api::server::MAX_MESSAGE_BYTES))
    }
}

/// A refused request: the caller's mistake (exit 2) or the agent's trouble (exit 1).
pub(crate) fn failure(s: tonic::Status) -> Failure {
    use tonic::Code;
    let msg = s.message().lines().next().unwrap_or_default().to_string();
    match s.code() {
        Code::InvalidArgument
        | Code::AlreadyExists
        | Code::NotFound
        | Code::ResourceExhausted
        | Code::FailedPrecondition => Failure::Input(msg),
        code => Failure::Runtime(anyhow::anyhow!("agent: {code:?}: {msg}")),
    }
}
