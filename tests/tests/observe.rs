//! The observe layer against the real kernel: a node modelled in a test cgroup (v1 memory)
//! with a pod whose container runs memhog, tmpfs mounts of known size for the filesystem
//! signals, and the pid signal checked against /proc.

use std::ffi::CString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use reactor::config::{Config, ConfigQuantity};
use reactor::decide::qos::QosClass;
use reactor::decide::quantity::Quantity;
use reactor::decide::signal::{FsLayout, Signal};
use reactor::decide::summary::Summary;
use reactor::observe::{ObserveSettings, Observer, PodCgroup};
use reactor_tests::{is_root, memhog_bin, require, TestCgroupTree};

const MIB: u64 = 1 << 20;

/// Kills and reaps the child on drop, by pid, so the cgroup can be removed.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cmd` inside the v1 memory cgroup directory `dir` (it joins before it execs, so all
/// its memory is charged there).
fn spawn_in(dir: &Path, cmd: &mut Command) -> ChildGuard {
    use std::os::unix::process::CommandExt;
    let procs = dir.join("cgroup.procs");
    // SAFETY: the closure only writes one file with std calls between fork and exec; the
    // test holds no locks the child could need.
    unsafe {
        cmd.pre_exec(move || std::fs::write(&procs, std::process::id().to_string()));
    }
    ChildGuard(cmd.spawn().expect("spawn in test cgroup"))
}

fn modelled_node(tree: &TestCgroupTree) -> Config {
    let mut config = Config {
        cgroup_root: tree.root.clone(),
        ..Default::default()
    };
    config.node.memory_capacity = "256Mi".into();
    config.system_reserved.insert(
        "memory".into(),
        ConfigQuantity(Quantity::parse("56Mi").expect("a quantity")),
    );
    config
}

#[test]
fn pod_working_set_and_allocatable_follow_a_memhog_in_the_container_cgroup() {
    if !require(is_root(), "root for cgroup v1 memory")
        || !require(
            Path::new("/sys/fs/cgroup/memory/memory.usage_in_bytes").exists(),
            "a v1 memory hierarchy at /sys/fs/cgroup/memory",
        )
        || !require(
            memhog_bin().exists(),
            "memhog built (cargo build --workspace --bins)",
        )
    {
        return;
    }
    let tree = TestCgroupTree::new("observe");
    let uid = "5d1c0a2e-observe";
    let pod_rel = format!("/kubepods/besteffort/pod{uid}");
    let container_rel = format!("{pod_rel}/app");
    tree.create(&container_rel, &["memory"]).unwrap();
    // The whole modelled node is capped so the hog can never touch the machine.
    std::fs::write(
        tree.path("memory", "").join("memory.limit_in_bytes"),
        (256 * MIB).to_string(),
    )
    .unwrap();
    let config = modelled_node(&tree);
    let scratch = tempfile::tempdir().unwrap();
    let mut settings = ObserveSettings::from_config(&config, None, None).unwrap();
    settings.nodefs = scratch.path().to_path_buf();
    settings.imagefs = scratch.path().to_path_buf();
    settings.containerfs = scratch.path().to_path_buf();
    let mut observer = Observer::new(settings).unwrap();
    assert_eq!(observer.memory_capacity(), 256 * MIB);

    let data = scratch.path().join("app-data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("written"), vec![1u8; 512 << 10]).unwrap();
    let mut pod = PodCgroup::under_kubepods(&tree.root, uid, QosClass::BestEffort, &["app"]);
    pod.containers[0].ephemeral_dir = Some(data);
    let pods = [pod];

    let mut summary = Summary::default();
    assert!(observer.observe_pods(&pods, &mut summary).is_empty());
    let before = summary.pods[0].working_set_bytes();
    assert!(before < 4 * MIB, "empty pod working set {before}");
    assert_eq!(summary.pods[0].process_count(), 0);

    let mut hog = spawn_in(
        &tree.path("memory", &container_rel),
        Command::new(memhog_bin())
            .args(["32", "0", "600"])
            .stdout(Stdio::piped()),
    );
    let mut line = String::new();
    BufReader::new(hog.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "allocated 32 MiB");

    let signals = observer.observe();
    assert!(signals.errors.is_empty(), "{:?}", signals.errors);
    assert!(observer.observe_pods(&pods, &mut summary).is_empty());
    let stats = &summary.pods[0];
    eprintln!(
        "observed: pod {:?}, allocatable {:?}, node {:?}",
        stats, signals.allocatable_memory, signals.memory
    );
    assert_eq!(stats.pod_ref.uid, uid);
    let pod_ws = stats.working_set_bytes();
    // 32 MiB of touched anonymous pages plus the hog's own pages and page tables.
    assert!(
        (32 * MIB..40 * MIB).contains(&pod_ws),
        "pod working set {} MiB",
        pod_ws / MIB
    );
    assert_eq!(stats.process_count(), 1);
    let app = &stats.containers[0];
    assert_eq!(app.name, "app");
    let app_ws = app.memory.and_then(|m| m.working_set_bytes).unwrap();
    assert!(app_ws <= pod_ws && app_ws >= 32 * MIB, "container {app_ws}");
    assert!(app.rootfs.and_then(|r| r.used_bytes).unwrap() >= 512 << 10);

    // allocatableMemory.available: (256Mi - 56Mi reserved) minus the kubepods working set.
    let alloc = signals.allocatable_memory.expect("kubepods exists");
    assert_eq!(alloc.capacity_bytes, 200 * MIB);
    assert!(
        (alloc.working_set_bytes >= 32 * MIB) && (alloc.available_bytes <= 168 * MIB),
        "{alloc:?}"
    );
    assert!(alloc.available_bytes >= 150 * MIB, "{alloc:?}");
    // memory.available on the modelled node: its cgroup holds only the pod.
    let node = signals.memory.unwrap();
    assert_eq!(node.capacity_bytes, 256 * MIB);
    assert!(
        (32 * MIB..48 * MIB).contains(&node.working_set_bytes),
        "{node:?}"
    );

    // The same figures reach decide's observations, on the monotonic clock.
    let obs = signals.observations();
    let m = obs.get(Signal::AllocatableMemoryAvailable).unwrap();
    assert_eq!(
        m.available,
        Quantity::from_units(alloc.available_bytes as i64)
    );
    assert!(m.at <= i128::from(reactor::sense::monotonic_ns()));

    // Once the hog is gone its anonymous memory leaves the pod's working set (the page cache
    // of its binary may stay charged).
    drop(hog);
    observer.observe_pods(&pods, &mut summary);
    let after = summary.pods[0].working_set_bytes();
    assert!(
        after + 30 * MIB <= pod_ws,
        "{after} after vs {pod_ws} during"
    );
    assert_eq!(summary.pods[0].process_count(), 0);
    drop(tree);
}

/// A tmpfs mounted on a temp dir, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(options: &str) -> Tmpfs {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = CString::new(options).expect("mount options");
        rustix::mount::mount(
            "tmpfs",
            dir.path(),
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            data.as_c_str(),
        )
        .expect("mount tmpfs");
        Tmpfs { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(self.dir.path(), rustix::mount::UnmountFlags::DETACH);
    }
}

#[test]
fn filesystem_signals_are_statvfs_of_the_configured_paths() {
    if !require(is_root(), "root to mount tmpfs") {
        return;
    }
    let nodefs = Tmpfs::mount("size=64m,nr_inodes=1000,mode=0700");
    let imagefs = Tmpfs::mount("size=32m,nr_inodes=500,mode=0700");
    let mut config = Config::default();
    config.node.nodefs_path = nodefs.path();
    config.node.imagefs_path = imagefs.path().to_string_lossy().into_owned();
    let mut observer = Observer::new(ObserveSettings::from_config(&config, None, None).unwrap())
        .expect("observer on the real machine");

    let before = observer.observe();
    let n = before.nodefs.unwrap();
    assert_eq!((n.capacity_bytes, n.inodes), (64 * MIB, 1000));
    assert_eq!(n.available_bytes, 64 * MIB);
    let i = before.imagefs.unwrap();
    assert_eq!((i.capacity_bytes, i.inodes), (32 * MIB, 500));
    // No runtime container filesystem: writable layers share the image filesystem.
    assert_eq!(before.containerfs, before.imagefs);
    assert_eq!(before.fs_layout(), Some(FsLayout::ImageFs));

    std::fs::write(nodefs.path().join("four-mib"), vec![7u8; 4 << 20]).unwrap();
    std::fs::create_dir(nodefs.path().join("d")).unwrap();
    let after = observer.observe();
    let n2 = after.nodefs.unwrap();
    assert_eq!(n.available_bytes - n2.available_bytes, 4 * MIB);
    assert_eq!(n.inodes_free - n2.inodes_free, 2);
    let obs = after.observations();
    let free = obs.get(Signal::NodeFsInodesFree).unwrap();
    assert_eq!(free.available, Quantity::from_units(n2.inodes_free as i64));
    assert_eq!(free.capacity, Some(Quantity::from_units(1000)));
    let avail = obs.get(Signal::ImageFsAvailable).unwrap();
    assert_eq!(avail.capacity, Some(Quantity::from_units(32 << 20)));
}

/// The task total after the slash in /proc/loadavg's fourth field.
fn loadavg_tasks() -> u64 {
    let text = std::fs::read_to_string("/proc/loadavg").expect("/proc/loadavg");
    let field = text.split_whitespace().nth(3).expect("a fourth field");
    let total = field.split_once('/').expect("running/total").1;
    total.parse().expect("a task count")
}

#[test]
fn pid_available_is_the_task_limit_minus_the_tasks_in_proc() {
    if !require(
        Path::new("/sys/fs/cgroup").exists(),
        "cgroupfs for the observer",
    ) {
        return;
    }
    let config = Config::default();
    let mut observer =
        match Observer::new(ObserveSettings::from_config(&config, None, None).unwrap()) {
            Ok(o) => o,
            Err(e) => panic!("observer on the real machine: {e}"),
        };
    let read = |p: &str| -> u64 { std::fs::read_to_string(p).unwrap().trim().parse().unwrap() };
    let limit = read("/proc/sys/kernel/pid_max").min(read("/proc/sys/kernel/threads-max"));
    let low = loadavg_tasks();
    let signals = observer.observe();
    let high = loadavg_tasks();
    let pids = signals.pids.unwrap();
    assert_eq!(pids.max, limit);
    // Other helpers start and stop processes meanwhile: allow some drift either way.
    let slack = 200;
    assert!(
        pids.running + slack >= low.min(high) && pids.running <= low.max(high) + slack,
        "{pids:?} vs /proc/loadavg {low}..{high}"
    );
    assert!(pids.available() > 0);
    let o = signals.observations();
    let p = o.get(Signal::PidAvailable).unwrap();
    assert_eq!(p.available, Quantity::from_units(pids.available()));
    assert_eq!(p.capacity, Some(Quantity::from_units(limit as i64)));
}
