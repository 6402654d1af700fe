//! `sense`: every way the kernel tells us about memory pressure, turned into one stream of
//! [`PressureEvent`]s.
//!
//! Each source runs as its own tokio task and sends into one channel, so the reactor loop
//! has a single place to wake from whatever the node offers (eBPF, PSI, memcg notification,
//! or the polling fallback). The event carries the kernel's own timestamp where the kernel
//! gives one, so the detection lag (`now - at_ns` when the reactor takes the event) is a
//! measured figure rather than an estimate.
//!
//! [`Sense::start`] attaches whatever the options switch on, says what attached and why
//! anything did not, and runs on what is left; [`Sense::next`] hands out events with their lag
//! and keeps the per-source lag histograms ([`lag`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), reactor::sense::SenseError> {
//! use reactor::config::Config;
//! use reactor::sense::{MemcgTarget, Sense, SenseOptions};
//!
//! let target = MemcgTarget { cgroup: "/kubepods".into(), threshold_bytes: Some(30 << 30) };
//! let mut sense = Sense::start(&SenseOptions::from_config(&Config::default(), vec![target]))?;
//! while let Some(r) = sense.next().await {
//!     println!("{} {} {} lag {}ns", r.event.source, r.event.kind, r.event.at_ns, r.lag_ns);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The layer's parts, one responsibility each: [`event`] (what an event is), [`clock`] (the
//! clocks it is stamped with), [`attach`] (starting the sources and the report of what
//! attached), [`stream`] (the running [`Sense`] and its lag), and the sources themselves:
//! [`ebpf`], [`psi`], [`memcg`] and [`poll`].

pub mod attach;
pub(crate) mod clock;
pub mod ebpf;
pub(crate) mod event;
mod fd;
pub mod lag;
pub mod memcg;
pub(crate) mod poll;
pub(crate) mod psi;
pub(crate) mod stream;

pub use attach::{AttachReport, SenseOptions, MEMCG_EVENTS_HOLD};
pub use clock::{monotonic_ns, ThreadCpu};
pub use event::KilledAtCrossing;
pub use event::{Kind, PressureEvent, Source};
pub use memcg::{MemcgTarget, MemoryHierarchy};
pub use stream::SenseError;
pub use stream::{Received, Sense};
