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
//!   [`ResourceConfig`]; which file gets which value on each version (shares → `cpu.weight`,
//!   quota and period → one `cpu.max`, ...) is `decide::cgroups::files`, the same mapping
//!   `reactor plan cgroups` prints, so the plan and the writer cannot drift apart.
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

mod fs;
pub(crate) mod reclaim;
pub mod tree;
pub mod v1;
pub mod v2;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::decide::cgroups::{files, pod_cgroup, CgroupVersion, FileValue, ResourceConfig};
use crate::decide::pod::PodInfo;
use crate::observe::cgroupfs::{anon_slack_bytes, stat_anon};

/// Where cgroupfs is mounted on a normal host; only a default, never assumed.
pub const DEFAULT_MOUNT_ROOT: &str = "/sys/fs/cgroup";

/// The top of the pod tree, below the cgroup root (the kubelet's name with cgroupfs).
pub(crate) const KUBEPODS: &str = "kubepods";

/// Why a cgroup operation failed. Every variant names the file or directory, and writes
/// carry the value, so one log line is enough to reproduce the problem by hand.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A cgroup name that could escape its parent or that the kernel would refuse.
    #[error("bad cgroup name {name:?}: {reason}")]
    BadName {
        /// The offending name or path.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The mount root does not look like the cgroup version asked for.
    #[error("no cgroup {version} hierarchy at {path}: {reason}")]
    NoHierarchy {
        /// "v1" or "v2".
        version: &'static str,
        /// Where the agent looked.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// Writing a value failed.
    #[error("write {value:?} to {path}: {source}{hint}", hint = write_hint(source))]
    Write {
        /// The cgroup file.
        path: PathBuf,
        /// The value that was refused.
        value: String,
        /// The kernel's error.
        source: std::io::Error,
    },
    /// The kernel could not reclaim enough to bring usage under a lowered memory limit
    /// (v1 `EBUSY`): raise the limit, or stop work in the cgroup first.
    #[error("write {value:?} to {path}: memory usage {usage} bytes is above the new limit and the kernel could not reclaim it (EBUSY)")]
    LimitBelowUsage {
        /// The `memory.limit_in_bytes` file.
        path: PathBuf,
        /// The limit that was refused.
        value: String,
        /// The cgroup's usage when the write failed.
        usage: u64,
    },
    /// Reading a file or directory failed.
    #[error("read {path}: {source}")]
    Read {
        /// The cgroup file or directory.
        path: PathBuf,
        /// The kernel's error.
        source: std::io::Error,
    },
    /// A cgroup file held something other than what the kernel writes there.
    #[error("{path}: unexpected content {text:?}")]
    Parse {
        /// The cgroup file.
        path: PathBuf,
        /// The text that did not parse.
        text: String,
    },
    /// mkdir failed.
    #[error("create cgroup {path}: {source}")]
    Create {
        /// The cgroup directory.
        path: PathBuf,
        /// The kernel's error.
        source: std::io::Error,
    },
    /// rmdir failed for a reason other than tasks still draining.
    #[error("remove cgroup {path}: {source}")]
    Remove {
        /// The cgroup directory.
        path: PathBuf,
        /// The kernel's error.
        source: std::io::Error,
    },
    /// The cgroup still had tasks when the removal gave up waiting.
    #[error("remove cgroup {path}: still busy after {waited:?}, pids inside: {pids:?}")]
    Busy {
        /// The cgroup directory.
        path: PathBuf,
        /// The pids found inside when giving up (empty: the kernel was still draining).
        pids: Vec<u32>,
        /// How long removal retried.
        waited: Duration,
    },
}

fn write_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::NotFound => {
            " (the file does not exist: controller not enabled for this cgroup?)"
        }
        _ => "",
    }
}

/// A cgroup below the manager's cgroup root, as a list of checked names.
///
/// Names are what the kubelet and runtimes use (`kubepods`, `burstable`, `pod<uid>`, a
/// container name or id): a name may not be empty, `.` or `..`, contain `/` or NUL, or be
/// longer than 255 bytes. That makes joining onto a mount root unable to escape it.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct CgroupPath {
    names: Vec<String>,
}

fn check_name(name: &str) -> Result<(), CgroupError> {
    let reason = if name.is_empty() {
        "empty"
    } else if name == "." || name == ".." {
        "a relative step"
    } else if name.contains('/') {
        "contains '/'"
    } else if name.contains('\0') {
        "contains NUL"
    } else if name.len() > 255 {
        "longer than 255 bytes"
    } else {
        return Ok(());
    };
    Err(CgroupError::BadName {
        name: name.to_string(),
        reason,
    })
}

impl CgroupPath {
    /// The cgroup root itself.
    pub fn root() -> CgroupPath {
        CgroupPath::default()
    }

    /// Parses `a/b/c` (a leading `/` and repeated slashes are accepted; `.`/`..` are not).
    pub fn parse(text: &str) -> Result<CgroupPath, CgroupError> {
        let mut path = CgroupPath::root();
        for name in text.split('/').filter(|n| !n.is_empty()) {
            check_name(name).map_err(|_| CgroupError::BadName {
                name: text.to_string(),
                reason: "a component is '.', '..', too long or contains NUL",
            })?;
            path.names.push(name.to_string());
        }
        Ok(path)
    }

    /// This cgroup's child `name`.
    pub fn join(&self, name: &str) -> Result<CgroupPath, CgroupError> {
        check_name(name)?;
        let mut child = self.clone();
        child.names.push(name.to_string());
        Ok(child)
    }

    /// The parent cgroup; `None` for the root.
    #[cfg(test)]
    pub(crate) fn parent(&self) -> Option<CgroupPath> {
        let mut parent = self.clone();
        parent.names.pop().map(|_| parent)
    }

    /// The names from the root down.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// `true` for the cgroup root itself.
    pub(crate) fn is_root(&self) -> bool {
        self.names.is_empty()
    }

    /// Appends this path to a directory.
    pub fn under(&self, dir: &Path) -> PathBuf {
        let mut p = dir.to_path_buf();
        p.extend(&self.names);
        p
    }

    /// `kubepods`: the parent of every pod cgroup.
    pub fn kubepods() -> CgroupPath {
        CgroupPath {
            names: vec![KUBEPODS.to_string()],
        }
    }

    /// The pod cgroup `kubepods[/<qos>]/pod<uid>`; `qos_dir` is `None` for Guaranteed pods,
    /// `Some("burstable")`/`Some("besteffort")` otherwise.
    pub fn pod(qos_dir: Option<&str>, uid: &str) -> Result<CgroupPath, CgroupError> {
        let mut p = CgroupPath::kubepods();
        if let Some(q) = qos_dir {
            p = p.join(q)?;
        }
        p.join(&format!("pod{uid}"))
    }
}

impl TryFrom<String> for CgroupPath {
    type Error = CgroupError;
    fn try_from(text: String) -> Result<Self, Self::Error> {
        CgroupPath::parse(&text)
    }
}

impl From<CgroupPath> for String {
    fn from(path: CgroupPath) -> String {
        path.to_string()
    }
}

impl std::fmt::Display for CgroupPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "/{}", self.names.join("/"))
    }
}

/// The values the kubelet writes for one cgroup, in cgroup v1 units (its `ResourceConfig`).
/// `None` leaves the file as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// `cpu.shares` (2..=262144); v2 writes the converted `cpu.weight`.
    pub cpu_shares: Option<u64>,
    /// CFS quota in µs per period; `-1` is unlimited (`max` on v2).
    pub cpu_quota_us: Option<i64>,
    /// CFS period in µs (the kubelet's `cpuCFSQuotaPeriod`, 100000 by default).
    pub cpu_period_us: Option<u64>,
    /// Memory limit in bytes; `-1` is unlimited (`max` on v2).
    pub memory_limit_bytes: Option<i64>,
    /// Maximum number of tasks; `-1` is unlimited (`max`).
    pub pids_max: Option<i64>,
    /// v2 `memory.oom.group`: the OOM killer takes the whole cgroup (the kubelet's
    /// `singleProcessOOMKill: false`); ignored on v1, which has no such file.
    #[serde(default)]
    pub memory_oom_group: Option<bool>,
    /// v2 `memory.min` (Memory QoS); ignored on v1.
    #[serde(default)]
    pub memory_min: Option<i64>,
    /// v2 `memory.low`; ignored on v1.
    #[serde(default)]
    pub memory_low: Option<i64>,
    /// v2 `memory.high` (Memory QoS); ignored on v1.
    #[serde(default)]
    pub memory_high: Option<i64>,
    /// v2 `memory.swap.max` (0: no swap); ignored on v1. A kernel without swap accounting
    /// has no such file, and the writer then leaves it out, as the kubelet does.
    #[serde(default)]
    pub memory_swap_max: Option<i64>,
}

/// A cgroup's memory use, as the eviction signals need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryUsage {
    /// v1 `memory.usage_in_bytes`, v2 `memory.current`.
    pub usage_bytes: u64,
    /// v1 `total_inactive_file`, v2 `inactive_file` from `memory.stat`.
    pub inactive_file_bytes: u64,
    /// `usage - inactive_file` (never below zero): the kubelet's working set.
    pub working_set_bytes: u64,
}

impl MemoryUsage {
    fn new(usage_bytes: u64, inactive_file_bytes: u64) -> MemoryUsage {
        MemoryUsage {
            usage_bytes,
            inactive_file_bytes,
            working_set_bytes: usage_bytes.saturating_sub(inactive_file_bytes),
        }
    }
}

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

/// Removes every directory of `dir`'s subtree leaf first, retrying `EBUSY` until `wait` has
/// passed; `procs` lists what is still inside a directory for the error.
pub(crate) fn remove_tree(
    dir: &Path,
    wait: Duration,
    procs: impl Fn(&Path) -> Vec<u32>,
) -> Result<(), CgroupError> {
    let start = std::time::Instant::now();
    for d in fs::subtree_leaf_first(dir)? {
        if !wait_for_anon(&d, start, wait) {
            tracing::debug!(cgroup = %d.display(), waited = ?start.elapsed(), "removing a cgroup that still holds anonymous memory");
        }
        let mut pause = Duration::from_millis(5);
        loop {
            match std::fs::remove_dir(&d) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) => {
                    if start.elapsed() >= wait {
                        return Err(CgroupError::Busy {
                            pids: procs(&d),
                            path: d,
                            waited: start.elapsed(),
                        });
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                Err(source) => return Err(CgroupError::Remove { path: d, source }),
            }
        }
    }
    Ok(())
}

/// Waits, until `wait` has passed since `start`, while the memory cgroup `dir` still holds
/// anonymous memory ([`anon_slack_bytes`] or more; a directory with no `memory.stat`, as in
/// v1's other hierarchies, is not waited for): the address space of a process that has left
/// it but is still being torn down, its pages on their way back. Removed before they are, the
/// cgroup would take with it the one place that shows them coming back, and the loop,
/// watching a victim whose cgroup is gone, could only count its memory as back and evict a
/// second pod while it was still charged. Past `wait` it is removed anyway: anonymous memory
/// a process elsewhere shares (copy-on-write) can stay charged to it for good.
fn wait_for_anon(dir: &Path, start: std::time::Instant, wait: Duration) -> bool {
    let stat = dir.join("memory.stat");
    let mut pause = Duration::from_millis(2);
    loop {
        let held = fs::read(&stat)
            .ok()
            .and_then(|text| stat_anon(&text))
            .is_some_and(|anon| anon >= anon_slack_bytes());
        if !held {
            return true;
        }
        if start.elapsed() >= wait {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

impl Resources {
    /// The cpu and memory part as `decide`'s [`ResourceConfig`], whose
    /// [`files`](crate::decide::cgroups::files()) says which file gets which value on each
    /// cgroup version: the writer and `reactor plan cgroups` share one mapping.
    pub fn config(&self) -> ResourceConfig {
        ResourceConfig {
            cpu_shares: self.cpu_shares,
            cpu_quota: self.cpu_quota_us,
            cpu_period: self.cpu_period_us,
            memory: self.memory_limit_bytes,
            memory_oom_group: self.memory_oom_group,
            memory_min: self.memory_min,
            memory_low: self.memory_low,
            memory_high: self.memory_high,
            memory_swap_max: self.memory_swap_max,
        }
    }
}

impl From<&ResourceConfig> for Resources {
    /// `decide`'s values for a cgroup; zero there means "not set" and stays unset here.
    fn from(c: &ResourceConfig) -> Resources {
        Resources {
            cpu_shares: c.cpu_shares.filter(|v| *v != 0),
            cpu_quota_us: c.cpu_quota.filter(|v| *v != 0),
            cpu_period_us: c.cpu_period.filter(|v| *v != 0),
            memory_limit_bytes: c.memory.filter(|v| *v != 0),
            pids_max: None,
            memory_oom_group: c.memory_oom_group,
            // Zero is a value here (`memory.swap.max` 0 is NoSwap; a tier's `memory.min` 0
            // clears an old protection), so these pass through as decided.
            memory_min: c.memory_min,
            memory_low: c.memory_low,
            memory_high: c.memory_high,
            memory_swap_max: c.memory_swap_max,
        }
    }
}

/// The cgroup files and values to write for `r` on `version`, in write order (a CFS period
/// before its quota), from `decide`'s mapping plus `pids.max`.
pub(crate) fn files_for(r: &Resources, version: CgroupVersion) -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, String)> = files(&r.config(), version)
        .into_iter()
        .map(|(name, value)| {
            let text = match value {
                FileValue::Int(i) => i.to_string(),
                FileValue::Text(t) => t,
            };
            (name, text)
        })
        .collect();
    if let Some(pids) = r.pids_max {
        out.push((
            "pids.max",
            if pids < 0 {
                "max".into()
            } else {
                pids.to_string()
            },
        ));
    }
    out
}

impl CgroupPath {
    /// The pod cgroup of a pod as `decide` sees it (`kubepods[/burstable|/besteffort]/pod<uid>`).
    pub fn for_pod(pod: &PodInfo) -> Result<CgroupPath, CgroupError> {
        if pod.uid.is_empty() {
            return Err(CgroupError::BadName {
                name: pod.name.clone(),
                reason: "the pod has no metadata.uid to name its cgroup",
            });
        }
        CgroupPath::parse(&pod_cgroup(pod))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `memory.stat` replaced whole (written aside, renamed over), as a reader never sees
    /// half a file.
    fn put_stat(dir: &Path, text: &str) {
        std::fs::write(dir.join("memory.stat.new"), text).unwrap();
        std::fs::rename(dir.join("memory.stat.new"), dir.join("memory.stat")).unwrap();
    }

    #[test]
    fn a_cgroup_is_removed_once_its_anonymous_memory_is_back_or_its_wait_is_over() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        put_stat(&dir, "anon 104857600\nfile 0\n");
        let freeing = {
            let dir = dir.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                put_stat(&dir, "anon 0\nfile 4096\n");
            })
        };
        assert!(wait_for_anon(
            &dir,
            std::time::Instant::now(),
            Duration::from_secs(30)
        ));
        assert_eq!(
            std::fs::read_to_string(dir.join("memory.stat")).unwrap(),
            "anon 0\nfile 4096\n",
            "it waited for the memory to be given back"
        );
        freeing.join().unwrap();
        put_stat(&dir, "total_rss 104857600\n");
        assert!(
            !wait_for_anon(&dir, std::time::Instant::now(), Duration::from_millis(20)),
            "held past the wait (v1's key): removed anyway"
        );
        put_stat(&dir, "total_rss 4096\n");
        assert!(wait_for_anon(
            &dir,
            std::time::Instant::now(),
            Duration::ZERO
        ));
        let other = tempfile::tempdir().unwrap();
        assert!(
            wait_for_anon(other.path(), std::time::Instant::now(), Duration::ZERO),
            "no memory.stat (another v1 hierarchy): nothing to wait for"
        );
    }

    #[test]
    fn names_cannot_escape() {
        for bad in ["..", ".", "", "a/b", "a\0b"] {
            assert!(CgroupPath::root().join(bad).is_err(), "{bad:?}");
        }
        assert!(CgroupPath::parse("kubepods/../etc").is_err());
        let p = CgroupPath::parse("/kubepods//burstable/").unwrap();
        assert_eq!(p.to_string(), "/kubepods/burstable");
        assert_eq!(
            p.under(Path::new("/m")),
            PathBuf::from("/m/kubepods/burstable")
        );
        assert_eq!(
            CgroupPath::pod(Some("besteffort"), "u1")
                .unwrap()
                .to_string(),
            "/kubepods/besteffort/podu1"
        );
        assert_eq!(
            CgroupPath::pod(None, "u1").unwrap().parent(),
            Some(CgroupPath::kubepods())
        );
    }

    #[test]
    fn decide_values_map_to_files() {
        let r = Resources::from(&ResourceConfig {
            cpu_shares: Some(1024),
            cpu_quota: Some(0),
            cpu_period: Some(100_000),
            memory: Some(-1),
            memory_oom_group: None,
            ..Default::default()
        });
        assert_eq!(r.cpu_quota_us, None);
        assert_eq!(
            files_for(&r, CgroupVersion::V2),
            [
                ("cpu.weight", "39".to_string()),
                ("cpu.max", "max 100000".into()),
                ("memory.max", "max".into())
            ]
        );
        let v1 = files_for(
            &Resources {
                pids_max: Some(10),
                ..r
            },
            CgroupVersion::V1,
        );
        assert_eq!(v1.first().map(|f| f.0), Some("cpu.shares"));
        assert_eq!(v1.last(), Some(&("pids.max", "10".to_string())));
    }

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
    fn pod_cgroup_from_the_pod_model() {
        let pod = crate::decide::pod::PodInfo::from_json(serde_json::json!({
            "metadata": {"name": "web", "uid": "u-1"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
        }))
        .unwrap();
        assert_eq!(
            CgroupPath::for_pod(&pod).unwrap().to_string(),
            "/kubepods/burstable/podu-1"
        );
    }
}
