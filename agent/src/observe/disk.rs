//! Filesystem figures: `statvfs(2)` for the node's filesystems, and a bounded `du` for a
//! pod's ephemeral storage.
//!
//! The figures are cadvisor's: capacity is `f_blocks × f_frsize`, available is
//! `f_bavail × f_frsize` (what an unprivileged writer can still use, which is what fills up
//! first), inodes are `f_files` and free inodes `f_ffree`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::ObserveError;

/// One filesystem's size and what is left of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsFigures {
    /// Total bytes.
    pub capacity_bytes: u64,
    /// Bytes an unprivileged writer may still use.
    pub available_bytes: u64,
    /// Total inodes.
    pub inodes: u64,
    /// Free inodes.
    pub inodes_free: u64,
    /// The device the path lives on, to tell whether two paths share a filesystem.
    pub device: u64,
}

/// `statvfs` of the filesystem holding `path`.
pub fn statvfs(path: &Path) -> Result<FsFigures, ObserveError> {
    let s = rustix::fs::statvfs(path).map_err(|e| ObserveError::io(path, e.into()))?;
    let st = rustix::fs::stat(path).map_err(|e| ObserveError::io(path, e.into()))?;
    let frsize = s.f_frsize;
    Ok(FsFigures {
        capacity_bytes: s.f_blocks.saturating_mul(frsize),
        available_bytes: s.f_bavail.saturating_mul(frsize),
        inodes: s.f_files,
        inodes_free: s.f_ffree,
        device: st.st_dev,
    })
}

/// Disk use of a directory tree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DirUsage {
    /// Bytes allocated on disk (`st_blocks × 512`, as `du` counts); a file with several hard
    /// links in the tree is counted at each of them (like `du -l`).
    pub bytes: u64,
    /// Inodes: every file, directory and link visited, the top directory included.
    pub inodes: u64,
    /// Whether the walk stopped at its entry cap, so the figures are a lower bound.
    pub truncated: bool,
}

/// Walks `dir` like `du -sx`: stays on its filesystem, does not follow symbolic links, and
/// visits at most `max_entries` entries so a pod with millions of files cannot stall the
/// reactor. A missing directory is zero usage (the container has not written anything yet).
pub(crate) fn dir_usage(dir: &Path, max_entries: u64) -> Result<DirUsage, ObserveError> {
    let top = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(DirUsage::default()),
        Err(e) => return Err(ObserveError::io(dir, e)),
    };
    let mut usage = DirUsage {
        bytes: top.blocks().saturating_mul(512),
        inodes: 1,
        truncated: false,
    };
    if !top.is_dir() {
        return Ok(usage);
    }
    let device = top.dev();
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    let mut visited: u64 = 1;
    while let Some(current) = stack.pop() {
        // Entries vanish while a container runs; what is gone no longer uses the disk.
        let Ok(entries) = std::fs::read_dir(&current) else {
            continue;
        };
        for entry in entries.flatten() {
            if visited >= max_entries {
                usage.truncated = true;
                return Ok(usage);
            }
            visited += 1;
            let Ok(meta) = entry.metadata() else { continue };
            if meta.dev() != device {
                continue;
            }
            usage.bytes = usage
                .bytes
                .saturating_add(meta.blocks().saturating_mul(512));
            usage.inodes += 1;
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statvfs_of_the_real_root_is_consistent() {
        let f = statvfs(Path::new("/")).unwrap();
        assert!(
            f.capacity_bytes > 0 && f.available_bytes <= f.capacity_bytes,
            "{f:?}"
        );
        assert!(f.inodes_free <= f.inodes, "{f:?}");
        assert!(statvfs(Path::new("/no/such/path")).is_err());
    }

    #[test]
    fn du_counts_files_and_stops_at_the_cap() {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().join("rootfs");
        std::fs::create_dir_all(top.join("a/b")).unwrap();
        std::fs::write(top.join("a/one"), vec![1u8; 64 << 10]).unwrap();
        std::fs::write(top.join("a/b/two"), vec![1u8; 128 << 10]).unwrap();
        std::os::unix::fs::symlink("/", top.join("loop")).unwrap();
        let u = dir_usage(&top, 1000).unwrap();
        // top, a, a/b, one, two, loop.
        assert_eq!(u.inodes, 6);
        assert!(!u.truncated);
        // Files written on a filesystem that keeps data (tmpfs or disk) take at least their size.
        assert!(u.bytes >= 192 << 10, "{u:?}");
        let capped = dir_usage(&top, 3).unwrap();
        assert!(capped.truncated && capped.inodes < 6, "{capped:?}");
        assert_eq!(
            dir_usage(&tmp.path().join("none"), 10).unwrap(),
            DirUsage::default()
        );
    }
}
