//! Types shared by the reactor's eBPF programs (kernel side) and the agent (user side).
//!
//! Everything here is `#[repr(C)]`, `Copy`, with explicit padding and integers instead of
//! `bool`, so both sides agree on the bytes without a serialiser: the kernel writes a record
//! into the ring buffer and user space reads the same struct back. With the `user` feature
//! the types implement [`aya::Pod`] so they can be passed as globals and map values.
//!
//! Every ring-buffer record starts with a [`Header`]; its `kind` says which struct follows.
//!
//! Cgroup attribution: every record carries `cgroup_id`, the id (kernfs inode number) of the
//! **memory** cgroup of the task the kernel was running, found in the kernel by walking
//! `task->cgroups->subsys[memory_cgrp_id]->cgroup->kn->id` with offsets that user space reads
//! from the kernel's BTF and passes in [`CgroupOffsets`]. The same walk works on cgroup v1
//! (the memory hierarchy's directory inode) and v2 (the unified hierarchy's inode). User space
//! maps the id back to a path by the directory inode. OOM records are about the victim, so
//! a raw tracepoint program on `mark_victim` (which gets the victim's `task_struct`) does the
//! same walk for the victim ([`OomEvent::cgroup_from`]). Without BTF the id is 0 and user
//! space falls back to `/proc/<pid>/cgroup`.

#![no_std]

/// Record kind: the OOM killer marked a victim ([`OomEvent`]).
pub const KIND_OOM: u32 = 1;
/// Record kind: a task finished a reclaim stall ([`StallEvent`]).
pub const KIND_STALL: u32 = 2;
/// Record kind: a memcg event counter moved ([`MemcgEvent`]).
pub const KIND_MEMCG: u32 = 3;
/// Record kind: a watched memory cgroup's usage crossed its armed level ([`ThresholdEvent`]).
pub const KIND_THRESHOLD: u32 = 4;

/// How many usage thresholds the programs check ([`ThresholdTable::slots`]).
pub const MAX_THRESHOLDS: usize = 8;
/// How many NUMA nodes' counters a root-cgroup threshold sums ([`ThresholdTable::node_stats`]).
pub const MAX_NODES: usize = 8;

/// Pages a CPU charges between two threshold checks while no armed slot is near its level:
/// the charge programs' cost on a calm charge path is a per-CPU count, not a check.
pub const CHARGE_BATCH_PAGES: u32 = 16;

/// The near zone ([`ThresholdOffsets::near_pages`]) per CPU that may charge: what a CPU can
/// move the page counter by between two batched checks (its 16 pages and a 64-page stock),
/// twice.
pub const CHARGE_NEAR_PAGES_PER_CPU: u64 = 2 * (CHARGE_BATCH_PAGES as u64 + 64);

/// The near zone's floor, pages (2 MiB).
pub const CHARGE_NEAR_PAGES_MIN: u64 = 512;

/// How close to its level (pages of counted usage) an armed slot is near, for `cpus` CPUs:
/// while any slot is, every CPU checks on every page it charges. A batched check can fall
/// after the last page of an allocation burst (the page counter moves in per-CPU stocks of
/// 64 pages, so the stock that crosses the level is often charged a few pages before the
/// burst ends), and the crossing would then wait for the next burst. The zone covers what
/// every CPU can charge between two batched checks, twice, so a check lands in it (and sets
/// the node-wide flag that switches every CPU to checking every page) before any charge can
/// reach the level; it is no wider, because every page charged on the node in it pays the
/// check.
pub const fn charge_near_pages(cpus: u64) -> u64 {
    let zone = CHARGE_NEAR_PAGES_PER_CPU.saturating_mul(cpus);
    if zone < CHARGE_NEAR_PAGES_MIN {
        CHARGE_NEAR_PAGES_MIN
    } else {
        zone
    }
}

/// `vm_event_item` numbers the memcg-event program can watch: bits of [`ItemMask`].
pub const MAX_ITEMS: usize = 256;

/// The watched `vm_event_item`s as a bitmask (item `i` is bit `i % 64` of word `i / 64`), a
/// global of the memcg-event program: the test on every page fault is one load and a mask,
/// where a map lookup costs a helper call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ItemMask {
    /// The bits.
    pub words: [u64; MAX_ITEMS / 64],
}

impl ItemMask {
    /// No item watched.
    pub const fn zeroed() -> Self {
        ItemMask {
            words: [0; MAX_ITEMS / 64],
        }
    }

    /// Watches `item`; `false` when it is past [`MAX_ITEMS`].
    pub fn insert(&mut self, item: u32) -> bool {
        let i = item as usize;
        if i >= MAX_ITEMS {
            return false;
        }
        self.words[i / 64] |= 1 << (i % 64);
        true
    }

    /// Whether `item` is watched.
    #[inline(always)]
    pub fn contains(&self, item: u32) -> bool {
        let i = item as usize;
        i < MAX_ITEMS && self.words[i / 64] & (1 << (i % 64)) != 0
    }
}

/// Length of the kernel's `task_struct.comm`.
pub const COMM_LEN: usize = 16;

/// Default ring-buffer size in bytes (a power-of-two multiple of the page size).
pub const DEFAULT_RING_BYTES: u32 = 256 * 1024;

/// Common start of every ring-buffer record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when the program ran.
    pub at_ns: u64,
    /// Memory cgroup id (kernfs inode) of the task the event is about, 0 if unknown.
    pub cgroup_id: u64,
    /// One of the `KIND_*` constants.
    pub kind: u32,
    /// The pid (kernel thread id) the event is about.
    pub pid: u32,
}

/// `OomEvent::cgroup_from`: `cgroup_id` is the memcg of the task that ran the OOM killer
/// (the cgroup that hit its limit, or an ancestor of it), not necessarily the victim's.
pub const OOM_CGROUP_OF_INVOKER: u32 = 0;
/// `OomEvent::cgroup_from`: the OOM killer ran in the victim itself, so `cgroup_id` is the
/// victim's memcg.
pub const OOM_CGROUP_OF_VICTIM: u32 = 1;
/// `OomEvent::cgroup_from`: `cgroup_id` is the victim's memcg, read from the victim's
/// `task_struct` by the raw tracepoint program.
pub const OOM_CGROUP_FROM_RAW_TP: u32 = 2;

/// `oom:mark_victim`: the OOM killer chose `header.pid`.
///
/// `cgroup_from` says whose memory cgroup `header.cgroup_id` is (`OOM_CGROUP_*`). The raw
/// tracepoint program on the same tracepoint records the victim's own memcg in the
/// `VICTIM_CGROUP` map; when it ran first the id here is already the victim's, otherwise user
/// space looks the victim up in that map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OomEvent {
    /// Common header (`kind` = [`KIND_OOM`], `pid` = the victim).
    pub header: Header,
    /// Victim's total virtual memory, KiB.
    pub total_vm_kb: u64,
    /// Victim's anonymous RSS, KiB.
    pub anon_rss_kb: u64,
    /// Victim's file-backed RSS, KiB.
    pub file_rss_kb: u64,
    /// Victim's shared-memory RSS, KiB.
    pub shmem_rss_kb: u64,
    /// Victim's page-table memory, KiB.
    pub pgtables_kb: u64,
    /// Victim's uid.
    pub uid: u32,
    /// Victim's `oom_score_adj` (-1000..=1000).
    pub oom_score_adj: i32,
    /// Whose memory cgroup `header.cgroup_id` is: one of the `OOM_CGROUP_*` constants.
    pub cgroup_from: u32,
    /// Explicit padding.
    pub _pad: u32,
    /// Victim's command name, NUL-padded.
    pub comm: [u8; COMM_LEN],
}

/// A reclaim stall (`mm_vmscan_{memcg,direct}_reclaim_begin` .. `_end`), timed in the kernel.
///
/// To keep a reclaim storm from flooding the ring buffer, at most one stall per cgroup is
/// written per rate-limit interval; the stalls in between are *folded* into the next record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StallEvent {
    /// Common header (`kind` = [`KIND_STALL`], `pid` = the stalled thread).
    pub header: Header,
    /// How long this stall took, ns.
    pub duration_ns: u64,
    /// Pages reclaimed by this stall.
    pub nr_reclaimed: u64,
    /// Stalls in this cgroup since the previous record that were not written on their own.
    pub folded: u64,
    /// Their total duration, ns.
    pub folded_ns: u64,
    /// 1 for memcg (limit) reclaim, 0 for global direct reclaim.
    pub memcg: u32,
    /// Explicit padding.
    pub _pad: u32,
}

/// `count_memcg_events` for a watched item, aggregated per (cgroup, item) in the kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemcgEvent {
    /// Common header (`kind` = [`KIND_MEMCG`], `cgroup_id` from the tracepoint's memcg id,
    /// `pid` = the task that was running).
    pub header: Header,
    /// The kernel's `enum vm_event_item` value.
    pub item: u32,
    /// Explicit padding.
    pub _pad: u32,
    /// Sum of the counter increments since the previous record for this (cgroup, item).
    pub count: u64,
}

/// A watched memory cgroup's page-counter usage reached its armed level.
///
/// Written by the charge program (raw tracepoint `mod_memcg_lruvec_state`) once per upward
/// crossing: the slot then waits until usage falls below
/// its re-arm level (hysteresis) before it can fire again.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThresholdEvent {
    /// Common header (`kind` = [`KIND_THRESHOLD`], `cgroup_id` = the *watched* cgroup,
    /// `pid` = the task whose charge crossed it).
    pub header: Header,
    /// The watched cgroup's usage when the crossing was seen, in pages.
    pub usage_pages: u64,
    /// The armed level, in pages.
    pub threshold_pages: u64,
    /// The memory cgroup that was charged (the watched one or a descendant of it).
    pub charged_cgroup_id: u64,
    /// Which slot of the [`ThresholdTable`] fired.
    pub slot: u32,
    /// The process (thread-group id) the program sent SIGKILL at the crossing, because it was
    /// charging the crossing page inside the [`StagedVictim`]; 0 when none was sent.
    pub killed_pid: u32,
    /// The inactive file pages the slot counted out of usage at the crossing (0 for a slot
    /// that does not follow them): the working set then was `usage_pages - inactive_pages`,
    /// and `threshold_pages` is the usage level it amounted to (working-set level +
    /// `inactive_pages`).
    pub inactive_pages: u64,
    /// The staged victim's cgroup id when a kill was tried (the one it was for, as the stage
    /// held it at that moment), else 0.
    pub victim_cgroup_id: u64,
    /// `bpf_send_signal`'s result when a kill was tried: 0 sent, a negative errno not sent
    /// (`killed_pid` is then 0).
    pub kill_error: i32,
    /// Explicit padding.
    pub _pad: u32,
}

/// The pod the agent evicts first should a hard memory threshold it watches in the kernel be
/// met now, staged by user space while such a threshold is near ([`StagedVictim::cgroup_id`]
/// 0 = none). When a slot fires and the task charging the crossing page runs in that pod
/// (its memory cgroup's ancestor at `level` has the id), the program sends that process
/// SIGKILL itself, at the crossing, and clears the stage: one kill per staging. User space
/// then completes the eviction (the pod's other processes, its status).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StagedVictim {
    /// The victim pod cgroup's id (kernfs inode of its directory in the memory hierarchy).
    pub cgroup_id: u64,
    /// Its depth (`cgroup.level`).
    pub level: u32,
    /// The [`ThresholdTable`] slots whose crossing may kill (bit `i` = slot `i`): those of
    /// hard thresholds. A soft threshold's slot only wakes user space (its grace period runs
    /// there).
    pub slots: u32,
    /// `CLOCK_MONOTONIC` ns when user space ranked the pods for it.
    pub staged_ns: u64,
    /// How long after `staged_ns` the stage holds: a ranking older than this (a loop that
    /// stopped re-ranking) kills nothing, and the loop decides alone.
    pub max_age_ns: u64,
}

/// One watched cgroup in the [`ThresholdTable`].
///
/// User space fills `cgroup_id`, `level`, `threshold_pages`, `rearm_pages` and `armed`; the
/// programs learn `cgroup_ptr`/`memcg_ptr` the first time they see the cgroup (after checking
/// its id) and flip `armed` on each crossing.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThresholdSlot {
    /// The watched cgroup's id (kernfs inode of its directory); 0 = empty slot.
    pub cgroup_id: u64,
    /// Its depth in its hierarchy (`cgroup.level`: the root is 0).
    pub level: u32,
    /// 1: armed (usage was below the level); 0: fired, waiting for usage to fall below
    /// `rearm_pages`.
    pub armed: u32,
    /// The armed level, pages of `mem_cgroup.memory.usage`.
    pub threshold_pages: u64,
    /// Usage below which a fired slot is armed again.
    pub rearm_pages: u64,
    /// `bpf_ktime_get_ns()` of the last crossing: a slot re-arms no sooner than
    /// `MIN_INTERVAL_NS` after it, so usage hovering at the level cannot flood the ring.
    pub last_fired_ns: u64,
    /// Learned in the kernel: the watched `struct cgroup *` (0 = not seen yet).
    pub cgroup_ptr: u64,
    /// Learned in the kernel: the watched `struct mem_cgroup *`.
    pub memcg_ptr: u64,
    /// For a slot that follows the page cache (`follow` = 1): the watched cgroup's inactive
    /// file pages, written by user space from `memory.stat` when it arms the slot and then
    /// moved by the programs on every `NR_INACTIVE_FILE` update in the cgroup's subtree
    /// (atomically: any CPU may move it). Signed: the snapshot may lag the moves a little.
    pub inactive_pages: i64,
    /// 1: `threshold_pages` and `rearm_pages` are working-set levels (usage minus
    /// `inactive_pages`); 0: usage levels.
    pub follow: u32,
    /// Set by the programs at each check of the slot: 1 while it is armed and its counted
    /// usage is within [`ThresholdOffsets::near_pages`] of its level (every CPU then checks
    /// on every charged page); user space writes 0.
    pub near: u32,
}

/// Every usage threshold, in one array-map value so a charge costs one map lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThresholdTable {
    /// Slots `0..count` are in use.
    pub slots: [ThresholdSlot; MAX_THRESHOLDS],
    /// Learned in the kernel: `&pglist_data.vm_stat[0]` of each NUMA node, for a root-cgroup
    /// slot (the root's usage is the node counters `NR_ANON_MAPPED + NR_FILE_PAGES`, what its
    /// v1 `memory.usage_in_bytes` and v2 `memory.stat` report, not its page counter).
    pub node_stats: [u64; MAX_NODES],
    /// How many slots are in use (0 = the programs return at once).
    pub count: u32,
    /// How many of them follow the page cache (0 = `NR_INACTIVE_FILE` moves return at once).
    pub following: u32,
}

/// Kernel struct offsets (bytes) for the usage-threshold programs, from BTF.
///
/// Passed as the global `THRESHOLD_OFFSETS`; `valid` = 0 keeps the programs idle.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThresholdOffsets {
    /// `mem_cgroup.css` (0 on every kernel so far; read, not assumed).
    pub memcg_css: u64,
    /// `mem_cgroup.memory` + `page_counter.usage`: the usage counter, in pages.
    pub memcg_usage: u64,
    /// `cgroup_subsys_state.cgroup`.
    pub css_cgroup: u64,
    /// `cgroup.level` (an `int`).
    pub cgroup_level: u64,
    /// `cgroup.ancestors` (a flexible array of `struct cgroup *`, `[0..=level]`).
    pub cgroup_ancestors: u64,
    /// `cgroup.subsys` (an array of `struct cgroup_subsys_state *`).
    pub cgroup_subsys: u64,
    /// `enum cgroup_subsys_id::memory_cgrp_id`: index into `cgroup.subsys`.
    pub memory_cgrp_id: u64,
    /// `cgroup.kn`.
    pub cgroup_kn: u64,
    /// `kernfs_node.id`.
    pub kn_id: u64,
    /// `mem_cgroup.nodeinfo` (a flexible array of `struct mem_cgroup_per_node *`).
    pub memcg_nodeinfo: u64,
    /// `mem_cgroup_per_node.lruvec` + `lruvec.pgdat`: the node's `struct pglist_data *`.
    pub per_node_pgdat: u64,
    /// `pglist_data.vm_stat` (an array of `atomic_long_t`, pages).
    pub pgdat_vm_stat: u64,
    /// `enum node_stat_item::NR_ANON_MAPPED`.
    pub nr_anon_mapped: u64,
    /// `enum node_stat_item::NR_FILE_PAGES`.
    pub nr_file_pages: u64,
    /// NUMA nodes to sum for a root-cgroup slot (highest online id + 1); 0 = root slots off.
    pub nr_nodes: u64,
    /// `enum node_stat_item::NR_INACTIVE_FILE`: the page cache the working set leaves out.
    pub nr_inactive_file: u64,
    /// The near zone, pages below an armed level ([`charge_near_pages`] of the possible
    /// CPUs): not an offset, but set with them.
    pub near_pages: u64,
    /// 1 when every offset above was found.
    pub valid: u64,
}

impl ThresholdOffsets {
    /// All zero: the programs stay idle until user space fills the offsets in.
    pub const fn zeroed() -> Self {
        ThresholdOffsets {
            memcg_css: 0,
            memcg_usage: 0,
            css_cgroup: 0,
            cgroup_level: 0,
            cgroup_ancestors: 0,
            cgroup_subsys: 0,
            memory_cgrp_id: 0,
            cgroup_kn: 0,
            kn_id: 0,
            memcg_nodeinfo: 0,
            per_node_pgdat: 0,
            pgdat_vm_stat: 0,
            nr_anon_mapped: 0,
            nr_file_pages: 0,
            nr_nodes: 0,
            nr_inactive_file: 0,
            near_pages: 0,
            valid: 0,
        }
    }
}

/// Kernel struct offsets (bytes) for the in-kernel memory-cgroup walk, from BTF.
///
/// Passed to the programs as the global `CGROUP_OFFSETS`; `valid` = 0 turns the walk off.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupOffsets {
    /// `task_struct.pid` (the thread id, a `pid_t`).
    pub task_pid: u64,
    /// `task_struct.cgroups` (a `struct css_set *`).
    pub task_cgroups: u64,
    /// `css_set.subsys` (an array of `struct cgroup_subsys_state *`).
    pub css_set_subsys: u64,
    /// `enum cgroup_subsys_id::memory_cgrp_id`: index into `css_set.subsys`.
    pub memory_cgrp_id: u64,
    /// `cgroup_subsys_state.cgroup`.
    pub css_cgroup: u64,
    /// `cgroup.kn` (a `struct kernfs_node *`).
    pub cgroup_kn: u64,
    /// `kernfs_node.id` (a `u64`; the inode number on 64-bit kernels).
    pub kn_id: u64,
    /// 1 when every offset above was found.
    pub valid: u64,
}

impl CgroupOffsets {
    /// All zero: the walk is off until user space fills the offsets in.
    pub const fn zeroed() -> Self {
        CgroupOffsets {
            task_pid: 0,
            task_cgroups: 0,
            css_set_subsys: 0,
            memory_cgrp_id: 0,
            css_cgroup: 0,
            cgroup_kn: 0,
            kn_id: 0,
            valid: 0,
        }
    }
}

/// Per-cgroup (or per cgroup+item) state of the in-kernel rate limiter.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateState {
    /// When the last record for this key was written, ns.
    pub last_emit_ns: u64,
    /// Occurrences folded since then (stalls, or counter increments).
    pub pending: u64,
    /// Stall time folded since then, ns (0 for counters).
    pub pending_ns: u64,
}

/// Key of the memcg-event aggregation map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemcgKey {
    /// The memcg id from the tracepoint.
    pub cgroup_id: u64,
    /// The `vm_event_item`.
    pub item: u32,
    /// Explicit padding (always 0, so keys compare bytewise).
    pub _pad: u32,
}

/// One tracepoint field the programs read, checked against the kernel's format file at attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// The field's name in `/sys/kernel/tracing/events/<cat>/<name>/format`.
    pub name: &'static str,
    /// Its byte offset in the record.
    pub offset: usize,
    /// Its size in bytes.
    pub size: usize,
}

/// The tracepoint record layouts the programs were written against (Linux 6.x).
///
/// Rust eBPF has no CO-RE, so the programs use these constant offsets and user space refuses
/// to attach a program whose tracepoint format disagrees (naming the field).
pub mod layout {
    use super::Field;

    /// `oom:mark_victim` fields.
    pub mod mark_victim {
        use super::Field;
        /// Victim pid.
        pub const PID: Field = Field {
            name: "pid",
            offset: 8,
            size: 4,
        };
        /// `__data_loc char[] comm`: low 16 bits offset, high 16 bits length.
        pub const COMM: Field = Field {
            name: "comm",
            offset: 12,
            size: 4,
        };
        /// Total VM, KiB.
        pub const TOTAL_VM: Field = Field {
            name: "total_vm",
            offset: 16,
            size: 8,
        };
        /// Anonymous RSS, KiB.
        pub const ANON_RSS: Field = Field {
            name: "anon_rss",
            offset: 24,
            size: 8,
        };
        /// File RSS, KiB.
        pub const FILE_RSS: Field = Field {
            name: "file_rss",
            offset: 32,
            size: 8,
        };
        /// Shmem RSS, KiB.
        pub const SHMEM_RSS: Field = Field {
            name: "shmem_rss",
            offset: 40,
            size: 8,
        };
        /// Owner uid.
        pub const UID: Field = Field {
            name: "uid",
            offset: 48,
            size: 4,
        };
        /// Page tables, KiB.
        pub const PGTABLES: Field = Field {
            name: "pgtables",
            offset: 56,
            size: 8,
        };
        /// `oom_score_adj` (a `short`).
        pub const OOM_SCORE_ADJ: Field = Field {
            name: "oom_score_adj",
            offset: 64,
            size: 2,
        };
        /// Every field read.
        pub const ALL: &[Field] = &[
            PID,
            COMM,
            TOTAL_VM,
            ANON_RSS,
            FILE_RSS,
            SHMEM_RSS,
            UID,
            PGTABLES,
            OOM_SCORE_ADJ,
        ];
    }

    /// `vmscan:mm_vmscan_{memcg,direct}_reclaim_end` fields.
    pub mod reclaim_end {
        use super::Field;
        /// Pages reclaimed.
        pub const NR_RECLAIMED: Field = Field {
            name: "nr_reclaimed",
            offset: 8,
            size: 8,
        };
        /// Every field read.
        pub const ALL: &[Field] = &[NR_RECLAIMED];
    }

    /// Fields the begin tracepoints need: none (only the time and the current task).
    pub const NONE: &[Field] = &[];
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: each type is `#[repr(C)]`, `Copy`, made of integers and integer arrays only,
    // with every padding byte an explicit field, so any bit pattern is a valid value.
    unsafe impl aya::Pod for super::Header {}
    unsafe impl aya::Pod for super::OomEvent {}
    unsafe impl aya::Pod for super::StallEvent {}
    unsafe impl aya::Pod for super::MemcgEvent {}
    unsafe impl aya::Pod for super::CgroupOffsets {}
    unsafe impl aya::Pod for super::RateState {}
    unsafe impl aya::Pod for super::MemcgKey {}
    unsafe impl aya::Pod for super::ThresholdEvent {}
    unsafe impl aya::Pod for super::ThresholdSlot {}
    unsafe impl aya::Pod for super::ThresholdTable {}
    unsafe impl aya::Pod for super::StagedVictim {}
    unsafe impl aya::Pod for super::ThresholdOffsets {}
    unsafe impl aya::Pod for super::ItemMask {}
}

// The layouts are part of the kernel/user contract: pin their sizes.
const _: () = assert!(core::mem::size_of::<Header>() == 24);
const _: () = assert!(core::mem::size_of::<OomEvent>() == 96);
const _: () = assert!(core::mem::size_of::<StallEvent>() == 64);
const _: () = assert!(core::mem::size_of::<MemcgEvent>() == 40);
const _: () = assert!(core::mem::size_of::<CgroupOffsets>() == 64);
const _: () = assert!(core::mem::size_of::<ThresholdEvent>() == 80);
const _: () = assert!(core::mem::size_of::<StagedVictim>() == 32);
const _: () = assert!(core::mem::size_of::<ThresholdSlot>() == 72);
const _: () =
    assert!(core::mem::size_of::<ThresholdTable>() == 72 * MAX_THRESHOLDS + 8 * MAX_NODES + 8);
const _: () = assert!(core::mem::size_of::<ThresholdOffsets>() == 144);
const _: () = assert!(core::mem::size_of::<ItemMask>() == 32);
