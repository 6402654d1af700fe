//! The close watch: how closely the loop re-reads the memory signals between events, and the
//! kernel's own watch of the memory thresholds that it relies on.
//!
//! A memory signal is close when it is within a margin of a threshold (a quarter of its
//! level, at least 16 MiB). Close to a threshold the kernel checks at its working-set level
//! itself (an armed eBPF slot that follows the page cache, [`KernelWatch`]), the kernel's
//! record wakes the loop at the crossing and re-reading every `close_poll` would only race
//! it: the loop re-reads every `kernel_watched_poll`, a net under the kernel's record. Close
//! to any other, it re-reads every `close_poll` rather than trusting the next notification
//! to come in time. Far from every threshold, the housekeeping interval.
//!
//! The kernel's levels are kept where the working set meets each threshold
//! ([`CloseWatch::move_thresholds`]), so what it watches is what the thresholds say.

use std::time::Duration;

use crate::decide::pressure::Observations;
use crate::decide::quantity::Quantity;
use crate::decide::signal::Signal;
use crate::decide::thresholds::Threshold;
use crate::observe::{ObserveSettings, Signals};
use crate::sense::ebpf::kernel_watch::KernelWatch;
use crate::sense::memcg::{Level, MemcgThresholds};

/// How close the memory signals are to a threshold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Closeness {
    /// No memory signal is close to a threshold: the housekeeping interval.
    #[default]
    Far,
    /// Close only to thresholds the kernel checks at their working-set level itself:
    /// `kernel_watched_poll`, a net under the kernel's record.
    KernelWatched,
    /// Close to a threshold nothing in the kernel watches at its crossing: `close_poll`.
    Close,
}

/// How far above a threshold's working-set level a kernel slot may sit and still count as
/// watching it: the charge program checks every page near an armed level (every 16 pages per
/// CPU farther away), and a slot's level is rounded up to a page.
const KERNEL_WATCH_SLACK_BYTES: u64 = 64 << 10;

/// The close watch's state: how close the last pass found the memory signals, and the
/// kernel's watches and levels it weighs that against.
#[derive(Debug, Default)]
pub(super) struct CloseWatch {
    closeness: Closeness,
    /// Which watched cgroups the kernel checks at their working-set level now.
    kernel_watch: KernelWatch,
    /// The memcg usage thresholds, moved by the inactive file pages on every pass.
    thresholds: MemcgThresholds,
}

impl CloseWatch {
    /// Watching with the sense layer's kernel watches and memcg thresholds.
    pub(super) fn start(&mut self, kernel_watch: KernelWatch, thresholds: MemcgThresholds) {
        self.kernel_watch = kernel_watch;
        self.thresholds = thresholds;
    }

    /// The kernel's watches (to learn when the charge programs come on).
    pub(super) fn kernel_watch(&self) -> &KernelWatch {
        &self.kernel_watch
    }

    /// How close the last pass found the memory signals.
    pub(super) fn closeness(&self) -> Closeness {
        self.closeness
    }

    /// Weighs this pass's `observations` against the memory thresholds of `thresholds`
    /// (`cgroups`: which cgroups the node's and the allocatable signals are read from).
    pub(super) fn assess(
        &mut self,
        thresholds: &[Threshold],
        observations: &Observations,
        cgroups: &ObserveSettings,
    ) {
        self.closeness = closeness(thresholds, observations, |t, capacity| {
            self.watches(t, capacity, cgroups)
        });
    }

    /// The period of the re-reads the closeness calls for, `None` when far: `close_poll`, or
    /// `kernel_watched_poll` under the kernel's watch. A dry run with an episode open
    /// (`dry_run_open`) re-reads no faster than the kernel-watched net (`dry_run`).
    pub(super) fn recheck_every(
        &self,
        close_poll: Duration,
        kernel_watched_poll: Duration,
        dry_run_open: bool,
    ) -> Option<Duration> {
        match self.closeness {
            Closeness::Far => None,
            Closeness::KernelWatched => Some(kernel_watched_poll),
            Closeness::Close if dry_run_open => Some(close_poll.max(kernel_watched_poll)),
            Closeness::Close => Some(close_poll),
        }
    }

    /// The metrics' name for a re-read the timer started now, `None` when far.
    pub(super) fn reread_label(&self) -> Option<&'static str> {
        match self.closeness {
            Closeness::Far => None,
            Closeness::KernelWatched => Some("kernel_watched"),
            Closeness::Close => Some("close"),
        }
    }

    /// Whether the kernel checks memory threshold `t` itself (an armed eBPF slot following
    /// the page cache on its cgroup, at or below the working set where it is met:
    /// `capacity - level`).
    pub(super) fn watches(
        &self,
        t: &Threshold,
        capacity: Quantity,
        cgroups: &ObserveSettings,
    ) -> bool {
        let cgroup = match t.signal {
            Signal::MemoryAvailable => &cgroups.node_cgroup,
            Signal::AllocatableMemoryAvailable => &cgroups.kubepods_cgroup,
            _ => return false,
        };
        let level = t.level(capacity, false).value();
        let working_set = u64::try_from(capacity.value().saturating_sub(level)).unwrap_or(0);
        self.kernel_watch
            .watches(cgroup, working_set, KERNEL_WATCH_SLACK_BYTES)
    }

    /// Keeps each memcg usage threshold where the working set meets its level: the base
    /// (`capacity - level`, armed at start) plus the cgroup's inactive file pages now, as the
    /// kubelet's threshold notifier does, so the kernel's notification comes when the
    /// threshold is met rather than a page cache earlier. Every change is passed on: the
    /// eBPF slot follows it page for page (one map write), the v1 registration only by
    /// [`crate::sense::memcg::V1_MOVE_STEP_BYTES`] or more.
    pub(super) fn move_thresholds(&self, signals: &Signals, cgroups: &ObserveSettings) {
        for target in self.thresholds.targets() {
            let Some(base) = target.threshold_bytes else {
                continue;
            };
            let memory = if target.cgroup == cgroups.node_cgroup {
                signals.memory
            } else if target.cgroup == cgroups.kubepods_cgroup {
                signals.allocatable_memory
            } else {
                None
            };
            let Some(m) = memory else {
                continue;
            };
            self.thresholds
                .set(target, Level::working_set(base, m.inactive_file_bytes));
        }
    }
}

/// How close `observations` are to the memory thresholds of `thresholds`; `watched` says
/// whether the kernel checks a threshold (at the signal's capacity) itself.
fn closeness(
    thresholds: &[Threshold],
    observations: &Observations,
    watched: impl Fn(&Threshold, Quantity) -> bool,
) -> Closeness {
    let mut out = Closeness::Far;
    for t in thresholds {
        if !matches!(
            t.signal,
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable
        ) {
            continue;
        }
        let Some(obs) = observations.get(t.signal) else {
            continue;
        };
        let capacity = obs.capacity.unwrap_or(Quantity::ZERO);
        let level = t.level(capacity, false).value();
        let margin = (level / 4).max(16 << 20);
        if obs.available.value() >= level.saturating_add(margin) {
            continue;
        }
        if watched(t, capacity) {
            out = Closeness::KernelWatched;
        } else {
            return Closeness::Close;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::decide::pressure::Observation;
    use crate::reactor::settings::ReactorSettings;

    const MI: i64 = 1 << 20;

    /// The default thresholds (`memory.available<100Mi` among them) and a node of 1 GiB
    /// with `available_mi` MiB available.
    fn node(available_mi: i64) -> (Vec<Threshold>, Observations) {
        let thresholds = ReactorSettings::from_config(&Config::default())
            .unwrap()
            .thresholds;
        let mut o = Observations::default();
        o.set(
            Signal::MemoryAvailable,
            Observation {
                available: Quantity::from_units(available_mi * MI),
                capacity: Some(Quantity::from_units(1024 * MI)),
                at: 0,
            },
        );
        (thresholds, o)
    }

    #[test]
    fn close_within_a_quarter_of_the_level_or_16_mib() {
        // 100Mi: the margin is 25Mi.
        let (t, o) = node(126);
        assert_eq!(closeness(&t, &o, |_, _| false), Closeness::Far);
        let (t, o) = node(124);
        assert_eq!(closeness(&t, &o, |_, _| false), Closeness::Close);
        assert_eq!(
            closeness(&t, &o, |_, _| true),
            Closeness::KernelWatched,
            "the kernel checks it at its level"
        );
        let (t, o) = node(50);
        assert_eq!(closeness(&t, &o, |_, _| false), Closeness::Close, "met");
        let (t, _) = node(50);
        assert_eq!(
            closeness(&t, &Observations::default(), |_, _| false),
            Closeness::Far,
            "nothing observed"
        );
    }

    #[test]
    fn the_closeness_sets_the_re_read_period() {
        let (close, kernel) = (Duration::from_millis(1), Duration::from_millis(100));
        let mut w = CloseWatch::default();
        assert_eq!(w.recheck_every(close, kernel, false), None);
        assert_eq!(w.reread_label(), None);
        w.closeness = Closeness::KernelWatched;
        assert_eq!(w.recheck_every(close, kernel, false), Some(kernel));
        assert_eq!(w.reread_label(), Some("kernel_watched"));
        w.closeness = Closeness::Close;
        assert_eq!(w.recheck_every(close, kernel, false), Some(close));
        assert_eq!(
            w.recheck_every(close, kernel, true),
            Some(kernel),
            "a dry run's open episode"
        );
        assert_eq!(w.reread_label(), Some("close"));
    }

    #[test]
    fn no_kernel_watch_watches_nothing() {
        let (t, _) = node(50);
        let w = CloseWatch::default();
        let cgroups = ObserveSettings::from_config(&Config::default(), None, None).unwrap();
        assert!(t
            .iter()
            .all(|t| !w.watches(t, Quantity::from_units(1024 * MI), &cgroups)));
    }
}
