//! Removing a cgroup subtree: leaf first, retrying while the kernel drains exiting tasks, and
//! waiting (bounded) for a removed cgroup's anonymous memory to come back first. It kills
//! nothing: what is still inside when the wait is over is reported.

use std::path::Path;
use std::time::Duration;

use super::error::CgroupError;
use super::fs;
use crate::observe::cgroupfs::{anon_slack_bytes, stat_anon};

/// Removes every directory of `dir`'s subtree leaf first, retrying `EBUSY` until `wait` has
/// passed; `procs` lists what is still inside a directory for the error.
pub(crate) fn remove_tree(
    dir: &Path,
    wait: Duration,
    procs: impl Fn(&Path) -> Vec<u32>,
) -> Result<(), CgroupError> {
    let start = std::time::Instant::now();
    for d in fs::subtree_leaf_first(dir)? {
        if !wait_for_anon(&d, start, wait) {
            tracing::debug!(cgroup = %d.display(), waited = ?start.elapsed(), "removing a cgroup that still holds anonymous memory");
        }
        let mut pause = Duration::from_millis(5);
        loop {
            match std::fs::remove_dir(&d) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) => {
                    if start.elapsed() >= wait {
                        return Err(CgroupError::Busy {
                            pids: procs(&d),
                            path: d,
                            waited: start.elapsed(),
                        });
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                Err(source) => return Err(CgroupError::Remove { path: d, source }),
            }
        }
    }
    Ok(())
}

/// Waits, until `wait` has passed since `start`, while the memory cgroup `dir` still holds
/// anonymous memory ([`anon_slack_bytes`] or more; a directory with no `memory.stat`, as in
/// v1's other hierarchies, is not waited for): the address space of a process that has left
/// it but is still being torn down, its pages on their way back. Removed before they are, the
/// cgroup would take with it the one place that shows them coming back, and the loop,
/// watching a victim whose cgroup is gone, could only count its memory as back and evict a
/// second pod while it was still charged. Past `wait` it is removed anyway: anonymous memory
/// a process elsewhere shares (copy-on-write) can stay charged to it for good.
fn wait_for_anon(dir: &Path, start: std::time::Instant, wait: Duration) -> bool {
    let stat = dir.join("memory.stat");
    let mut pause = Duration::from_millis(2);
    loop {
        let held = fs::read(&stat)
            .ok()
            .and_then(|text| stat_anon(&text))
            .is_some_and(|anon| anon >= anon_slack_bytes());
        if !held {
            return true;
        }
        if start.elapsed() >= wait {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `memory.stat` replaced whole (written aside, renamed over), as a reader never sees
    /// half a file.
    fn put_stat(dir: &Path, text: &str) {
        std::fs::write(dir.join("memory.stat.new"), text).unwrap();
        std::fs::rename(dir.join("memory.stat.new"), dir.join("memory.stat")).unwrap();
    }

    #[test]
    fn a_cgroup_is_removed_once_its_anonymous_memory_is_back_or_its_wait_is_over() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        put_stat(&dir, "anon 104857600\nfile 0\n");
        let freeing = {
            let dir = dir.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                put_stat(&dir, "anon 0\nfile 4096\n");
            })
        };
        assert!(wait_for_anon(
            &dir,
            std::time::Instant::now(),
            Duration::from_secs(30)
        ));
        assert_eq!(
            std::fs::read_to_string(dir.join("memory.stat")).unwrap(),
            "anon 0\nfile 4096\n",
            "it waited for the memory to be given back"
        );
        freeing.join().unwrap();
        put_stat(&dir, "total_rss 104857600\n");
        assert!(
            !wait_for_anon(&dir, std::time::Instant::now(), Duration::from_millis(20)),
            "held past the wait (v1's key): removed anyway"
        );
        put_stat(&dir, "total_rss 4096\n");
        assert!(wait_for_anon(
            &dir,
            std::time::Instant::now(),
            Duration::ZERO
        ));
        let other = tempfile::tempdir().unwrap();
        assert!(
            wait_for_anon(other.path(), std::time::Instant::now(), Duration::ZERO),
            "no memory.stat (another v1 hierarchy): nothing to wait for"
        );
    }
}
