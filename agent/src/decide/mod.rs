//! `decide`: every rule the agent acts on, as pure functions over plain data.
//!
//! Nothing here reads a file, a clock or a socket: time is an argument and inputs are plain
//! values, so `reactor plan` can run the same rules offline on a JSON snapshot and tests can
//! hold them to the kubelet's behaviour without a node.

pub mod backoff;
pub mod cgroups;
pub mod crossing;
pub mod dry_run;
pub mod duration;
pub mod eviction_message;
pub mod image_gc;
pub mod inflight;
pub mod memory_qos;
pub mod memory_reclaim;
pub mod pod;
pub mod preempt;
pub mod pressure;
pub mod psi_conditions;
pub mod qos;
pub mod quantity;
pub mod quantity_text;
pub mod rank;
pub mod resources;
pub mod signal;
pub mod summary;
pub mod thresholds;
pub mod timestamp;
