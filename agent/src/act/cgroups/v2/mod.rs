//! cgroup v2: the unified hierarchy, one tree with controllers enabled per subtree.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{fs, CgroupError, CgroupPath, MemoryUsage, Resources};
use crate::decide::cgroups::{CgroupVersion, MEMORY_SWAP_MAX};

/// Controllers the kubelet enables for the pod tree, where the parent offers them.
const CONTROLLERS: [&str; 6] = ["cpuset", "cpu", "io", "memory", "hugetlb", "pids"];

/// The v2 manager: `<mount>/<cgroup root>` of the unified hierarchy.
#[derive(Debug, Clone)]
pub struct V2 {
    root: PathBuf,
}

impl V2 {
    /// Uses the unified hierarchy mounted at `mount_root`; the cgroup root must exist.
    pub fn new(mount_root: &Path, cgroup_root: &CgroupPath) -> Result<V2, CgroupError> {
        if !mount_root.join("cgroup.controllers").exists() {
            return Err(CgroupError::NoHierarchy {
                version: "v2",
                path: mount_root.to_path_buf(),
                reason: "no cgroup.controllers: not a unified (cgroup2) mount".into(),
            });
        }
        let root = cgroup_root.under(mount_root);
        if !root.join("cgroup.controllers").exists() {
            return Err(CgroupError::NoHierarchy {
                version: "v2",
                path: root,
                reason: "the cgroup root does not exist".into(),
            });
        }
        Ok(V2 { root })
    }

    /// `<mount>/<cgroup root>`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn file(&self, cgroup: &CgroupPath, name: &str) -> PathBuf {
        cgroup.under(&self.root).join(name)
    }

    /// Enables in `dir`'s `cgroup.subtree_control` every kubelet controller it offers and
    /// has not enabled yet, one write per controller so a refusal names it.
    fn enable_controllers(dir: &Path) -> Result<(), CgroupError> {
        let offered = fs::read(&dir.join("cgroup.controllers"))?;
        let control = dir.join("cgroup.subtree_control");
        let enabled = fs::read(&control)?;
        for c in CONTROLLERS {
            let has = |list: &str| list.split_whitespace().any(|x| x == c);
            if has(&offered) && !has(&enabled) {
                fs::write(&control, &format!("+{c}"))?;
            }
        }
        Ok(())
    }

    pub(super) fn create(&self, cgroup: &CgroupPath) -> Result<(), CgroupError> {
        let mut dir = self.root.clone();
        for name in cgroup.names() {
            Self::enable_controllers(&dir)?;
            dir.push(name);
            fs::mkdir(&dir)?;
        }
        Ok(())
    }

    pub(super) fn apply(&self, cgroup: &CgroupPath, r: &Resources) -> Result<(), CgroupError> {
        for (name, value) in super::files_for(r, CgroupVersion::V2) {
            let path = self.file(cgroup, name);
            // A kernel without swap accounting has no `memory.swap.max`: the kubelet then
            // configures no swap at all (`swapControllerAvailable`), and so does this.
            if name == MEMORY_SWAP_MAX && !path.exists() {
                continue;
            }
            fs::write(&path, &value)?;
        }
        Ok(())
    }

    /// Whether the kernel offers swap control under the pod tree: `kubepods/memory.swap.max`
    /// exists (the cgroup root's own may not: the hierarchy's root has none).
    pub(super) fn swap_controller_available(&self) -> bool {
        self.file(&CgroupPath::kubepods(), MEMORY_SWAP_MAX).exists()
    }

    pub(super) fn read_file(&self, cgroup: &CgroupPath, name: &str) -> Result<String, CgroupError> {
        fs::read(&self.file(cgroup, name))
    }

    pub(super) fn exists(&self, cgroup: &CgroupPath) -> bool {
        cgroup.under(&self.root).is_dir()
    }

    pub(super) fn procs_files(&self, cgroup: &CgroupPath) -> Vec<PathBuf> {
        vec![self.file(cgroup, "cgroup.procs")]
    }

    pub(super) fn procs_recursive(&self, cgroup: &CgroupPath) -> Result<Vec<u32>, CgroupError> {
        fs::pids_below([cgroup.under(&self.root).as_path()])
    }

    pub(super) fn memory_procs_recursive(
        &self,
        cgroup: &CgroupPath,
    ) -> Result<Vec<u32>, CgroupError> {
        self.procs_recursive(cgroup)
    }

    pub(super) fn memory_usage(&self, cgroup: &CgroupPath) -> Result<MemoryUsage, CgroupError> {
        let usage = fs::read_u64(&self.file(cgroup, "memory.current"))?;
        let inactive =
            fs::read_key(&self.file(cgroup, "memory.stat"), "inactive_file")?.unwrap_or(0);
        Ok(MemoryUsage::new(usage, inactive))
    }

    pub(super) fn oom_kills(&self, cgroup: &CgroupPath) -> Result<u64, CgroupError> {
        Ok(fs::read_key(&self.file(cgroup, "memory.events"), "oom_kill")?.unwrap_or(0))
    }

    /// Removes `cgroup`'s subtree (never the root: [`super::CgroupManager::remove`] refuses it).
    pub(super) fn remove(&self, cgroup: &CgroupPath, wait: Duration) -> Result<(), CgroupError> {
        super::remove_tree(&cgroup.under(&self.root), wait, |d| {
            fs::read_pids(&d.join("cgroup.procs")).unwrap_or_default()
        })
    }
}

#[cfg(test)]
mod tests;
