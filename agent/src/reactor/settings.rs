//! How the loop behaves ([`ReactorSettings`], built from the config once) and the memcg
//! notifications it asks the sense layer for ([`memcg_targets`]).

use std::time::Duration;

use crate::config::Config;
use crate::decide::psi_conditions::PsiSettings;
use crate::decide::signal::{FsLayout, Signal};
use crate::decide::thresholds::{
    parse_thresholds, with_containerfs_thresholds, EvictionSettings, Threshold, ThresholdError,
};
use crate::observe::Observer;
use crate::sense::MemcgTarget;

/// The kubelet's default `evictionPressureTransitionPeriod`, which also replaces a zero.
const DEFAULT_TRANSITION: Duration = Duration::from_secs(300);

/// How the loop behaves; built from the config once.
#[derive(Clone, Debug)]
pub struct ReactorSettings {
    /// The eviction thresholds, hard first, with the `containerfs` ones derived for `layout`.
    pub thresholds: Vec<Threshold>,
    /// The thresholds as configured, which `thresholds` is derived from: `containerfs`
    /// thresholds cannot be configured (seed 003) but follow the filesystem layout, which is
    /// only known once the filesystems are observed.
    pub configured: Vec<Threshold>,
    /// The filesystem layout the `containerfs` thresholds were derived for.
    pub layout: FsLayout,
    /// `evictionPressureTransitionPeriod`.
    pub transition_period: Duration,
    /// `evictionMaxPodGracePeriod`, seconds.
    pub max_pod_grace_period: i64,
    /// The housekeeping interval: the longest the loop sleeps without an event.
    pub housekeeping: Duration,
    /// With `serial_evictions`, how long to wait for an evicted pod's cgroup to empty after
    /// its stop before deciding again.
    pub release_wait: Duration,
    /// How long after its kill (SIGKILL, or the end of its grace period) — or after it last
    /// gave memory back, when later, up to 30 s after the kill — a victim may take to be
    /// gone before the loop stops counting on its memory and evicts the next pod if a
    /// threshold is still met (a frozen cgroup, a process in D state, a hung runtime stop).
    /// The victim stays in flight until it is gone.
    pub victim_bound: Duration,
    /// Wait for each eviction to finish and its memory to come back before the next pass —
    /// the kubelet's behaviour, kept for the bench's "kubelet-like" comparison. Default
    /// `false`: evictions run in flight and the loop keeps observing and deciding.
    pub serial_evictions: bool,
    /// How often to re-read the signals while a memory signal is close to a threshold that
    /// nothing in the kernel watches at its crossing.
    pub close_poll: Duration,
    /// How often to re-read them while the only thresholds close are ones the kernel checks
    /// at their working-set level itself (an armed eBPF slot; its record wakes the loop at
    /// the crossing): a safety net, not the way a crossing is caught.
    pub kernel_watched_poll: Duration,
    /// How many pods of the ranking each decision records.
    pub ranking_top: usize,
    /// `cgroupRoot` (as a path in the hierarchy): events from cgroups outside it are not
    /// this node's.
    pub cgroup_root: String,
    /// `memoryReclaim.timeout` when `memoryReclaim.enabled`: reclaim page cache before a
    /// memory eviction, for at most this long ([`crate::decide::memory_reclaim`]). `None`:
    /// kubelet-exact.
    pub memory_reclaim: Option<Duration>,
    /// `killAtCrossing`: stage the pod a hard memory threshold would evict first for the
    /// eBPF charge program to kill at the crossing ([`crate::sense::ebpf::stage`]).
    pub kill_at_crossing: bool,
    /// KEP-5394's PSI node conditions: the gate and the thresholds.
    pub psi: PsiSettings,
    /// `dryRun`: record the evictions the loop would make ([`Action::WouldEvict`], once per
    /// pod per pressure episode: [`crate::decide::dry_run`]) and make none; no victim is
    /// staged for the charge program and no page cache is reclaimed.
    ///
    /// [`Action::WouldEvict`]: super::Action::WouldEvict
    pub dry_run: bool,
}

impl ReactorSettings {
    /// The settings a config file asks for.
    pub fn from_config(config: &Config) -> Result<ReactorSettings, ThresholdError> {
        let settings = EvictionSettings {
            hard: config.eviction_hard.clone(),
            // The config's own default holds the kubelet's defaults (an absent key); an
            // empty map there was written so.
            hard_given: true,
            soft: config.eviction_soft.clone(),
            soft_grace_period: config.eviction_soft_grace_period.clone(),
            minimum_reclaim: config.eviction_minimum_reclaim.clone(),
            merge_defaults: config.merge_default_eviction_settings,
            enforce_allocatable_pods: config.enforce_node_allocatable.iter().any(|e| e == "pods"),
        };
        let parsed = parse_thresholds(&settings)?;
        let (thresholds, _) = with_containerfs_thresholds(&parsed, FsLayout::Shared);
        let transition = config.eviction_pressure_transition_period.0;
        Ok(ReactorSettings {
            thresholds,
            configured: parsed,
            layout: FsLayout::Shared,
            transition_period: if transition.is_zero() {
                DEFAULT_TRANSITION
            } else {
                transition
            },
            max_pod_grace_period: config.eviction_max_pod_grace_period,
            housekeeping: config.housekeeping_interval.0,
            release_wait: Duration::from_secs(10),
            victim_bound: Duration::from_secs(2),
            serial_evictions: false,
            close_poll: Duration::from_millis(1),
            kernel_watched_poll: Duration::from_millis(100),
            ranking_top: 5,
            cgroup_root: if config.cgroup_root.is_empty() {
                "/".to_string()
            } else {
                config.cgroup_root.clone()
            },
            memory_reclaim: config
                .memory_reclaim
                .enabled
                .then_some(config.memory_reclaim.timeout.0),
            kill_at_crossing: config.kill_at_crossing,
            psi: config.psi_settings(),
            dry_run: config.dry_run,
        })
    }
}

impl ReactorSettings {
    /// Derives the `containerfs` thresholds for `layout` as seed 003 says: those of `nodefs`
    /// when one filesystem holds everything or the image filesystem is split, those of
    /// `imagefs` when a separate image filesystem also holds the writable layers. The other
    /// thresholds keep their place (the derived ones come last). Returns whether anything
    /// changed.
    pub(crate) fn set_layout(&mut self, layout: FsLayout) -> bool {
        if layout == self.layout {
            return false;
        }
        let (thresholds, _) = with_containerfs_thresholds(&self.configured, layout);
        self.layout = layout;
        let changed = thresholds != self.thresholds;
        self.thresholds = thresholds;
        changed
    }
}

/// The memcg notifications the loop needs: for each memory threshold, a usage threshold on
/// the cgroup the signal is measured on (the node cgroup for `memory.available`, kubepods for
/// the allocatable signal) at the level where the threshold is met — the kubelet's memory
/// threshold notifier. Usage counts page cache the working set does not, so the crossing can
/// come a little before the threshold is met; the loop then watches closely (`close_poll`).
pub fn memcg_targets(settings: &ReactorSettings, observer: &Observer) -> Vec<MemcgTarget> {
    targets_of(settings, observer, |_| true)
}

/// The targets of the hard memory thresholds alone: the slots whose crossing may kill
/// ([`crate::sense::ebpf::stage`]).
pub(crate) fn hard_memcg_targets(
    settings: &ReactorSettings,
    observer: &Observer,
) -> Vec<MemcgTarget> {
    targets_of(settings, observer, Threshold::is_hard)
}

fn targets_of(
    settings: &ReactorSettings,
    observer: &Observer,
    keep: impl Fn(&Threshold) -> bool,
) -> Vec<MemcgTarget> {
    let capacity = observer.memory_capacity();
    let allocatable = capacity.saturating_sub(observer.settings().reserved_memory);
    let mut out: Vec<MemcgTarget> = Vec::new();
    for t in settings.thresholds.iter().filter(|t| keep(t)) {
        let (cgroup, total) = match t.signal {
            Signal::MemoryAvailable => (observer.settings().node_cgroup.clone(), capacity),
            Signal::AllocatableMemoryAvailable => {
                (observer.settings().kubepods_cgroup.clone(), allocatable)
            }
            _ => continue,
        };
        let total_q =
            crate::decide::quantity::Quantity::from_units(i64::try_from(total).unwrap_or(i64::MAX));
        let level = u64::try_from(t.level(total_q, false).value()).unwrap_or(0);
        let usage_at = total.saturating_sub(level);
        if usage_at == 0 {
            continue;
        }
        let target = MemcgTarget {
            cgroup,
            threshold_bytes: Some(usage_at),
        };
        if !out.contains(&target) {
            out.push(target);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(hard: &[(&str, &str)]) -> ReactorSettings {
        let config = Config {
            eviction_hard: hard
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Config::default()
        };
        ReactorSettings::from_config(&config).unwrap()
    }

    fn names(s: &ReactorSettings) -> Vec<String> {
        s.thresholds.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn an_explicit_empty_eviction_hard_means_no_hard_thresholds() {
        let given = Config::from_yaml("evictionHard: {}\n").unwrap();
        let s = ReactorSettings::from_config(&given).unwrap();
        assert_eq!(names(&s), Vec::<String>::new());
        // Absent: the kubelet's defaults.
        let absent = Config::from_yaml("housekeepingInterval: 10s\n").unwrap();
        let s = ReactorSettings::from_config(&absent).unwrap();
        assert!(
            names(&s).contains(&"memory.available<100Mi".to_string()),
            "{:?}",
            names(&s)
        );
        // Merging brings the defaults to an empty map too.
        let merged =
            Config::from_yaml("evictionHard: {}\nmergeDefaultEvictionSettings: true\n").unwrap();
        let s = ReactorSettings::from_config(&merged).unwrap();
        assert!(
            names(&s).contains(&"memory.available<100Mi".to_string()),
            "{:?}",
            names(&s)
        );
    }

    #[test]
    fn containerfs_thresholds_follow_the_observed_layout() {
        let mut s = settings(&[("nodefs.available", "1Gi"), ("imagefs.available", "2Gi")]);
        // Until the filesystems are observed: one shared filesystem, nodefs's thresholds.
        assert_eq!(s.layout, FsLayout::Shared);
        assert_eq!(
            names(&s),
            [
                "nodefs.available<1Gi",
                "imagefs.available<2Gi",
                "containerfs.available<1Gi"
            ]
        );
        // A separate image filesystem holding the writable layers: imagefs's.
        assert!(s.set_layout(FsLayout::ImageFs));
        assert_eq!(
            names(&s)[..2],
            ["nodefs.available<1Gi", "imagefs.available<2Gi"],
            "configured thresholds keep their place"
        );
        assert_eq!(names(&s)[2], "containerfs.available<2Gi");
        assert!(!s.set_layout(FsLayout::ImageFs), "no change");
        // A split image filesystem: the writable layers are back with nodefs.
        assert!(s.set_layout(FsLayout::ImageFsContainerFs));
        assert_eq!(names(&s)[2], "containerfs.available<1Gi");
        // Nothing on imagefs configured: a separate imagefs derives nothing for containerfs.
        let mut s = settings(&[("memory.available", "100Mi")]);
        let before = names(&s);
        assert!(!s.set_layout(FsLayout::ImageFs));
        assert_eq!(names(&s), before);
        assert!(
            before.iter().all(|t| !t.starts_with("containerfs")),
            "{before:?}"
        );
        assert_eq!(s.layout, FsLayout::ImageFs);
    }
}
