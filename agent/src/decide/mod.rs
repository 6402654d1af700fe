//! `decide`: every rule the agent acts on, as pure functions over plain data.
//!
//! Nothing here reads a file, a clock or a socket: time is an argument and inputs are plain
//! values, so `reactor plan` can run the same rules offline on a JSON snapshot and tests can
//! hold them to the kubelet's behaviour without a node.

pub mod backoff;
pub mod cgroups;
pub(crate) mod crossing;
pub(crate) mod dry_run;
pub mod duration;
pub(crate) mod eviction_message;
pub mod image_gc;
pub mod inflight;
pub mod memory_qos;
pub(crate) mod memory_reclaim;
pub mod oom_score;
pub mod pod;
pub mod preempt;
pub mod pressure;
pub mod psi_conditions;
pub mod qos;
pub mod quantity;
pub(crate) mod quantity_text;
pub mod rank;
pub mod resources;
pub mod signal;
pub mod summary;
pub mod thresholds;
pub(crate) mod timestamp;

/// `text` with its control characters escaped (`\n`, `\r`, `\u{1b}`) and the rest as
/// written: how a refusal quotes a key or value from the input, which may hold anything, and
/// still stays on one line. Used by the config, pod-document and plan-input errors.
pub(crate) fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}
