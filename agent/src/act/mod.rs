//! `act`: the only layer that changes the node — the cgroup writer, and the container
//! runtimes that start and stop pods and remove images. Each submodule owns one outside system.

pub mod cgroups;
pub mod cri;
pub mod cri_runtime;
pub mod kill;
pub mod pod_spec;
pub mod process;
pub mod runtime;
