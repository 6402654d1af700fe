//! `plan`: the offline front of the decision engine (`reactor plan <what> --input FILE`).
//!
//! Each plan reads one JSON snapshot, runs the same pure rules from [`crate::decide`] that the
//! live agent runs, and prints one JSON answer. This module holds what every plan shares:
//! reading the input with a size cap, parsing it with errors that name the field, and
//! printing the answer. The plans themselves live beside it, one module each.

pub mod cgroups;
pub mod evict;
pub mod image_gc;
pub mod input;
pub mod preempt;
pub mod pressure;
