//! Eviction signals: what the agent measures, the resource each one starves, and the node
//! condition it raises.
//!
//! The names are the kubelet's (`memory.available`, `nodefs.inodesFree`, …) so an operator's
//! `evictionHard` map works unchanged, and the mapping to resources and conditions is the
//! kubelet's, so the same threshold raises the same condition and reclaims the same resource.

use std::fmt;

/// One eviction signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    /// Node memory capacity minus the working set.
    MemoryAvailable,
    /// Memory allocatable to pods minus the pods' working set.
    AllocatableMemoryAvailable,
    /// Free bytes on the node filesystem (volumes, logs, …).
    NodeFsAvailable,
    /// Free inodes on the node filesystem.
    NodeFsInodesFree,
    /// Free bytes on the image filesystem.
    ImageFsAvailable,
    /// Free inodes on the image filesystem.
    ImageFsInodesFree,
    /// Free bytes on the container (writable layer) filesystem.
    ContainerFsAvailable,
    /// Free inodes on the container filesystem.
    ContainerFsInodesFree,
    /// Process ids left before the node's pid limit.
    PidAvailable,
}

/// The resource an eviction for a signal reclaims; it picks the ranking and the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resource {
    /// Memory bytes.
    Memory,
    /// Local ephemeral storage bytes.
    EphemeralStorage,
    /// Inodes (an internal resource of the eviction manager: nobody requests inodes).
    Inodes,
    /// Process ids (internal as well).
    Pids,
}

impl Resource {
    /// The resource name the kubelet writes in events and messages.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::EphemeralStorage => "ephemeral-storage",
            Resource::Inodes => "inodes",
            Resource::Pids => "pids",
        }
    }

    /// Whether amounts of this resource are bytes (printed `Mi`, `Gi`) rather than counts.
    pub(crate) fn is_bytes(self) -> bool {
        matches!(self, Resource::Memory | Resource::EphemeralStorage)
    }
}

/// A node condition the eviction manager reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeCondition {
    /// A memory signal is under its threshold.
    MemoryPressure,
    /// A filesystem signal is under its threshold.
    DiskPressure,
    /// The pid signal is under its threshold.
    PidPressure,
    /// PSI (KEP-5394): the system's memory `full` stall over its threshold.
    SystemMemoryContentionPressure,
    /// PSI (KEP-5394): the system's I/O `full` stall over its threshold.
    SystemDiskContentionPressure,
    /// PSI (KEP-5394): kubepods' memory `full` stall over its threshold.
    KubepodsMemoryContentionPressure,
    /// PSI (KEP-5394): kubepods' I/O `full` stall over its threshold.
    KubepodsDiskContentionPressure,
}

impl NodeCondition {
    /// The condition type as the node status spells it.
    pub fn name(self) -> &'static str {
        match self {
            NodeCondition::MemoryPressure => "MemoryPressure",
            NodeCondition::DiskPressure => "DiskPressure",
            NodeCondition::PidPressure => "PIDPressure",
            NodeCondition::SystemMemoryContentionPressure => "SystemMemoryContentionPressure",
            NodeCondition::SystemDiskContentionPressure => "SystemDiskContentionPressure",
            NodeCondition::KubepodsMemoryContentionPressure => "KubepodsMemoryContentionPressure",
            NodeCondition::KubepodsDiskContentionPressure => "KubepodsDiskContentionPressure",
        }
    }
}

impl Signal {
    /// Every signal, in a fixed order used for stable output.
    pub(crate) const ALL: [Signal; 9] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    /// The kubelet's name for the signal.
    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::ContainerFsAvailable => "containerfs.available",
            Signal::ContainerFsInodesFree => "containerfs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    /// Parses a kubelet signal name; `None` for anything the kubelet would call unsupported.
    pub fn parse(name: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The resource an eviction for this signal reclaims.
    pub(crate) fn resource(self) -> Resource {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Resource::Memory,
            Signal::NodeFsAvailable | Signal::ImageFsAvailable | Signal::ContainerFsAvailable => {
                Resource::EphemeralStorage
            }
            Signal::NodeFsInodesFree
            | Signal::ImageFsInodesFree
            | Signal::ContainerFsInodesFree => Resource::Inodes,
            Signal::PidAvailable => Resource::Pids,
        }
    }

    /// The node condition a met threshold on this signal raises.
    pub(crate) fn condition(self) -> NodeCondition {
        match self.resource() {
            Resource::Memory => NodeCondition::MemoryPressure,
            Resource::EphemeralStorage | Resource::Inodes => NodeCondition::DiskPressure,
            Resource::Pids => NodeCondition::PidPressure,
        }
    }

    /// Whether the manager reclaims this signal before any other (memory is always first).
    pub(crate) fn is_memory(self) -> bool {
        self.resource() == Resource::Memory
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How the node's filesystems are laid out; it decides which usage is charged to a pod for
/// each disk signal and which thresholds the container filesystem inherits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FsLayout {
    /// One filesystem holds everything (`nodefs` = `imagefs` = `containerfs`).
    #[default]
    Shared,
    /// A separate image filesystem that also holds writable layers (`containerfs` = `imagefs`).
    ImageFs,
    /// Images alone on `imagefs`; writable layers with everything else (`containerfs` = `nodefs`).
    ImageFsContainerFs,
}

impl FsLayout {
    /// Parses the `plan` input's name for the layout.
    pub fn parse(name: &str) -> Option<FsLayout> {
        match name {
            "shared" => Some(FsLayout::Shared),
            "imagefs" => Some(FsLayout::ImageFs),
            "imagefs+containerfs" => Some(FsLayout::ImageFsContainerFs),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_refused() {
        for s in Signal::ALL {
            assert_eq!(Signal::parse(s.name()), Some(s));
        }
        assert_eq!(Signal::parse("swap.available"), None);
        assert_eq!(Signal::parse("memory.Available"), None);
    }

    #[test]
    fn conditions_follow_resources() {
        assert_eq!(
            Signal::AllocatableMemoryAvailable.condition(),
            NodeCondition::MemoryPressure
        );
        assert_eq!(
            Signal::ContainerFsInodesFree.condition(),
            NodeCondition::DiskPressure
        );
        assert_eq!(Signal::PidAvailable.condition(), NodeCondition::PidPressure);
        assert_eq!(Signal::ImageFsInodesFree.resource(), Resource::Inodes);
        assert_eq!(NodeCondition::PidPressure.name(), "PIDPressure");
    }
}
