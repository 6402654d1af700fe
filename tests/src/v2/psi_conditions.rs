//! KEP-5394's PSI node conditions on a real kernel: a Burstable container held at its
//! `memory.high` (`MemoryQoS` on, `memoryThrottlingFactor: 0.5`) spends its time in the
//! kernel's throttle, a memory stall PSI counts as `full` for kubepods (the hog is the only
//! task there that is not idle). `KubepodsMemoryContentionPressure` turns True once the
//! kernel's `full` averages reach the threshold; after the pod is removed the stall ends,
//! the condition is held for `evictionPressureTransitionPeriod` past the pass that last saw
//! avg60 at the threshold, and turns False.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::agent::{apply, follow_events, pod, procs, start};
use super::pods::NODE;
use super::{read, wait_until};
use crate::memhog_bin;

/// The condition under test and its threshold (percent of time fully stalled).
const CONDITION: &str = "KubepodsMemoryContentionPressure";
const THRESHOLD: f64 = 10.0;
/// Short, so the check sees the hold end; the other conditions keep theirs too.
const TRANSITION_SECS: u64 = 10;

/// `reactor status --json`.
fn status(agent: &crate::agent::TestAgent) -> Value {
    let out = agent.cli(&["status", "--json"]);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "status --json: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The status of condition `name` in a status document ("True", "False", or "" if absent).
fn condition(status: &Value, name: &str) -> String {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == name)
        .and_then(|c| c["status"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// The `full` averages the pass read for `source` (`kubepods.memory`), if read.
fn figure(status: &Value, source: &str) -> Option<(f64, f64)> {
    let f = status["psi"]
        .as_array()?
        .iter()
        .find(|p| p["source"] == source)?;
    let full = f["full"].as_object()?;
    Some((full["avg10"].as_f64()?, full["avg60"].as_f64()?))
}

fn show(status: &Value) -> String {
    let f = |s: &str| {
        figure(status, s).map_or("not read".to_string(), |(a10, a60)| {
            format!("avg10 {a10:.2} avg60 {a60:.2}")
        })
    };
    format!(
        "{CONDITION} {}, kubepods.memory full {}, system.memory full {}",
        condition(status, CONDITION),
        f("kubepods.memory"),
        f("system.memory")
    )
}

/// The stall turns the condition True, and it turns False again one transition period
/// after the agent last saw the KEP's rule hold.
pub fn kubepods_memory_condition_rises_and_falls() -> String {
    let agent = start(
        "v2-psi",
        &format!(
            "{NODE}featureGates: {{MemoryQoS: true, PSINodeCondition: true}}\n\
             memoryThrottlingFactor: 0.5\n\
             kubepodsMemoryContentionThreshold: {THRESHOLD}\n\
             systemMemoryContentionThreshold: 0\n\
             systemDiskContentionThreshold: 0\n\
             evictionPressureTransitionPeriod: {TRANSITION_SECS}s\n\
             housekeepingInterval: 1s\n"
        ),
    );
    let (_events_child, events) = follow_events(&agent);
    let kubepods = agent.v2_dir("kubepods");

    // Gate on: all four PSI conditions listed, False on a calm node, kubepods' figure read.
    // The two system-wide conditions are off (threshold 0, listed False): the suite's
    // earlier checks stall the whole guest's memory, and its `full` avg60 was still 12.9
    // when a full run reached this check (the node, not this check's pod, as the kubepods
    // figure is this check's alone).
    let calm = status(&agent);
    for c in [
        "SystemMemoryContentionPressure",
        "SystemDiskContentionPressure",
        "KubepodsMemoryContentionPressure",
        "KubepodsDiskContentionPressure",
    ] {
        assert_eq!(condition(&calm, c), "False", "{c} on a calm node: {calm}");
    }
    assert!(
        figure(&calm, "kubepods.memory").is_some(),
        "kubepods' memory.pressure not read: {calm}"
    );
    let calm_text = show(&calm);

    // request 16Mi, limit 64Mi: memory.high 40Mi; the hog wants 60Mi and is held at the
    // throttle (no swap: nothing of it can be reclaimed), well below memory.max.
    let hog = vec![
        memhog_bin().display().to_string(),
        "60".into(),
        "0".into(),
        "3600".into(),
    ];
    let doc = apply(
        &agent,
        &pod(
            "staller",
            &[(
                "app",
                hog,
                json!({"requests": {"memory": "16Mi"}, "limits": {"memory": "64Mi"}}),
            )],
        ),
    );
    let uid = doc["metadata"]["uid"].as_str().unwrap_or_default();
    let dir = agent.v2_dir(&format!("kubepods/burstable/pod{uid}/app"));
    wait_until(
        "the hog's container to run",
        120,
        || dir.join("memory.high").exists() && !procs(&dir).is_empty(),
        || agent.log(),
    );
    let stall_start = Instant::now();
    let last = std::cell::RefCell::new(Value::Null);
    wait_until(
        &format!("{CONDITION} True under the stall"),
        180,
        || {
            let s = status(&agent);
            let on = condition(&s, CONDITION) == "True";
            *last.borrow_mut() = s;
            on
        },
        || {
            format!(
                "{}\nkubepods memory.pressure: {}\n{}",
                show(&last.borrow()),
                read(&kubepods.join("memory.pressure")),
                agent.log()
            )
        },
    );
    let rose_after = stall_start.elapsed();
    let last = last.into_inner();
    let at_true = show(&last);
    let kernel_at_true = read(&kubepods.join("memory.pressure"));
    let (a10, a60) = figure(&last, "kubepods.memory").expect("figure read at True");
    assert!(
        a60 >= THRESHOLD && a10 >= THRESHOLD,
        "True below the threshold: {at_true}"
    );
    let high_events = super::counter(&dir.join("memory.events"), "high");
    assert!(
        high_events > 0,
        "no memory.high throttling: {}",
        read(&dir.join("memory.events"))
    );

    // End the stall.
    let out = agent.cli(&["pod", "rm", "default/staller", "--grace", "0"]);
    assert!(
        out.status.success(),
        "pod rm: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let removed = Instant::now();

    // The pass that first reads avg60 under the threshold: the rule no longer holds, but the
    // condition is still True (held for the transition period).
    let mut below_at = None;
    let mut below_text = String::new();
    let mut false_at = None;
    let mut false_text = String::new();
    wait_until(
        &format!("{CONDITION} False after the transition period"),
        300,
        || {
            let s = status(&agent);
            let on = condition(&s, CONDITION);
            if below_at.is_none() {
                if let Some((_, a60)) = figure(&s, "kubepods.memory") {
                    if a60 < THRESHOLD {
                        below_at = Some(Instant::now());
                        below_text = show(&s);
                        assert_eq!(
                            on, "True",
                            "dropped as soon as avg60 fell, without the transition period: {below_text}"
                        );
                    }
                }
            }
            if on == "False" {
                false_at = Some(Instant::now());
                false_text = show(&s);
                return true;
            }
            false
        },
        || agent.log(),
    );
    let below_at = below_at.expect("avg60 seen under the threshold before False");
    let false_at = false_at.expect("False seen");
    let held = false_at.duration_since(below_at);
    // The rule was last seen a little before the poll that read avg60 under the threshold:
    // one re-read of the figures (1 s), one pass (housekeeping 1 s) and one TCG-slow status
    // call at most; without the hold it would drop at once.
    assert!(
        held >= Duration::from_secs(TRANSITION_SECS - 4),
        "held only {held:?} after avg60 fell (period {TRANSITION_SECS} s): {below_text} → {false_text}"
    );
    assert!(
        held <= Duration::from_secs(TRANSITION_SECS + 30),
        "held {held:?} after avg60 fell (period {TRANSITION_SECS} s)"
    );

    // Both changes on the event stream, with the kubelet's reasons and the figure read.
    let mut seen: Vec<Value> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && seen.len() < 2 {
        let Ok(e) = events.recv_timeout(Duration::from_millis(500)) else {
            continue;
        };
        if e["kind"] == "condition" && e["event"]["type"] == CONDITION {
            seen.push(e);
        }
    }
    let text: Vec<String> = seen.iter().map(ToString::to_string).collect();
    assert_eq!(seen.len(), 2, "condition events: {text:?}");
    assert!(
        text[0].contains("KubeletHasKubepodsMemoryContentionPressure")
            && text[0].contains("\"True\"")
            && text[0].contains("kubepods.memory full avg10"),
        "{text:?}"
    );
    assert!(
        text[1].contains("KubeletHasNoKubepodsMemoryContentionPressure")
            && text[1].contains("\"False\""),
        "{text:?}"
    );

    format!(
        "calm: {calm_text}; True {:.1} s into the stall: {at_true} (kernel: {}; memory.high events {high_events}); \
         avg60 under {THRESHOLD} {:.1} s after the pod's removal: {below_text}; \
         False {:.1} s later: {false_text}",
        rose_after.as_secs_f64(),
        kernel_at_true.replace('\n', " | "),
        below_at.duration_since(removed).as_secs_f64(),
        held.as_secs_f64()
    )
}
