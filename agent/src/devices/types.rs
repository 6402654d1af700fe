//! Domain types at the device manager's edge: what admission passes in and what the runtime
//! gets back. No wire (protobuf) type crosses this boundary.

use std::collections::{BTreeMap, BTreeSet};

/// Device IDs of one resource, kept sorted so allocations and reports are deterministic.
pub type DeviceSet = BTreeSet<String>;

/// One container's device needs: extended resource name → number of devices (its limit; the
/// API server makes requests equal limits for extended resources).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerRequest {
    /// The container's name, unique in its pod.
    pub name: String,
    /// Extended resource name → device count. Non-device resources do not belong here.
    pub devices: BTreeMap<String, u64>,
    /// An init container with `restartPolicy: Always` (a sidecar): it keeps running beside
    /// the app containers, so its devices are never handed on to them.
    pub restartable: bool,
}

/// A pod as the device manager sees it at admission.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRequest {
    /// The pod's UID: the key of every assignment and of the checkpoint.
    pub uid: String,
    /// Init containers, in the order they run.
    pub init_containers: Vec<ContainerRequest>,
    /// App containers.
    pub containers: Vec<ContainerRequest>,
}

/// A host path the plugin wants mounted in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMount {
    /// Where it appears inside the container.
    pub container_path: String,
    /// The path on the host.
    pub host_path: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// A host device node the plugin wants in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    /// Its path inside the container.
    pub container_path: String,
    /// The device node on the host.
    pub host_path: String,
    /// Cgroup permissions, some of `r`, `w`, `m`.
    pub permissions: String,
}

/// What a plugin's `Allocate` answered for one container and one resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginResponse {
    /// Environment variables for the container.
    pub envs: BTreeMap<String, String>,
    /// Host paths to mount.
    pub mounts: Vec<DeviceMount>,
    /// Device nodes to create.
    pub device_nodes: Vec<DeviceNode>,
    /// Annotations for the container runtime.
    pub annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names.
    pub cdi_devices: Vec<String>,
}

/// Everything the runtime needs to give one container its devices: the process runtime uses
/// `envs`; the CRI runtime puts all of it into the container config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerAllocation {
    /// Resource → the device IDs assigned to this container.
    pub devices: BTreeMap<String, DeviceSet>,
    /// Merged environment; on a clash between resources the first (by resource name) wins,
    /// as in the kubelet.
    pub envs: BTreeMap<String, String>,
    /// Mounts, first one per container path wins.
    pub mounts: Vec<DeviceMount>,
    /// Device nodes, first one per container path wins.
    pub device_nodes: Vec<DeviceNode>,
    /// Merged annotations, first wins.
    pub annotations: BTreeMap<String, String>,
    /// CDI device names, deduplicated.
    pub cdi_devices: Vec<String>,
}

impl ContainerAllocation {
    /// Merges one resource's plugin answer into the container's options.
    pub(crate) fn merge(&mut self, resource: &str, devices: &DeviceSet, resp: &PluginResponse) {
        self.devices
            .entry(resource.to_string())
            .or_default()
            .extend(devices.iter().cloned());
        for (k, v) in &resp.envs {
            self.envs.entry(k.clone()).or_insert_with(|| v.clone());
        }
        for m in &resp.mounts {
            if !self
                .mounts
                .iter()
                .any(|x| x.container_path == m.container_path)
            {
                self.mounts.push(m.clone());
            }
        }
        for d in &resp.device_nodes {
            if !self
                .device_nodes
                .iter()
                .any(|x| x.container_path == d.container_path)
            {
                self.device_nodes.push(d.clone());
            }
        }
        for (k, v) in &resp.annotations {
            self.annotations
                .entry(k.clone())
                .or_insert_with(|| v.clone());
        }
        for c in &resp.cdi_devices {
            if !self.cdi_devices.contains(c) {
                self.cdi_devices.push(c.clone());
            }
        }
    }
}

/// A pod's device assignments after admission, per container name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodAllocation {
    /// The pod's UID.
    pub uid: String,
    /// Container name → what it gets. Containers without devices are absent.
    pub containers: BTreeMap<String, ContainerAllocation>,
}

/// Counts for one resource, as node status reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResourceCapacity {
    /// Healthy + unhealthy devices (node `capacity`).
    pub capacity: u64,
    /// Healthy devices (node `allocatable`).
    pub allocatable: u64,
    /// Devices held by pods (and admissions in flight).
    pub allocated: u64,
    /// Healthy devices nobody holds: what a new pod can get.
    pub free: u64,
}

impl From<ResourceCapacity> for crate::record::metrics::DeviceCounts {
    fn from(c: ResourceCapacity) -> Self {
        crate::record::metrics::DeviceCounts {
            healthy: c.allocatable,
            unhealthy: c.capacity.saturating_sub(c.allocatable),
            allocated: c.allocated,
        }
    }
}

/// The device manager's view of the node, for node status and `reactor status`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capacity {
    /// Per registered resource.
    pub resources: BTreeMap<String, ResourceCapacity>,
    /// Resources whose plugin stayed away past the grace period, dropped by this call (each
    /// is reported once, as the kubelet's `GetCapacity` does).
    pub deleted: Vec<String>,
}

/// Why a pod cannot get its devices: not enough healthy, unallocated devices.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("requested number of devices unavailable for {resource}. Requested: {requested}, Available: {available}")]
pub struct Insufficient {
    /// The resource that is short.
    pub resource: String,
    /// How many new devices the pod needs of it.
    pub requested: u64,
    /// How many healthy, unallocated devices there are.
    pub available: u64,
}
