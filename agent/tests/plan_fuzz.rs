//! Property tests of the `reactor plan` input path: random bytes, truncated documents and
//! documents with a field swapped for a random value must give either an answer or one
//! clear line, never a panic. The library functions are driven directly for speed, the
//! binary a few times to check the exit code.

use proptest::prelude::*;
use reactor::plan::{cgroups, input::InputError, preempt};
use serde_json::{json, Value};

fn pod(name: &str, requests: Value, limits: Value, priority: Option<i64>) -> Value {
    let mut spec = json!({"containers": [{"name": "c", "resources": {"requests": requests, "limits": limits}}],
        "initContainers": [{"name": "i", "restartPolicy": "Always",
            "resources": {"requests": {"cpu": "10m"}, "limits": {"cpu": "20m"}}}],
        "overhead": {"cpu": "5m", "memory": 1048576},
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}]});
    if let Some(p) = priority {
        spec["priority"] = json!(p);
    }
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                     "annotations": {"kubernetes.io/config.source": "api"}},
        "spec": spec, "status": {"phase": "Running"}})
}

fn pods() -> Vec<Value> {
    vec![
        pod("be", json!({}), json!({}), Some(0)),
        pod(
            "bu",
            json!({"cpu": "250m", "memory": "256Mi"}),
            json!({"memory": "1Gi"}),
            Some(10),
        ),
        pod(
            "gu",
            json!({"cpu": 1, "memory": "1Gi"}),
            json!({"cpu": "1", "memory": "1Gi"}),
            None,
        ),
    ]
}

fn preempt_doc() -> Value {
    json!({"pods": pods(), "admit": pod("crit", json!({"cpu": "1"}), json!({}), Some(2000001000)),
        "failures": [{"type": "InsufficientResource", "resource": "memory", "requested": "512Mi", "used": "7.8Gi", "capacity": "8Gi"},
                     {"type": "InsufficientResource", "resource": "cpu", "requested": "1", "used": 3, "capacity": 3}]})
}

fn cgroups_doc() -> Value {
    json!({"node": {"cgroupVersion": 2, "allocatable": {"cpu": "3", "memory": "8Gi"},
        "qosReserved": {"memory": "100%"}, "enforceCPULimits": true, "cpuCFSQuotaPeriod": "100ms",
        "memoryCapacity": "8Gi"}, "pods": pods()})
}

/// Both plans on the same bytes: an answer, or an error that is one non-empty line.
fn check(bytes: &[u8]) {
    let results: [Result<(), InputError>; 2] = [
        preempt::run(bytes).map(|_| ()),
        cgroups::run(bytes).map(|_| ()),
    ];
    for r in results {
        if let Err(e) = r {
            let text = e.to_string();
            assert!(!text.trim().is_empty(), "empty error");
            assert!(
                !text.contains('\n') && !text.contains('\r'),
                "multi-line error: {text:?}"
            );
        }
    }
}

#[derive(Clone, Debug)]
enum PathStep {
    Key(String),
    Index(usize),
}

/// Every location of a JSON value, as a path of object keys and array indices.
fn paths(v: &Value, prefix: &mut Vec<PathStep>, out: &mut Vec<Vec<PathStep>>) {
    out.push(prefix.clone());
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                prefix.push(PathStep::Key(k.clone()));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                prefix.push(PathStep::Index(i));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn at<'a>(v: &'a mut Value, path: &[PathStep]) -> &'a mut Value {
    let mut cur = v;
    for step in path {
        cur = match step {
            PathStep::Key(k) => &mut cur[k.as_str()],
            PathStep::Index(i) => &mut cur[*i],
        };
    }
    cur
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[0-9a-zA-Z.+-]{0,12}".prop_map(Value::from),
        prop::sample::select(vec![
            "12Qi",
            "-1",
            "1e400",
            "9223372036854775807",
            "0.000000001",
            "1Ei",
            "",
            "100m",
            "-5Gi",
            "Always",
            "Memory",
            "Guaranteed",
            "Gold",
            "InsufficientResource",
            "Other",
            "1h",
            "0s",
            "150%",
            "%",
            "-3%",
            "cpu",
            "pods",
        ])
        .prop_map(Value::from),
        Just(json!({})),
        Just(json!([])),
        Just(json!([{}])),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check(&bytes);
    }

    #[test]
    fn truncated_documents_are_errors_of_one_line(which in 0usize..2, cut in 0.0f64..1.0) {
        let doc = if which == 0 { preempt_doc() } else { cgroups_doc() };
        let text = serde_json::to_vec(&doc).expect("serialize");
        let at = ((text.len() as f64) * cut) as usize;
        let bytes = &text[..at.min(text.len() - 1)];
        check(bytes);
        let r = if which == 0 {
            preempt::run(bytes).map(|_| ())
        } else {
            cgroups::run(bytes).map(|_| ())
        };
        prop_assert!(r.is_err(), "a truncated document must not be accepted");
    }

    #[test]
    fn one_field_replaced_by_anything_never_panics(
        which in 0usize..2,
        pick in any::<prop::sample::Index>(),
        value in scalar(),
    ) {
        let mut doc = if which == 0 { preempt_doc() } else { cgroups_doc() };
        let mut all = Vec::new();
        paths(&doc, &mut Vec::new(), &mut all);
        let path = pick.get(&all).clone();
        *at(&mut doc, &path) = value;
        check(&serde_json::to_vec(&doc).expect("serialize"));
    }

    #[test]
    fn random_quantities_in_requests_never_panic(
        cpu in "[-+]?[0-9]{0,25}(\\.[0-9]{0,12})?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|e[0-9]{1,3}|E-?[0-9]{1,2})?",
        mem in any::<i64>(),
    ) {
        let mut doc = cgroups_doc();
        doc["pods"][1]["spec"]["containers"][0]["resources"]["requests"] = json!({"cpu": cpu, "memory": mem});
        doc["pods"][1]["spec"]["containers"][0]["resources"]["limits"] = json!({"cpu": cpu, "memory": mem});
        check(&serde_json::to_vec(&doc).expect("serialize"));
        let mut doc = preempt_doc();
        doc["pods"][2]["spec"]["containers"][0]["resources"]["requests"] = json!({"cpu": cpu, "memory": mem});
        doc["failures"][1]["requested"] = json!(cpu);
        check(&serde_json::to_vec(&doc).expect("serialize"));
    }
}

#[test]
fn the_sample_documents_are_accepted() {
    let out = preempt::run(&serde_json::to_vec(&preempt_doc()).expect("serialize")).expect("valid");
    assert!(out.admit, "{out:?}");
    cgroups::run(&serde_json::to_vec(&cgroups_doc()).expect("serialize")).expect("valid");
}

#[test]
fn the_binary_exits_2_with_one_line_on_broken_documents() {
    let bin = env!("CARGO_BIN_EXE_reactor");
    let dir = tempfile::tempdir().expect("temp dir");
    let text = serde_json::to_vec(&cgroups_doc()).expect("serialize");
    let mut cases: Vec<Vec<u8>> = vec![
        text[..text.len() / 2].to_vec(),
        text[..text.len() - 1].to_vec(),
        b"\xff\xfe\x00garbage".to_vec(),
        Vec::new(),
        b"[]".to_vec(),
    ];
    cases.push(std::iter::repeat_n(b'[', 10_000).collect());
    for (i, bytes) in cases.iter().enumerate() {
        let file = dir.path().join(format!("case{i}.json"));
        std::fs::write(&file, bytes).expect("write");
        for what in ["cgroups", "preempt"] {
            let out = std::process::Command::new(bin)
                .args(["plan", what, "--input"])
                .arg(&file)
                .output()
                .expect("run reactor");
            assert_eq!(out.status.code(), Some(2), "case {i} {what}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(err.trim_end().lines().count(), 1, "case {i} {what}: {err}");
            assert!(out.stdout.is_empty());
        }
    }
}
