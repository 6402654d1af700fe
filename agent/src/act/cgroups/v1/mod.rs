//! cgroup v1: one directory tree per mounted controller hierarchy.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{fs, CgroupError, CgroupPath, MemoryUsage, Resources};
use crate::decide::cgroups::CgroupVersion;

/// Controllers the kubelet (cgroupfs driver) needs a pod's cgroup in; all must be mounted.
pub(super) const REQUIRED: [&str; 4] = ["cpu", "cpuacct", "cpuset", "memory"];
/// Controllers it also uses where they are mounted.
const OPTIONAL: [&str; 2] = ["pids", "hugetlb"];

/// One mounted hierarchy: the controllers it carries and its directory for the cgroup root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hierarchy {
    /// Controllers mounted together here (`["cpu", "cpuacct"]` when co-mounted).
    pub controllers: Vec<String>,
    /// `<mount>/<cgroup root>`.
    pub root: PathBuf,
}

/// The v1 manager: the hierarchies found under the mount root.
#[derive(Debug, Clone)]
pub struct V1 {
    hierarchies: Vec<Hierarchy>,
}

impl V1 {
    /// Finds `<mount_root>/<controller>` for each controller the kubelet uses; co-mounted
    /// controllers (symlinks to one mount) collapse into one hierarchy. The cgroup root must
    /// already exist in each (it is the agent's delegated subtree, or the mount itself).
    pub fn new(mount_root: &Path, cgroup_root: &CgroupPath) -> Result<V1, CgroupError> {
        let mut hierarchies: Vec<(PathBuf, Hierarchy)> = Vec::new();
        for (controller, required) in REQUIRED
            .iter()
            .map(|c| (c, true))
            .chain(OPTIONAL.iter().map(|c| (c, false)))
        {
            let mount = mount_root.join(controller);
            let canonical = match mount.canonicalize() {
                Ok(c) => c,
                Err(_) if !required => continue,
                Err(e) => {
                    return Err(CgroupError::NoHierarchy {
                        version: "v1",
                        path: mount,
                        reason: format!("controller {controller} is not mounted there ({e})"),
                    })
                }
            };
            if let Some((_, h)) = hierarchies.iter_mut().find(|(c, _)| *c == canonical) {
                h.controllers.push(controller.to_string());
                continue;
            }
            let root = cgroup_root.under(&mount);
            if !root.is_dir() {
                return Err(CgroupError::NoHierarchy {
                    version: "v1",
                    path: root,
                    reason: "the cgroup root does not exist in this hierarchy".into(),
                });
            }
            hierarchies.push((
                canonical,
                Hierarchy {
                    controllers: vec![controller.to_string()],
                    root,
                },
            ));
        }
        Ok(V1 {
            hierarchies: hierarchies.into_iter().map(|(_, h)| h).collect(),
        })
    }

    /// The hierarchies in use.
    #[cfg(test)]
    pub(crate) fn hierarchies(&self) -> &[Hierarchy] {
        &self.hierarchies
    }

    fn hierarchy(&self, controller: &str) -> Option<&Hierarchy> {
        self.hierarchies
            .iter()
            .find(|h| h.controllers.iter().any(|c| c == controller))
    }

    fn dir(&self, controller: &str, cgroup: &CgroupPath) -> PathBuf {
        match self.hierarchy(controller) {
            Some(h) => cgroup.under(&h.root),
            // Every required controller was found in `new`; optional ones are only asked
            // for after checking. A path that does not exist still reports clearly.
            None => PathBuf::from(format!("<{controller} not mounted>")),
        }
    }

    /// The file `name` (its controller is the prefix before the first dot) of `cgroup`.
    fn file(&self, cgroup: &CgroupPath, name: &str) -> PathBuf {
        let controller = name.split('.').next().unwrap_or(name);
        let controller = if controller == "cgroup" || controller == "tasks" {
            "memory"
        } else {
            controller
        };
        self.dir(controller, cgroup).join(name)
    }

    pub(super) fn create(&self, cgroup: &CgroupPath) -> Result<(), CgroupError> {
        for h in &self.hierarchies {
            let cpuset = h.controllers.iter().any(|c| c == "cpuset");
            let mut dir = h.root.clone();
            for name in cgroup.names() {
                let parent = dir.clone();
                dir.push(name);
                fs::mkdir(&dir)?;
                if cpuset {
                    seed_cpuset(&parent, &dir)?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn apply(&self, cgroup: &CgroupPath, r: &Resources) -> Result<(), CgroupError> {
        for (name, value) in super::files_for(r, CgroupVersion::V1) {
            if name == "pids.max" && self.hierarchy("pids").is_none() {
                continue;
            }
            let path = self.file(cgroup, name);
            match fs::write(&path, &value) {
                Err(CgroupError::Write { source, .. })
                    if name == "memory.limit_in_bytes"
                        && source.raw_os_error()
                            == Some(rustix::io::Errno::BUSY.raw_os_error()) =>
                {
                    let usage =
                        fs::read_u64(&self.file(cgroup, "memory.usage_in_bytes")).unwrap_or(0);
                    return Err(CgroupError::LimitBelowUsage { path, value, usage });
                }
                other => other?,
            }
        }
        Ok(())
    }

    pub(super) fn read_file(&self, cgroup: &CgroupPath, name: &str) -> Result<String, CgroupError> {
        fs::read(&self.file(cgroup, name))
    }

    pub(super) fn exists(&self, cgroup: &CgroupPath) -> bool {
        self.hierarchies
            .iter()
            .all(|h| cgroup.under(&h.root).is_dir())
    }

    pub(super) fn procs_files(&self, cgroup: &CgroupPath) -> Vec<PathBuf> {
        self.hierarchies
            .iter()
            .map(|h| cgroup.under(&h.root).join("cgroup.procs"))
            .collect()
    }

    pub(super) fn procs_recursive(&self, cgroup: &CgroupPath) -> Result<Vec<u32>, CgroupError> {
        let dirs: Vec<PathBuf> = self
            .hierarchies
            .iter()
            .map(|h| cgroup.under(&h.root))
            .collect();
        fs::pids_below(dirs.iter().map(PathBuf::as_path))
    }

    pub(super) fn memory_procs_recursive(
        &self,
        cgroup: &CgroupPath,
    ) -> Result<Vec<u32>, CgroupError> {
        fs::pids_below([self.dir("memory", cgroup).as_path()])
    }

    pub(super) fn memory_usage(&self, cgroup: &CgroupPath) -> Result<MemoryUsage, CgroupError> {
        let usage = fs::read_u64(&self.file(cgroup, "memory.usage_in_bytes"))?;
        let inactive =
            fs::read_key(&self.file(cgroup, "memory.stat"), "total_inactive_file")?.unwrap_or(0);
        Ok(MemoryUsage::new(usage, inactive))
    }

    pub(super) fn oom_kills(&self, cgroup: &CgroupPath) -> Result<u64, CgroupError> {
        Ok(fs::read_key(&self.file(cgroup, "memory.oom_control"), "oom_kill")?.unwrap_or(0))
    }

    /// Removes `cgroup`'s subtree (never the root: [`super::CgroupManager::remove`] refuses it).
    pub(super) fn remove(&self, cgroup: &CgroupPath, wait: Duration) -> Result<(), CgroupError> {
        for h in &self.hierarchies {
            super::remove_tree(&cgroup.under(&h.root), wait, |d| {
                fs::read_pids(&d.join("cgroup.procs")).unwrap_or_default()
            })?;
        }
        Ok(())
    }
}

/// A new cpuset cgroup starts with empty `cpuset.cpus`/`cpuset.mems`, and no task can join
/// it until they are set: copy the parent's (as the kubelet's libcontainer does). Done
/// whenever they are empty, so a cgroup left half-made by a crash is repaired too.
fn seed_cpuset(parent: &Path, dir: &Path) -> Result<(), CgroupError> {
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let path = dir.join(file);
        if !path.exists() {
            // Not a cpuset cgroupfs (the kernel always creates these): nothing to seed.
            continue;
        }
        if fs::read(&path)?.is_empty() {
            let value = fs::read(&parent.join(file))?;
            fs::write(&path, &value)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
