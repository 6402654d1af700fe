//! Turning what the kernel gives us (a memory cgroup id, or a pid) into the cgroup path that
//! `PressureEvent::cgroup` carries.
//!
//! The programs record the memory cgroup's kernfs id, which on 64-bit kernels is also the
//! inode number of the cgroup's directory in the memory hierarchy (v1
//! `/sys/fs/cgroup/memory`, or the v2 mount). Two halves, so the ring-buffer drain never
//! does I/O for a name:
//!
//! - [`NameCache`], shared: id → path, read by the drain with one hash lookup
//!   ([`NameCache::get`]); a miss sends the record to the resolver instead.
//! - [`CgroupNames`], the resolver's, off the drain path: resolves an id with
//!   `open_by_handle_at(2)` on the hierarchy's mount (a kernfs file handle *is* the id:
//!   cgroupfs exports them, v1 and v2 alike, so an id resolves without a walk) and the
//!   opened directory's path, falling back to walking the hierarchy where handles are refused
//!   (no `CAP_DAC_READ_SEARCH`, or a kernel without kernfs export); ids still unknown (a
//!   cgroup already removed) are remembered for a second so a storm of events from a vanished
//!   cgroup cannot make it walk in a loop. A pid is mapped through `/proc/<pid>/cgroup`
//!   (the memory line).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// How long an id that no walk could find stays "unknown" before we walk again for it.
const NEGATIVE_TTL: Duration = Duration::from_secs(1);
/// Upper bound on cached entries, so a churn of short-lived cgroups cannot grow the cache.
const MAX_ENTRIES: usize = 65_536;

/// Which cgroup hierarchy holds the memory controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryHierarchy {
    /// cgroup v1: the memory controller's own mount.
    V1(PathBuf),
    /// cgroup v2: the unified mount.
    V2(PathBuf),
}

impl MemoryHierarchy {
    /// The mount point.
    pub fn root(&self) -> &Path {
        match self {
            MemoryHierarchy::V1(p) | MemoryHierarchy::V2(p) => p,
        }
    }
}

/// Finds the memory controller's hierarchy in a `/proc/self/mountinfo` text: a v1 `cgroup`
/// mount with the `memory` option wins; otherwise a `cgroup2` mount.
pub(crate) fn find_memory_hierarchy(mountinfo: &str) -> Option<MemoryHierarchy> {
    let mut v2 = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount_point) = left.split_whitespace().nth(4) else {
            continue;
        };
        let mut r = right.split_whitespace();
        let (fstype, _source, options) = (r.next(), r.next(), r.next().unwrap_or(""));
        match fstype {
            Some("cgroup") if options.split(',').any(|o| o == "memory") => {
                return Some(MemoryHierarchy::V1(PathBuf::from(mount_point)));
            }
            Some("cgroup2") if v2.is_none() => v2 = Some(PathBuf::from(mount_point)),
            _ => {}
        }
    }
    v2.map(MemoryHierarchy::V2)
}

/// The memory cgroup path in a `/proc/<pid>/cgroup` text: the v1 line naming `memory`, or the
/// v2 `0::` line.
pub(crate) fn parse_proc_cgroup(text: &str, v1: bool) -> Option<String> {
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = if v1 {
            controllers.split(',').any(|c| c == "memory")
        } else {
            id == "0" && controllers.is_empty()
        };
        matches.then(|| path.to_string())
    })
}

/// The id → path cache the drain reads and the resolver fills; cheap to clone (shared).
#[derive(Clone, Debug, Default)]
pub struct NameCache(Arc<RwLock<HashMap<u64, String>>>);

impl NameCache {
    /// The cached path of memory cgroup `id`, without any I/O.
    pub fn get(&self, id: u64) -> Option<String> {
        let map = self.0.read().unwrap_or_else(|e| e.into_inner());
        map.get(&id).cloned()
    }

    fn insert(&self, id: u64, path: String) {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_ENTRIES {
            map.clear();
        }
        map.insert(id, path);
    }

    fn len(&self) -> usize {
        self.0.read().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Memory-cgroup id → path and pid → path lookups, filling a shared [`NameCache`].
#[derive(Debug)]
pub struct CgroupNames {
    hierarchy: Option<MemoryHierarchy>,
    /// The hierarchy's mount, opened once for `open_by_handle_at`; `None` once handles were
    /// refused (then ids are found by walking).
    mount: Option<OwnedFd>,
    cache: NameCache,
    unknown: HashMap<u64, Instant>,
}

impl CgroupNames {
    /// Finds the memory hierarchy from `/proc/self/mountinfo`.
    pub fn discover() -> CgroupNames {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        CgroupNames::new(find_memory_hierarchy(&mountinfo))
    }

    /// Uses the given hierarchy (`None`: no cgroup names at all).
    pub fn new(hierarchy: Option<MemoryHierarchy>) -> CgroupNames {
        // File handles are kernfs ids only on cgroupfs itself.
        let mount = hierarchy.as_ref().and_then(|h| {
            let fd = rustix::fs::open(
                h.root(),
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .ok()?;
            let magic = rustix::fs::fstatfs(&fd).ok()?.f_type as i64;
            [CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC]
                .contains(&magic)
                .then_some(fd)
        });
        CgroupNames {
            hierarchy,
            mount,
            cache: NameCache::default(),
            unknown: HashMap::new(),
        }
    }

    /// Whether ids are resolved by kernfs file handle (no walk) rather than by walking.
    pub fn resolves_by_handle(&self) -> bool {
        self.mount.is_some()
    }

    /// The cache this resolver fills, for the drain to read.
    pub fn cache(&self) -> NameCache {
        self.cache.clone()
    }

    /// The path of the memory cgroup with this id (`/` for the root), if it exists.
    pub fn by_id(&mut self, id: u64) -> Option<String> {
        if id == 0 {
            return None;
        }
        if let Some(path) = self.cache.get(id) {
            return Some(path);
        }
        if let Some(since) = self.unknown.get(&id) {
            if since.elapsed() < NEGATIVE_TTL {
                return None;
            }
        }
        let found = match self.by_handle(id) {
            Ok(found) => found,
            Err(()) => {
                self.rescan();
                self.cache.get(id)
            }
        };
        match found {
            Some(path) => {
                self.unknown.remove(&id);
                self.cache.insert(id, path.clone());
                Some(path)
            }
            None => {
                if self.unknown.len() >= MAX_ENTRIES {
                    self.unknown.clear();
                }
                self.unknown.insert(id, Instant::now());
                None
            }
        }
    }

    /// Opens the cgroup by its kernfs file handle and reads back its path: `Ok(None)` when no
    /// cgroup has that id (any more), `Err` when handles cannot be used here (then walk).
    fn by_handle(&mut self, id: u64) -> Result<Option<String>, ()> {
        let (Some(mount), Some(root)) = (&self.mount, self.hierarchy.as_ref().map(|h| h.root()))
        else {
            return Err(());
        };
        match open_kernfs_handle(mount, id) {
            Ok(dir) => {
                let link = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd()));
                match link.ok().and_then(|p| relative_cgroup_path(root, &p)) {
                    Some(path) => Ok(Some(path)),
                    None => Err(()),
                }
            }
            // No such id: a cgroup removed (or an id of another hierarchy).
            Err(rustix::io::Errno::STALE | rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => {
                tracing::debug!(error = %e, "cgroup ids by file handle refused; walking the hierarchy instead");
                self.mount = None;
                Err(())
            }
        }
    }

    /// The memory cgroup path of a live (or not yet reaped) task, from `/proc/<pid>/cgroup`.
    pub(crate) fn by_pid(&self, pid: u32) -> Option<String> {
        let v1 = matches!(self.hierarchy, Some(MemoryHierarchy::V1(_)));
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        parse_proc_cgroup(&text, v1)
    }

    /// Remembers that `path` has this id (learned elsewhere), saving a lookup later.
    pub(crate) fn remember(&mut self, id: u64, path: String) {
        if id != 0 {
            self.cache.insert(id, path);
        }
    }

    /// The id (directory inode) of the memory cgroup at `path`, as the programs report it.
    pub fn id_of(&self, path: &str) -> Option<u64> {
        let root = self.hierarchy.as_ref()?.root();
        let dir = root.join(path.trim_start_matches('/'));
        std::fs::metadata(dir).ok().map(|m| m.ino())
    }

    /// Walks the whole hierarchy into the cache (entries already there stay).
    fn rescan(&mut self) {
        let Some(root) = self.hierarchy.as_ref().map(|h| h.root().to_path_buf()) else {
            return;
        };
        let mut stack = vec![(root, String::from("/"))];
        while let Some((dir, path)) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue;
            };
            if self.cache.len() >= MAX_ENTRIES {
                break;
            }
            self.cache.insert(meta.ino(), path.clone());
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let child = if path == "/" {
                        format!("/{name}")
                    } else {
                        format!("{path}/{name}")
                    };
                    stack.push((entry.path(), child));
                }
            }
        }
    }
}

/// `path` (an absolute path below `root`) as a cgroup path (`/`, `/a/b`).
fn relative_cgroup_path(root: &Path, path: &Path) -> Option<String> {
    let rest = path.strip_prefix(root).ok()?;
    let rest = rest.to_str()?;
    Some(format!("/{rest}"))
}

/// The kernel's `struct file_handle` with the 8-byte payload of a kernfs handle.
#[repr(C)]
struct KernfsHandle {
    handle_bytes: u32,
    handle_type: i32,
    id: u64,
}

/// `statfs` magic of cgroup v1 and v2 mounts.
const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// `FILEID_KERNFS`: a kernfs node's 64-bit id as the handle (`include/linux/exportfs.h`).
const FILEID_KERNFS: i32 = 0xfe;

/// Opens the kernfs node `id` below the mount `mount` (needs `CAP_DAC_READ_SEARCH`).
fn open_kernfs_handle(mount: &OwnedFd, id: u64) -> Result<OwnedFd, rustix::io::Errno> {
    let mut handle = KernfsHandle {
        handle_bytes: 8,
        handle_type: FILEID_KERNFS,
        id,
    };
    // SAFETY: `handle` is a valid `struct file_handle` with `handle_bytes` of payload that
    // lives for the call; the kernel only reads it. The mount fd is open (borrowed).
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            (&mut handle as *mut KernfsHandle).cast::<libc::file_handle>(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(rustix::io::Errno::from_raw_os_error(
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        ));
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 254:0 / / rw,relatime - ext4 /dev/vda rw
30 29 0:26 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
31 29 0:27 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 29 0:35 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn v1_memory_mount_wins_over_v2() {
        assert_eq!(
            find_memory_hierarchy(MOUNTINFO),
            Some(MemoryHierarchy::V1("/sys/fs/cgroup/memory".into()))
        );
        let only_v2: String = MOUNTINFO
            .lines()
            .filter(|l| !l.contains("memory"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            find_memory_hierarchy(&only_v2),
            Some(MemoryHierarchy::V2("/sys/fs/cgroup/unified".into()))
        );
        assert_eq!(find_memory_hierarchy("garbage\n"), None);
    }

    #[test]
    fn proc_cgroup_memory_line() {
        let text = "12:pids:/a\n4:memory:/kubepods/pod1/c1\n0::/user.slice\n";
        assert_eq!(
            parse_proc_cgroup(text, true).as_deref(),
            Some("/kubepods/pod1/c1")
        );
        assert_eq!(
            parse_proc_cgroup(text, false).as_deref(),
            Some("/user.slice")
        );
        assert_eq!(parse_proc_cgroup("3:cpu,cpuacct:/x\n", true), None);
        assert_eq!(
            parse_proc_cgroup("5:memory,hugetlb:/y\n", true).as_deref(),
            Some("/y")
        );
    }

    #[test]
    fn ids_are_directory_inodes_of_a_walked_tree() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("kubepods/pod1")).unwrap();
        let mut names = CgroupNames::new(Some(MemoryHierarchy::V1(tmp.path().to_path_buf())));
        // Not cgroupfs: no file handles, the walk.
        assert!(!names.resolves_by_handle());
        let id = names.id_of("/kubepods/pod1").unwrap();
        let cache = names.cache();
        assert_eq!(cache.get(id), None);
        assert_eq!(names.by_id(id).as_deref(), Some("/kubepods/pod1"));
        // What the resolver learned, the drain's cache has.
        assert_eq!(cache.get(id).as_deref(), Some("/kubepods/pod1"));
        let root = names.id_of("/").unwrap();
        assert_eq!(names.by_id(root).as_deref(), Some("/"));
        assert_eq!(names.by_id(0), None);
        // A cgroup made after the first walk is found by the walk an unknown id triggers.
        std::fs::create_dir(tmp.path().join("late")).unwrap();
        let late = names.id_of("/late").unwrap();
        assert_eq!(names.by_id(late).as_deref(), Some("/late"));
        // An id that exists nowhere stays unknown (and is not walked for again at once).
        assert_eq!(names.by_id(u64::MAX), None);
        assert_eq!(names.by_id(u64::MAX), None);
    }
}
