//! `reactor plan image-gc`: one image-GC round over realistic image records, as the kubelet's
//! image GC manager plans it; an invalid policy is an `error` in the answer, malformed input
//! exits 2.

mod plan_cli;

use plan_cli::{plan_ok, plan_refused, plan_stdin};
use serde_json::{json, Value};

const GI: u64 = 1 << 30;
const MI: u64 = 1 << 20;

fn image(
    id: &str,
    size: u64,
    first: Option<&str>,
    used: Option<&str>,
    in_use: bool,
    pinned: bool,
) -> Value {
    json!({"id": format!("sha256:{id}"), "sizeBytes": size, "firstDetected": first,
           "lastUsed": used, "inUse": in_use, "pinned": pinned})
}

fn images() -> Vec<Value> {
    vec![
        image(
            "pause",
            700 * 1024,
            Some("2026-11-01T00:00:00Z"),
            Some("2026-11-22T09:59:00Z"),
            false,
            true,
        ),
        image(
            "nginx",
            70 * MI,
            Some("2026-11-20T08:00:00Z"),
            Some("2026-11-22T10:00:00Z"),
            true,
            false,
        ),
        image(
            "postgres",
            400 * MI,
            Some("2026-11-10T00:00:00Z"),
            Some("2026-11-21T12:00:00Z"),
            false,
            false,
        ),
        image(
            "busybox",
            4 * MI,
            Some("2026-11-05T00:00:00Z"),
            None,
            false,
            false,
        ),
        image(
            "cuda",
            3 * GI,
            Some("2026-11-02T00:00:00Z"),
            Some("2026-11-15T00:00:00Z"),
            false,
            false,
        ),
        image(
            "redis",
            40 * MI,
            None,
            Some("2026-11-15T00:00:00Z"),
            false,
            false,
        ),
        image(
            "just-pulled",
            GI,
            Some("2026-11-22T09:59:30Z"),
            None,
            false,
            false,
        ),
        image(
            "used-now",
            GI,
            Some("2026-11-01T00:00:00Z"),
            Some("2026-11-22T10:00:00Z"),
            false,
            false,
        ),
    ]
}

fn input(policy: Value, capacity: u64, available: u64) -> Value {
    json!({"policy": policy, "fs": {"capacityBytes": capacity, "availableBytes": available},
           "now": "2026-11-22T10:00:00Z", "startedAt": "2026-11-22T08:00:00Z", "images": images()})
}

fn policy() -> Value {
    json!({"highThresholdPercent": 85, "lowThresholdPercent": 80, "minAge": "2m", "maxAge": "0s"})
}

#[test]
fn below_the_high_threshold_nothing_is_deleted() {
    let out = plan_ok("image-gc", &input(policy(), 100 * GI, 20 * GI));
    assert_eq!(
        out,
        json!({"usagePercent": 80, "bytesToFree": null, "delete": [], "freedBytes": 0, "error": null})
    );
}

#[test]
fn at_the_high_threshold_frees_down_to_the_low_one_lru_first() {
    // 100 - floor(15 * 100 / 100) = 85: at the threshold. Target 20Gi available: free 5Gi.
    let out = plan_ok("image-gc", &input(policy(), 100 * GI, 15 * GI));
    assert_eq!(out["usagePercent"], json!(85));
    assert_eq!(out["bytesToFree"], json!(5 * GI));
    // Never used first (busybox; just-pulled is younger than minAge), then by last use:
    // redis and cuda tie on last use, redis was detected first (null is the beginning of
    // time); then postgres. Pinned, in-use and used-at-now images are kept.
    assert_eq!(
        out["delete"],
        json!([
            "sha256:busybox",
            "sha256:redis",
            "sha256:cuda",
            "sha256:postgres"
        ])
    );
    let freed = 4 * MI + 40 * MI + 3 * GI + 400 * MI;
    assert_eq!(out["freedBytes"], json!(freed));
    let err = out["error"].as_str().expect("could not free enough");
    assert!(
        err.contains(&format!(
            "Attempted to free {} bytes, but only found {freed} bytes",
            5 * GI
        )),
        "{err}"
    );
}

#[test]
fn stops_as_soon_as_enough_is_freed() {
    // 86% used on a 20Gi filesystem: 1.2Gi to free, which cuda covers; postgres stays.
    let cap = 20 * GI;
    let available = cap * 14 / 100; // usage 86%
    let out = plan_ok("image-gc", &input(policy(), cap, available));
    let to_free = (cap * 20 / 100) as i64 - available as i64;
    assert_eq!(out["bytesToFree"], json!(to_free));
    assert_eq!(
        out["delete"],
        json!(["sha256:busybox", "sha256:redis", "sha256:cuda"])
    );
    assert_eq!(out["error"], Value::Null);
}

#[test]
fn max_age_deletes_whatever_the_usage_once_the_agent_has_been_up_long_enough() {
    let mut p = policy();
    p["maxAge"] = json!("72h");
    // Plenty of space; unused for more than 72h: busybox (never), redis and cuda (Nov 15).
    let mut long_up = input(p.clone(), 100 * GI, 90 * GI);
    long_up.as_object_mut().expect("object").remove("startedAt"); // default: long ago
    let out = plan_ok("image-gc", &long_up);
    // Oldest use first; the never-used image pulled a moment ago goes too (maxAge is not
    // held back by minAge); postgres, used 22h ago, stays.
    assert_eq!(
        out["delete"],
        json!([
            "sha256:busybox",
            "sha256:just-pulled",
            "sha256:redis",
            "sha256:cuda"
        ])
    );
    assert_eq!(out["bytesToFree"], Value::Null);
    assert_eq!(out["error"], Value::Null);
    // Up for only 2h (startedAt 08:00): age-based deletion waits for the agent to have been
    // up longer than maxAge.
    let young = input(p, 100 * GI, 90 * GI);
    let out = plan_ok("image-gc", &young);
    assert_eq!(out["delete"], json!([]));
}

#[test]
fn invalid_policy_is_an_error_not_a_crash() {
    for (high, low, needle) in [
        (101, 80, "HighThresholdPercent 101"),
        (85, -5, "LowThresholdPercent -5"),
        (
            70,
            80,
            "LowThresholdPercent 80 can not be higher than HighThresholdPercent 70",
        ),
    ] {
        let p = json!({"highThresholdPercent": high, "lowThresholdPercent": low, "minAge": "2m", "maxAge": "0s"});
        let out = plan_ok("image-gc", &input(p, 100 * GI, GI));
        assert!(
            out["error"].as_str().expect("error").contains(needle),
            "{out}"
        );
        assert_eq!(out["delete"], json!([]));
    }
}

#[test]
fn malformed_input_exits_2_naming_the_field() {
    let good = input(policy(), 100 * GI, GI);
    let mut cases: Vec<(Value, &str)> = Vec::new();
    let mut neg = good.clone();
    neg["images"][2]["sizeBytes"] = json!(-1);
    cases.push((neg, "images[2].sizeBytes"));
    let mut bad_time = good.clone();
    bad_time["images"][3]["lastUsed"] = json!("last tuesday");
    cases.push((bad_time, "images[3].lastUsed"));
    let mut bad_now = good.clone();
    bad_now["now"] = json!(12);
    cases.push((bad_now, "now"));
    let mut bad_age = good.clone();
    bad_age["policy"]["minAge"] = json!("2 minutes");
    cases.push((bad_age, "policy.minAge"));
    let mut no_fs = good.clone();
    no_fs.as_object_mut().expect("object").remove("fs");
    cases.push((no_fs, "fs"));
    for (doc, needle) in cases {
        let err = plan_refused("image-gc", doc.to_string().as_bytes());
        assert!(err.contains(needle), "{needle}: {err}");
    }
}

#[test]
fn reads_stdin() {
    let out = plan_stdin(
        "image-gc",
        input(policy(), 100 * GI, 20 * GI).to_string().as_bytes(),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.json["usagePercent"], json!(80));
}
