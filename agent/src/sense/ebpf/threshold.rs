//! Usage thresholds checked in the kernel: the user-space half of the charge programs
//! (`charge_lruvec` in `agent-ebpf`).
//!
//! cgroup v2 offers no "usage crossed X bytes" notification (`memory.events` moves only on
//! `high`/`max`/`oom`), and v1's needs one eventfd registration per threshold. The charge
//! programs read the watched cgroup's page counter on the charge path and write one
//! [`agent_ebpf::ThresholdEvent`] per upward crossing, with the kernel's timestamp; the same
//! program serves v1 and v2 because it reads `struct mem_cgroup`, not a cgroup file.
//!
//! User space owns the [`agent_ebpf::ThresholdTable`] (one array-map value): which cgroups,
//! at what level, and whether each slot is armed. A level moves when the reactor loop moves
//! the memcg thresholds ([`crate::sense::memcg::MemcgThresholds`], the same handle), and each
//! write re-reads the cgroup's usage so a slot armed below its usage waits for the next
//! crossing instead of firing at once (what a v1 eventfd registration does too).
//!
//! Minimum kernel: the `memcg:mod_memcg_lruvec_state` tracepoint (Linux 6.14) and BTF for the
//! offsets.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use agent_ebpf::{ThresholdOffsets, ThresholdSlot, ThresholdTable, MAX_NODES, MAX_THRESHOLDS};
use aya::maps::{Array, MapData};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_stream::{StreamExt as _, StreamMap};

use super::btf::Btf;

/// A slot that fired re-arms once usage falls this far below its level: at least 4 MiB (16
/// per-CPU charge batches), or 1% of the level on large cgroups, so usage hovering at the
/// level (page cache coming and going) cannot turn into a stream of crossings.
pub const MIN_HYSTERESIS_BYTES: u64 = 4 << 20;

/// The offsets the charge programs need, from BTF; `None` names the first one missing.
pub(crate) fn offsets(btf: &Btf) -> Result<ThresholdOffsets, String> {
    let member = |s: &str, m: &str| {
        btf.member_offset(s, m)
            .ok_or_else(|| format!("BTF has no {s}.{m}"))
    };
    let node_item = |name: &str| {
        btf.enum_value("node_stat_item", name)
            .and_then(|v| u64::try_from(v).ok())
            .ok_or_else(|| format!("BTF has no node_stat_item {name}"))
    };
    let memory_cgrp_id = btf
        .enum_value("cgroup_subsys_id", "memory_cgrp_id")
        .and_then(|v| u64::try_from(v).ok())
        .ok_or("BTF has no memory_cgrp_id (no memory controller?)")?;
    Ok(ThresholdOffsets {
        memcg_css: member("mem_cgroup", "css")?,
        memcg_usage: member("mem_cgroup", "memory")? + member("page_counter", "usage")?,
        css_cgroup: member("cgroup_subsys_state", "cgroup")?,
        cgroup_level: member("cgroup", "level")?,
        cgroup_ancestors: member("cgroup", "ancestors")?,
        cgroup_subsys: member("cgroup", "subsys")?,
        memory_cgrp_id,
        cgroup_kn: member("cgroup", "kn")?,
        kn_id: member("kernfs_node", "id")?,
        memcg_nodeinfo: member("mem_cgroup", "nodeinfo")?,
        per_node_pgdat: member("mem_cgroup_per_node", "lruvec")? + member("lruvec", "pgdat")?,
        pgdat_vm_stat: member("pglist_data", "vm_stat")?,
        nr_anon_mapped: node_item("NR_ANON_MAPPED")?,
        nr_file_pages: node_item("NR_FILE_PAGES")?,
        nr_nodes: std::fs::read_to_string(NODES_ONLINE)
            .ok()
            .and_then(|t| node_count(&t))
            .unwrap_or(0),
        valid: 1,
    })
}

/// The NUMA nodes the kernel has online.
const NODES_ONLINE: &str = "/sys/devices/system/node/online";

/// Highest node id + 1 from a kernel CPU/node list (`0`, `0-1`, `0,2-3`); `None` when it does
/// not parse or names more than [`MAX_NODES`] nodes (root-cgroup thresholds are then off).
pub fn node_count(list: &str) -> Option<u64> {
    let mut highest: Option<u64> = None;
    for part in list.trim().split(',') {
        let last = part.rsplit('-').next()?.trim().parse::<u64>().ok()?;
        highest = highest.max(Some(last));
    }
    let n = highest? + 1;
    (n <= MAX_NODES as u64).then_some(n)
}

/// One cgroup whose usage threshold the kernel should check.
#[derive(Debug)]
pub struct UsageWatch {
    /// The cgroup as a path inside the memory hierarchy (`/kubepods`).
    pub cgroup: String,
    /// Its directory (where `memory.current` or `memory.usage_in_bytes` is).
    pub dir: PathBuf,
    /// Where the threshold is now and where it moves to.
    pub bytes: watch::Receiver<u64>,
}

/// A watch placed in a slot.
#[derive(Debug)]
struct Placed {
    cgroup: String,
    dir: PathBuf,
    id: u64,
    level: u32,
}

/// The table's user-space owner: places watches in slots and rewrites a slot when its level
/// moves.
pub(crate) struct UsageThresholds {
    map: Array<MapData, ThresholdTable>,
    /// Whether a root-cgroup slot can be checked (the node counters could be found).
    root: bool,
    placed: Vec<Placed>,
    moves: StreamMap<usize, WatchStream<u64>>,
    page: u64,
}

impl std::fmt::Debug for UsageThresholds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageThresholds")
            .field("placed", &self.placed)
            .finish_non_exhaustive()
    }
}

impl UsageThresholds {
    pub(crate) fn new(map: Array<MapData, ThresholdTable>, offsets: &ThresholdOffsets) -> Self {
        UsageThresholds {
            map,
            root: offsets.nr_nodes > 0,
            placed: Vec::new(),
            moves: StreamMap::new(),
            page: rustix::param::page_size() as u64,
        }
    }

    /// Places `watch` in the next slot and arms it; `Ok` describes it and gives the cgroup's
    /// id (what its records carry), `Err` says why not.
    pub(crate) fn add(&mut self, watch: UsageWatch) -> Result<(String, u64), String> {
        let slot = self.placed.len();
        if slot >= MAX_THRESHOLDS {
            return Err(format!(
                "{}: eBPF usage threshold not armed: all {MAX_THRESHOLDS} slots are in use",
                watch.cgroup
            ));
        }
        let level = cgroup_level(&watch.cgroup);
        if level == 0 && !self.root {
            return Err(format!(
                "{}: eBPF usage threshold not armed on the root cgroup: the NUMA layout in \
                 {NODES_ONLINE} is unreadable or has more than {MAX_NODES} nodes",
                watch.cgroup
            ));
        }
        let id = std::fs::metadata(&watch.dir)
            .map_err(|e| format!("{}: cannot stat {}: {e}", watch.cgroup, watch.dir.display()))?
            .ino();
        let bytes = *watch.bytes.borrow();
        self.placed.push(Placed {
            cgroup: watch.cgroup.clone(),
            dir: watch.dir,
            id,
            level,
        });
        self.arm(slot, bytes)
            .inspect_err(|_| {
                self.placed.pop();
            })
            .map_err(|e| format!("{}: {e}", watch.cgroup))?;
        self.moves.insert(slot, WatchStream::new(watch.bytes));
        Ok((
            format!(
                "eBPF usage threshold {} on {} (checked on every charge)",
                crate::human::bytes(i128::from(bytes)),
                watch.cgroup
            ),
            id,
        ))
    }

    /// Rewrites slot `index` at `bytes`, keeping the other slots as the kernel left them.
    fn arm(&mut self, index: usize, bytes: u64) -> Result<(), String> {
        let placed = &self.placed[index];
        let usage = read_usage(&placed.dir);
        let mut table = self.map.get(&0, 0).unwrap_or_default();
        table.slots[index] = slot_for(placed.id, placed.level, bytes, usage, self.page);
        table.count = u32::try_from(self.placed.len()).unwrap_or(0);
        self.map
            .set(0, table, 0)
            .map_err(|e| format!("cannot write the eBPF threshold table: {e}"))
    }

    /// Moves slots as their levels move; returns when every level's sender is gone.
    pub(crate) async fn follow(&mut self) {
        while let Some((index, bytes)) = self.moves.next().await {
            if let Err(e) = self.arm(index, bytes) {
                let cgroup = &self.placed[index].cgroup;
                tracing::warn!(%cgroup, bytes, error = %e, "eBPF usage threshold not moved");
            }
        }
        std::future::pending::<()>().await;
    }
}

/// Depth of a cgroup path in its hierarchy (`/` = 0, `/kubepods/burstable` = 2).
pub fn cgroup_level(cgroup: &str) -> u32 {
    let n = Path::new(cgroup)
        .components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The slot for a cgroup at `threshold_bytes`, armed only when usage is below it now: a
/// crossing is a change from below to at-or-above, as with a v1 eventfd.
pub fn slot_for(
    id: u64,
    level: u32,
    threshold_bytes: u64,
    usage_bytes: Option<u64>,
    page: u64,
) -> ThresholdSlot {
    let page = page.max(1);
    let threshold_pages = threshold_bytes.div_ceil(page);
    let hysteresis = MIN_HYSTERESIS_BYTES.max(threshold_bytes / 100) / page;
    ThresholdSlot {
        cgroup_id: id,
        level,
        armed: u32::from(usage_bytes.is_none_or(|u| u < threshold_bytes)),
        threshold_pages,
        rearm_pages: threshold_pages.saturating_sub(hysteresis),
        last_fired_ns: 0,
        cgroup_ptr: 0,
        memcg_ptr: 0,
    }
}

/// The cgroup's usage as the programs see it, from its own files: v2 `memory.current` and
/// v1 `memory.usage_in_bytes` (for a non-root cgroup the page counter; for the v1 root, anon +
/// file pages), or for the v2 root (no `memory.current`) `anon + file` of `memory.stat`.
fn read_usage(dir: &Path) -> Option<u64> {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
    if let Some(t) = read("memory.current").or_else(|| read("memory.usage_in_bytes")) {
        return t.trim().parse().ok();
    }
    let stat = read("memory.stat")?;
    let value = |key: &str| {
        stat.lines().find_map(|l| {
            l.strip_prefix(key)?
                .strip_prefix(' ')?
                .trim()
                .parse::<u64>()
                .ok()
        })
    };
    Some(value("anon")?.saturating_add(value("file")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists_give_the_node_count() {
        assert_eq!(node_count("0\n"), Some(1));
        assert_eq!(node_count("0-1"), Some(2));
        assert_eq!(node_count("0,2-3"), Some(4));
        assert_eq!(node_count("0-8"), None, "more nodes than the table holds");
        assert_eq!(node_count(""), None);
        assert_eq!(node_count("x"), None);
    }

    #[test]
    fn levels_count_path_components() {
        assert_eq!(cgroup_level("/"), 0);
        assert_eq!(cgroup_level(""), 0);
        assert_eq!(cgroup_level("/kubepods"), 1);
        assert_eq!(cgroup_level("/kubepods/burstable/"), 2);
    }

    #[test]
    fn slots_arm_below_usage_and_rearm_below_the_hysteresis() {
        let mib = 1 << 20;
        let s = slot_for(7, 2, 100 * mib, Some(50 * mib), 4096);
        assert_eq!((s.cgroup_id, s.level, s.armed), (7, 2, 1));
        assert_eq!(s.threshold_pages, 100 * 256);
        assert_eq!(s.rearm_pages, 96 * 256, "4 MiB below the level");
        // Armed above usage: wait for the next crossing.
        assert_eq!(slot_for(7, 2, 100 * mib, Some(100 * mib), 4096).armed, 0);
        // Usage unknown: armed.
        assert_eq!(slot_for(7, 2, 100 * mib, None, 4096).armed, 1);
        // Large levels re-arm 1% below.
        let big = slot_for(7, 1, 1000 * 1024 * mib, None, 4096);
        assert_eq!(big.rearm_pages, big.threshold_pages - 10 * 1024 * 256);
        // A level below the hysteresis re-arms at 0, never underflows.
        assert_eq!(slot_for(7, 1, mib, None, 4096).rearm_pages, 0);
        // Bytes round up to whole pages.
        assert_eq!(slot_for(7, 1, 4097, None, 4096).threshold_pages, 2);
    }
}
