//! memcg notifications: the memory controller's own "usage crossed X" and "OOM" signals.
//!
//! - cgroup v1 ([`v1`]): a threshold on `memory.usage_in_bytes` registered through
//!   `cgroup.event_control` with an eventfd (`"<eventfd> <fd of memory.usage_in_bytes>
//!   <bytes>"`, what the kubelet's `--kernel-memcg-notification` does), and the OOM
//!   notification (an eventfd registered against `memory.oom_control`), so OOMs are seen
//!   without eBPF. The kernel signals a threshold eventfd when usage crosses it in *either*
//!   direction, so the event carries the usage read at wake-up to tell which.
//! - cgroup v2 ([`v2`]): `memory.events` is watched with inotify (`IN_MODIFY`, which the
//!   kernel raises on every counter change) and the `low`/`high`/`max`/`oom`/`oom_kill`
//!   deltas become events. v2 has no byte thresholds; a target's threshold is checked against
//!   `memory.current` whenever `memory.events` moves.
//!
//! Where the controller is mounted is [`hierarchy`]'s; the counter files both versions read
//! are [`counters`]'. Which cgroups to watch is an input ([`MemcgTarget`], in [`thresholds`]
//! with the levels the loop moves): the reactor loop sets them from the eviction thresholds;
//! `reactor watch`/`run` from flags or the config ([`node_target`]).
//!
//! Minimum kernel: 2.6.34 for v1 thresholds, 4.5 for v2 `memory.events`.

pub mod counters;
pub mod hierarchy;
pub mod thresholds;
pub(crate) mod v1;
pub(crate) mod v2;

pub use hierarchy::{cgroup_dir, MemoryHierarchy};
pub use thresholds::MemcgThresholds;
pub use thresholds::{node_target, working_set_level, Level, MemcgTarget};
pub(crate) use v1::V1Error;
pub(crate) use v1::V1Registration;
