//! The file operations every cgroup write and read goes through, so every error names the
//! path (and the value, for a write).
//!
//! cgroupfs files exist as soon as the kernel creates the cgroup; writing one never creates
//! it. Opening without `O_CREAT` keeps that true here too: a missing file is a missing
//! controller, reported as such, not a stray regular file left in a temp dir or a typo that
//! silently "works".

use std::io::Write;
use std::path::Path;

use super::CgroupError;

/// Writes `value` to an existing cgroup file in one `write(2)`, as the kernel expects.
pub(crate) fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    let result = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()));
    result.map_err(|source| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.to_string(),
        source,
    })
}

/// Reads a cgroup file whole, trimmed of its trailing newline.
pub fn read(path: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim_end().to_string())
        .map_err(|source| CgroupError::Read {
            path: path.to_path_buf(),
            source,
        })
}

/// Reads a whole-number cgroup file (`memory.usage_in_bytes`, `memory.current`).
pub(crate) fn read_u64(path: &Path) -> Result<u64, CgroupError> {
    let text = read(path)?;
    text.parse().map_err(|_| CgroupError::Parse {
        path: path.to_path_buf(),
        text,
    })
}

/// Reads one `key value` line of a flat-keyed file (`memory.stat`, `memory.events`,
/// `memory.oom_control`); `None` when the key is absent.
pub(crate) fn read_key(path: &Path, key: &str) -> Result<Option<u64>, CgroupError> {
    let text = read(path)?;
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        if parts.next() == Some(key) {
            let value = parts.next().unwrap_or_default();
            return value.parse().map(Some).map_err(|_| CgroupError::Parse {
                path: path.to_path_buf(),
                text: line.to_string(),
            });
        }
    }
    Ok(None)
}

/// The pids listed in a `cgroup.procs` file.
pub(crate) fn read_pids(path: &Path) -> Result<Vec<u32>, CgroupError> {
    let text = read(path)?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            l.trim().parse().map_err(|_| CgroupError::Parse {
                path: path.to_path_buf(),
                text: l.to_string(),
            })
        })
        .collect()
}

/// Makes one cgroup directory; an existing one is fine (creation is idempotent).
pub(crate) fn mkdir(path: &Path) -> Result<bool, CgroupError> {
    match std::fs::create_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(source) => Err(CgroupError::Create {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The pids in the `cgroup.procs` of every cgroup of `dirs`' subtrees, sorted, each once (a
/// process moving between two cgroups while they are read can show in both).
pub(crate) fn pids_below<'a>(
    dirs: impl IntoIterator<Item = &'a Path>,
) -> Result<Vec<u32>, CgroupError> {
    let mut pids = Vec::new();
    for dir in dirs {
        for d in subtree_leaf_first(dir)? {
            pids.extend(read_pids(&d.join("cgroup.procs"))?);
        }
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

/// Every cgroup directory at or below `dir`, deepest first (the order rmdir needs).
pub(crate) fn subtree_leaf_first(dir: &Path) -> Result<Vec<std::path::PathBuf>, CgroupError> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    while let Some((d, depth)) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(CgroupError::Read { path: d, source }),
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((entry.path(), depth + 1));
            }
        }
        out.push((depth, d));
    }
    out.sort_by_key(|b| std::cmp::Reverse(b.0));
    Ok(out.into_iter().map(|(_, d)| d).collect())
}
