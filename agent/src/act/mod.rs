//! The only layer that changes the node: the container runtime (stop pods, remove images)
//! and, later, the cgroup writer. Each submodule owns one outside system.

pub mod cri;
