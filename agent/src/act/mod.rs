//! `act`: the only place that changes the node — the cgroup writer and the runtimes that
//! start and stop pods.

pub mod cgroups;
pub mod pod_spec;
pub mod process;
pub mod runtime;
