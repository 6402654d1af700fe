//! The cgroup writer against the real cgroup v1 hierarchies of this kernel, under a cgroup
//! root unique to each test.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns: a failed setup should panic with its backtrace"
)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reactor::act::cgroups::{CgroupError, CgroupManager, CgroupPath, Resources};
use reactor_tests::cgroup_root::{TestCgroupRoot, MOUNT_ROOT};
use reactor_tests::{is_root, memhog_bin, require};

fn ready() -> bool {
    require(is_root(), "root, to create cgroups")
        && require(
            Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists()
                && Path::new("/sys/fs/cgroup/cpu/cpu.shares").exists(),
            "cgroup v1 memory and cpu hierarchies under /sys/fs/cgroup",
        )
}

fn manager(root: &TestCgroupRoot) -> CgroupManager {
    let m = CgroupManager::v1(
        Path::new(MOUNT_ROOT),
        &CgroupPath::parse(&root.name).unwrap(),
    )
    .unwrap();
    assert!(matches!(m, CgroupManager::V1(_)));
    m
}

fn real(root: &TestCgroupRoot, controller: &str, cgroup: &str, file: &str) -> String {
    let path = Path::new(MOUNT_ROOT)
        .join(controller)
        .join(&root.name)
        .join(cgroup)
        .join(file);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

/// Starts `cmd` inside `cgroup` (it joins before exec, so its memory is charged there).
fn spawn_in(m: &CgroupManager, cgroup: &CgroupPath, cmd: &mut Command) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let files = m.procs_files(cgroup);
    // SAFETY: the closure only writes small files; the test holds no locks at spawn.
    unsafe {
        cmd.pre_exec(move || {
            for f in &files {
                std::fs::write(f, "0")?;
            }
            Ok(())
        });
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// Kills and reaps `child` (by its pid), then waits up to 5 s for `cgroup` to show empty.
fn kill_and_wait_empty(m: &CgroupManager, cgroup: &CgroupPath, mut child: std::process::Child) {
    child.kill().unwrap();
    child.wait().unwrap();
    let start = Instant::now();
    while !m.is_empty(cgroup).unwrap() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn builds_the_kubelet_tree_writes_values_and_removes_it() {
    if !ready() {
        return;
    }
    let root = TestCgroupRoot::v1("cgv1-tree").unwrap();
    let m = manager(&root);
    let burstable_pod = CgroupPath::pod(Some("burstable"), "11111111-aaaa").unwrap();
    let container = burstable_pod.join("web").unwrap();
    let guaranteed_pod = CgroupPath::pod(None, "22222222-bbbb").unwrap();
    for cg in [
        CgroupPath::kubepods(),
        CgroupPath::parse("kubepods/burstable").unwrap(),
        CgroupPath::parse("kubepods/besteffort").unwrap(),
        container.clone(),
        guaranteed_pod.clone(),
    ] {
        m.create(&cg).unwrap();
        assert!(m.exists(&cg), "{cg}");
    }
    for c in ["cpu", "cpuacct", "cpuset", "memory", "pids"] {
        let dir = Path::new(MOUNT_ROOT)
            .join(c)
            .join(&root.name)
            .join("kubepods/burstable/pod11111111-aaaa/web");
        assert!(dir.is_dir(), "{}", dir.display());
    }
    // The new cpuset cgroups were seeded, or no process could join them.
    assert_eq!(
        real(
            &root,
            "cpuset",
            "kubepods/burstable/pod11111111-aaaa/web",
            "cpuset.mems"
        ),
        real(&root, "cpuset", "", "cpuset.mems")
    );

    let values = Resources {
        cpu_shares: Some(1536),
        cpu_quota_us: Some(150_000),
        cpu_period_us: Some(100_000),
        memory_limit_bytes: Some(256 << 20),
        pids_max: Some(64),
        memory_oom_group: None,
        ..Default::default()
    };
    m.apply(&guaranteed_pod, &values).unwrap();
    let g = "kubepods/pod22222222-bbbb";
    assert_eq!(real(&root, "cpu", g, "cpu.shares"), "1536");
    assert_eq!(real(&root, "cpu", g, "cpu.cfs_quota_us"), "150000");
    assert_eq!(real(&root, "cpu", g, "cpu.cfs_period_us"), "100000");
    assert_eq!(
        real(&root, "memory", g, "memory.limit_in_bytes"),
        "268435456"
    );
    assert_eq!(real(&root, "pids", g, "pids.max"), "64");
    // Back to unlimited.
    m.apply(
        &guaranteed_pod,
        &Resources {
            cpu_quota_us: Some(-1),
            memory_limit_bytes: Some(-1),
            pids_max: Some(-1),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(real(&root, "cpu", g, "cpu.cfs_quota_us"), "-1");
    assert_eq!(real(&root, "pids", g, "pids.max"), "max");
    assert!(
        real(&root, "memory", g, "memory.limit_in_bytes")
            .parse::<u64>()
            .unwrap()
            > 1 << 60
    );

    // A value the kernel refuses names the file and the value.
    let err = m
        .apply(
            &guaranteed_pod,
            &Resources {
                cpu_shares: Some(0),
                cpu_period_us: Some(10),
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cpu.cfs_period_us") && err.contains("\"10\""),
        "{err}"
    );

    // Move a process in: it shows in every hierarchy and in procs().
    let mut child = spawn_in(&m, &container, Command::new("sleep").arg("60"));
    assert_eq!(m.procs(&container).unwrap(), vec![child.id()]);
    assert!(!m.is_empty(&CgroupPath::kubepods()).unwrap());
    let own = std::fs::read_to_string(format!("/proc/{}/cgroup", child.id())).unwrap();
    for c in ["memory", "cpu", "cpuset", "pids"] {
        let line = own
            .lines()
            .find(|l| l.split(':').nth(1) == Some(c))
            .unwrap();
        assert!(
            line.ends_with(&format!(
                "{}/kubepods/burstable/pod11111111-aaaa/web",
                root.name
            )),
            "{line}"
        );
    }
    assert!(m.memory_usage(&container).unwrap().usage_bytes > 0);
    // add_process moves a running process too.
    let mut other = Command::new("sleep")
        .arg("60")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    m.add_process(&guaranteed_pod, other.id()).unwrap();
    assert_eq!(m.procs(&guaranteed_pod).unwrap(), vec![other.id()]);
    other.kill().unwrap();
    other.wait().unwrap();
    assert_eq!(m.oom_kills(&container).unwrap(), 0);

    // Removal kills nothing: with the process inside it gives up and names the pid.
    match m.remove(&CgroupPath::kubepods(), Duration::from_millis(100)) {
        Err(CgroupError::Busy { pids, path, .. }) => {
            assert_eq!(pids, vec![child.id()], "{}", path.display());
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    assert!(child.try_wait().unwrap().is_none(), "removal must not kill");
    kill_and_wait_empty(&m, &CgroupPath::kubepods(), child);
    m.remove(&CgroupPath::kubepods(), Duration::from_secs(2))
        .unwrap();
    assert!(!m.exists(&CgroupPath::kubepods()));
    assert_eq!(root.leftovers(), Vec::<std::path::PathBuf>::new());
    // Removing again is fine.
    m.remove(&CgroupPath::kubepods(), Duration::from_millis(10))
        .unwrap();
}

#[test]
fn lowering_memory_below_usage_is_reported_as_ebusy() {
    if !ready() {
        return;
    }
    let root = TestCgroupRoot::v1("cgv1-ebusy").unwrap();
    let m = manager(&root);
    let pod = CgroupPath::pod(Some("burstable"), "33333333-cccc").unwrap();
    m.create(&pod).unwrap();
    m.apply(
        &pod,
        &Resources {
            memory_limit_bytes: Some(128 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    let mut hog = spawn_in(&m, &pod, Command::new(memhog_bin()).args(["32", "0", "60"]));
    // memhog touches its pages right away; wait until they are charged here.
    let start = Instant::now();
    while m.memory_usage(&pod).unwrap().usage_bytes < 30 << 20 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "memhog never reached 30 MiB"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // No swap here, anonymous memory cannot be reclaimed: the kernel refuses with EBUSY.
    let err = m
        .apply(
            &pod,
            &Resources {
                memory_limit_bytes: Some(8 << 20),
                ..Default::default()
            },
        )
        .unwrap_err();
    match &err {
        CgroupError::LimitBelowUsage { usage, value, path } => {
            assert!(*usage >= 30 << 20, "usage {usage}");
            assert_eq!(value, "8388608");
            assert!(path.ends_with("memory.limit_in_bytes"));
        }
        other => panic!("expected LimitBelowUsage, got {other}"),
    }
    assert!(err.to_string().contains("EBUSY"), "{err}");
    assert_eq!(
        real(
            &root,
            "memory",
            "kubepods/burstable/pod33333333-cccc",
            "memory.limit_in_bytes"
        ),
        "134217728"
    );
    hog.kill().unwrap();
    hog.wait().unwrap();
    m.remove(&CgroupPath::kubepods(), Duration::from_secs(2))
        .unwrap();
    assert!(root.leftovers().is_empty());
}

#[test]
fn qos_tier_below_usage_is_clamped_to_usage_like_the_kubelet() {
    if !ready() {
        return;
    }
    let root = TestCgroupRoot::v1("cgv1-qos").unwrap();
    let m = manager(&root);
    m.ensure_pod_tree(&Resources {
        cpu_shares: Some(2048),
        memory_limit_bytes: Some(1 << 30),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        real(&root, "memory", "kubepods", "memory.limit_in_bytes"),
        "1073741824"
    );
    assert!(m.exists(&CgroupPath::parse("kubepods/burstable").unwrap()));
    let pod = CgroupPath::pod(Some("besteffort"), "55555555-eeee").unwrap();
    m.create_pod_cgroup(
        &pod,
        &Resources {
            cpu_shares: Some(2),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        real(
            &root,
            "cpu",
            "kubepods/besteffort/pod55555555-eeee",
            "cpu.shares"
        ),
        "2"
    );
    let container = pod.join("hog").unwrap();
    m.create(&container).unwrap();
    let mut hog = spawn_in(
        &m,
        &container,
        Command::new(memhog_bin()).args(["24", "0", "60"]),
    );
    let start = Instant::now();
    while m.memory_usage(&container).unwrap().usage_bytes < 24 << 20 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "memhog never reached 24 MiB"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let limit = |b: i64| Resources {
        memory_limit_bytes: Some(b),
        ..Default::default()
    };
    // A guaranteed pod reserving memory squeezes besteffort to 8 MiB: below its usage.
    let clamped = m
        .update_qos_tiers(&limit(512 << 20), &limit(8 << 20))
        .unwrap();
    assert_eq!(clamped.len(), 1, "{clamped:?}");
    let c = &clamped[0];
    assert_eq!(c.cgroup.to_string(), "/kubepods/besteffort");
    assert_eq!(c.wanted, 8 << 20);
    // The limit lands on the usage at the moment of writing; v1 usage moves by per-cpu charge
    // batches, so it can sit a little under what memhog touched.
    assert!(c.set > c.wanted && c.set >= 20 << 20, "{c:?}");
    let written: i64 = real(
        &root,
        "memory",
        "kubepods/besteffort",
        "memory.limit_in_bytes",
    )
    .parse()
    .unwrap();
    assert_eq!(written, c.set);
    assert_eq!(
        real(
            &root,
            "memory",
            "kubepods/burstable",
            "memory.limit_in_bytes"
        ),
        "536870912"
    );
    assert!(
        hog.try_wait().unwrap().is_none(),
        "clamping to usage must not OOM-kill"
    );
    hog.kill().unwrap();
    hog.wait().unwrap();
    m.remove_pod_cgroup(&pod, Duration::from_secs(2)).unwrap();
    // With the pod gone the tier gets its memory back.
    assert!(m
        .update_qos_tiers(&limit(-1), &limit(-1))
        .unwrap()
        .is_empty());
    m.remove(&CgroupPath::kubepods(), Duration::from_secs(2))
        .unwrap();
    assert!(root.leftovers().is_empty());
}

/// Removal from async code retries on a blocking thread: while a cgroup stays busy, the
/// runtime that asked goes on running its other tasks (a one-thread runtime, so a removal
/// that slept on it would hold every task up until it gave up).
#[test]
fn removal_from_async_code_leaves_the_runtime_running() {
    if !ready() {
        return;
    }
    let root = TestCgroupRoot::v1("cgv1-rmasync").unwrap();
    let m = manager(&root);
    let pod = CgroupPath::pod(Some("besteffort"), "44444444-dddd").unwrap();
    m.create(&pod).unwrap();
    let child = spawn_in(&m, &pod, Command::new("sleep").arg("60"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (removed, ticks) = rt.block_on(async {
        let ticks = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = std::sync::Arc::clone(&ticks);
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let removed = m.remove_off_runtime(&pod, Duration::from_millis(500)).await;
        ticker.abort();
        (removed, ticks.load(std::sync::atomic::Ordering::Relaxed))
    });
    match removed {
        Err(CgroupError::Busy { pids, .. }) => assert_eq!(pids, vec![child.id()]),
        other => panic!("expected Busy, got {other:?}"),
    }
    // About 50 in the 500 ms; a removal that slept on the runtime's one thread leaves 0.
    assert!(
        ticks >= 5,
        "the runtime ran {ticks} ticks of 10 ms during the removal"
    );
    kill_and_wait_empty(&m, &pod, child);
    rt.block_on(m.remove_off_runtime(&CgroupPath::kubepods(), Duration::from_secs(2)))
        .unwrap();
    assert_eq!(root.leftovers(), Vec::<std::path::PathBuf>::new());
}
