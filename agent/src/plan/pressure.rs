//! `reactor plan pressure`: thresholds, grace periods, minimum reclaim and node conditions
//! over a sequence of observations, one eviction-manager pass per observation.
//!
//! Input `{"config", "capacity", "observations"}` (and optionally `"filesystems"`, which
//! decides what `containerfs` thresholds inherit); output the normalized thresholds and one
//! step per observation. With the agent's `config.memoryReclaim.enabled`, an observation may
//! give kubepods' active file pages (`activeFile`), and a step with a memory eviction due
//! shows the loop's reclaim-first choice (`memoryReclaim`: reclaim or skip, and how much). Settings the kubelet would refuse at start (a soft threshold without
//! a grace period, a percentage over 100, an unknown signal) exit 2 naming the key.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::decide::duration::{format_go_duration, parse_go_duration_nanos};
use crate::decide::memory_reclaim::{memory_shortfall, next_step, ReclaimView, Step};
use crate::decide::pressure::{pass_with_psi, EvictionState, Observation, Observations};
use crate::decide::psi_conditions::{
    FullAverages, PsiReadings, PsiSettings, DEFAULT_THRESHOLD, SOURCES, THRESHOLD_KEYS,
};
use crate::decide::quantity::Quantity;
use crate::decide::signal::{FsLayout, Signal};
use crate::decide::thresholds::{
    format_quantity, parse_thresholds, pod_grace_period_seconds, with_containerfs_thresholds,
    EvictionSettings, Threshold,
};
use crate::decide::timestamp::{parse_rfc3339, UnixNanos};
use crate::plan::evict::LayoutName;
use crate::plan::input::{invalid, parse, InputError};

/// The kubelet's default for `evictionPressureTransitionPeriod`; it also replaces a zero.
const DEFAULT_TRANSITION_NANOS: i64 = 300_000_000_000;

/// A map value written as a string or a bare number (`"500Mi"`, `1000`).
#[derive(Debug, Clone)]
struct Text(String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Text(s)),
            Value::Number(n) => Ok(Text(n.to_string())),
            other => Err(serde::de::Error::custom(format!(
                "expected a string or a number, found {other}"
            ))),
        }
    }
}

/// A non-negative quantity written as a string or a plain integer.
#[derive(Debug, Clone, Copy)]
struct Amount(Quantity);

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = Text::deserialize(d)?.0;
        parse_amount(&text)
            .map(Amount)
            .map_err(serde::de::Error::custom)
    }
}

/// An amount of the input that is not a non-negative quantity.
#[derive(Debug, thiserror::Error)]
enum AmountError {
    /// Not a quantity at all.
    #[error(transparent)]
    Quantity(#[from] crate::decide::quantity::QuantityError),
    /// A quantity below zero.
    #[error("quantity {0:?} must not be negative")]
    Negative(String),
    /// Neither a quantity string nor an integer.
    #[error("expected a quantity string or an integer, found {0}")]
    NotAmount(Value),
}

fn parse_amount(text: &str) -> Result<Quantity, AmountError> {
    let q = Quantity::parse(text)?;
    if q.is_negative() {
        return Err(AmountError::Negative(text.to_string()));
    }
    Ok(q)
}

/// The eviction settings, with KubeletConfiguration names; other keys are ignored so a whole
/// kubelet config can be pasted.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConfigIn {
    #[serde(default)]
    eviction_hard: Option<BTreeMap<String, Text>>,
    #[serde(default)]
    eviction_soft: Option<BTreeMap<String, Text>>,
    #[serde(default)]
    eviction_soft_grace_period: Option<BTreeMap<String, Text>>,
    #[serde(default)]
    eviction_minimum_reclaim: Option<BTreeMap<String, Text>>,
    #[serde(default)]
    eviction_pressure_transition_period: Option<String>,
    #[serde(default)]
    eviction_max_pod_grace_period: Option<i64>,
    #[serde(default)]
    merge_default_eviction_settings: Option<bool>,
    #[serde(default)]
    enforce_node_allocatable: Option<Vec<String>>,
    #[serde(default)]
    memory_reclaim: Option<MemoryReclaimIn>,
    /// The kubelet's feature gates; only `PSINodeCondition` changes the plan.
    #[serde(default)]
    feature_gates: Option<BTreeMap<String, bool>>,
    #[serde(default)]
    system_memory_contention_threshold: Option<f64>,
    #[serde(default)]
    system_disk_contention_threshold: Option<f64>,
    #[serde(default)]
    kubepods_memory_contention_threshold: Option<f64>,
    #[serde(default)]
    kubepods_disk_contention_threshold: Option<f64>,
}

impl ConfigIn {
    /// KEP-5394's gate and thresholds (the kubelet's defaults where not given); a threshold
    /// that is not a percentage is refused naming its key.
    fn psi(&self) -> Result<PsiSettings, InputError> {
        let enabled = self
            .feature_gates
            .as_ref()
            .and_then(|g| g.get("PSINodeCondition"))
            .copied()
            .unwrap_or(false);
        let given = [
            self.system_memory_contention_threshold,
            self.system_disk_contention_threshold,
            self.kubepods_memory_contention_threshold,
            self.kubepods_disk_contention_threshold,
        ];
        let mut thresholds = [DEFAULT_THRESHOLD; 4];
        for (i, g) in given.into_iter().enumerate() {
            if let Some(v) = g {
                PsiSettings::check_threshold(v)
                    .map_err(|e| invalid(format!("config.{}", THRESHOLD_KEYS[i]), e))?;
                thresholds[i] = v;
            }
        }
        Ok(PsiSettings {
            enabled,
            thresholds,
        })
    }
}

/// The agent's `memoryReclaim` section; only `enabled` changes the plan (the time bound is
/// a live matter).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MemoryReclaimIn {
    #[serde(default)]
    enabled: bool,
}

/// Capacities the percentages refer to.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CapacityIn {
    memory: Option<Amount>,
    allocatable_memory: Option<Amount>,
    nodefs: Option<Amount>,
    nodefs_inodes: Option<Amount>,
    imagefs: Option<Amount>,
    imagefs_inodes: Option<Amount>,
    containerfs: Option<Amount>,
    containerfs_inodes: Option<Amount>,
    pid: Option<Amount>,
}

impl CapacityIn {
    /// The capacity of a signal and the input key it comes from; containerfs falls back to
    /// the filesystem it shares under the layout.
    fn of(&self, signal: Signal, layout: FsLayout) -> (Option<Quantity>, &'static str) {
        let pick = |a: &Option<Amount>| a.map(|a| a.0);
        match signal {
            Signal::MemoryAvailable => (pick(&self.memory), "memory"),
            Signal::AllocatableMemoryAvailable => {
                (pick(&self.allocatable_memory), "allocatableMemory")
            }
            Signal::NodeFsAvailable => (pick(&self.nodefs), "nodefs"),
            Signal::NodeFsInodesFree => (pick(&self.nodefs_inodes), "nodefsInodes"),
            Signal::ImageFsAvailable => (pick(&self.imagefs), "imagefs"),
            Signal::ImageFsInodesFree => (pick(&self.imagefs_inodes), "imagefsInodes"),
            Signal::ContainerFsAvailable => {
                let shared = match layout {
                    FsLayout::ImageFs => pick(&self.imagefs),
                    _ => pick(&self.nodefs),
                };
                (pick(&self.containerfs).or(shared), "containerfs")
            }
            Signal::ContainerFsInodesFree => {
                let shared = match layout {
                    FsLayout::ImageFs => pick(&self.imagefs_inodes),
                    _ => pick(&self.nodefs_inodes),
                };
                (
                    pick(&self.containerfs_inodes).or(shared),
                    "containerfsInodes",
                )
            }
            Signal::PidAvailable => (pick(&self.pid), "pid"),
        }
    }
}

#[derive(Debug, Deserialize)]
struct PressureIn {
    #[serde(default)]
    config: Option<ConfigIn>,
    #[serde(default)]
    capacity: Option<CapacityIn>,
    observations: Vec<serde_json::Map<String, Value>>,
    #[serde(default)]
    filesystems: Option<LayoutName>,
}

/// A normalized threshold in the answer.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ThresholdOut {
    /// The signal.
    pub signal: String,
    /// Always `LessThan`, the kubelet's only operator.
    pub operator: String,
    /// `"100Mi"` or `"10%"`.
    pub value: String,
    /// Go duration; `"0s"` for a hard threshold.
    pub grace_period: String,
    /// The minimum reclaim, if any.
    pub min_reclaim: Option<String>,
    /// Whether the threshold is hard (acts at once, no pod grace period).
    pub hard: bool,
}

/// What the manager would evict for at a step.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EvictOut {
    /// The signal acted on.
    pub signal: String,
    /// The available level to reclaim to: threshold plus minimum reclaim.
    pub reclaim_to: String,
    /// The grace period a pod gets (the ceiling for soft thresholds; the pod's own smaller
    /// `terminationGracePeriodSeconds` lowers it further).
    pub grace_period_seconds: i64,
}

/// The reclaim-first choice at a step (`memoryReclaim.enabled`, a memory eviction due).
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MemoryReclaimOut {
    /// `reclaim` (ask `memory.reclaim` first; evict only if the threshold is still met
    /// after) or `skip` (evict at once).
    pub choice: String,
    /// Threshold plus minimum reclaim minus available, the largest among the memory
    /// thresholds.
    pub shortfall: String,
    /// The active file pages given (`activeFile`; none given counts as none).
    pub active_file: String,
    /// What the first `memory.reclaim` write asks for, when reclaiming.
    pub request: Option<String>,
    /// Why reclaim is skipped (`file-pages-short`).
    pub reason: Option<String>,
}

/// One observation's outcome.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct StepOut {
    /// The observation time, as given.
    pub at: String,
    /// Signals of thresholds met now (soft ones once held for their grace period).
    pub met: Vec<String>,
    /// Node conditions reported.
    pub conditions: Vec<String>,
    /// What to evict for, if anything.
    pub evict: Option<EvictOut>,
    /// With `memoryReclaim.enabled`, whether a memory eviction tries reclaim first.
    #[serde(rename = "memoryReclaim", skip_serializing_if = "Option::is_none")]
    pub memory_reclaim: Option<MemoryReclaimOut>,
}

/// The `plan pressure` answer.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct PressurePlan {
    /// The thresholds in force, after defaults, allocatable copies and containerfs derivation.
    pub thresholds: Vec<ThresholdOut>,
    /// One step per observation.
    pub steps: Vec<StepOut>,
}

fn to_strings(map: Option<BTreeMap<String, Text>>) -> BTreeMap<String, String> {
    map.unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect()
}

fn threshold_out(t: &Threshold) -> ThresholdOut {
    let bytes = t.signal.resource().is_bytes();
    ThresholdOut {
        signal: t.signal.name().to_string(),
        operator: "LessThan".to_string(),
        value: t.value.display(bytes),
        grace_period: format_go_duration(std::time::Duration::from_nanos(
            u64::try_from(t.grace_period_nanos).unwrap_or(0),
        )),
        min_reclaim: t.min_reclaim.map(|m| m.display(bytes)),
        hard: t.is_hard(),
    }
}

struct ParsedObservation {
    at_text: String,
    at: UnixNanos,
    observations: Observations,
    /// kubepods' active file pages (`activeFile`), bytes.
    active_file: Option<Quantity>,
}

fn parse_observations(
    raw: Vec<serde_json::Map<String, Value>>,
    capacity: &CapacityIn,
    layout: FsLayout,
) -> Result<Vec<ParsedObservation>, InputError> {
    let mut out: Vec<ParsedObservation> = Vec::with_capacity(raw.len());
    for (i, entry) in raw.into_iter().enumerate() {
        let at_text = match entry.get("at") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(invalid(
                    format!("observations[{i}].at"),
                    format!("expected an RFC 3339 time string, found {other}"),
                ))
            }
            None => return Err(invalid(format!("observations[{i}]"), "missing field `at`")),
        };
        let at =
            parse_rfc3339(&at_text).map_err(|e| invalid(format!("observations[{i}].at"), e))?;
        if let Some(prev) = out.last() {
            if at < prev.at {
                return Err(invalid(
                    format!("observations[{i}].at"),
                    format!("{at_text} is earlier than the observation before it"),
                ));
            }
        }
        let mut observations = Observations::default();
        let mut active_file = None;
        for (key, value) in &entry {
            if key == "at" {
                continue;
            }
            let path = format!("observations[{i}].{key}");
            if key == "activeFile" {
                active_file = Some(amount(value).map_err(|e| invalid(&path, e))?);
                continue;
            }
            if key == "psi" {
                observations.psi = psi_readings(value, &path)?;
                continue;
            }
            let signal = Signal::parse(key)
                .ok_or_else(|| invalid(&path, format!("unsupported eviction signal {key:?}")))?;
            let available = amount(value).map_err(|e| invalid(&path, e))?;
            observations.set(
                signal,
                Observation {
                    available,
                    capacity: capacity.of(signal, layout).0,
                    at,
                },
            );
        }
        out.push(ParsedObservation {
            at_text,
            at,
            observations,
            active_file,
        });
    }
    Ok(out)
}

/// Runs `plan pressure` on raw input bytes.
pub fn run(bytes: &[u8]) -> Result<serde_json::Value, InputError> {
    let input: PressureIn = parse(bytes)?;
    let plan = plan(input)?;
    serde_json::to_value(plan).map_err(|e| InputError::Invalid(e.to_string()))
}

fn plan(input: PressureIn) -> Result<PressurePlan, InputError> {
    let layout = input.filesystems.unwrap_or_default().0;
    let config = input.config.unwrap_or_default();
    let psi = config.psi()?;
    let capacity = input.capacity.unwrap_or_default();
    let settings = EvictionSettings {
        hard_given: config.eviction_hard.is_some(),
        hard: to_strings(config.eviction_hard),
        soft: to_strings(config.eviction_soft),
        soft_grace_period: to_strings(config.eviction_soft_grace_period),
        minimum_reclaim: to_strings(config.eviction_minimum_reclaim),
        merge_defaults: config.merge_default_eviction_settings.unwrap_or(false),
        enforce_allocatable_pods: config
            .enforce_node_allocatable
            .as_ref()
            .is_none_or(|list| list.iter().any(|e| e == "pods")),
    };
    let parsed =
        parse_thresholds(&settings).map_err(|e| invalid(format!("config.{}", e.key), e.reason))?;
    let (thresholds, _warnings) = with_containerfs_thresholds(&parsed, layout);

    let transition = match config.eviction_pressure_transition_period.as_deref() {
        None => DEFAULT_TRANSITION_NANOS,
        Some(text) => {
            let path = "config.evictionPressureTransitionPeriod";
            let nanos = parse_go_duration_nanos(text).map_err(|e| invalid(path, e))?;
            if nanos < 0 {
                return Err(invalid(path, "must not be negative"));
            }
            // The KubeletConfiguration defaulting turns a zero period into the default.
            if nanos == 0 {
                DEFAULT_TRANSITION_NANOS
            } else {
                nanos
            }
        }
    };
    let max_pod_grace = config.eviction_max_pod_grace_period.unwrap_or(0);
    if max_pod_grace < 0 {
        return Err(invalid(
            "config.evictionMaxPodGracePeriod",
            "must not be negative",
        ));
    }

    let reclaim_first = config.memory_reclaim.as_ref().is_some_and(|m| m.enabled);
    let observations = parse_observations(input.observations, &capacity, layout)?;
    // A percentage needs the capacity of the signal it is observed on.
    for t in &thresholds {
        if !t.needs_capacity() {
            continue;
        }
        let observed = observations
            .iter()
            .any(|o| o.observations.get(t.signal).is_some());
        let (cap, key) = capacity.of(t.signal, layout);
        if observed && cap.is_none() {
            return Err(invalid(
                format!("capacity.{key}"),
                format!("required: the threshold {t} is a percentage of it"),
            ));
        }
    }

    let mut state = EvictionState::default();
    let mut steps = Vec::with_capacity(observations.len());
    for o in observations {
        let (next, result) = pass_with_psi(
            &thresholds,
            &psi,
            &state,
            &o.observations,
            o.at,
            i128::from(transition),
        );
        state = next;
        let mut met: Vec<String> = Vec::new();
        for &i in &result.met {
            let name = thresholds[i].signal.name().to_string();
            if !met.contains(&name) {
                met.push(name);
            }
        }
        let evict = result.reclaim.map(|r| EvictOut {
            signal: r.signal.name().to_string(),
            reclaim_to: format_quantity(r.reclaim_to, r.resource.is_bytes()),
            grace_period_seconds: pod_grace_period_seconds(
                &thresholds[r.threshold],
                max_pod_grace,
                None,
            ),
        });
        let memory_reclaim = result
            .reclaim
            .filter(|r| reclaim_first && r.signal.is_memory())
            .map(|_| memory_reclaim_out(&thresholds, &o.observations, o.active_file));
        steps.push(StepOut {
            at: o.at_text,
            met,
            conditions: result
                .conditions
                .iter()
                .map(|c| c.name().to_string())
                .collect(),
            evict,
            memory_reclaim,
        });
    }
    Ok(PressurePlan {
        thresholds: thresholds.iter().map(threshold_out).collect(),
        steps,
    })
}

/// The loop's first reclaim step on these figures ([`next_step`] with no time spent).
fn memory_reclaim_out(
    thresholds: &[Threshold],
    observations: &Observations,
    active_file: Option<Quantity>,
) -> MemoryReclaimOut {
    let active = active_file.map_or(0, |q| u64::try_from(q.value()).unwrap_or(u64::MAX));
    let short = memory_shortfall(thresholds, observations);
    let step = next_step(&ReclaimView {
        shortfall_bytes: short,
        active_file_bytes: active,
        elapsed: std::time::Duration::ZERO,
        timeout: std::time::Duration::MAX,
        steps: 0,
    });
    let bytes = |n: u64| {
        format_quantity(
            Quantity::from_units(i64::try_from(n).unwrap_or(i64::MAX)),
            true,
        )
    };
    let (choice, request, reason) = match step {
        Step::Ask { bytes: b } => ("reclaim", Some(bytes(b)), None),
        Step::Stop(r) => ("skip", None, Some(r.as_str().to_string())),
    };
    MemoryReclaimOut {
        choice: choice.to_string(),
        shortfall: bytes(short),
        active_file: bytes(active),
        request,
        reason,
    }
}

/// An observation's `psi`: `{"system.memory": {"avg10": 12.5, "avg60": 3.1}, ...}`, the
/// `full` averages (percent) of the figures KEP-5394's conditions read; a figure left out
/// is one not read (its condition keeps its state).
fn psi_readings(value: &Value, path: &str) -> Result<PsiReadings, InputError> {
    let Value::Object(map) = value else {
        return Err(invalid(
            path,
            format!(
                "expected an object of PSI figures ({}), found {value}",
                SOURCES.join(", ")
            ),
        ));
    };
    let mut out = PsiReadings::default();
    for (source, figure) in map {
        let at = format!("{path}.{source}");
        let i = SOURCES.iter().position(|s| s == source).ok_or_else(|| {
            invalid(
                &at,
                format!("unknown PSI figure (one of {})", SOURCES.join(", ")),
            )
        })?;
        let Value::Object(f) = figure else {
            return Err(invalid(
                &at,
                format!("expected {{\"avg10\": N, \"avg60\": N}}, found {figure}"),
            ));
        };
        if let Some(k) = f.keys().find(|k| *k != "avg10" && *k != "avg60") {
            return Err(invalid(format!("{at}.{k}"), "unknown field (avg10, avg60)"));
        }
        let avg = |k: &str| -> Result<f64, InputError> {
            let v = f
                .get(k)
                .ok_or_else(|| invalid(&at, format!("missing field `{k}`")))?;
            match v.as_f64() {
                Some(n) if (0.0..=100.0).contains(&n) => Ok(n),
                _ => Err(invalid(
                    format!("{at}.{k}"),
                    format!("{v} is not a percentage from 0 to 100"),
                )),
            }
        };
        out.full[i] = Some(FullAverages {
            avg10: avg("avg10")?,
            avg60: avg("avg60")?,
        });
    }
    Ok(out)
}

/// An observation's amount: a quantity string or a plain integer.
fn amount(value: &Value) -> Result<Quantity, AmountError> {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => return Err(AmountError::NotAmount(other.clone())),
    };
    parse_amount(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run_json(v: Value) -> Result<Value, InputError> {
        run(v.to_string().as_bytes())
    }

    #[test]
    fn defaults_and_a_hard_memory_step() {
        let out = run_json(json!({
            "capacity": {"memory": "1Gi", "nodefs": "100Gi"},
            "observations": [
                {"at": "2026-01-01T00:00:00Z", "memory.available": "500Mi", "nodefs.available": "50Gi"},
                {"at": "2026-01-01T00:00:10Z", "memory.available": "50Mi", "nodefs.available": "50Gi"}
            ]
        }))
        .unwrap();
        let signals: Vec<&str> = out["thresholds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["signal"].as_str().unwrap())
            .collect();
        assert!(signals.contains(&"allocatableMemory.available"));
        assert!(signals.contains(&"containerfs.available"));
        assert_eq!(out["steps"][0]["met"], json!([]));
        assert_eq!(out["steps"][0]["evict"], Value::Null);
        assert_eq!(out["steps"][1]["met"], json!(["memory.available"]));
        assert_eq!(out["steps"][1]["conditions"], json!(["MemoryPressure"]));
        assert_eq!(
            out["steps"][1]["evict"],
            json!({"signal": "memory.available", "reclaimTo": "100Mi", "gracePeriodSeconds": 0})
        );
    }

    /// Found by the `plan` fuzz target: an observation's key is the input's own text, and a
    /// line break in it split the refusal over two lines.
    #[test]
    fn a_signal_key_with_a_line_break_is_named_on_one_line() {
        let err = run_json(json!({
            "capacity": {"memory": "1Gi"},
            "observations": [{"at": "2026-01-01T00:00:00Z", "memory.\navailable": "5\r0Mi"}]
        }))
        .unwrap_err()
        .to_string();
        assert!(!err.contains(['\n', '\r']), "{err:?}");
        assert!(
            err.starts_with("observations[0].memory.\\navailable: unsupported eviction signal"),
            "{err}"
        );
    }

    #[test]
    fn an_explicit_empty_eviction_hard_means_no_hard_thresholds() {
        let input = |config: Value| {
            json!({
                "capacity": {"memory": "1Gi", "nodefs": "100Gi"},
                "config": config,
                "observations": [
                    {"at": "2026-01-01T00:00:00Z", "memory.available": "50Mi", "nodefs.available": "1Gi"}
                ]
            })
        };
        // `{}`: nothing met however low memory is (the kubelet defaults only a nil map).
        let out = run_json(input(json!({"evictionHard": {}}))).unwrap();
        assert_eq!(out["thresholds"], json!([]), "{out}");
        assert_eq!(out["steps"][0]["met"], json!([]));
        // Absent: the defaults.
        let out = run_json(input(json!({}))).unwrap();
        assert_eq!(
            out["steps"][0]["met"],
            json!(["memory.available", "nodefs.available"])
        );
    }

    #[test]
    fn soft_threshold_grace_and_pod_grace_ceiling() {
        let out = run_json(json!({
            "config": {"evictionHard": {"memory.available": "100Mi"},
                       "evictionSoft": {"memory.available": "300Mi"},
                       "evictionSoftGracePeriod": {"memory.available": "30s"},
                       "evictionMinimumReclaim": {"memory.available": "200Mi"},
                       "evictionMaxPodGracePeriod": 45},
            "capacity": {"memory": "2Gi"},
            "observations": [
                {"at": "2026-01-01T00:00:00Z", "memory.available": "250Mi"},
                {"at": "2026-01-01T00:00:30Z", "memory.available": "250Mi"}
            ]
        }))
        .unwrap();
        assert_eq!(out["steps"][0]["met"], json!([]));
        assert_eq!(out["steps"][0]["conditions"], json!(["MemoryPressure"]));
        assert_eq!(
            out["steps"][1]["evict"],
            json!({"signal": "memory.available", "reclaimTo": "500Mi", "gracePeriodSeconds": 45})
        );
    }

    #[test]
    fn refused_settings_name_the_key() {
        for (config, needle) in [
            (
                json!({"evictionSoft": {"memory.available": "1Gi"}}),
                "config.evictionSoftGracePeriod.memory.available: grace period must be specified",
            ),
            (
                json!({"evictionHard": {"nodefs.available": "120%"}}),
                "config.evictionHard.nodefs.available:",
            ),
            (
                json!({"evictionHard": {"disk.available": "1Gi"}}),
                "config.evictionHard.disk.available: unsupported eviction signal",
            ),
            (
                json!({"evictionPressureTransitionPeriod": "-1s"}),
                "config.evictionPressureTransitionPeriod:",
            ),
        ] {
            let e = run_json(json!({"config": config, "observations": []}))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(needle), "{e}");
        }
        let e = run_json(
            json!({"observations": [{"at": "2026-01-01T00:00:00Z", "nodefs.available": "1Gi"}]}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("capacity.nodefs: required"), "{e}");
        let e = run_json(
            json!({"observations": [{"at": "2026-01-01T00:00:00Z", "memory.available": "12Qi"}]}),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("observations[0].memory.available: invalid quantity"),
            "{e}"
        );
        let e = run_json(
            json!({"observations": [{"at": "2026-01-01T00:00:00Z", "cpu.available": "1"}]}),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("observations[0].cpu.available: unsupported"),
            "{e}"
        );
        let e = run_json(json!({"observations": [{"at": "2026-01-01T00:00:10Z"}, {"at": "2026-01-01T00:00:00Z"}]}))
            .unwrap_err().to_string();
        assert!(e.starts_with("observations[1].at:"), "{e}");
    }

    #[test]
    fn memory_reclaim_choice_uses_the_largest_memory_shortfall() {
        // memory.available is 150Mi short of 250Mi, allocatableMemory.available 300Mi short:
        // reclaim must cover the larger for both to clear; one write asks at most 256Mi
        // (`MAX_STEP_BYTES`), the rest in the next step.
        let out = run_json(json!({
            "config": {"evictionHard": {"memory.available": "250Mi",
                                        "allocatableMemory.available": "400Mi"},
                       "memoryReclaim": {"enabled": true}},
            "capacity": {"memory": "2Gi", "allocatableMemory": "1Gi"},
            "observations": [
                {"at": "2026-01-01T00:00:00Z", "memory.available": "100Mi",
                 "allocatableMemory.available": "100Mi", "activeFile": "310Mi"}
            ]
        }))
        .unwrap();
        assert_eq!(
            out["steps"][0]["memoryReclaim"],
            json!({"choice": "reclaim", "shortfall": "300Mi", "activeFile": "310Mi",
                   "request": "256Mi", "reason": null})
        );
    }

    #[test]
    fn psi_averages_set_the_psi_conditions_with_the_transition_period() {
        let obs = |at: &str, avg10: f64, avg60: f64| {
            json!({"at": at, "memory.available": "900Mi",
                   "psi": {"kubepods.memory": {"avg10": avg10, "avg60": avg60},
                           "system.io": {"avg10": 0.0, "avg60": 0.0}}})
        };
        let input = |gates: Value| {
            json!({
                "config": {"featureGates": gates, "kubepodsMemoryContentionThreshold": 5,
                           "evictionPressureTransitionPeriod": "30s"},
                "capacity": {"memory": "1Gi"},
                "observations": [
                    obs("2026-01-01T00:00:00Z", 1.0, 0.5),
                    // avg10 over, avg60 not: the KEP waits for the minute.
                    obs("2026-01-01T00:00:10Z", 20.0, 4.0),
                    obs("2026-01-01T00:00:20Z", 20.0, 6.0),
                    // Trending lower (avg60 over, avg10 under): kept.
                    obs("2026-01-01T00:00:30Z", 2.0, 5.5),
                    // avg60 under: held by the transition period from 00:30...
                    obs("2026-01-01T00:00:40Z", 0.0, 4.0),
                    obs("2026-01-01T00:00:59Z", 0.0, 3.0),
                    // ... until 01:00.
                    obs("2026-01-01T00:01:00Z", 0.0, 2.0)
                ]
            })
        };
        let out = run_json(input(json!({"PSINodeCondition": true}))).unwrap();
        let conditions: Vec<Value> = out["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["conditions"].clone())
            .collect();
        let on = json!(["KubepodsMemoryContentionPressure"]);
        assert_eq!(
            conditions,
            [
                json!([]),
                json!([]),
                on.clone(),
                on.clone(),
                on.clone(),
                on,
                json!([])
            ],
            "{out}"
        );
        assert!(out["steps"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["evict"].is_null()));
        // The gate off (the default): the same figures set nothing.
        let out = run_json(input(json!({}))).unwrap();
        assert!(
            out["steps"]
                .as_array()
                .unwrap()
                .iter()
                .all(|s| s["conditions"] == json!([])),
            "{out}"
        );
    }

    #[test]
    fn the_psi_defaults_are_the_kubelets() {
        // 0.9 % for every condition when no threshold is given.
        let out = run_json(json!({
            "config": {"featureGates": {"PSINodeCondition": true}},
            "observations": [{"at": "2026-01-01T00:00:00Z",
                "psi": {"system.memory": {"avg10": 0.9, "avg60": 0.9},
                        "system.io": {"avg10": 0.89, "avg60": 50.0}}}]
        }))
        .unwrap();
        assert_eq!(
            out["steps"][0]["conditions"],
            json!(["SystemMemoryContentionPressure"])
        );
    }

    #[test]
    fn bad_psi_input_is_one_line_naming_the_field() {
        for (config, psi, needle) in [
            (
                json!({}),
                json!({"node.memory": {"avg10": 1, "avg60": 1}}),
                "observations[0].psi.node.memory: unknown PSI figure",
            ),
            (
                json!({}),
                json!({"system.io": {"avg10": 1}}),
                "observations[0].psi.system.io: missing field `avg60`",
            ),
            (
                json!({}),
                json!({"system.io": {"avg10": 101, "avg60": 1}}),
                "observations[0].psi.system.io.avg10:",
            ),
            (
                json!({}),
                json!({"system.io": {"avg10": "high", "avg60": 1}}),
                "observations[0].psi.system.io.avg10:",
            ),
            (
                json!({}),
                json!({"system.io": {"avg10": 1, "avg60": 1, "avg300": 1}}),
                "observations[0].psi.system.io.avg300: unknown field",
            ),
            (
                json!({}),
                json!([1]),
                "observations[0].psi: expected an object",
            ),
            (
                json!({"systemDiskContentionThreshold": -1}),
                json!({}),
                "config.systemDiskContentionThreshold:",
            ),
        ] {
            let e = run_json(json!({"config": config,
                "observations": [{"at": "2026-01-01T00:00:00Z", "psi": psi}]}))
            .unwrap_err()
            .to_string();
            assert!(e.contains(needle), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
