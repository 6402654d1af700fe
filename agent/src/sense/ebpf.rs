//! The eBPF sense source: kernel tracepoints that mean memory pressure, delivered through one
//! BPF ring buffer with the kernel's own `bpf_ktime_get_ns()` timestamp.
//!
//! The programs live in the `agent-ebpf` crate; `build.rs` compiles them and the object is
//! embedded in the `reactor` binary, so there is nothing to install beside it.
//!
//! | program | tracepoint | becomes |
//! | --- | --- | --- |
//! | `oom_victim_cgroup` | raw tracepoint `mark_victim` | the victim's memcg, for the next row |
//! | `oom_mark_victim` | `oom:mark_victim` | [`Kind::OomKill`] |
//! | `{memcg,direct}_reclaim_{begin,end}` | `vmscan:mm_vmscan_{memcg,direct}_reclaim_{begin,end}` | [`Kind::ReclaimStall`] (duration timed in the kernel) |
//! | `count_memcg_events` | raw tracepoint `count_memcg_events` (pressure items only) | [`Kind::MemcgEvent`] |
//! | `charge_lruvec` | raw tracepoint `mod_memcg_lruvec_state` | [`Kind::ThresholdCrossed`] for a watched cgroup ([`threshold`]), with the pid it killed when the staged victim was charging ([`stage`]) |
//!
//! **Cost on a calm node.** `count_memcg_events` is entered on every page fault of every
//! process (the kernel counts `PGFAULT` per memcg through it), so it is a raw tracepoint: no
//! trace record is built for it, and an item that is not watched costs one load and a mask
//! (`WATCH_ITEM_MASK`, a global) before it returns. Even so the kernel's dispatch to it on
//! every fault still costs (bench part 7: 0.98 of the no-eBPF fault rate with it alone on),
//! and the items it watches mean pressure only while memory is reclaimed: with
//! [`EbpfOptions::memcg_events_on_reclaim`] (the agent's setting) it is on its tracepoint
//! only from a reclaim stall until a hold after the last one ([`charge_switch`]). The charge
//! programs attach only near a level ([`near`]). A calm node then runs none of the programs
//! on its page faults. Bench part 7 (`cargo xtask bench --only charge`) reports the fault
//! rate in each state and each program's runs per fault and ns per run.
//!
//! Each program needs its tracepoint with the layout in `agent_ebpf::layout` (checked at
//! attach; `memcg:count_memcg_events` is a recent addition that older kernels lack, and
//! `oom:mark_victim` gained its RSS fields late too): a program whose tracepoint is absent or
//! different is reported in [`EbpfSource::missing`] and the rest run.
//!
//! **Cgroup attribution.** The programs walk
//! `current->cgroups->subsys[memory_cgrp_id]->cgroup->kn->id` in the kernel, with the struct
//! offsets read here from the kernel's BTF and passed in as a global, and record the memory
//! cgroup's id; this works the same on cgroup v1 (memory controller on its own hierarchy, as
//! on these nodes) and v2. `count_memcg_events` reads the id of the memcg it is passed. User space
//! maps the id to a path by the cgroup directory's inode ([`cgroup::CgroupNames`]). For an
//! OOM kill the cgroup that matters is the *victim's*, not that of the task running the OOM
//! killer: a raw tracepoint program on `mark_victim` gets the victim's `task_struct`, does the
//! same walk and stores victim pid → memcg id in a map, which the `oom:mark_victim` program
//! reads into its record, so the id is captured in the kernel before the victim can exit. If
//! that is unavailable the record falls back to the current task's memcg when it is the
//! victim, then to the map as user space sees it, `/proc/<pid>/cgroup`, and the OOM invoker's
//! memcg. Without BTF the walk is off and every lookup goes through `/proc/<pid>/cgroup`.
//!
//! **The drain path.** [`EbpfSource::run`] hands each record on as it reads it, stamped with
//! its wake-up time (`woke_ns`), and names its cgroup from a cache only; a record that needs
//! I/O to be named (an id not cached yet, a pid, the victims map) goes to a resolver on a
//! blocking thread, so a new cgroup never stalls the records behind it.
//!
//! **Flood control.** A kernel-side rate limit allows one stall record per cgroup, and one
//! memcg-event record per (cgroup, item), per [`EbpfOptions::min_interval`]; what happens in
//! between is folded into the next record (`folded`, `count`). Records that still do not fit
//! (`bpf_ringbuf_reserve` fails) are counted in a per-CPU map: [`EbpfSource::drops`] sums it
//! and [`EbpfSource::run`] reports every increase as a [`Kind::Dropped`] event and a warning.
//!
//! **Time base.** `bpf_ktime_get_ns()` is `CLOCK_MONOTONIC`; the detection lag of an event is
//! [`monotonic_ns`]` - at_ns` when the consumer picks it up.
//!
//! **Rooms.** This file holds what the source is (the program table, options, errors, the
//! [`EbpfSource`] handle and its accessors); the work is in the rooms below it:
//! - `load` (private): reads the kernel's facts from BTF, loads the object and attaches each
//!   program ([`EbpfSource::attach`]);
//! - `drain` (private): the ring-buffer reader ([`EbpfSource::run`]) and the resolver that
//!   turns records into [`PressureEvent`]s;
//! - [`threshold`]: the usage-threshold slots the charge programs check;
//! - [`near`]: keeping the charge programs off their tracepoint while no watched cgroup is
//!   near its level;
//! - [`stage`]: the pod the loop would evict first, staged for the charge program to kill at
//!   a hard threshold's crossing;
//! - [`charge_switch`]: taking the charge programs off their tracepoint and back, and the
//!   memcg events program on reclaim;
//! - [`kernel_watch`]: which watched cgroups the kernel checks at their working-set level now;
//! - [`decode`]: decoding ring-buffer records; [`cgroup`]: naming cgroup ids;
//! - [`btf`], [`tracefs`]: reading the kernel's type information and tracepoint formats;
//! - [`stats`]: the kernel's run counts and run times of the programs, for the benches (a
//!   running agent never turns them on); [`floor`]: a bench's near-empty program on the
//!   charge tracepoint, the floor its cost is measured against.
//!
//! ```no_run
//! # async fn demo() -> Result<(), reactor::sense::ebpf::EbpfError> {
//! use reactor::sense::ebpf::{EbpfOptions, EbpfSource};
//! let source = EbpfSource::attach(EbpfOptions::default())?;
//! for (program, why) in source.missing() {
//!     eprintln!("eBPF program {program} not attached: {why}");
//! }
//! let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
//! tokio::spawn(source.run(tx));
//! while let Some(event) = rx.recv().await {
//!     println!("{event:?}");
//! }
//! # Ok(()) }
//! ```

pub(crate) mod btf;
pub mod cgroup;
pub mod charge_switch;
pub mod decode;
mod drain;
pub mod floor;
pub mod kernel_watch;
mod load;
pub mod near;
pub mod stage;
pub mod stats;
pub mod threshold;
pub mod tracefs;

use std::collections::HashMap as StdHashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_ebpf::{layout, Field};
use aya::maps::{HashMap, MapData, PerCpuArray, RingBuf};

use self::cgroup::CgroupNames;
use self::charge_switch::{ChargeSwitch, Programs};
use self::threshold::{UsageThresholds, UsageWatch, UsageWatchError};
#[cfg(doc)]
use super::event::{Kind, PressureEvent};

/// One program and the tracepoint it attaches to.
#[derive(Debug, Clone, Copy)]
pub struct TracepointSpec {
    /// The program's name in the object (its function name in `agent-ebpf`).
    pub program: &'static str,
    /// Tracepoint category (`events/<category>/…`).
    pub category: &'static str,
    /// Tracepoint name.
    pub name: &'static str,
    /// The record fields the program reads, checked against the format file.
    pub fields: &'static [Field],
    /// A raw tracepoint (attached by `name` alone; reads the tracepoint's C arguments).
    pub raw: bool,
}

/// The programs that check usage thresholds on the charge path; attached only when
/// [`EbpfOptions::usage_thresholds`] asks for them (they run on every charge).
pub const CHARGE_PROGRAMS: [&str; 1] = ["charge_lruvec"];

/// Every program the source attaches, in attach order (the raw `mark_victim` program before
/// the classic one so it runs first; stall `begin`s before `end`s).
pub const TRACEPOINTS: [TracepointSpec; 8] = [
    TracepointSpec {
        program: "oom_victim_cgroup",
        category: "oom",
        name: "mark_victim",
        fields: layout::NONE,
        raw: true,
    },
    TracepointSpec {
        program: "oom_mark_victim",
        category: "oom",
        name: "mark_victim",
        fields: layout::mark_victim::ALL,
        raw: false,
    },
    TracepointSpec {
        program: "memcg_reclaim_begin",
        category: "vmscan",
        name: "mm_vmscan_memcg_reclaim_begin",
        fields: layout::NONE,
        raw: false,
    },
    TracepointSpec {
        program: "memcg_reclaim_end",
        category: "vmscan",
        name: "mm_vmscan_memcg_reclaim_end",
        fields: layout::reclaim_end::ALL,
        raw: false,
    },
    TracepointSpec {
        program: "direct_reclaim_begin",
        category: "vmscan",
        name: "mm_vmscan_direct_reclaim_begin",
        fields: layout::NONE,
        raw: false,
    },
    TracepointSpec {
        program: "direct_reclaim_end",
        category: "vmscan",
        name: "mm_vmscan_direct_reclaim_end",
        fields: layout::reclaim_end::ALL,
        raw: false,
    },
    TracepointSpec {
        program: "count_memcg_events",
        category: "memcg",
        name: "count_memcg_events",
        fields: layout::NONE,
        raw: true,
    },
    TracepointSpec {
        program: "charge_lruvec",
        category: "memcg",
        name: "mod_memcg_lruvec_state",
        fields: layout::NONE,
        raw: true,
    },
];

/// The `vm_event_item`s reported by default: scanning and stealing by direct (including
/// memcg limit) reclaim and by kswapd, swap-out, and major faults (refaults under pressure).
pub(crate) const DEFAULT_MEMCG_ITEMS: [&str; 6] = [
    "PGSCAN_DIRECT",
    "PGSTEAL_DIRECT",
    "PGSCAN_KSWAPD",
    "PSWPOUT",
    "ZSWPOUT",
    "PGMAJFAULT",
];

/// How the source is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EbpfOptions {
    /// Ring-buffer size in bytes: a power of two, at least one page (4096).
    pub ring_buffer_bytes: u32,
    /// Kernel-side rate limit: at most one stall record per cgroup and one memcg-event record
    /// per (cgroup, item) per interval; the rest is folded into the next record.
    /// `Duration::ZERO` turns the limit off.
    pub min_interval: Duration,
    /// `vm_event_item` names (as in the kernel's enum) that `count_memcg_events` reports.
    pub memcg_items: Vec<String>,
    /// How often [`EbpfSource::run`] checks the drop counter.
    pub drop_check_interval: Duration,
    /// Attach the charge programs that check usage thresholds in the kernel
    /// ([`CHARGE_PROGRAMS`]); cgroups are then watched with [`EbpfSource::watch_usage`].
    pub usage_thresholds: bool,
    /// Keep the charge programs on their tracepoint only while a watched cgroup is near its
    /// level ([`near`]); `None` keeps them on throughout.
    pub near_level: Option<near::NearLevel>,
    /// Attach `count_memcg_events` only from a reclaim stall until this long after the last
    /// one ([`charge_switch`]); `None` keeps it on throughout.
    pub memcg_events_on_reclaim: Option<Duration>,
    /// How close below an armed level (pages of counted usage) the charge programs check on
    /// every page charged; `None`: [`agent_ebpf::charge_near_pages`] of the possible CPUs,
    /// what the agent runs with. Bench part 7 widens it to hold a workload in the zone.
    pub near_zone_pages: Option<u64>,
}

impl Default for EbpfOptions {
    fn default() -> Self {
        EbpfOptions {
            ring_buffer_bytes: agent_ebpf::DEFAULT_RING_BYTES,
            min_interval: Duration::from_millis(10),
            memcg_items: DEFAULT_MEMCG_ITEMS.iter().map(|s| s.to_string()).collect(),
            drop_check_interval: Duration::from_millis(250),
            usage_thresholds: false,
            near_level: None,
            memcg_events_on_reclaim: None,
            near_zone_pages: None,
        }
    }
}

/// Why the eBPF source could not start at all (per-program failures are in
/// [`EbpfSource::missing`] instead).
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    /// The binary was built with `AYA_BUILD_SKIP`, so it carries no programs.
    #[error("this reactor was built without eBPF programs (AYA_BUILD_SKIP)")]
    NotBuilt,
    /// An option is out of range.
    #[error("bad eBPF option: {0}")]
    BadOption(String),
    /// The object could not be loaded (maps created) — usually not root.
    #[error("cannot load the eBPF object: {reason}")]
    Load {
        /// What went wrong, with a hint when it is a permission problem.
        reason: String,
    },
    /// Loading worked but no program attached.
    #[error("no eBPF program attached: {}", missing_summary(.0))]
    NothingAttached(Vec<(&'static str, String)>),
    /// A map the programs define is missing or of the wrong type (agent/object mismatch).
    #[error("eBPF map {name}: {reason}")]
    Map {
        /// The map.
        name: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Waiting on the ring buffer failed.
    #[error("reading the eBPF ring buffer: {0}")]
    Io(#[from] std::io::Error),
}

fn missing_summary(missing: &[(&'static str, String)]) -> String {
    missing
        .iter()
        .map(|(p, why)| format!("{p}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

pub use super::clock::monotonic_ns;

/// The attached programs and the ring buffer they write to.
pub struct EbpfSource {
    /// Keeps the programs, their links and the other maps alive; the charge programs' links
    /// are the [`ChargeSwitch`]'s to take off and put back.
    _programs: Arc<Mutex<Programs>>,
    /// Pauses the charge programs, when they attached.
    charge_switch: Option<ChargeSwitch>,
    /// Attaches the memcg events program on reclaim, when it is switched.
    events_switch: Option<ChargeSwitch>,
    ring: RingBuf<MapData>,
    drops: PerCpuArray<MapData, u64>,
    /// OOM victim pid → memcg id, from the raw `mark_victim` program.
    victims: HashMap<MapData, u32, u64>,
    /// The usage-threshold table, when the charge programs attached.
    usage: Option<UsageThresholds>,
    /// The staged victim, when the charge programs attached.
    victim_stage: Option<stage::VictimStage>,
    /// Which watched cgroups the kernel checks at their working-set level now (written by
    /// the charge switch, the table's owner and the drain).
    kernel_watch: kernel_watch::KernelWatch,
    /// The programs' log ring (aya-log), when it could be opened.
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    attached: Vec<&'static str>,
    missing: Vec<(&'static str, String)>,
    items: StdHashMap<u32, String>,
    in_kernel_cgroups: bool,
    names: CgroupNames,
    opts: EbpfOptions,
}

impl std::fmt::Debug for EbpfSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EbpfSource")
            .field("attached", &self.attached)
            .field("missing", &self.missing)
            .field("in_kernel_cgroups", &self.in_kernel_cgroups)
            .finish_non_exhaustive()
    }
}

impl EbpfSource {
    /// The programs that attached.
    pub fn attached(&self) -> Vec<&'static str> {
        self.attached.clone()
    }

    /// The switch that takes the charge programs off their tracepoint while a victim is torn
    /// down (see [`ChargeSwitch`]); `None` when they did not attach.
    pub fn charge_switch(&self) -> Option<ChargeSwitch> {
        self.charge_switch.clone()
    }

    /// The switch that attaches the memcg events program on reclaim
    /// ([`EbpfOptions::memcg_events_on_reclaim`]); `None` when it is not switched.
    pub fn events_switch(&self) -> Option<ChargeSwitch> {
        self.events_switch.clone()
    }

    /// Which watched cgroups the kernel checks at their working-set level right now (see
    /// [`kernel_watch`]); watches nothing when the charge programs did not attach.
    pub fn kernel_watch(&self) -> kernel_watch::KernelWatch {
        self.kernel_watch.clone()
    }

    /// Where the loop stages the pod it would evict first, for the charge program to kill at
    /// a hard threshold's crossing ([`stage`]); `None` when the charge programs did not
    /// attach.
    pub(crate) fn victim_stage(&self) -> Option<stage::VictimStage> {
        self.victim_stage.clone()
    }

    /// A duplicate of the ring buffer's fd, to ask without reading it whether a record is
    /// waiting (`POLLIN`): the reactor loop asks before a pass its timer started
    /// ([`crate::sense::Sense::kernel_record_waiting`]). `None` if the fd cannot be duplicated.
    pub(crate) fn ring_probe(&self) -> Option<std::os::fd::OwnedFd> {
        use std::os::fd::AsFd as _;
        self.ring.as_fd().try_clone_to_owned().ok()
    }

    /// The programs that did not attach, each with the reason.
    pub fn missing(&self) -> Vec<(&'static str, String)> {
        self.missing.clone()
    }

    /// Whether cgroups are attributed in the kernel (BTF offsets found) rather than through
    /// `/proc/<pid>/cgroup`.
    pub fn in_kernel_cgroups(&self) -> bool {
        self.in_kernel_cgroups
    }

    /// Has the kernel check `watch`'s usage threshold on every charge: one
    /// [`Kind::ThresholdCrossed`] per upward crossing, re-armed as the level moves. `Ok`
    /// describes the armed watch, `Err` says why it is not (charge programs missing, the
    /// NUMA layout unknown for the root cgroup, no free slot).
    pub fn watch_usage(&mut self, watch: UsageWatch) -> Result<String, UsageWatchError> {
        let Some(usage) = &mut self.usage else {
            let why = self
                .missing
                .iter()
                .find(|(p, _)| CHARGE_PROGRAMS.contains(p))
                .map_or_else(
                    || "the charge programs were not asked for".to_string(),
                    |(p, why)| format!("{p}: {why}"),
                );
            return Err(UsageWatchError::NoChargePrograms {
                cgroup: watch.cgroup,
                why,
            });
        };
        let cgroup = watch.cgroup.clone();
        // The level as given, before the loop moves it: the target's base threshold, which
        // the loop names the hard thresholds' slots by when it stages a victim.
        let base = watch.level.borrow().usage_bytes;
        let (described, id, slot) = usage.add(watch)?;
        if let Some(stage) = &self.victim_stage {
            stage.add_slot(
                slot,
                crate::sense::MemcgTarget {
                    cgroup: cgroup.clone(),
                    threshold_bytes: Some(base),
                },
            );
        }
        // Its records then name it from the cache, on the drain path.
        self.names.remember(id, cgroup);
        Ok(described)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_moves_forward() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0 && b >= a);
    }
}
