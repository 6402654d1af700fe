//! Reading the eviction signals now, from cgroupfs, `statvfs` and `/proc`.
//!
//! The reactor loop calls [`Observer::observe`] on every pressure event, so an observation is
//! a handful of small file reads into buffers kept between calls: no heap allocation once
//! warm, microseconds per signal. [`Observer::observe_pods`] refills its output in place; only
//! the walk of each pod's cgroup tree (a directory listing) allocates. The figures are the
//! kubelet's (through cadvisor):
//!
//! | signal | available | capacity |
//! | --- | --- | --- |
//! | `memory.available` | capacity − working set of the node cgroup | `node.memoryCapacity`, else `MemTotal` |
//! | `allocatableMemory.available` | allocatable − working set of `<cgroupRoot>/kubepods` | capacity − system/kube reserved memory (the kubepods limit) |
//! | `nodefs.*`, `imagefs.*`, `containerfs.*` | `f_bavail × f_frsize`, `f_ffree` | `f_blocks × f_frsize`, `f_files` |
//! | `pid.available` | `min(pid_max, threads-max)` − tasks | `min(pid_max, threads-max)` |
//!
//! The working set is usage minus inactive file pages, floored at zero, and so is
//! `available`. The node's memory is read from `cgroupRoot` — the hierarchy root by default,
//! as the kubelet reads it, or a test's own cgroup when it models a smaller node there (the
//! same cgroup the sense layer watches). [`Signals::observations`] turns a snapshot into the
//! input of [`crate::decide::pressure::pass_with_psi`]; [`Observer::observe_pods`] fills the Summary
//! that [`crate::decide::rank::rank`] orders pods by.
//!
//! ```no_run
//! use reactor::config::Config;
//! use reactor::decide::summary::Summary;
//! use reactor::observe::{Observer, ObserveSettings, PodCgroup};
//! use reactor::decide::qos::QosClass;
//!
//! let config = Config::default();
//! let mut observer = Observer::new(ObserveSettings::from_config(&config, None, None)?)?;
//! let signals = observer.observe();
//! let observations = signals.observations();
//! let pods = [PodCgroup::under_kubepods("/", "uid-1", QosClass::BestEffort, &["app"])];
//! let mut summary = Summary::default();
//! let problems = observer.observe_pods(&pods, &mut summary);
//! # let _ = (observations, problems);
//! # Ok::<(), reactor::observe::ObserveError>(())
//! ```

pub mod cgroupfs;
pub mod disk;
mod error;
pub mod pods;
pub mod procfs;
pub(crate) mod psi;

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::config::Config;
use crate::decide::pressure::{Observation, Observations};
use crate::decide::psi_conditions::PsiReadings;
use crate::decide::quantity::Quantity;
use crate::decide::signal::{FsLayout, Signal};
use crate::decide::summary::Summary;

pub use cgroupfs::Layout;
pub use cgroupfs::{CgroupFs, MemoryUsage};
pub use disk::statvfs;
pub use disk::FsFigures;
pub use error::ObserveError;
pub use pods::{kubepods_cgroup, ContainerCgroup};
pub use pods::{PodCgroup, PodReads};
pub use procfs::ProcFs;
pub use procfs::Tasks;
pub(crate) use psi::PsiFiles;

/// Where and what to observe; built from the config once, at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObserveSettings {
    /// The cgroupfs mount (`/sys/fs/cgroup`); the memory hierarchy is found under it.
    pub cgroup_mount: PathBuf,
    /// The procfs mount (`/proc`).
    pub proc_root: PathBuf,
    /// The cgroup whose working set is the node's (`cgroupRoot`, `/` by default).
    pub node_cgroup: String,
    /// The pods cgroup (`<cgroupRoot>/kubepods`).
    pub kubepods_cgroup: String,
    /// `node.memoryCapacity` in bytes; `None` reads `MemTotal`.
    pub memory_capacity: Option<u64>,
    /// Memory held back from pods (system + kube reserved) when `enforceNodeAllocatable`
    /// has `pods`, so the kubepods limit is capacity minus this; else zero.
    pub reserved_memory: u64,
    /// The `nodefs` filesystem (`node.nodefsPath`).
    pub nodefs: PathBuf,
    /// The `imagefs` filesystem.
    pub imagefs: PathBuf,
    /// The `containerfs` filesystem (writable layers).
    pub containerfs: PathBuf,
    /// Most directory entries one container's ephemeral-storage walk visits.
    pub ephemeral_walk_cap: u64,
    /// Read the PSI figures of KEP-5394's node conditions (`featureGates.PSINodeCondition`).
    pub psi_conditions: bool,
}

/// How old the PSI figures may be before a pass reads them again: the kernel recomputes
/// its averages every 2 s.
const PSI_REREAD_NS: u64 = 1_000_000_000;

/// Default cap on the entries of one ephemeral-storage walk: a few milliseconds of `stat`s.
pub(crate) const DEFAULT_EPHEMERAL_WALK_CAP: u64 = 100_000;

fn config_bytes(key: &str, text: &str) -> Result<u64, ObserveError> {
    let q = Quantity::parse(text).map_err(|e| ObserveError::Config {
        key: key.to_string(),
        reason: e.to_string(),
    })?;
    u64::try_from(q.value()).map_err(|_| ObserveError::Config {
        key: key.to_string(),
        reason: format!("{text:?} is negative or out of range"),
    })
}

/// `node.memoryCapacity` in bytes, `None` when unset: the one parser of the key.
pub(crate) fn configured_memory_capacity(config: &Config) -> Result<Option<u64>, ObserveError> {
    match config.node.memory_capacity.as_str() {
        "" => Ok(None),
        text => config_bytes("node.memoryCapacity", text).map(Some),
    }
}

/// The node's memory capacity: `node.memoryCapacity` when set, else `MemTotal` of
/// `/proc/meminfo` ([`ProcFs::mem_total_bytes`]). For those that need the figure without an
/// [`Observer`]: the node plan, and `reactor watch`'s node target (which sense, a floor
/// below, takes as an argument rather than read itself).
pub fn memory_capacity(config: &Config) -> Result<u64, ObserveError> {
    match configured_memory_capacity(config)? {
        Some(bytes) => Ok(bytes),
        None => ProcFs::new(PathBuf::from("/proc")).mem_total_bytes(),
    }
}

impl ObserveSettings {
    /// Settings from the config file. `runtime_imagefs` and `runtime_containerfs` are the
    /// mount points the runtime's `ImageFsInfo` reports, when there is a runtime that knows:
    /// an empty `node.imagefsPath` takes the first, else nodefs; containerfs is the second,
    /// else imagefs (one filesystem for images and writable layers).
    pub fn from_config(
        config: &Config,
        runtime_imagefs: Option<&Path>,
        runtime_containerfs: Option<&Path>,
    ) -> Result<ObserveSettings, ObserveError> {
        let memory_capacity = configured_memory_capacity(config)?;
        let mut reserved_memory = 0u64;
        if config.enforce_node_allocatable.iter().any(|e| e == "pods") {
            for (key, map) in [
                ("systemReserved.memory", &config.system_reserved),
                ("kubeReserved.memory", &config.kube_reserved),
            ] {
                if let Some(q) = map.get("memory") {
                    let bytes = u64::try_from(q.0.value()).map_err(|_| ObserveError::Config {
                        key: key.to_string(),
                        reason: "negative or out of range".to_string(),
                    })?;
                    reserved_memory = reserved_memory.saturating_add(bytes);
                }
            }
        }
        let nodefs = config.node.nodefs_path.clone();
        let imagefs = if !config.node.imagefs_path.is_empty() {
            PathBuf::from(&config.node.imagefs_path)
        } else {
            runtime_imagefs.map_or_else(|| nodefs.clone(), Path::to_path_buf)
        };
        let containerfs = runtime_containerfs.map_or_else(|| imagefs.clone(), Path::to_path_buf);
        let root = if config.cgroup_root.is_empty() {
            "/"
        } else {
            config.cgroup_root.as_str()
        };
        Ok(ObserveSettings {
            cgroup_mount: PathBuf::from("/sys/fs/cgroup"),
            proc_root: PathBuf::from("/proc"),
            node_cgroup: root.to_string(),
            kubepods_cgroup: kubepods_cgroup(root),
            memory_capacity,
            reserved_memory,
            nodefs,
            imagefs,
            containerfs,
            ephemeral_walk_cap: DEFAULT_EPHEMERAL_WALK_CAP,
            psi_conditions: config.psi_node_condition(),
        })
    }
}

/// A memory signal's figures in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemorySignal {
    /// The total the signal is measured against.
    pub capacity_bytes: u64,
    /// The working set charged against it.
    pub working_set_bytes: u64,
    /// `capacity - working set`, floored at zero.
    pub available_bytes: u64,
    /// Inactive file pages: what usage counts and the working set does not. A usage
    /// threshold meant to fire where the working set crosses a level is raised by this much
    /// (the kubelet's memory threshold notifier does the same).
    pub inactive_file_bytes: u64,
    /// Active file pages: page cache the working set counts, which reclaim can drop
    /// (see [`crate::decide::memory_reclaim`]).
    pub active_file_bytes: u64,
}

impl MemorySignal {
    fn new(capacity_bytes: u64, m: &cgroupfs::MemoryUsage) -> MemorySignal {
        MemorySignal {
            capacity_bytes,
            working_set_bytes: m.working_set,
            available_bytes: capacity_bytes.saturating_sub(m.working_set),
            inactive_file_bytes: m.inactive_file,
            active_file_bytes: m.active_file,
        }
    }
}

/// Every signal observed at one moment. A signal that could not be read is `None`, with the
/// reason in `errors`: a missing image filesystem must not blind the agent to memory.
#[derive(Debug)]
pub struct Signals {
    /// When the figures were read, on `CLOCK_MONOTONIC` (the clock sense events carry).
    pub monotonic_ns: u64,
    /// The same moment in wall time, for records and node conditions.
    pub wall: SystemTime,
    /// `memory.available`.
    pub memory: Option<MemorySignal>,
    /// `allocatableMemory.available` (`None` while the kubepods cgroup does not exist).
    pub allocatable_memory: Option<MemorySignal>,
    /// The node filesystem.
    pub nodefs: Option<FsFigures>,
    /// The image filesystem.
    pub imagefs: Option<FsFigures>,
    /// The container (writable layer) filesystem.
    pub containerfs: Option<FsFigures>,
    /// Tasks against the node's task limit.
    pub pids: Option<Tasks>,
    /// The PSI `full` averages of KEP-5394's conditions (all `None` with the gate off).
    pub psi: PsiReadings,
    /// Why any of the above is missing.
    pub errors: Vec<ObserveError>,
}

fn bytes(n: u64) -> Quantity {
    Quantity::from_units(i64::try_from(n).unwrap_or(i64::MAX))
}

impl Signals {
    /// The observations decide's threshold evaluation takes, stamped with `monotonic_ns`
    /// (pass the same clock as `now` to [`crate::decide::pressure::pass_with_psi`]).
    pub fn observations(&self) -> Observations {
        let at = i128::from(self.monotonic_ns);
        let mut out = Observations::default();
        out.psi = self.psi;
        let mut set = |signal: Signal, available: Quantity, capacity: Quantity| {
            out.set(
                signal,
                Observation {
                    available,
                    capacity: Some(capacity),
                    at,
                },
            );
        };
        if let Some(m) = self.memory {
            set(
                Signal::MemoryAvailable,
                bytes(m.available_bytes),
                bytes(m.capacity_bytes),
            );
        }
        if let Some(m) = self.allocatable_memory {
            set(
                Signal::AllocatableMemoryAvailable,
                bytes(m.available_bytes),
                bytes(m.capacity_bytes),
            );
        }
        for (fs, avail, inodes) in [
            (
                self.nodefs,
                Signal::NodeFsAvailable,
                Signal::NodeFsInodesFree,
            ),
            (
                self.imagefs,
                Signal::ImageFsAvailable,
                Signal::ImageFsInodesFree,
            ),
            (
                self.containerfs,
                Signal::ContainerFsAvailable,
                Signal::ContainerFsInodesFree,
            ),
        ] {
            if let Some(f) = fs {
                set(avail, bytes(f.available_bytes), bytes(f.capacity_bytes));
                set(inodes, bytes(f.inodes_free), bytes(f.inodes));
            }
        }
        if let Some(t) = self.pids {
            set(
                Signal::PidAvailable,
                Quantity::from_units(t.available()),
                bytes(t.max),
            );
        }
        out
    }

    /// How the filesystems are laid out, from their devices: which usage ranking charges to
    /// a pod for each disk signal. `None` without all three figures.
    pub fn fs_layout(&self) -> Option<FsLayout> {
        let (node, image, container) = (self.nodefs?, self.imagefs?, self.containerfs?);
        Some(if node.device == image.device {
            FsLayout::Shared
        } else if container.device == node.device {
            FsLayout::ImageFsContainerFs
        } else {
            FsLayout::ImageFs
        })
    }
}

/// Reads signals on demand. Holds the open configuration and the read buffers; one per
/// reactor loop (`&mut self`: it is not shared between threads).
#[derive(Debug)]
pub struct Observer {
    settings: ObserveSettings,
    cgroups: CgroupFs,
    proc: ProcFs,
    /// The node's memory capacity: configured, or `MemTotal` read once at start.
    memory_capacity: u64,
    /// The pressure files KEP-5394's conditions read, with their gate on.
    psi: Option<PsiFiles>,
    /// Their last reading and when it was made (monotonic ns).
    psi_last: (PsiReadings, Option<u64>),
    scratch: String,
}

impl Observer {
    /// Finds the memory hierarchy and the memory capacity. Fails when there is no memory
    /// controller or `/proc/meminfo` cannot be read: without them no memory signal exists.
    pub fn new(settings: ObserveSettings) -> Result<Observer, ObserveError> {
        let cgroups = CgroupFs::detect(&settings.cgroup_mount)?;
        Observer::with_cgroupfs(settings, cgroups)
    }

    /// Like [`Observer::new`] with a memory hierarchy chosen by the caller (a fixture tree, or
    /// a known layout).
    pub(crate) fn with_cgroupfs(
        settings: ObserveSettings,
        mut cgroups: CgroupFs,
    ) -> Result<Observer, ObserveError> {
        cgroups.keep_open(&settings.node_cgroup);
        cgroups.keep_open(&settings.kubepods_cgroup);
        let mut proc = ProcFs::new(settings.proc_root.clone());
        let memory_capacity = match settings.memory_capacity {
            Some(bytes) => bytes,
            None => proc.mem_total_bytes()?,
        };
        // kubepods' pressure files exist on cgroup v2 only.
        let psi = settings.psi_conditions.then(|| {
            let kubepods = match cgroups.layout() {
                Layout::V2 => cgroups.dir(&settings.kubepods_cgroup).ok(),
                Layout::V1 => None,
            };
            PsiFiles::new(&settings.proc_root, kubepods.as_deref())
        });
        Ok(Observer {
            settings,
            cgroups,
            proc,
            memory_capacity,
            psi,
            psi_last: (PsiReadings::default(), None),
            scratch: String::with_capacity(256),
        })
    }

    /// The settings in use.
    pub fn settings(&self) -> &ObserveSettings {
        &self.settings
    }

    /// The memory hierarchy's layout.
    #[cfg(test)]
    pub(crate) fn layout(&self) -> Layout {
        self.cgroups.layout()
    }

    /// The node's memory capacity in bytes.
    pub fn memory_capacity(&self) -> u64 {
        self.memory_capacity
    }

    /// The id the kernel knows the cgroup at `cgroup` (a path in the hierarchy) by: its
    /// directory's inode, the kernfs id. `None` when it is gone or unreadable.
    pub(crate) fn cgroup_id(&self, cgroup: &str) -> Option<u64> {
        use std::os::unix::fs::MetadataExt as _;
        let dir = self.cgroups.root().join(cgroup.trim_start_matches('/'));
        std::fs::metadata(dir).ok().map(|m| m.ino())
    }

    /// Reads every signal now.
    pub fn observe(&mut self) -> Signals {
        let monotonic_ns = crate::sense::monotonic_ns();
        let wall = SystemTime::now();
        let mut errors = Vec::new();
        let keep = |r: Result<Option<MemoryUsage>, ObserveError>,
                    errors: &mut Vec<ObserveError>| match r {
            Ok(m) => m,
            Err(e) => {
                errors.push(e);
                None
            }
        };
        let node = keep(self.cgroups.memory(&self.settings.node_cgroup), &mut errors);
        if node.is_none() && errors.is_empty() {
            errors.push(ObserveError::Parse {
                path: self.cgroups.root().to_path_buf(),
                reason: format!("node cgroup {:?} does not exist", self.settings.node_cgroup),
            });
        }
        let memory = node.map(|m| MemorySignal::new(self.memory_capacity, &m));
        let allocatable = self
            .memory_capacity
            .saturating_sub(self.settings.reserved_memory);
        let allocatable_memory = keep(
            self.cgroups.memory(&self.settings.kubepods_cgroup),
            &mut errors,
        )
        .map(|m| MemorySignal::new(allocatable, &m));

        let fs = |path: &Path,
                  same_as: Option<(&Path, Option<FsFigures>)>,
                  errors: &mut Vec<ObserveError>| {
            if let Some((other, figures)) = same_as {
                if other == path {
                    return figures;
                }
            }
            match statvfs(path) {
                Ok(f) => Some(f),
                Err(e) => {
                    errors.push(e);
                    None
                }
            }
        };
        let s = &self.settings;
        let nodefs = fs(&s.nodefs, None, &mut errors);
        let imagefs = fs(&s.imagefs, Some((&s.nodefs, nodefs)), &mut errors);
        let containerfs = fs(&s.containerfs, Some((&s.imagefs, imagefs)), &mut errors);
        let pids = match self.proc.tasks() {
            Ok(t) => Some(t),
            Err(e) => {
                errors.push(e);
                None
            }
        };
        // The kernel updates the averages every 2 s; reading them once a second is enough,
        // and keeps four file reads off the passes the close watch makes every millisecond.
        let psi = match &self.psi {
            Some(files) => {
                let (last, at) = self.psi_last;
                if at.is_some_and(|at| monotonic_ns.saturating_sub(at) < PSI_REREAD_NS) {
                    last
                } else {
                    let r = files.read(&mut self.scratch, &mut errors);
                    self.psi_last = (r, Some(monotonic_ns));
                    r
                }
            }
            None => PsiReadings::default(),
        };
        Signals {
            monotonic_ns,
            wall,
            memory,
            allocatable_memory,
            nodefs,
            imagefs,
            containerfs,
            pids,
            psi,
            errors,
        }
    }

    /// Reads the statistics of `pods` into `summary` (reusing its allocations), one entry per
    /// pod whose cgroup exists; returns why any pod was left out.
    pub fn observe_pods(&mut self, pods: &[PodCgroup], summary: &mut Summary) -> Vec<ObserveError> {
        self.observe_pods_for(pods, PodReads::ALL, summary)
    }

    /// The memory usage of each pod cgroup in `cgroups` (paths in the hierarchy; `None`:
    /// gone or unreadable, said at debug): the bounds
    /// [`crate::decide::rank::first_for_memory`] starts from. The files of cgroups not in
    /// `cgroups` are closed.
    pub fn pod_memory_usages<S: AsRef<str>>(
        &mut self,
        cgroups: impl IntoIterator<Item = S>,
    ) -> Vec<Option<u64>> {
        let usages = cgroups
            .into_iter()
            .map(|cg| match self.cgroups.memory_usage(cg.as_ref()) {
                Ok(u) => u,
                Err(e) => {
                    tracing::debug!(error = %e, "pod memory usage left out of the ranking");
                    None
                }
            })
            .collect();
        self.cgroups.end_usage_pass();
        usages
    }

    /// Keeps the usage and `memory.stat` files of `cgroups` open for
    /// [`Observer::pod_memory_usages`] and [`Observer::pod_working_set`] (opening the new
    /// ones, closing the rest) without reading them.
    pub fn keep_pod_usage_open<S: AsRef<str>>(&mut self, cgroups: impl IntoIterator<Item = S>) {
        self.cgroups.keep_usage_open(cgroups);
    }

    /// Keeps the usage and `memory.stat` files of the container cgroups `cgroups` open for
    /// the victim's message ([`Observer::observe_pods_for`]), opening the new ones and
    /// closing the rest, without reading them.
    pub fn keep_container_files_open<S: AsRef<str>>(
        &mut self,
        cgroups: impl IntoIterator<Item = S>,
    ) {
        self.cgroups.keep_container_files_open(cgroups);
    }

    /// The anonymous memory still charged to a pod's cgroup (its `memory.stat`, through the
    /// file kept open for it when there is one); `None` when it cannot be read. What tells a
    /// victim whose address space is still being torn down from one that left only page
    /// cache behind ([`crate::observe::cgroupfs::MemoryUsage::anon`]).
    pub(crate) fn pod_anon(&mut self, cgroup: &str) -> Option<u64> {
        match self.cgroups.pod_memory(cgroup) {
            Ok(m) => m.map(|m| m.anon),
            Err(e) => {
                tracing::debug!(error = %e, "pod anonymous memory not read");
                None
            }
        }
    }

    /// The working set of the pod cgroup at `cgroup` (`None`: gone or unreadable, said at
    /// debug), through the files kept open for the pod when it has them.
    pub fn pod_working_set(&mut self, cgroup: &str) -> Option<u64> {
        match self.cgroups.pod_memory(cgroup) {
            Ok(m) => m.map(|m| m.working_set),
            Err(e) => {
                tracing::debug!(error = %e, "pod working set left out of the ranking");
                None
            }
        }
    }

    /// [`Observer::observe_pods`] reading only `reads` (what one ranking needs): the rest of
    /// each entry is left empty.
    pub fn observe_pods_for(
        &mut self,
        pods: &[PodCgroup],
        reads: PodReads,
        summary: &mut Summary,
    ) -> Vec<ObserveError> {
        let mut errors = Vec::new();
        pods::fill_summary(
            &mut self.cgroups,
            pods,
            reads,
            self.settings.ephemeral_walk_cap,
            &mut self.scratch,
            summary,
            &mut errors,
        );
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::cgroupfs::fixtures::*;
    use super::*;
    use crate::config::ConfigQuantity;
    use crate::decide::pressure::pass;
    use crate::decide::thresholds::{parse_thresholds, EvictionSettings};
    use std::collections::BTreeMap;

    fn fixture_settings(tmp: &Path, config: &Config) -> ObserveSettings {
        let mut s = ObserveSettings::from_config(config, None, None).unwrap();
        s.cgroup_mount = tmp.join("cgroup");
        s.nodefs = tmp.to_path_buf();
        s.imagefs = tmp.to_path_buf();
        s.containerfs = tmp.to_path_buf();
        s
    }

    fn modelled_node() -> Config {
        let mut c = Config {
            cgroup_root: "/node".into(),
            ..Default::default()
        };
        c.node.memory_capacity = "1Gi".into();
        c.system_reserved = BTreeMap::from([(
            "memory".to_string(),
            ConfigQuantity(Quantity::parse("100Mi").unwrap()),
        )]);
        c.kube_reserved = BTreeMap::from([(
            "memory".to_string(),
            ConfigQuantity(Quantity::parse("156Mi").unwrap()),
        )]);
        c
    }

    #[test]
    fn configured_capacity_wins() {
        let mut c = Config::default();
        c.node.memory_capacity = "2Gi".into();
        assert_eq!(memory_capacity(&c).unwrap(), 2 << 30);
        c.node.memory_capacity = "lots".into();
        let e = memory_capacity(&c).unwrap_err().to_string();
        assert!(e.starts_with("config key node.memoryCapacity:"), "{e}");
        c.node.memory_capacity = String::new();
        assert!(memory_capacity(&c).unwrap() > 64 << 20, "MemTotal");
    }

    #[test]
    fn settings_follow_the_config() {
        let c = modelled_node();
        let s =
            ObserveSettings::from_config(&c, Some(Path::new("/var/lib/containerd")), None).unwrap();
        assert_eq!(s.node_cgroup, "/node");
        assert_eq!(s.kubepods_cgroup, "/node/kubepods");
        assert_eq!(s.memory_capacity, Some(1 << 30));
        assert_eq!(s.reserved_memory, 256 << 20);
        assert_eq!(s.imagefs, Path::new("/var/lib/containerd"));
        assert_eq!(s.containerfs, s.imagefs);
        let mut d = Config::default();
        d.enforce_node_allocatable.clear();
        d.system_reserved = c.system_reserved.clone();
        let s = ObserveSettings::from_config(&d, None, None).unwrap();
        assert_eq!(
            (s.node_cgroup.as_str(), s.kubepods_cgroup.as_str()),
            ("/", "/kubepods")
        );
        assert_eq!(s.reserved_memory, 0, "no allocatable enforced on kubepods");
        assert_eq!(
            (s.imagefs.as_path(), s.memory_capacity),
            (d.node.nodefs_path.as_path(), None)
        );
        d.node.memory_capacity = "-1".into();
        let err = ObserveSettings::from_config(&d, None, None)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("config key node.memoryCapacity:"), "{err}");
    }

    #[test]
    fn v1_node_signals_and_threshold_pass() {
        let tmp = tempfile::tempdir().unwrap();
        let mem = tmp.path().join("cgroup/memory");
        v1_memcg(&mem, "/", 50 << 30, 0);
        v1_memcg(&mem, "/node", 900 << 20, 100 << 20);
        v1_memcg(&mem, "/node/kubepods", 700 << 20, 50 << 20);
        let settings = fixture_settings(tmp.path(), &modelled_node());
        let mut obs = Observer::new(settings).unwrap();
        assert_eq!(obs.layout(), Layout::V1);
        let s = obs.observe();
        assert!(s.errors.is_empty(), "{:?}", s.errors);
        let m = s.memory.unwrap();
        assert_eq!(
            (m.capacity_bytes, m.working_set_bytes, m.available_bytes),
            (1 << 30, 800 << 20, 224 << 20)
        );
        let a = s.allocatable_memory.unwrap();
        assert_eq!(
            (a.capacity_bytes, a.available_bytes),
            (768 << 20, 118 << 20)
        );
        assert_eq!(s.fs_layout(), Some(FsLayout::Shared));
        assert!(s.pids.unwrap().available() > 0);

        // The adapter feeds decide: a 300Mi hard threshold on memory.available is met (224Mi
        // left), a 100Mi one on the allocatable signal is not (118Mi left).
        let settings = EvictionSettings {
            hard: BTreeMap::from([
                ("memory.available".to_string(), "300Mi".to_string()),
                (
                    "allocatableMemory.available".to_string(),
                    "100Mi".to_string(),
                ),
            ]),
            ..Default::default()
        };
        let thresholds = parse_thresholds(&settings).unwrap();
        let observations = s.observations();
        let at = i128::from(s.monotonic_ns);
        assert_eq!(observations.get(Signal::MemoryAvailable).unwrap().at, at);
        let (_, result) = pass(&thresholds, &Default::default(), &observations, at, 0);
        let reclaim = result.reclaim.expect("memory threshold met");
        assert_eq!(reclaim.signal, Signal::MemoryAvailable);
        assert_eq!(reclaim.available, Quantity::from_units(224 << 20));
        assert_eq!(result.met.len(), 1);
        let nodefs = observations.get(Signal::NodeFsInodesFree).unwrap();
        assert!(nodefs.capacity.unwrap() >= nodefs.available);
    }

    #[test]
    fn v2_root_node_and_missing_pieces_are_reported_not_fatal() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cgroup");
        set(&root, "/", "cgroup.controllers", "cpu memory pids\n");
        set(
            &root,
            "/",
            "memory.stat",
            &v2_stat(3 << 30, 1 << 30, 512 << 20),
        );
        let mut config = Config::default();
        config.node.memory_capacity = "8Gi".into();
        let mut settings = fixture_settings(tmp.path(), &config);
        settings.imagefs = tmp.path().join("no-such-imagefs");
        let mut obs = Observer::new(settings).unwrap();
        assert_eq!(obs.layout(), Layout::V2);
        let s = obs.observe();
        let m = s.memory.unwrap();
        assert_eq!(m.working_set_bytes, (4 << 30) - (512 << 20));
        assert_eq!(m.available_bytes, (8 << 30) - (4 << 30) + (512 << 20));
        // No kubepods cgroup yet: no allocatable signal, and that is not an error.
        assert!(s.allocatable_memory.is_none());
        assert!(s.nodefs.is_some() && s.imagefs.is_none());
        assert_eq!(s.errors.len(), 1, "{:?}", s.errors);
        assert!(s.errors[0].to_string().contains("no-such-imagefs"));
        assert!(s.observations().get(Signal::ImageFsAvailable).is_none());
        assert!(s.observations().get(Signal::MemoryAvailable).is_some());
    }

    #[test]
    fn working_set_over_capacity_floors_available_at_zero() {
        let tmp = tempfile::tempdir().unwrap();
        let mem = tmp.path().join("cgroup/memory");
        v1_memcg(&mem, "/", 1, 0);
        v1_memcg(&mem, "/node", 2 << 30, 0);
        let mut obs = Observer::new(fixture_settings(tmp.path(), &modelled_node())).unwrap();
        let s = obs.observe();
        assert_eq!(s.memory.unwrap().available_bytes, 0);
        let o = s.observations();
        assert_eq!(
            o.get(Signal::MemoryAvailable).unwrap().available,
            Quantity::ZERO
        );
    }

    #[test]
    fn psi_figures_are_read_with_the_gate_and_at_most_once_a_second() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cgroup");
        set(&root, "/", "cgroup.controllers", "cpu memory pids\n");
        set(&root, "/", "memory.stat", &v2_stat(1 << 30, 0, 0));
        let line = |f10: f64, f60: f64| {
            format!("some avg10={f10:.2} avg60={f60:.2} avg300=0.00 total=9\nfull avg10={f10:.2} avg60={f60:.2} avg300=0.00 total=9\n")
        };
        set(&root, "/kubepods", "memory.pressure", &line(40.0, 12.5));
        set(&root, "/kubepods", "io.pressure", &line(0.0, 0.0));
        let proc_root = tmp.path().join("proc");
        std::fs::create_dir_all(proc_root.join("pressure")).unwrap();
        std::fs::write(proc_root.join("pressure/memory"), line(2.0, 0.5)).unwrap();
        std::fs::write(proc_root.join("pressure/io"), line(0.25, 0.0)).unwrap();
        let mut config = Config::default();
        config.node.memory_capacity = "8Gi".into();
        config.feature_gates.insert("PSINodeCondition".into(), true);
        let mut settings = fixture_settings(tmp.path(), &config);
        settings.proc_root = proc_root.clone();
        assert!(settings.psi_conditions);
        let mut obs = Observer::new(settings.clone()).unwrap();
        let s = obs.observe();
        let f = |avg10, avg60| Some(crate::decide::psi_conditions::FullAverages { avg10, avg60 });
        assert_eq!(
            s.observations().psi.full,
            [f(2.0, 0.5), f(0.25, 0.0), f(40.0, 12.5), f(0.0, 0.0)]
        );
        // Read again within the second: the same figures, not the file's new ones.
        set(&root, "/kubepods", "memory.pressure", &line(0.0, 3.0));
        assert_eq!(obs.observe().psi.full[2], f(40.0, 12.5));
        // Gate off: nothing read.
        settings.psi_conditions = false;
        let mut off = Observer::new(settings).unwrap();
        assert_eq!(off.observe().psi, PsiReadings::default());
    }
}
