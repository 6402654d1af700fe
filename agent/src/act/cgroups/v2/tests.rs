//! The v2 writer through [`CgroupManager`], on a temp dir laid out like a v2 mount.

use super::super::CgroupManager;
use super::*;

fn set_fixture(tmp: &Path, cgroup: &str, file: &str, value: &str) {
    let dir = tmp.join(cgroup);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(file), value).unwrap();
}

/// A unified mount with the agent's delegated subtree `agent` offering cpu/memory/pids.
fn fixture() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    set_fixture(
        tmp.path(),
        "",
        "cgroup.controllers",
        "cpuset cpu io memory pids\n",
    );
    set_fixture(
        tmp.path(),
        "agent",
        "cgroup.controllers",
        "cpu memory pids\n",
    );
    set_fixture(tmp.path(), "agent", "cgroup.subtree_control", "\n");
    tmp
}

#[test]
fn missing_controller_file_is_reported_with_a_hint() {
    let tmp = fixture();
    set_fixture(tmp.path(), "agent/kubepods", "cgroup.procs", "");
    let m = CgroupManager::v2(tmp.path(), &CgroupPath::parse("agent").unwrap()).unwrap();
    let err = m
        .apply(
            &CgroupPath::kubepods(),
            &Resources {
                memory_limit_bytes: Some(1),
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("agent/kubepods/memory.max") && err.contains("controller not enabled"),
        "{err}"
    );
}

#[test]
fn memory_qos_files_are_written_and_a_missing_swap_file_is_left_out() {
    let tmp = fixture();
    let cg = "agent/kubepods/burstable/podu/c";
    for f in ["memory.min", "memory.high", "cpu.weight"] {
        set_fixture(tmp.path(), cg, f, "0\n");
    }
    let m = CgroupManager::v2(tmp.path(), &CgroupPath::parse("agent").unwrap()).unwrap();
    let c = CgroupPath::parse("kubepods/burstable/podu/c").unwrap();
    let values = Resources {
        cpu_shares: Some(2),
        memory_min: Some(128 << 20),
        memory_high: Some(255_012_864),
        memory_swap_max: Some(0),
        ..Default::default()
    };
    // No swap accounting: no memory.swap.max, and the rest is still written.
    m.apply(&c, &values).unwrap();
    let read = |f: &str| std::fs::read_to_string(tmp.path().join(cg).join(f)).unwrap();
    assert_eq!(read("memory.min"), "134217728");
    assert_eq!(read("memory.high"), "255012864");
    assert!(!tmp.path().join(cg).join("memory.swap.max").exists());
    assert!(!m.swap_controller_available());
    // With it, the file gets its value.
    set_fixture(tmp.path(), cg, "memory.swap.max", "max\n");
    set_fixture(tmp.path(), "agent/kubepods", "memory.swap.max", "max\n");
    m.apply(
        &c,
        &Resources {
            memory_swap_max: Some(134_217_728),
            ..values
        },
    )
    .unwrap();
    assert_eq!(read("memory.swap.max"), "134217728");
    assert!(m.swap_controller_available());
}

#[test]
fn not_a_unified_mount() {
    let tmp = tempfile::tempdir().unwrap();
    let err = CgroupManager::v2(tmp.path(), &CgroupPath::root())
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a unified"), "{err}");
}
