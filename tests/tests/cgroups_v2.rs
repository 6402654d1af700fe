//! The cgroup writer against the real unified (v2) hierarchy of this kernel. Here it offers
//! no memory or cpu controller, so values are covered by the temp-dir cgroupfs unit tests;
//! this test covers what the kernel does have: the tree, processes, removal.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use reactor::act::cgroups::{CgroupError, CgroupManager, CgroupPath, Resources};
use reactor_tests::cgroup_root::{TestCgroupRoot, UNIFIED_ROOT};
use reactor_tests::{is_root, require};

#[test]
fn builds_the_tree_moves_a_process_and_removes_it() {
    if !require(is_root(), "root, to create cgroups")
        || !require(
            Path::new(UNIFIED_ROOT).join("cgroup.controllers").exists(),
            "a cgroup2 mount at /sys/fs/cgroup/unified",
        )
    {
        return;
    }
    let root = TestCgroupRoot::v2("cgv2-tree").unwrap();
    let m = CgroupManager::detect(
        Path::new(UNIFIED_ROOT),
        &CgroupPath::parse(&root.name).unwrap(),
    )
    .unwrap();
    assert!(matches!(m, CgroupManager::V2(_)));
    let container = CgroupPath::pod(Some("besteffort"), "44444444-dddd")
        .unwrap()
        .join("worker")
        .unwrap();
    m.create(&container).unwrap();
    assert!(m.exists(&container));
    assert!(Path::new(UNIFIED_ROOT)
        .join(&root.name)
        .join("kubepods/besteffort/pod44444444-dddd/worker/cgroup.procs")
        .exists());

    // Whatever controllers this root lacks, asking for their values names the file.
    let offered = m.read_file(&container, "cgroup.controllers").unwrap();
    if !offered.split_whitespace().any(|c| c == "memory") {
        let err = m
            .apply(
                &container,
                &Resources {
                    memory_limit_bytes: Some(1 << 20),
                    ..Default::default()
                },
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("worker/memory.max") && err.contains("controller not enabled"),
            "{err}"
        );
    }

    let mut child = Command::new("sleep")
        .arg("60")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    m.add_process(&container, child.id()).unwrap();
    assert_eq!(m.procs(&container).unwrap(), vec![child.id()]);
    let own = std::fs::read_to_string(format!("/proc/{}/cgroup", child.id())).unwrap();
    assert!(
        own.lines()
            .any(|l| l.starts_with("0::") && l.ends_with("pod44444444-dddd/worker")),
        "{own}"
    );
    assert!(!m.is_empty(&CgroupPath::kubepods()).unwrap());
    assert!(matches!(
        m.remove(&CgroupPath::kubepods(), Duration::from_millis(50)),
        Err(CgroupError::Busy { .. })
    ));
    child.kill().unwrap();
    child.wait().unwrap();
    m.remove(&CgroupPath::kubepods(), Duration::from_secs(2))
        .unwrap();
    assert!(!m.exists(&CgroupPath::kubepods()));
    assert!(root.leftovers().is_empty());
}
