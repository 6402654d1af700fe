//! The cgroup v2 suite: checks that need a real v2 memory controller, run by the `v2-suite`
//! binary inside the guest that `cargo xtask vm-test` boots (see `xtask/src/vm.rs`).
//!
//! Each check is a plain function that panics (with `assert!`) when the kernel or the agent
//! disagrees with what it expects, and returns notes worth showing otherwise. The runner
//! catches the panic, so one failing check does not stop the others, and reports one JSON
//! line per check. Adding a check is one function and one line in [`CHECKS`].
//!
//! The guest mounts cgroup2 at `/sys/fs/cgroup` ([`MOUNT`]; what every check reads the guest with is in `guest.rs`); every check works below a cgroup
//! root of its own, removed afterwards.

pub mod agent;
pub mod chaos;
mod guest;
pub mod kernel;
pub mod memory_qos;
pub mod oom;
pub mod pods;
pub mod pressure;
pub mod psi_conditions;
pub mod reclaim;

pub use guest::{counter, enable_root_controllers, read, wait_until, CACHE_FILE, MOUNT};

/// A check: panics on failure, returns notes on success.
pub type Check = fn() -> String;

/// One named check; a disabled one is listed but not run.
pub struct Entry {
    /// The test's name in the results.
    pub name: &'static str,
    /// The check.
    pub check: Check,
    /// Whether the suite runs it.
    pub enabled: bool,
}

const fn on(name: &'static str, check: Check) -> Entry {
    Entry {
        name,
        check,
        enabled: true,
    }
}

/// A check the suite lists but runs only when named (`--only`): one too long for every CI run.
const fn off(name: &'static str, check: Check) -> Entry {
    Entry {
        name,
        check,
        enabled: false,
    }
}

/// Every check, in the order the guest runs them (cheap kernel checks first).
pub const CHECKS: &[Entry] = &[
    on("kernel_has_the_v2_features", kernel::features),
    on(
        "observe_memory_available_matches_kernel_files",
        kernel::observe_matches_kernel_files,
    ),
    on("pod_tree_matches_plan_cgroups", pods::tree_matches_plan),
    on(
        "oom_score_adj_matches_plan",
        pods::oom_score_adj_matches_plan,
    ),
    on(
        "qos_reserved_moves_with_admissions",
        pods::qos_reserved_moves_with_admissions,
    ),
    on(
        "memory_qos_tree_matches_plan_cgroups",
        memory_qos::tree_matches_plan,
    ),
    on(
        "memory_high_throttles_not_oom_kills",
        memory_qos::high_throttles_not_oom_kills,
    ),
    on(
        "limited_swap_burstable_swaps_guaranteed_does_not",
        memory_qos::limited_swap,
    ),
    on(
        "psi_condition_true_under_a_stall_false_after_the_transition_period",
        psi_conditions::kubepods_memory_condition_rises_and_falls,
    ),
    on(
        "memory_oom_group_kills_the_whole_container",
        oom::group_kills_whole_container,
    ),
    on(
        "oom_kill_from_memory_events_mapped_to_pod",
        oom::kill_from_memory_events,
    ),
    on("oom_kill_from_ebpf_mapped_to_pod", oom::kill_from_ebpf),
    on(
        "eviction_before_oom_psi_and_memory_events",
        pressure::eviction_before_oom_without_ebpf,
    ),
    on(
        "ebpf_usage_threshold_crossed",
        pressure::ebpf_usage_threshold,
    ),
    on(
        "eviction_before_oom_woken_by_ebpf_threshold",
        pressure::eviction_before_oom_woken_by_ebpf_threshold,
    ),
    on(
        "cache_full_kubepods_keeps_the_charge_program_off_and_evicts_the_hog",
        pressure::cache_full_kubepods_is_calm,
    ),
    on(
        "memory_reclaim_off_evicts_the_cache_reader",
        reclaim::file_cache_evicted_kubelet_exact,
    ),
    on(
        "memory_reclaim_on_keeps_the_cache_reader",
        reclaim::file_cache_reclaimed_not_evicted,
    ),
    on(
        "memory_reclaim_on_still_evicts_the_anonymous_hog",
        reclaim::anonymous_hog_still_evicted,
    ),
    on(
        "memory_reclaim_on_evicts_the_hog_keeps_the_reader",
        reclaim::hog_evicted_reader_kept,
    ),
    // About 7 minutes of the guest's time: `cargo xtask chaos --v2` runs it.
    off("chaos_short_run_keeps_every_invariant", chaos::short_run),
];
