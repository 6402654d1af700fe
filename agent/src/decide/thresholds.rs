//! Eviction thresholds from KubeletConfiguration maps, parsed by the kubelet's rules.
//!
//! An operator pastes `evictionHard`, `evictionSoft`, `evictionSoftGracePeriod` and
//! `evictionMinimumReclaim` from their kubelet config; the agent must arrive at the same set
//! of thresholds the kubelet would, including its quirks: the defaults apply only when
//! `evictionHard` is empty unless `mergeDefaultEvictionSettings` is set, `"0%"` and `"100%"`
//! switch a threshold off, a soft threshold needs a grace period, a hard `memory.available`
//! threshold is copied to `allocatableMemory.available` when node allocatable is enforced on
//! pods, and `containerfs` thresholds are never the operator's but derived from `nodefs` or
//! `imagefs` by filesystem layout.

use std::collections::BTreeMap;
use std::fmt;

use crate::decide::duration::parse_go_duration_nanos;
use crate::decide::quantity::Quantity;
use crate::decide::quantity_text::{binary_si, decimal_si};
use crate::decide::signal::{FsLayout, Signal};

/// The kubelet's default hard thresholds (Linux), used when `evictionHard` is empty and merged
/// under the operator's when `mergeDefaultEvictionSettings` is true.
pub(crate) const DEFAULT_EVICTION_HARD: [(&str, &str); 5] = [
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
    ("imagefs.inodesFree", "5%"),
];

/// A threshold's level: an absolute amount, or a share of the signal's capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ThresholdValue {
    /// An absolute amount (`"500Mi"`, `"1000"` inodes).
    Quantity(Quantity),
    /// A percentage of capacity. `fraction` is held in single precision as the kubelet holds
    /// it (`float32(percent) / 100`), so `10%` of a capacity lands on the same byte.
    Percentage {
        /// The percentage as written (`10` for `"10%"`), for display.
        percent: f32,
        /// `percent / 100` in single precision, the figure the kubelet multiplies by.
        fraction: f32,
    },
}

impl ThresholdValue {
    /// The amount this value stands for on a resource of the given capacity, as the kubelet's
    /// `GetThresholdQuantity` computes it (a percentage truncates to whole units).
    pub(crate) fn quantity(&self, capacity: Quantity) -> Quantity {
        match *self {
            ThresholdValue::Quantity(q) => q,
            ThresholdValue::Percentage { fraction, .. } => {
                let cap = capacity.value() as f64;
                Quantity::from_units((cap * f64::from(fraction)) as i64)
            }
        }
    }

    /// Whether the value needs the signal's capacity to mean anything.
    pub(crate) fn is_percentage(&self) -> bool {
        matches!(self, ThresholdValue::Percentage { .. })
    }

    /// The value as an operator writes it (`"10%"`, `"100Mi"`, `"5k"`).
    pub(crate) fn display(&self, bytes: bool) -> String {
        match *self {
            ThresholdValue::Quantity(q) => format_quantity(q, bytes),
            ThresholdValue::Percentage { percent, .. } => format!("{percent}%"),
        }
    }
}

/// Prints a quantity as the kubelet would: binary suffixes for bytes, decimal for counts, and
/// the exact form when it is not a whole number.
pub(crate) fn format_quantity(q: Quantity, bytes: bool) -> String {
    if q.nanos() % 1_000_000_000 != 0 {
        return q.to_string();
    }
    let units = q.nanos() / 1_000_000_000;
    if bytes {
        binary_si(units)
    } else {
        decimal_si(units)
    }
}

/// One eviction threshold: evict when the signal's available amount drops below the value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    /// The measured signal.
    pub signal: Signal,
    /// The level below which the threshold is met.
    pub value: ThresholdValue,
    /// How long the threshold must hold before it acts, in nanoseconds; zero means a hard
    /// threshold (the kubelet decides "hard" by this alone).
    pub grace_period_nanos: i64,
    /// How much beyond the threshold an eviction reclaims.
    pub min_reclaim: Option<ThresholdValue>,
}

impl Threshold {
    /// Whether the threshold acts at once and evicts with no grace period.
    pub(crate) fn is_hard(&self) -> bool {
        self.grace_period_nanos == 0
    }

    /// The level available must stay above: the threshold's amount, plus the minimum reclaim
    /// when `with_min_reclaim` (the level an eviction reclaims up to).
    pub(crate) fn level(&self, capacity: Quantity, with_min_reclaim: bool) -> Quantity {
        let mut q = self.value.quantity(capacity);
        if with_min_reclaim {
            if let Some(min) = self.min_reclaim {
                q = q.saturating_add(min.quantity(capacity));
            }
        }
        q
    }

    /// Whether the threshold needs the signal's capacity (a percentage value or reclaim).
    pub(crate) fn needs_capacity(&self) -> bool {
        self.value.is_percentage() || self.min_reclaim.is_some_and(|m| m.is_percentage())
    }
}

/// A setting the kubelet would refuse at start, with the config key it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct ThresholdError {
    /// The dotted key path (`evictionHard.memory.available`).
    pub key: String,
    /// What is wrong.
    pub reason: String,
}

impl ThresholdError {
    fn new(key: String, reason: impl Into<String>) -> Self {
        ThresholdError {
            key,
            reason: reason.into(),
        }
    }
}

/// The eviction part of a KubeletConfiguration, as maps of signal name to text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EvictionSettings {
    /// `evictionHard`.
    pub hard: BTreeMap<String, String>,
    /// Whether `evictionHard` was given at all (an explicit `{}` included). The kubelet
    /// applies its defaults only when the field is absent (`if obj.EvictionHard == nil`):
    /// given empty, there are no hard thresholds (unless merging with the defaults).
    pub hard_given: bool,
    /// `evictionSoft`.
    pub soft: BTreeMap<String, String>,
    /// `evictionSoftGracePeriod` (Go durations).
    pub soft_grace_period: BTreeMap<String, String>,
    /// `evictionMinimumReclaim`.
    pub minimum_reclaim: BTreeMap<String, String>,
    /// `mergeDefaultEvictionSettings`.
    pub merge_defaults: bool,
    /// Whether `enforceNodeAllocatable` contains `pods` (adds allocatable memory thresholds).
    pub enforce_allocatable_pods: bool,
}

fn parse_signal(section: &str, name: &str) -> Result<Signal, ThresholdError> {
    Signal::parse(name).ok_or_else(|| {
        ThresholdError::new(
            format!("{section}.{name}"),
            format!("unsupported eviction signal {name:?}"),
        )
    })
}

/// Parses a percentage as the kubelet does: single precision, then divided by 100.
fn parse_percentage(key: &str, text: &str) -> Result<(f32, f32), ThresholdError> {
    let digits = text.trim_end_matches('%');
    let percent: f32 = digits.parse().map_err(|_| {
        ThresholdError::new(key.to_string(), format!("invalid percentage {text:?}"))
    })?;
    if !percent.is_finite() {
        return Err(ThresholdError::new(
            key.to_string(),
            format!("invalid percentage {text:?}"),
        ));
    }
    Ok((percent, percent / 100.0))
}

fn parse_quantity(key: &str, text: &str) -> Result<Quantity, ThresholdError> {
    Quantity::parse(text).map_err(|e| ThresholdError::new(key.to_string(), e.to_string()))
}

/// One `evictionHard`/`evictionSoft` entry; `None` when the kubelet ignores it (`0%`, `100%`).
fn parse_statement(
    section: &str,
    name: &str,
    text: &str,
) -> Result<Option<(Signal, ThresholdValue)>, ThresholdError> {
    let signal = parse_signal(section, name)?;
    let key = format!("{section}.{name}");
    if text.ends_with('%') {
        if text == "0%" || text == "100%" {
            return Ok(None);
        }
        let (percent, fraction) = parse_percentage(&key, text)?;
        if fraction < 0.0 {
            return Err(ThresholdError::new(
                key,
                format!("eviction percentage threshold must be >= 0%: {text}"),
            ));
        }
        if fraction > 1.0 {
            return Err(ThresholdError::new(
                key,
                format!("eviction percentage threshold must be <= 100%: {text}"),
            ));
        }
        return Ok(Some((
            signal,
            ThresholdValue::Percentage { percent, fraction },
        )));
    }
    let q = parse_quantity(&key, text)?;
    if q.nanos() <= 0 {
        return Err(ThresholdError::new(
            key,
            format!("eviction threshold must be positive: {text}"),
        ));
    }
    Ok(Some((signal, ThresholdValue::Quantity(q))))
}

fn parse_min_reclaim(name: &str, text: &str) -> Result<(Signal, ThresholdValue), ThresholdError> {
    const SECTION: &str = "evictionMinimumReclaim";
    let signal = parse_signal(SECTION, name)?;
    let key = format!("{SECTION}.{name}");
    if text.ends_with('%') {
        let (percent, fraction) = parse_percentage(&key, text)?;
        if fraction <= 0.0 {
            return Err(ThresholdError::new(
                key,
                format!("eviction percentage minimum reclaim must be positive: {text}"),
            ));
        }
        return Ok((signal, ThresholdValue::Percentage { percent, fraction }));
    }
    let q = parse_quantity(&key, text)?;
    if q.is_negative() {
        return Err(ThresholdError::new(
            key,
            format!("negative eviction minimum reclaim: {text}"),
        ));
    }
    Ok((signal, ThresholdValue::Quantity(q)))
}

/// The `evictionHard` map the kubelet actually uses: the defaults when none is given, the
/// operator's alone when some are given, or both (operator's winning) when merging.
pub(crate) fn effective_hard(settings: &EvictionSettings) -> BTreeMap<String, String> {
    let defaults = || {
        DEFAULT_EVICTION_HARD
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    if settings.hard.is_empty() && !settings.hard_given {
        return defaults();
    }
    if settings.merge_defaults {
        let mut merged = defaults();
        merged.extend(settings.hard.clone());
        return merged;
    }
    settings.hard.clone()
}

fn signal_order(map: &BTreeMap<String, String>) -> impl Iterator<Item = (&String, &String)> + '_ {
    // Known signals in their fixed order first, then anything else (which fails to parse),
    // so the list reads the same every time.
    let mut entries: Vec<_> = map.iter().collect();
    entries.sort_by_key(|(k, _)| {
        Signal::parse(k).map_or(usize::MAX, |s| {
            Signal::ALL.iter().position(|x| *x == s).unwrap_or(0)
        })
    });
    entries.into_iter()
}

/// Parses the eviction settings into thresholds as the kubelet's `ParseThresholdConfig` does:
/// hard thresholds, then soft ones (each needs a grace period), minimum reclaims attached by
/// signal, and allocatable copies of hard `memory.available` when pods' allocatable is enforced.
pub(crate) fn parse_thresholds(
    settings: &EvictionSettings,
) -> Result<Vec<Threshold>, ThresholdError> {
    let hard_map = effective_hard(settings);
    let mut results = Vec::new();
    for (name, text) in signal_order(&hard_map) {
        if let Some((signal, value)) = parse_statement("evictionHard", name, text)? {
            results.push(Threshold {
                signal,
                value,
                grace_period_nanos: 0,
                min_reclaim: None,
            });
        }
    }
    let mut soft = Vec::new();
    for (name, text) in signal_order(&settings.soft) {
        if let Some(parsed) = parse_statement("evictionSoft", name, text)? {
            soft.push(parsed);
        }
    }
    let mut grace = BTreeMap::new();
    for (name, text) in signal_order(&settings.soft_grace_period) {
        let signal = parse_signal("evictionSoftGracePeriod", name)?;
        let key = format!("evictionSoftGracePeriod.{name}");
        let nanos = parse_go_duration_nanos(text)
            .map_err(|e| ThresholdError::new(key.clone(), e.to_string()))?;
        if nanos < 0 {
            return Err(ThresholdError::new(
                key,
                format!("invalid eviction grace period {text:?}: must not be negative"),
            ));
        }
        grace.insert(signal, nanos);
    }
    let mut reclaim = BTreeMap::new();
    for (name, text) in signal_order(&settings.minimum_reclaim) {
        let (signal, value) = parse_min_reclaim(name, text)?;
        reclaim.insert(signal, value);
    }
    for (signal, value) in soft {
        let Some(&grace_period_nanos) = grace.get(&signal) else {
            return Err(ThresholdError::new(
                format!("evictionSoftGracePeriod.{signal}"),
                format!("grace period must be specified for the soft eviction threshold {signal}"),
            ));
        };
        results.push(Threshold {
            signal,
            value,
            grace_period_nanos,
            min_reclaim: None,
        });
    }
    for t in &mut results {
        t.min_reclaim = reclaim.get(&t.signal).copied();
    }
    if settings.enforce_allocatable_pods {
        let copies: Vec<Threshold> = results
            .iter()
            .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
            .map(|t| Threshold {
                signal: Signal::AllocatableMemoryAvailable,
                ..*t
            })
            .collect();
        results.extend(copies);
    }
    Ok(results)
}

/// Replaces any `containerfs` thresholds with the ones the kubelet derives for the layout:
/// copies of the `nodefs` thresholds when the writable layers live with nodefs (one shared
/// filesystem, or a split image filesystem), copies of `imagefs` ones when they live on the
/// image filesystem. Returns the warnings the kubelet logs for thresholds it overrode.
pub(crate) fn with_containerfs_thresholds(
    thresholds: &[Threshold],
    layout: FsLayout,
) -> (Vec<Threshold>, Vec<String>) {
    let mut warnings = Vec::new();
    let mut out: Vec<Threshold> = Vec::with_capacity(thresholds.len() + 4);
    for t in thresholds {
        if matches!(
            t.signal,
            Signal::ContainerFsAvailable | Signal::ContainerFsInodesFree
        ) {
            warnings.push(format!(
                "{} thresholds are derived from the filesystem layout; the configured one is ignored",
                t.signal
            ));
        } else {
            out.push(*t);
        }
    }
    let (bytes_from, inodes_from) = match layout {
        FsLayout::Shared | FsLayout::ImageFsContainerFs => {
            (Signal::NodeFsAvailable, Signal::NodeFsInodesFree)
        }
        FsLayout::ImageFs => (Signal::ImageFsAvailable, Signal::ImageFsInodesFree),
    };
    let derived: Vec<Threshold> = [
        (bytes_from, Signal::ContainerFsAvailable),
        (inodes_from, Signal::ContainerFsInodesFree),
    ]
    .iter()
    .flat_map(|&(from, to)| {
        // One hard and one soft per source, as the kubelet keeps the last of each.
        let hard = out
            .iter()
            .rev()
            .find(|t| t.signal == from && t.is_hard())
            .copied();
        let soft = out
            .iter()
            .rev()
            .find(|t| t.signal == from && !t.is_hard())
            .copied();
        [hard, soft]
            .into_iter()
            .flatten()
            .map(move |t| Threshold { signal: to, ..t })
    })
    .collect();
    out.extend(derived);
    (out, warnings)
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.signal.resource().is_bytes();
        write!(f, "{}<{}", self.signal, self.value.display(bytes))
    }
}

/// The grace period an evicted pod gets, as the kubelet's eviction manager asks for it: none
/// for a hard threshold; for a soft one `evictionMaxPodGracePeriod`, lowered to the pod's own
/// `terminationGracePeriodSeconds` when the pod sets a smaller one (with
/// `evictionMaxPodGracePeriod` at 0, that is 0 too). This is the override the manager asks
/// for; the kubelet's pod worker honours it but never kills with less than 1 second, which is
/// the process runtime's business, not this rule's.
pub(crate) fn pod_grace_period_seconds(
    threshold: &Threshold,
    max_pod_grace_period: i64,
    pod_termination_grace_period: Option<i64>,
) -> i64 {
    if threshold.is_hard() {
        return 0;
    }
    match pod_termination_grace_period {
        Some(pod) => max_pod_grace_period.min(pod),
        None => max_pod_grace_period,
    }
}

/// One `evictionHard` entry parsed by the kubelet's rules, its signal checked: the value, or
/// `None` when the kubelet ignores it (`0%`, `100%`). For callers that need one threshold's
/// level without the whole set ([`parse_thresholds`]).
pub(crate) fn parse_hard(name: &str, text: &str) -> Result<Option<ThresholdValue>, ThresholdError> {
    Ok(parse_statement("evictionHard", name, text)?.map(|(_, value)| value))
}

/// The usage at which a memory threshold of `value` is met on `capacity_bytes`: capacity
/// minus the threshold's amount ([`ThresholdValue::quantity`], the kubelet's figure),
/// floored at zero. The working set is usage minus inactive file pages, so usage reaches
/// this figure at or before the working set meets the threshold: a usage notification armed
/// here wakes the loop no later than the signal crosses.
pub(crate) fn usage_at(capacity_bytes: u64, value: &ThresholdValue) -> u64 {
    let capacity = Quantity::from_units(i64::try_from(capacity_bytes).unwrap_or(i64::MAX));
    let level = u64::try_from(value.quantity(capacity).value()).unwrap_or(0);
    capacity_bytes.saturating_sub(level)
}

/// Checks the eviction keys of an agent config the way `reactor run --config` must: every
/// threshold the kubelet would refuse is refused here, with its key path.
pub fn validate(settings: &EvictionSettings) -> Result<(), ThresholdError> {
    parse_thresholds(settings).map(|_| ())
}

/// A threshold on `signal` at `mi` MiB (`grace_nanos` 0: hard), for the rules' unit tests.
#[cfg(test)]
pub(crate) fn mebibytes(signal: Signal, mi: i64, grace_nanos: i64) -> Threshold {
    Threshold {
        signal,
        value: ThresholdValue::Quantity(Quantity::from_units(mi << 20)),
        grace_period_nanos: grace_nanos,
        min_reclaim: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn settings(hard: &[(&str, &str)]) -> EvictionSettings {
        EvictionSettings {
            hard: map(hard),
            enforce_allocatable_pods: false,
            ..Default::default()
        }
    }

    fn signals(ts: &[Threshold]) -> Vec<&'static str> {
        ts.iter().map(|t| t.signal.name()).collect()
    }

    #[test]
    fn no_settings_means_the_kubelet_defaults() {
        let ts = parse_thresholds(&settings(&[])).unwrap();
        assert_eq!(
            signals(&ts),
            [
                "memory.available",
                "nodefs.available",
                "nodefs.inodesFree",
                "imagefs.available",
                "imagefs.inodesFree"
            ]
        );
        assert_eq!(
            ts[0].value,
            ThresholdValue::Quantity(Quantity::from_units(100 << 20))
        );
        assert!(ts.iter().all(Threshold::is_hard));
    }

    #[test]
    fn partial_hard_drops_the_other_defaults_unless_merging() {
        let s = settings(&[("memory.available", "500Mi")]);
        assert_eq!(
            signals(&parse_thresholds(&s).unwrap()),
            ["memory.available"]
        );
        let merged = EvictionSettings {
            merge_defaults: true,
            ..s
        };
        let ts = parse_thresholds(&merged).unwrap();
        assert_eq!(ts.len(), 5);
        assert_eq!(
            ts[0].value,
            ThresholdValue::Quantity(Quantity::from_units(500 << 20))
        );
        // Given as an explicit empty map: no hard thresholds, as the kubelet (its defaults
        // apply only when the field is absent); merging still brings them in.
        let empty = EvictionSettings {
            hard_given: true,
            ..settings(&[])
        };
        assert!(parse_thresholds(&empty).unwrap().is_empty());
        let merged_empty = EvictionSettings {
            merge_defaults: true,
            ..empty
        };
        assert_eq!(parse_thresholds(&merged_empty).unwrap().len(), 5);
        // "0%" switches a default off even when merging.
        let off = EvictionSettings {
            hard: map(&[("nodefs.available", "0%")]),
            merge_defaults: true,
            ..Default::default()
        };
        let ts = parse_thresholds(&off).unwrap();
        assert!(!signals(&ts).contains(&"nodefs.available"));
        assert_eq!(ts.len(), 4);
    }

    #[test]
    fn zero_and_hundred_percent_are_ignored_other_bad_values_refused() {
        let ts = parse_thresholds(&settings(&[
            ("memory.available", "100%"),
            ("nodefs.available", "0%"),
            ("pid.available", "10"),
        ]))
        .unwrap();
        assert_eq!(signals(&ts), ["pid.available"]);
        for (sig, val, needle) in [
            ("memory.available", "101%", "<= 100%"),
            ("memory.available", "-5%", ">= 0%"),
            ("memory.available", "0", "positive"),
            ("memory.available", "-1Mi", "positive"),
            ("memory.available", "12Qi", "12Qi"),
            ("memory.available", "abc%", "invalid percentage"),
            ("swap.available", "1Gi", "unsupported eviction signal"),
        ] {
            let err = parse_thresholds(&settings(&[(sig, val)])).unwrap_err();
            assert_eq!(err.key, format!("evictionHard.{sig}"));
            assert!(err.reason.contains(needle), "{err}");
        }
    }

    #[test]
    fn soft_needs_grace_period_and_reclaim_attaches_by_signal() {
        let s = EvictionSettings {
            hard: map(&[("memory.available", "100Mi")]),
            soft: map(&[("memory.available", "300Mi")]),
            ..Default::default()
        };
        let err = parse_thresholds(&s).unwrap_err();
        assert_eq!(err.key, "evictionSoftGracePeriod.memory.available");
        assert!(err.reason.contains("grace period must be specified"));
        let s = EvictionSettings {
            soft_grace_period: map(&[("memory.available", "1m30s")]),
            minimum_reclaim: map(&[("memory.available", "50Mi")]),
            ..s
        };
        let ts = parse_thresholds(&s).unwrap();
        assert_eq!(ts.len(), 2);
        assert!(ts[0].is_hard());
        assert_eq!(ts[1].grace_period_nanos, 90_000_000_000);
        let min = ThresholdValue::Quantity(Quantity::from_units(50 << 20));
        assert_eq!(ts[0].min_reclaim, Some(min));
        assert_eq!(ts[1].min_reclaim, Some(min));
        // A soft threshold switched off by "0%" needs no grace period.
        let s = EvictionSettings {
            soft: map(&[("memory.available", "0%")]),
            ..Default::default()
        };
        assert!(parse_thresholds(&s).is_ok());
    }

    #[test]
    fn grace_and_reclaim_errors_name_their_keys() {
        let bad = |s: EvictionSettings, key: &str| {
            let err = parse_thresholds(&s).unwrap_err();
            assert_eq!(err.key, key, "{err}");
        };
        bad(
            EvictionSettings {
                soft_grace_period: map(&[("memory.available", "-1s")]),
                ..Default::default()
            },
            "evictionSoftGracePeriod.memory.available",
        );
        bad(
            EvictionSettings {
                soft_grace_period: map(&[("memory.available", "soon")]),
                ..Default::default()
            },
            "evictionSoftGracePeriod.memory.available",
        );
        bad(
            EvictionSettings {
                minimum_reclaim: map(&[("memory.available", "0%")]),
                ..Default::default()
            },
            "evictionMinimumReclaim.memory.available",
        );
        bad(
            EvictionSettings {
                minimum_reclaim: map(&[("nodefs.available", "-1Gi")]),
                ..Default::default()
            },
            "evictionMinimumReclaim.nodefs.available",
        );
        bad(
            EvictionSettings {
                minimum_reclaim: map(&[("bogus", "1Gi")]),
                ..Default::default()
            },
            "evictionMinimumReclaim.bogus",
        );
        // Zero as a quantity is a valid (no-op) minimum reclaim.
        assert!(parse_thresholds(&EvictionSettings {
            minimum_reclaim: map(&[("memory.available", "0Mi")]),
            ..Default::default()
        })
        .is_ok());
    }

    #[test]
    fn allocatable_copies_hard_memory_only() {
        let s = EvictionSettings {
            hard: map(&[("memory.available", "200Mi")]),
            soft: map(&[("memory.available", "400Mi")]),
            soft_grace_period: map(&[("memory.available", "1m")]),
            enforce_allocatable_pods: true,
            ..Default::default()
        };
        let ts = parse_thresholds(&s).unwrap();
        assert_eq!(
            signals(&ts),
            [
                "memory.available",
                "memory.available",
                "allocatableMemory.available"
            ]
        );
        assert!(ts[2].is_hard());
        assert_eq!(ts[2].value, ts[0].value);
    }

    #[test]
    fn usage_at_is_capacity_minus_the_kubelets_amount() {
        fn hard(text: &str) -> ThresholdValue {
            parse_hard("memory.available", text).unwrap().unwrap()
        }
        let gib = 1u64 << 30;
        assert_eq!(usage_at(8 * gib, &hard("100Mi")), 8 * gib - (100 << 20));
        assert_eq!(usage_at(1000, &hard("10%")), 900);
        assert_eq!(usage_at(50, &hard("1Ki")), 0, "floored at zero");
        // A percentage is the kubelet's single-precision share, as the loop evaluates it:
        // float32(0.1) lands 16 bytes above a tenth of 10Gi, so the usage is 16 bytes lower.
        assert_eq!(usage_at(10 * gib, &hard("10%")), 10 * gib - 1_073_741_840);
        // Within single precision of the exact share, for capacities a node has.
        for cap in [64 << 20, 1000 << 20, 3 * gib + 12_345, 256 * gib] {
            for p in [1u64, 5, 10, 33, 50, 99] {
                let exact = cap - cap * p / 100;
                let got = usage_at(cap, &hard(&format!("{p}%")));
                assert!(
                    got.abs_diff(exact) <= (cap >> 22) + 1,
                    "{cap} {p}%: {got} vs {exact}"
                );
            }
        }
    }

    #[test]
    fn parse_hard_refuses_what_the_kubelet_refuses_and_ignores_what_it_ignores() {
        assert_eq!(parse_hard("memory.available", "0%").unwrap(), None);
        assert_eq!(parse_hard("memory.available", "100%").unwrap(), None);
        for bad in ["12Qi", "150%", "-1", "abc%"] {
            let e = parse_hard("memory.available", bad).unwrap_err();
            assert!(
                e.to_string().starts_with("evictionHard.memory.available: "),
                "{e}"
            );
        }
        assert!(parse_hard("memory.typo", "1Mi").is_err());
    }

    #[test]
    fn percentages_are_single_precision_like_the_kubelet() {
        let ts = parse_thresholds(&settings(&[("nodefs.available", "10%")])).unwrap();
        // float32(0.1) is slightly above 0.1, so 10% of 10Gi is 16 bytes above 1Gi.
        let cap = Quantity::from_units(10 << 30);
        assert_eq!(
            ts[0].value.quantity(cap),
            Quantity::from_units(1_073_741_840)
        );
        assert_eq!(ts[0].value.display(true), "10%");
        let ts = parse_thresholds(&settings(&[("nodefs.available", "7.5%")])).unwrap();
        assert_eq!(ts[0].value.display(true), "7.5%");
    }

    #[test]
    fn containerfs_follows_the_layout() {
        let s = EvictionSettings {
            hard: map(&[
                ("nodefs.available", "10%"),
                ("imagefs.available", "15%"),
                ("containerfs.available", "50%"),
            ]),
            ..Default::default()
        };
        let ts = parse_thresholds(&s).unwrap();
        let (shared, warnings) = with_containerfs_thresholds(&ts, FsLayout::Shared);
        assert_eq!(warnings.len(), 1);
        let c = shared
            .iter()
            .find(|t| t.signal == Signal::ContainerFsAvailable)
            .unwrap();
        assert_eq!(c.value.display(true), "10%");
        let (image, _) = with_containerfs_thresholds(&ts, FsLayout::ImageFs);
        let c = image
            .iter()
            .find(|t| t.signal == Signal::ContainerFsAvailable)
            .unwrap();
        assert_eq!(c.value.display(true), "15%");
        let (split, _) = with_containerfs_thresholds(&ts, FsLayout::ImageFsContainerFs);
        let c = split
            .iter()
            .find(|t| t.signal == Signal::ContainerFsAvailable)
            .unwrap();
        assert_eq!(c.value.display(true), "10%");
        // No inode source, no derived inode threshold.
        assert!(!split
            .iter()
            .any(|t| t.signal == Signal::ContainerFsInodesFree));
    }

    #[test]
    fn pod_grace_period_rules() {
        let hard = Threshold {
            signal: Signal::MemoryAvailable,
            value: ThresholdValue::Quantity(Quantity::from_units(1)),
            grace_period_nanos: 0,
            min_reclaim: None,
        };
        let soft = Threshold {
            grace_period_nanos: 1,
            ..hard
        };
        assert_eq!(pod_grace_period_seconds(&hard, 60, Some(30)), 0);
        assert_eq!(pod_grace_period_seconds(&soft, 60, Some(30)), 30);
        assert_eq!(pod_grace_period_seconds(&soft, 20, Some(30)), 20);
        assert_eq!(pod_grace_period_seconds(&soft, 60, None), 60);
        assert_eq!(pod_grace_period_seconds(&soft, 0, Some(30)), 0);
    }

    #[test]
    fn level_adds_min_reclaim_only_when_asked() {
        let t = Threshold {
            signal: Signal::NodeFsAvailable,
            value: ThresholdValue::Quantity(Quantity::from_units(1 << 30)),
            grace_period_nanos: 0,
            min_reclaim: Some(ThresholdValue::Quantity(Quantity::from_units(500 << 20))),
        };
        let cap = Quantity::from_units(100 << 30);
        assert_eq!(t.level(cap, false), Quantity::from_units(1 << 30));
        assert_eq!(
            t.level(cap, true),
            Quantity::from_units((1 << 30) + (500 << 20))
        );
        assert_eq!(format_quantity(t.level(cap, true), true), "1524Mi");
        assert_eq!(t.to_string(), "nodefs.available<1Gi");
    }
}
