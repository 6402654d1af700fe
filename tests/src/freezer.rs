//! A v1 freezer cgroup unique to a test or bench: a process in it that is frozen cannot
//! run, not even its exit path after SIGKILL — the victim that will not die. Thawed and
//! removed on drop.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where the v1 freezer hierarchy is mounted on these machines.
pub const FREEZER: &str = "/sys/fs/cgroup/freezer";

/// A freezer cgroup `FREEZER/<name>`; see the module doc.
pub struct Freezer(pub PathBuf);

impl Freezer {
    /// Whether the v1 freezer hierarchy is mounted.
    pub fn available() -> bool {
        Path::new(FREEZER).join("cgroup.procs").exists()
    }

    /// Creates `FREEZER/<name>` (one path component, or a path below a cgroup the caller
    /// made).
    pub fn new(name: &str) -> std::io::Result<Freezer> {
        let dir = Path::new(FREEZER).join(name);
        std::fs::create_dir(&dir)?;
        Ok(Freezer(dir))
    }

    /// Moves process `pid` into it.
    pub fn add(&self, pid: u32) -> std::io::Result<()> {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string())
    }

    /// Writes `freezer.state` (`FROZEN` or `THAWED`).
    pub fn set(&self, state: &str) -> std::io::Result<()> {
        std::fs::write(self.0.join("freezer.state"), state)
    }

    /// `freezer.state` as read now (`FREEZING` while it takes effect).
    pub fn state(&self) -> String {
        std::fs::read_to_string(self.0.join("freezer.state"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// Freezes it and waits, up to `timeout`, until every process in it is frozen.
    pub fn freeze(&self, timeout: Duration) -> std::io::Result<bool> {
        self.set("FROZEN")?;
        let t = Instant::now();
        while self.state() != "FROZEN" {
            if t.elapsed() > timeout {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(true)
    }
}

impl Drop for Freezer {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("freezer.state"), "THAWED");
        for _ in 0..100 {
            if std::fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
