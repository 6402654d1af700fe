//! Shared helpers for the integration tests: the rule on skipping, and temp roots that clean
//! up after themselves.
//!
//! Tests that need root and a real kernel run in CI (`CI=true`) and must not skip there; on a
//! developer machine without root they print why they skip and pass.

use std::path::{Path, PathBuf};

pub mod agent;
pub mod cgroup_root;
pub mod chaos;
pub mod containerd;
pub mod exposition;
pub mod freezer;
pub mod hog_record;
pub mod node;
pub mod oci;
pub mod stats;
pub mod v2;

pub use containerd::{containerd_available, Containerd, TestCgroupTree};
pub use oci::{BuiltImage, TestImage};

/// Where `cargo xtask fuzz --seeds` collects the fuzz targets' seed corpus: set, the tests
/// that make parser inputs (the plan tests, `fuzz_seeds`) also keep them there.
pub const FUZZ_SEEDS_ENV: &str = "REACTOR_FUZZ_SEEDS";

/// Keeps `bytes` as a seed of fuzz target `target` (`$REACTOR_FUZZ_SEEDS/<target>/<name>`,
/// the name a hash of the bytes so a seed made twice is kept once); nothing when the
/// variable is unset. Returns where it went.
pub fn keep_fuzz_seed(target: &str, bytes: &[u8]) -> Option<PathBuf> {
    let dir = Path::new(&std::env::var_os(FUZZ_SEEDS_ENV)?).join(target);
    std::fs::create_dir_all(&dir).ok()?;
    // FNV-1a, 64 bits: stable across runs and toolchains, unlike the std hasher.
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    let path = dir.join(format!("{hash:016x}"));
    std::fs::write(&path, bytes).ok()?;
    Some(path)
}

/// Whether the tests run in CI, where every kernel test must run.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Returns `true` when the test may go on; otherwise prints why it skips. Panics in CI, where
/// a skip would hide a broken kernel path.
pub fn require(condition: bool, what: &str) -> bool {
    if condition {
        return true;
    }
    if in_ci() {
        panic!("required in CI but missing: {what}");
    }
    eprintln!("skipping: {what}");
    false
}

/// Whether the test process runs as root.
pub fn is_root() -> bool {
    // SAFETY-free check: /proc/self/status carries the effective uid.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// The `reactor` binary built for this test run.
pub fn reactor_bin() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    target.join(profile).join("reactor")
}

/// The usage an eviction message gives for container `name` ("Container app was using
/// 207384Ki, ..."), in bytes; `None` when the message names no such figure.
pub fn message_container_usage(message: &str, name: &str) -> Option<i128> {
    let after = message
        .split(&format!("Container {name} was using "))
        .nth(1)?;
    let text = after.split(',').next()?;
    reactor::decide::quantity::Quantity::parse(text)
        .ok()
        .map(|q| q.value())
}

/// Starts `cmd` inside the cgroup whose directory is `dir` (v1 or v2): the child writes its
/// pid to `cgroup.procs` between fork and exec, so nothing it allocates is charged elsewhere.
pub fn spawn_in_cgroup(
    dir: &std::path::Path,
    cmd: &mut std::process::Command,
) -> std::io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    let procs = dir.join("cgroup.procs");
    // SAFETY: the closure only writes a file with std calls that are safe between fork and
    // exec for this single-purpose child (no locks are held by the test at spawn).
    unsafe {
        cmd.pre_exec(move || std::fs::write(&procs, std::process::id().to_string()));
    }
    cmd.spawn()
}

/// The `memhog` helper binary built beside the tests.
pub fn memhog_bin() -> PathBuf {
    reactor_bin().with_file_name("memhog")
}

/// A file on `/var/tmp` whose pages are clean, inactive page cache charged to the memory
/// cgroup that [`fill_page_cache`] filled; the file goes with its directory, and its cache
/// with the file.
pub struct CacheFile {
    /// The file's own directory (removed on drop).
    pub dir: tempfile::TempDir,
    /// The file.
    pub path: PathBuf,
    /// How long writing, dropping and reading it back took.
    pub took: std::time::Duration,
}

/// Runs `cmd` to its end inside the memory cgroup at `dir`; fails naming `what`.
fn run_in(dir: &Path, cmd: &mut std::process::Command, what: &str) -> std::io::Result<()> {
    let status = spawn_in_cgroup(
        dir,
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    )?
    .wait()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "{what} in {}: {status}",
            dir.display()
        )))
    }
}

/// Fills the memory cgroup at `dir` with `bytes` of clean, inactive page cache, as a node's
/// memory fills after a day of work: `dd` writes a file on `/var/tmp` (a disk file system:
/// tmpfs pages are shmem, on the anon lists) from the cgroup, drops its cache and reads it
/// back once. Written pages carry buffer heads, kernel memory charged beside them that
/// leaves as the cache is reclaimed, and some end on the active list (a written 768 MiB file
/// left 60 % of a full cgroup inactive once); read once, the pages are plain inactive file.
/// Past the cgroup's limit, it ends at its limit full of it.
pub fn fill_page_cache(dir: &Path, bytes: u64) -> std::io::Result<CacheFile> {
    let start = std::time::Instant::now();
    let tmp = tempfile::Builder::new()
        .prefix("reactor-test-cache")
        .tempdir_in("/var/tmp")?;
    let path = tmp.path().join("cache");
    let file = path.display();
    run_in(
        dir,
        std::process::Command::new("dd")
            .arg("if=/dev/zero")
            .arg(format!("of={file}"))
            .arg("bs=1M")
            .arg(format!("count={}", bytes >> 20))
            .arg("conv=fsync"),
        "writing the page-cache file (dd)",
    )?;
    run_in(
        dir,
        std::process::Command::new("dd")
            .arg(format!("if={file}"))
            .args(["iflag=nocache", "count=0"]),
        "dropping the page-cache file's cache (dd iflag=nocache)",
    )?;
    read_page_cache(dir, &path)?;
    Ok(CacheFile {
        dir: tmp,
        path,
        took: start.elapsed(),
    })
}

/// Reads `file` through once from the memory cgroup at `dir` (`dd` to /dev/null).
pub fn read_page_cache(dir: &Path, file: &Path) -> std::io::Result<()> {
    run_in(
        dir,
        std::process::Command::new("dd")
            .arg(format!("if={}", file.display()))
            .args(["of=/dev/null", "bs=1M"]),
        "reading the page-cache file (dd)",
    )
}

/// A memory cgroup's usage from its directory: v1 `memory.usage_in_bytes`, v2
/// `memory.current`.
pub fn memcg_usage(dir: &Path) -> std::io::Result<u64> {
    let text = std::fs::read_to_string(dir.join("memory.usage_in_bytes"))
        .or_else(|_| std::fs::read_to_string(dir.join("memory.current")))?;
    text.trim()
        .parse()
        .map_err(|e| std::io::Error::other(format!("usage {text:?} in {}: {e}", dir.display())))
}

/// A cgroup v1 memory cgroup with a limit, unique to one test, removed on drop (after the
/// processes the test started in it are killed by pid).
pub struct TestMemcg {
    /// The cgroup's directory in the memory hierarchy.
    pub path: PathBuf,
    /// Its path inside the hierarchy (`/reactor-test-…`), as events name cgroups.
    pub cgroup: String,
    children: Vec<std::process::Child>,
}

/// Where the cgroup v1 memory controller is mounted on these machines.
pub const MEMCG_V1_ROOT: &str = "/sys/fs/cgroup/memory";

impl TestMemcg {
    /// Creates `/sys/fs/cgroup/memory/reactor-test-<name>-<pid>` with a memory limit.
    pub fn new(name: &str, limit_bytes: u64) -> std::io::Result<TestMemcg> {
        let cgroup = format!("/reactor-test-{name}-{}", std::process::id());
        let path = PathBuf::from(MEMCG_V1_ROOT).join(&cgroup[1..]);
        if path.exists() {
            let _ = std::fs::remove_dir(&path);
        }
        std::fs::create_dir(&path)?;
        let memcg = TestMemcg {
            path,
            cgroup,
            children: Vec::new(),
        };
        std::fs::write(
            memcg.path.join("memory.limit_in_bytes"),
            limit_bytes.to_string(),
        )?;
        Ok(memcg)
    }

    /// A child cgroup `name` of this one, without a limit of its own (the parent's applies);
    /// drop it before the parent.
    pub fn child(&self, name: &str) -> std::io::Result<TestMemcg> {
        let path = self.path.join(name);
        if path.exists() {
            let _ = std::fs::remove_dir(&path);
        }
        std::fs::create_dir(&path)?;
        Ok(TestMemcg {
            path,
            cgroup: format!("{}/{name}", self.cgroup),
            children: Vec::new(),
        })
    }

    /// Starts a command inside this cgroup (it joins before it execs).
    pub fn spawn(&mut self, cmd: &mut std::process::Command) -> std::io::Result<u32> {
        let child = spawn_in_cgroup(&self.path, cmd)?;
        let pid = child.id();
        self.children.push(child);
        Ok(pid)
    }

    /// Runs a command inside this cgroup to its end: how it exited and how long it took from
    /// just before the spawn to its exit (waited for directly, so no polling interval in it).
    pub fn run(
        &mut self,
        cmd: &mut std::process::Command,
    ) -> std::io::Result<(std::process::ExitStatus, std::time::Duration)> {
        let start = std::time::Instant::now();
        self.spawn(cmd)?;
        let child = self.children.last_mut().expect("just spawned");
        let status = child.wait()?;
        let took = start.elapsed();
        self.children.pop();
        Ok((status, took))
    }

    /// Kills (by pid) and reaps every child started here so far, so the cgroup can be used
    /// again from empty.
    pub fn kill_all(&mut self) {
        for mut child in self.children.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.kill_leftovers();
    }

    /// Kills (by pid) whatever the children left in the cgroup (a shell's own children):
    /// only this test's processes can be in a cgroup unique to it.
    fn kill_leftovers(&self) {
        for _ in 0..50 {
            let text = std::fs::read_to_string(self.path.join("cgroup.procs")).unwrap_or_default();
            let pids: Vec<i32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Waits for every child started here to exit, up to `timeout`; returns their statuses.
    pub fn wait_all(
        &mut self,
        timeout: std::time::Duration,
    ) -> Vec<Option<std::process::ExitStatus>> {
        let deadline = std::time::Instant::now() + timeout;
        self.children
            .iter_mut()
            .map(|c| loop {
                match c.try_wait() {
                    Ok(Some(s)) => break Some(s),
                    Ok(None) if std::time::Instant::now() < deadline => {
                        std::thread::sleep(std::time::Duration::from_millis(20))
                    }
                    _ => break None,
                }
            })
            .collect()
    }
}

impl Drop for TestMemcg {
    fn drop(&mut self) {
        self.kill_all();
        for _ in 0..100 {
            if std::fs::remove_dir(&self.path).is_ok() || !self.path.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        eprintln!(
            "warning: could not remove test cgroup {}",
            self.path.display()
        );
    }
}

/// A process a test started, killed (by its pid) on drop if the test did not see it exit.
pub struct ChildGuard(pub std::process::Child);

impl ChildGuard {
    /// Waits up to `within` for the process to exit on its own and returns how it ended;
    /// panics naming `what` if it is still running then.
    pub fn wait_exit(
        &mut self,
        what: &str,
        within: std::time::Duration,
    ) -> std::process::ExitStatus {
        let started = std::time::Instant::now();
        loop {
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                started.elapsed() < within,
                "{what} did not exit within {within:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
