//! A cgroup root unique to one test, in every v1 hierarchy the agent uses or in the unified
//! (v2) hierarchy, removed on drop with everything below it.
//!
//! The agent is told to work below this root (its `cgroupRoot`), exactly as it works in a
//! delegated subtree on a real node; nothing a test does touches cgroups outside it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where cgroupfs is mounted on these machines.
pub const MOUNT_ROOT: &str = "/sys/fs/cgroup";
/// Where the unified hierarchy is mounted on these machines (hybrid layout).
pub const UNIFIED_ROOT: &str = "/sys/fs/cgroup/unified";

/// v1 controllers the agent creates cgroups in (those mounted here).
pub const V1_CONTROLLERS: [&str; 6] = ["cpu", "cpuacct", "cpuset", "memory", "pids", "hugetlb"];

/// A per-test cgroup root; see the module doc.
pub struct TestCgroupRoot {
    /// The cgroup root's name (one path component below each mount).
    pub name: String,
    /// Its directory in each hierarchy.
    pub dirs: Vec<PathBuf>,
}

fn is_cgroup_mount(p: &Path) -> bool {
    p.join("cgroup.procs").exists()
}

impl TestCgroupRoot {
    /// Creates `reactor-test-<name>-<pid>` in every mounted v1 hierarchy the agent uses,
    /// with the cpuset one seeded from its parent.
    pub fn v1(name: &str) -> std::io::Result<TestCgroupRoot> {
        let name = format!("reactor-test-{name}-{}", std::process::id());
        let mut root = TestCgroupRoot {
            name: name.clone(),
            dirs: Vec::new(),
        };
        for c in V1_CONTROLLERS {
            let mount = Path::new(MOUNT_ROOT).join(c);
            if !is_cgroup_mount(&mount) {
                continue;
            }
            let dir = mount.join(&name);
            std::fs::create_dir(&dir)?;
            root.dirs.push(dir.clone());
            if c == "cpuset" {
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    std::fs::write(dir.join(f), std::fs::read_to_string(mount.join(f))?)?;
                }
            }
        }
        Ok(root)
    }

    /// Creates `reactor-test-<name>-<pid>` in the unified hierarchy.
    pub fn v2(name: &str) -> std::io::Result<TestCgroupRoot> {
        let name = format!("reactor-test-{name}-{}", std::process::id());
        let dir = Path::new(UNIFIED_ROOT).join(&name);
        std::fs::create_dir(&dir)?;
        Ok(TestCgroupRoot {
            name,
            dirs: vec![dir],
        })
    }

    /// Creates `reactor-test-<name>-<pid>` in the unified hierarchy mounted at `mount` (the
    /// v2 guest mounts it at `/sys/fs/cgroup`).
    pub fn v2_at(mount: &Path, name: &str) -> std::io::Result<TestCgroupRoot> {
        let name = format!("reactor-test-{name}-{}", std::process::id());
        let dir = mount.join(&name);
        std::fs::create_dir(&dir)?;
        Ok(TestCgroupRoot {
            name,
            dirs: vec![dir],
        })
    }

    /// Whether the root is in a unified (v2) hierarchy: one directory, with the v2 files.
    pub fn is_v2(&self) -> bool {
        self.dirs.len() == 1 && self.dirs[0].join("cgroup.controllers").exists()
    }

    /// Every cgroup directory left below the root in any hierarchy (the root excluded).
    pub fn leftovers(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for d in &self.dirs {
            let mut stack = vec![d.clone()];
            while let Some(dir) = stack.pop() {
                for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        out.push(e.path());
                        stack.push(e.path());
                    }
                }
            }
        }
        out
    }
}

impl Drop for TestCgroupRoot {
    fn drop(&mut self) {
        // runc, on this hybrid layout, makes each container's cgroup path in every hierarchy
        // mounted here (the unified one, blkio, devices, freezer, the systemd name
        // hierarchy), not only in the agent's: a root's namesakes there, and everything
        // below them, go as well.
        for mount in std::fs::read_dir(MOUNT_ROOT)
            .into_iter()
            .flatten()
            .flatten()
        {
            let mirror = mount.path().join(&self.name);
            if mirror.is_dir() && !self.dirs.contains(&mirror) {
                self.dirs.push(mirror);
            }
        }
        // Only this test's processes can be in its own root: kill those left by pid.
        let mut dirs: Vec<PathBuf> = self.leftovers();
        dirs.extend(self.dirs.iter().cloned());
        for d in &dirs {
            if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
                for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                    }
                }
            }
        }
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        let deadline = Instant::now() + Duration::from_secs(5);
        for d in dirs {
            while std::fs::remove_dir(&d).is_err() && d.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if d.exists() {
                eprintln!("warning: could not remove test cgroup {}", d.display());
            }
        }
    }
}

/// `reactor run` works below its cgroup root in every v1 hierarchy: the test's memory cgroup
/// gets siblings of the same name in the others (cpuset seeded from its parent).
pub fn create_other_v1_roots(cgroup: &str) -> AgentTreeGuard {
    for c in V1_CONTROLLERS {
        let mount = std::path::Path::new(MOUNT_ROOT).join(c);
        if c == "memory" || !mount.join("cgroup.procs").exists() {
            continue;
        }
        let dir = mount.join(cgroup.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).expect("create cgroup root");
        if c == "cpuset" {
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let parent = std::fs::read_to_string(mount.join(f)).expect("read cpuset");
                std::fs::write(dir.join(f), parent).expect("seed cpuset");
            }
        }
    }
    AgentTreeGuard(cgroup.to_string())
}

/// `reactor run` builds the (empty) QoS tree below its cgroup root in every v1 hierarchy and
/// leaves it for the next start; the test removes it and the other roots so its cgroup can go.
pub fn remove_agent_tree(cgroup: &str) {
    for c in V1_CONTROLLERS {
        let root = std::path::Path::new(MOUNT_ROOT)
            .join(c)
            .join(cgroup.trim_start_matches('/'));
        for sub in ["kubepods/burstable", "kubepods/besteffort", "kubepods"] {
            let _ = std::fs::remove_dir(root.join(sub));
        }
        if c != "memory" {
            let _ = std::fs::remove_dir(&root);
        }
    }
}

/// Removes what [`create_other_v1_roots`] made and the agent's empty QoS tree when dropped,
/// even when the test panics; drop it before the memory cgroup itself.
pub struct AgentTreeGuard(String);

impl Drop for AgentTreeGuard {
    fn drop(&mut self) {
        remove_agent_tree(&self.0);
    }
}
