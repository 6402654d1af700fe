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
//! **Working-set levels follow the page cache in the kernel.** Eviction compares the working
//! set (`usage - inactive_file`), so a usage level placed at the loop's pass
//! (`capacity - threshold + inactive_file`) goes stale as soon as the page cache moves: when
//! it shrinks, the real crossing passes unnotified until usage reaches the old level (4 MiB
//! late = 12 ms at 350 MiB/s, measured in issue 26). A slot given a working-set
//! [`Level`] instead holds the fixed working-set level and the cgroup's `inactive_file` (read
//! from `memory.stat` when the slot is written); the charge program then moves that count on
//! every `NR_INACTIVE_FILE` update in the cgroup's subtree (the same tracepoint as the
//! charges) and compares usage minus it, so the crossing is seen at the working-set crossing
//! whatever the page cache did since the last pass. A root-cgroup slot reads the nodes'
//! `NR_INACTIVE_FILE` beside their usage instead. The slot is written again only when the
//! working-set level itself moves, not at every pass.
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

use std::time::{Duration, Instant};

use super::btf::Btf;
use super::charge_switch::ChargeSwitch;
use super::kernel_watch::{ArmingReport, KernelWatch};
use super::near::{self, Arming, NearLevel, Tripwire, Woke};
use crate::sense::memcg::Level;

/// A slot that fired re-arms once usage falls this far below its level: at least 4 MiB (16
/// per-CPU charge batches), or 1% of the level on large cgroups, so usage hovering at the
/// level (page cache coming and going) cannot turn into a stream of crossings.
pub(crate) const MIN_HYSTERESIS_BYTES: u64 = 4 << 20;

/// What the kernel's BTF lacks that the charge programs need.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum OffsetsError {
    /// BTF has no such struct member.
    #[error("BTF has no {0}.{1}")]
    Member(&'static str, &'static str),
    /// BTF has no such `node_stat_item`.
    #[error("BTF has no node_stat_item {0}")]
    NodeItem(&'static str),
    /// BTF has no `memory_cgrp_id`.
    #[error("BTF has no memory_cgrp_id (no memory controller?)")]
    NoMemoryController,
    /// There was no BTF to read.
    #[error("no BTF")]
    NoBtf,
}

/// Why a usage threshold was not armed in the kernel; each names the cgroup.
#[derive(Debug, thiserror::Error)]
pub enum UsageWatchError {
    /// The charge programs are not attached.
    #[error("{cgroup}: eBPF usage threshold not armed ({why})")]
    NoChargePrograms {
        /// The cgroup.
        cgroup: String,
        /// Why the programs are missing.
        why: String,
    },
    /// Every slot of the table is taken.
    #[error("{0}: eBPF usage threshold not armed: all {MAX_THRESHOLDS} slots are in use")]
    SlotsFull(String),
    /// The root cgroup's usage is summed over NUMA nodes, and their layout is unknown.
    #[error("{0}: eBPF usage threshold not armed on the root cgroup: the NUMA layout in {NODES_ONLINE} is unreadable or has more than {MAX_NODES} nodes")]
    RootNuma(String),
    /// The cgroup's directory could not be read.
    #[error("{cgroup}: cannot stat {}: {source}", dir.display())]
    Stat {
        /// The cgroup.
        cgroup: String,
        /// Its directory.
        dir: PathBuf,
        /// The error from the kernel.
        #[source]
        source: std::io::Error,
    },
    /// The slot could not be written.
    #[error("{cgroup}: {source}")]
    Arm {
        /// The cgroup.
        cgroup: String,
        /// Why.
        #[source]
        source: ArmError,
    },
}

/// The threshold table could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the eBPF threshold table: {0}")]
pub struct ArmError(#[source] aya::maps::MapError);

/// The offsets the charge programs need, from BTF; `Err` names the first one missing.
pub(crate) fn offsets(btf: &Btf) -> Result<ThresholdOffsets, OffsetsError> {
    let member = |s: &'static str, m: &'static str| {
        btf.member_offset(s, m).ok_or(OffsetsError::Member(s, m))
    };
    let node_item = |name: &'static str| {
        btf.enum_value("node_stat_item", name)
            .and_then(|v| u64::try_from(v).ok())
            .ok_or(OffsetsError::NodeItem(name))
    };
    let memory_cgrp_id = btf
        .enum_value("cgroup_subsys_id", "memory_cgrp_id")
        .and_then(|v| u64::try_from(v).ok())
        .ok_or(OffsetsError::NoMemoryController)?;
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
        nr_inactive_file: node_item("NR_INACTIVE_FILE")?,
        nr_nodes: std::fs::read_to_string(NODES_ONLINE)
            .ok()
            .and_then(|t| node_count(&t))
            .unwrap_or(0),
        near_pages: agent_ebpf::charge_near_pages(possible_cpus()),
        valid: 1,
    })
}

/// The CPUs the kernel may ever bring online (each may charge pages between two checks);
/// 64 when the list cannot be read, a wide zone rather than a late crossing.
fn possible_cpus() -> u64 {
    std::fs::read_to_string(CPUS_POSSIBLE)
        .ok()
        .and_then(|t| id_count(&t))
        .unwrap_or(64)
}

const CPUS_POSSIBLE: &str = "/sys/devices/system/cpu/possible";

/// How many ids a kernel id list (`0-3,8-11`) spans: the highest id + 1.
fn id_count(list: &str) -> Option<u64> {
    let mut highest: Option<u64> = None;
    for part in list.trim().split(',') {
        let last = part.rsplit('-').next()?.trim().parse::<u64>().ok()?;
        highest = highest.max(Some(last));
    }
    Some(highest? + 1)
}

/// The NUMA nodes the kernel has online.
const NODES_ONLINE: &str = "/sys/devices/system/node/online";

/// Highest node id + 1 from a kernel CPU/node list (`0`, `0-1`, `0,2-3`); `None` when it does
/// not parse or names more than [`MAX_NODES`] nodes (root-cgroup thresholds are then off).
pub(crate) fn node_count(list: &str) -> Option<u64> {
    let n = id_count(list)?;
    (n <= MAX_NODES as u64).then_some(n)
}

/// One cgroup whose usage threshold the kernel should check.
#[derive(Debug)]
pub struct UsageWatch {
    /// The cgroup as a path inside the memory hierarchy (`/kubepods`).
    pub cgroup: String,
    /// Its directory (where `memory.current` or `memory.usage_in_bytes` is).
    pub dir: PathBuf,
    /// Where the threshold is now and where it moves to: a usage level, or a working-set
    /// level whose page cache the kernel then follows.
    pub level: watch::Receiver<Level>,
}

/// A watch placed in a slot.
#[derive(Debug)]
struct Placed {
    cgroup: String,
    dir: PathBuf,
    id: u64,
    level: u32,
    /// Where the level is now.
    now: Level,
    /// What the slot was last written with: the working-set level (for a following slot)
    /// or the usage level.
    written: Option<Written>,
}

/// The level a slot was written at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Written {
    Usage(u64),
    WorkingSet(u64),
}

impl Written {
    fn of(level: &Level) -> Written {
        match level.working_set_bytes() {
            Some(ws) => Written::WorkingSet(ws),
            None => Written::Usage(level.usage_bytes),
        }
    }
}

/// The table's user-space owner: places watches in slots and rewrites a slot when its level
/// moves.
pub(crate) struct UsageThresholds {
    map: Array<MapData, ThresholdTable>,
    /// Whether a root-cgroup slot can be checked (the node counters could be found).
    root: bool,
    placed: Vec<Placed>,
    moves: StreamMap<usize, WatchStream<Level>>,
    page: u64,
    /// Arming the charge programs only near a level, when asked for.
    near: Option<Near>,
    /// Told what each slot watches and whether it is armed (for the loop's close watch).
    kernel_watch: KernelWatch,
}

/// The state of arming near a level ([`super::near`]).
struct Near {
    opts: NearLevel,
    switch: ChargeSwitch,
    /// One per placed watch.
    wires: Vec<Tripwire>,
    tick: tokio::time::Interval,
    /// The cache look: while a cgroup is within reach only by its page cache.
    cache_tick: tokio::time::Interval,
    /// Whether the programs are wanted on now.
    on: bool,
    /// Whether the first look was taken (the drain calls `follow` anew after each record).
    looked: bool,
    /// A reclaim stall seen since the last look that read the page cache.
    reclaim: bool,
    /// When a look last read every watched cgroup's page cache.
    deep_at: Option<Instant>,
    /// Whether the programs were on their tracepoint at the last look.
    attached: bool,
}

impl std::fmt::Debug for UsageThresholds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageThresholds")
            .field("placed", &self.placed)
            .finish_non_exhaustive()
    }
}

impl UsageThresholds {
    pub fn new(
        map: Array<MapData, ThresholdTable>,
        offsets: &ThresholdOffsets,
        kernel_watch: KernelWatch,
    ) -> Self {
        UsageThresholds {
            map,
            root: offsets.nr_nodes > 0,
            placed: Vec::new(),
            moves: StreamMap::new(),
            page: rustix::param::page_size() as u64,
            near: None,
            kernel_watch,
        }
    }

    /// From now on, keeps the charge programs on their tracepoint only while a watched
    /// cgroup is near its level, through `switch`.
    pub(crate) fn arm_near(&mut self, opts: NearLevel, switch: ChargeSwitch) {
        let mut tick = tokio::time::interval(opts.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut cache_tick = tokio::time::interval(opts.cache_look);
        cache_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.near = Some(Near {
            wires: self.placed.iter().map(|_| Tripwire::default()).collect(),
            opts,
            switch,
            tick,
            cache_tick,
            // As loaded: attached; the first look decides.
            on: true,
            looked: false,
            reclaim: false,
            deep_at: None,
            attached: false,
        });
    }

    /// Places `watch` in the next slot and arms it; `Ok` describes it and gives the cgroup's
    /// id (what its records carry) and the slot, `Err` says why not.
    pub(crate) fn add(
        &mut self,
        watch: UsageWatch,
    ) -> Result<(String, u64, usize), UsageWatchError> {
        let slot = self.placed.len();
        if slot >= MAX_THRESHOLDS {
            return Err(UsageWatchError::SlotsFull(watch.cgroup));
        }
        let level = cgroup_level(&watch.cgroup);
        if level == 0 && !self.root {
            return Err(UsageWatchError::RootNuma(watch.cgroup));
        }
        let id = match std::fs::metadata(&watch.dir) {
            Ok(m) => m.ino(),
            Err(source) => {
                return Err(UsageWatchError::Stat {
                    cgroup: watch.cgroup,
                    dir: watch.dir,
                    source,
                })
            }
        };
        let level_now = *watch.level.borrow();
        self.placed.push(Placed {
            cgroup: watch.cgroup.clone(),
            dir: watch.dir,
            id,
            level,
            now: level_now,
            written: None,
        });
        if let Some(near) = &mut self.near {
            near.wires.push(Tripwire::default());
        }
        self.arm(slot, level_now, false)
            .inspect_err(|_| {
                self.placed.pop();
            })
            .inspect_err(|_| {
                if let Some(near) = &mut self.near {
                    near.wires.pop();
                }
            })
            .map_err(|source| UsageWatchError::Arm {
                cgroup: watch.cgroup.clone(),
                source,
            })?;
        self.moves.insert(slot, WatchStream::new(watch.level));
        Ok((
            format!(
                "eBPF usage threshold {} on {} (checked on every charge{})",
                crate::human::bytes(i128::from(level_now.usage_bytes)),
                watch.cgroup,
                if self.near.is_some() {
                    " while its working set is near it"
                } else {
                    ""
                }
            ),
            id,
            slot,
        ))
    }

    /// Rewrites slot `index` at `level`, keeping the other slots as the kernel left them. A
    /// working-set level whose working-set part has not moved is left alone: the kernel
    /// follows its page cache more closely than a new `memory.stat` reading would. With
    /// `armed`, the slot is armed even where the working set is past its level already (the
    /// programs coming on after a time off: the next charge writes the record); otherwise
    /// only where it is below, as a v1 eventfd registration does.
    fn arm(&mut self, index: usize, level: Level, armed: bool) -> Result<(), ArmError> {
        self.placed[index].now = level;
        let written = Written::of(&level);
        if self.placed[index].written == Some(written) && matches!(written, Written::WorkingSet(_))
        {
            return Ok(());
        }
        let placed = &self.placed[index];
        let usage = read_usage(&placed.dir);
        let mut slot = match written {
            Written::Usage(bytes) => slot_for(placed.id, placed.level, bytes, usage, self.page),
            Written::WorkingSet(ws) => {
                let inactive = read_inactive_file(&placed.dir).unwrap_or(0);
                following_slot(placed.id, placed.level, ws, usage, inactive, self.page)
            }
        };
        if armed {
            slot.armed = 1;
        }
        let mut table = self.map.get(&0, 0).unwrap_or_default();
        table.slots[index] = slot;
        table.count = u32::try_from(self.placed.len()).unwrap_or(0);
        table.following = u32::try_from(
            table.slots[..self.placed.len()]
                .iter()
                .filter(|s| s.follow == 1)
                .count(),
        )
        .unwrap_or(0);
        // Not watching while the slot is rewritten; watching after, if it follows the page
        // cache and was armed below its level.
        self.kernel_watch
            .set_slot(index, &self.placed[index].cgroup, None, false);
        self.map.set(0, table, 0).map_err(ArmError)?;
        self.placed[index].written = Some(written);
        let working_set = match written {
            Written::WorkingSet(_) => Some(slot.threshold_pages.saturating_mul(self.page)),
            Written::Usage(_) => None,
        };
        self.kernel_watch.set_slot(
            index,
            &self.placed[index].cgroup,
            working_set,
            slot.armed == 1,
        );
        Ok(())
    }

    /// A reclaim stall record arrived (the drain's): while a watched cgroup is within reach
    /// only by its page cache, reclaim is how its working set rises with usage at the limit,
    /// so the next look reads the page cache again (at most one such look per poll
    /// interval).
    pub(crate) fn reclaim_seen(&mut self) {
        if let Some(near) = &mut self.near {
            near.reclaim = near.wires.iter().any(|w| w.arming == Arming::Cached);
        }
    }

    /// Moves slots as their levels move; returns when every level's sender is gone.
    ///
    /// Arming near a level, it also wakes on the tripwires, the poll, the cache look and
    /// reclaim, and attaches or detaches the charge programs. Cancel-safe: every wait is, and
    /// the state is written before the next one.
    pub(crate) async fn follow(&mut self) {
        if self.near.as_ref().is_some_and(|n| !n.looked) {
            self.look_near(Woke::Deep);
        }
        loop {
            let (poll, reclaim_in) = match &self.near {
                Some(n) => (
                    n.on || n.wires.iter().any(Tripwire::polled),
                    n.reclaim.then(|| {
                        let due = n.deep_at.map(|at| at + n.opts.poll_interval);
                        due.map_or(Duration::ZERO, |d| {
                            d.saturating_duration_since(Instant::now())
                        })
                    }),
                ),
                None => (false, None),
            };
            // The programs just put on their tracepoint followed nothing until then: look at
            // once, so their page cache counts are read anew before the crossing they check
            // (waiting for the next poll left up to one poll of reclaim uncounted).
            let watch = self.kernel_watch.clone();
            let on = self.near.as_ref().is_some_and(|n| n.on);
            let woke = tokio::select! {
                () = watch.attached_again(), if on => {
                    // Read anew even when a look saw them on before a pause took them off.
                    if let Some(n) = &mut self.near {
                        n.attached = false;
                    }
                    Woke::Poll
                }
                Some((index, level)) = self.moves.next() => {
                    if let Err(e) = self.arm(index, level, false) {
                        let cgroup = &self.placed[index].cgroup;
                        let bytes = level.usage_bytes;
                        tracing::warn!(%cgroup, bytes, error = %e, "eBPF usage threshold not moved");
                    }
                    Woke::Deep
                }
                () = tokio::time::sleep(reclaim_in.unwrap_or_default()), if reclaim_in.is_some() => Woke::Deep,
                woke = wake_near(self.near.as_mut(), poll) => woke,
                else => std::future::pending::<Woke>().await,
            };
            self.look_near(woke);
        }
    }

    /// Reads each watched cgroup's usage (and, where it must, its page cache), places its
    /// tripwire, and attaches or detaches the charge programs as some cgroup's working set is
    /// near its level or none is.
    fn look_near(&mut self, woke: Woke) {
        let Some(near) = &mut self.near else {
            return;
        };
        near.looked = true;
        let now = Instant::now();
        let deep = woke == Woke::Deep || near.reclaim;
        if deep {
            near.reclaim = false;
            near.deep_at = Some(now);
        }
        // A fired slot re-arms in the kernel, silently, once usage has fallen below its
        // re-arm level: read the flags back while the programs are on (each look then, every
        // poll interval), so the loop's close watch relaxes again only once it has. The page
        // cache the kernel follows in each slot is read from the same table.
        let mut table = if near.on {
            self.map.get(&0, 0).ok()
        } else {
            None
        };
        // The programs follow the page cache only while on their tracepoint, and the switch
        // puts them there on a thread of its own (and takes them off while a victim dies):
        // the page cache reclaimed between a slot's writing and the attach is missed, and
        // the working set the programs compare is short by it (about one hog chunk at
        // 150 MiB/s, measured: the loop saw crossings before the kernel did). So each time
        // they are found back on, the following slots' counts are read anew; the switch wakes
        // a look as soon as it has attached them (`KernelWatch::attached_again`).
        let attached = near.on && self.kernel_watch.attached();
        if attached && !near.attached {
            if let Some(t) = &mut table {
                reseed_inactive(t, &self.placed, self.page);
                if let Err(e) = self.map.set(0, *t, 0) {
                    tracing::warn!(error = %e, "eBPF: page cache counts not read anew after the attach");
                }
            }
        }
        near.attached = attached;
        if let Some(table) = &table {
            self.kernel_watch.set_armed(
                table.slots[..self.placed.len().min(MAX_THRESHOLDS)]
                    .iter()
                    .map(|s| s.armed == 1),
            );
        }
        let mut any = false;
        for (index, (placed, wire)) in self.placed.iter().zip(near.wires.iter_mut()).enumerate() {
            let level = placed.now.working_set_bytes();
            let Some(usage) = read_usage(&placed.dir) else {
                any = true; // unreadable: stay on, the safe side
                wire.arming = Arming::Near;
                continue;
            };
            let reach = near::reach(wire.rate(), &near.opts);
            let level_bytes = level.unwrap_or(placed.now.usage_bytes);
            // What the kernel follows in the slot, while it follows (a root slot reads the
            // node counters at each check instead).
            let followed = table
                .as_ref()
                .filter(|_| attached && placed.level != 0)
                .and_then(|t| t.slots.get(index))
                .filter(|s| s.follow == 1)
                .map(|s| u64::try_from(s.inactive_pages.max(0)).unwrap_or(0) * self.page);
            let look = Look { on: near.on, deep };
            let inactive = match level {
                None => 0,
                Some(_) => page_cache_now(placed, wire, usage, level_bytes, reach, followed, look),
            };
            wire.inactive = inactive;
            wire.sample(usage.saturating_sub(inactive), now);
            let arming = near::assess(usage, inactive, level_bytes, reach, near.on);
            wire.arming = arming;
            // Placed only while off (see `near`), on a blocking thread. The kernel signals only
            // crossings after a registration lands, so the look its landing wakes reads usage
            // again; until then usage is polled (`Tripwire::polled`), as with no eventfd.
            if !near.on && arming != Arming::Near {
                let tripwire = near::usage_tripwire(arming, level_bytes, reach, inactive);
                wire.place(&placed.dir, tripwire, usage);
            }
            self.kernel_watch.set_arming(
                index,
                ArmingReport {
                    arming,
                    usage_bytes: usage,
                    inactive_file_bytes: inactive,
                    level_bytes,
                    reach_bytes: reach,
                },
            );
            any |= arming == Arming::Near;
        }
        if any == near.on {
            return;
        }
        near.on = any;
        if any {
            // The programs followed no page cache while off: read it anew first, and arm every
            // slot, even one whose working set passed its level while they were off: the next
            // charge then writes the record that wakes the loop.
            for index in 0..self.placed.len() {
                self.placed[index].written = None;
                let level = self.placed[index].now;
                if let Err(e) = self.arm(index, level, true) {
                    tracing::warn!(cgroup = %self.placed[index].cgroup, error = %e, "eBPF usage threshold not rewritten");
                }
            }
        }
        if let Some(near) = &self.near {
            tracing::debug!(near = any, "eBPF: charge programs switched");
            near.switch.near(any);
        }
    }
}

/// How a look was taken: with the programs on, and woken by something that can have moved
/// the page cache (anything but the v2 poll).
#[derive(Clone, Copy)]
struct Look {
    on: bool,
    deep: bool,
}

/// The inactive file pages a look counts for a watched cgroup with a working-set level of
/// `level` bytes and `usage` now: the count the kernel follows (`followed`), else a fresh
/// `memory.stat` reading wherever the last one may be stale, else the last one. Below
/// `level - reach` usage alone says the working set is out of reach, so nothing is read.
fn page_cache_now(
    placed: &Placed,
    wire: &Tripwire,
    usage: u64,
    level: u64,
    reach: u64,
    followed: Option<u64>,
    look: Look,
) -> u64 {
    if !near::is_near(usage, level.saturating_sub(reach), look.on) {
        return wire.inactive;
    }
    if let Some(f) = followed {
        return f;
    }
    // Usage past the tripwire the last reading placed (a charge under the limit, or a v2
    // poll that saw one), the first look within reach, or the programs on (their detach
    // rests on it): read it now.
    let passed = usage >= near::usage_tripwire(Arming::Cached, level, reach, wire.inactive);
    if look.deep || look.on || passed || wire.arming == Arming::Far {
        read_inactive_file(&placed.dir).unwrap_or(0)
    } else {
        wire.inactive
    }
}

/// Sets every following, non-root slot's inactive file count from its cgroup's
/// `memory.stat` now (a root slot reads the node counters at each check and follows nothing).
fn reseed_inactive(table: &mut ThresholdTable, placed: &[Placed], page: u64) {
    for (slot, p) in table.slots.iter_mut().zip(placed) {
        if slot.follow != 1 || p.level == 0 {
            continue;
        }
        if let Some(inactive) = read_inactive_file(&p.dir) {
            slot.inactive_pages = i64::try_from(inactive / page.max(1)).unwrap_or(i64::MAX);
        }
    }
}

/// Waits for a tripwire, the poll or the cache look (never returns without arming near a
/// level). The cache look runs while the programs are off and some cgroup is within reach
/// only by its page cache.
async fn wake_near(near: Option<&mut Near>, poll: bool) -> Woke {
    match near {
        Some(n) => {
            let cached = !n.on && n.wires.iter().any(|w| w.arming == Arming::Cached);
            let cache = cached.then_some(&mut n.cache_tick);
            near::wake(&mut n.wires, &mut n.tick, poll, cache).await
        }
        None => std::future::pending().await,
    }
}

/// Depth of a cgroup path in its hierarchy (`/` = 0, `/kubepods/burstable` = 2).
pub(crate) fn cgroup_level(cgroup: &str) -> u32 {
    let n = Path::new(cgroup)
        .components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The slot for a cgroup at `threshold_bytes`, armed only when usage is below it now: a
/// crossing is a change from below to at-or-above, as with a v1 eventfd.
pub(crate) fn slot_for(
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
        inactive_pages: 0,
        follow: 0,
        near: 0,
    }
}

/// The slot for a cgroup whose working set (usage minus inactive file) is checked against
/// `working_set_bytes`, with `inactive_bytes` of inactive file now (which the programs then
/// follow); armed only when the working set is below the level now.
pub(crate) fn following_slot(
    id: u64,
    level: u32,
    working_set_bytes: u64,
    usage_bytes: Option<u64>,
    inactive_bytes: u64,
    page: u64,
) -> ThresholdSlot {
    let page = page.max(1);
    let working_set = usage_bytes.map(|u| u.saturating_sub(inactive_bytes));
    ThresholdSlot {
        inactive_pages: i64::try_from(inactive_bytes / page).unwrap_or(i64::MAX),
        follow: 1,
        ..slot_for(id, level, working_set_bytes, working_set, page)
    }
}

/// One `key value` line of a `memory.stat` text, the value in bytes.
fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The cgroup's inactive file pages (v1 `total_inactive_file`, v2 `inactive_file` of
/// `memory.stat`, both counting the whole subtree), in bytes.
fn read_inactive_file(dir: &Path) -> Option<u64> {
    let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
    stat_value(&stat, "total_inactive_file").or_else(|| stat_value(&stat, "inactive_file"))
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
    Some(stat_value(&stat, "anon")?.saturating_add(stat_value(&stat, "file")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_near_zone_covers_every_cpu_s_charges_between_two_checks() {
        assert_eq!(id_count("0-1\n"), Some(2));
        assert_eq!(id_count("0-3,8-11"), Some(12));
        assert_eq!(id_count("nonsense"), None);
        // 2 MiB at least; 160 pages (640 KiB) per CPU beyond that.
        assert_eq!(agent_ebpf::charge_near_pages(2), 512);
        assert_eq!(agent_ebpf::charge_near_pages(4), 640);
        assert_eq!(agent_ebpf::charge_near_pages(64), 64 * 160);
        assert_eq!(agent_ebpf::charge_near_pages(u64::MAX), u64::MAX);
    }

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

    #[test]
    fn a_look_reads_the_page_cache_only_where_the_last_reading_may_be_stale() {
        let mib = 1u64 << 20;
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(
            dir.path().join("memory.stat"),
            format!("cache 1\ntotal_inactive_file {}\n", 300 * mib),
        )
        .expect("memory.stat");
        let placed = Placed {
            cgroup: "/kubepods".into(),
            dir: dir.path().to_path_buf(),
            id: 7,
            level: 1,
            now: Level::working_set(400 * mib, 0),
            written: None,
        };
        let mut wire = Tripwire::default();
        wire.inactive = 500 * mib;
        wire.arming = Arming::Cached;
        let (level, reach) = (400 * mib, 64 * mib);
        let shallow = Look {
            on: false,
            deep: false,
        };
        let deep = Look {
            on: false,
            deep: true,
        };
        // Usage out of reach: nothing is read, whatever woke the look.
        assert_eq!(
            page_cache_now(&placed, &wire, 300 * mib, level, reach, None, deep),
            500 * mib
        );
        // The v2 poll, usage within reach but under the last tripwire (336 + 500 MiB).
        assert_eq!(
            page_cache_now(&placed, &wire, 800 * mib, level, reach, None, shallow),
            500 * mib
        );
        // Past it, or a deep look: read now.
        assert_eq!(
            page_cache_now(&placed, &wire, 840 * mib, level, reach, None, shallow),
            300 * mib
        );
        assert_eq!(
            page_cache_now(&placed, &wire, 800 * mib, level, reach, None, deep),
            300 * mib
        );
        // The first look within reach after a far one reads it too.
        wire.arming = Arming::Far;
        assert_eq!(
            page_cache_now(&placed, &wire, 800 * mib, level, reach, None, shallow),
            300 * mib
        );
        // What the kernel follows comes first.
        assert_eq!(
            page_cache_now(
                &placed,
                &wire,
                800 * mib,
                level,
                reach,
                Some(123 * mib),
                deep
            ),
            123 * mib
        );
    }

    #[test]
    fn following_slots_compare_the_working_set() {
        let mib = 1 << 20;
        // Usage 120 MiB with 30 MiB of inactive file: a working set of 90 MiB, below 100.
        let s = following_slot(7, 1, 100 * mib, Some(120 * mib), 30 * mib, 4096);
        assert_eq!((s.follow, s.armed), (1, 1));
        assert_eq!(
            s.threshold_pages,
            100 * 256,
            "the working-set level, not usage"
        );
        assert_eq!(s.inactive_pages, 30 * 256);
        assert_eq!(s.rearm_pages, 96 * 256);
        // The same usage with 10 MiB of inactive file is past it: wait for the next crossing.
        assert_eq!(
            following_slot(7, 1, 100 * mib, Some(120 * mib), 10 * mib, 4096).armed,
            0
        );
        assert_eq!(slot_for(7, 1, 100 * mib, None, 4096).follow, 0);
    }
}
