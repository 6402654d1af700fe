//! `reactor plan pressure`: thresholds, grace periods, minimum reclaim and node conditions
//! over a series of observations, as the kubelet's eviction manager evaluates them at each
//! housekeeping pass; settings the kubelet refuses exit 2 naming the key.

mod plan_cli;

use plan_cli::{plan_ok, plan_refused, plan_stdin};
use serde_json::{json, Value};

fn at(seconds: u64) -> String {
    let h = seconds / 3600;
    let m = (seconds % 3600) / 60;
    let s = seconds % 60;
    format!("2026-11-22T{:02}:{m:02}:{s:02}Z", 10 + h)
}

fn signals(v: &Value) -> Vec<String> {
    v.as_array()
        .expect("list")
        .iter()
        .map(|s| s.as_str().expect("string").to_string())
        .collect()
}

fn threshold_signals(out: &Value) -> Vec<String> {
    out["thresholds"]
        .as_array()
        .expect("thresholds")
        .iter()
        .map(|t| t["signal"].as_str().expect("signal").to_string())
        .collect()
}

const CAPACITY: fn() -> Value = || {
    json!({"memory": "8Gi", "allocatableMemory": "7Gi", "nodefs": "100Gi", "nodefsInodes": 6553600,
           "imagefs": "500Gi", "imagefsInodes": 32768000, "pid": 32768})
};

#[test]
fn no_settings_means_the_kubelet_defaults() {
    let out = plan_ok(
        "pressure",
        &json!({"capacity": CAPACITY(), "observations": []}),
    );
    let got = threshold_signals(&out);
    for s in [
        "memory.available",
        "nodefs.available",
        "nodefs.inodesFree",
        "imagefs.available",
        "imagefs.inodesFree",
        "allocatableMemory.available",
        "containerfs.available",
        "containerfs.inodesFree",
    ] {
        assert!(got.contains(&s.to_string()), "{s} in {got:?}");
    }
    let memory = &out["thresholds"][0];
    assert_eq!(
        *memory,
        json!({"signal": "memory.available", "operator": "LessThan", "value": "100Mi",
               "gracePeriod": "0s", "minReclaim": null, "hard": true})
    );
    assert_eq!(out["steps"], json!([]));
}

#[test]
fn setting_some_hard_thresholds_drops_the_other_defaults_unless_merged() {
    let only = plan_ok(
        "pressure",
        &json!({"config": {"evictionHard": {"memory.available": "500Mi"}}, "observations": []}),
    );
    assert_eq!(
        threshold_signals(&only),
        ["memory.available", "allocatableMemory.available"]
    );
    let merged = plan_ok(
        "pressure",
        &json!({"config": {"evictionHard": {"memory.available": "500Mi"},
                           "mergeDefaultEvictionSettings": true,
                           "enforceNodeAllocatable": []},
                "observations": []}),
    );
    let got = threshold_signals(&merged);
    assert!(got.contains(&"nodefs.available".to_string()), "{got:?}");
    assert!(
        !got.contains(&"allocatableMemory.available".to_string()),
        "{got:?}"
    );
    assert_eq!(merged["thresholds"][0]["value"], json!("500Mi"));
}

#[test]
fn minimum_reclaim_from_the_seed_example() {
    // evictionHard nodefs.available 1Gi with minimum reclaim 500Mi: once met, the manager
    // reclaims until 1.5Gi is available and keeps acting until it is.
    let config = json!({
        "evictionHard": {"memory.available": "500Mi", "nodefs.available": "1Gi", "imagefs.available": "100Gi"},
        "evictionMinimumReclaim": {"memory.available": "0Mi", "nodefs.available": "500Mi", "imagefs.available": "2Gi"}
    });
    let out = plan_ok(
        "pressure",
        &json!({"config": config, "capacity": CAPACITY(), "filesystems": "imagefs", "observations": [
            {"at": at(0), "memory.available": "4Gi", "nodefs.available": "10Gi", "imagefs.available": "200Gi"},
            {"at": at(10), "memory.available": "4Gi", "nodefs.available": "900Mi", "imagefs.available": "200Gi"},
            {"at": at(20), "memory.available": "4Gi", "nodefs.available": "1200Mi", "imagefs.available": "99Gi"},
            {"at": at(30), "memory.available": "4Gi", "nodefs.available": "2Gi", "imagefs.available": "101Gi"},
            {"at": at(40), "memory.available": "4Gi", "nodefs.available": "2Gi", "imagefs.available": "103Gi"},
            {"at": at(40 + 300), "memory.available": "4Gi", "nodefs.available": "2Gi", "imagefs.available": "103Gi"}
        ]}),
    );
    let steps = out["steps"].as_array().expect("steps");
    assert_eq!(steps[0]["met"], json!([]));
    assert_eq!(steps[0]["conditions"], json!([]));
    assert_eq!(steps[0]["evict"], Value::Null);

    assert_eq!(signals(&steps[1]["met"]), ["nodefs.available"]);
    assert_eq!(steps[1]["conditions"], json!(["DiskPressure"]));
    assert_eq!(
        steps[1]["evict"],
        json!({"signal": "nodefs.available", "reclaimTo": "1524Mi", "gracePeriodSeconds": 0})
    );
    // 1200Mi is above the threshold but short of threshold + minimum reclaim.
    let met = signals(&steps[2]["met"]);
    assert!(met.contains(&"nodefs.available".to_string()), "{met:?}");
    assert!(met.contains(&"imagefs.available".to_string()), "{met:?}");
    // With a separate imagefs, containerfs inherits the imagefs threshold (and is evaluated
    // only when a containerfs figure is observed).
    let containerfs = out["thresholds"]
        .as_array()
        .expect("thresholds")
        .iter()
        .find(|t| t["signal"] == json!("containerfs.available"))
        .expect("containerfs threshold");
    assert_eq!(containerfs["value"], json!("100Gi"));
    assert_eq!(containerfs["minReclaim"], json!("2Gi"));
    assert_eq!(steps[2]["evict"]["signal"], json!("nodefs.available"));
    // Resolved for nodefs; imagefs (101Gi < 102Gi) still short of its minimum reclaim.
    assert_eq!(signals(&steps[3]["met"]), ["imagefs.available"]);
    assert_eq!(
        steps[3]["evict"],
        json!({"signal": "imagefs.available", "reclaimTo": "102Gi", "gracePeriodSeconds": 0})
    );
    // All resolved; the condition stays for the transition period (5m by default)...
    assert_eq!(steps[4]["met"], json!([]));
    assert_eq!(steps[4]["conditions"], json!(["DiskPressure"]));
    assert_eq!(steps[4]["evict"], Value::Null);
    // ...and is gone once 5m have passed since it was last met.
    assert_eq!(steps[5]["conditions"], json!([]));
}

#[test]
fn soft_threshold_waits_for_its_grace_period_and_caps_the_pod_grace_period() {
    let config = json!({
        "evictionHard": {"memory.available": "500Mi"},
        "evictionSoft": {"memory.available": "1.5Gi"},
        "evictionSoftGracePeriod": {"memory.available": "1m30s"},
        "evictionMaxPodGracePeriod": 60,
        "evictionPressureTransitionPeriod": "30s"
    });
    let obs = |t: u64, mem: &str| json!({"at": at(t), "memory.available": mem});
    let out = plan_ok(
        "pressure",
        &json!({"config": config, "capacity": CAPACITY(), "observations": [
            obs(0, "1Gi"), obs(60, "1Gi"), obs(90, "1Gi"), obs(100, "400Mi"),
            obs(110, "2Gi"), obs(125, "2Gi"), obs(130, "2Gi")
        ]}),
    );
    let steps = out["steps"].as_array().expect("steps");
    // The condition is reported at once; eviction waits for the grace period.
    assert_eq!(steps[0]["met"], json!([]));
    assert_eq!(steps[0]["conditions"], json!(["MemoryPressure"]));
    assert_eq!(steps[1]["evict"], Value::Null);
    assert_eq!(signals(&steps[2]["met"]), ["memory.available"]);
    assert_eq!(
        steps[2]["evict"],
        json!({"signal": "memory.available", "reclaimTo": "1536Mi", "gracePeriodSeconds": 60})
    );
    // Below the hard threshold too: the hard one is acted on, with no grace period.
    assert_eq!(
        steps[3]["evict"],
        json!({"signal": "memory.available", "reclaimTo": "500Mi", "gracePeriodSeconds": 0})
    );
    assert_eq!(steps[4]["met"], json!([]));
    assert_eq!(steps[4]["conditions"], json!(["MemoryPressure"]));
    assert_eq!(steps[5]["conditions"], json!(["MemoryPressure"]));
    assert_eq!(steps[6]["conditions"], json!([]));
}

#[test]
fn memory_is_reclaimed_before_disk_and_pids_raise_their_own_condition() {
    let out = plan_ok(
        "pressure",
        &json!({"config": {"evictionHard": {"memory.available": "100Mi", "nodefs.available": "10%", "pid.available": "1000"}},
                "capacity": CAPACITY(),
                "observations": [{"at": at(0), "memory.available": "50Mi", "nodefs.available": "1Gi", "pid.available": 900}]}),
    );
    let step = &out["steps"][0];
    assert_eq!(
        signals(&step["met"]),
        ["memory.available", "nodefs.available", "pid.available"]
    );
    assert_eq!(
        step["conditions"],
        json!(["MemoryPressure", "DiskPressure", "PIDPressure"])
    );
    assert_eq!(step["evict"]["signal"], json!("memory.available"));
}

#[test]
fn refused_settings_exit_2_naming_the_key() {
    for (config, key) in [
        (
            json!({"evictionSoft": {"memory.available": "1Gi"}}),
            "evictionSoftGracePeriod.memory.available",
        ),
        (
            json!({"evictionHard": {"nodefs.available": "101%"}}),
            "evictionHard.nodefs.available",
        ),
        (
            json!({"evictionHard": {"memory.avail": "1Gi"}}),
            "evictionHard.memory.avail",
        ),
        (
            json!({"evictionHard": {"memory.available": "12Qi"}}),
            "evictionHard.memory.available",
        ),
        (
            json!({"evictionMinimumReclaim": {"memory.available": "-1Mi"}}),
            "evictionMinimumReclaim.memory.available",
        ),
    ] {
        let input = json!({"config": config, "capacity": CAPACITY(), "observations": []});
        let err = plan_refused("pressure", input.to_string().as_bytes());
        assert!(err.contains(key), "{key}: {err}");
    }
    for (input, needle) in [
        (
            json!({"observations": [{"at": "yesterday", "memory.available": "1Gi"}]}),
            "observations[0].at",
        ),
        (
            json!({"observations": [{"at": at(0), "memory.available": "-1Gi"}]}),
            "observations[0].memory.available",
        ),
        (
            json!({"observations": [{"at": at(0), "nodefs.available": "1Gi"}]}),
            "capacity.nodefs",
        ),
    ] {
        let err = plan_refused("pressure", input.to_string().as_bytes());
        assert!(err.contains(needle), "{needle}: {err}");
    }
}

#[test]
fn reads_stdin_and_truncated_input_exits_2() {
    let doc =
        json!({"capacity": CAPACITY(), "observations": [{"at": at(0), "memory.available": "1Gi"}]});
    let out = plan_stdin("pressure", doc.to_string().as_bytes());
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.json["steps"][0]["met"], json!([]));
    let text = doc.to_string();
    let out = plan_stdin("pressure", &text.as_bytes()[..text.len() - 3]);
    assert_eq!(out.code, Some(2));
    assert_eq!(out.stderr.trim_end().lines().count(), 1, "{}", out.stderr);
}

/// `memoryReclaim.enabled` (the agent's own key): a memory eviction due first tries
/// `memory.reclaim` when kubepods' active file pages (`activeFile`) cover the shortfall
/// (threshold plus minimum reclaim minus available), and skips it at once when they do not;
/// the eviction shown is what follows if reclaim does not clear the threshold.
#[test]
fn memory_reclaim_first_follows_the_file_pages() {
    let config = json!({"evictionHard": {"memory.available": "500Mi"},
                        "evictionMinimumReclaim": {"memory.available": "100Mi"},
                        "memoryReclaim": {"enabled": true}});
    let out = plan_ok(
        "pressure",
        &json!({"config": config, "capacity": CAPACITY(), "observations": [
            {"at": at(0), "memory.available": "4Gi", "activeFile": "1Gi"},
            // Cache-heavy: 200Mi short of 600Mi, 1Gi of active file pages.
            {"at": at(10), "memory.available": "400Mi", "activeFile": "1Gi"},
            // Anonymous: 200Mi short, only 64Mi of file pages.
            {"at": at(20), "memory.available": "400Mi", "activeFile": "64Mi"},
            // No file pages given: none known, skipped.
            {"at": at(30), "memory.available": "400Mi"}
        ]}),
    );
    let steps = out["steps"].as_array().expect("steps");
    assert!(steps[0].get("memoryReclaim").is_none(), "{}", steps[0]);
    assert_eq!(
        steps[1]["memoryReclaim"],
        json!({"choice": "reclaim", "shortfall": "200Mi", "activeFile": "1Gi",
               "request": "200Mi", "reason": null})
    );
    assert_eq!(steps[1]["evict"]["signal"], json!("memory.available"));
    assert_eq!(
        steps[2]["memoryReclaim"],
        json!({"choice": "skip", "shortfall": "200Mi", "activeFile": "64Mi",
               "request": null, "reason": "file-pages-short"})
    );
    assert_eq!(steps[3]["memoryReclaim"]["choice"], json!("skip"));
    assert_eq!(steps[3]["memoryReclaim"]["activeFile"], json!("0"));
}

/// Off (the default, kubelet-exact), no step shows a reclaim choice, whatever the file
/// pages; disk evictions never show one; a bad `activeFile` names its field.
#[test]
fn memory_reclaim_off_or_disk_shows_no_choice() {
    let obs = json!([
        {"at": at(0), "memory.available": "50Mi", "activeFile": "1Gi"},
        {"at": at(10), "memory.available": "4Gi", "nodefs.available": "1Gi", "activeFile": "1Gi"}
    ]);
    let off = plan_ok(
        "pressure",
        &json!({"capacity": CAPACITY(), "observations": obs}),
    );
    assert_eq!(
        off["steps"][0]["evict"]["signal"],
        json!("memory.available")
    );
    assert!(off["steps"][0].get("memoryReclaim").is_none(), "{off}");
    let on = plan_ok(
        "pressure",
        &json!({"config": {"memoryReclaim": {"enabled": true}}, "capacity": CAPACITY(),
                "observations": obs}),
    );
    assert_eq!(on["steps"][0]["memoryReclaim"]["choice"], json!("reclaim"));
    assert_eq!(on["steps"][1]["evict"]["signal"], json!("nodefs.available"));
    assert!(on["steps"][1].get("memoryReclaim").is_none(), "{on}");
    let e = plan_refused(
        "pressure",
        json!({"config": {"memoryReclaim": {"enabled": true}},
               "observations": [{"at": at(0), "memory.available": "50Mi", "activeFile": "lots"}]})
        .to_string()
        .as_bytes(),
    );
    assert!(
        e.contains("observations[0].activeFile: invalid quantity"),
        "{e}"
    );
}

/// KEP-5394's PSI conditions: with the gate on, the `full` averages of each observation set
/// them by the KEP's rule (avg60 and avg10 at the threshold to rise, avg60 under it to fall)
/// and they are held for the transition period; a kubelet config pasted as `config` (its
/// `featureGates` and threshold keys among the rest) is read as it is.
#[test]
fn psi_averages_raise_the_psi_conditions_behind_their_gate() {
    let psi = |memory: (f64, f64), io: (f64, f64)| {
        json!({"system.memory": {"avg10": memory.0, "avg60": memory.1},
               "kubepods.io": {"avg10": io.0, "avg60": io.1}})
    };
    let input = |gate: bool| {
        json!({"config": {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
                   "featureGates": {"PSINodeCondition": gate, "MemoryQoS": true},
                   "systemMemoryContentionThreshold": 2.5, "kubepodsDiskContentionThreshold": 0,
                   "evictionPressureTransitionPeriod": "1m"},
        "capacity": CAPACITY(),
        "observations": [
            {"at": at(0), "memory.available": "4Gi", "psi": psi((0.0, 0.0), (100.0, 100.0))},
            {"at": at(10), "memory.available": "4Gi", "psi": psi((30.0, 2.5), (100.0, 100.0))},
            {"at": at(20), "memory.available": "4Gi", "psi": psi((1.0, 2.0), (0.0, 0.0))},
            // No figure read at 69 s: still held, 59 s after the rule last held (at 10 s).
            {"at": at(69), "memory.available": "4Gi"},
            {"at": at(70), "memory.available": "4Gi", "psi": psi((0.0, 0.5), (0.0, 0.0))}
        ]})
    };
    let out = plan_ok("pressure", &input(true));
    let conditions: Vec<Value> = out["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["conditions"].clone())
        .collect();
    let on = json!(["SystemMemoryContentionPressure"]);
    // The kubepods I/O threshold is 0: that condition never turns on, even at 100 %.
    assert_eq!(
        conditions,
        [json!([]), on.clone(), on.clone(), on, json!([])],
        "{out}"
    );
    let out = plan_ok("pressure", &input(false));
    for step in out["steps"].as_array().expect("steps") {
        assert_eq!(step["conditions"], json!([]), "{out}");
    }
    for (config, psi, needle) in [
        (
            json!({"kubepodsMemoryContentionThreshold": 120}),
            json!({}),
            "config.kubepodsMemoryContentionThreshold",
        ),
        (
            json!({}),
            json!({"kubepods.cpu": {"avg10": 1, "avg60": 1}}),
            "observations[0].psi.kubepods.cpu",
        ),
        (
            json!({}),
            json!({"system.io": {"avg10": -1, "avg60": 1}}),
            "observations[0].psi.system.io.avg10",
        ),
    ] {
        let input = json!({"config": config, "observations": [{"at": at(0), "psi": psi}]});
        let err = plan_refused("pressure", input.to_string().as_bytes());
        assert!(err.contains(needle), "{needle}: {err}");
    }
}
