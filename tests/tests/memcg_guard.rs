//! The test cgroup guard itself: a hog in a 64 MiB cgroup is OOM-killed inside it, and the
//! cgroup is gone afterwards.

use std::process::Command;
use std::time::Duration;

use reactor_tests::{is_root, memhog_bin, require, TestMemcg};

#[test]
fn hog_is_oom_killed_inside_its_cgroup_and_cgroup_is_removed() {
    if !require(is_root(), "root for cgroup v1 memory") {
        return;
    }
    let path;
    {
        let mut cg = TestMemcg::new("guard", 64 << 20).expect("create test memcg");
        path = cg.path.clone();
        cg.spawn(Command::new(memhog_bin()).args(["256", "0", "30"]))
            .expect("spawn memhog");
        let statuses = cg.wait_all(Duration::from_secs(30));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            statuses[0].and_then(|s| s.signal()),
            Some(9),
            "killed by the OOM killer"
        );
        let oom = std::fs::read_to_string(cg.path.join("memory.oom_control")).unwrap();
        assert!(oom.contains("oom_kill 1"), "{oom}");
    }
    assert!(!path.exists(), "test cgroup removed");
}
