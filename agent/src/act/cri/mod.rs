//! A client for the Container Runtime Interface (`runtime.v1`) over the runtime's unix
//! socket, as the kubelet speaks it to containerd or CRI-O.
//!
//! Why a client of our own: pod eviction and image garbage collection act through the
//! runtime, and the agent must see the runtime's answers (not found, unavailable, not
//! implemented by an older runtime) as plain values it can decide on. Wire types stay in this
//! module: `convert` turns them into the domain types re-exported here at the edge, and every
//! gRPC failure becomes one [`CriError`] that names the RPC.

mod client;
mod convert;
mod error;
mod types;

pub use client::{CriClient, Timeouts};
pub use error::CriError;
pub use types::*;
