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
        let mut pids = Vec::new();
        for h in &self.hierarchies {
            for dir in fs::subtree_leaf_first(&cgroup.under(&h.root))? {
                pids.extend(fs::read_pids(&dir.join("cgroup.procs"))?);
            }
        }
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    pub(super) fn memory_procs_recursive(
        &self,
        cgroup: &CgroupPath,
    ) -> Result<Vec<u32>, CgroupError> {
        let mut pids = Vec::new();
        for dir in fs::subtree_leaf_first(&self.dir("memory", cgroup))? {
            pids.extend(fs::read_pids(&dir.join("cgroup.procs"))?);
        }
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
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

    pub(super) fn remove(&self, cgroup: &CgroupPath, wait: Duration) -> Result<(), CgroupError> {
        if cgroup.is_root() {
            return Err(CgroupError::BadName {
                name: "/".into(),
                reason: "refusing to remove the cgroup root",
            });
        }
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
mod tests {
    use super::super::CgroupManager;
    use super::*;

    /// A temp dir laid out like a v1 mount with the files the kernel would create.
    fn fixture() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        for c in ["cpu", "cpuacct", "cpuset", "memory", "pids"] {
            std::fs::create_dir_all(tmp.path().join(c).join("agent")).unwrap();
        }
        std::fs::write(tmp.path().join("cpuset/agent/cpuset.cpus"), "0-3\n").unwrap();
        std::fs::write(tmp.path().join("cpuset/agent/cpuset.mems"), "0\n").unwrap();
        tmp
    }

    fn set_fixture(tmp: &Path, controller: &str, cgroup: &str, file: &str, value: &str) {
        let dir = tmp.join(controller).join("agent").join(cgroup);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(file), value).unwrap();
    }

    fn read(tmp: &Path, controller: &str, cgroup: &str, file: &str) -> String {
        std::fs::read_to_string(tmp.join(controller).join("agent").join(cgroup).join(file)).unwrap()
    }

    #[test]
    fn apply_writes_the_kubelet_files() {
        let tmp = fixture();
        let cg = "kubepods/burstable/podu1";
        for (c, f) in [
            ("cpu", "cpu.shares"),
            ("cpu", "cpu.cfs_quota_us"),
            ("cpu", "cpu.cfs_period_us"),
            ("memory", "memory.limit_in_bytes"),
            ("pids", "pids.max"),
        ] {
            set_fixture(tmp.path(), c, cg, f, "0\n");
        }
        let m = CgroupManager::v1(tmp.path(), &CgroupPath::parse("agent").unwrap()).unwrap();
        let pod = CgroupPath::parse(cg).unwrap();
        m.apply(
            &pod,
            &Resources {
                cpu_shares: Some(512),
                cpu_quota_us: Some(50_000),
                cpu_period_us: Some(100_000),
                memory_limit_bytes: Some(256 << 20),
                pids_max: Some(-1),
                memory_oom_group: None,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(read(tmp.path(), "cpu", cg, "cpu.shares"), "512");
        assert_eq!(read(tmp.path(), "cpu", cg, "cpu.cfs_quota_us"), "50000");
        assert_eq!(read(tmp.path(), "cpu", cg, "cpu.cfs_period_us"), "100000");
        assert_eq!(
            read(tmp.path(), "memory", cg, "memory.limit_in_bytes"),
            "268435456"
        );
        assert_eq!(read(tmp.path(), "pids", cg, "pids.max"), "max");
        assert_eq!(m.read_file(&pod, "cpu.shares").unwrap(), "512");
        // Unset values leave files alone.
        m.apply(
            &pod,
            &Resources {
                cpu_shares: Some(2),
                ..Resources::default()
            },
        )
        .unwrap();
        assert_eq!(
            read(tmp.path(), "memory", cg, "memory.limit_in_bytes"),
            "268435456"
        );
    }

    #[test]
    fn a_missing_file_is_never_created_and_the_error_names_path_and_value() {
        let tmp = fixture();
        let m = CgroupManager::v1(tmp.path(), &CgroupPath::parse("agent").unwrap()).unwrap();
        let cg = CgroupPath::parse("kubepods").unwrap();
        m.create(&cg).unwrap();
        let err = m
            .apply(
                &cg,
                &Resources {
                    memory_limit_bytes: Some(4096),
                    ..Default::default()
                },
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("memory/agent/kubepods/memory.limit_in_bytes"),
            "{err}"
        );
        assert!(err.contains("\"4096\""), "{err}");
        assert!(!tmp
            .path()
            .join("memory/agent/kubepods/memory.limit_in_bytes")
            .exists());
    }

    #[test]
    fn create_makes_every_hierarchy_and_seeds_cpuset() {
        let tmp = fixture();
        // What the kernel creates in a new cpuset cgroup: empty cpus/mems.
        set_fixture(tmp.path(), "cpuset", "kubepods", "cpuset.cpus", "\n");
        set_fixture(tmp.path(), "cpuset", "kubepods", "cpuset.mems", "\n");
        let m = CgroupManager::v1(tmp.path(), &CgroupPath::parse("agent").unwrap()).unwrap();
        let CgroupManager::V1(v1) = &m else {
            panic!("v1")
        };
        assert_eq!(v1.hierarchies().len(), 5);
        let cg = CgroupPath::parse("kubepods/besteffort").unwrap();
        m.create(&cg).unwrap();
        for c in ["cpu", "cpuacct", "cpuset", "memory", "pids"] {
            assert!(
                tmp.path()
                    .join(c)
                    .join("agent/kubepods/besteffort")
                    .is_dir(),
                "{c}"
            );
        }
        assert_eq!(read(tmp.path(), "cpuset", "kubepods", "cpuset.cpus"), "0-3");
        assert_eq!(read(tmp.path(), "cpuset", "kubepods", "cpuset.mems"), "0");
        assert!(m.exists(&cg));
        assert!(!m.exists(&cg.join("podx").unwrap()));
        // Creating again is fine.
        m.create(&cg).unwrap();
    }

    #[test]
    fn colocated_controllers_are_one_hierarchy() {
        let tmp = tempfile::tempdir().unwrap();
        for c in ["cpu,cpuacct", "cpuset", "memory"] {
            std::fs::create_dir_all(tmp.path().join(c)).unwrap();
        }
        std::os::unix::fs::symlink("cpu,cpuacct", tmp.path().join("cpu")).unwrap();
        std::os::unix::fs::symlink("cpu,cpuacct", tmp.path().join("cpuacct")).unwrap();
        let m = CgroupManager::v1(tmp.path(), &CgroupPath::root()).unwrap();
        let CgroupManager::V1(v1) = &m else { panic!() };
        assert_eq!(v1.hierarchies().len(), 3);
        assert_eq!(v1.hierarchies()[0].controllers, ["cpu", "cpuacct"]);
        let missing = tempfile::tempdir().unwrap();
        let err = CgroupManager::v1(missing.path(), &CgroupPath::root()).unwrap_err();
        assert!(
            err.to_string().contains("controller cpu is not mounted"),
            "{err}"
        );
    }

    #[test]
    fn usage_oom_kills_and_procs_read_back() {
        let tmp = fixture();
        let cg = "kubepods/podu2";
        set_fixture(
            tmp.path(),
            "memory",
            cg,
            "memory.usage_in_bytes",
            "1000000\n",
        );
        set_fixture(
            tmp.path(),
            "memory",
            cg,
            "memory.stat",
            "cache 5\ninactive_file 1\ntotal_inactive_file 300000\n",
        );
        set_fixture(
            tmp.path(),
            "memory",
            cg,
            "memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        );
        for c in ["cpu", "cpuacct", "cpuset", "memory", "pids"] {
            set_fixture(tmp.path(), c, cg, "cgroup.procs", "");
        }
        set_fixture(tmp.path(), "memory", cg, "cgroup.procs", "12\n7\n");
        set_fixture(tmp.path(), "cpu", cg, "cgroup.procs", "7\n");
        let m = CgroupManager::v1(tmp.path(), &CgroupPath::parse("agent").unwrap()).unwrap();
        let pod = CgroupPath::parse(cg).unwrap();
        let usage = m.memory_usage(&pod).unwrap();
        assert_eq!(usage.working_set_bytes, 700_000);
        assert_eq!(m.oom_kills(&pod).unwrap(), 3);
        assert_eq!(m.procs(&pod).unwrap(), vec![7, 12]);
        assert!(!m.is_empty(&pod).unwrap());
        set_fixture(tmp.path(), "memory", cg, "cgroup.procs", "x\n");
        let err = m.procs(&pod).unwrap_err().to_string();
        assert!(
            err.contains("memory/agent/kubepods/podu2/cgroup.procs"),
            "{err}"
        );
    }
}
