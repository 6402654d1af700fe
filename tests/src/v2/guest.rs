//! What every guest check works with: where the guest mounts cgroup2 and its 9p file, the
//! root's controllers turned on, and reading, counting and waiting on cgroup files.

use std::path::Path;

/// Where the guest mounts the unified hierarchy.
pub const MOUNT: &str = "/sys/fs/cgroup";

/// The file the guest reads over 9p (see `xtask/src/vm.rs`): clean, reclaimable page cache.
/// Here, not in `pressure.rs`: `reclaim.rs` reads it too, and `pressure.rs` uses `reclaim.rs`.
pub const CACHE_FILE: &str = "/mnt/host/cache.bin";

/// Enables every controller the root offers for its children, as a v2 node's init system
/// does, so a check's own cgroup root can use them.
pub fn enable_root_controllers() -> Result<(), String> {
    let root = Path::new(MOUNT);
    let offered = std::fs::read_to_string(root.join("cgroup.controllers"))
        .map_err(|e| format!("{MOUNT}/cgroup.controllers: {e}"))?;
    for c in offered.split_whitespace() {
        std::fs::write(root.join("cgroup.subtree_control"), format!("+{c}"))
            .map_err(|e| format!("enable {c} in {MOUNT}/cgroup.subtree_control: {e}"))?;
    }
    Ok(())
}

/// Reads a cgroup (or any) file, trimmed; panics naming it when it cannot.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .trim()
        .to_string()
}

/// One `key value` counter of a flat keyed file (`memory.events`, `memory.stat`).
pub fn counter(path: &Path, key: &str) -> u64 {
    let text = read(path);
    text.lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(key)).then(|| w.next().and_then(|v| v.parse().ok()))?
        })
        .unwrap_or_else(|| panic!("no {key} in {}: {text}", path.display()))
}

/// Polls `cond` every 50 ms until it holds or `secs` (TCG-generous) pass; panics with
/// `what` and `context()` then.
pub fn wait_until(
    what: &str,
    secs: u64,
    mut cond: impl FnMut() -> bool,
    context: impl Fn() -> String,
) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !cond() {
        if std::time::Instant::now() >= deadline {
            panic!("timed out after {secs} s waiting for {what}\n{}", context());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
