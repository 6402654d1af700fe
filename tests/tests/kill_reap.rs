//! The eviction's kill gives the victim's memory back without waiting for the victim's exit:
//! `process_mrelease` through a pidfd, on the real kernel and a real memory cgroup.
//!
//! The victim is held frozen (a v1 freezer cgroup unique to the test), so after SIGKILL it
//! cannot run its exit path: whatever memory comes back before it is thawed was reaped by
//! the agent's call, not by the exit.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reactor::act::cgroups::{CgroupManager, CgroupPath};
use reactor::act::kill::{kill_cgroup, kill_cgroup_now};
use reactor_tests::cgroup_root::{TestCgroupRoot, MOUNT_ROOT};
use reactor_tests::freezer::Freezer;
use reactor_tests::{is_root, memhog_bin, require, ChildGuard};

const MI: u64 = 1 << 20;
fn usage(memcg: &Path) -> u64 {
    std::fs::read_to_string(memcg.join("memory.usage_in_bytes"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let (Some(a), Some(b)) = (parts.next(), parts.next()) else {
        return false;
    };
    (a.parse::<u32>().unwrap_or(0), b.parse::<u32>().unwrap_or(0)) >= (major, minor)
}

/// A memhog of about 160 MiB in a memory cgroup of its own (under a test root named `name`),
/// frozen in a v1 freezer cgroup; `None` (with the reason printed) where the test cannot run.
fn frozen_victim(name: &str) -> Option<Frozen> {
    if !require(is_root(), "root (cgroups, signals to a frozen process)")
        || !require(
            Freezer::available() && Path::new(MOUNT_ROOT).join("memory/cgroup.procs").exists(),
            "cgroup v1 memory and freezer hierarchies under /sys/fs/cgroup",
        )
        || !require(kernel_at_least(5, 15), "Linux 5.15+ (process_mrelease)")
    {
        return None;
    }
    let root = TestCgroupRoot::v1(name).expect("test cgroup root");
    let freezer = Freezer::new(&root.name).expect("creating the freezer cgroup");
    let memcg = Path::new(MOUNT_ROOT).join("memory").join(&root.name);
    std::fs::write(memcg.join("memory.limit_in_bytes"), (512 * MI).to_string())
        .expect("setting the test memcg's limit");
    let cgroups = CgroupManager::v1(
        Path::new(MOUNT_ROOT),
        &CgroupPath::parse(&root.name).expect("the test root as a cgroup path"),
    )
    .expect("cgroup manager over the test root");

    let procs = [memcg.join("cgroup.procs"), freezer.0.join("cgroup.procs")];
    let mut cmd = Command::new(memhog_bin());
    cmd.args(["160", "0", "3600"]).stdout(Stdio::null());
    // SAFETY: the closure only writes two files with std calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            for p in &procs {
                std::fs::write(p, std::process::id().to_string())?;
            }
            Ok(())
        });
    }
    let victim = ChildGuard(cmd.spawn().expect("starting memhog"));
    let t = Instant::now();
    while usage(&memcg) < 150 * MI {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "memhog never reached 150 MiB"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        freezer
            .freeze(Duration::from_secs(10))
            .expect("writing freezer.state"),
        "victim never froze"
    );
    let before = usage(&memcg);

    Some(Frozen {
        freezer,
        memcg,
        cgroups,
        victim,
        before,
        _root: root,
    })
}

/// Fields drop in their order here: the root last, after what is in it.
struct Frozen {
    freezer: Freezer,
    memcg: std::path::PathBuf,
    cgroups: CgroupManager,
    victim: ChildGuard,
    before: u64,
    _root: TestCgroupRoot,
}

impl Frozen {
    /// Asserts the killed victim has not exited while frozen, then thaws it and asserts it
    /// ends by SIGKILL.
    fn thaw_and_see_it_killed(mut self) {
        assert!(
            self.victim.0.try_wait().expect("try_wait").is_none(),
            "the frozen victim exited"
        );
        self.freezer.set("THAWED").expect("writing freezer.state");
        let status = self
            .victim
            .wait_exit("the killed victim", Duration::from_secs(10));
        assert_eq!(status.signal(), Some(9), "killed by SIGKILL: {status:?}");
    }
}

#[test]
fn a_killed_victims_memory_is_reaped_before_it_exits() {
    let Some(f) = frozen_victim("reap") else {
        return;
    };
    let out = kill_cgroup(&f.cgroups, &CgroupPath::root());
    assert_eq!(out.killed, 1, "one process signalled: {out:?}");
    assert_eq!(out.reaped, 1, "process_mrelease reaped it: {out:?}");
    let (before, after) = (f.before, usage(&f.memcg));
    // Still there (frozen, its exit path not run; checked below), but its memory is back.
    assert!(
        after < 16 * MI && after + 130 * MI < before,
        "memcg usage {before} → {after} bytes: the memory was not reaped"
    );
    f.thaw_and_see_it_killed();
}

/// The eviction's kill on a runtime (the reactor loop's) hands the reap to a blocking thread
/// and returns: the loop goes on looking while the pages are freed. Here the runtime's one
/// blocking thread is held until the kill has returned, so the reap cannot have started by
/// then; once it is let go the memory comes back, the victim still frozen.
#[test]
fn on_a_runtime_the_kill_returns_and_a_blocking_thread_reaps() {
    let Some(f) = frozen_victim("reap-aside") else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(1)
        .build()
        .expect("runtime");
    let (hold, held) = std::sync::mpsc::channel::<()>();
    let (started, is_started) = std::sync::mpsc::channel::<()>();
    let _blocker = rt.spawn_blocking(move || {
        let _ = started.send(());
        let _ = held.recv();
    });
    is_started.recv().expect("the blocking thread started");
    let out = rt.block_on(async { kill_cgroup_now(&f.cgroups, &CgroupPath::root(), Vec::new()) });
    assert_eq!(out.killed, 1, "one process signalled: {out:?}");
    assert_eq!(out.reaped, 1, "handed to the reaper: {out:?}");
    let (before, during) = (f.before, usage(&f.memcg));
    assert!(
        during + 16 * MI > before,
        "memcg usage {before} → {during} bytes while the only blocking thread was held: the \
         kill reaped in the caller's thread"
    );
    drop(hold);
    let t = Instant::now();
    while usage(&f.memcg) >= 16 * MI && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let after = usage(&f.memcg);
    assert!(
        after < 16 * MI,
        "memcg usage {before} → {after} bytes: the reaper thread did not free the memory"
    );
    f.thaw_and_see_it_killed();
}
