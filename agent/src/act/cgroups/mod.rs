//! The cgroup writer: creates the kubelet's cgroup tree (`kubepods`, the QoS cgroups, one
//! cgroup per pod and per container), writes resource values into it, reads usage back and
//! removes it — on cgroup v1 or v2, behind one [`CgroupManager`].
//!
//! Why it looks like this:
//! - **Direct file I/O, not `cgroups-rs`.** cgroups-rs finds its hierarchies from
//!   `/proc/self/mountinfo` and the process's own cgroup; the agent must instead work under a
//!   root it is *given* (a delegated subtree via the config's `cgroupRoot`, a temp dir in unit
//!   tests), must never create files on write, and must report the path and value of every
//!   failed write. The handful of files the kubelet writes are simpler to write directly than
//!   to adapt that crate to those rules.
//! - **The roots are injected.** [`CgroupManager::v1`] and [`CgroupManager::v2`] take the
//!   mount root (`/sys/fs/cgroup` is only the default, see [`DEFAULT_MOUNT_ROOT`]) and the
//!   cgroup root inside it; every cgroup is a [`CgroupPath`] below that, made of checked
//!   names, so no path can climb out with `..` or an absolute component.
//! - **Which hierarchies (v1).** Like the kubelet with the `cgroupfs` driver, a cgroup is
//!   created in `cpu`, `cpuacct`, `cpuset`, `memory` and, where mounted, `pids` and
//!   `hugetlb`; co-mounted controllers (`cpu,cpuacct`) are one hierarchy. A new `cpuset`
//!   cgroup gets its parent's `cpuset.cpus`/`cpuset.mems`, or no task could join it.
//! - **Controllers (v2).** Creating a cgroup enables, in each ancestor's
//!   `cgroup.subtree_control` from the cgroup root down, every controller the kubelet uses
//!   that the ancestor offers in `cgroup.controllers`.
//! - **Values.** [`Resources`] holds the kubelet's `ResourceConfig` in v1 units (cpu shares,
//!   CFS quota and period in µs, memory bytes, pids) and converts from `decide`'s
//!   [`ResourceConfig`](crate::decide::cgroups::ResourceConfig); which file gets which
//!   value on each version (shares → `cpu.weight`, quota and period → one `cpu.max`, ...)
//!   is `decide::cgroups::files`, the same mapping `reactor plan cgroups` prints, so the
//!   plan and the writer cannot drift apart.
//! - **Lowering a memory limit below usage.** On v1 the kernel reclaims, and if it cannot get
//!   below the new limit the write fails with `EBUSY`: that is
//!   [`CgroupError::LimitBelowUsage`] with the usage at the time. On v2 the kernel reclaims
//!   and then OOM-kills inside the cgroup instead of refusing. When lowering limits on a
//!   tree, write children before parents; when raising, parents before children.
//! - **Removal kills nothing.** [`CgroupManager::remove`] removes the subtree leaf first,
//!   retrying briefly while the kernel drains exiting tasks, and reports the pids still
//!   inside when it gives up; stopping processes is the runtime's job.
//!
//! ```no_run
//! use reactor::act::cgroups::{CgroupManager, CgroupPath, Resources};
//! # fn main() -> Result<(), reactor::act::cgroups::CgroupError> {
//! let root = CgroupPath::parse("/")?;
//! let cgroups = CgroupManager::detect("/sys/fs/cgroup".as_ref(), &root)?;
//! let pod = CgroupPath::parse("kubepods/burstable/pod1234")?;
//! cgroups.create(&pod)?;
//! cgroups.apply(&pod, &Resources { cpu_shares: Some(512), memory_limit_bytes: Some(256 << 20), ..Resources::default() })?;
//! # Ok(()) }
//! ```

mod error;
mod fs;
mod path;
pub(crate) mod reclaim;
mod remove;
mod resources;
pub mod tree;
pub mod v1;
pub mod v2;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use error::CgroupError;
pub use path::CgroupPath;
pub(crate) use remove::remove_tree;
pub(crate) use resources::files_for;
pub use resources::{MemoryUsage, Resources};

use crate::decide::cgroups::CgroupVersion;

/// Where cgroupfs is mounted on a normal host; only a default, never assumed.
pub const DEFAULT_MOUNT_ROOT: &str = "/sys/fs/cgroup";

/// How long [`CgroupManager::remove`] retries by default while exiting tasks drain.
pub(crate) const DEFAULT_REMOVE_WAIT: Duration = Duration::from_secs(2);

/// One cgroup manager over either cgroup version (enum dispatch: no trait objects, and a
/// `match` shows every place the versions differ).
#[derive(Debug, Clone)]
pub enum CgroupManager {
    /// Separate hierarchies per controller.
    V1(v1::V1),
    /// The unified hierarchy.
    V2(v2::V2),
}

macro_rules! dispatch {
    ($self:ident, $m:ident ( $($a:expr),* )) => {
        match $self {
            CgroupManager::V1(m) => m.$m($($a),*),
            CgroupManager::V2(m) => m.$m($($a),*),
        }
    };
}

impl CgroupManager {
    /// A v1 manager over the controller hierarchies mounted under `mount_root`, working below
    /// `cgroup_root` in each.
    pub fn v1(mount_root: &Path, cgroup_root: &CgroupPath) -> Result<CgroupManager, CgroupError> {
        v1::V1::new(mount_root, cgroup_root).map(CgroupManager::V1)
    }

    /// A v2 manager over the unified hierarchy mounted at `mount_root`, working below
    /// `cgroup_root`.
    pub(crate) fn v2(
        mount_root: &Path,
        cgroup_root: &CgroupPath,
    ) -> Result<CgroupManager, CgroupError> {
        v2::V2::new(mount_root, cgroup_root).map(CgroupManager::V2)
    }

    /// v2 when `mount_root` holds `cgroup.controllers` (a unified mount), v1 otherwise.
    pub fn detect(
        mount_root: &Path,
        cgroup_root: &CgroupPath,
    ) -> Result<CgroupManager, CgroupError> {
        if mount_root.join("cgroup.controllers").exists() {
            Self::v2(mount_root, cgroup_root)
        } else {
            Self::v1(mount_root, cgroup_root)
        }
    }

    /// The manager the config asks for: `cgroupRoot` below the cgroupfs mounted at
    /// `mount_root` (normally [`DEFAULT_MOUNT_ROOT`]), v1 or v2 as the mount shows.
    /// The config's own validation has already refused drivers other than `cgroupfs`.
    pub fn from_config(
        config: &crate::config::Config,
        mount_root: &Path,
    ) -> Result<CgroupManager, CgroupError> {
        Self::detect(mount_root, &CgroupPath::parse(&config.cgroup_root)?)
    }

    /// Which cgroup version this manager writes, as `decide` needs it for the values.
    pub fn version(&self) -> CgroupVersion {
        match self {
            CgroupManager::V1(_) => CgroupVersion::V1,
            CgroupManager::V2(_) => CgroupVersion::V2,
        }
    }

    /// Creates `cgroup` and any missing ancestors below the cgroup root, in every hierarchy
    /// (v1) or with controllers enabled on the way down (v2). Existing cgroups are kept.
    pub fn create(&self, cgroup: &CgroupPath) -> Result<(), CgroupError> {
        dispatch!(self, create(cgroup))
    }

    /// Writes the values that are set in `resources`; files are never created.
    pub fn apply(&self, cgroup: &CgroupPath, resources: &Resources) -> Result<(), CgroupError> {
        dispatch!(self, apply(cgroup, resources))
    }

    /// Reads one cgroup file (`memory.limit_in_bytes`, `cpu.max`, ...) as text, without its
    /// trailing newline.
    pub fn read_file(&self, cgroup: &CgroupPath, file: &str) -> Result<String, CgroupError> {
        dispatch!(self, read_file(cgroup, file))
    }

    /// Whether containers can be given `memory.swap.max`: cgroup v2 with swap accounting
    /// (checked on `kubepods`, so after [`CgroupManager::ensure_pod_tree`]). v1: never, as
    /// the kubelet configures swap on v2 only.
    pub(crate) fn swap_controller_available(&self) -> bool {
        match self {
            CgroupManager::V1(_) => false,
            CgroupManager::V2(v2) => v2.swap_controller_available(),
        }
    }

    /// Whether `cgroup` exists (in every hierarchy, on v1).
    pub fn exists(&self, cgroup: &CgroupPath) -> bool {
        dispatch!(self, exists(cgroup))
    }

    /// The `cgroup.procs` files to write a pid to so a process joins `cgroup` everywhere it
    /// must (one per hierarchy on v1). The runtime opens them before it forks.
    pub fn procs_files(&self, cgroup: &CgroupPath) -> Vec<PathBuf> {
        dispatch!(self, procs_files(cgroup))
    }

    /// Moves process `pid` into `cgroup` (every hierarchy on v1).
    pub fn add_process(&self, cgroup: &CgroupPath, pid: u32) -> Result<(), CgroupError> {
        for file in self.procs_files(cgroup) {
            fs::write(&file, &pid.to_string())?;
        }
        Ok(())
    }

    /// The processes directly in `cgroup` (not its descendants), sorted.
    pub fn procs(&self, cgroup: &CgroupPath) -> Result<Vec<u32>, CgroupError> {
        let mut pids = Vec::new();
        for file in self.procs_files(cgroup) {
            pids.extend(fs::read_pids(&file)?);
        }
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    /// The processes in `cgroup` and all its descendants, sorted.
    pub fn procs_recursive(&self, cgroup: &CgroupPath) -> Result<Vec<u32>, CgroupError> {
        dispatch!(self, procs_recursive(cgroup))
    }

    /// The processes in `cgroup` and below in the memory controller's tree only: on v1 one
    /// walk instead of one per hierarchy (the same processes, as the runtimes place them;
    /// on v2 there is one tree anyway). The eviction's kill list, read between the decision
    /// and the SIGKILL; whatever a stray process left in another hierarchy, the runtime's
    /// stop that follows kills too.
    pub fn memory_procs_recursive(&self, cgroup: &CgroupPath) -> Result<Vec<u32>, CgroupError> {
        dispatch!(self, memory_procs_recursive(cgroup))
    }

    /// The names of `cgroup`'s child cgroups, in any hierarchy (v1), sorted; none when
    /// `cgroup` does not exist. How the pod manager finds pod cgroups nobody knows about.
    pub(crate) fn children(&self, cgroup: &CgroupPath) -> Vec<String> {
        let mut names: Vec<String> = self
            .procs_files(cgroup)
            .iter()
            .filter_map(|f| f.parent().and_then(|d| std::fs::read_dir(d).ok()))
            .flat_map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.file_name().to_string_lossy().into_owned())
            })
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// `true` when no process is left in `cgroup` or below it: the point at which a
    /// victim's memory has been given back.
    pub fn is_empty(&self, cgroup: &CgroupPath) -> Result<bool, CgroupError> {
        self.procs_recursive(cgroup).map(|p| p.is_empty())
    }

    /// Memory usage and inactive file pages of `cgroup` (hierarchical).
    pub fn memory_usage(&self, cgroup: &CgroupPath) -> Result<MemoryUsage, CgroupError> {
        dispatch!(self, memory_usage(cgroup))
    }

    /// How many processes the kernel's OOM killer has killed in `cgroup` (v1
    /// `memory.oom_control` `oom_kill`, kernel ≥ 4.13; v2 `memory.events` `oom_kill`).
    pub fn oom_kills(&self, cgroup: &CgroupPath) -> Result<u64, CgroupError> {
        dispatch!(self, oom_kills(cgroup))
    }

    /// Removes `cgroup` and everything below it, leaf first, retrying for up to `wait` while
    /// the kernel drains exiting tasks. Kills nothing; an absent cgroup is fine.
    pub fn remove(&self, cgroup: &CgroupPath, wait: Duration) -> Result<(), CgroupError> {
        if cgroup.is_root() {
            return Err(CgroupError::BadName {
                name: "/".into(),
                reason: "refusing to remove the cgroup root",
            });
        }
        dispatch!(self, remove(cgroup, wait))
    }

    /// [`remove`](Self::remove) from async code: it runs on a blocking thread, because its
    /// retries sleep while the kernel drains exiting tasks (5 ms, doubling to 100 ms, for up
    /// to `wait`), and a sleep on a runtime worker would hold up every task on it meanwhile.
    pub async fn remove_off_runtime(
        &self,
        cgroup: &CgroupPath,
        wait: Duration,
    ) -> Result<(), CgroupError> {
        let (this, target) = (self.clone(), cgroup.clone());
        tokio::task::spawn_blocking(move || this.remove(&target, wait))
            .await
            .unwrap_or_else(|e| {
                Err(CgroupError::Remove {
                    path: PathBuf::from(cgroup.to_string()),
                    source: std::io::Error::other(format!("the removal's thread: {e}")),
                })
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_config_uses_the_cgroup_root() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("agent/slice")).unwrap();
        std::fs::write(tmp.path().join("cgroup.controllers"), "cpu memory\n").unwrap();
        std::fs::write(tmp.path().join("agent/slice/cgroup.controllers"), "").unwrap();
        let mut config = crate::config::Config {
            cgroup_root: "/agent/slice".into(),
            ..Default::default()
        };
        let m = CgroupManager::from_config(&config, tmp.path()).unwrap();
        assert_eq!(m.version(), CgroupVersion::V2);
        let CgroupManager::V2(v2) = &m else {
            panic!("v2")
        };
        assert_eq!(v2.root(), tmp.path().join("agent/slice"));
        config.cgroup_root = "/missing".into();
        let err = CgroupManager::from_config(&config, tmp.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("missing") && err.contains("does not exist"),
            "{err}"
        );
    }

    #[test]
    fn the_cgroup_root_is_never_removed() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("agent")).unwrap();
        std::fs::write(tmp.path().join("cgroup.controllers"), "cpu memory\n").unwrap();
        std::fs::write(tmp.path().join("agent/cgroup.controllers"), "").unwrap();
        let m = CgroupManager::v2(tmp.path(), &CgroupPath::parse("agent").unwrap()).unwrap();
        let err = m.remove(&CgroupPath::root(), Duration::ZERO).unwrap_err();
        assert!(
            matches!(err, CgroupError::BadName { .. }) && err.to_string().contains("cgroup root"),
            "{err}"
        );
        assert!(tmp.path().join("agent").is_dir());
    }
}
