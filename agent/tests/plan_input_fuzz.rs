//! Random and truncated documents fed to the `plan evict`, `plan pressure` and
//! `plan image-gc` input parsers: every one either plans or fails with a single line, and
//! none panics.

use proptest::prelude::*;
use reactor::plan::{evict, image_gc, pressure};

const EVICT: &str = r#"{"signal": "nodefs.available", "filesystems": "imagefs",
 "pods": [{"metadata": {"name": "a", "namespace": "x", "uid": "u1"},
           "spec": {"priority": 5, "containers": [{"name": "c",
             "resources": {"requests": {"memory": "64Mi", "ephemeral-storage": "1Gi"}}}],
             "volumes": [{"name": "v", "emptyDir": {}}]}},
          {"metadata": {"name": "b", "uid": "u2"}}],
 "summary": {"pods": [{"podRef": {"name": "a", "namespace": "x", "uid": "u1"},
   "memory": {"workingSetBytes": 1048576},
   "containers": [{"name": "c", "rootfs": {"usedBytes": 10, "inodesUsed": 2},
                   "logs": {"usedBytes": 5, "inodesUsed": 1}}],
   "volume": [{"name": "v", "usedBytes": 7, "inodesUsed": 3}],
   "ephemeral-storage": {"usedBytes": 22}, "process_stats": {"process_count": 3}}]}}"#;

const PRESSURE: &str = r#"{"config": {"evictionHard": {"memory.available": "100Mi", "nodefs.available": "10%"},
   "evictionSoft": {"memory.available": "300Mi"}, "evictionSoftGracePeriod": {"memory.available": "30s"},
   "evictionMinimumReclaim": {"memory.available": "50Mi"}, "evictionPressureTransitionPeriod": "1m",
   "evictionMaxPodGracePeriod": 20, "mergeDefaultEvictionSettings": true},
 "capacity": {"memory": "4Gi", "allocatableMemory": "3Gi", "nodefs": "100Gi", "nodefsInodes": 1000000,
   "imagefs": "200Gi", "imagefsInodes": 2000000, "pid": 32768},
 "observations": [
   {"at": "2026-01-01T00:00:00Z", "memory.available": "250Mi", "nodefs.available": "50Gi", "pid.available": 30000},
   {"at": "2026-01-01T00:00:40Z", "memory.available": "90Mi", "nodefs.inodesFree": 10}]}"#;

const IMAGE_GC: &str = r#"{"policy": {"highThresholdPercent": 85, "lowThresholdPercent": 80, "minAge": "2m", "maxAge": "1h"},
 "fs": {"capacityBytes": 1000, "availableBytes": 50}, "now": "2026-01-01T02:00:00Z",
 "startedAt": "2026-01-01T00:00:00Z",
 "images": [{"id": "sha256:a", "sizeBytes": 100, "firstDetected": null, "lastUsed": null, "inUse": false, "pinned": false},
            {"id": "sha256:b", "sizeBytes": 300, "firstDetected": "2026-01-01T01:59:00Z", "lastUsed": "2026-01-01T01:00:00Z"}]}"#;

type Runner = fn(&[u8]) -> Result<serde_json::Value, reactor::plan::input::InputError>;

const PLANS: [(&str, &str, Runner); 3] = [
    ("evict", EVICT, evict::run),
    ("pressure", PRESSURE, pressure::run),
    ("image-gc", IMAGE_GC, image_gc::run),
];

fn check(name: &str, run: Runner, bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Err(e) = run(bytes) {
        let text = e.to_string();
        prop_assert!(!text.is_empty(), "{name}: empty error");
        prop_assert!(!text.contains('\n'), "{name}: multi-line error {text:?}");
    }
    Ok(())
}

#[test]
fn the_sample_documents_plan() {
    for (name, doc, run) in PLANS {
        assert!(run(doc.as_bytes()).is_ok(), "{name}");
    }
}

/// A JSON value that looks a little like plan input: known keys, odd values.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(|f| serde_json::json!(f)),
        prop_oneof![
            Just("100Mi".to_string()),
            Just("10%".to_string()),
            Just("-1".to_string()),
            Just("12Qi".to_string()),
            Just("2026-01-01T00:00:00Z".to_string()),
            Just("memory.available".to_string()),
            Just("1m30s".to_string()),
            "[a-zA-Z0-9.%:-]{0,12}",
        ]
        .prop_map(serde_json::Value::from),
    ];
    let keys = prop_oneof![
        Just("signal".to_string()),
        Just("pods".to_string()),
        Just("summary".to_string()),
        Just("config".to_string()),
        Just("capacity".to_string()),
        Just("observations".to_string()),
        Just("policy".to_string()),
        Just("fs".to_string()),
        Just("images".to_string()),
        Just("now".to_string()),
        Just("at".to_string()),
        Just("memory.available".to_string()),
        Just("evictionHard".to_string()),
        Just("metadata".to_string()),
        "[a-z]{1,8}",
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map(keys.clone(), inner, 0..5)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn truncated_documents_fail_in_one_line(cut in 0usize..2000, which in 0usize..3) {
        let (name, doc, run) = PLANS[which];
        let end = cut.min(doc.len());
        check(name, run, &doc.as_bytes()[..end])?;
    }

    #[test]
    fn mutated_documents_never_panic(pos in 0usize..2000, byte in any::<u8>(), which in 0usize..3) {
        let (name, doc, run) = PLANS[which];
        let mut bytes = doc.as_bytes().to_vec();
        let at = pos % bytes.len();
        bytes[at] = byte;
        check(name, run, &bytes)?;
    }

    #[test]
    fn random_values_never_panic(value in json_value(), which in 0usize..3) {
        let (name, _, run) = PLANS[which];
        check(name, run, value.to_string().as_bytes())?;
    }

    #[test]
    fn random_values_inside_valid_documents_never_panic(
        value in json_value(),
        field in 0usize..12,
        which in 0usize..3,
    ) {
        let (name, doc, run) = PLANS[which];
        let mut base: serde_json::Value = serde_json::from_str(doc).expect("sample parses");
        let targets = [
            "/signal", "/pods/0/spec", "/summary/pods/0", "/summary/pods/0/containers/0",
            "/config/evictionHard", "/capacity", "/observations/1", "/config",
            "/policy", "/fs", "/images/0", "/now",
        ];
        if let Some(slot) = base.pointer_mut(targets[field]) {
            *slot = value;
        }
        check(name, run, base.to_string().as_bytes())?;
    }
}
