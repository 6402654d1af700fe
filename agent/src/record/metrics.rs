//! Prometheus metrics: one registry ([`Metrics`]) holding every family the agent exposes, so
//! the rest of the code only increments, and [`serve`] to expose it over HTTP.
//!
//! Operators watch a node agent through its metrics: how fast pressure is noticed (detection
//! lag) and acted on (reaction lag), what the kernel reported, what the agent evicted and what
//! it failed to prevent (kernel OOM kills). Every family is registered up front, in one place,
//! so names, help texts, units and label sets are decided once and a dashboard can rely on
//! them.
//!
//! Naming follows the Prometheus conventions: a `reactor_` prefix, base units (seconds,
//! bytes) in the name, `_total` on counters. The exposition is the OpenMetrics text format
//! (which Prometheus scrapes natively). A family with no series is left out of the
//! exposition (the client library does this, as the Go client does), so every family whose
//! label values are known in advance is created at zero when [`Metrics::new`] runs:
//!
//! | family | type | labels | present from start |
//! | --- | --- | --- | --- |
//! | `reactor_detection_lag_seconds` | histogram | `source` | yes, every source |
//! | `reactor_reaction_lag_seconds` | histogram | `source` | yes, every source |
//! | `reactor_pressure_events_total` | counter | `source`, `kind` | yes, each kind a source can send |
//! | `reactor_ebpf_ring_buffer_dropped_events_total` | counter | — | yes |
//! | `reactor_sense_source_attached` | gauge 0/1 | `source` | yes, every source |
//! | `reactor_eviction_signal_value` | gauge | `signal` | no: after the first observation (0 would read as "no memory left") |
//! | `reactor_eviction_threshold` | gauge | `signal`, `type` (hard, soft) | no: only signals with a threshold |
//! | `reactor_node_condition` | gauge 0/1 | `condition` | yes, every condition (0 = false) |
//! | `reactor_evictions_total` | counter | `signal`, `qos` | yes, every signal × QoS class |
//! | `reactor_oom_kills_total` | counter | — | yes |
//! | `reactor_preemptions_total` | counter | — | yes |
//! | `reactor_pod_admissions_total` | counter | `result` (admitted, rejected) | yes |
//! | `reactor_pod_admission_rejections_total` | counter | `reason` | no: after the first rejection (reasons are open-ended) |
//! | `reactor_image_gc_runs_total` | counter | — | yes |
//! | `reactor_image_gc_failures_total` | counter | — | yes |
//! | `reactor_image_gc_freed_bytes_total` | counter | — | yes |
//! | `reactor_memory_reclaims_total` | counter | `outcome` (resolved, skipped, bounded, short, failed) | yes, every outcome |
//! | `reactor_memory_reclaimed_bytes_total` | counter | — | yes |
//! | `reactor_memory_reclaim_duration_seconds` | histogram | — | yes |
//! | `reactor_node_swap_bytes`, `reactor_node_swap_used_bytes` | gauge | — | yes (0 until the first read, at start, then every `housekeepingInterval`) |
//! | `reactor_close_watch_rereads_total` | counter | `watch` (close, kernel_watched) | yes, both |
//! | `reactor_dry_run` | gauge 0/1 | — | yes (1 when the agent runs with `dryRun`) |
//! | `reactor_dry_run_evictions_total` | counter | `signal`, `qos` | yes, every signal × QoS class |
//! | `reactor_dry_run_preemptions_total` | counter | — | yes |
//! | `reactor_dry_run_image_deletions_total` | counter | — | yes |
//! | `reactor_devices` | gauge | `resource`, `health` (healthy, unhealthy) | no: after the first [`Metrics::update_devices`] (resources are whatever plugins register) |
//! | `reactor_devices_allocated` | gauge | `resource` | no: as `reactor_devices` |
//!
//! Signal values and thresholds are in the signal's own unit: bytes for the `*.available`
//! memory and filesystem signals, counts for `*.inodesFree` and `pid.available`.
//!
//! Recording is cheap enough for the hot path: label sets are `&'static str` where the values
//! are known, so an increment is a read lock, a hash lookup and an atomic add, with no
//! allocation.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::decide::qos::QosClass;
use crate::decide::signal::{NodeCondition, Signal};
use crate::sense::lag::BUCKET_BOUNDS_NS;
use crate::sense::{Kind, Received, Source};

pub mod serve;

/// The content type of [`Metrics::encode`]'s output (OpenMetrics text 1.0.0).
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every family name the agent exposes, as it appears on sample lines' `# TYPE` (counters
/// without their `_total`): for tests and docs that must name them all.
pub const FAMILIES: [&str; 27] = [
    "reactor_detection_lag_seconds",
    "reactor_reaction_lag_seconds",
    "reactor_pressure_events",
    "reactor_ebpf_ring_buffer_dropped_events",
    "reactor_sense_source_attached",
    "reactor_eviction_signal_value",
    "reactor_eviction_threshold",
    "reactor_node_condition",
    "reactor_evictions",
    "reactor_oom_kills",
    "reactor_preemptions",
    "reactor_pod_admissions",
    "reactor_pod_admission_rejections",
    "reactor_image_gc_runs",
    "reactor_image_gc_failures",
    "reactor_image_gc_freed_bytes",
    "reactor_devices",
    "reactor_devices_allocated",
    "reactor_memory_reclaims",
    "reactor_memory_reclaimed_bytes",
    "reactor_memory_reclaim_duration_seconds",
    "reactor_node_swap_bytes",
    "reactor_node_swap_used_bytes",
    "reactor_dry_run",
    "reactor_dry_run_evictions",
    "reactor_dry_run_preemptions",
    "reactor_dry_run_image_deletions",
];

/// The families that appear only after their first use (see the module docs for why).
pub const FAMILIES_AFTER_FIRST_USE: [&str; 5] = [
    "reactor_eviction_signal_value",
    "reactor_eviction_threshold",
    "reactor_pod_admission_rejections",
    "reactor_devices",
    "reactor_devices_allocated",
];

/// The kinds of event each source can send: the `kind` label values created at zero.
const KINDS_BY_SOURCE: [(Source, &[&str]); 4] = [
    (
        Source::Ebpf,
        &["oom-kill", "reclaim-stall", "memcg-event", "dropped"],
    ),
    (Source::Psi, &["psi-trigger"]),
    (
        Source::MemcgThreshold,
        &["threshold-crossed", "oom-kill", "memcg-event"],
    ),
    (Source::Poll, &["tick"]),
];

/// The `kind` label of an event: the kind's name without its details (`oom-kill`), so the
/// label set stays small; the same name as the event's JSON `type`.
pub(crate) fn kind_label(kind: &Kind) -> &'static str {
    match kind {
        Kind::OomKill { .. } => "oom-kill",
        Kind::ReclaimStall { .. } => "reclaim-stall",
        Kind::MemcgEvent { .. } => "memcg-event",
        Kind::PsiTrigger { .. } => "psi-trigger",
        Kind::ThresholdCrossed { .. } => "threshold-crossed",
        Kind::Tick => "tick",
        Kind::Dropped { .. } => "dropped",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    source: &'static str,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignalLabels {
    signal: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ThresholdLabels {
    signal: &'static str,
    r#type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConditionLabels {
    condition: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EvictionLabels {
    signal: &'static str,
    qos: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabels {
    watch: &'static str,
}

/// How the loop re-reads the signals near a threshold: `close` every `close_poll` (nothing in
/// the kernel watches the crossing), `kernel_watched` at the safety-net interval under an
/// armed eBPF slot.
pub(crate) const CLOSE_WATCHES: [&str; 2] = ["close", "kernel_watched"];

/// The outcomes of a memory reclaim before an eviction (the decision record's
/// `memoryReclaim.outcome`), each created at zero.
pub const MEMORY_RECLAIM_OUTCOMES: [&str; 5] =
    ["resolved", "skipped", "bounded", "short", "failed"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeviceLabels {
    resource: String,
    health: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    resource: String,
}

/// A gauge holding a float (signal values can exceed what `i64` gauges show exactly only in
/// theory, but thresholds given as percentages resolve to fractions of bytes).
type FloatGauge = Gauge<f64, AtomicU64>;

/// A histogram family whose histograms all use the lag buckets.
type LagFamily = Family<SourceLabels, Histogram, fn() -> Histogram>;

/// The outcome of a pod admission, for [`Metrics::record_admission`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The pod was admitted.
    Admitted,
    /// The pod was rejected; the reason is the pod status reason (`Evicted`, `OutOfcpu`...).
    Rejected,
}

impl Admission {
    fn label(self) -> &'static str {
        match self {
            Admission::Admitted => "admitted",
            Admission::Rejected => "rejected",
        }
    }
}

/// A signal's thresholds in the signal's unit, resolved against capacity (a percentage
/// threshold becomes bytes), for [`Metrics::set_signal`]. `None` = no such threshold.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct SignalThresholds {
    /// The hard eviction threshold.
    pub hard: Option<f64>,
    /// The soft eviction threshold.
    pub soft: Option<f64>,
}

/// One device-plugin resource's device counts, as [`Metrics::update_devices`] shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCounts {
    /// Healthy devices (the node's allocatable).
    pub healthy: u64,
    /// Unhealthy devices (capacity minus allocatable).
    pub unhealthy: u64,
    /// Devices held by pods.
    pub allocated: u64,
}

/// The agent's metrics registry. Share it as `Arc<Metrics>`: every method takes `&self`.
pub struct Metrics {
    registry: Registry,
    detection_lag: LagFamily,
    reaction_lag: LagFamily,
    events: Family<EventLabels, Counter>,
    ring_buffer_drops: Counter,
    sense_attached: Family<SourceLabels, Gauge>,
    signal_value: Family<SignalLabels, FloatGauge>,
    signal_threshold: Family<ThresholdLabels, FloatGauge>,
    conditions: Family<ConditionLabels, Gauge>,
    evictions: Family<EvictionLabels, Counter>,
    oom_kills: Counter,
    preemptions: Counter,
    admissions: Family<ResultLabels, Counter>,
    rejections: Family<ReasonLabels, Counter>,
    image_gc_runs: Counter,
    image_gc_failures: Counter,
    image_gc_freed: Counter,
    devices: Family<DeviceLabels, Gauge>,
    devices_allocated: Family<ResourceLabels, Gauge>,
    memory_reclaims: Family<OutcomeLabels, Counter>,
    memory_reclaimed: Counter,
    memory_reclaim_duration: Histogram,
    swap_total: Gauge,
    swap_used: Gauge,
    close_rereads: Family<WatchLabels, Counter>,
    dry_run: Gauge,
    dry_run_evictions: Family<EvictionLabels, Counter>,
    dry_run_preemptions: Counter,
    dry_run_image_deletions: Counter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// A histogram with the sense layer's lag buckets (1 µs to 50 s, 1-2-5), in seconds, so the
/// Prometheus histogram and `reactor watch`'s summaries bucket the same way.
fn lag_histogram() -> Histogram {
    Histogram::new(BUCKET_BOUNDS_NS.iter().map(|&ns| ns as f64 / 1e9))
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every family and creates the series whose label values are known at zero.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            detection_lag: Family::new_with_constructor(lag_histogram),
            reaction_lag: Family::new_with_constructor(lag_histogram),
            events: Family::default(),
            ring_buffer_drops: Counter::default(),
            sense_attached: Family::default(),
            signal_value: Family::default(),
            signal_threshold: Family::default(),
            conditions: Family::default(),
            evictions: Family::default(),
            oom_kills: Counter::default(),
            preemptions: Counter::default(),
            admissions: Family::default(),
            rejections: Family::default(),
            image_gc_runs: Counter::default(),
            image_gc_failures: Counter::default(),
            image_gc_freed: Counter::default(),
            devices: Family::default(),
            devices_allocated: Family::default(),
            memory_reclaims: Family::default(),
            memory_reclaimed: Counter::default(),
            memory_reclaim_duration: lag_histogram(),
            swap_total: Gauge::default(),
            swap_used: Gauge::default(),
            close_rereads: Family::default(),
            dry_run: Gauge::default(),
            dry_run_evictions: Family::default(),
            dry_run_preemptions: Counter::default(),
            dry_run_image_deletions: Counter::default(),
            registry: Registry::default(),
        };
        registry.register_with_unit(
            "reactor_detection_lag",
            "Time from the kernel seeing a pressure event (its own timestamp where it has one) \
             to the agent taking it, per sense source",
            Unit::Seconds,
            m.detection_lag.clone(),
        );
        registry.register_with_unit(
            "reactor_reaction_lag",
            "Time from a pressure event to the agent's action on it being done, per sense \
             source of the event",
            Unit::Seconds,
            m.reaction_lag.clone(),
        );
        registry.register(
            "reactor_pressure_events",
            "Pressure events received, per sense source and kind",
            m.events.clone(),
        );
        registry.register(
            "reactor_ebpf_ring_buffer_dropped_events",
            "eBPF records lost because the ring buffer was full (pressure may have been missed)",
            m.ring_buffer_drops.clone(),
        );
        registry.register(
            "reactor_sense_source_attached",
            "Whether a sense source is running (1) or missing (0); see the agent's log for why",
            m.sense_attached.clone(),
        );
        registry.register(
            "reactor_eviction_signal_value",
            "Last observed value of an eviction signal, in its unit (bytes; inodes and pids \
             as counts)",
            m.signal_value.clone(),
        );
        registry.register(
            "reactor_eviction_threshold",
            "Eviction threshold of a signal resolved to its unit, by type (hard, soft)",
            m.signal_threshold.clone(),
        );
        registry.register(
            "reactor_node_condition",
            "Node pressure condition: 1 when true, 0 when false",
            m.conditions.clone(),
        );
        registry.register(
            "reactor_evictions",
            "Pods evicted, by the signal that triggered the eviction and the pod's QoS class",
            m.evictions.clone(),
        );
        registry.register(
            "reactor_oom_kills",
            "Processes killed by the kernel OOM killer: pressure the agent did not prevent",
            m.oom_kills.clone(),
        );
        registry.register(
            "reactor_preemptions",
            "Pods preempted to admit a critical pod",
            m.preemptions.clone(),
        );
        registry.register(
            "reactor_pod_admissions",
            "Pod admission decisions, by result (admitted, rejected)",
            m.admissions.clone(),
        );
        registry.register(
            "reactor_pod_admission_rejections",
            "Pods rejected at admission, by reason",
            m.rejections.clone(),
        );
        registry.register(
            "reactor_image_gc_runs",
            "Image garbage collection runs",
            m.image_gc_runs.clone(),
        );
        registry.register(
            "reactor_image_gc_failures",
            "Image garbage collection runs that did not free what they had to",
            m.image_gc_failures.clone(),
        );
        registry.register_with_unit(
            "reactor_image_gc_freed",
            "Bytes freed by image garbage collection",
            Unit::Bytes,
            m.image_gc_freed.clone(),
        );
        registry.register(
            "reactor_devices",
            "Devices registered by device plugins, per resource and health",
            m.devices.clone(),
        );
        registry.register(
            "reactor_devices_allocated",
            "Devices held by pods, per resource",
            m.devices_allocated.clone(),
        );
        registry.register(
            "reactor_memory_reclaims",
            "Memory reclaims before an eviction (memoryReclaim), by outcome: resolved (nothing \
             evicted), skipped (file pages could not cover the shortfall), bounded, short, failed",
            m.memory_reclaims.clone(),
        );
        registry.register(
            "reactor_close_watch_rereads",
            "Passes the loop's own timer started while a memory signal was close to a \
             threshold, by watch: close (every 1 ms; nothing in the kernel watches the \
             crossing) or kernel_watched (a safety net under an armed eBPF usage threshold)",
            m.close_rereads.clone(),
        );
        for watch in CLOSE_WATCHES {
            m.close_rereads.get_or_create_owned(&WatchLabels { watch });
        }
        registry.register_with_unit(
            "reactor_memory_reclaimed",
            "Bytes freed by memory reclaims before an eviction (drop of kubepods file pages)",
            Unit::Bytes,
            m.memory_reclaimed.clone(),
        );
        registry.register_with_unit(
            "reactor_memory_reclaim_duration",
            "Time one memory reclaim before an eviction took, steps and re-observations",
            Unit::Seconds,
            m.memory_reclaim_duration.clone(),
        );
        registry.register_with_unit(
            "reactor_node_swap",
            "The node's swap (SwapTotal in /proc/meminfo); no eviction signal counts it",
            Unit::Bytes,
            m.swap_total.clone(),
        );
        registry.register_with_unit(
            "reactor_node_swap_used",
            "The node's swap in use (SwapTotal - SwapFree)",
            Unit::Bytes,
            m.swap_used.clone(),
        );
        registry.register(
            "reactor_dry_run",
            "1 when the agent runs with dryRun (it records what it would evict, preempt and \
             delete, and does none of it), 0 otherwise",
            m.dry_run.clone(),
        );
        registry.register(
            "reactor_dry_run_evictions",
            "Evictions a dry run would have made (once per pod per pressure episode), by the \
             signal and the pod's QoS class; nothing was evicted",
            m.dry_run_evictions.clone(),
        );
        registry.register(
            "reactor_dry_run_preemptions",
            "Pods a dry run would have preempted to admit a critical pod; none was",
            m.dry_run_preemptions.clone(),
        );
        registry.register(
            "reactor_dry_run_image_deletions",
            "Images a dry run would have deleted, counted per image GC round or disk-pressure \
             reclaim (an image each round would delete is counted by each); none was",
            m.dry_run_image_deletions.clone(),
        );
        for outcome in MEMORY_RECLAIM_OUTCOMES {
            m.memory_reclaims
                .get_or_create_owned(&OutcomeLabels { outcome });
        }
        for source in Source::ALL {
            let labels = SourceLabels {
                source: source.name(),
            };
            m.detection_lag.get_or_create_owned(&labels);
            m.reaction_lag.get_or_create_owned(&labels);
            m.sense_attached.get_or_create_owned(&labels);
        }
        for (source, kinds) in KINDS_BY_SOURCE {
            for &kind in kinds {
                m.events.get_or_create_owned(&EventLabels {
                    source: source.name(),
                    kind,
                });
            }
        }
        for condition in [
            NodeCondition::MemoryPressure,
            NodeCondition::DiskPressure,
            NodeCondition::PidPressure,
        ] {
            m.set_condition(condition, false);
        }
        for signal in Signal::ALL {
            for qos in [
                QosClass::Guaranteed,
                QosClass::Burstable,
                QosClass::BestEffort,
            ] {
                let labels = EvictionLabels {
                    signal: signal.name(),
                    qos: qos.as_str(),
                };
                m.evictions.get_or_create_owned(&labels);
                m.dry_run_evictions.get_or_create_owned(&labels);
            }
        }
        for result in [Admission::Admitted, Admission::Rejected] {
            m.admissions.get_or_create_owned(&ResultLabels {
                result: result.label(),
            });
        }
        Metrics { registry, ..m }
    }

    /// The exposition in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        // Writing into a String cannot fail; the encoder only reports the writer's errors.
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    /// Records one sense event: counts it by source and kind and observes its detection lag.
    /// A [`Kind::Dropped`] event also adds its count to the ring-buffer drop counter.
    /// Kernel OOM kills are counted separately by [`Metrics::record_oom_kill`], because one
    /// kill can reach the agent from more than one source.
    pub fn record_event(&self, received: &Received) {
        let source = received.event.source.name();
        self.events
            .get_or_create(&EventLabels {
                source,
                kind: kind_label(&received.event.kind),
            })
            .inc();
        self.detection_lag
            .get_or_create(&SourceLabels { source })
            .observe(received.lag_ns as f64 / 1e9);
        if let Kind::Dropped { count } = received.event.kind {
            self.ring_buffer_drops.inc_by(count);
        }
    }

    /// Marks a sense source as running (`true`) or missing.
    pub fn set_source_attached(&self, source: Source, attached: bool) {
        self.sense_attached
            .get_or_create(&SourceLabels {
                source: source.name(),
            })
            .set(i64::from(attached));
    }

    /// Observes the time from a pressure event (from `source`) to the action taken on it.
    pub(crate) fn observe_reaction_lag(&self, source: Source, secs: f64) {
        self.reaction_lag
            .get_or_create(&SourceLabels {
                source: source.name(),
            })
            .observe(secs);
    }

    /// Sets a signal's observed value and its thresholds (a threshold given as `None` is
    /// removed from the exposition, so a dashboard never shows a stale one).
    pub(crate) fn set_signal(&self, signal: Signal, value: f64, thresholds: SignalThresholds) {
        let name = signal.name();
        self.signal_value
            .get_or_create(&SignalLabels { signal: name })
            .set(value);
        for (r#type, threshold) in [("hard", thresholds.hard), ("soft", thresholds.soft)] {
            let labels = ThresholdLabels {
                signal: name,
                r#type,
            };
            match threshold {
                Some(t) => {
                    self.signal_threshold.get_or_create(&labels).set(t);
                }
                None => {
                    self.signal_threshold.remove(&labels);
                }
            }
        }
    }

    /// Sets a node condition true (1) or false (0).
    pub(crate) fn set_condition(&self, condition: NodeCondition, on: bool) {
        self.conditions
            .get_or_create(&ConditionLabels {
                condition: condition.name(),
            })
            .set(i64::from(on));
    }

    /// Counts one pod eviction by the signal that caused it and the pod's QoS class.
    pub(crate) fn record_eviction(&self, signal: Signal, qos: QosClass) {
        self.evictions
            .get_or_create(&EvictionLabels {
                signal: signal.name(),
                qos: qos.as_str(),
            })
            .inc();
    }

    /// Says whether the agent runs with `dryRun`.
    pub fn set_dry_run(&self, on: bool) {
        self.dry_run.set(i64::from(on));
    }

    /// Counts one eviction a dry run would have made (nothing was evicted).
    pub(crate) fn record_dry_run_eviction(&self, signal: Signal, qos: QosClass) {
        self.dry_run_evictions
            .get_or_create(&EvictionLabels {
                signal: signal.name(),
                qos: qos.as_str(),
            })
            .inc();
    }

    /// Counts `n` pods a dry run would have preempted (none was).
    pub fn record_dry_run_preemptions(&self, n: u64) {
        self.dry_run_preemptions.inc_by(n);
    }

    /// Counts `n` images a dry run would have deleted (none was).
    pub fn record_dry_run_image_deletions(&self, n: u64) {
        self.dry_run_image_deletions.inc_by(n);
    }

    /// Counts one process killed by the kernel OOM killer.
    pub fn record_oom_kill(&self) {
        self.oom_kills.inc();
    }

    /// Counts one pod preempted for a critical pod.
    pub fn record_preemption(&self) {
        self.preemptions.inc();
    }

    /// Counts one admission decision; a rejection is also counted under its `reason` (the pod
    /// status reason, e.g. `Evicted`, `OutOfmemory`), which is ignored for admissions.
    pub fn record_admission(&self, result: Admission, reason: &str) {
        self.admissions
            .get_or_create(&ResultLabels {
                result: result.label(),
            })
            .inc();
        if result == Admission::Rejected {
            self.rejections
                .get_or_create(&ReasonLabels {
                    reason: reason.to_string(),
                })
                .inc();
        }
    }

    /// Counts one memory reclaim tried (or skipped) before an eviction: its outcome (one of
    /// [`MEMORY_RECLAIM_OUTCOMES`]), what it freed and how long it took. A skipped one
    /// took no reclaim time and is not observed in the duration histogram.
    pub(crate) fn record_memory_reclaim(&self, outcome: &str, freed_bytes: u64, took_secs: f64) {
        let Some(&outcome) = MEMORY_RECLAIM_OUTCOMES.iter().find(|&&o| o == outcome) else {
            return;
        };
        self.memory_reclaims
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
        self.memory_reclaimed.inc_by(freed_bytes);
        if outcome != "skipped" {
            self.memory_reclaim_duration.observe(took_secs);
        }
    }

    /// The node's swap now (`SwapTotal`, and `SwapTotal - SwapFree`), in bytes.
    pub fn set_node_swap(&self, total: u64, used: u64) {
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.swap_total.set(gauge(total));
        self.swap_used.set(gauge(used));
    }

    /// Counts one pass the loop's timer started near a threshold, by `watch` (one of
    /// [`CLOSE_WATCHES`]).
    pub(crate) fn count_close_reread(&self, watch: &str) {
        if let Some(&watch) = CLOSE_WATCHES.iter().find(|&&w| w == watch) {
            self.close_rereads
                .get_or_create(&WatchLabels { watch })
                .inc();
        }
    }

    /// Counts one image GC run with the bytes it freed; `ok = false` counts a failure (it
    /// could not free what it had to).
    pub fn record_image_gc(&self, freed_bytes: u64, ok: bool) {
        self.image_gc_runs.inc();
        self.image_gc_freed.inc_by(freed_bytes);
        if !ok {
            self.image_gc_failures.inc();
        }
    }

    /// Sets the device gauges from the device manager's counts per resource; resources the
    /// manager dropped (`deleted`) leave the exposition. The counts come as plain numbers
    /// (the device manager converts its `ResourceCapacity`), so `record` stays below
    /// `devices`.
    pub fn update_devices(&self, resources: &BTreeMap<String, DeviceCounts>, deleted: &[String]) {
        for (resource, c) in resources {
            for (health, n) in [("healthy", c.healthy), ("unhealthy", c.unhealthy)] {
                self.devices
                    .get_or_create(&DeviceLabels {
                        resource: resource.clone(),
                        health,
                    })
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            self.devices_allocated
                .get_or_create(&ResourceLabels {
                    resource: resource.clone(),
                })
                .set(i64::try_from(c.allocated).unwrap_or(i64::MAX));
        }
        for resource in deleted {
            for health in ["healthy", "unhealthy"] {
                self.devices.remove(&DeviceLabels {
                    resource: resource.clone(),
                    health,
                });
            }
            self.devices_allocated.remove(&ResourceLabels {
                resource: resource.clone(),
            });
        }
    }
}

#[cfg(test)]
mod tests;
