//! `reactor plan image-gc`: which images one GC round would delete.
//!
//! Input `{"policy", "fs", "now", "startedAt", "images"}`, output `{"usagePercent",
//! "bytesToFree", "delete", "freedBytes", "error"}`. An invalid policy is reported in
//! `error` (exit 0); malformed input (a bad time, a negative size) exits 2.

use serde::{Deserialize, Serialize};

use crate::decide::duration::parse_go_duration_nanos;
use crate::decide::image_gc::{plan as gc_plan, ImageFs, ImageGcPolicy, ImageRecord};
use crate::decide::timestamp::parse_rfc3339;
use crate::plan::input::{invalid, parse, InputError};

fn default_high() -> i64 {
    85
}
fn default_low() -> i64 {
    80
}
fn default_min_age() -> String {
    "2m".to_string()
}
fn default_max_age() -> String {
    "0s".to_string()
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PolicyIn {
    #[serde(default = "default_high")]
    high_threshold_percent: i64,
    #[serde(default = "default_low")]
    low_threshold_percent: i64,
    #[serde(default = "default_min_age")]
    min_age: String,
    #[serde(default = "default_max_age")]
    max_age: String,
}

impl Default for PolicyIn {
    fn default() -> Self {
        PolicyIn {
            high_threshold_percent: default_high(),
            low_threshold_percent: default_low(),
            min_age: default_min_age(),
            max_age: default_max_age(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FsIn {
    capacity_bytes: u64,
    available_bytes: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImageIn {
    id: String,
    size_bytes: u64,
    #[serde(default)]
    first_detected: Option<String>,
    #[serde(default)]
    last_used: Option<String>,
    #[serde(default)]
    in_use: bool,
    #[serde(default)]
    pinned: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImageGcIn {
    #[serde(default)]
    policy: Option<PolicyIn>,
    fs: FsIn,
    now: String,
    #[serde(default)]
    started_at: Option<String>,
    #[serde(default)]
    images: Vec<ImageIn>,
}

/// The `plan image-gc` answer.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ImageGcOut {
    /// `100 - floor(available * 100 / capacity)`; null for a zero capacity.
    pub usage_percent: Option<i64>,
    /// What space-driven GC aims to free; null below the high threshold.
    pub bytes_to_free: Option<i64>,
    /// Image ids in deletion order (age-driven first, then space-driven).
    pub delete: Vec<String>,
    /// Bytes freed by the deletions.
    pub freed_bytes: i64,
    /// An invalid policy, or the kubelet's complaint when it cannot free enough.
    pub error: Option<String>,
}

fn bytes(path: &str, value: u64) -> Result<i64, InputError> {
    i64::try_from(value).map_err(|_| invalid(path, format!("{value} is out of range")))
}

fn time(path: &str, text: Option<&str>) -> Result<Option<i128>, InputError> {
    text.map(|t| parse_rfc3339(t).map_err(|e| invalid(path, e)))
        .transpose()
}

/// Runs `plan image-gc` on raw input bytes.
pub fn run(bytes_in: &[u8]) -> Result<serde_json::Value, InputError> {
    let input: ImageGcIn = parse(bytes_in)?;
    let policy_in = input.policy.unwrap_or_default();
    let min_age =
        parse_go_duration_nanos(&policy_in.min_age).map_err(|e| invalid("policy.minAge", e))?;
    let max_age =
        parse_go_duration_nanos(&policy_in.max_age).map_err(|e| invalid("policy.maxAge", e))?;
    let policy = ImageGcPolicy {
        high_threshold_percent: policy_in.high_threshold_percent,
        low_threshold_percent: policy_in.low_threshold_percent,
        min_age_nanos: min_age,
        max_age_nanos: max_age,
    };
    let fs = ImageFs {
        capacity_bytes: bytes("fs.capacityBytes", input.fs.capacity_bytes)?,
        available_bytes: bytes("fs.availableBytes", input.fs.available_bytes)?,
    };
    let now = parse_rfc3339(&input.now).map_err(|e| invalid("now", e))?;
    let started_at = time("startedAt", input.started_at.as_deref())?;
    let mut images = Vec::with_capacity(input.images.len());
    for (i, img) in input.images.into_iter().enumerate() {
        images.push(ImageRecord {
            size_bytes: bytes(&format!("images[{i}].sizeBytes"), img.size_bytes)?,
            first_detected: time(
                &format!("images[{i}].firstDetected"),
                img.first_detected.as_deref(),
            )?,
            last_used: time(&format!("images[{i}].lastUsed"), img.last_used.as_deref())?,
            in_use: img.in_use,
            pinned: img.pinned,
            id: img.id,
        });
    }
    let plan = gc_plan(&policy, fs, &images, now, started_at);
    let out = ImageGcOut {
        usage_percent: plan.usage_percent,
        bytes_to_free: plan.bytes_to_free,
        delete: plan
            .delete
            .iter()
            .map(|(i, _)| images[*i].id.clone())
            .collect(),
        freed_bytes: plan.freed_bytes,
        error: plan.error,
    };
    serde_json::to_value(out).map_err(|e| InputError::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn run_json(v: Value) -> Result<Value, InputError> {
        run(v.to_string().as_bytes())
    }

    #[test]
    fn plans_and_reports() {
        let out = run_json(json!({
            "policy": {"highThresholdPercent": 85, "lowThresholdPercent": 80, "minAge": "2m", "maxAge": "0s"},
            "fs": {"capacityBytes": 1000, "availableBytes": 100},
            "now": "2026-01-01T01:00:00Z",
            "images": [
                {"id": "sha256:b", "sizeBytes": 60, "firstDetected": "2026-01-01T00:00:00Z", "lastUsed": "2026-01-01T00:30:00Z", "inUse": false, "pinned": false},
                {"id": "sha256:a", "sizeBytes": 60, "firstDetected": null, "lastUsed": null},
                {"id": "sha256:c", "sizeBytes": 60, "inUse": true}
            ]
        }))
        .unwrap();
        assert_eq!(
            out,
            json!({"usagePercent": 90, "bytesToFree": 100, "delete": ["sha256:a", "sha256:b"],
                   "freedBytes": 120, "error": null})
        );
    }

    #[test]
    fn invalid_policy_is_an_error_in_the_answer() {
        let out = run_json(json!({
            "policy": {"highThresholdPercent": 70, "lowThresholdPercent": 80},
            "fs": {"capacityBytes": 1000, "availableBytes": 100},
            "now": "2026-01-01T01:00:00Z", "images": []
        }))
        .unwrap();
        assert!(out["error"]
            .as_str()
            .unwrap()
            .contains("LowThresholdPercent 80"));
        assert_eq!(out["delete"], json!([]));
    }

    #[test]
    fn malformed_input_names_the_field() {
        for (doc, needle) in [
            (
                json!({"fs": {"capacityBytes": -1, "availableBytes": 0}, "now": "2026-01-01T00:00:00Z"}),
                "fs.capacityBytes:",
            ),
            (
                json!({"fs": {"capacityBytes": 1, "availableBytes": 0}, "now": "tomorrow"}),
                "now: invalid time",
            ),
            (
                json!({"fs": {"capacityBytes": 1, "availableBytes": 0}, "now": "2026-01-01T00:00:00Z",
                       "images": [{"id": "x", "sizeBytes": 1, "lastUsed": "never"}]}),
                "images[0].lastUsed: invalid time",
            ),
            (
                json!({"policy": {"minAge": "2 minutes"}, "fs": {"capacityBytes": 1, "availableBytes": 0},
                       "now": "2026-01-01T00:00:00Z"}),
                "policy.minAge: invalid duration",
            ),
        ] {
            let e = run_json(doc).unwrap_err().to_string();
            assert!(e.starts_with(needle), "{e}");
        }
    }
}
