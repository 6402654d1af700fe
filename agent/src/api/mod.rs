//! `api`: the agent's gRPC front end (`reactor.v1`, see `proto/reactor/v1/agent.proto`).
//! Thin by design: requests are converted to domain types here and answered by the library.

pub mod server;
pub mod socket;
