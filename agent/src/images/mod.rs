//! Image garbage collection through the container runtime, by the kubelet's policy.
//!
//! The kubelet's image GC manager, over CRI: records per image id (first detected, last
//! used, size, pinned) refreshed from the runtime; periodic rounds that free the image
//! filesystem from `imageGCHighThresholdPercent` down to `imageGCLowThresholdPercent`,
//! least recently used first, and drop images unused for longer than `imageMaximumGCAge`;
//! and the disk-pressure reclaim the eviction path calls before it evicts anyone.
//!
//! Unlike the kubelet, the records are checkpointed under `stateDir`
//! (`image-records.json`): a restarted agent keeps each image's first-detected and last-used
//! times, so `imageMinimumGCAge` still protects an image pulled just before the restart and
//! the LRU order survives, where the kubelet dates every image it finds at start to an
//! unknown past. Images that appeared while the agent was down are dated to the first
//! detection after the restart.
//!
//! The rules live in [`crate::decide::image_gc`]; here are the bookkeeping
//! ([`records`]), the deletions ([`delete`]), the dead-container removal before a reclaim
//! ([`containers`]), the events and counters ([`events`]), the settings ([`settings`]), the
//! manager tying them to the runtime ([`manager`]) and its loop ([`task`]).

pub(crate) mod containers;
pub mod delete;
pub mod events;
pub mod manager;
pub mod records;
pub mod settings;
pub(crate) mod task;

pub use events::{Counters, GcTrigger, ImageGcEvent};
pub use manager::{ImageGcManager, Reclaimed};
pub use records::ImageRecords;
pub use settings::{ImageGcError, ImageGcSettings};
pub use task::GcTask;
