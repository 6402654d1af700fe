//! memcg notifications: the memory controller's own "usage crossed X" and "OOM" signals.
//!
//! - cgroup v1: a threshold on `memory.usage_in_bytes` registered through
//!   `cgroup.event_control` with an eventfd (`"<eventfd> <fd of memory.usage_in_bytes>
//!   <bytes>"`, what the kubelet's `--kernel-memcg-notification` does), and the OOM
//!   notification (an eventfd registered against `memory.oom_control`), so OOMs are seen
//!   without eBPF. The kernel signals a threshold eventfd when usage crosses it in *either*
//!   direction, so the event carries the usage read at wake-up to tell which.
//! - cgroup v2: `memory.events` is watched with inotify (`IN_MODIFY`, which the kernel raises
//!   on every counter change) and the `low`/`high`/`max`/`oom`/`oom_kill` deltas become
//!   events. v2 has no byte thresholds; a target's threshold is checked against
//!   `memory.current` whenever `memory.events` moves.
//!
//! Which cgroups to watch is an input ([`MemcgTarget`]): the reactor loop sets them from the
//! eviction thresholds; `reactor watch`/`run` from flags or the config ([`node_target`]).
//!
//! Minimum kernel: 2.6.34 for v1 thresholds, 4.5 for v2 `memory.events`.

use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::event::{eventfd, EventfdFlags};
use rustix::fs::inotify;
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use std::sync::Arc;
use tokio::io::unix::AsyncFd;

use tokio::sync::{mpsc, watch};

use super::{monotonic_ns, Kind, PressureEvent, Source};

/// Moves the usage thresholds armed for the targets while the watches run. The kubelet's
/// memory threshold notifier re-arms its usage threshold at `capacity - level +
/// inactive_file` on every housekeeping pass, because usage counts inactive page cache that
/// the working set (what eviction compares) does not: a threshold at `capacity - level` fires
/// early, by exactly the inactive file pages, and the decision it wakes finds nothing met.
/// The same levels drive the eBPF charge programs' in-kernel thresholds
/// ([`super::ebpf::threshold`]). Cheap to clone; a target that was not armed (no threshold,
/// v1 registration refused) is ignored.
#[derive(Clone, Debug, Default)]
pub struct MemcgThresholds {
    armed: Arc<Vec<(MemcgTarget, watch::Sender<Level>)>>,
}

impl MemcgThresholds {
    /// The targets as they were given to [`super::Sense::start`] (their base thresholds).
    pub fn targets(&self) -> impl Iterator<Item = &MemcgTarget> {
        self.armed.iter().map(|(t, _)| t)
    }

    /// Arms `target`'s notification at `level` from now on; a no-op when it is armed there
    /// already.
    pub fn set(&self, target: &MemcgTarget, level: Level) {
        for (t, tx) in self.armed.iter() {
            if t == target {
                tx.send_if_modified(|now| {
                    let changed = *now != level;
                    *now = level;
                    changed
                });
            }
        }
    }
}

/// Where a target's threshold is: the usage that meets it now and, for a working-set level,
/// the inactive file pages counted into that usage.
///
/// The v1 eventfd and the v2 `memory.events` check can only compare usage, so they take
/// [`usage_bytes`](Self::usage_bytes), placed at the loop's last pass. The eBPF charge
/// programs compare the working set itself (usage minus the page cache they follow in the
/// kernel) against `usage_bytes - inactive_file_bytes`, which does not move with the page
/// cache, so their level cannot go stale between two passes.
///
/// Where the v1 eventfd cannot follow: its threshold is on `memory.usage_in_bytes` alone and
/// moves only when the loop re-registers it (at most once per [`V1_MOVE_STEP_BYTES`]), so
/// page cache dropped since the last pass leaves it high by that much; the eBPF slot, where it
/// runs, is the one that catches that crossing on time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Level {
    /// The usage at which the threshold is met now.
    pub usage_bytes: u64,
    /// `Some(i)`: a working-set level, `i` bytes of inactive file counted into
    /// `usage_bytes`; `None`: a plain usage level.
    pub inactive_file_bytes: Option<u64>,
}

impl Level {
    /// A plain usage level.
    pub fn usage(bytes: u64) -> Level {
        Level {
            usage_bytes: bytes,
            inactive_file_bytes: None,
        }
    }

    /// The level of a threshold on `base` bytes of working set, with `inactive_file` bytes
    /// of inactive file pages now ([`working_set_level`]).
    pub fn working_set(base: u64, inactive_file: u64) -> Level {
        Level {
            usage_bytes: working_set_level(base, inactive_file),
            inactive_file_bytes: Some(inactive_file),
        }
    }

    /// The working set at which the threshold is met, for a working-set level.
    pub fn working_set_bytes(&self) -> Option<u64> {
        self.inactive_file_bytes
            .map(|i| self.usage_bytes.saturating_sub(i))
    }
}

/// The usage at which a threshold on `base` bytes of working set is met, given the
/// cgroup's inactive file pages now: the eviction signal is met when the working set
/// (`usage - inactive_file`) exceeds `base`, so the kernel should wake us at the first
/// usage past `base + inactive_file` (`+ 1`: "at or above" in the kernel's checks).
pub fn working_set_level(base: u64, inactive_file: u64) -> u64 {
    base.saturating_add(inactive_file).saturating_add(1)
}

/// The least move worth a new v1 registration: each one allocates the cgroup's threshold
/// arrays anew and the old eventfd's removal waits for an RCU grace period in the kernel,
/// so a level following the page cache page by page would churn for nothing. Inside the
/// step the v1 notification may come up to this much early and the loop's close watch
/// finishes the approach; the eBPF slot has no such cost and follows every page.
pub const V1_MOVE_STEP_BYTES: u64 = 1 << 20;

/// Whether a v1 threshold registered at `registered` bytes should move to `want`.
pub fn v1_moves(registered: u64, want: u64) -> bool {
    registered.abs_diff(want) >= V1_MOVE_STEP_BYTES
}

/// Builds [`MemcgThresholds`] while the sources attach.
#[derive(Default)]
pub(crate) struct ThresholdsBuilder {
    armed: Vec<(MemcgTarget, watch::Sender<Level>)>,
}

impl ThresholdsBuilder {
    /// A receiver for `target`'s threshold, starting at `bytes`; every source that checks
    /// the same target (the memcg notification, the eBPF charge programs) follows one level.
    pub(crate) fn add(&mut self, target: &MemcgTarget, bytes: u64) -> watch::Receiver<Level> {
        if let Some((_, tx)) = self.armed.iter().find(|(t, _)| t == target) {
            return tx.subscribe();
        }
        let (tx, rx) = watch::channel(Level::usage(bytes));
        self.armed.push((target.clone(), tx));
        rx
    }

    pub(crate) fn build(self) -> MemcgThresholds {
        MemcgThresholds {
            armed: Arc::new(self.armed),
        }
    }
}

/// A cgroup to watch and, optionally, a usage threshold on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemcgTarget {
    /// The cgroup as a path inside the memory hierarchy (`/`, `/kubepods`).
    pub cgroup: String,
    /// Usage in bytes whose crossing wakes us; `None` watches OOMs / `memory.events` only.
    pub threshold_bytes: Option<u64>,
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
pub struct CgroupMounts {
    /// The v1 hierarchy that has the memory controller.
    pub v1_memory: Option<PathBuf>,
    /// The cgroup2 mount.
    pub v2: Option<PathBuf>,
}

/// Finds the cgroup mounts in the text of `/proc/self/mountinfo`.
pub fn parse_mountinfo(text: &str) -> CgroupMounts {
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
    pub fn detect() -> Result<MemoryHierarchy, String> {
        let text = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
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
            return Err(format!(
                "cgroup2 at {} has no memory controller and no v1 memory hierarchy is mounted",
                root.display()
            ));
        }
        Err("no memory cgroup hierarchy is mounted".into())
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
    pub fn dir(&self, cgroup: &str) -> Result<PathBuf, String> {
        cgroup_dir(self.root(), cgroup)
    }
}

/// Joins a cgroup path under a hierarchy root so that it cannot escape it.
pub fn cgroup_dir(root: &Path, cgroup: &str) -> Result<PathBuf, String> {
    let mut dir = root.to_path_buf();
    for component in Path::new(cgroup).components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => dir.push(part),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(format!("cgroup path {cgroup:?} must not contain \"..\""));
            }
        }
    }
    Ok(dir)
}

/// The counters of a v2 `memory.events` file (or any flat `key value` file).
pub type EventCounters = BTreeMap<String, u64>;

/// Parses a flat keyed file of counters (`memory.events`, `memory.oom_control`).
pub fn parse_counters(text: &str) -> Result<EventCounters, String> {
    let mut counters = EventCounters::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut words = line.split_whitespace();
        let (Some(key), Some(value), None) = (words.next(), words.next(), words.next()) else {
            return Err(format!("line {line:?} is not \"key value\""));
        };
        let value = value
            .parse()
            .map_err(|_| format!("{key} value {value:?} is not a count"))?;
        counters.insert(key.to_string(), value);
    }
    Ok(counters)
}

/// The `memory.events` items worth an event, by kernel name.
const EVENT_ITEMS: [&str; 5] = ["low", "high", "max", "oom", "oom_group_kill"];

/// What changed between two readings of `memory.events`: one [`Kind::OomKill`] when
/// `oom_kill` moved, one [`Kind::MemcgEvent`] per other item that moved. A counter that went
/// down (the file was recreated) counts from zero.
pub fn events_delta(before: &EventCounters, now: &EventCounters) -> Vec<Kind> {
    let moved = |key: &str| {
        let n = now.get(key).copied().unwrap_or(0);
        let b = before.get(key).copied().unwrap_or(0);
        if n >= b {
            n - b
        } else {
            n
        }
    };
    let mut kinds = Vec::new();
    if moved("oom_kill") > 0 {
        kinds.push(Kind::OomKill {
            pid: None,
            comm: None,
            rss_bytes: None,
            oom_score_adj: None,
        });
    }
    for item in EVENT_ITEMS {
        let count = moved(item);
        if count > 0 {
            kinds.push(Kind::MemcgEvent {
                item: item.to_string(),
                count,
            });
        }
    }
    kinds
}

/// The usage threshold that wakes us before the `memory.available` hard eviction threshold is
/// met: `capacity - hard`.
///
/// memory.available is `capacity - working_set` and the working set is usage minus inactive
/// file pages, so usage ≥ working set: a threshold on usage at `capacity - hard` fires at or
/// before the moment the signal crosses, never after. The reactor then reads the real signal.
/// `hard` is a quantity (`"100Mi"`) or a percentage of capacity (`"10%"`).
pub fn node_threshold(capacity_bytes: u64, hard: &str) -> Result<u64, String> {
    let hard_bytes = if let Some(percent) = hard.strip_suffix('%') {
        let p: f64 = percent
            .parse()
            .map_err(|_| format!("{hard:?} is not a percentage"))?;
        if !(0.0..=100.0).contains(&p) {
            return Err(format!("{hard:?} is not a percentage in 0..100"));
        }
        (capacity_bytes as f64 * p / 100.0) as u64
    } else {
        let q = crate::decide::quantity::Quantity::parse(hard).map_err(|e| e.to_string())?;
        if q.is_negative() {
            return Err(format!("{hard:?} is negative"));
        }
        u64::try_from(q.value()).map_err(|_| format!("{hard:?} is out of range"))?
    };
    Ok(capacity_bytes.saturating_sub(hard_bytes))
}

/// The node's memory capacity: `node.memoryCapacity` when set, else `MemTotal` of
/// `/proc/meminfo`.
pub fn memory_capacity(configured: &str) -> Result<u64, String> {
    if !configured.is_empty() {
        let q = crate::decide::quantity::Quantity::parse(configured)
            .map_err(|e| format!("node.memoryCapacity: {e}"))?;
        return u64::try_from(q.value())
            .map_err(|_| format!("node.memoryCapacity {configured:?} is out of range"));
    }
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| format!("cannot read /proc/meminfo: {e}"))?;
    let kib = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .ok_or("no MemTotal in /proc/meminfo")?;
    Ok(kib * 1024)
}

/// The node target: the cgroup the agent manages (`cgroupRoot`) with the usage threshold
/// derived from capacity and the `memory.available` hard eviction threshold, or no
/// threshold (OOM / events only) when there is no such eviction threshold.
pub fn node_target(config: &crate::config::Config) -> Result<MemcgTarget, String> {
    let threshold_bytes = match config.eviction_hard.get("memory.available") {
        None => None,
        Some(hard) => {
            let capacity = memory_capacity(&config.node.memory_capacity)?;
            Some(
                node_threshold(capacity, hard)
                    .map_err(|e| format!("evictionHard.memory.available: {e}"))?,
            )
        }
    };
    Ok(MemcgTarget {
        cgroup: config.cgroup_root.clone(),
        threshold_bytes,
    })
}

/// What a v1 eventfd is registered for.
#[derive(Clone, Copy, Debug)]
enum V1Notification {
    Threshold(u64),
    Oom,
}

/// A v1 eventfd registered with `cgroup.event_control`.
pub(crate) struct EventfdWatch {
    eventfd: AsyncFd<OwnedFd>,
    /// The file the notification is registered on (`memory.usage_in_bytes` or
    /// `memory.oom_control`), read through this fd at wake-up.
    watched: OwnedFd,
    dir: PathBuf,
    cgroup: String,
    what: V1Notification,
    /// Where the threshold should be (a threshold watch whose level can move).
    moves: Option<watch::Receiver<Level>>,
}

fn open_ro(path: &Path) -> Result<OwnedFd, String> {
    rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).map_err(|e| match e {
        Errno::NOENT => format!("{} absent", path.display()),
        _ => format!("cannot open {}: {e}", path.display()),
    })
}

pub(crate) fn register_v1(
    dir: &Path,
    file: &str,
    arg: Option<u64>,
) -> Result<(OwnedFd, OwnedFd), String> {
    if !dir.is_dir() {
        return Err(format!("cgroup {} absent", dir.display()));
    }
    let watched = open_ro(&dir.join(file))?;
    let efd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
        .map_err(|e| format!("eventfd: {e}"))?;
    let line = match arg {
        Some(bytes) => format!("{} {} {bytes}", efd.as_raw_fd(), watched.as_raw_fd()),
        None => format!("{} {}", efd.as_raw_fd(), watched.as_raw_fd()),
    };
    let control = dir.join("cgroup.event_control");
    std::fs::write(&control, &line).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::PermissionDenied => " (not root?)",
            std::io::ErrorKind::NotFound => " (not a v1 memory cgroup?)",
            _ => "",
        };
        format!(
            "kernel refused {line:?} on {}: {e}{hint}",
            control.display()
        )
    })?;
    Ok((efd, watched))
}

/// Registers a v1 usage threshold on a cgroup directory; `moves` re-arms it elsewhere.
pub(crate) fn arm_v1_threshold(
    dir: &Path,
    cgroup: &str,
    threshold_bytes: u64,
    moves: Option<watch::Receiver<Level>>,
) -> Result<EventfdWatch, String> {
    let (efd, watched) = register_v1(dir, "memory.usage_in_bytes", Some(threshold_bytes))?;
    let mut w = EventfdWatch::new(
        efd,
        watched,
        dir,
        cgroup,
        V1Notification::Threshold(threshold_bytes),
    )?;
    w.moves = moves;
    Ok(w)
}

/// Registers the v1 OOM notification on a cgroup directory.
pub(crate) fn arm_v1_oom(dir: &Path, cgroup: &str) -> Result<EventfdWatch, String> {
    let (efd, watched) = register_v1(dir, "memory.oom_control", None)?;
    EventfdWatch::new(efd, watched, dir, cgroup, V1Notification::Oom)
}

fn read_u64_file(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Reads a cgroup file through an fd we hold open (from offset 0, as the kernel regenerates
/// the text on every read).
fn pread_text(fd: &OwnedFd) -> Option<String> {
    let mut buf = [0u8; 512];
    let n = rustix::io::pread(fd, &mut buf, 0).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// The `oom_kill` count of a `memory.oom_control` text.
fn oom_kills(text: Option<String>) -> u64 {
    text.and_then(|t| parse_counters(&t).ok())
        .and_then(|c| c.get("oom_kill").copied())
        .unwrap_or(0)
}

/// A v1 usage threshold being registered on a blocking thread. Each registration waits for
/// an RCU grace period in the kernel (10-30 ms under load), and the sources share the reactor
/// loop's one runtime thread: made there, it held the loop for that long. Awaited, it gives
/// the new eventfd (registered with the runtime) and the usage file it watches.
pub(crate) struct V1Registration {
    bytes: u64,
    dir: PathBuf,
    task: tokio::task::JoinHandle<Result<(OwnedFd, OwnedFd), String>>,
}

impl V1Registration {
    /// Starts registering a threshold at `bytes` on `dir`'s `memory.usage_in_bytes`.
    pub(crate) fn start(dir: &Path, bytes: u64) -> V1Registration {
        let at = dir.to_path_buf();
        V1Registration {
            bytes,
            dir: dir.to_path_buf(),
            task: tokio::task::spawn_blocking(move || {
                register_v1(&at, "memory.usage_in_bytes", Some(bytes))
            }),
        }
    }

    /// The level being registered.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The cgroup directory it is registered on.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl std::future::Future for V1Registration {
    type Output = Result<(AsyncFd<OwnedFd>, OwnedFd), String>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.task).poll(cx).map(|joined| {
            let (efd, watched) = joined
                .map_err(|e| format!("the registering thread failed: {e}"))
                .and_then(|r| r)?;
            let efd = super::register_fd(efd, tokio::io::Interest::READABLE)
                .map_err(|e| format!("cannot register eventfd: {e}"))?;
            Ok((efd, watched))
        })
    }
}

impl std::fmt::Debug for V1Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("V1Registration")
            .field("bytes", &self.bytes)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// Waits for the registration in flight and gives its level with what it gave; never
/// returns when there is none.
async fn landed(
    moving: &mut Option<V1Registration>,
) -> (u64, Result<(AsyncFd<OwnedFd>, OwnedFd), String>) {
    match moving {
        Some(r) => (r.bytes(), r.await),
        None => std::future::pending().await,
    }
}

impl EventfdWatch {
    fn new(
        efd: OwnedFd,
        watched: OwnedFd,
        dir: &Path,
        cgroup: &str,
        what: V1Notification,
    ) -> Result<EventfdWatch, String> {
        let eventfd = super::register_fd(efd, tokio::io::Interest::READABLE)
            .map_err(|e| format!("cannot register eventfd: {e}"))?;
        Ok(EventfdWatch {
            eventfd,
            watched,
            dir: dir.to_path_buf(),
            cgroup: cgroup.to_string(),
            what,
            moves: None,
        })
    }

    /// Takes the threshold registered at `bytes` (with its new eventfd) in place of the old
    /// one, whose eventfd is dropped (the kernel removes an event whose eventfd is closed).
    fn rearmed(&mut self, bytes: u64, efd: AsyncFd<OwnedFd>, watched: OwnedFd) {
        self.eventfd = efd;
        self.watched = watched;
        self.what = V1Notification::Threshold(bytes);
    }

    /// Waits for the threshold to move; never returns for a watch that cannot move.
    async fn moved(moves: &mut Option<watch::Receiver<Level>>) -> Option<u64> {
        match moves {
            Some(rx) => match rx.changed().await {
                Ok(()) => Some(rx.borrow_and_update().usage_bytes),
                Err(_) => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }

    /// What this watch is, for the attach report.
    pub(crate) fn describe(&self) -> String {
        match self.what {
            V1Notification::Threshold(bytes) => format!(
                "v1 threshold {} on {}/memory.usage_in_bytes",
                crate::human::bytes(i128::from(bytes)),
                self.dir.display()
            ),
            V1Notification::Oom => {
                format!(
                    "v1 OOM notification on {}/memory.oom_control",
                    self.dir.display()
                )
            }
        }
    }

    /// Sends one event per eventfd wake-up until the receiver is gone or the cgroup is
    /// removed (the kernel signals the eventfd on removal too).
    pub(crate) async fn run(mut self, tx: mpsc::Sender<PressureEvent>) {
        let mut kills_seen = oom_kills(pread_text(&self.watched));
        let mut moves = self.moves.take();
        // A registration runs on a blocking thread ([`V1Registration`]), with the old
        // threshold still armed (and read here) until the new one is in place. Moves that
        // come meanwhile wait in the watch channel; the latest is taken after.
        let mut moving: Option<V1Registration> = None;
        loop {
            let mut guard = tokio::select! {
                ready = self.eventfd.readable() => match ready {
                    Ok(guard) => guard,
                    Err(e) => {
                        tracing::warn!(cgroup = %self.cgroup, error = %e, "memcg eventfd wait failed; watch stops");
                        return;
                    }
                },
                Some(bytes) = Self::moved(&mut moves), if moving.is_none() => {
                    let V1Notification::Threshold(registered) = self.what else {
                        continue;
                    };
                    if !v1_moves(registered, bytes) {
                        continue;
                    }
                    moving = Some(V1Registration::start(&self.dir, bytes));
                    continue;
                }
                (bytes, done) = landed(&mut moving) => {
                    moving = None;
                    match done {
                        Ok((efd, watched)) => self.rearmed(bytes, efd, watched),
                        Err(e) => tracing::warn!(cgroup = %self.cgroup, error = %e, "memcg threshold not moved; the old one stays"),
                    }
                    continue;
                }
            };
            let at_ns = monotonic_ns();
            let mut counter = [0u8; 8];
            match guard.try_io(|fd| {
                rustix::io::read(fd.get_ref(), &mut counter).map_err(std::io::Error::from)
            }) {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(cgroup = %self.cgroup, error = %e, "memcg eventfd read failed; watch stops");
                    return;
                }
                Err(_would_block) => continue,
            }
            if !self.dir.is_dir() {
                tracing::info!(cgroup = %self.cgroup, "cgroup removed; its memcg watch stops");
                return;
            }
            let kind = match self.what {
                V1Notification::Threshold(bytes) => Kind::ThresholdCrossed {
                    threshold_bytes: Some(bytes),
                    usage_bytes: pread_text(&self.watched).and_then(|t| t.trim().parse().ok()),
                    killed: None,
                },
                V1Notification::Oom => {
                    let kills = oom_kills(pread_text(&self.watched));
                    let killed = kills > kills_seen;
                    kills_seen = kills;
                    if killed {
                        Kind::OomKill {
                            pid: None,
                            comm: None,
                            rss_bytes: None,
                            oom_score_adj: None,
                        }
                    } else {
                        Kind::MemcgEvent {
                            item: "oom".to_string(),
                            count: u64::from_ne_bytes(counter),
                        }
                    }
                }
            };
            let event = PressureEvent {
                at_ns,
                woke_ns: Some(at_ns),
                source: Source::MemcgThreshold,
                cgroup: Some(self.cgroup.clone()),
                kind,
            };
            if tx.send(event).await.is_err() {
                return;
            }
        }
    }
}

/// A v2 `memory.events` file watched with inotify.
pub(crate) struct EventsWatch {
    inotify: AsyncFd<OwnedFd>,
    events_file: PathBuf,
    current_file: PathBuf,
    cgroup: String,
    threshold_bytes: Option<u64>,
    /// Where the threshold should be, read at every change.
    moves: Option<watch::Receiver<Level>>,
    last: EventCounters,
}

/// Watches `memory.events` in `dir` (a v2 cgroup directory) for changes.
pub(crate) fn arm_v2_events(
    dir: &Path,
    cgroup: &str,
    threshold_bytes: Option<u64>,
    moves: Option<watch::Receiver<Level>>,
) -> Result<EventsWatch, String> {
    let events_file = dir.join("memory.events");
    let text = std::fs::read_to_string(&events_file).map_err(|e| {
        format!(
            "cannot read {}: {e} (no v2 memory controller here?)",
            events_file.display()
        )
    })?;
    let last = parse_counters(&text).map_err(|e| format!("{}: {e}", events_file.display()))?;
    let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)
        .map_err(|e| format!("inotify_init: {e}"))?;
    inotify::add_watch(&fd, &events_file, inotify::WatchFlags::MODIFY)
        .map_err(|e| format!("inotify watch on {}: {e}", events_file.display()))?;
    let inotify = super::register_fd(fd, tokio::io::Interest::READABLE)
        .map_err(|e| format!("cannot register inotify fd: {e}"))?;
    Ok(EventsWatch {
        inotify,
        current_file: dir.join("memory.current"),
        events_file,
        cgroup: cgroup.to_string(),
        threshold_bytes,
        moves,
        last,
    })
}

impl EventsWatch {
    /// What this watch is, for the attach report.
    pub(crate) fn describe(&self) -> String {
        match self.threshold_bytes {
            Some(bytes) => format!(
                "inotify on {} (threshold {bytes} bytes checked on change)",
                self.events_file.display()
            ),
            None => format!("inotify on {}", self.events_file.display()),
        }
    }

    /// Sends the counter deltas each time `memory.events` changes, until the receiver is gone
    /// or the file is removed.
    pub(crate) async fn run(mut self, tx: mpsc::Sender<PressureEvent>) {
        let mut buf = [MaybeUninit::<u8>::uninit(); 1024];
        loop {
            let mut guard = match self.inotify.readable().await {
                Ok(guard) => guard,
                Err(e) => {
                    tracing::warn!(cgroup = %self.cgroup, error = %e, "inotify wait failed; watch stops");
                    return;
                }
            };
            let at_ns = monotonic_ns();
            // Drain every queued inotify event; note whether the watch was removed.
            let mut gone = false;
            let mut any = false;
            let drained = guard.try_io(|fd| {
                let mut reader = inotify::Reader::new(fd.get_ref(), &mut buf);
                loop {
                    match reader.next() {
                        Ok(ev) => {
                            any = true;
                            if ev.events().contains(inotify::ReadFlags::IGNORED) {
                                gone = true;
                            }
                        }
                        Err(Errno::AGAIN) if any => return Ok(()),
                        Err(e) => return Err(std::io::Error::from(e)),
                    }
                }
            });
            match drained {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(cgroup = %self.cgroup, error = %e, "inotify read failed; watch stops");
                    return;
                }
                Err(_would_block) => continue,
            }
            let now = match std::fs::read_to_string(&self.events_file)
                .map_err(|e| e.to_string())
                .and_then(|t| parse_counters(&t))
            {
                Ok(now) => now,
                Err(e) => {
                    tracing::info!(cgroup = %self.cgroup, reason = %e, "memory.events unreadable (cgroup removed?); watch stops");
                    return;
                }
            };
            let mut kinds = events_delta(&self.last, &now);
            self.last = now;
            if let Some(rx) = &self.moves {
                self.threshold_bytes = Some(rx.borrow().usage_bytes);
            }
            if let Some(bytes) = self.threshold_bytes {
                if let Some(usage) = read_u64_file(&self.current_file) {
                    if usage >= bytes {
                        kinds.push(Kind::ThresholdCrossed {
                            threshold_bytes: Some(bytes),
                            usage_bytes: Some(usage),
                            killed: None,
                        });
                    }
                }
            }
            for kind in kinds {
                let event = PressureEvent {
                    at_ns,
                    woke_ns: Some(at_ns),
                    source: Source::MemcgThreshold,
                    cgroup: Some(self.cgroup.clone()),
                    kind,
                };
                if tx.send(event).await.is_err() {
                    return;
                }
            }
            if gone {
                tracing::info!(cgroup = %self.cgroup, "memory.events removed; watch stops");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_level_is_the_first_usage_past_the_working_set_base() {
        let base = 384 << 20;
        // No page cache: usage must pass the base itself.
        assert_eq!(working_set_level(base, 0), base + 1);
        // 300 KiB of inactive page cache: 300 KiB later, a page's precision kept.
        assert_eq!(working_set_level(base, 300 << 10), base + (300 << 10) + 1);
        assert_eq!(working_set_level(u64::MAX, 1), u64::MAX, "no overflow");
    }

    #[test]
    fn v1_registrations_move_only_by_a_step() {
        let at = 384 << 20;
        assert!(
            !v1_moves(at, at + (300 << 10)),
            "a page cache's drift stays"
        );
        assert!(!v1_moves(at, at - (1 << 20) + 1));
        assert!(v1_moves(at, at + (1 << 20)));
        assert!(v1_moves(at, at - (1 << 20)));
    }

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

    #[test]
    fn parses_memory_events() {
        let c =
            parse_counters("low 0\nhigh 12\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n").unwrap();
        assert_eq!(c["high"], 12);
        assert_eq!(c["oom_kill"], 1);
        assert!(parse_counters("high twelve\n").is_err());
        assert!(parse_counters("high 1 2\n").is_err());
    }

    #[test]
    fn parses_v1_oom_control() {
        let c = parse_counters("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n").unwrap();
        assert_eq!(c["oom_kill"], 4);
    }

    #[test]
    fn delta_names_what_moved() {
        let before = parse_counters("low 0\nhigh 10\nmax 0\noom 0\noom_kill 0\n").unwrap();
        let now = parse_counters("low 0\nhigh 15\nmax 2\noom 1\noom_kill 1\n").unwrap();
        let kinds = events_delta(&before, &now);
        assert_eq!(
            kinds,
            vec![
                Kind::OomKill {
                    pid: None,
                    comm: None,
                    rss_bytes: None,
                    oom_score_adj: None,
                },
                Kind::MemcgEvent {
                    item: "high".into(),
                    count: 5
                },
                Kind::MemcgEvent {
                    item: "max".into(),
                    count: 2
                },
                Kind::MemcgEvent {
                    item: "oom".into(),
                    count: 1
                },
            ]
        );
        assert!(events_delta(&now, &now).is_empty());
    }

    #[test]
    fn delta_after_reset_counts_from_zero() {
        let before = parse_counters("high 10\n").unwrap();
        let now = parse_counters("high 3\n").unwrap();
        assert_eq!(
            events_delta(&before, &now),
            vec![Kind::MemcgEvent {
                item: "high".into(),
                count: 3
            }]
        );
    }

    #[test]
    fn node_threshold_from_quantity_or_percent() {
        let gib = 1u64 << 30;
        assert_eq!(
            node_threshold(8 * gib, "100Mi").unwrap(),
            8 * gib - (100 << 20)
        );
        assert_eq!(node_threshold(1000, "10%").unwrap(), 900);
        assert_eq!(node_threshold(50, "1Ki").unwrap(), 0);
        assert!(node_threshold(1000, "12Qi").is_err());
        assert!(node_threshold(1000, "150%").is_err());
        assert!(node_threshold(1000, "-1").is_err());
    }

    #[test]
    fn configured_capacity_wins() {
        assert_eq!(memory_capacity("2Gi").unwrap(), 2 << 30);
        assert!(memory_capacity("lots").is_err());
    }
}
