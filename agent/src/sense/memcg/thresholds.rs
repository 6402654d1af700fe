//! What to watch and where its threshold is: the targets, the levels the loop moves while
//! the watches run ([`MemcgThresholds`]), and the node's own target from the config. The
//! maths of a threshold's level is decide's ([`crate::decide::thresholds`]); this is the
//! plumbing that carries it to the v1 eventfds, the v2 checks and the eBPF slots.

use std::sync::Arc;

use tokio::sync::watch;

use crate::config::Config;
use crate::decide::thresholds::{parse_hard, usage_at, ThresholdError};

/// Moves the usage thresholds armed for the targets while the watches run. The kubelet's
/// memory threshold notifier re-arms its usage threshold at `capacity - level +
/// inactive_file` on every housekeeping pass, because usage counts inactive page cache that
/// the working set (what eviction compares) does not: a threshold at `capacity - level` fires
/// early, by exactly the inactive file pages, and the decision it wakes finds nothing met.
/// The same levels drive the eBPF charge programs' in-kernel thresholds
/// ([`crate::sense::ebpf::threshold`]). Cheap to clone; a target that was not armed (no
/// threshold, v1 registration refused) is ignored.
#[derive(Clone, Debug, Default)]
pub struct MemcgThresholds {
    armed: Arc<Vec<(MemcgTarget, watch::Sender<Level>)>>,
}

impl MemcgThresholds {
    /// The targets as they were given to [`crate::sense::Sense::start`] (their base
    /// thresholds).
    pub(crate) fn targets(&self) -> impl Iterator<Item = &MemcgTarget> {
        self.armed.iter().map(|(t, _)| t)
    }

    /// Arms `target`'s notification at `level` from now on; a no-op when it is armed there
    /// already.
    pub fn set(&self, target: &MemcgTarget, level: Level) {
        for (t, tx) in self.armed.iter() {
            if t == target {
                tx.send_if_modified(|now| {
                    let changed = *now != level;
                    *now = level;
                    changed
                });
            }
        }
    }
}

/// Where a target's threshold is: the usage that meets it now and, for a working-set level,
/// the inactive file pages counted into that usage.
///
/// The v1 eventfd and the v2 `memory.events` check can only compare usage, so they take
/// [`usage_bytes`](Self::usage_bytes), placed at the loop's last pass. The eBPF charge
/// programs compare the working set itself (usage minus the page cache they follow in the
/// kernel) against `usage_bytes - inactive_file_bytes`, which does not move with the page
/// cache, so their level cannot go stale between two passes.
///
/// Where the v1 eventfd cannot follow: its threshold is on `memory.usage_in_bytes` alone and
/// moves only when the loop re-registers it (at most once per
/// [`super::v1::V1_MOVE_STEP_BYTES`]), so page cache dropped since the last pass leaves it high
/// by that much; the eBPF slot, where it runs, is the one that catches that crossing on time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Level {
    /// The usage at which the threshold is met now.
    pub usage_bytes: u64,
    /// `Some(i)`: a working-set level, `i` bytes of inactive file counted into
    /// `usage_bytes`; `None`: a plain usage level.
    pub inactive_file_bytes: Option<u64>,
}

impl Level {
    /// A plain usage level.
    pub fn usage(bytes: u64) -> Level {
        Level {
            usage_bytes: bytes,
            inactive_file_bytes: None,
        }
    }

    /// The level of a threshold on `base` bytes of working set, with `inactive_file` bytes
    /// of inactive file pages now ([`working_set_level`]).
    pub fn working_set(base: u64, inactive_file: u64) -> Level {
        Level {
            usage_bytes: working_set_level(base, inactive_file),
            inactive_file_bytes: Some(inactive_file),
        }
    }

    /// The working set at which the threshold is met, for a working-set level.
    pub fn working_set_bytes(&self) -> Option<u64> {
        self.inactive_file_bytes
            .map(|i| self.usage_bytes.saturating_sub(i))
    }
}

/// The usage at which a threshold on `base` bytes of working set is met, given the
/// cgroup's inactive file pages now: the eviction signal is met when the working set
/// (`usage - inactive_file`) exceeds `base`, so the kernel should wake us at the first
/// usage past `base + inactive_file` (`+ 1`: "at or above" in the kernel's checks).
pub fn working_set_level(base: u64, inactive_file: u64) -> u64 {
    base.saturating_add(inactive_file).saturating_add(1)
}

/// Builds [`MemcgThresholds`] while the sources attach.
#[derive(Default)]
pub(crate) struct ThresholdsBuilder {
    armed: Vec<(MemcgTarget, watch::Sender<Level>)>,
}

impl ThresholdsBuilder {
    /// A receiver for `target`'s threshold, starting at `bytes`; every source that checks
    /// the same target (the memcg notification, the eBPF charge programs) follows one level.
    pub(crate) fn add(&mut self, target: &MemcgTarget, bytes: u64) -> watch::Receiver<Level> {
        if let Some((_, tx)) = self.armed.iter().find(|(t, _)| t == target) {
            return tx.subscribe();
        }
        let (tx, rx) = watch::channel(Level::usage(bytes));
        self.armed.push((target.clone(), tx));
        rx
    }

    pub(crate) fn build(self) -> MemcgThresholds {
        MemcgThresholds {
            armed: Arc::new(self.armed),
        }
    }
}

/// A cgroup to watch and, optionally, a usage threshold on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemcgTarget {
    /// The cgroup as a path inside the memory hierarchy (`/`, `/kubepods`).
    pub cgroup: String,
    /// Usage in bytes whose crossing wakes us; `None` watches OOMs / `memory.events` only.
    pub threshold_bytes: Option<u64>,
}

/// The usage threshold that wakes us before the `memory.available` hard eviction threshold
/// `hard` is met on `capacity_bytes`: decide's [`usage_at`], so the wake-up and the loop's
/// evaluation share one figure. `None` when the kubelet ignores the threshold (`0%`, `100%`).
/// `hard` is a quantity (`"100Mi"`) or a percentage of capacity (`"10%"`).
pub(crate) fn node_threshold(
    capacity_bytes: u64,
    hard: &str,
) -> Result<Option<u64>, ThresholdError> {
    Ok(parse_hard("memory.available", hard)?.map(|value| usage_at(capacity_bytes, &value)))
}

/// The node target: the cgroup the agent manages (`cgroupRoot`) with the usage threshold
/// derived from `capacity_bytes` and the `memory.available` hard eviction threshold, or no
/// threshold (OOM / events only) when there is no such eviction threshold. The capacity is
/// the caller's to read (`observe::memory_capacity`): sense stands below observe.
pub fn node_target(config: &Config, capacity_bytes: u64) -> Result<MemcgTarget, ThresholdError> {
    let threshold_bytes = match config.eviction_hard.get("memory.available") {
        None => None,
        Some(hard) => node_threshold(capacity_bytes, hard)?,
    };
    Ok(MemcgTarget {
        cgroup: config.cgroup_root.clone(),
        threshold_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_level_is_the_first_usage_past_the_working_set_base() {
        let base = 384 << 20;
        // No page cache: usage must pass the base itself.
        assert_eq!(working_set_level(base, 0), base + 1);
        // 300 KiB of inactive page cache: 300 KiB later, a page's precision kept.
        assert_eq!(working_set_level(base, 300 << 10), base + (300 << 10) + 1);
        assert_eq!(working_set_level(u64::MAX, 1), u64::MAX, "no overflow");
    }

    #[test]
    fn node_threshold_from_quantity_or_percent() {
        let gib = 1u64 << 30;
        assert_eq!(
            node_threshold(8 * gib, "100Mi").unwrap(),
            Some(8 * gib - (100 << 20))
        );
        assert_eq!(node_threshold(1000, "10%").unwrap(), Some(900));
        assert_eq!(node_threshold(50, "1Ki").unwrap(), Some(0));
        assert!(node_threshold(1000, "12Qi").is_err());
        assert!(node_threshold(1000, "150%").is_err());
        assert!(node_threshold(1000, "-1").is_err());
        // Thresholds the kubelet ignores arm no usage threshold.
        assert_eq!(node_threshold(1000, "0%").unwrap(), None);
        assert_eq!(node_threshold(1000, "100%").unwrap(), None);
    }

    #[test]
    fn node_target_names_the_key_at_fault() {
        let mut config = Config {
            cgroup_root: "/node".into(),
            eviction_hard: [("memory.available".to_string(), "100Mi".to_string())].into(),
            ..Default::default()
        };
        let t = node_target(&config, 1 << 30).unwrap();
        assert_eq!(t.cgroup, "/node");
        assert_eq!(t.threshold_bytes, Some((1 << 30) - (100 << 20)));
        config
            .eviction_hard
            .insert("memory.available".into(), "150%".into());
        let e = node_target(&config, 1 << 30).unwrap_err().to_string();
        assert!(e.starts_with("evictionHard.memory.available: "), "{e}");
        config.eviction_hard.clear();
        assert_eq!(node_target(&config, 1 << 30).unwrap().threshold_bytes, None);
    }
}
