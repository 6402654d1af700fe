//! `reactor`: a node agent that handles memory, disk and pid pressure by the kubelet's rules,
//! woken by the kernel's own pressure events instead of a ten-second poll.
//!
//! Data flows one way: [`sense`] turns kernel sources into pressure events, [`observe`] reads
//! the signals, [`decide`] applies the kubelet's rules as pure functions, `act` changes the
//! node, and `record` keeps what happened. The binary (`reactor`) and its gRPC API are thin
//! front ends over this library.
//!
//! The modules stand on floors; a module uses only floors below its own (checked by
//! `cargo xtask house`, with no circle of imports between files either), bottom first:
//! [`decide`] (pure) and [`limits`]; [`human`], [`config`], [`priority`]; [`sense`];
//! [`observe`] and [`record`]; [`act`] and [`plan`]; [`devices`] and [`images`];
//! [`reactor`] (the loop that joins sense → observe → decide → act → record); [`node`]
//! (the pod manager the loop drives); [`api`].
//!
//! What this library makes public is what the binary, the tests and the fuzz targets use;
//! everything else is `pub(crate)` or narrower, so the compiler reports what nothing calls.
//! The docs are written for the agent's developers and link to crate-private items freely:
//! read them with `cargo doc --document-private-items`.

// The docs link to crate-private items on purpose (see above).
#![allow(rustdoc::private_intra_doc_links)]

pub mod act;
pub mod api;
pub mod config;
pub mod decide;
pub mod devices;
pub mod human;
pub mod images;
pub mod limits;
pub mod node;
pub mod observe;
pub mod plan;
pub mod priority;
pub mod reactor;
pub mod record;
pub mod sense;
