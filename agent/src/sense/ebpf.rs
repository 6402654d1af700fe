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
//! | `count_memcg_events` | `memcg:count_memcg_events` (pressure items only) | [`Kind::MemcgEvent`] |
//! | `charge_lruvec` | raw tracepoint `mod_memcg_lruvec_state` | [`Kind::ThresholdCrossed`] for a watched cgroup ([`threshold`]) |
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
//! on these nodes) and v2. `memcg:count_memcg_events` carries the memcg id itself. User space
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

pub mod btf;
pub mod cgroup;
pub mod charge_switch;
pub mod record;
pub mod threshold;
pub mod tracefs;

use std::collections::HashMap as StdHashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_ebpf::{layout, CgroupOffsets, Field, ThresholdOffsets};
use aya::maps::{Array, HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::raw_trace_point::RawTracePointLinkId;
use aya::programs::{RawTracePoint, TracePoint};
use aya::{Ebpf, EbpfLoader};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc::Sender;

use self::btf::Btf;
use self::cgroup::CgroupNames;
use self::charge_switch::{ChargeLink, ChargeSwitch, Programs};
use self::record::{comm_str, Record};
use self::threshold::{UsageThresholds, UsageWatch};
use super::{Kind, PressureEvent, Source};

/// The programs, built by `build.rs` from the `agent-ebpf` crate (empty with AYA_BUILD_SKIP).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/agent-ebpf"));

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
        fields: layout::count_memcg_events::ALL,
        raw: false,
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
pub const DEFAULT_MEMCG_ITEMS: [&str; 6] = [
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
}

impl Default for EbpfOptions {
    fn default() -> Self {
        EbpfOptions {
            ring_buffer_bytes: agent_ebpf::DEFAULT_RING_BYTES,
            min_interval: Duration::from_millis(10),
            memcg_items: DEFAULT_MEMCG_ITEMS.iter().map(|s| s.to_string()).collect(),
            drop_check_interval: Duration::from_millis(250),
            usage_thresholds: false,
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

pub use super::monotonic_ns;

/// Kernel facts from BTF: the cgroup-walk offsets and the watched `vm_event_item` numbers.
#[derive(Debug)]
struct KernelFacts {
    offsets: CgroupOffsets,
    /// item number → lower-case name (`pgscan_direct`, as in `/proc/vmstat`).
    items: StdHashMap<u32, String>,
    /// Offsets for the charge programs, or why there are none.
    thresholds: Result<ThresholdOffsets, String>,
    /// Why the facts are incomplete, if they are.
    btf_problem: Option<String>,
}

impl Default for KernelFacts {
    fn default() -> Self {
        KernelFacts {
            offsets: CgroupOffsets::default(),
            items: StdHashMap::new(),
            thresholds: Err("no BTF".into()),
            btf_problem: None,
        }
    }
}

impl KernelFacts {
    fn offsets_valid(&self) -> bool {
        self.offsets.valid == 1
    }
}

fn kernel_facts(wanted_items: &[String]) -> KernelFacts {
    let btf = match Btf::from_kernel() {
        Ok(Ok(btf)) => btf,
        Ok(Err(e)) => {
            return KernelFacts {
                btf_problem: Some(format!("no usable BTF: {e}")),
                ..Default::default()
            }
        }
        Err(e) => {
            return KernelFacts {
                btf_problem: Some(format!("no BTF ({}: {e})", btf::VMLINUX_BTF)),
                ..Default::default()
            }
        }
    };
    let mut facts = KernelFacts {
        thresholds: threshold::offsets(&btf),
        ..Default::default()
    };
    match cgroup_offsets(&btf) {
        Some(offsets) => facts.offsets = offsets,
        None => {
            facts.btf_problem =
                Some("BTF lacks a member of the task->memcg walk (no memory controller?)".into())
        }
    }
    for name in wanted_items {
        if let Some(v) = btf
            .enum_value("vm_event_item", name)
            .and_then(|v| u32::try_from(v).ok())
        {
            facts.items.insert(v, name.to_ascii_lowercase());
        }
    }
    facts
}

/// The offsets of `current->cgroups->subsys[memory_cgrp_id]->cgroup->kn->id`.
fn cgroup_offsets(btf: &Btf) -> Option<CgroupOffsets> {
    Some(CgroupOffsets {
        task_pid: btf.member_offset("task_struct", "pid")?,
        task_cgroups: btf.member_offset("task_struct", "cgroups")?,
        css_set_subsys: btf.member_offset("css_set", "subsys")?,
        memory_cgrp_id: u64::try_from(btf.enum_value("cgroup_subsys_id", "memory_cgrp_id")?)
            .ok()?,
        css_cgroup: btf.member_offset("cgroup_subsys_state", "cgroup")?,
        cgroup_kn: btf.member_offset("cgroup", "kn")?,
        kn_id: btf.member_offset("kernfs_node", "id")?,
        valid: 1,
    })
}

fn check_options(opts: &EbpfOptions) -> Result<(), EbpfError> {
    let size = opts.ring_buffer_bytes;
    if size < 4096 || !size.is_power_of_two() {
        return Err(EbpfError::BadOption(format!(
            "ring_buffer_bytes {size} must be a power of two and at least 4096"
        )));
    }
    if opts.drop_check_interval.is_zero() {
        return Err(EbpfError::BadOption(
            "drop_check_interval must be more than zero".into(),
        ));
    }
    Ok(())
}

fn load_hint(e: &aya::EbpfError) -> String {
    let text = format!("{e}");
    let source = std::error::Error::source(e)
        .map(|s| format!(": {s}"))
        .unwrap_or_default();
    let debug = format!("{e:?}");
    let denied = ["EPERM", "PermissionDenied", "Operation not permitted"];
    if denied.iter().any(|d| debug.contains(d)) {
        format!("{text}{source} (not root? loading needs CAP_BPF and CAP_PERFMON)")
    } else {
        format!("{text}{source}")
    }
}

/// The attached programs and the ring buffer they write to.
pub struct EbpfSource {
    /// Keeps the programs, their links and the other maps alive; the charge programs' links
    /// are the [`ChargeSwitch`]'s to take off and put back.
    _programs: Arc<Mutex<Programs>>,
    /// Pauses the charge programs, when they attached.
    charge_switch: Option<ChargeSwitch>,
    ring: RingBuf<MapData>,
    drops: PerCpuArray<MapData, u64>,
    /// OOM victim pid → memcg id, from the raw `mark_victim` program.
    victims: HashMap<MapData, u32, u64>,
    /// The usage-threshold table, when the charge programs attached.
    usage: Option<UsageThresholds>,
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
    /// Loads the embedded programs and attaches each to its tracepoint.
    ///
    /// Succeeds with whatever subset attached ([`attached`](Self::attached)); each program
    /// that did not is in [`missing`](Self::missing) with the reason (tracefs not mounted,
    /// tracepoint absent or of another layout, no BTF, verifier refusal). Fails only when
    /// nothing can run: no programs in this build, the object cannot be loaded (not root),
    /// or no program attached. Needs Linux 5.8+ (BPF ring buffer).
    pub fn attach(opts: EbpfOptions) -> Result<EbpfSource, EbpfError> {
        check_options(&opts)?;
        if OBJECT.is_empty() {
            return Err(EbpfError::NotBuilt);
        }
        let facts = kernel_facts(&opts.memcg_items);
        let min_interval_ns = u64::try_from(opts.min_interval.as_nanos()).unwrap_or(u64::MAX);
        let mut ebpf = EbpfLoader::new()
            .override_global("CGROUP_OFFSETS", &facts.offsets, true)
            .override_global("MIN_INTERVAL_NS", &min_interval_ns, true)
            .override_global(
                "THRESHOLD_OFFSETS",
                facts
                    .thresholds
                    .as_ref()
                    .unwrap_or(&ThresholdOffsets::zeroed()),
                true,
            )
            .map_max_entries("EVENTS", opts.ring_buffer_bytes)
            .load(OBJECT)
            .map_err(|e| EbpfError::Load {
                reason: load_hint(&e),
            })?;

        let mut missing: Vec<(&'static str, String)> = Vec::new();
        {
            let map = ebpf.map_mut("WATCH_ITEMS").ok_or(EbpfError::Map {
                name: "WATCH_ITEMS",
                reason: "not in the object".into(),
            })?;
            let mut watch: HashMap<&mut MapData, u32, u32> =
                HashMap::try_from(map).map_err(|e| EbpfError::Map {
                    name: "WATCH_ITEMS",
                    reason: e.to_string(),
                })?;
            for item in facts.items.keys() {
                watch.insert(item, 1, 0).map_err(|e| EbpfError::Map {
                    name: "WATCH_ITEMS",
                    reason: e.to_string(),
                })?;
            }
        }

        // The programs' rare diagnostics (a failed read, an unexpected layout), relayed to the
        // agent's log at debug.
        let logger = match aya_log::EbpfLogger::init(&mut ebpf) {
            Ok(logger) => Some(logger),
            Err(e) => {
                tracing::debug!("eBPF: program log not relayed: {e}");
                None
            }
        };

        let root = tracefs::root();
        let mut attached = Vec::new();
        let mut charge_links = Vec::new();
        for spec in TRACEPOINTS {
            let charge = CHARGE_PROGRAMS.contains(&spec.program);
            if charge && !opts.usage_thresholds {
                continue;
            }
            let result = (|| -> Result<Option<RawTracePointLinkId>, String> {
                let root = root
                    .as_deref()
                    .ok_or("tracefs is not mounted (/sys/kernel/tracing)")?;
                tracefs::check_tracepoint(root, spec.category, spec.name, spec.fields)?;
                if spec.program == "count_memcg_events" && facts.items.is_empty() {
                    return Err(match &facts.btf_problem {
                        Some(p) => format!("{p}: cannot number the memcg event items"),
                        None => "none of the configured memcg items exists in this kernel".into(),
                    });
                }
                if charge {
                    if let Err(why) = &facts.thresholds {
                        return Err(format!("{why}: cannot read memcg usage"));
                    }
                } else if spec.raw && !facts.offsets_valid() {
                    return Err(format!(
                        "{}: cannot read the victim's cgroup",
                        facts.btf_problem.as_deref().unwrap_or("no BTF offsets")
                    ));
                }
                let program = ebpf
                    .program_mut(spec.program)
                    .ok_or("program missing from the object")?;
                if spec.raw {
                    let program: &mut RawTracePoint =
                        program.try_into().map_err(|e| format!("{e}"))?;
                    program
                        .load()
                        .map_err(|e| format!("verifier refused it: {e:?}"))?;
                    let link = program
                        .attach(spec.name)
                        .map_err(|e| format!("attach failed: {e}"))?;
                    Ok(Some(link))
                } else {
                    let program: &mut TracePoint =
                        program.try_into().map_err(|e| format!("{e}"))?;
                    program
                        .load()
                        .map_err(|e| format!("verifier refused it: {e:?}"))?;
                    program
                        .attach(spec.category, spec.name)
                        .map_err(|e| format!("attach failed: {e}"))?;
                    Ok(None)
                }
            })();
            match result {
                Ok(link) => {
                    attached.push(spec.program);
                    if let (true, Some(link)) = (charge, link) {
                        charge_links.push(ChargeLink {
                            program: spec.program,
                            tracepoint: spec.name,
                            link: Some(link),
                        });
                    }
                }
                Err(why) => missing.push((spec.program, why)),
            }
        }
        if attached.is_empty() {
            return Err(EbpfError::NothingAttached(missing));
        }
        if let Some(problem) = &facts.btf_problem {
            tracing::warn!(
                "eBPF: {problem}; cgroups resolved from /proc/<pid>/cgroup in user space"
            );
        }

        let take = |ebpf: &mut Ebpf, name: &'static str| {
            ebpf.take_map(name).ok_or(EbpfError::Map {
                name,
                reason: "not in the object".into(),
            })
        };
        let ring = RingBuf::try_from(take(&mut ebpf, "EVENTS")?).map_err(|e| EbpfError::Map {
            name: "EVENTS",
            reason: e.to_string(),
        })?;
        let drops =
            PerCpuArray::try_from(take(&mut ebpf, "DROPS")?).map_err(|e| EbpfError::Map {
                name: "DROPS",
                reason: e.to_string(),
            })?;
        let victims =
            HashMap::try_from(take(&mut ebpf, "VICTIM_CGROUP")?).map_err(|e| EbpfError::Map {
                name: "VICTIM_CGROUP",
                reason: e.to_string(),
            })?;
        let usage = match &facts.thresholds {
            Ok(offsets) if CHARGE_PROGRAMS.iter().any(|p| attached.contains(p)) => {
                let table = Array::try_from(take(&mut ebpf, "THRESHOLDS")?).map_err(|e| {
                    EbpfError::Map {
                        name: "THRESHOLDS",
                        reason: e.to_string(),
                    }
                })?;
                Some(UsageThresholds::new(table, offsets))
            }
            _ => None,
        };
        let charge_attached = !charge_links.is_empty();
        let programs = Arc::new(Mutex::new(Programs {
            ebpf,
            charge: charge_links,
        }));
        let charge_switch = charge_attached
            .then(|| ChargeSwitch::new(&programs))
            .flatten();
        Ok(EbpfSource {
            usage,
            logger,
            _programs: programs,
            charge_switch,
            ring,
            drops,
            victims,
            attached,
            missing,
            items: facts.items,
            in_kernel_cgroups: facts.offsets.valid == 1,
            names: CgroupNames::discover(),
            opts,
        })
    }

    /// The programs that attached.
    pub fn attached(&self) -> Vec<&'static str> {
        self.attached.clone()
    }

    /// The switch that takes the charge programs off their tracepoint while a victim is torn
    /// down (see [`ChargeSwitch`]); `None` when they did not attach.
    pub fn charge_switch(&self) -> Option<ChargeSwitch> {
        self.charge_switch.clone()
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
    pub fn watch_usage(&mut self, watch: UsageWatch) -> Result<String, String> {
        let Some(usage) = &mut self.usage else {
            let why = self
                .missing
                .iter()
                .find(|(p, _)| CHARGE_PROGRAMS.contains(p))
                .map_or_else(
                    || "the charge programs were not asked for".to_string(),
                    |(p, why)| format!("{p}: {why}"),
                );
            return Err(format!(
                "{}: eBPF usage threshold not armed ({why})",
                watch.cgroup
            ));
        };
        let cgroup = watch.cgroup.clone();
        let (described, id) = usage.add(watch)?;
        // Its records then name it from the cache, on the drain path.
        self.names.remember(id, cgroup);
        Ok(described)
    }

    /// Records lost so far because the ring buffer was full (sum over CPUs).
    pub fn drops(&self) -> u64 {
        read_drops(&self.drops)
    }

    /// Reads the ring buffer until `tx` is closed, sending one [`PressureEvent`] per record
    /// and a [`Kind::Dropped`] event whenever the drop counter grew.
    ///
    /// Wakes on the ring buffer's epoll readiness (no polling loop); the drop counter is
    /// checked every [`EbpfOptions::drop_check_interval`]. Each record is handed on as soon
    /// as it is read, its slot given back to the kernel first. The drain does no I/O for a
    /// name: a record whose cgroup is not in the [`cgroup::NameCache`] (a new cgroup, an id
    /// to look up by pid, an OOM victim the kernel could not attribute) goes to a resolver
    /// on a blocking thread, which sends it on once resolved. A full channel blocks the
    /// reader; records that then do not fit in the ring buffer are dropped in the kernel and
    /// counted, so a slow consumer shows up as `Dropped` events rather than as unbounded
    /// memory.
    pub async fn run(self, tx: Sender<PressureEvent>) -> Result<(), EbpfError> {
        let EbpfSource {
            _programs,
            ring,
            drops,
            victims,
            items,
            names,
            opts,
            usage,
            logger,
            ..
        } = self;
        let mut usage = usage;
        let mut logger = match logger {
            // SAFETY: the logger owns its ring buffer's map fd (a `MapData`) and keeps it open,
            // unchanged, for as long as the AsyncFd owns the logger.
            Some(l) => match unsafe { AsyncFd::register_with_interest(l, Interest::READABLE) } {
                Ok(fd) => Some(fd),
                Err(e) => {
                    tracing::debug!("eBPF: program log not relayed: {e}");
                    None
                }
            },
            None => None,
        };
        let cache = names.cache();
        let items = std::sync::Arc::new(items);
        let (slow_tx, slow_rx) = tokio::sync::mpsc::channel::<Slow>(SLOW_QUEUE);
        {
            let (tx, items) = (tx.clone(), items.clone());
            tokio::task::spawn_blocking(move || resolve(slow_rx, names, victims, &items, &tx));
        }
        // SAFETY: the RingBuf owns its map fd (a `MapData`) and keeps it open, unchanged,
        // for as long as the AsyncFd owns the RingBuf.
        let mut ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| EbpfError::Io(e.into()))?;
        let mut tick = tokio::time::interval(opts.drop_check_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The counter starts at 0 when the object loads, so drops before `run` are reported too.
        let mut reported = 0u64;
        loop {
            tokio::select! {
                ready = ring.readable_mut() => {
                    let mut guard = ready?;
                    let pass = monotonic_ns();
                    let mut taken = 0;
                    loop {
                        // The item (a borrow of the ring) is dropped at the end of this
                        // statement, giving its slot back before the event is sent.
                        let Some(decoded) = guard.get_inner_mut().next().map(|i| record::decode(&i))
                        else {
                            guard.clear_ready();
                            break;
                        };
                        taken += 1;
                        match decoded {
                            Ok(rec) => {
                                // Written during this pass: it did not wait for a wake-up.
                                let woke = pass.max(rec.header().at_ns);
                                let mut fast = CacheOnly { cache: &cache, missed: false };
                                let mut event = to_event(&rec, &items, &mut fast);
                                let sent = if fast.missed {
                                    slow_tx.send(Slow { rec, woke }).await.is_ok()
                                } else {
                                    event.woke_ns = Some(woke);
                                    tx.send(event).await.is_ok()
                                };
                                if !sent {
                                    return Ok(());
                                }
                            }
                            Err(e) => tracing::warn!("eBPF: {e}"),
                        }
                        // Let the drop check have its turn under a flood (still ready).
                        if taken >= PASS_RECORDS {
                            break;
                        }
                    }
                }
                () = follow_usage(usage.as_mut()) => {}
                () = flush_log(logger.as_mut()) => {}
                _ = tick.tick() => {
                    let now = read_drops(&drops);
                    if now > reported {
                        let count = now - reported;
                        reported = now;
                        tracing::warn!(count, total = now, "eBPF ring buffer full: events dropped");
                        let event = PressureEvent {
                            at_ns: monotonic_ns(),
                            woke_ns: None,
                            source: Source::Ebpf,
                            cgroup: None,
                            kind: Kind::Dropped { count },
                        };
                        if tx.send(event).await.is_err() {
                            return Ok(());
                        }
                    }
                    if tx.is_closed() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// Moves usage thresholds as their levels move (never returns without any).
async fn follow_usage(usage: Option<&mut UsageThresholds>) {
    match usage {
        Some(u) => u.follow().await,
        None => std::future::pending().await,
    }
}

/// Relays the programs' log records to the agent's log (never returns without a log ring).
async fn flush_log(logger: Option<&mut AsyncFd<aya_log::EbpfLogger<&'static dyn log::Log>>>) {
    let Some(logger) = logger else {
        return std::future::pending().await;
    };
    match logger.readable_mut().await {
        Ok(mut guard) => {
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
        Err(_) => std::future::pending().await,
    }
}

/// Records read in one pass before the drain lets the drop check run.
const PASS_RECORDS: usize = 256;
/// Records that may wait for the resolver before the drain waits for it.
const SLOW_QUEUE: usize = 4096;

/// A record whose cgroup needs I/O to name, for the resolver.
struct Slow {
    rec: Record,
    woke: u64,
}

/// How [`to_event`] names cgroups: from the cache alone on the drain path, with I/O in the
/// resolver.
trait Names {
    /// The path of memory cgroup `id`.
    fn by_id(&mut self, id: u64) -> Option<String>;
    /// The memory cgroup of task `pid`.
    fn by_pid(&mut self, pid: u32) -> Option<String>;
    /// The memcg id the raw `mark_victim` program stored for OOM victim `pid`.
    fn victim(&mut self, pid: u32) -> Option<u64>;
}

/// The drain's names: cache hits only; anything else marks the record for the resolver.
struct CacheOnly<'a> {
    cache: &'a cgroup::NameCache,
    missed: bool,
}

impl Names for CacheOnly<'_> {
    fn by_id(&mut self, id: u64) -> Option<String> {
        let hit = self.cache.get(id);
        self.missed |= hit.is_none() && id != 0;
        hit
    }

    fn by_pid(&mut self, _pid: u32) -> Option<String> {
        self.missed = true;
        None
    }

    fn victim(&mut self, _pid: u32) -> Option<u64> {
        self.missed = true;
        None
    }
}

/// The resolver's names: file handles or a walk, `/proc/<pid>/cgroup`, the victims map.
struct Resolver<'a> {
    names: &'a mut CgroupNames,
    victims: Option<&'a mut HashMap<MapData, u32, u64>>,
}

impl Names for Resolver<'_> {
    fn by_id(&mut self, id: u64) -> Option<String> {
        self.names.by_id(id)
    }

    fn by_pid(&mut self, pid: u32) -> Option<String> {
        self.names.by_pid(pid)
    }

    fn victim(&mut self, pid: u32) -> Option<u64> {
        let victims = self.victims.as_mut()?;
        let id = victims.get(&pid, 0).ok();
        let _ = victims.remove(&pid);
        id
    }
}

/// The resolver: names the records the drain could not and sends them on, until either
/// channel closes. Runs on a blocking thread (it does file I/O and map syscalls).
fn resolve(
    mut rx: tokio::sync::mpsc::Receiver<Slow>,
    mut names: CgroupNames,
    mut victims: HashMap<MapData, u32, u64>,
    items: &StdHashMap<u32, String>,
    tx: &Sender<PressureEvent>,
) {
    while let Some(Slow { rec, woke }) = rx.blocking_recv() {
        let mut full = Resolver {
            names: &mut names,
            victims: Some(&mut victims),
        };
        let mut event = to_event(&rec, items, &mut full);
        event.woke_ns = Some(woke);
        if tx.blocking_send(event).is_err() {
            return;
        }
    }
}

fn read_drops(drops: &PerCpuArray<MapData, u64>) -> u64 {
    match drops.get(&0, 0) {
        Ok(values) => values.iter().copied().fold(0u64, u64::saturating_add),
        Err(e) => {
            tracing::warn!("eBPF: cannot read the drop counter: {e}");
            0
        }
    }
}

/// Turns a decoded record into the agent's event, naming its cgroup through `names` (whose
/// `victim` looks an OOM victim up in the raw tracepoint's map). `woke_ns` is left for the
/// caller.
fn to_event(rec: &Record, items: &StdHashMap<u32, String>, names: &mut dyn Names) -> PressureEvent {
    let header = *rec.header();
    let (cgroup, kind) = match rec {
        Record::Oom(e) => {
            // The kernel put the victim's memcg in the record unless the raw tracepoint had
            // not run yet; only then look in its map (an LRU map: entries left there age out).
            let victims_id = if e.cgroup_from == agent_ebpf::OOM_CGROUP_OF_INVOKER {
                names.victim(header.pid)
            } else {
                Some(header.cgroup_id)
            };
            let cgroup = victims_id
                .and_then(|id| names.by_id(id))
                .or_else(|| names.by_pid(header.pid))
                .or_else(|| names.by_id(header.cgroup_id));
            let rss_kb = e
                .anon_rss_kb
                .saturating_add(e.file_rss_kb)
                .saturating_add(e.shmem_rss_kb);
            let kind = Kind::OomKill {
                pid: Some(header.pid),
                comm: Some(comm_str(&e.comm)),
                rss_bytes: Some(rss_kb.saturating_mul(1024)),
                oom_score_adj: Some(e.oom_score_adj),
            };
            (cgroup, kind)
        }
        Record::Stall(e) => {
            let cgroup = names
                .by_id(header.cgroup_id)
                .or_else(|| names.by_pid(header.pid));
            let kind = Kind::ReclaimStall {
                pid: header.pid,
                duration_ns: e.duration_ns,
                memcg: e.memcg == 1,
                folded: e.folded,
                folded_ns: e.folded_ns,
            };
            (cgroup, kind)
        }
        Record::Memcg(e) => {
            let item = items
                .get(&e.item)
                .cloned()
                .unwrap_or_else(|| format!("item{}", e.item));
            let kind = Kind::MemcgEvent {
                item,
                count: e.count,
            };
            (names.by_id(header.cgroup_id), kind)
        }
        Record::Threshold(e) => {
            // The watched cgroup (remembered when it was armed), not the charged descendant.
            let page = rustix::param::page_size() as u64;
            let kind = Kind::ThresholdCrossed {
                threshold_bytes: Some(e.threshold_pages.saturating_mul(page)),
                usage_bytes: Some(e.usage_pages.saturating_mul(page)),
            };
            (names.by_id(header.cgroup_id), kind)
        }
    };
    PressureEvent {
        at_ns: header.at_ns,
        woke_ns: None,
        source: Source::Ebpf,
        cgroup,
        kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked() {
        assert!(check_options(&EbpfOptions::default()).is_ok());
        for bytes in [0, 1000, 4095, 6144] {
            let opts = EbpfOptions {
                ring_buffer_bytes: bytes,
                ..Default::default()
            };
            let err = check_options(&opts).unwrap_err().to_string();
            assert!(err.contains("ring_buffer_bytes"), "{err}");
        }
        let opts = EbpfOptions {
            drop_check_interval: Duration::ZERO,
            ..Default::default()
        };
        assert!(check_options(&opts).is_err());
    }

    #[test]
    fn threshold_records_name_the_watched_cgroup_in_bytes() {
        let mut cgroups = CgroupNames::new(None);
        cgroups.remember(42, "/kubepods".into());
        let mut names = Resolver {
            names: &mut cgroups,
            victims: None,
        };
        let page = rustix::param::page_size() as u64;
        let rec = Record::Threshold(agent_ebpf::ThresholdEvent {
            header: agent_ebpf::Header {
                at_ns: 5,
                cgroup_id: 42,
                kind: agent_ebpf::KIND_THRESHOLD,
                pid: 9,
            },
            usage_pages: 101,
            threshold_pages: 100,
            charged_cgroup_id: 43,
            slot: 1,
            _pad: 0,
        });
        let ev = to_event(&rec, &StdHashMap::new(), &mut names);
        assert_eq!(ev.cgroup.as_deref(), Some("/kubepods"));
        assert_eq!(ev.at_ns, 5);
        assert_eq!(
            ev.kind,
            Kind::ThresholdCrossed {
                threshold_bytes: Some(100 * page),
                usage_bytes: Some(101 * page),
            }
        );
    }

    #[test]
    fn records_become_events_with_names() {
        let mut cgroups = CgroupNames::new(None);
        let mut names = Resolver {
            names: &mut cgroups,
            victims: None,
        };
        let mut items = StdHashMap::new();
        items.insert(7, "pgscan_direct".to_string());
        let memcg = Record::Memcg(agent_ebpf::MemcgEvent {
            header: agent_ebpf::Header {
                at_ns: 11,
                cgroup_id: 0,
                kind: agent_ebpf::KIND_MEMCG,
                pid: 1,
            },
            item: 7,
            _pad: 0,
            count: 32,
        });
        let ev = to_event(&memcg, &items, &mut names);
        assert_eq!(ev.at_ns, 11);
        assert_eq!(ev.source, Source::Ebpf);
        assert_eq!(
            ev.kind,
            Kind::MemcgEvent {
                item: "pgscan_direct".into(),
                count: 32
            }
        );
        let unknown = Record::Memcg(agent_ebpf::MemcgEvent {
            item: 99,
            ..match memcg {
                Record::Memcg(m) => m,
                _ => unreachable!(),
            }
        });
        let ev = to_event(&unknown, &items, &mut names);
        assert!(matches!(ev.kind, Kind::MemcgEvent { ref item, .. } if item == "item99"));
    }

    #[test]
    fn the_drain_names_from_the_cache_and_hands_misses_on() {
        let mut cgroups = CgroupNames::new(None);
        cgroups.remember(42, "/kubepods/pod1".into());
        let cache = cgroups.cache();
        let stall = |cgroup_id| {
            Record::Stall(agent_ebpf::StallEvent {
                header: agent_ebpf::Header {
                    at_ns: 5,
                    cgroup_id,
                    kind: agent_ebpf::KIND_STALL,
                    pid: 7,
                },
                duration_ns: 1000,
                memcg: 1,
                ..Default::default()
            })
        };
        let items = StdHashMap::new();
        let mut fast = CacheOnly {
            cache: &cache,
            missed: false,
        };
        let ev = to_event(&stall(42), &items, &mut fast);
        assert!(!fast.missed);
        assert_eq!(ev.cgroup.as_deref(), Some("/kubepods/pod1"));
        assert_eq!(
            ev.woke_ns, None,
            "the drain stamps the wake-up, not to_event"
        );
        // An id the cache lacks needs the resolver (a lookup, then `/proc/<pid>/cgroup`).
        let mut fast = CacheOnly {
            cache: &cache,
            missed: false,
        };
        let _ = to_event(&stall(43), &items, &mut fast);
        assert!(fast.missed);
        // An OOM record the kernel attributed needs no map lookup; one it could not does.
        let oom = |from| {
            Record::Oom(agent_ebpf::OomEvent {
                header: agent_ebpf::Header {
                    cgroup_id: 42,
                    kind: agent_ebpf::KIND_OOM,
                    pid: 9,
                    ..Default::default()
                },
                cgroup_from: from,
                ..Default::default()
            })
        };
        let mut fast = CacheOnly {
            cache: &cache,
            missed: false,
        };
        let ev = to_event(&oom(agent_ebpf::OOM_CGROUP_FROM_RAW_TP), &items, &mut fast);
        assert!(!fast.missed);
        assert_eq!(ev.cgroup.as_deref(), Some("/kubepods/pod1"));
        let mut fast = CacheOnly {
            cache: &cache,
            missed: false,
        };
        let _ = to_event(&oom(agent_ebpf::OOM_CGROUP_OF_INVOKER), &items, &mut fast);
        assert!(fast.missed);
    }

    #[test]
    fn monotonic_clock_moves_forward() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0 && b >= a);
    }
}
