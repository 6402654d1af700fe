//! `record`: what the agent keeps so that a restart loses nothing — checkpoints of pods,
//! device allocations and image records today; eviction records, conditions and metrics
//! as they land.

pub mod checkpoint;
pub mod metrics;
pub mod state_file;
