//! The reactor's eBPF programs: kernel tracepoints that mean memory pressure, each writing a
//! record stamped with `bpf_ktime_get_ns()` into the one ring buffer `EVENTS`.
//!
//! Built for `bpfel-unknown-none` by `agent/build.rs`; on the host this file is an empty
//! program so the workspace builds without the eBPF toolchain. Minimum kernel: 5.8 (BPF ring
//! buffer); the tracepoint layouts are those of `agent_ebpf::layout`, checked at attach.
//!
//! | program | tracepoint | record |
//! | --- | --- | --- |
//! | `oom_victim_cgroup` | raw tracepoint `mark_victim` | victim's memcg into `VICTIM_CGROUP` |
//! | `oom_mark_victim` | `oom:mark_victim` | `OomEvent` |
//! | `memcg_reclaim_begin` / `_end` | `vmscan:mm_vmscan_memcg_reclaim_{begin,end}` | `StallEvent` |
//! | `direct_reclaim_begin` / `_end` | `vmscan:mm_vmscan_direct_reclaim_{begin,end}` | `StallEvent` |
//! | `count_memcg_events` | raw tracepoint `count_memcg_events` | `MemcgEvent` |
//! | `charge_lruvec` | raw tracepoint `mod_memcg_lruvec_state` | `ThresholdEvent` (and, at a hard threshold's crossing, SIGKILL to the staged victim's charging process) |
//!
//! **Usage thresholds in the kernel.** cgroup v2 has no "usage crossed X" notification and
//! the v1 one needs an eventfd per threshold; the charge programs give both one. The memcg
//! stat tracepoints fire on every charge-side stat update and their raw form passes the
//! `struct mem_cgroup *` itself, so the program reads the watched cgroup's page counter
//! (`mem_cgroup.memory.usage`) directly. A charge in a descendant counts for the watched
//! ancestor: `cgroup.ancestors[level]` finds it in one read, without a loop over parents.
//! Cost on the charge path, which the bench measures: the program returns at once unless the
//! update is an increase of anonymous or file pages (one per charged user page, not the
//! several LRU and slab updates around it), and then only counts pages per CPU until
//! `CHARGE_BATCH_PAGES` have gone by; only then does it look the table up and read usage
//! (three probe reads per watched slot; the ancestor's pointers are learned once, after
//! checking its kernfs id). Within the near zone of an armed level (`charge_near_pages`:
//! 640 KiB per possible CPU, at least 2 MiB) every CPU checks on every page it charges
//! instead (one node-wide flag, set by whichever CPU's check finds a slot near, so a workload
//! moved to another CPU is checked on its first page there): the page counter moves in
//! per-CPU stocks of 64 pages, the stock that crosses
//! the level is charged ahead of the pages that use it, and a
//! batched check could fall after the last page of an allocation burst, leaving the
//! crossing unseen until the next burst (a chunk of the bench's hog, 2.9 ms at 350 MiB/s).
//! One record per upward crossing; a fired slot re-arms only when usage falls below its
//! re-arm level and `MIN_INTERVAL_NS` has passed, so a cgroup hovering at its level cannot
//! flood the ring. A crossing is seen at the first page charged after the page counter
//! passes the level.
//!
//! **Working-set levels.** Eviction compares `usage - inactive_file`, and a usage level
//! placed from user space goes stale as the page cache moves. A slot with `follow` set keeps
//! the cgroup's inactive file count itself: the same tracepoint reports every
//! `NR_INACTIVE_FILE` move, and the program adds each one in the watched subtree to the
//! slot (an atomic add: any CPU may move it), so the check compares `usage - inactive`
//! against a fixed working-set level. The inactive moves only follow; a check runs on charges
//! alone, because truncation takes a batch of folios off the LRU before it uncharges them and
//! `usage - inactive` overstates the working set in between.

//!
//! **Killing at the crossing.** User space may stage the pod it would evict first
//! (`VICTIM`, an [`agent_ebpf::StagedVictim`]) with the slots of hard thresholds. When such a
//! slot fires and the task charging the crossing page runs inside that pod, the program
//! sends its process SIGKILL (`bpf_send_signal`) before it writes the record, which carries
//! the pid, and clears the stage. A stage older than its `max_age_ns` kills nothing. Nothing
//! of it runs before the crossing: one map lookup and the current task's cgroup walk run at
//! the crossing itself, once per record.

#![cfg_attr(target_arch = "bpf", no_std, no_main)]
// The BPF target has no `fetch_add` on its atomics (`target_has_atomic` is off), but the
// instruction set has an atomic add: the intrinsic emits it.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(target_arch = "bpf")]
mod programs {
    use core::intrinsics::AtomicOrdering;

    use agent_ebpf::{
        layout, CgroupOffsets, Header, ItemMask, MemcgEvent, MemcgKey, OomEvent, RateState,
        StagedVictim, StallEvent, ThresholdEvent, ThresholdOffsets, ThresholdSlot, ThresholdTable,
        CHARGE_BATCH_PAGES, COMM_LEN, DEFAULT_RING_BYTES, KIND_MEMCG, KIND_OOM, KIND_STALL,
        KIND_THRESHOLD, MAX_ITEMS, MAX_NODES, MAX_THRESHOLDS, OOM_CGROUP_FROM_RAW_TP,
        OOM_CGROUP_OF_INVOKER, OOM_CGROUP_OF_VICTIM,
    };
    use aya_ebpf::{
        helpers::{
            bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns,
            bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes, bpf_send_signal,
        },
        macros::{map, raw_tracepoint, tracepoint},
        maps::{Array, LruHashMap, PerCpuArray, RingBuf},
        programs::{RawTracePointContext, TracePointContext},
        EbpfContext,
    };
    use aya_log_ebpf::debug;

    /// Offsets for the memory-cgroup walk, set by user space from BTF.
    #[unsafe(no_mangle)]
    static CGROUP_OFFSETS: CgroupOffsets = CgroupOffsets::zeroed();

    /// Minimum time between two records for the same cgroup (stalls) or cgroup+item (memcg
    /// events); what happens in between is folded into the next record. 0 = no limit.
    #[unsafe(no_mangle)]
    static MIN_INTERVAL_NS: u64 = 0;

    /// The one ring buffer every program writes to (size overridable by user space).
    #[map]
    static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);

    /// Records lost because `EVENTS` was full, per CPU (index 0).
    #[map]
    static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

    /// Start of a reclaim in progress: key = thread id | (1 << 32 for memcg reclaim). LRU, so
    /// a begin whose end never came (a task that died in reclaim) ages out instead of filling
    /// the map.
    #[map]
    static STALL_START: LruHashMap<u64, u64> = LruHashMap::with_max_entries(16384, 0);

    /// Rate-limiter state for stall records, per memory cgroup id.
    #[map]
    static STALL_RATE: LruHashMap<u64, RateState> = LruHashMap::with_max_entries(8192, 0);

    /// Rate-limiter state for memcg-event records, per (cgroup, item).
    #[map]
    static MEMCG_RATE: LruHashMap<MemcgKey, RateState> = LruHashMap::with_max_entries(16384, 0);

    /// OOM victim thread id → its memory cgroup id, written by `oom_victim_cgroup`.
    #[map]
    static VICTIM_CGROUP: LruHashMap<u32, u64> = LruHashMap::with_max_entries(1024, 0);

    /// The `vm_event_item`s that mean pressure (set by user space from BTF names): a global
    /// bitmask, so the test on every page fault (`PGFAULT` goes through the same tracepoint)
    /// is a load and a mask, not a map lookup.
    #[unsafe(no_mangle)]
    static WATCH_ITEM_MASK: ItemMask = ItemMask::zeroed();

    /// Offsets for the usage-threshold programs, set by user space from BTF.
    #[unsafe(no_mangle)]
    static THRESHOLD_OFFSETS: ThresholdOffsets = ThresholdOffsets::zeroed();

    /// The watched cgroups and their armed levels: one value (index 0), written by user
    /// space, whose `armed`/learned fields the charge programs update.
    #[map]
    static THRESHOLDS: Array<ThresholdTable> = Array::with_max_entries(1, 0);

    /// The pod to evict first should a watched hard memory threshold be met now (index 0),
    /// staged by user space; the charge program kills its process at the crossing when that
    /// process is the one charging, and clears it (see `kill_staged`).
    #[map]
    static VICTIM: Array<StagedVictim> = Array::with_max_entries(1, 0);

    /// Per CPU: the user pages charged on it since its last threshold check.
    #[map]
    static CHARGE_PENDING: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

    /// 1 while an armed slot is near its level, by the last check on any CPU: then every CPU
    /// checks on every page it charges. One flag for the node, not one per CPU: a workload
    /// the scheduler moves to a CPU that has not checked since the near zone began must still
    /// be checked on its first page there (with a per-CPU flag such a CPU waited out its
    /// batch, up to 15 pages past the crossing). Written only when it changes, so the cache
    /// line is not bounced between CPUs on every check.
    #[unsafe(no_mangle)]
    static mut CHARGE_NEAR: u32 = 0;

    const MEMCG_FLAG: u64 = 1 << 32;

    #[inline(always)]
    fn min_interval() -> u64 {
        // SAFETY: a plain read of a global the loader may have rewritten; volatile so the
        // compiler does not fold the initial value in.
        unsafe { core::ptr::read_volatile(&MIN_INTERVAL_NS) }
    }

    #[inline(always)]
    fn count_drop() {
        if let Some(slot) = DROPS.get_ptr_mut(0) {
            // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
            unsafe { *slot += 1 };
        }
    }

    #[inline(always)]
    fn read_ptr(base: u64, offset: u64) -> Option<u64> {
        if base == 0 {
            return None;
        }
        // SAFETY: bpf_probe_read_kernel checks the address; a bad one returns an error.
        unsafe { bpf_probe_read_kernel((base + offset) as *const u64) }.ok()
    }

    #[inline(always)]
    fn offsets() -> CgroupOffsets {
        // SAFETY: see `min_interval`.
        unsafe { core::ptr::read_volatile(&CGROUP_OFFSETS) }
    }

    /// The `struct cgroup *` of `task`'s (a `struct task_struct *`) memory cgroup, or `None`
    /// when the walk is off or fails.
    #[inline(always)]
    fn memcg_cgroup_of(task: u64, o: &CgroupOffsets) -> Option<u64> {
        if o.valid == 0 {
            return None;
        }
        read_ptr(task, o.task_cgroups)
            .and_then(|cset| read_ptr(cset, o.css_set_subsys + 8 * o.memory_cgrp_id))
            .and_then(|css| read_ptr(css, o.css_cgroup))
    }

    /// The memory cgroup id of `task` (a `struct task_struct *`), or 0 when the walk is off
    /// or fails.
    #[inline(always)]
    fn memcg_id_of(task: u64, o: &CgroupOffsets) -> u64 {
        memcg_cgroup_of(task, o)
            .and_then(|cgrp| read_ptr(cgrp, o.cgroup_kn))
            .and_then(|kn| read_ptr(kn, o.kn_id))
            .unwrap_or(0)
    }

    /// The memory cgroup id of the current task, or 0.
    #[inline(always)]
    fn current_memcg_id() -> u64 {
        // SAFETY: the helper returns the current task pointer; it is only read through
        // bpf_probe_read_kernel.
        let task = unsafe { bpf_get_current_task() };
        memcg_id_of(task, &offsets())
    }

    #[inline(always)]
    fn current_tid() -> u32 {
        bpf_get_current_pid_tgid() as u32
    }

    #[inline(always)]
    fn now() -> u64 {
        // SAFETY: no preconditions.
        unsafe { bpf_ktime_get_ns() }
    }

    /// Raw tracepoint `mark_victim` (arg 0: the victim's `struct task_struct *`): records the
    /// victim's own memory cgroup, which the classic tracepoint cannot see, before the victim
    /// can exit. Attached before `oom_mark_victim` so it normally runs first.
    #[raw_tracepoint(tracepoint = "mark_victim")]
    pub fn oom_victim_cgroup(ctx: RawTracePointContext) -> i32 {
        let task: u64 = ctx.arg(0);
        let o = offsets();
        if o.valid == 0 {
            return 0;
        }
        // SAFETY: bpf_probe_read_kernel checks the address.
        let Ok(pid) = (unsafe { bpf_probe_read_kernel((task + o.task_pid) as *const i32) }) else {
            return 0;
        };
        let id = memcg_id_of(task, &o);
        if id != 0 {
            let _ = VICTIM_CGROUP.insert(&(pid as u32), &id, 0);
        }
        0
    }

    /// `oom:mark_victim`: the OOM killer chose a victim.
    #[tracepoint(category = "oom", name = "mark_victim")]
    pub fn oom_mark_victim(ctx: TracePointContext) -> u32 {
        match try_oom_mark_victim(&ctx) {
            Ok(()) | Err(_) => 0,
        }
    }

    fn try_oom_mark_victim(ctx: &TracePointContext) -> Result<(), i32> {
        use layout::mark_victim as f;
        let at_ns = now();
        // SAFETY: offsets checked against the tracepoint's format file before attaching.
        let (pid, loc, total_vm, anon, file, shmem, uid, pgtables, adj) = unsafe {
            (
                ctx.read_at::<i32>(f::PID.offset)?,
                ctx.read_at::<u32>(f::COMM.offset)?,
                ctx.read_at::<u64>(f::TOTAL_VM.offset)?,
                ctx.read_at::<u64>(f::ANON_RSS.offset)?,
                ctx.read_at::<u64>(f::FILE_RSS.offset)?,
                ctx.read_at::<u64>(f::SHMEM_RSS.offset)?,
                ctx.read_at::<u32>(f::UID.offset)?,
                ctx.read_at::<u64>(f::PGTABLES.offset)?,
                ctx.read_at::<i16>(f::OOM_SCORE_ADJ.offset)?,
            )
        };
        let mut comm = [0u8; COMM_LEN];
        let comm_at = (ctx.as_ptr() as u64) + u64::from(loc & 0xffff);
        // SAFETY: __data_loc points inside the trace record; the helper bounds the copy.
        let _ = unsafe { bpf_probe_read_kernel_str_bytes(comm_at as *const u8, &mut comm) };
        let victim = pid as u32;
        // SAFETY: the value is copied out at once.
        let (cgroup_id, cgroup_from) = match unsafe { VICTIM_CGROUP.get(&victim) } {
            Some(id) => (*id, OOM_CGROUP_FROM_RAW_TP),
            None if current_tid() == victim => (current_memcg_id(), OOM_CGROUP_OF_VICTIM),
            None => (current_memcg_id(), OOM_CGROUP_OF_INVOKER),
        };
        let Some(mut entry) = EVENTS.reserve::<OomEvent>(0) else {
            count_drop();
            return Ok(());
        };
        entry.write(OomEvent {
            header: Header {
                at_ns,
                cgroup_id,
                kind: KIND_OOM,
                pid: victim,
            },
            total_vm_kb: total_vm,
            anon_rss_kb: anon,
            file_rss_kb: file,
            shmem_rss_kb: shmem,
            pgtables_kb: pgtables,
            uid,
            oom_score_adj: i32::from(adj),
            cgroup_from,
            _pad: 0,
            comm,
        });
        entry.submit(0);
        Ok(())
    }

    fn reclaim_begin(memcg: u64) -> u32 {
        let key = u64::from(current_tid()) | memcg;
        let _ = STALL_START.insert(&key, &now(), 0);
        0
    }

    /// `vmscan:mm_vmscan_memcg_reclaim_begin`: a task starts limit reclaim in its memcg.
    #[tracepoint(category = "vmscan", name = "mm_vmscan_memcg_reclaim_begin")]
    pub fn memcg_reclaim_begin(_ctx: TracePointContext) -> u32 {
        reclaim_begin(MEMCG_FLAG)
    }

    /// `vmscan:mm_vmscan_direct_reclaim_begin`: a task starts global direct reclaim.
    #[tracepoint(category = "vmscan", name = "mm_vmscan_direct_reclaim_begin")]
    pub fn direct_reclaim_begin(_ctx: TracePointContext) -> u32 {
        reclaim_begin(0)
    }

    /// `vmscan:mm_vmscan_memcg_reclaim_end`.
    #[tracepoint(category = "vmscan", name = "mm_vmscan_memcg_reclaim_end")]
    pub fn memcg_reclaim_end(ctx: TracePointContext) -> u32 {
        match reclaim_end(&ctx, MEMCG_FLAG) {
            Ok(()) | Err(_) => 0,
        }
    }

    /// `vmscan:mm_vmscan_direct_reclaim_end`.
    #[tracepoint(category = "vmscan", name = "mm_vmscan_direct_reclaim_end")]
    pub fn direct_reclaim_end(ctx: TracePointContext) -> u32 {
        match reclaim_end(&ctx, 0) {
            Ok(()) | Err(_) => 0,
        }
    }

    fn reclaim_end(ctx: &TracePointContext, memcg: u64) -> Result<(), i32> {
        let at_ns = now();
        let tid = current_tid();
        let key = u64::from(tid) | memcg;
        // SAFETY: the value is copied out before the entry is removed.
        let Some(start) = (unsafe { STALL_START.get(&key) }).copied() else {
            return Ok(()); // began before we attached
        };
        let _ = STALL_START.remove(&key);
        let duration_ns = at_ns.saturating_sub(start);
        // SAFETY: offset checked against the format file before attaching.
        let nr_reclaimed: u64 =
            unsafe { ctx.read_at(layout::reclaim_end::NR_RECLAIMED.offset) }.unwrap_or(0);
        let cgroup_id = current_memcg_id();

        let (folded, folded_ns) = match STALL_RATE.get_ptr_mut(&cgroup_id) {
            Some(state) => {
                // SAFETY: a map value pointer; concurrent updates from two CPUs for the same
                // cgroup may lose a fold count, which only makes the folded figure approximate.
                let s = unsafe { &mut *state };
                if at_ns.saturating_sub(s.last_emit_ns) < min_interval() {
                    s.pending += 1;
                    s.pending_ns += duration_ns;
                    return Ok(());
                }
                let out = (s.pending, s.pending_ns);
                s.pending = 0;
                s.pending_ns = 0;
                s.last_emit_ns = at_ns;
                out
            }
            None => {
                let fresh = RateState {
                    last_emit_ns: at_ns,
                    pending: 0,
                    pending_ns: 0,
                };
                let _ = STALL_RATE.insert(&cgroup_id, &fresh, 0);
                (0, 0)
            }
        };

        let Some(mut entry) = EVENTS.reserve::<StallEvent>(0) else {
            count_drop();
            return Ok(());
        };
        entry.write(StallEvent {
            header: Header {
                at_ns,
                cgroup_id,
                kind: KIND_STALL,
                pid: tid,
            },
            duration_ns,
            nr_reclaimed,
            folded,
            folded_ns,
            memcg: (memcg >> 32) as u32,
            _pad: 0,
        });
        entry.submit(0);
        Ok(())
    }

    /// Raw tracepoint `count_memcg_events(memcg, item, val)`: a memcg event counter moved;
    /// only watched items count. Entered on every page fault (`PGFAULT`), so it is a raw
    /// tracepoint (no trace record is built for it) and an unwatched item costs one load and a
    /// mask before it returns.
    #[raw_tracepoint(tracepoint = "count_memcg_events")]
    pub fn count_memcg_events(ctx: RawTracePointContext) -> i32 {
        let item: u64 = ctx.arg(1);
        let item = item as u32;
        if item as usize >= MAX_ITEMS {
            return 0;
        }
        // SAFETY: a plain read of one word of a global the loader may have rewritten; volatile
        // so the compiler does not fold the initial (empty) mask in.
        let word =
            unsafe { core::ptr::read_volatile(&WATCH_ITEM_MASK.words[(item / 64) as usize & 3]) };
        if word & (1u64 << (item % 64)) == 0 {
            return 0;
        }
        let memcg: u64 = ctx.arg(0);
        let val: u64 = ctx.arg(2);
        let o = threshold_offsets();
        let cgroup_id = read_ptr(memcg, o.memcg_css + o.css_cgroup)
            .map(|cgrp| cgroup_id_of(cgrp, &o))
            .unwrap_or(0);
        memcg_event(cgroup_id, item, val);
        0
    }

    /// Writes (or folds) one record for a watched memcg event.
    fn memcg_event(cgroup_id: u64, item: u32, val: u64) {
        let at_ns = now();
        let key = MemcgKey {
            cgroup_id,
            item,
            _pad: 0,
        };
        let count = match MEMCG_RATE.get_ptr_mut(&key) {
            Some(state) => {
                // SAFETY: see reclaim_end: races only make the count approximate.
                let s = unsafe { &mut *state };
                if at_ns.saturating_sub(s.last_emit_ns) < min_interval() {
                    s.pending += val;
                    return;
                }
                let count = s.pending + val;
                s.pending = 0;
                s.last_emit_ns = at_ns;
                count
            }
            None => {
                let fresh = RateState {
                    last_emit_ns: at_ns,
                    pending: 0,
                    pending_ns: 0,
                };
                let _ = MEMCG_RATE.insert(&key, &fresh, 0);
                val
            }
        };
        let Some(mut entry) = EVENTS.reserve::<MemcgEvent>(0) else {
            count_drop();
            return;
        };
        entry.write(MemcgEvent {
            header: Header {
                at_ns,
                cgroup_id,
                kind: KIND_MEMCG,
                pid: current_tid(),
            },
            item,
            _pad: 0,
            count,
        });
        entry.submit(0);
    }

    #[inline(always)]
    fn threshold_offsets() -> ThresholdOffsets {
        // SAFETY: see `min_interval`.
        unsafe { core::ptr::read_volatile(&THRESHOLD_OFFSETS) }
    }

    /// Raw tracepoint `mod_memcg_lruvec_state(memcg, item, val)`: per-node memcg stats move;
    /// an increase of `NR_ANON_MAPPED` or `NR_FILE_PAGES` is a user page charged, and an
    /// `NR_INACTIVE_FILE` move is page cache entering or leaving what the working set leaves
    /// out.
    #[raw_tracepoint(tracepoint = "mod_memcg_lruvec_state")]
    pub fn charge_lruvec(ctx: RawTracePointContext) -> i32 {
        check_thresholds(&ctx);
        0
    }

    /// Does nothing. Never attached by the agent: bench part 7 attaches it alone to measure
    /// what the kernel's dispatch to a program on this tracepoint costs by itself, the floor
    /// under `charge_lruvec`.
    #[raw_tracepoint(tracepoint = "mod_memcg_lruvec_state")]
    pub fn lruvec_floor(_ctx: RawTracePointContext) -> i32 {
        0
    }

    /// Checks every armed slot that `memcg` (arg 0) is inside of, once per
    /// `CHARGE_BATCH_PAGES` user pages charged on this CPU, or on every one while
    /// `CHARGE_NEAR` is set (arg 1 the item, arg 2 the pages); moves the following slots'
    /// inactive file count on every `NR_INACTIVE_FILE` update.
    #[inline(always)]
    fn check_thresholds(ctx: &RawTracePointContext) {
        let val: u64 = ctx.arg(2);
        let val = val as i32;
        let item: u64 = ctx.arg(1);
        let item = u64::from(item as u32);
        // Only the three item numbers on every entry (most entries end here); the whole
        // offsets global is copied once per batch, below.
        // SAFETY: plain reads of a global the loader may have rewritten; volatile so the
        // compiler does not fold the initial values in.
        let (anon, file, inactive) = unsafe {
            (
                core::ptr::read_volatile(&THRESHOLD_OFFSETS.nr_anon_mapped),
                core::ptr::read_volatile(&THRESHOLD_OFFSETS.nr_file_pages),
                core::ptr::read_volatile(&THRESHOLD_OFFSETS.nr_inactive_file),
            )
        };
        if item == inactive {
            // Only followed here, never checked: page cache leaves the LRU before it is
            // uncharged (truncation frees a batch of folios, then uncharges them), so between
            // the two `usage - inactive` overstates the working set by up to the batch. A rise
            // of the working set without a charge (activation) is seen at the next charge.
            if val != 0 {
                follow_inactive(ctx, val);
            }
            return;
        }
        if val <= 0 || (item != anon && item != file) {
            return;
        }
        let Some(pending) = CHARGE_PENDING.get_ptr_mut(0) else {
            return;
        };
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
        let pending = unsafe { &mut *pending };
        *pending = pending.saturating_add(val as u32);
        // SAFETY: an aligned u32 global that any CPU may write; a plain load sees one value
        // or the other, and either is safe (a stale 0 checks at the batch, as before a
        // near zone).
        let near = unsafe { core::ptr::read_volatile(&raw const CHARGE_NEAR) };
        if near == 0 && *pending < CHARGE_BATCH_PAGES {
            return;
        }
        *pending = 0;
        let now_near = u32::from(check_slots(ctx));
        if now_near != near {
            // SAFETY: as above; two CPUs writing at once leave one's answer, and the next
            // check on any CPU corrects it.
            unsafe { core::ptr::write_volatile(&raw mut CHARGE_NEAR, now_near) };
        }
    }

    /// The check itself: every armed slot that `memcg` (arg 0) is inside of. Returns whether
    /// any armed slot is near its level after it (its own last check said so).
    #[inline(always)]
    fn check_slots(ctx: &RawTracePointContext) -> bool {
        let o = threshold_offsets();
        if o.valid == 0 {
            return false;
        }
        let Some(table) = THRESHOLDS.get_ptr_mut(0) else {
            return false;
        };
        // SAFETY: an array-map value; two CPUs may update a slot at once, which at worst
        // reports one crossing twice or re-learns a pointer.
        let table = unsafe { &mut *table };
        let count = table.count as usize;
        if count == 0 {
            return false;
        }
        let memcg: u64 = ctx.arg(0);
        let Some(cgrp) = read_ptr(memcg, o.memcg_css + o.css_cgroup) else {
            return false;
        };
        // SAFETY: bpf_probe_read_kernel checks the address.
        let Ok(level) = (unsafe { bpf_probe_read_kernel((cgrp + o.cgroup_level) as *const i32) })
        else {
            return false;
        };
        if level < 0 {
            debug!(
                ctx,
                "threshold: cgroup level {} < 0: unexpected layout", level
            );
            return false;
        }
        let level = level as u32;
        let at_ns = now();
        for i in 0..MAX_THRESHOLDS {
            if i >= count {
                break;
            }
            let slot = table.slots[i];
            if slot.cgroup_id == 0 || level < slot.level {
                continue;
            }
            let (usage, node_inactive, ancestor) = if slot.level == 0 {
                // Every memcg is inside the root: its usage is the node counters.
                match node_usage(&mut table.node_stats, memcg, &o) {
                    Some((usage, inactive)) => (usage, inactive, 0),
                    None => continue,
                }
            } else {
                let Some(ancestor) = read_ptr(cgrp, o.cgroup_ancestors + 8 * u64::from(slot.level))
                else {
                    continue;
                };
                let slot = &mut table.slots[i];
                if slot.cgroup_ptr != ancestor {
                    if slot.cgroup_ptr != 0 {
                        continue; // another subtree
                    }
                    if !learn(ctx, slot, ancestor, &o) {
                        continue;
                    }
                }
                // SAFETY: bpf_probe_read_kernel checks the address.
                let Ok(usage) = (unsafe {
                    bpf_probe_read_kernel((slot.memcg_ptr + o.memcg_usage) as *const u64)
                }) else {
                    continue;
                };
                (usage, 0, ancestor)
            };
            let slot = &mut table.slots[i];
            // The page cache the level leaves out: the root's from the node counters, a
            // cgroup's as followed on its subtree's LRU moves.
            let left_out = if slot.follow == 0 {
                0
            } else if slot.level == 0 {
                node_inactive
            } else {
                // SAFETY: an aligned i64 in the map value that other CPUs add to atomically;
                // an aligned 8-byte load sees one value or the other, never a torn one.
                let followed = unsafe { core::ptr::read_volatile(&slot.inactive_pages) };
                followed.max(0) as u64
            };
            let counted = usage.saturating_sub(left_out);
            if slot.armed == 1 {
                if counted >= slot.threshold_pages {
                    // The learned pointer could in principle belong to a newer cgroup at the
                    // same address: confirm the id once per crossing.
                    if ancestor != 0 && cgroup_id_of(ancestor, &o) != slot.cgroup_id {
                        slot.cgroup_ptr = 0;
                        slot.memcg_ptr = 0;
                        continue;
                    }
                    slot.armed = 0;
                    slot.last_fired_ns = at_ns;
                    let kill = kill_staged(&o, i as u32, at_ns);
                    emit_threshold(
                        i as u32,
                        slot,
                        usage,
                        left_out,
                        cgroup_id_of(cgrp, &o),
                        at_ns,
                        kill,
                    );
                }
            } else if counted < slot.rearm_pages
                && at_ns.saturating_sub(slot.last_fired_ns) >= min_interval()
            {
                slot.armed = 1;
            }
            slot.near = u32::from(
                slot.armed == 1 && counted.saturating_add(o.near_pages) >= slot.threshold_pages,
            );
        }
        // Near by any slot's own last check, this one's or another subtree's.
        let mut near = false;
        for i in 0..MAX_THRESHOLDS {
            if i >= count {
                break;
            }
            let slot = &table.slots[i];
            near |= slot.cgroup_id != 0 && slot.armed == 1 && slot.near == 1;
        }
        near
    }

    /// Moves the inactive file count of every following slot whose subtree `memcg` (arg 0)
    /// is in by `val` pages.
    #[inline(always)]
    fn follow_inactive(ctx: &RawTracePointContext, val: i32) {
        let Some(table) = THRESHOLDS.get_ptr_mut(0) else {
            return;
        };
        // SAFETY: an array-map value; the count is moved atomically, the rest as in
        // `check_thresholds`.
        let table = unsafe { &mut *table };
        if table.following == 0 {
            return;
        }
        let o = threshold_offsets();
        if o.valid == 0 {
            return;
        }
        let count = table.count as usize;
        let memcg: u64 = ctx.arg(0);
        let Some(cgrp) = read_ptr(memcg, o.memcg_css + o.css_cgroup) else {
            return;
        };
        // SAFETY: bpf_probe_read_kernel checks the address.
        let Ok(level) = (unsafe { bpf_probe_read_kernel((cgrp + o.cgroup_level) as *const i32) })
        else {
            return;
        };
        let level = level as u32;
        for i in 0..MAX_THRESHOLDS {
            if i >= count {
                break;
            }
            let slot = &mut table.slots[i];
            // The root's page cache is read from the node counters at each check.
            if slot.follow == 0 || slot.level == 0 || slot.cgroup_id == 0 || level < slot.level {
                continue;
            }
            let Some(ancestor) = read_ptr(cgrp, o.cgroup_ancestors + 8 * u64::from(slot.level))
            else {
                continue;
            };
            if slot.cgroup_ptr != ancestor {
                if slot.cgroup_ptr != 0 || !learn(ctx, slot, ancestor, &o) {
                    continue;
                }
            }
            // SAFETY: an aligned i64 in the map value; an atomic add, so moves from two CPUs
            // are both counted.
            unsafe {
                core::intrinsics::atomic_xadd::<i64, i64, { AtomicOrdering::Relaxed }>(
                    &mut slot.inactive_pages,
                    i64::from(val),
                )
            };
        }
    }

    /// `NR_ANON_MAPPED + NR_FILE_PAGES` summed over the NUMA nodes, in pages: the root
    /// cgroup's usage, with the nodes' `NR_INACTIVE_FILE` beside it. Each node's counter array
    /// is found once through `memcg` (any memcg's `nodeinfo[nid]->lruvec.pgdat` is the node's)
    /// and remembered in `stats`.
    #[inline(always)]
    fn node_usage(
        stats: &mut [u64; MAX_NODES],
        memcg: u64,
        o: &ThresholdOffsets,
    ) -> Option<(u64, u64)> {
        if o.nr_nodes == 0 {
            return None;
        }
        let mut total: i64 = 0;
        let mut inactive: i64 = 0;
        for (nid, stat) in stats.iter_mut().enumerate() {
            if nid as u64 >= o.nr_nodes {
                break;
            }
            if *stat == 0 {
                let per_node = read_ptr(memcg, o.memcg_nodeinfo + 8 * nid as u64)?;
                let pgdat = read_ptr(per_node, o.per_node_pgdat)?;
                if pgdat == 0 {
                    return None;
                }
                *stat = pgdat + o.pgdat_vm_stat;
            }
            let anon = read_ptr(*stat, 8 * o.nr_anon_mapped)? as i64;
            let file = read_ptr(*stat, 8 * o.nr_file_pages)? as i64;
            total += anon + file;
            inactive += read_ptr(*stat, 8 * o.nr_inactive_file)? as i64;
        }
        Some((total.max(0) as u64, inactive.max(0) as u64))
    }

    /// The kernfs id of a `struct cgroup *`, or 0.
    #[inline(always)]
    fn cgroup_id_of(cgrp: u64, o: &ThresholdOffsets) -> u64 {
        read_ptr(cgrp, o.cgroup_kn)
            .and_then(|kn| read_ptr(kn, o.kn_id))
            .unwrap_or(0)
    }

    /// Remembers `ancestor` (and its memcg) in `slot` when it is the watched cgroup.
    #[inline(always)]
    fn learn(
        ctx: &RawTracePointContext,
        slot: &mut ThresholdSlot,
        ancestor: u64,
        o: &ThresholdOffsets,
    ) -> bool {
        if cgroup_id_of(ancestor, o) != slot.cgroup_id {
            return false;
        }
        let Some(css) = read_ptr(ancestor, o.cgroup_subsys + 8 * o.memory_cgrp_id) else {
            debug!(
                ctx,
                "threshold: cannot read the memory css of cgroup {}", slot.cgroup_id
            );
            return false;
        };
        if css == 0 {
            return false;
        }
        slot.memcg_ptr = css - o.memcg_css;
        slot.cgroup_ptr = ancestor;
        true
    }

    /// What `kill_staged` did: the process killed (0: none), the staged victim's id (0: none
    /// staged, or the current task is not in it), `bpf_send_signal`'s error.
    struct Kill {
        pid: u32,
        victim: u64,
        error: i32,
    }

    /// At a crossing: SIGKILL to the current process when it runs inside the staged victim
    /// pod (staged no longer than its `max_age_ns` ago), then the stage cleared (one kill per
    /// staging; user space stages again after its eviction). The current task is the one
    /// whose charge crossed the level, so the pod the agent would evict first is stopped at
    /// the crossing itself, before any wake-up of user space; a crossing charged by any other
    /// pod is left to the loop, which acts as always.
    /// `bpf_send_signal` signals the whole thread group (queued through irq_work when
    /// interrupts are off, as on parts of the charge path).
    #[inline(always)]
    fn kill_staged(o: &ThresholdOffsets, slot: u32, at_ns: u64) -> Kill {
        let none = Kill {
            pid: 0,
            victim: 0,
            error: 0,
        };
        let Some(staged) = VICTIM.get_ptr_mut(0) else {
            return none;
        };
        // SAFETY: an array-map value; user space writes it whole, this program clears its id.
        let staged = unsafe { &mut *staged };
        let victim = staged.cgroup_id;
        if victim == 0 || slot >= 32 || staged.slots & (1 << slot) == 0 {
            return none;
        }
        if at_ns.saturating_sub(staged.staged_ns) > staged.max_age_ns {
            return none;
        }
        // SAFETY: the helper returns the current task pointer; it is only read through
        // bpf_probe_read_kernel.
        let task = unsafe { bpf_get_current_task() };
        let Some(cgrp) = memcg_cgroup_of(task, &offsets()) else {
            return none;
        };
        // SAFETY: bpf_probe_read_kernel checks the address.
        let Ok(level) = (unsafe { bpf_probe_read_kernel((cgrp + o.cgroup_level) as *const i32) })
        else {
            return none;
        };
        if level < 0 || (level as u32) < staged.level {
            return none;
        }
        let inside = read_ptr(cgrp, o.cgroup_ancestors + 8 * u64::from(staged.level))
            .is_some_and(|ancestor| cgroup_id_of(ancestor, o) == victim);
        if !inside {
            return none;
        }
        // SAFETY: no preconditions; SIGKILL (9) to the current thread group.
        let error = unsafe { bpf_send_signal(9) } as i32;
        if error != 0 {
            return Kill {
                pid: 0,
                victim,
                error,
            };
        }
        staged.cgroup_id = 0;
        Kill {
            pid: (bpf_get_current_pid_tgid() >> 32) as u32,
            victim,
            error: 0,
        }
    }

    fn emit_threshold(
        index: u32,
        slot: &ThresholdSlot,
        usage: u64,
        left_out: u64,
        charged: u64,
        at_ns: u64,
        kill: Kill,
    ) {
        let Some(mut entry) = EVENTS.reserve::<ThresholdEvent>(0) else {
            count_drop();
            return;
        };
        entry.write(ThresholdEvent {
            header: Header {
                at_ns,
                cgroup_id: slot.cgroup_id,
                kind: KIND_THRESHOLD,
                pid: current_tid(),
            },
            usage_pages: usage,
            threshold_pages: slot.threshold_pages.saturating_add(left_out),
            charged_cgroup_id: charged,
            slot: index,
            killed_pid: kill.pid,
            inactive_pages: left_out,
            victim_cgroup_id: kill.victim,
            kill_error: kill.error,
            _pad: 0,
        });
        entry.submit(0);
    }

    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        // SAFETY: the verifier rejects programs that could reach a panic, so this is dead.
        unsafe { core::hint::unreachable_unchecked() }
    }
}
