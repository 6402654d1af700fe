//! Staging the pod the loop would evict first, for the charge program to kill at a hard
//! threshold's crossing ([`agent_ebpf::StagedVictim`]).
//!
//! Between the kernel's record at a crossing and the loop's SIGKILL lie the loop thread's
//! wake-up and its pass (a few hundred microseconds here, milliseconds when the VM runs
//! slow), while the pod that crossed goes on charging pages. The ranking the pass would run
//! does not depend on that moment: the loop runs it ahead, while a hard memory threshold is
//! near, and stages its answer here. At the crossing the charge program then sends SIGKILL
//! to the charging process itself if it runs in the staged pod; the loop completes the
//! eviction when the record reaches it (the pod's other processes, the runtime's stop, the
//! status), as for one of its own kills. A crossing charged by any other pod is left to the
//! loop. The kernel clears the stage with its kill: one kill per staging.
//!
//! Which slots may kill: a slot's crossing means its threshold is met only for the
//! thresholds placed on it; the stage names the slots of hard thresholds, so a soft
//! threshold's crossing never kills (its grace period runs in user space).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agent_ebpf::{StagedVictim, MAX_THRESHOLDS};
use aya::maps::{Array, MapData};

use crate::sense::{monotonic_ns, MemcgTarget};

/// The staged victim's map and which target each usage slot watches (cheap to clone).
#[derive(Clone)]
pub(crate) struct VictimStage {
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    map: Array<MapData, StagedVictim>,
    /// Slot index → the memcg target it was armed for.
    slots: Vec<(usize, MemcgTarget)>,
    /// Whether the map holds a victim, as last written (the kernel clears it with its kill;
    /// the loop says so with [`VictimStage::killed`]): a clear is written only over one.
    staged: bool,
}

impl std::fmt::Debug for VictimStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("VictimStage")
            .field("slots", &inner.slots)
            .field("staged", &inner.staged)
            .finish_non_exhaustive()
    }
}

/// The slot mask of the slots armed for any of `targets`.
pub(crate) fn slot_mask(slots: &[(usize, MemcgTarget)], targets: &[MemcgTarget]) -> u32 {
    slots
        .iter()
        .filter(|(i, t)| *i < MAX_THRESHOLDS && targets.contains(t))
        .fold(0, |mask, (i, _)| mask | (1 << i))
}

impl VictimStage {
    pub fn new(map: Array<MapData, StagedVictim>) -> VictimStage {
        VictimStage {
            inner: Arc::new(Mutex::new(Inner {
                map,
                slots: Vec::new(),
                staged: false,
            })),
        }
    }

    /// Slot `index` was armed for `target`.
    pub(crate) fn add_slot(&self, index: usize, target: MemcgTarget) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.slots.push((index, target));
    }

    /// Stages the pod cgroup `victim` (its id and depth), ranked now, for the crossings of the
    /// slots armed for `hard` (the hard memory thresholds' targets) until `max_age` from now,
    /// or clears the stage (`None`, or no slot among them; written only if something was
    /// staged). Returns whether a victim is staged now.
    pub(crate) fn stage(
        &self,
        victim: Option<(u64, u32)>,
        hard: &[MemcgTarget],
        max_age: Duration,
    ) -> Result<bool, StageError> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let slots = slot_mask(&inner.slots, hard);
        let want = match victim {
            Some((cgroup_id, level)) if slots != 0 && cgroup_id != 0 => StagedVictim {
                cgroup_id,
                level,
                slots,
                // Written anew at every staging: the kernel holds it no longer than
                // `max_age` after the ranking it stands for.
                staged_ns: monotonic_ns(),
                max_age_ns: u64::try_from(max_age.as_nanos()).unwrap_or(u64::MAX),
            },
            _ => StagedVictim::default(),
        };
        let staged = want.cgroup_id != 0;
        if !staged && !inner.staged {
            return Ok(false);
        }
        inner.map.set(0, want, 0).map_err(StageError)?;
        inner.staged = staged;
        Ok(staged)
    }

    /// The kernel killed the staged victim's process and cleared the stage: the next
    /// [`VictimStage::stage`] writes anew.
    pub(crate) fn killed(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.staged = false;
    }
}

/// The staged victim could not be written to the kernel's map.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the eBPF staged victim: {0}")]
pub(crate) struct StageError(#[source] aya::maps::MapError);

#[cfg(test)]
mod tests {
    use super::*;

    fn target(cgroup: &str, bytes: u64) -> MemcgTarget {
        MemcgTarget {
            cgroup: cgroup.into(),
            threshold_bytes: Some(bytes),
        }
    }

    #[test]
    fn only_the_hard_thresholds_slots_may_kill() {
        let slots = vec![
            (0, target("/kubepods", 400)),
            (1, target("/kubepods", 300)),
            (2, target("/", 900)),
        ];
        let hard = [target("/kubepods", 400), target("/", 900)];
        assert_eq!(slot_mask(&slots, &hard), 0b101);
        assert_eq!(slot_mask(&slots, &[target("/kubepods", 300)]), 0b010);
        assert_eq!(slot_mask(&slots, &[]), 0);
        assert_eq!(slot_mask(&slots, &[target("/other", 400)]), 0);
    }
}
