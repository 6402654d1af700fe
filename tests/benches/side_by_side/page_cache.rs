//! Page cache for the parts' "full of page cache" setups (issue 42): files written once to a
//! disk file system from inside a memory cgroup, so their pages are charged to it and sit on
//! its inactive file list, and what the cgroup's `memory.stat` then says.
//!
//! The files go to `/var/tmp` (ext4 on these machines), never a tmpfs: a tmpfs's pages are
//! shmem, on the anon lists, and no inactive file. They are flushed as they are written
//! (`dd conv=fsync`), so the cache is clean and reclaim can drop it at once, as a calm
//! node's mostly is (dirty pages would make a reclaiming hog wait on writeback). A page read
//! again while still cached is moved to the active list ([`read`] is for that), so a file
//! that is to stay inactive is written afresh rather than read back.
//!
//! [`fill`] writes, drops the file's cache and reads it back once: ext4 attaches buffer
//! heads to the pages it writes, kernel memory charged to the same cgroup (13 MiB for a
//! cgroup filled to 512 MiB here), which leaves with the pages as reclaim takes them, so
//! the cgroup's working set (`usage - inactive_file`) fell as a hog reclaimed that cache
//! and a crossing clocked on the working set before the hog came 8 MiB early. Pages read
//! from disk carry none (the working set of a cgroup filled so read 0 MiB), and a page read
//! once stays on the inactive list.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reactor::observe::cgroupfs::stat_value;

/// A file holding page cache; removed, and its cache freed with it, on drop.
pub(crate) struct CacheFile {
    /// The file's own directory (removed with it).
    _dir: tempfile::TempDir,
    pub(crate) path: PathBuf,
    /// How long writing it took (the write and the flush).
    pub(crate) took: Duration,
}

/// Runs `cmd` inside the memory cgroup at `memcg` (it joins before it execs) to its end.
fn run_in(memcg: &Path, cmd: &mut Command, what: &str) -> Result<Duration> {
    let start = Instant::now();
    let mut child = reactor_tests::spawn_in_cgroup(memcg, cmd)
        .with_context(|| format!("{what}: starting it in {}", memcg.display()))?;
    let out = child.wait().with_context(|| format!("{what}: waiting"))?;
    if !out.success() {
        bail!("{what} in {}: {out}", memcg.display());
    }
    Ok(start.elapsed())
}

/// Writes `bytes` (whole MiB) of zeros to a new file on `/var/tmp` from inside the memory
/// cgroup whose directory is `memcg`, flushed to disk before it returns.
pub(crate) fn write(memcg: &Path, bytes: u64) -> Result<CacheFile> {
    if bytes < 1 << 20 {
        bail!("a page-cache file of {bytes} bytes: at least 1 MiB is written");
    }
    let dir = tempfile::Builder::new()
        .prefix("reactor-bench-cache")
        .tempdir_in("/var/tmp")
        .context("a directory on /var/tmp for the page-cache file")?;
    let path = dir.path().join("cache");
    let took = run_in(
        memcg,
        Command::new("dd")
            .arg("if=/dev/zero")
            .arg(format!("of={}", path.display()))
            .arg("bs=1M")
            .arg(format!("count={}", bytes >> 20))
            .arg("conv=fsync")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        "writing the page-cache file (dd)",
    )?;
    Ok(CacheFile {
        _dir: dir,
        path,
        took,
    })
}

/// [`write`], then the file's cache dropped (`dd iflag=nocache count=0`:
/// `posix_fadvise(DONTNEED)` on the whole file; its pages are clean after the flush) and the
/// file read once from the same cgroup: page cache charged to `memcg` with no buffer heads,
/// on the inactive list (see the module doc); the tests' own [`reactor_tests::fill_page_cache`].
pub(crate) fn fill(memcg: &Path, bytes: u64) -> Result<CacheFile> {
    if bytes < 1 << 20 {
        bail!("a page-cache file of {bytes} bytes: at least 1 MiB is written");
    }
    let file = reactor_tests::fill_page_cache(memcg, bytes)
        .with_context(|| format!("filling {} with page cache", memcg.display()))?;
    Ok(CacheFile {
        _dir: file.dir,
        path: file.path,
        took: file.took,
    })
}

/// Reads `file` to its end from inside the memory cgroup at `memcg` (`dd` to `/dev/null`):
/// pages still cached are marked accessed, and a page accessed twice is activated.
pub(crate) fn read(memcg: &Path, file: &Path) -> Result<Duration> {
    let start = Instant::now();
    reactor_tests::read_page_cache(memcg, file)
        .with_context(|| format!("reading {} from {}", file.display(), memcg.display()))?;
    Ok(start.elapsed())
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MemStat {
    pub(crate) usage: u64,
    pub(crate) inactive_file: u64,
    pub(crate) active_file: u64,
}

impl MemStat {
    /// The share of usage on the inactive file list.
    pub(crate) fn inactive_share(&self) -> f64 {
        self.inactive_file as f64 / self.usage.max(1) as f64
    }

    /// `usage - inactive_file`: the kubelet's working set.
    pub(crate) fn working_set(&self) -> u64 {
        self.usage.saturating_sub(self.inactive_file)
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "usage_bytes": self.usage,
            "inactive_file_bytes": self.inactive_file,
            "active_file_bytes": self.active_file,
            "inactive_file_share": self.inactive_share(),
        })
    }
}

/// Reads `memory.usage_in_bytes` and the hierarchical file counters (`total_inactive_file`,
/// `total_active_file`) of the v1 memory cgroup at `memcg`.
pub(crate) fn stat(memcg: &Path) -> Result<MemStat> {
    let text = std::fs::read_to_string(memcg.join("memory.stat"))
        .with_context(|| format!("reading {}/memory.stat", memcg.display()))?;
    let field = |name: &str| -> Result<u64> {
        stat_value(&text, name)
            .map_err(anyhow::Error::msg)?
            .with_context(|| format!("no {name} in {}/memory.stat", memcg.display()))
    };
    let usage = std::fs::read_to_string(memcg.join("memory.usage_in_bytes"))
        .with_context(|| format!("reading {}/memory.usage_in_bytes", memcg.display()))?;
    let usage = usage.trim().parse().with_context(|| {
        format!(
            "{}/memory.usage_in_bytes is not a number: {usage:?}",
            memcg.display()
        )
    })?;
    Ok(MemStat {
        usage,
        inactive_file: field("total_inactive_file")?,
        active_file: field("total_active_file")?,
    })
}

/// Reads [`stat`] of the memory cgroup at `memcg` with its statistics folded first: a
/// process in `inside` (a memory cgroup in `memcg`'s subtree) touches 4 MiB and exits before
/// the read. The kernel folds a cgroup's statistics (rstat) on a read only once more than
/// `MEMCG_CHARGE_BATCH` × CPUs page updates are pending (128 pages here), else every 2 s;
/// up to that many, a few hundred pages, can be missing from a plain read. The process's
/// 1,024 charges and uncharges push the count past the gate, so this read folds everything.
/// At a limit, its charge reclaims 4 MiB of inactive page cache that its exit frees: usage
/// and inactive file pages fall alike, and the working set stays.
pub(crate) fn folded_stat(memcg: &Path, inside: &Path) -> Result<MemStat> {
    run_in(
        inside,
        Command::new("dd").args([
            "if=/dev/zero",
            "of=/dev/null",
            "bs=4M",
            "count=1",
            "status=none",
        ]),
        "the statistics fold's 4 MiB touch",
    )?;
    stat(memcg)
}

/// How long [`settled`] waits: the kernel's periodic flush of the cgroup statistics runs
/// every 2 s.
const SETTLE_WAIT: Duration = Duration::from_secs(6);

/// Reads the memory cgroup at `parent` once its `total_inactive_file` holds what its
/// descendant at `child` has (within [`SETTLE_SLACK_BYTES`]), waiting up to
/// [`SETTLE_WAIT`]; after that it takes the reading as it is and says so on stderr (a stale
/// figure is the kernel's, not a broken harness: a full run must not end on it). The slack
/// is tight because the OOM part's cache-full clock starts from this reading: a run that
/// took readings up to 4 MiB short placed its crossings about 2 MiB early (crossing →
/// SIGKILL p50 13 ms at 150 MiB/s, against 0.27 ms with 1 MiB).
///
/// The kernel folds a cgroup's page statistics into its ancestors' lazily (rstat): right
/// after a child's page cache was filled, the parent's `memory.stat` showed none of it
/// (kubepods at 202 MiB of usage, 0 of it inactive file, with 200 MiB inactive in the pod
/// below), so a working set read from it counted the whole cache, and the activation burst's
/// clock placed its crossing half a second early. Its usage, a page counter, is exact. Once
/// folded, the two figures can still differ by a few pages' worth of per-CPU batches (410
/// against 412 MiB, seen once).
pub(crate) fn settled(parent: &Path, child: &Path) -> Result<MemStat> {
    let want = stat(child)?.inactive_file;
    let slack = SETTLE_SLACK_BYTES;
    let deadline = Instant::now() + SETTLE_WAIT;
    loop {
        let now = stat(parent)?;
        if now.inactive_file + slack >= want {
            return Ok(now);
        }
        if Instant::now() > deadline {
            eprintln!(
                "bench: {}: {} MiB of inactive file pages after {:?}, its descendant {} has {} \
                 MiB; taken as it is",
                parent.display(),
                now.inactive_file >> 20,
                SETTLE_WAIT,
                child.display(),
                want >> 20
            );
            return Ok(now);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How far a parent's folded inactive file figure may fall short of its descendant's and
/// still count as holding it.
const SETTLE_SLACK_BYTES: u64 = 1 << 20;

/// A v1 memory cgroup's `memory.limit_in_bytes`.
pub(crate) fn limit(memcg: &Path) -> Result<u64> {
    let text = std::fs::read_to_string(memcg.join("memory.limit_in_bytes"))
        .with_context(|| format!("reading {}/memory.limit_in_bytes", memcg.display()))?;
    text.trim().parse().with_context(|| {
        format!(
            "{}/memory.limit_in_bytes is not a number: {text:?}",
            memcg.display()
        )
    })
}

/// A memory cgroup of the bench's own (no pod: the loops rank pods only, and the agent's
/// recovery looks only at `pod*` names) that holds page cache inside a node's cgroup tree,
/// with the file whose cache it holds. The file goes first on drop (its cache with it),
/// then the cgroup.
pub(crate) struct CacheCgroup {
    pub(crate) dir: PathBuf,
    file: Option<CacheFile>,
}

impl CacheCgroup {
    /// Makes the cgroup `name` in the v1 memory cgroup at `parent`.
    pub(crate) fn new(parent: &Path, name: &str) -> Result<CacheCgroup> {
        let dir = parent.join(name);
        if !dir.exists() {
            std::fs::create_dir(&dir)
                .with_context(|| format!("creating the cache cgroup {}", dir.display()))?;
        }
        Ok(CacheCgroup { dir, file: None })
    }

    /// Frees the cache held now (removes its file), then fills `bytes` afresh ([`fill`]).
    pub(crate) fn fill(&mut self, bytes: u64) -> Result<&CacheFile> {
        self.empty();
        Ok(self.file.insert(fill(&self.dir, bytes)?))
    }

    /// Removes the file, which frees its page cache.
    pub(crate) fn empty(&mut self) {
        self.file = None;
    }
}

impl Drop for CacheCgroup {
    fn drop(&mut self) {
        self.empty();
        // Nothing runs in it once `dd` has exited; the rmdir may wait for the charges.
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&self.dir).is_err()
            && self.dir.exists()
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.dir.exists() {
            eprintln!(
                "warning: could not remove the cache cgroup {}",
                self.dir.display()
            );
        }
    }
}
