//! Domain types for what the agent asks of and learns from the container runtime.
//!
//! They carry only what the agent uses, with CRI's "zero means unset" fields turned into
//! `Option`s, so callers never confuse "the runtime said 0" with "the runtime said nothing".

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Name and versions the runtime reports, logged at start so a report names the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// The CRI version the runtime speaks (`v1`).
    pub api_version: String,
    /// The runtime's name (`containerd`).
    pub runtime_name: String,
    /// The runtime's own version (`1.6.20~ds1`).
    pub runtime_version: String,
    /// The CRI API version the runtime implements (`v1`).
    pub runtime_api_version: String,
}

/// One condition of the runtime (`RuntimeReady`, `NetworkReady`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeCondition {
    /// The condition's type.
    pub kind: String,
    /// Whether it holds.
    pub status: bool,
    /// Why, in one word, when it does not.
    pub reason: String,
    /// Why, for a person.
    pub message: String,
}

/// The runtime's status: its conditions and, where the runtime reveals it in its verbose
/// info (containerd does), the sandbox ("pause") image it uses, which image GC must keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeStatus {
    /// The runtime's conditions.
    pub conditions: Vec<RuntimeCondition>,
    /// The sandbox image from the runtime's verbose config, if it names one.
    pub sandbox_image: Option<String>,
}

/// How the runtime manages cgroups; the agent's cgroup paths must match it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupDriver {
    /// Paths like `/kubepods/burstable/pod<uid>`.
    Cgroupfs,
    /// systemd slices (`kubepods-burstable-pod<uid>.slice`).
    Systemd,
}

/// Which namespace a pod's processes share: the kubelet's `hostNetwork`/`hostPID`/`hostIPC`
/// map to [`NamespaceMode::Node`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NamespaceMode {
    /// One namespace for the whole pod (the CRI default).
    #[default]
    Pod,
    /// One namespace per container.
    Container,
    /// The node's own namespace.
    Node,
}

/// Cgroup settings for a container (or a sandbox), as the kubelet derives them from the
/// pod's requests and limits. `None` leaves the runtime's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinuxResources {
    /// `cpu.shares` (cgroup v1 weight; 2..=262144).
    pub cpu_shares: Option<u64>,
    /// CFS quota in microseconds per period.
    pub cpu_quota_us: Option<u64>,
    /// CFS period in microseconds.
    pub cpu_period_us: Option<u64>,
    /// `memory.limit_in_bytes`.
    pub memory_limit_bytes: Option<u64>,
    /// The container processes' `oom_score_adj` (-1000..=1000); 0 is CRI's "unset".
    pub oom_score_adj: Option<i64>,
    /// cgroup v2 files the runtime writes as they are (CRI's `unified`), e.g.
    /// `memory.oom.group`; empty on v1, where a runtime refuses them.
    pub unified: BTreeMap<String, String>,
}

/// What to create a pod sandbox with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSandboxSpec {
    /// The pod's name.
    pub name: String,
    /// The pod's UID (unique per pod).
    pub uid: String,
    /// The pod's namespace.
    pub namespace: String,
    /// Restart attempt, 0 for the first.
    pub attempt: u32,
    /// Hostname inside the pod; not sent for [`NamespaceMode::Node`] networking, where the
    /// pod shares the node's UTS namespace (runc refuses a hostname there).
    pub hostname: String,
    /// Where the runtime writes container logs (`<dir>/<container log_path>`).
    pub log_directory: Option<PathBuf>,
    /// Labels the agent uses to find its own sandboxes again.
    pub labels: BTreeMap<String, String>,
    /// Opaque annotations passed to the runtime.
    pub annotations: BTreeMap<String, String>,
    /// The pod's cgroup (cgroupfs form, `/kubepods/burstable/pod<uid>`): every container of
    /// the pod is created below it, so pod-level limits and eviction apply to all of them.
    pub cgroup_parent: String,
    /// Network namespace mode (use [`NamespaceMode::Node`] where no CNI is configured).
    pub network: NamespaceMode,
    /// PID namespace mode.
    pub pid: NamespaceMode,
    /// IPC namespace mode.
    pub ipc: NamespaceMode,
    /// Resources of the whole pod, for runtimes that size the sandbox.
    pub resources: Option<LinuxResources>,
}

/// A bind mount into a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Where it appears inside the container.
    pub container_path: String,
    /// What is mounted, on the host.
    pub host_path: String,
    /// Whether the container may only read it.
    pub readonly: bool,
}

/// A device node given to a container (a device plugin's allocation ends up here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Its path inside the container.
    pub container_path: String,
    /// Its path on the host.
    pub host_path: String,
    /// cgroup device permissions: some of `r`, `w`, `m`.
    pub permissions: String,
}

/// What to create a container with, inside an existing sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerSpec {
    /// The container's name in the pod.
    pub name: String,
    /// Restart attempt, 0 for the first.
    pub attempt: u32,
    /// The image reference (tag or id), which must already be present.
    pub image: String,
    /// Replaces the image's entrypoint when not empty.
    pub command: Vec<String>,
    /// Replaces the image's cmd when not empty.
    pub args: Vec<String>,
    /// Working directory, when not the image's.
    pub working_dir: Option<String>,
    /// Environment variables, in order.
    pub env: Vec<(String, String)>,
    /// Bind mounts.
    pub mounts: Vec<Mount>,
    /// Device nodes.
    pub devices: Vec<Device>,
    /// Labels the agent uses to find the container again.
    pub labels: BTreeMap<String, String>,
    /// Opaque annotations passed to the runtime.
    pub annotations: BTreeMap<String, String>,
    /// Log file, relative to the sandbox's log directory.
    pub log_path: Option<String>,
    /// Cgroup settings.
    pub resources: LinuxResources,
}

/// State of a pod sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxState {
    /// Running, with its namespaces set up.
    Ready,
    /// Stopped or not yet set up.
    NotReady,
}

/// A pod sandbox as the runtime lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxInfo {
    /// The runtime's id for it.
    pub id: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
    /// The pod's namespace.
    pub namespace: String,
    /// Restart attempt.
    pub attempt: u32,
    /// Its state.
    pub state: SandboxState,
    /// Creation time, nanoseconds since the Unix epoch.
    pub created_at_ns: i64,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its annotations.
    pub annotations: BTreeMap<String, String>,
}

/// Which sandboxes to list; empty fields match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxFilter {
    /// Only this sandbox.
    pub id: Option<String>,
    /// Only sandboxes in this state.
    pub state: Option<SandboxState>,
    /// Only sandboxes carrying all of these labels.
    pub labels: BTreeMap<String, String>,
}

/// State of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerState {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Its process exited.
    Exited,
    /// The runtime does not know.
    Unknown,
}

/// A container as the runtime lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    /// The runtime's id for it.
    pub id: String,
    /// The sandbox it belongs to.
    pub pod_sandbox_id: String,
    /// Its name in the pod.
    pub name: String,
    /// Restart attempt.
    pub attempt: u32,
    /// The image as the container spec named it.
    pub image: String,
    /// The image the runtime resolved it to (an image id or digest): what image GC compares.
    pub image_ref: String,
    /// Its state.
    pub state: ContainerState,
    /// Creation time, nanoseconds since the Unix epoch.
    pub created_at_ns: i64,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its annotations.
    pub annotations: BTreeMap<String, String>,
}

/// Which containers to list; empty fields match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerFilter {
    /// Only this container.
    pub id: Option<String>,
    /// Only containers in this state.
    pub state: Option<ContainerState>,
    /// Only containers of this sandbox.
    pub pod_sandbox_id: Option<String>,
    /// Only containers carrying all of these labels.
    pub labels: BTreeMap<String, String>,
}

/// A container's detailed status: how it ended matters to eviction records (`OOMKilled`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerStatus {
    /// What the runtime lists about it; `pod_sandbox_id` is empty here, since CRI's
    /// `ContainerStatus` does not carry it (take it from [`ContainerInfo`] in a listing).
    pub info: ContainerInfo,
    /// Start time (ns since the epoch), 0 if never started.
    pub started_at_ns: i64,
    /// Exit time (ns since the epoch), 0 if still running.
    pub finished_at_ns: i64,
    /// Exit code, meaningful once exited.
    pub exit_code: i32,
    /// One word on why it exited (`Completed`, `Error`, `OOMKilled`).
    pub reason: String,
    /// Details on why it exited.
    pub message: String,
}

/// Which containers to get stats for; empty fields match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsFilter {
    /// Only this container.
    pub id: Option<String>,
    /// Only containers of this sandbox.
    pub pod_sandbox_id: Option<String>,
    /// Only containers carrying all of these labels.
    pub labels: BTreeMap<String, String>,
}

/// A container's resource use: the eviction ranking reads memory working set and the
/// writable layer from here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerStats {
    /// The container's id.
    pub id: String,
    /// Its name in the pod.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// CPU time used, all cores, in nanoseconds.
    pub cpu_usage_core_ns: Option<u64>,
    /// Recent CPU rate in nanocores (runtimes fill it only after two samples).
    pub cpu_usage_nano_cores: Option<u64>,
    /// Memory usage minus inactive file pages: what the kubelet ranks pods by.
    pub memory_working_set_bytes: Option<u64>,
    /// Memory usage as the cgroup counts it.
    pub memory_usage_bytes: Option<u64>,
    /// Anonymous and swap-cache memory.
    pub memory_rss_bytes: Option<u64>,
    /// Bytes the container wrote to its writable layer.
    pub writable_layer_bytes: Option<u64>,
    /// Inodes the container used in its writable layer.
    pub writable_layer_inodes: Option<u64>,
}

/// An image the runtime holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    /// The image id (`sha256:…` of its config).
    pub id: String,
    /// Tags naming it (`docker.io/library/busybox:1`).
    pub repo_tags: Vec<String>,
    /// Digests naming it (`repo@sha256:…`).
    pub repo_digests: Vec<String>,
    /// Its size in bytes as the runtime counts it.
    pub size_bytes: u64,
    /// Whether the runtime asks that it never be garbage-collected.
    pub pinned: bool,
}

/// Usage of a filesystem that holds images or containers' writable layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilesystemUsage {
    /// When the runtime measured it, nanoseconds since the Unix epoch.
    pub timestamp_ns: i64,
    /// The directory the runtime keeps the data in.
    pub mount_point: PathBuf,
    /// Bytes the runtime's data uses, as the runtime reports it.
    pub used_bytes: Option<u64>,
    /// Inodes the runtime's data uses, as the runtime reports it.
    pub inodes_used: Option<u64>,
    /// Size of the filesystem under `mount_point` (CRI has no such field: from statvfs).
    pub capacity_bytes: Option<u64>,
    /// Bytes available to unprivileged users there (statvfs).
    pub available_bytes: Option<u64>,
    /// Total inodes there (statvfs).
    pub inodes_total: Option<u64>,
    /// Free inodes there (statvfs).
    pub inodes_free: Option<u64>,
}

/// What `ImageFsInfo` reports: image filesystems and, where separate, the filesystems of the
/// containers' writable layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageFsInfo {
    /// Where images are stored.
    pub image_filesystems: Vec<FilesystemUsage>,
    /// Where writable layers are stored, if the runtime keeps them apart (newer runtimes).
    pub container_filesystems: Vec<FilesystemUsage>,
}
