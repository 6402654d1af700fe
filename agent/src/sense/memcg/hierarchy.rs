//! Where the memory controller lives: the cgroup mounts read from `/proc/self/mountinfo`, the
//! v1 memory hierarchy or the v2 unified one, and a cgroup's directory inside it.

use std::path::{Component, Path, PathBuf};

/// Why the memory hierarchy was not found, or a cgroup path was refused. `Clone`, as every
/// source that needs the hierarchy reports the same reason when it is missing.
#[derive(Clone, Debug, thiserror::Error)]
pub enum HierarchyError {
    /// `/proc/self/mountinfo` could not be read.
    #[error("cannot read /proc/self/mountinfo: {0}")]
    Mountinfo(#[source] std::sync::Arc<std::io::Error>),
    /// cgroup2 is mounted without the memory controller, and no v1 memory hierarchy is.
    #[error("cgroup2 at {} has no memory controller and no v1 memory hierarchy is mounted", .0.display())]
    NoV2Memory(PathBuf),
    /// No cgroup hierarchy with the memory controller is mounted.
    #[error("no memory cgroup hierarchy is mounted")]
    NotMounted,
    /// A cgroup path that would leave the hierarchy.
    #[error("cgroup path {0:?} must not contain \"..\"")]
    ClimbsOut(String),
}

/// Where the memory controller lives on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemoryHierarchy {
    /// The v1 memory controller mounted at this directory.
    V1(PathBuf),
    /// The v2 unified hierarchy (with the memory controller) mounted at this directory.
    V2(PathBuf),
}

/// Mount points of cgroup hierarchies found in `/proc/self/mountinfo`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CgroupMounts {
    /// The v1 hierarchy that has the memory controller.
    pub v1_memory: Option<PathBuf>,
    /// The cgroup2 mount.
    pub v2: Option<PathBuf>,
}

/// Finds the cgroup mounts in the text of `/proc/self/mountinfo`.
pub(crate) fn parse_mountinfo(text: &str) -> CgroupMounts {
    let mut mounts = CgroupMounts::default();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some(dash) = fields.iter().position(|&f| f == "-") else {
            continue;
        };
        let (Some(mount_point), Some(fstype)) = (fields.get(4), fields.get(dash + 1)) else {
            continue;
        };
        let mount_point = PathBuf::from(mount_point.replace("\\040", " "));
        let super_opts = fields.get(dash + 3).copied().unwrap_or_default();
        match *fstype {
            "cgroup" if super_opts.split(',').any(|o| o == "memory") => {
                mounts.v1_memory.get_or_insert(mount_point);
            }
            "cgroup2" => {
                mounts.v2.get_or_insert(mount_point);
            }
            _ => {}
        }
    }
    mounts
}

impl MemoryHierarchy {
    /// Finds the memory controller: the v1 memory hierarchy if one is mounted (the
    /// controller can be bound to only one hierarchy), else cgroup2 if its root lists
    /// `memory` in `cgroup.controllers`.
    pub(crate) fn detect() -> Result<MemoryHierarchy, HierarchyError> {
        let text = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| HierarchyError::Mountinfo(std::sync::Arc::new(e)))?;
        let mounts = parse_mountinfo(&text);
        if let Some(root) = mounts.v1_memory {
            return Ok(MemoryHierarchy::V1(root));
        }
        if let Some(root) = mounts.v2 {
            let controllers =
                std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            if controllers.split_whitespace().any(|c| c == "memory") {
                return Ok(MemoryHierarchy::V2(root));
            }
            return Err(HierarchyError::NoV2Memory(root));
        }
        Err(HierarchyError::NotMounted)
    }

    /// The hierarchy's mount point.
    pub fn root(&self) -> &Path {
        match self {
            MemoryHierarchy::V1(root) | MemoryHierarchy::V2(root) => root,
        }
    }

    /// `"v1"` or `"v2"`, for logs.
    pub fn version(&self) -> &'static str {
        match self {
            MemoryHierarchy::V1(_) => "v1",
            MemoryHierarchy::V2(_) => "v2",
        }
    }

    /// The directory of a cgroup given as a path inside the hierarchy; refuses paths that
    /// would leave it (`..`).
    pub(crate) fn dir(&self, cgroup: &str) -> Result<PathBuf, HierarchyError> {
        cgroup_dir(self.root(), cgroup)
    }
}

/// Joins a cgroup path under a hierarchy root so that it cannot escape it.
pub fn cgroup_dir(root: &Path, cgroup: &str) -> Result<PathBuf, HierarchyError> {
    let mut dir = root.to_path_buf();
    for component in Path::new(cgroup).components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => dir.push(part),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(HierarchyError::ClimbsOut(cgroup.to_string()));
            }
        }
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 25 0:27 / /sys/fs/cgroup/unified rw,relatime shared:7 - cgroup2 cgroup2 rw,nsdelegate
33 25 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 25 0:30 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
";

    #[test]
    fn finds_v1_memory_and_v2_mounts() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.v1_memory, Some(PathBuf::from("/sys/fs/cgroup/memory")));
        assert_eq!(m.v2, Some(PathBuf::from("/sys/fs/cgroup/unified")));
    }

    #[test]
    fn pure_v2_node_has_no_v1_memory() {
        let m = parse_mountinfo(
            "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n",
        );
        assert_eq!(m.v1_memory, None);
        assert_eq!(m.v2, Some(PathBuf::from("/sys/fs/cgroup")));
    }

    #[test]
    fn cgroup_dirs_stay_inside_the_root() {
        let root = Path::new("/sys/fs/cgroup/memory");
        assert_eq!(cgroup_dir(root, "/").unwrap(), root);
        assert_eq!(
            cgroup_dir(root, "/kubepods/burstable").unwrap(),
            root.join("kubepods/burstable")
        );
        assert_eq!(cgroup_dir(root, "kubepods").unwrap(), root.join("kubepods"));
        assert!(cgroup_dir(root, "/kubepods/../../etc").is_err());
    }
}
