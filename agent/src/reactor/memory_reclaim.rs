//! Reclaim first, for memory too (`memoryReclaim.enabled`, issue 24): before a memory
//! eviction, ask the kernel to drop page cache from kubepods through cgroup v2's
//! `memory.reclaim`, re-observe, and stop there if every memory threshold is clear with its
//! minimum reclaim — as the disk path stops after image GC.
//!
//! The loop must never lose the race for it. Whether to ask, and how much, is
//! [`crate::decide::memory_reclaim::next_step`] on fresh figures before every step: nothing
//! is asked when kubepods' active file pages cannot cover the shortfall (an anonymous hog is
//! evicted at once), each write is capped, and no step starts once `memoryReclaim.timeout`
//! has passed, so the loop is held at most the bound plus one capped step. Whatever reclaim
//! did not fix is evicted as before, with the reclaim's record on the eviction decision.
//!
//! On cgroup v1 there is no `memory.reclaim` (nor a sound equivalent: see
//! [`crate::act::cgroups::reclaim`]); [`Reactor::check_memory_reclaim`] turns the option off
//! with one warning at start.

use std::time::Instant;

use crate::act::cgroups::reclaim::ReclaimWrite;
use crate::act::cgroups::CgroupPath;
use crate::decide::memory_reclaim::{memory_shortfall, next_step, ReclaimView, Step, StopReason};
use crate::decide::pressure::{thresholds_met, Reclaim};
use crate::observe::Signals;

use super::decision::MemoryReclaim;
use super::pods::PodControl;
use super::Reactor;

impl<P: PodControl + 'static> Reactor<P> {
    /// At start: on a hierarchy without `memory.reclaim` (v1), `memoryReclaim.enabled` does
    /// nothing, and the agent says so once.
    pub(super) fn check_memory_reclaim(&mut self) {
        if self.settings.memory_reclaim.is_some() && !self.cgroups.can_reclaim() {
            tracing::warn!(
                "memoryReclaim.enabled has no effect on cgroup v1: there is no memory.reclaim \
                 to ask the kernel for a bounded reclaim (memory.force_empty empties the whole \
                 cgroup and is no equivalent); memory thresholds evict at once, as the kubelet \
                 does"
            );
            self.settings.memory_reclaim = None;
        }
    }

    /// Tries reclaim before evicting for `reclaim` (a memory threshold, option on): `None`
    /// when it does not apply, else what it did — `resolved` means nothing is to be evicted.
    pub(super) fn reclaim_memory_first(
        &mut self,
        reclaim: &Reclaim,
        signals: &Signals,
    ) -> Option<MemoryReclaim> {
        let timeout = self.settings.memory_reclaim?;
        if !reclaim.signal.is_memory() {
            return None;
        }
        let start = Instant::now();
        let kubepods = CgroupPath::kubepods();
        let (mut short, mut active) = self.reclaim_figures(signals);
        let mut file = kubepods_file(signals);
        let mut record = MemoryReclaim {
            signal: reclaim.signal.name().to_string(),
            cgroup: format!(
                "{}/kubepods",
                self.settings.cgroup_root.trim_end_matches('/')
            ),
            outcome: String::new(),
            shortfall_bytes: short,
            active_file_bytes: active,
            requested_bytes: 0,
            freed_bytes: 0,
            steps: 0,
            available_after_bytes: None,
            took_ns: 0,
            error: None,
        };
        // A dry run asks nothing: the record says what the first step would have asked for
        // (`dry-run`), or that it would have been skipped (`reactor::dry_run`).
        if self.settings.dry_run {
            let step = next_step(&ReclaimView {
                shortfall_bytes: short,
                active_file_bytes: active,
                elapsed: std::time::Duration::ZERO,
                timeout,
                steps: 0,
            });
            record.outcome = match step {
                Step::Ask { bytes } => {
                    record.requested_bytes = bytes;
                    "dry-run"
                }
                Step::Stop(_) => "skipped",
            }
            .to_string();
            return Some(record);
        }
        let outcome = loop {
            let step = next_step(&ReclaimView {
                shortfall_bytes: short,
                active_file_bytes: active,
                elapsed: start.elapsed(),
                timeout,
                steps: record.steps,
            });
            let bytes = match step {
                Step::Ask { bytes } => bytes,
                Step::Stop(StopReason::FilePagesShort) if record.steps == 0 => break "skipped",
                Step::Stop(StopReason::FilePagesShort) => break "short",
                Step::Stop(StopReason::TimeBound | StopReason::StepBound) => break "bounded",
            };
            record.steps += 1;
            record.requested_bytes = record.requested_bytes.saturating_add(bytes);
            let wrote = self.cgroups.memory_reclaim(&kubepods, bytes);
            let again = self.observer.observe();
            record.available_after_bytes = again
                .observations()
                .get(reclaim.signal)
                .and_then(|o| u64::try_from(o.available.value()).ok());
            let now = kubepods_file(&again);
            record.freed_bytes = record.freed_bytes.saturating_add(file.saturating_sub(now));
            file = now;
            match wrote {
                Ok(ReclaimWrite::Done | ReclaimWrite::Short) => {}
                Err(e) => {
                    record.error = Some(e.to_string());
                    break "failed";
                }
            }
            if self.memory_clear(&again) {
                break "resolved";
            }
            (short, active) = self.reclaim_figures(&again);
        };
        record.outcome = outcome.to_string();
        record.took_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if let Some(m) = &self.out.metrics {
            m.record_memory_reclaim(outcome, record.freed_bytes, record.took_ns as f64 / 1e9);
        }
        Some(record)
    }

    /// The largest shortfall among the memory thresholds (threshold plus minimum reclaim
    /// minus available: what must be freed for all of them to clear) and kubepods' active
    /// file pages, from `signals`.
    fn reclaim_figures(&self, signals: &Signals) -> (u64, u64) {
        let short = memory_shortfall(&self.settings.thresholds, &signals.observations());
        let active = signals
            .allocatable_memory
            .map_or(0, |m| m.active_file_bytes);
        (short, active)
    }

    /// Whether every memory threshold is clear with its minimum reclaim (grace periods
    /// ignored), the kubelet's test for a reclaim standing in for an eviction.
    fn memory_clear(&self, signals: &Signals) -> bool {
        let observations = signals.observations();
        let memory = (0..self.settings.thresholds.len())
            .filter(|&i| self.settings.thresholds[i].signal.is_memory());
        thresholds_met(&self.settings.thresholds, memory, &observations, true).is_empty()
    }
}

/// kubepods' file pages (active and inactive), bytes: what reclaim frees is their drop,
/// not the drop of usage, which a pod allocating at the same time would hide.
fn kubepods_file(signals: &Signals) -> u64 {
    signals.allocatable_memory.map_or(0, |m| {
        m.active_file_bytes.saturating_add(m.inactive_file_bytes)
    })
}
