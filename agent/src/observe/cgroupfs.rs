//! The memory controller's files, read through one injected root.
//!
//! The root is a seam: the live agent passes `/sys/fs/cgroup`, unit tests a temp dir holding
//! fixture files in either layout. Every read goes into a buffer and a path kept between
//! calls, so an observation on every pressure event does not churn the allocator.
//!
//! The working set is computed as cadvisor computes it for the kubelet: usage minus inactive
//! file pages, floored at zero. Usage is `memory.usage_in_bytes` on v1 and `memory.current` on
//! v2; inactive file pages are `total_inactive_file` (v1, hierarchical) or `inactive_file`
//! (v2, hierarchical by design). The v2 root cgroup has no `memory.current`; there runc (and so
//! cadvisor) takes `anon + file` from the root's `memory.stat`, and so do we.

use std::collections::HashMap;
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::ObserveError;

/// Which cgroup interface holds the memory controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// The v1 `memory` hierarchy.
    V1,
    /// The unified hierarchy with the memory controller enabled.
    V2,
}

/// A cgroup's memory figures in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// What the kernel charges the cgroup (page cache included).
    pub usage: u64,
    /// Inactive file pages: reclaimable cache the kubelet does not count as used.
    pub inactive_file: u64,
    /// `usage - inactive_file`, floored at zero: the figure eviction compares.
    pub working_set: u64,
    /// Active file pages (v1 `total_active_file`, v2 `active_file`; 0 when the file has no
    /// such line): page cache the working set counts and `memory.reclaim` can drop.
    pub active_file: u64,
    /// Anonymous memory (v1 `total_rss`, v2 `anon`; 0 when the file has no such line). In a
    /// cgroup with no process left it is memory an address space still being torn down
    /// holds: it is on its way back, where page cache the cgroup leaves behind is not.
    pub anon: u64,
}

/// The anonymous memory a cgroup whose address spaces are all gone may still show: the
/// kernel folds a cgroup's statistics into `memory.stat` only once more than 64 page updates
/// per CPU are pending, and each CPU may hold up to 64 more of its own, so freed memory can
/// read up to about two batches of pages per CPU; never under 1 MiB.
pub(crate) fn anon_slack_bytes() -> u64 {
    static SLACK: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SLACK.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        (1u64 << 20).max(2 * 64 * 4096 * cpus)
    })
}

/// The anonymous memory in a `memory.stat` text: v1 `total_rss`, v2 `anon` (each counts the
/// cgroup and everything below it); `None` when it has neither or says no number.
pub(crate) fn stat_anon(text: &str) -> Option<u64> {
    ["total_rss", "anon"]
        .into_iter()
        .find_map(|key| stat_value(text, key).ok().flatten())
}

/// The memory hierarchy, rooted at an injected directory, with scratch space for reads.
#[derive(Debug)]
pub struct CgroupFs {
    layout: Layout,
    /// The directory of the hierarchy's root cgroup (`/sys/fs/cgroup/memory` on v1).
    root: PathBuf,
    path: PathBuf,
    buf: Vec<u8>,
    /// The usage files [`CgroupFs::memory_usage`] read, kept open and re-read at offset 0:
    /// opening one walks its path and costs several times the read itself, and the bounded
    /// memory ranking reads one per pod between the kernel's event and the kill. Each with
    /// the pass it was last read in; [`CgroupFs::end_usage_pass`] closes the others.
    usage_files: HashMap<String, PodFiles>,
    usage_pass: u64,
    /// The containers' usage files and `memory.stat`, kept open the same way for the
    /// victim's message ([`CgroupFs::keep_container_files_open`]): read between the choice
    /// of the victim and its kill.
    container_files: HashMap<String, PodFiles>,
    /// The cgroups every observation reads (the node's and kubepods', [`CgroupFs::keep_open`])
    /// and their files, kept open the same way: under a churn of pod cgroups being created
    /// and removed, each path walk in cgroupfs waits on the same kernfs locks as the
    /// `mkdir`s and `rmdir`s.
    kept_cgroups: Vec<String>,
    kept: KeptFiles,
}

/// A pod's or container's cgroup files kept open between passes
/// ([`CgroupFs::keep_usage_open`], [`CgroupFs::keep_container_files_open`]).
#[derive(Debug)]
struct PodFiles {
    /// The usage counter, read for every pod by the bounded memory ranking.
    usage: File,
    /// `memory.stat`, for the working sets the ranking asks for and the victim's message:
    /// opened with the usage when the pods change, so a read between the kernel's event and
    /// the kill is one `pread` and not two path walks (each costs more than the read).
    stat: Option<File>,
    /// The pass the usage was last read or kept in.
    pass: u64,
}

/// Files read again and again, kept open and re-read from offset 0 (cgroupfs and procfs
/// regenerate the text on every read from the start).
#[derive(Debug, Default)]
pub(crate) struct KeptFiles {
    files: HashMap<PathBuf, File>,
}

impl KeptFiles {
    /// Reads `path` into `buf` (cleared first) through the file kept open for it, opening it
    /// the first time; `Ok(false)` when it does not exist. A kept file that can no longer be
    /// read (`ENODEV`: its cgroup was removed) is dropped and the path opened afresh, which
    /// tells a removed cgroup from a new one of the same name.
    pub fn read(&mut self, path: &Path, buf: &mut Vec<u8>) -> Result<bool, ObserveError> {
        if let Some(file) = self.files.get(path) {
            if pread_all(file, buf).is_ok() {
                return Ok(true);
            }
            self.files.remove(path);
        }
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(ObserveError::io(path, e)),
        };
        match pread_all(&file, buf) {
            Ok(()) => {}
            Err(e) if is_gone(&e) => return Ok(false),
            Err(e) => return Err(ObserveError::io(path, e)),
        }
        self.files.insert(path.to_path_buf(), file);
        Ok(true)
    }
}

/// A read error that means the file's cgroup was removed under us.
fn is_gone(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENODEV)
}

/// Reads all of `file` from offset 0 into `buf` (cleared first). A read that does not fill
/// the space offered is the end: the kernel hands over a generated file's text whole, and
/// one more read past it would make it generate the text again only to find nothing.
fn pread_all(file: &File, buf: &mut Vec<u8>) -> std::io::Result<()> {
    buf.clear();
    let mut len = 0;
    loop {
        if buf.capacity() - len < 4096 {
            buf.reserve(8192);
        }
        buf.resize(buf.capacity(), 0);
        let n = file.read_at(&mut buf[len..], len as u64)?;
        len += n;
        if n == 0 || len < buf.len() {
            buf.truncate(len);
            return Ok(());
        }
    }
}

/// Whether `dir/cgroup.controllers` lists the memory controller.
fn v2_has_memory(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.controllers"))
        .is_ok_and(|text| text.split_whitespace().any(|c| c == "memory"))
}

impl CgroupFs {
    /// Finds the memory controller under a cgroupfs mount point (`/sys/fs/cgroup`): the
    /// unified hierarchy when it has the memory controller, else the v1 `memory` hierarchy,
    /// else a hybrid's `unified` mount with memory. Hybrid hosts whose v2 mount lacks memory
    /// (as here) resolve to v1, which is where the kernel charges pages.
    pub(crate) fn detect(mount: &Path) -> Result<CgroupFs, ObserveError> {
        if v2_has_memory(mount) {
            return Ok(CgroupFs::new(Layout::V2, mount.to_path_buf()));
        }
        let v1 = mount.join("memory");
        if v1.join("memory.usage_in_bytes").exists() {
            return Ok(CgroupFs::new(Layout::V1, v1));
        }
        let unified = mount.join("unified");
        if v2_has_memory(&unified) {
            return Ok(CgroupFs::new(Layout::V2, unified));
        }
        Err(ObserveError::NoMemoryController {
            mount: mount.to_path_buf(),
        })
    }

    /// A hierarchy of a known layout whose root cgroup is the directory `root`.
    pub fn new(layout: Layout, root: PathBuf) -> CgroupFs {
        CgroupFs {
            layout,
            root,
            path: PathBuf::with_capacity(256),
            buf: Vec::with_capacity(8192),
            usage_files: HashMap::new(),
            usage_pass: 0,
            container_files: HashMap::new(),
            kept_cgroups: Vec::new(),
            kept: KeptFiles::default(),
        }
    }

    /// Keeps the files of `cgroup` open once read ([`CgroupFs::memory`] reads it on every
    /// observation): for the few cgroups read on every pass, never per pod.
    pub(crate) fn keep_open(&mut self, cgroup: &str) {
        if !self.kept_cgroups.iter().any(|c| c == cgroup) {
            self.kept_cgroups.push(cgroup.to_string());
        }
    }

    /// The layout in use.
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    /// The directory of the hierarchy's root cgroup.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of a cgroup given by its path in the hierarchy (`/kubepods/pod…`).
    /// `..` components are refused so a cgroup name from outside cannot escape the root.
    pub(crate) fn dir(&self, cgroup: &str) -> Result<PathBuf, ObserveError> {
        let mut dir = self.root.clone();
        push_cgroup(&mut dir, cgroup)?;
        Ok(dir)
    }

    fn set_path(&mut self, cgroup: &str, file: Option<&str>) -> Result<(), ObserveError> {
        self.path.as_mut_os_string().clear();
        self.path.push(&self.root);
        push_cgroup(&mut self.path, cgroup)?;
        if let Some(file) = file {
            self.path.push(file);
        }
        Ok(())
    }

    /// Reads `cgroup/file` into the buffer; `Ok(false)` when the file (or cgroup) is absent.
    fn read(&mut self, cgroup: &str, file: &str) -> Result<bool, ObserveError> {
        self.set_path(cgroup, Some(file))?;
        if self.kept_cgroups.iter().any(|c| c == cgroup) {
            return self.kept.read(&self.path, &mut self.buf);
        }
        read_into(&self.path, &mut self.buf)
    }

    fn read_u64(&mut self, cgroup: &str, file: &str) -> Result<Option<u64>, ObserveError> {
        if !self.read(cgroup, file)? {
            return Ok(None);
        }
        let text = std::str::from_utf8(&self.buf).unwrap_or("").trim();
        text.parse::<u64>()
            .map(Some)
            .map_err(|_| ObserveError::parse(&self.path, format!("{text:?} is not a byte count")))
    }

    /// The memory usage of a (non-root) cgroup alone — `memory.usage_in_bytes` (v1) or
    /// `memory.current` (v2), a counter read without the `memory.stat` walk — never below its
    /// working set; `Ok(None)` when the cgroup is gone. What the bounded memory ranking
    /// reads for every pod ([`crate::decide::rank::first_for_memory`]).
    pub(crate) fn memory_usage(&mut self, cgroup: &str) -> Result<Option<u64>, ObserveError> {
        let mut text = [0u8; 32];
        if let Some(files) = self.usage_files.get_mut(cgroup) {
            files.pass = self.usage_pass;
            match files.usage.read_at(&mut text, 0) {
                Ok(n) => return self.parse_usage(cgroup, &text[..n]).map(Some),
                // Gone (`ENODEV` once the cgroup is removed): opened afresh below, which
                // tells a removed cgroup from a new one of the same name.
                Err(_) => {
                    self.usage_files.remove(cgroup);
                }
            }
        }
        let Some(file) = self.open_usage(cgroup)? else {
            return Ok(None);
        };
        let n = match file.read_at(&mut text, 0) {
            Ok(n) => n,
            Err(e) if is_gone(&e) => return Ok(None),
            Err(e) => return Err(ObserveError::io(&self.path, e)),
        };
        let usage = self.parse_usage(cgroup, &text[..n])?;
        let files = PodFiles {
            usage: file,
            stat: None,
            pass: self.usage_pass,
        };
        self.usage_files.insert(cgroup.to_string(), files);
        Ok(Some(usage))
    }

    /// Opens `cgroup`'s usage file; `None` when the cgroup is gone.
    fn open_usage(&mut self, cgroup: &str) -> Result<Option<File>, ObserveError> {
        self.set_path(cgroup, Some(self.usage_file()))?;
        match File::open(&self.path) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ObserveError::io(&self.path, e)),
        }
    }

    /// The usage file's name in this layout.
    fn usage_file(&self) -> &'static str {
        match self.layout {
            Layout::V1 => "memory.usage_in_bytes",
            Layout::V2 => "memory.current",
        }
    }

    fn parse_usage(&mut self, cgroup: &str, text: &[u8]) -> Result<u64, ObserveError> {
        let text = std::str::from_utf8(text).unwrap_or("").trim();
        text.parse::<u64>().map_err(|_| {
            let file = self.usage_file();
            let path = self.dir(cgroup).map(|d| d.join(file)).unwrap_or_default();
            ObserveError::parse(&path, format!("{text:?} is not a byte count"))
        })
    }

    /// Opens `cgroup`'s `memory.stat`; `None` when it cannot be (the cgroup gone: the read
    /// that needs it opens it afresh and says so).
    fn open_stat(&mut self, cgroup: &str) -> Option<File> {
        self.set_path(cgroup, Some("memory.stat")).ok()?;
        File::open(&self.path).ok()
    }

    /// The memory usage and working set of a pod or container cgroup kept open
    /// ([`CgroupFs::keep_usage_open`], [`CgroupFs::memory_usage`],
    /// [`CgroupFs::keep_container_files_open`]), through its open files (`memory.stat`
    /// opened and kept the first time if it is not yet); any other cgroup, or one whose kept
    /// files no longer read (removed, or removed and made again), as [`CgroupFs::memory`]
    /// reads it.
    pub(crate) fn pod_memory(&mut self, cgroup: &str) -> Result<Option<MemoryUsage>, ObserveError> {
        let pod = self.usage_files.contains_key(cgroup);
        if !pod && !self.container_files.contains_key(cgroup) {
            return self.memory(cgroup);
        }
        if self
            .kept_files(pod)
            .get(cgroup)
            .is_some_and(|f| f.stat.is_none())
        {
            let stat = self.open_stat(cgroup);
            if let Some(f) = self.kept_files(pod).get_mut(cgroup) {
                f.stat = stat;
            }
        }
        let mut text = [0u8; 32];
        let mut buf = std::mem::take(&mut self.buf);
        let read = self.kept_files(pod).get(cgroup).and_then(|f| {
            let n = f.usage.read_at(&mut text, 0).ok()?;
            pread_all(f.stat.as_ref()?, &mut buf).ok()?;
            Some(n)
        });
        self.buf = buf;
        let Some(n) = read else {
            // Gone or made again: dropped, and read afresh by path.
            self.kept_files(pod).remove(cgroup);
            return self.memory(cgroup);
        };
        let usage = self.parse_usage(cgroup, &text[..n])?;
        self.set_path(cgroup, Some("memory.stat"))?;
        self.parse_stat(Some(usage)).map(Some)
    }

    /// The pods' kept files, or the containers'.
    fn kept_files(&mut self, pod: bool) -> &mut HashMap<String, PodFiles> {
        if pod {
            &mut self.usage_files
        } else {
            &mut self.container_files
        }
    }

    /// Opens the usage file and `memory.stat` of each of the container cgroups `cgroups`
    /// not open yet, without reading any, and closes the others (containers gone); called
    /// as the pods change.
    pub fn keep_container_files_open<S: AsRef<str>>(
        &mut self,
        cgroups: impl IntoIterator<Item = S>,
    ) {
        let mut kept = HashMap::with_capacity(self.container_files.len());
        for cg in cgroups {
            let cg = cg.as_ref();
            if let Some(files) = self.container_files.remove(cg) {
                kept.insert(cg.to_string(), files);
            } else if let Ok(Some(usage)) = self.open_usage(cg) {
                let stat = self.open_stat(cg);
                kept.insert(
                    cg.to_string(),
                    PodFiles {
                        usage,
                        stat,
                        pass: 0,
                    },
                );
            }
        }
        self.container_files = kept;
    }

    /// Opens the usage file and `memory.stat` of each of `cgroups` not open yet, without
    /// reading any, and closes the others (pods gone): what keeping up with the pods costs is
    /// two opens per new pod, never a read of every pod. A cgroup that cannot be opened is left for
    /// [`CgroupFs::memory_usage`] to report.
    pub(crate) fn keep_usage_open<S: AsRef<str>>(&mut self, cgroups: impl IntoIterator<Item = S>) {
        // A pass of its own: `cgroups` is the whole set to keep.
        self.usage_pass = self.usage_pass.wrapping_add(1);
        let pass = self.usage_pass;
        for cg in cgroups {
            let cg = cg.as_ref();
            if let Some(files) = self.usage_files.get_mut(cg) {
                files.pass = pass;
            } else if let Ok(Some(usage)) = self.open_usage(cg) {
                let stat = self.open_stat(cg);
                let files = PodFiles { usage, stat, pass };
                self.usage_files.insert(cg.to_string(), files);
            }
        }
        self.end_usage_pass();
    }

    /// Closes the usage files not read since the last call (pods gone from the node).
    pub(crate) fn end_usage_pass(&mut self) {
        let pass = self.usage_pass;
        self.usage_files.retain(|_, f| f.pass == pass);
        self.usage_pass = pass.wrapping_add(1);
    }

    /// The memory usage and working set of a cgroup; `Ok(None)` when the cgroup is gone
    /// (a pod that just exited), so callers treat it as "no statistics".
    pub(crate) fn memory(&mut self, cgroup: &str) -> Result<Option<MemoryUsage>, ObserveError> {
        let is_root = cgroup.trim_matches('/').is_empty();
        let usage = match self.layout {
            Layout::V1 => self.read_u64(cgroup, "memory.usage_in_bytes")?,
            Layout::V2 if is_root => None,
            Layout::V2 => self.read_u64(cgroup, "memory.current")?,
        };
        if usage.is_none() && !(self.layout == Layout::V2 && is_root) {
            return Ok(None);
        }
        if !self.read(cgroup, "memory.stat")? {
            return Ok(None);
        }
        self.parse_stat(usage).map(Some)
    }

    /// The figures of a `memory.stat` text in the buffer (read from `self.path`) with the
    /// cgroup's usage counter (`None` only for the v2 root, which has none).
    fn parse_stat(&self, usage: Option<u64>) -> Result<MemoryUsage, ObserveError> {
        let text = std::str::from_utf8(&self.buf)
            .map_err(|_| ObserveError::parse(&self.path, "not UTF-8".to_string()))?;
        let stat = |key: &str| -> Result<u64, ObserveError> {
            stat_value(text, key)
                .map_err(|e| ObserveError::parse(&self.path, e.to_string()))?
                .ok_or_else(|| ObserveError::parse(&self.path, format!("no {key} line")))
        };
        let active_key = match self.layout {
            Layout::V1 => "total_active_file",
            Layout::V2 => "active_file",
        };
        let optional = |key: &str| -> Result<u64, ObserveError> {
            Ok(stat_value(text, key)
                .map_err(|e| ObserveError::parse(&self.path, e.to_string()))?
                .unwrap_or(0))
        };
        let active_file = optional(active_key)?;
        let anon = optional(match self.layout {
            Layout::V1 => "total_rss",
            Layout::V2 => "anon",
        })?;
        let (usage, inactive_file) = match (self.layout, usage) {
            (Layout::V1, Some(usage)) => (usage, stat("total_inactive_file")?),
            (Layout::V2, Some(usage)) => (usage, stat("inactive_file")?),
            // The v2 root: runc's emulation, anon + file of the root's memory.stat.
            (_, _) => (
                stat("anon")?.saturating_add(stat("file")?),
                stat("inactive_file")?,
            ),
        };
        Ok(MemoryUsage {
            usage,
            inactive_file,
            working_set: usage.saturating_sub(inactive_file),
            active_file,
            anon,
        })
    }

    /// Processes in a cgroup and every cgroup below it (`cgroup.procs` lines), as the
    /// kubelet's per-pod process count; `Ok(None)` when the cgroup is gone.
    pub fn process_count(&mut self, cgroup: &str) -> Result<Option<u64>, ObserveError> {
        self.set_path(cgroup, None)?;
        let mut dir = std::mem::take(&mut self.path);
        let counted = count_procs(&mut dir, &mut self.buf, 0);
        self.path = dir;
        counted
    }
}

/// Deepest cgroup nesting walked when counting processes: far below anything a runtime
/// creates, and a bound on the work a strange tree can cause.
const MAX_DEPTH: usize = 16;

fn count_procs(
    dir: &mut PathBuf,
    buf: &mut Vec<u8>,
    depth: usize,
) -> Result<Option<u64>, ObserveError> {
    dir.push("cgroup.procs");
    let present = read_into(dir, buf);
    dir.pop();
    if !present? {
        return Ok(None);
    }
    let mut count = buf.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count() as u64;
    if depth >= MAX_DEPTH {
        return Ok(Some(count));
    }
    let entries = match std::fs::read_dir(&*dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Some(count)),
        Err(e) => return Err(ObserveError::io(dir, e)),
    };
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        dir.push(entry.file_name());
        let child = count_procs(dir, buf, depth + 1);
        dir.pop();
        count += child?.unwrap_or(0);
    }
    Ok(Some(count))
}

/// Appends a cgroup path (`/a/b`, `a/b`, `/` for the root) to a directory, refusing `..`.
fn push_cgroup(dir: &mut PathBuf, cgroup: &str) -> Result<(), ObserveError> {
    for part in cgroup.split('/').filter(|p| !p.is_empty() && *p != ".") {
        if part == ".." {
            return Err(ObserveError::BadCgroup {
                cgroup: cgroup.to_string(),
            });
        }
        dir.push(part);
    }
    Ok(())
}

/// Reads a whole file into `buf` (cleared first); `Ok(false)` when it does not exist.
pub(crate) fn read_into(path: &Path, buf: &mut Vec<u8>) -> Result<bool, ObserveError> {
    buf.clear();
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(ObserveError::io(path, e)),
    };
    match file.read_to_end(buf) {
        Ok(_) => Ok(true),
        // A cgroup removed between open and read.
        Err(e) if is_gone(&e) => Ok(false),
        Err(e) => Err(ObserveError::io(path, e)),
    }
}

/// The value of `key` in a `memory.stat`-style file (`key value` per line); `Ok(None)` when
/// the key is absent, `Err` when its value is not a whole number.
pub fn stat_value(text: &str, key: &str) -> Result<Option<u64>, NotWhole> {
    for line in text.lines() {
        let mut parts = line.split_ascii_whitespace();
        if parts.next() != Some(key) {
            continue;
        }
        let value = parts.next().unwrap_or("");
        return value.parse::<u64>().map(Some).map_err(|_| NotWhole {
            key: key.to_string(),
            value: value.to_string(),
        });
    }
    Ok(None)
}

/// A `memory.stat` value that is not a whole number.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{key} value {value:?} is not a whole number")]
pub struct NotWhole {
    /// The key.
    pub key: String,
    /// What stood where the number should be.
    pub value: String,
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Temp-dir cgroupfs trees in either layout, shared by the observe unit tests.

    use std::path::Path;

    /// Writes `file` with `text` under `root/cgroup`, creating the directories.
    pub fn set(root: &Path, cgroup: &str, file: &str, text: &str) {
        let dir = root.join(cgroup.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
    }

    /// A v1 `memory.stat` (the hierarchical `total_*` lines after the local ones).
    pub(crate) fn v1_stat(inactive_file: u64) -> String {
        format!(
            "cache 4096\nrss 8192\nrss_huge 0\nshmem 0\nmapped_file 0\ninactive_anon 0\n\
             active_anon 8192\ninactive_file 1\nactive_file 0\nhierarchical_memory_limit \
             9223372036854771712\ntotal_cache 4096\ntotal_rss 8192\ntotal_inactive_anon 0\n\
             total_active_anon 8192\ntotal_inactive_file {inactive_file}\ntotal_active_file 0\n"
        )
    }

    /// A v2 `memory.stat`.
    pub(crate) fn v2_stat(anon: u64, file: u64, inactive_file: u64) -> String {
        format!(
            "anon {anon}\nfile {file}\nkernel 4096\nkernel_stack 0\nsock 0\nshmem 0\n\
             file_mapped 0\nfile_dirty 0\ninactive_anon 0\nactive_anon {anon}\n\
             inactive_file {inactive_file}\nactive_file 0\nunevictable 0\n"
        )
    }

    /// A v1 memory cgroup with usage and inactive file pages.
    pub(crate) fn v1_memcg(root: &Path, cgroup: &str, usage: u64, inactive_file: u64) {
        set(root, cgroup, "memory.usage_in_bytes", &format!("{usage}\n"));
        set(root, cgroup, "memory.stat", &v1_stat(inactive_file));
        set(root, cgroup, "cgroup.procs", "");
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    #[test]
    fn v1_working_set_is_usage_minus_total_inactive_file() {
        let tmp = tempfile::tempdir().unwrap();
        v1_memcg(&tmp.path().join("memory"), "/", 1000 << 20, 300 << 20);
        v1_memcg(
            &tmp.path().join("memory"),
            "/kubepods",
            500 << 20,
            600 << 20,
        );
        let mut fs = CgroupFs::detect(tmp.path()).unwrap();
        assert_eq!(fs.layout(), Layout::V1);
        let root = fs.memory("/").unwrap().unwrap();
        assert_eq!(root.working_set, 700 << 20);
        // More inactive file than usage floors at zero, as cadvisor does.
        let kubepods = fs.memory("/kubepods").unwrap().unwrap();
        assert_eq!(kubepods.working_set, 0);
        assert_eq!(fs.memory("/kubepods/gone").unwrap(), None);
    }
    #[test]
    fn kept_cgroups_are_read_through_open_files_whole_and_afresh() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("memory");
        v1_memcg(&root, "/kubepods", 300, 100);
        // A memory.stat longer than the first read offered (8 KiB): read whole.
        let long: String = (0..1000).map(|i| format!("padding_{i} 0\n")).collect();
        let stat = format!("{long}total_inactive_file 100\n");
        assert!(stat.len() > 12 << 10);
        set(&root, "/kubepods", "memory.stat", &stat);
        let mut fs = CgroupFs::new(Layout::V1, root.clone());
        fs.keep_open("/kubepods");
        let m = fs.memory("/kubepods").unwrap().unwrap();
        assert_eq!((m.usage, m.inactive_file, m.working_set), (300, 100, 200));
        assert_eq!(fs.kept.files.len(), 2, "usage and memory.stat kept open");
        // Read again at offset 0: the new figures, shorter text and all.
        set(&root, "/kubepods", "memory.usage_in_bytes", "500\n");
        set(
            &root,
            "/kubepods",
            "memory.stat",
            "total_inactive_file 50\n",
        );
        let m = fs.memory("/kubepods").unwrap().unwrap();
        assert_eq!((m.usage, m.inactive_file), (500, 50));
        // A cgroup not kept is opened per read and nothing more is held.
        v1_memcg(&root, "/kubepods/pod", 10, 0);
        assert!(fs.memory("/kubepods/pod").unwrap().is_some());
        assert_eq!(fs.kept.files.len(), 2);
        assert_eq!(fs.memory("/gone").unwrap(), None);
    }

    #[test]
    fn usage_files_stay_open_between_reads_and_close_when_not_read_in_a_pass() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("memory");
        v1_memcg(&root, "/", 1, 0);
        v1_memcg(&root, "/kubepods/a", 100, 0);
        v1_memcg(&root, "/kubepods/b", 200, 0);
        let mut fs = CgroupFs::new(Layout::V1, root.clone());
        assert_eq!(fs.memory_usage("/kubepods/a").unwrap(), Some(100));
        assert_eq!(fs.memory_usage("/kubepods/b").unwrap(), Some(200));
        assert_eq!(fs.memory_usage("/kubepods/gone").unwrap(), None);
        fs.end_usage_pass();
        assert_eq!(fs.usage_files.len(), 2);
        // The open file is read again at offset 0: the new figure, not the first one.
        set(&root, "/kubepods/a", "memory.usage_in_bytes", "150\n");
        assert_eq!(fs.memory_usage("/kubepods/a").unwrap(), Some(150));
        fs.end_usage_pass();
        assert_eq!(fs.usage_files.keys().collect::<Vec<_>>(), ["/kubepods/a"]);
        set(&root, "/kubepods/a", "memory.usage_in_bytes", "lots\n");
        let err = fs.memory_usage("/kubepods/a").unwrap_err().to_string();
        assert!(err.contains("/kubepods/a/memory.usage_in_bytes"), "{err}");
        // Keeping up with the pods opens the new ones' files and closes the others'.
        fs.keep_usage_open(["/kubepods/b", "/kubepods/gone"]);
        assert_eq!(fs.usage_files.keys().collect::<Vec<_>>(), ["/kubepods/b"]);
        assert_eq!(fs.memory_usage("/kubepods/b").unwrap(), Some(200));
    }

    #[test]
    fn pod_working_sets_are_read_through_the_kept_files_and_afresh_once_gone() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("memory");
        v1_memcg(&root, "/kubepods/a", 100, 30);
        let mut fs = CgroupFs::new(Layout::V1, root.clone());
        fs.keep_usage_open(["/kubepods/a"]);
        let kept = |fs: &CgroupFs| fs.usage_files.get("/kubepods/a").map(|f| f.stat.is_some());
        assert_eq!(kept(&fs), Some(true), "memory.stat opened with the usage");
        assert_eq!(
            fs.pod_memory("/kubepods/a").unwrap().unwrap().working_set,
            70
        );
        // The kept files are read again from the start: the new figures.
        set(&root, "/kubepods/a", "memory.usage_in_bytes", "300\n");
        set(&root, "/kubepods/a", "memory.stat", &v1_stat(100));
        assert_eq!(
            fs.pod_memory("/kubepods/a").unwrap().unwrap().working_set,
            200
        );
        set(
            &root,
            "/kubepods/a",
            "memory.stat",
            "total_inactive_file lots\n",
        );
        let err = fs.pod_memory("/kubepods/a").unwrap_err().to_string();
        assert!(err.contains("/kubepods/a/memory.stat"), "{err}");
        // A cgroup kept for its usage alone gets its memory.stat on the first look.
        v1_memcg(&root, "/kubepods/b", 50, 10);
        assert_eq!(fs.memory_usage("/kubepods/b").unwrap(), Some(50));
        assert_eq!(
            fs.pod_memory("/kubepods/b").unwrap().unwrap().working_set,
            40
        );
        assert!(fs.usage_files["/kubepods/b"].stat.is_some());
        // Not kept: read by path, nothing kept; gone: no figures.
        v1_memcg(&root, "/kubepods/c", 20, 5);
        assert_eq!(
            fs.pod_memory("/kubepods/c").unwrap().unwrap().working_set,
            15
        );
        assert!(!fs.usage_files.contains_key("/kubepods/c"));
        assert_eq!(fs.pod_memory("/kubepods/gone").unwrap(), None);
        // Containers: kept as the pods change, read through the kept files, the ones gone
        // closed.
        v1_memcg(&root, "/kubepods/a/ctr", 60, 20);
        fs.keep_container_files_open(["/kubepods/a/ctr", "/kubepods/a/gone"]);
        assert_eq!(
            fs.container_files.keys().collect::<Vec<_>>(),
            ["/kubepods/a/ctr"]
        );
        set(&root, "/kubepods/a/ctr", "memory.usage_in_bytes", "90\n");
        assert_eq!(
            fs.pod_memory("/kubepods/a/ctr")
                .unwrap()
                .unwrap()
                .working_set,
            70
        );
        fs.keep_container_files_open(Vec::<String>::new());
        assert!(fs.container_files.is_empty());
    }

    #[test]
    fn hybrid_without_v2_memory_resolves_to_v1_and_nothing_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        set(tmp.path(), "/unified", "cgroup.controllers", "pids\n");
        assert!(matches!(
            CgroupFs::detect(tmp.path()),
            Err(ObserveError::NoMemoryController { .. })
        ));
        v1_memcg(&tmp.path().join("memory"), "/", 1, 0);
        assert_eq!(CgroupFs::detect(tmp.path()).unwrap().layout(), Layout::V1);
    }

    #[test]
    fn bad_figures_name_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        v1_memcg(&tmp.path().join("memory"), "/", 1, 0);
        set(
            &tmp.path().join("memory"),
            "/x",
            "memory.usage_in_bytes",
            "lots\n",
        );
        let mut fs = CgroupFs::detect(tmp.path()).unwrap();
        let err = fs.memory("/x").unwrap_err().to_string();
        assert!(
            err.contains("memory.usage_in_bytes") && err.contains("lots"),
            "{err}"
        );
        set(
            &tmp.path().join("memory"),
            "/y",
            "memory.usage_in_bytes",
            "5\n",
        );
        set(&tmp.path().join("memory"), "/y", "memory.stat", "cache 1\n");
        let err = fs.memory("/y").unwrap_err().to_string();
        assert!(err.contains("no total_inactive_file"), "{err}");
        assert!(matches!(
            fs.memory("/../etc"),
            Err(ObserveError::BadCgroup { .. })
        ));
    }

    #[test]
    fn process_count_walks_the_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("memory");
        v1_memcg(&root, "/", 1, 0);
        set(&root, "/pod1", "cgroup.procs", "");
        set(&root, "/pod1/a", "cgroup.procs", "10\n11\n");
        set(&root, "/pod1/b", "cgroup.procs", "12\n");
        set(&root, "/pod1/b/deeper", "cgroup.procs", "13\n14\n15\n");
        let mut fs = CgroupFs::detect(tmp.path()).unwrap();
        assert_eq!(fs.process_count("/pod1").unwrap(), Some(6));
        assert_eq!(fs.process_count("/pod1/a").unwrap(), Some(2));
        assert_eq!(fs.process_count("/pod2").unwrap(), None);
    }

    #[test]
    fn stat_lines_are_matched_by_whole_key() {
        let text = "total_inactive_file 7\ninactive_file 3\n";
        assert_eq!(stat_value(text, "inactive_file"), Ok(Some(3)));
        assert_eq!(stat_value(text, "total_inactive_file"), Ok(Some(7)));
        assert_eq!(stat_value(text, "file"), Ok(None));
        assert!(stat_value("file x\n", "file").is_err());
    }
}
