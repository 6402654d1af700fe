//! Proactive memory reclaim: cgroup v2's `memory.reclaim`, one bounded step at a time.
//!
//! Writing `N` to a v2 cgroup's `memory.reclaim` makes the kernel reclaim up to `N` bytes
//! from it now, clean page cache first, and return when done; it fails with `EAGAIN` when it
//! could not reclaim that much (what it did reclaim stays reclaimed). The write is
//! synchronous, so the caller keeps each step small ([`crate::decide::memory_reclaim`]
//! caps it) and checks its own time bound between steps.
//!
//! cgroup v1 has no such file. `memory.force_empty` is not an equivalent: it reclaims
//! everything the cgroup holds (not a bounded amount), retries until usage is zero or it
//! gives up, and is meant for a cgroup about to be removed — on a live `kubepods` it would
//! throw away every pod's cache at once and hold the caller for as long as that takes.

use std::io::Write as _;

use super::{CgroupError, CgroupManager, CgroupPath};

/// How one `memory.reclaim` write ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReclaimWrite {
    /// The kernel reclaimed what was asked.
    Done,
    /// The kernel could not reclaim all of it (`EAGAIN`); some may have been reclaimed.
    Short,
}

impl CgroupManager {
    /// Whether this hierarchy can reclaim on demand (`memory.reclaim`: v2 only).
    pub(crate) fn can_reclaim(&self) -> bool {
        matches!(self, CgroupManager::V2(_))
    }

    /// Asks the kernel to reclaim `bytes` from `cgroup` now (v2 `memory.reclaim`). On v1
    /// there is no such file: the write fails naming it.
    pub(crate) fn memory_reclaim(
        &self,
        cgroup: &CgroupPath,
        bytes: u64,
    ) -> Result<ReclaimWrite, CgroupError> {
        let path = match self {
            CgroupManager::V2(m) => cgroup.under(m.root()).join("memory.reclaim"),
            CgroupManager::V1(_) => {
                return Err(CgroupError::Write {
                    path: cgroup.to_string().into(),
                    value: bytes.to_string(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::Unsupported,
                        "cgroup v1 has no memory.reclaim",
                    ),
                })
            }
        };
        let value = bytes.to_string();
        let result = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| f.write_all(value.as_bytes()));
        match result {
            Ok(()) => Ok(ReclaimWrite::Done),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::AGAIN.raw_os_error()) => {
                Ok(ReclaimWrite::Short)
            }
            Err(source) => Err(CgroupError::Write {
                path,
                value,
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_has_no_memory_reclaim() {
        let dir = tempfile::tempdir().unwrap();
        // A v1 layout: one directory per controller the writer requires.
        for c in super::super::v1::REQUIRED {
            std::fs::create_dir(dir.path().join(c)).unwrap();
        }
        let m = CgroupManager::v1(dir.path(), &CgroupPath::root()).unwrap();
        assert!(!m.can_reclaim());
        let e = m
            .memory_reclaim(&CgroupPath::kubepods(), 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(e.contains("memory.reclaim"), "{e}");
    }

    #[test]
    fn v2_writes_the_byte_count() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.controllers"), "memory").unwrap();
        let kubepods = dir.path().join("kubepods");
        std::fs::create_dir(&kubepods).unwrap();
        std::fs::write(kubepods.join("memory.reclaim"), "").unwrap();
        let m = CgroupManager::v2(dir.path(), &CgroupPath::root()).unwrap();
        assert!(m.can_reclaim());
        assert_eq!(
            m.memory_reclaim(&CgroupPath::kubepods(), 42 << 20).unwrap(),
            ReclaimWrite::Done
        );
        assert_eq!(
            std::fs::read_to_string(kubepods.join("memory.reclaim")).unwrap(),
            (42u64 << 20).to_string()
        );
        // A missing file (no memory controller) is an error naming it.
        let e = m
            .memory_reclaim(&CgroupPath::parse("gone").unwrap(), 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("gone/memory.reclaim"), "{e}");
    }
}
