//! Loading the object and attaching its programs: the kernel's facts from BTF (the
//! cgroup-walk offsets, the watched `vm_event_item` numbers, the charge programs' offsets),
//! the loader's globals, and one attach per [`TRACEPOINTS`] row, each failure kept with its
//! reason in [`EbpfSource::missing`] so the rest still run.

use std::collections::HashMap as StdHashMap;
use std::sync::{Arc, Mutex};

use agent_ebpf::{CgroupOffsets, ItemMask, ThresholdOffsets, MAX_ITEMS};
use aya::maps::{Array, HashMap, PerCpuArray, RingBuf};
use aya::programs::raw_trace_point::RawTracePointLinkId;
use aya::programs::{RawTracePoint, TracePoint};
use aya::{Ebpf, EbpfLoader};

use super::btf::{self, Btf};
use super::cgroup::CgroupNames;
use super::charge_switch::{ChargeLink, ChargeSwitch, Programs};
use super::kernel_watch::KernelWatch;
use super::threshold::{self, UsageThresholds};
use super::tracefs;
use super::{EbpfError, EbpfOptions, EbpfSource, CHARGE_PROGRAMS, TRACEPOINTS};

/// The programs, built by `build.rs` from the `agent-ebpf` crate (empty with AYA_BUILD_SKIP).
pub(super) static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/agent-ebpf"));

/// Why one program did not attach: its line in the attach report.
#[derive(Debug, thiserror::Error)]
enum NotAttached {
    /// tracefs, where the tracepoints' formats are checked, is not mounted.
    #[error("tracefs is not mounted (/sys/kernel/tracing)")]
    NoTracefs,
    /// The tracepoint is absent or its record moved.
    #[error(transparent)]
    Tracepoint(#[from] tracefs::TracepointError),
    /// BTF could not give what the program needs.
    #[error("{problem}: cannot {cannot}")]
    Btf {
        /// What BTF lacks.
        problem: String,
        /// What the program then cannot do.
        cannot: &'static str,
    },
    /// None of the memcg event items the program watches exists.
    #[error("none of the configured memcg items exists in this kernel")]
    NoItems,
    /// BTF lacks an offset the charge programs read.
    #[error("{source}: cannot {cannot}")]
    Offsets {
        /// The offset missing.
        source: threshold::OffsetsError,
        /// What the program then cannot do.
        cannot: &'static str,
    },
    /// The object has no such program (agent/object mismatch).
    #[error("program missing from the object")]
    NotInObject,
    /// The program is not of the type its tracepoint needs.
    #[error("{0}")]
    Program(aya::programs::ProgramError),
    /// The verifier refused the program.
    #[error("verifier refused it: {0:?}")]
    Verifier(aya::programs::ProgramError),
    /// The kernel refused to attach it.
    #[error("attach failed: {0}")]
    Attach(aya::programs::ProgramError),
}

/// Kernel facts from BTF: the cgroup-walk offsets and the watched `vm_event_item` numbers.
#[derive(Debug)]
struct KernelFacts {
    offsets: CgroupOffsets,
    /// item number → lower-case name (`pgscan_direct`, as in `/proc/vmstat`).
    items: StdHashMap<u32, String>,
    /// Offsets for the charge programs, or why there are none.
    thresholds: Result<ThresholdOffsets, threshold::OffsetsError>,
    /// Why the facts are incomplete, if they are.
    btf_problem: Option<String>,
}

impl Default for KernelFacts {
    fn default() -> Self {
        KernelFacts {
            offsets: CgroupOffsets::default(),
            items: StdHashMap::new(),
            thresholds: Err(threshold::OffsetsError::NoBtf),
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
        let mut facts = facts;
        if let (Ok(t), Some(pages)) = (facts.thresholds.as_mut(), opts.near_zone_pages) {
            t.near_pages = pages;
        }
        let mut mask = ItemMask::zeroed();
        facts.items.retain(|&item, name| {
            let fits = mask.insert(item);
            if !fits {
                tracing::warn!(
                    item,
                    name = %name,
                    "eBPF: memcg event item not watched: its number is past {MAX_ITEMS}"
                );
            }
            fits
        });
        let mut ebpf = EbpfLoader::new()
            .override_global("CGROUP_OFFSETS", &facts.offsets, true)
            .override_global("MIN_INTERVAL_NS", &min_interval_ns, true)
            .override_global("WATCH_ITEM_MASK", &mask, true)
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
        let mut event_links = Vec::new();
        for spec in TRACEPOINTS {
            let charge = CHARGE_PROGRAMS.contains(&spec.program);
            if charge && !opts.usage_thresholds {
                continue;
            }
            let result = (|| -> Result<Option<RawTracePointLinkId>, NotAttached> {
                let root = root.as_deref().ok_or(NotAttached::NoTracefs)?;
                tracefs::check_tracepoint(root, spec.category, spec.name, spec.fields)?;
                if spec.program == "count_memcg_events" && facts.items.is_empty() {
                    return Err(match &facts.btf_problem {
                        Some(p) => NotAttached::Btf {
                            problem: p.clone(),
                            cannot: "number the memcg event items",
                        },
                        None => NotAttached::NoItems,
                    });
                }
                if charge {
                    if let Err(why) = &facts.thresholds {
                        return Err(NotAttached::Offsets {
                            source: why.clone(),
                            cannot: "read memcg usage",
                        });
                    }
                } else if spec.program == "count_memcg_events" {
                    if let Err(why) = &facts.thresholds {
                        return Err(NotAttached::Offsets {
                            source: why.clone(),
                            cannot: "read the event's cgroup id",
                        });
                    }
                } else if spec.raw && !facts.offsets_valid() {
                    return Err(NotAttached::Btf {
                        problem: facts
                            .btf_problem
                            .clone()
                            .unwrap_or_else(|| "no BTF offsets".to_string()),
                        cannot: "read the victim's cgroup",
                    });
                }
                let program = ebpf
                    .program_mut(spec.program)
                    .ok_or(NotAttached::NotInObject)?;
                if spec.raw {
                    let program: &mut RawTracePoint =
                        program.try_into().map_err(NotAttached::Program)?;
                    program.load().map_err(NotAttached::Verifier)?;
                    let link = program.attach(spec.name).map_err(NotAttached::Attach)?;
                    Ok(Some(link))
                } else {
                    let program: &mut TracePoint =
                        program.try_into().map_err(NotAttached::Program)?;
                    program.load().map_err(NotAttached::Verifier)?;
                    program
                        .attach(spec.category, spec.name)
                        .map_err(NotAttached::Attach)?;
                    Ok(None)
                }
            })();
            match result {
                Ok(link) => {
                    attached.push(spec.program);
                    let gated = spec.program == "count_memcg_events"
                        && opts.memcg_events_on_reclaim.is_some();
                    if let (true, Some(link)) = (charge || gated, link) {
                        let link = ChargeLink {
                            program: spec.program,
                            tracepoint: spec.name,
                            link: Some(link),
                        };
                        if charge {
                            charge_links.push(link);
                        } else {
                            event_links.push(link);
                        }
                    }
                }
                Err(why) => missing.push((spec.program, why.to_string())),
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
        let kernel_watch = KernelWatch::default();
        let usage = match &facts.thresholds {
            Ok(offsets) if CHARGE_PROGRAMS.iter().any(|p| attached.contains(p)) => {
                let table = Array::try_from(take(&mut ebpf, "THRESHOLDS")?).map_err(|e| {
                    EbpfError::Map {
                        name: "THRESHOLDS",
                        reason: e.to_string(),
                    }
                })?;
                Some(UsageThresholds::new(table, offsets, kernel_watch.clone()))
            }
            _ => None,
        };
        let victim_stage = match usage {
            Some(_) => Some(super::stage::VictimStage::new(
                Array::try_from(take(&mut ebpf, "VICTIM")?).map_err(|e| EbpfError::Map {
                    name: "VICTIM",
                    reason: e.to_string(),
                })?,
            )),
            None => None,
        };
        let charge_attached = !charge_links.is_empty();
        let events_switched = !event_links.is_empty();
        let programs = Arc::new(Mutex::new(Programs {
            ebpf,
            charge: charge_links,
            events: event_links,
            paused: false,
            near: true,
            kernel_watch: kernel_watch.clone(),
        }));
        if let Ok(p) = programs.lock() {
            p.tell_watch();
        }
        let switch = (charge_attached || events_switched)
            .then(|| ChargeSwitch::new(&programs, opts.memcg_events_on_reclaim.unwrap_or_default()))
            .flatten();
        let charge_switch = switch.clone().filter(|_| charge_attached);
        let mut usage = usage;
        if let (Some(usage), Some(switch), Some(near)) =
            (&mut usage, &charge_switch, &opts.near_level)
        {
            usage.arm_near(near.clone(), switch.clone());
        }
        Ok(EbpfSource {
            usage,
            victim_stage,
            kernel_watch,
            logger,
            _programs: programs,
            charge_switch,
            events_switch: switch.filter(|_| events_switched),
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
}
