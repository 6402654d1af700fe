//! What a chaos run sets up around the agent: the modelled node's config, the nodefs
//! tmpfs, and the watch on the kernel's OOM kills in the pods' memcgs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::check;

/// The node a run models: its memory, its memory thresholds, and what the hard threshold's
/// headroom is counted on to catch.
#[derive(Clone, Copy, Debug)]
pub struct Model {
    /// `node.memoryCapacity` in MiB; the agent gives `kubepods` that limit.
    pub memory_mib: u64,
    /// `evictionHard` `memory.available`, MiB.
    pub hard_mib: u64,
    /// `evictionSoft` `memory.available` (2 s grace), MiB.
    pub soft_mib: u64,
    /// The fastest allocation the hard threshold's headroom is counted on to catch (MiB/s):
    /// a kernel OOM kill while a faster ramp runs is an exception, counted with its cause.
    pub ramp_limit_mib_s: u64,
    /// The schedule's memory sizes in percent of the host run's.
    pub size_pct: u64,
    /// How long past a pod's grace its processes may take to go (the agent's kill, the
    /// kernel's exit of a big address space).
    pub slack: Duration,
}

/// The host run: 768 MiB, hard 150 MiB (headroom caught within half a second on this
/// loaded machine at 300 MiB/s), soft 300 MiB.
pub const HOST: Model = Model {
    memory_mib: 768,
    hard_mib: 150,
    soft_mib: 300,
    ramp_limit_mib_s: 300,
    size_pct: 100,
    slack: Duration::from_secs(6),
};

/// The short run in the cgroup v2 guest: 1 GiB of RAM in all, emulated (TCG, code about
/// 17 times slower than on the host), so half the node and half the sizes, and a ramp limit
/// and an exit slack sized for an agent and a kernel that slow.
pub const GUEST: Model = Model {
    memory_mib: 384,
    hard_mib: 96,
    soft_mib: 160,
    ramp_limit_mib_s: 40,
    size_pct: 50,
    slack: Duration::from_secs(20),
};

/// The agent's config for `model`: its memory thresholds (soft for 2 s), nodefs (the run's
/// 64 MiB tmpfs) at 20 %, pids at 700 tasks above what the machine ran at the start (and
/// imagefs at 20 % under containerd); every kernel source on.
pub(super) fn config(
    model: &Model,
    nodefs: &Path,
    pid_threshold: u64,
    cri: Option<&str>,
) -> String {
    // Under containerd its root is a small tmpfs: the image filesystem, where the disk
    // fillers' writable layers are, with a threshold of its own.
    let (imagefs, runtime) = match cri {
        Some(endpoint) => (
            ", imagefs.available: 20%".to_string(),
            format!("runtime: {{kind: cri, endpoint: '{endpoint}'}}\n"),
        ),
        None => (String::new(), String::new()),
    };
    format!(
        "node: {{memoryCapacity: {mem}Mi, cpuCapacity: '2', nodefsPath: {nodefs}}}\n\
         evictionHard: {{memory.available: {hard}Mi, nodefs.available: 20%, \
         pid.available: '{pid_threshold}'{imagefs}}}\n{runtime}\
         evictionSoft: {{memory.available: {soft}Mi}}\n\
         evictionSoftGracePeriod: {{memory.available: 2s}}\n\
         evictionMaxPodGracePeriod: 5\n\
         evictionPressureTransitionPeriod: 5s\n\
         housekeepingInterval: 1s\n\
         orphanGracePeriod: 1h\n\
         sense: {{ebpf: true, psi: false, memcgThreshold: true}}\n",
        mem = model.memory_mib,
        hard = model.hard_mib,
        soft = model.soft_mib,
        nodefs = nodefs.display()
    )
}

/// `min(pid_max, threads-max)` less the tasks running now and 700: `pid.available` falls
/// below it when the run's pods add 700 tasks (a fork storm does).
pub(super) fn pid_threshold() -> u64 {
    let read = |p: &str| -> u64 {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(32768)
    };
    let max = read("/proc/sys/kernel/pid_max").min(read("/proc/sys/kernel/threads-max"));
    let tasks = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| reactor::observe::procfs::parse_loadavg_tasks(&s))
        .unwrap_or(1000);
    max.saturating_sub(tasks + 700)
}

/// A tmpfs mounted for the run, unmounted on drop.
pub(super) struct Tmpfs(pub(super) PathBuf);

impl Tmpfs {
    pub(super) fn mount(dir: PathBuf, mib: u64) -> std::io::Result<Tmpfs> {
        std::fs::create_dir_all(&dir)?;
        rustix::mount::mount(
            "reactor-chaos",
            &dir,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            std::ffi::CString::new(format!("size={mib}m"))
                .map_err(std::io::Error::other)?
                .as_c_str(),
        )?;
        Ok(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
    }
}

/// Kernel OOM kills counted in the pods' memcgs, watched every 5 ms on a thread of its own
/// (a pod's cgroup goes with the pod, so the counters are read while they exist).
pub(super) struct OomWatch {
    kills: Arc<Mutex<Vec<(Instant, PathBuf, u64)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OomWatch {
    /// Watches the container memcgs under `kubepods`; `v2` says which counter file they have.
    pub(super) fn start(kubepods: PathBuf, v2: bool) -> OomWatch {
        let kills: Arc<Mutex<Vec<(Instant, PathBuf, u64)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (k, s) = (Arc::clone(&kills), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            let mut seen: BTreeMap<PathBuf, u64> = BTreeMap::new();
            let mut listed = Instant::now() - Duration::from_secs(1);
            let mut dirs = Vec::new();
            while !s.load(Ordering::Relaxed) {
                if listed.elapsed() > Duration::from_millis(50) {
                    dirs = check::container_memcgs(&kubepods);
                    listed = Instant::now();
                }
                for d in &dirs {
                    let Some(n) = check::oom_kills(d, v2) else {
                        continue;
                    };
                    let before = seen.entry(d.clone()).or_insert(0);
                    if n > *before {
                        k.lock().unwrap_or_else(|e| e.into_inner()).push((
                            Instant::now(),
                            d.clone(),
                            n - *before,
                        ));
                        *before = n;
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        OomWatch {
            kills,
            stop,
            thread: Some(thread),
        }
    }

    pub(super) fn take(&self) -> Vec<(Instant, PathBuf, u64)> {
        std::mem::take(&mut *self.kills.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for OomWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Thaws `dir`: a v1 freezer cgroup (`freezer.state`), or a v2 cgroup (`cgroup.freeze`,
/// which freezes everything below it).
pub(super) fn thaw(dir: &Path) {
    let _ = if dir.join("freezer.state").exists() {
        std::fs::write(dir.join("freezer.state"), "THAWED")
    } else {
        std::fs::write(dir.join("cgroup.freeze"), "0")
    };
}

/// Freezes the v2 cgroup `dir` and waits, up to `timeout`, until `cgroup.events` says every
/// process below it is frozen.
pub(super) fn freeze_v2(dir: &Path, timeout: Duration) -> std::io::Result<bool> {
    std::fs::write(dir.join("cgroup.freeze"), "1")?;
    let t = Instant::now();
    loop {
        let events = std::fs::read_to_string(dir.join("cgroup.events"))?;
        if events.lines().any(|l| l.trim() == "frozen 1") {
            return Ok(true);
        }
        if t.elapsed() > timeout {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Thaws each frozen cgroup when its time comes, on a thread of its own: the run's main
/// loop may wait on the agent (a CLI call behind a runtime stop of that very frozen pod),
/// and a freeze must not last as long as that wait.
pub(super) struct Thawer {
    due: Arc<Mutex<Vec<(PathBuf, Instant)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Thawer {
    pub(super) fn start() -> Thawer {
        let due: Arc<Mutex<Vec<(PathBuf, Instant)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (d, s) = (Arc::clone(&due), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let now = Instant::now();
                d.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|(dir, at)| {
                        if *at > now {
                            return true;
                        }
                        thaw(dir);
                        false
                    });
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Thawer {
            due,
            stop,
            thread: Some(thread),
        }
    }

    /// Thaws the frozen cgroup `dir` at `at` ([`thaw`]).
    pub(super) fn thaw_at(&self, dir: PathBuf, at: Instant) {
        self.due
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((dir, at));
    }
}

impl Drop for Thawer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
