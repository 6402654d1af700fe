//! gRPC definitions the agent speaks, generated at build time from the `.proto` files under
//! `proto/` (vendored upstream files carry a provenance line).
//!
//! Generated types stay at the edge: the agent converts them to its own domain types where a
//! request enters, so the core never depends on wire shapes.
