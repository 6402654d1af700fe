//! Unit tests of the metrics registry.
use super::*;
use crate::sense::PressureEvent;

fn received(source: Source, kind: Kind, lag_ns: u64) -> Received {
    Received {
        event: PressureEvent {
            at_ns: 1,
            woke_ns: None,
            source,
            cgroup: None,
            kind,
        },
        lag_ns,
        wake_lag_ns: None,
    }
}

/// The value of the one sample line starting with `series ` (exact name and labels).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

fn has_help_and_type(text: &str, family: &str) -> bool {
    text.lines()
        .any(|l| l.starts_with(&format!("# HELP {family} ")))
        && text
            .lines()
            .any(|l| l.starts_with(&format!("# TYPE {family} ")))
}

fn use_everything(m: &Metrics) {
    m.record_event(&received(Source::Ebpf, Kind::Dropped { count: 3 }, 500));
    m.observe_reaction_lag(Source::Psi, 0.002);
    m.set_signal(
        Signal::MemoryAvailable,
        1e9,
        SignalThresholds {
            hard: Some(1e8),
            soft: Some(2e8),
        },
    );
    m.record_admission(Admission::Rejected, "OutOfmemory");
    let gpu = DeviceCounts {
        healthy: 3,
        unhealthy: 1,
        allocated: 2,
    };
    m.update_devices(&[("example.com/gpu".to_string(), gpu)].into(), &[]);
}

#[test]
fn every_family_has_help_and_type_once_used() {
    let m = Metrics::new();
    use_everything(&m);
    let text = m.encode();
    for family in FAMILIES {
        assert!(
            has_help_and_type(&text, family),
            "{family} missing:\n{text}"
        );
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
}

#[test]
fn fresh_registry_shows_all_but_the_documented_families() {
    let text = Metrics::new().encode();
    for family in FAMILIES {
        let shown = has_help_and_type(&text, family);
        assert_eq!(
            shown,
            !FAMILIES_AFTER_FIRST_USE.contains(&family),
            "{family}:\n{text}"
        );
    }
    assert_eq!(
        sample(
            &text,
            r#"reactor_pressure_events_total{source="ebpf",kind="oom-kill"}"#
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"reactor_evictions_total{signal="pid.available",qos="BestEffort"}"#
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(&text, r#"reactor_node_condition{condition="PIDPressure"}"#),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"reactor_detection_lag_seconds_count{source="memcg-threshold"}"#
        ),
        Some(0.0)
    );
    assert_eq!(sample(&text, "reactor_oom_kills_total"), Some(0.0));
    assert_eq!(
        sample(&text, "reactor_image_gc_freed_bytes_total"),
        Some(0.0)
    );
}

#[test]
fn names_follow_the_conventions() {
    let m = Metrics::new();
    use_everything(&m);
    let text = m.encode();
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut parts = line.split(' ').skip(2);
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            panic!("bad TYPE line {line}");
        };
        assert!(name.starts_with("reactor_"), "{line}");
        assert!(!name.contains("_ms") && !name.contains("_ns"), "{line}");
        if kind == "counter" {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&format!("{name}_total"))),
                "{name} has no _total sample"
            );
        }
    }
}

#[test]
fn events_count_by_source_and_kind_and_lag_lands_in_its_bucket() {
    let m = Metrics::new();
    m.record_event(&received(Source::Psi, Kind::Tick, 0));
    m.record_event(&received(
        Source::Psi,
        Kind::PsiTrigger {
            level: "some".into(),
            total_us: None,
        },
        1_500,
    ));
    m.record_event(&received(
        Source::Psi,
        Kind::PsiTrigger {
            level: "full".into(),
            total_us: Some(3),
        },
        3_000_000,
    ));
    let text = m.encode();
    assert_eq!(
        sample(
            &text,
            r#"reactor_pressure_events_total{source="psi",kind="psi-trigger"}"#
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"reactor_pressure_events_total{source="psi",kind="tick"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"reactor_detection_lag_seconds_count{source="psi"}"#
        ),
        Some(3.0)
    );
    // 0 and 1.5 µs are at or below 2 µs; 3 ms is not.
    assert_eq!(
        sample(
            &text,
            r#"reactor_detection_lag_seconds_bucket{le="2e-6",source="psi"}"#
        )
        .or_else(|| sample(
            &text,
            r#"reactor_detection_lag_seconds_bucket{le="0.000002",source="psi"}"#
        )),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"reactor_detection_lag_seconds_bucket{le="+Inf",source="psi"}"#
        ),
        Some(3.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"reactor_detection_lag_seconds_count{source="poll"}"#
        ),
        Some(0.0)
    );
}

#[test]
fn drops_add_their_count() {
    let m = Metrics::new();
    m.record_event(&received(Source::Ebpf, Kind::Dropped { count: 7 }, 10));
    m.record_event(&received(Source::Ebpf, Kind::Dropped { count: 5 }, 10));
    let text = m.encode();
    assert_eq!(
        sample(&text, "reactor_ebpf_ring_buffer_dropped_events_total"),
        Some(12.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"reactor_pressure_events_total{source="ebpf",kind="dropped"}"#
        ),
        Some(2.0)
    );
}

#[test]
fn decisions_and_actions_are_counted() {
    let m = Metrics::new();
    m.record_eviction(Signal::MemoryAvailable, QosClass::BestEffort);
    m.record_eviction(Signal::MemoryAvailable, QosClass::BestEffort);
    m.record_oom_kill();
    m.record_preemption();
    m.record_admission(Admission::Admitted, "ignored");
    m.record_admission(Admission::Rejected, "Evicted");
    m.record_image_gc(4096, true);
    m.record_image_gc(0, false);
    m.set_condition(NodeCondition::MemoryPressure, true);
    m.set_source_attached(Source::Ebpf, true);
    m.observe_reaction_lag(Source::Ebpf, 0.000_3);
    let text = m.encode();
    for (series, want) in [
        (
            r#"reactor_evictions_total{signal="memory.available",qos="BestEffort"}"#,
            2.0,
        ),
        (
            r#"reactor_evictions_total{signal="memory.available",qos="Guaranteed"}"#,
            0.0,
        ),
        ("reactor_oom_kills_total", 1.0),
        ("reactor_preemptions_total", 1.0),
        (r#"reactor_pod_admissions_total{result="admitted"}"#, 1.0),
        (r#"reactor_pod_admissions_total{result="rejected"}"#, 1.0),
        (
            r#"reactor_pod_admission_rejections_total{reason="Evicted"}"#,
            1.0,
        ),
        ("reactor_image_gc_runs_total", 2.0),
        ("reactor_image_gc_failures_total", 1.0),
        ("reactor_image_gc_freed_bytes_total", 4096.0),
        (r#"reactor_node_condition{condition="MemoryPressure"}"#, 1.0),
        (r#"reactor_node_condition{condition="DiskPressure"}"#, 0.0),
        (r#"reactor_sense_source_attached{source="ebpf"}"#, 1.0),
        (r#"reactor_sense_source_attached{source="psi"}"#, 0.0),
        (r#"reactor_reaction_lag_seconds_count{source="ebpf"}"#, 1.0),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series}:\n{text}");
    }
    assert!(!text.contains(r#"reason="ignored""#));
}

#[test]
fn signals_and_thresholds_follow_the_latest_values() {
    let m = Metrics::new();
    m.set_signal(
        Signal::NodeFsAvailable,
        5e9,
        SignalThresholds {
            hard: Some(1e9),
            soft: Some(2e9),
        },
    );
    m.set_signal(
        Signal::NodeFsAvailable,
        4e9,
        SignalThresholds {
            hard: Some(1e9),
            soft: None,
        },
    );
    let text = m.encode();
    assert_eq!(
        sample(
            &text,
            r#"reactor_eviction_signal_value{signal="nodefs.available"}"#
        ),
        Some(4e9)
    );
    assert_eq!(
        sample(
            &text,
            r#"reactor_eviction_threshold{signal="nodefs.available",type="hard"}"#
        ),
        Some(1e9)
    );
    assert!(!text.contains(r#"type="soft""#), "{text}");
    assert!(!text.contains(r#"signal="memory.available"}"#), "{text}");
}

#[test]
fn devices_follow_capacity_and_deleted_resources_leave() {
    let m = Metrics::new();
    let gpu = DeviceCounts {
        healthy: 3,
        unhealthy: 1,
        allocated: 2,
    };
    m.update_devices(&[("example.com/gpu".to_string(), gpu)].into(), &[]);
    let text = m.encode();
    for (series, want) in [
        (
            r#"reactor_devices{resource="example.com/gpu",health="healthy"}"#,
            3.0,
        ),
        (
            r#"reactor_devices{resource="example.com/gpu",health="unhealthy"}"#,
            1.0,
        ),
        (
            r#"reactor_devices_allocated{resource="example.com/gpu"}"#,
            2.0,
        ),
    ] {
        assert_eq!(sample(&text, series), Some(want), "{series}:\n{text}");
    }
    m.update_devices(&BTreeMap::new(), &["example.com/gpu".to_string()]);
    assert!(!m.encode().contains("example.com/gpu"));
}

#[test]
fn label_values_are_escaped() {
    let m = Metrics::new();
    m.record_admission(Admission::Rejected, "a \"quoted\"\nreason");
    let text = m.encode();
    assert!(text.contains(r#"reason="a \"quoted\"\nreason""#), "{text}");
}

#[test]
fn every_kind_has_a_label_a_source_declares() {
    let declared: Vec<&str> = KINDS_BY_SOURCE
        .iter()
        .flat_map(|(_, kinds)| kinds.iter().copied())
        .collect();
    for kind in [
        Kind::OomKill {
            pid: None,
            comm: None,
            rss_bytes: None,
            oom_score_adj: None,
        },
        Kind::ReclaimStall {
            pid: 1,
            duration_ns: 1,
            memcg: true,
            folded: 0,
            folded_ns: 0,
        },
        Kind::MemcgEvent {
            item: "high".into(),
            count: 1,
        },
        Kind::PsiTrigger {
            level: "some".into(),
            total_us: None,
        },
        Kind::ThresholdCrossed {
            threshold_bytes: None,
            usage_bytes: None,
            killed: None,
        },
        Kind::Tick,
        Kind::Dropped { count: 1 },
    ] {
        let label = kind_label(&kind);
        // The same name as the event's JSON `type` (`reactor watch --json`).
        let json = serde_json::to_value(&kind).unwrap();
        assert_eq!(json["type"], label, "{kind}");
        assert!(declared.contains(&label), "{label}");
    }
}
