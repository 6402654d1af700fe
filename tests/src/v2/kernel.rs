//! What the v2 paths need from the kernel, and observe's memory figures against the kernel's
//! own files.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use reactor::config::Config;
use reactor::observe::{ObserveSettings, Observer};

use super::{counter, read, MOUNT};
use crate::cgroup_root::TestCgroupRoot;
use crate::{memhog_bin, ChildGuard};

/// The kernel features each v2 path of the agent needs are there: the memory controller on
/// the unified hierarchy, per-cgroup PSI, `memory.events` with `oom_group_kill`,
/// `memory.oom.group`, `memory.reclaim` (proactive reclaim, `memoryReclaim`), BTF and the `memcg:`/`oom:` tracepoints.
pub fn features() -> String {
    let mut notes = String::new();
    let controllers = read(&Path::new(MOUNT).join("cgroup.controllers"));
    for c in ["cpu", "memory", "pids"] {
        assert!(
            controllers.split_whitespace().any(|x| x == c),
            "no {c} controller on the unified hierarchy: {controllers}"
        );
    }
    let root = TestCgroupRoot::v2_at(Path::new(MOUNT), "features").expect("create a cgroup");
    let dir = &root.dirs[0];
    for f in [
        "memory.pressure",
        "memory.events",
        "memory.oom.group",
        "memory.current",
        "memory.stat",
        "memory.max",
        "memory.reclaim",
        "cpu.weight",
        "cpu.max",
        "pids.max",
    ] {
        assert!(dir.join(f).exists(), "a v2 cgroup has no {f}");
    }
    counter(&dir.join("memory.events"), "oom_group_kill");
    counter(&dir.join("memory.stat"), "inactive_file");
    assert!(
        Path::new("/proc/pressure/memory").exists(),
        "no PSI (/proc/pressure/memory)"
    );
    assert!(
        Path::new("/sys/kernel/btf/vmlinux").exists(),
        "no BTF (/sys/kernel/btf/vmlinux)"
    );
    for tp in [
        "oom/mark_victim",
        "memcg/count_memcg_events",
        "memcg/mod_memcg_state",
        "vmscan/mm_vmscan_memcg_reclaim_begin",
    ] {
        assert!(
            Path::new("/sys/kernel/tracing/events").join(tp).exists(),
            "no tracepoint {tp}"
        );
    }
    let uname = Command::new("uname").arg("-r").output().expect("uname");
    let _ = writeln!(
        notes,
        "kernel {}; controllers: {controllers}",
        String::from_utf8_lossy(&uname.stdout).trim()
    );
    notes
}

/// `memory.available` as observe computes it on v2 equals the node capacity minus
/// `memory.current − inactive_file` of the node cgroup, read from the kernel around the
/// observation; at the hierarchy root (no `memory.current`) it uses `anon + file` of the
/// root's `memory.stat`, as cadvisor does.
pub fn observe_matches_kernel_files() -> String {
    let mut notes = String::new();
    let root = TestCgroupRoot::v2_at(Path::new(MOUNT), "observe").expect("create a cgroup");
    let dir = root.dirs[0].clone();
    std::fs::write(dir.join("memory.max"), (256u64 << 20).to_string()).expect("memory.max");
    // A process holding 40 MiB inside the node cgroup, and some page cache charged to it.
    let _hog = ChildGuard(
        crate::spawn_in_cgroup(
            &dir,
            Command::new(memhog_bin())
                .args(["40", "0", "3600"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .expect("start memhog"),
    );
    super::wait_until(
        "memhog to hold 40 MiB",
        120,
        || counter(&dir.join("memory.stat"), "anon") >= 40 << 20,
        || read(&dir.join("memory.stat")),
    );

    let capacity: u64 = 512 << 20;
    let mut config = Config {
        cgroup_root: format!("/{}", root.name),
        ..Config::default()
    };
    config.node.memory_capacity = "512Mi".into();
    config.node.nodefs_path = "/tmp".into();
    let mut observer =
        Observer::new(ObserveSettings::from_config(&config, None, None).expect("settings"))
            .expect("observer on the v2 hierarchy");
    let working_set = |d: &Path| {
        let current: u64 = read(&d.join("memory.current"))
            .parse()
            .expect("memory.current");
        current.saturating_sub(counter(&d.join("memory.stat"), "inactive_file"))
    };
    let before = working_set(&dir);
    let signals = observer.observe();
    let after = working_set(&dir);
    let m = signals
        .memory
        .unwrap_or_else(|| panic!("no memory.available: {:?}", signals.errors));
    let (lo, hi) = (before.min(after), before.max(after));
    assert!(
        (lo..=hi).contains(&m.working_set_bytes),
        "observe's working set {} is not the kernel's memory.current - inactive_file ({before} before, {after} after)",
        m.working_set_bytes
    );
    assert_eq!(m.capacity_bytes, capacity);
    assert_eq!(m.available_bytes, capacity - m.working_set_bytes);
    let _ = writeln!(
        notes,
        "node cgroup: working set {} (kernel {before}..{after}), available {}",
        m.working_set_bytes, m.available_bytes
    );

    // The hierarchy root: no memory.current there.
    config.cgroup_root = "/".into();
    config.node.memory_capacity = String::new();
    let mut observer =
        Observer::new(ObserveSettings::from_config(&config, None, None).expect("settings"))
            .expect("observer at the root");
    let root_ws = || {
        let stat = Path::new(MOUNT).join("memory.stat");
        (counter(&stat, "anon") + counter(&stat, "file"))
            .saturating_sub(counter(&stat, "inactive_file"))
    };
    let before = root_ws();
    let signals = observer.observe();
    let after = root_ws();
    let m = signals
        .memory
        .unwrap_or_else(|| panic!("no memory.available at the root: {:?}", signals.errors));
    // The root's counters move with everything on the machine: allow 2 MiB of drift.
    let slack = 2 << 20;
    assert!(
        m.working_set_bytes + slack >= before.min(after)
            && m.working_set_bytes <= before.max(after) + slack,
        "observe's root working set {} is not anon + file - inactive_file of the root's memory.stat ({before} before, {after} after)",
        m.working_set_bytes
    );
    let memtotal = read(Path::new("/proc/meminfo"))
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:").map(str::to_string))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("MemTotal");
    assert_eq!(m.capacity_bytes, memtotal * 1024, "capacity is MemTotal");
    let _ = writeln!(
        notes,
        "root: working set {} (kernel {before}..{after}), capacity {}",
        m.working_set_bytes, m.capacity_bytes
    );
    notes
}
