//! The v1 writer through [`CgroupManager`], on a temp dir laid out like a v1 mount.

use super::super::CgroupManager;
use super::*;

/// A temp dir laid out like a v1 mount with the files the kernel would create.
fn fixture() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for c in ["cpu", "cpuacct", "cpuset", "memory", "pids"] {
        std::fs::create_dir_all(tmp.path().join(c).join("agent")).unwrap();
    }
    std::fs::write(tmp.path().join("cpuset/agent/cpuset.cpus"), "0-3\n").unwrap();
    std::fs::write(tmp.path().join("cpuset/agent/cpuset.mems"), "0\n").unwrap();
    tmp
}

fn set_fixture(tmp: &Path, controller: &str, cgroup: &str, file: &str, value: &str) {
    let dir = tmp.join(controller).join("agent").join(cgroup);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(file), value).unwrap();
}

fn read(tmp: &Path, controller: &str, cgroup: &str, file: &str) -> String {
    std::fs::read_to_string(tmp.join(controller).join("agent").join(cgroup).join(file)).unwrap()
}

#[test]
fn apply_writes_the_kubelet_files() {
    let tmp = fixture();
    let cg = "kubepods/burstable/podu1";
    for (c, f) in [
        ("cpu", "cpu.shares"),
        ("cpu", "cpu.cfs_quota_us"),
        ("cpu", "cpu.cfs_period_us"),
        ("memory", "memory.limit_in_bytes"),
        ("pids", "pids.max"),
    ] {
        set_fixture(tmp.path(), c, cg, f, "0\n");
    }
    let m = CgroupManager::v1(tmp.path(), &CgroupPath::parse("agent").unwrap()).unwrap();
    let pod = CgroupPath::parse(cg).unwrap();
    m.apply(
        &pod,
        &Resources {
            cpu_shares: Some(512),
            cpu_quota_us: Some(50_000),
            cpu_period_us: Some(100_000),
            memory_limit_bytes: Some(256 << 20),
            pids_max: Some(-1),
            memory_oom_group: None,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(read(tmp.path(), "cpu", cg, "cpu.shares"), "512");
    assert_eq!(read(tmp.path(), "cpu", cg, "cpu.cfs_quota_us"), "50000");
    assert_eq!(read(tmp.path(), "cpu", cg, "cpu.cfs_period_us"), "100000");
    assert_eq!(
        read(tmp.path(), "memory", cg, "memory.limit_in_bytes"),
        "268435456"
    );
    assert_eq!(read(tmp.path(), "pids", cg, "pids.max"), "max");
    assert_eq!(m.read_file(&pod, "cpu.shares").unwrap(), "512");
    // Unset values leave files alone.
    m.apply(
        &pod,
        &Resources {
            cpu_shares: Some(2),
            ..Resources::default()
        },
    )
    .unwrap();
    assert_eq!(
        read(tmp.path(), "memory", cg, "memory.limit_in_bytes"),
        "268435456"
    );
}

#[test]
fn a_missing_file_is_never_created_and_the_error_names_path_and_value() {
    let tmp = fixture();
    let m = CgroupManager::v1(tmp.path(), &CgroupPath::parse("agent").unwrap()).unwrap();
    let cg = CgroupPath::parse("kubepods").unwrap();
    m.create(&cg).unwrap();
    let err = m
        .apply(
            &cg,
            &Resources {
                memory_limit_bytes: Some(4096),
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("memory/agent/kubepods/memory.limit_in_bytes"),
        "{err}"
    );
    assert!(err.contains("\"4096\""), "{err}");
    assert!(!tmp
        .path()
        .join("memory/agent/kubepods/memory.limit_in_bytes")
        .exists());
}

#[test]
fn create_makes_every_hierarchy_and_seeds_cpuset() {
    let tmp = fixture();
    // What the kernel creates in a new cpuset cgroup: empty cpus/mems.
    set_fixture(tmp.path(), "cpuset", "kubepods", "cpuset.cpus", "\n");
    set_fixture(tmp.path(), "cpuset", "kubepods", "cpuset.mems", "\n");
    let m = CgroupManager::v1(tmp.path(), &CgroupPath::parse("agent").unwrap()).unwrap();
    let CgroupManager::V1(v1) = &m else {
        panic!("v1")
    };
    assert_eq!(v1.hierarchies().len(), 5);
    let cg = CgroupPath::parse("kubepods/besteffort").unwrap();
    m.create(&cg).unwrap();
    for c in ["cpu", "cpuacct", "cpuset", "memory", "pids"] {
        assert!(
            tmp.path()
                .join(c)
                .join("agent/kubepods/besteffort")
                .is_dir(),
            "{c}"
        );
    }
    assert_eq!(read(tmp.path(), "cpuset", "kubepods", "cpuset.cpus"), "0-3");
    assert_eq!(read(tmp.path(), "cpuset", "kubepods", "cpuset.mems"), "0");
    assert!(m.exists(&cg));
    assert!(!m.exists(&cg.join("podx").unwrap()));
    // Creating again is fine.
    m.create(&cg).unwrap();
}

#[test]
fn colocated_controllers_are_one_hierarchy() {
    let tmp = tempfile::tempdir().unwrap();
    for c in ["cpu,cpuacct", "cpuset", "memory"] {
        std::fs::create_dir_all(tmp.path().join(c)).unwrap();
    }
    std::os::unix::fs::symlink("cpu,cpuacct", tmp.path().join("cpu")).unwrap();
    std::os::unix::fs::symlink("cpu,cpuacct", tmp.path().join("cpuacct")).unwrap();
    let m = CgroupManager::v1(tmp.path(), &CgroupPath::root()).unwrap();
    let CgroupManager::V1(v1) = &m else { panic!() };
    assert_eq!(v1.hierarchies().len(), 3);
    assert_eq!(v1.hierarchies()[0].controllers, ["cpu", "cpuacct"]);
    let missing = tempfile::tempdir().unwrap();
    let err = CgroupManager::v1(missing.path(), &CgroupPath::root()).unwrap_err();
    assert!(
        err.to_string().contains("controller cpu is not mounted"),
        "{err}"
    );
}

#[test]
fn usage_oom_kills_and_procs_read_back() {
    let tmp = fixture();
    let cg = "kubepods/podu2";
    set_fixture(
        tmp.path(),
        "memory",
        cg,
        "memory.usage_in_bytes",
        "1000000\n",
    );
    set_fixture(
        tmp.path(),
        "memory",
        cg,
        "memory.stat",
        "cache 5\ninactive_file 1\ntotal_inactive_file 300000\n",
    );
    set_fixture(
        tmp.path(),
        "memory",
        cg,
        "memory.oom_control",
        "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
    );
    for c in ["cpu", "cpuacct", "cpuset", "memory", "pids"] {
        set_fixture(tmp.path(), c, cg, "cgroup.procs", "");
    }
    set_fixture(tmp.path(), "memory", cg, "cgroup.procs", "12\n7\n");
    set_fixture(tmp.path(), "cpu", cg, "cgroup.procs", "7\n");
    let m = CgroupManager::v1(tmp.path(), &CgroupPath::parse("agent").unwrap()).unwrap();
    let pod = CgroupPath::parse(cg).unwrap();
    let usage = m.memory_usage(&pod).unwrap();
    assert_eq!(usage.working_set_bytes, 700_000);
    assert_eq!(m.oom_kills(&pod).unwrap(), 3);
    assert_eq!(m.procs(&pod).unwrap(), vec![7, 12]);
    assert!(!m.is_empty(&pod).unwrap());
    set_fixture(tmp.path(), "memory", cg, "cgroup.procs", "x\n");
    let err = m.procs(&pod).unwrap_err().to_string();
    assert!(
        err.contains("memory/agent/kubepods/podu2/cgroup.procs"),
        "{err}"
    );
}
