//! Critical-pod preemption over a node with 10,000 running pods (target: under 10 ms).
//!
//! Pods are built once (as the live agent keeps them); the measured part is the kubelet's
//! admission-failure handling: tiering, the feasibility check and the distance loops.

use criterion::{criterion_main, Criterion};
use reactor::decide::pod::PodInfo;
use reactor::decide::preempt::{handle_admission_failure, AdmitFailure};
use serde_json::json;
use std::hint::black_box;

const MI: i64 = 1 << 20;

/// 10,000 pods: a third best-effort, a third burstable, a third guaranteed, with varied
/// requests and priorities, plus a few critical ones.
fn node_pods(n: usize) -> Vec<PodInfo> {
    (0..n)
        .map(|i| {
            let mem = 64 + (i * 37 % 2000);
            let cpu = 10 + (i * 53 % 1990);
            let resources = match i % 3 {
                0 => json!({}),
                1 => json!({"requests": {"cpu": format!("{cpu}m"), "memory": format!("{mem}Mi")}}),
                _ => {
                    let r = json!({"cpu": format!("{cpu}m"), "memory": format!("{mem}Mi")});
                    json!({"requests": r.clone(), "limits": r})
                }
            };
            let priority = if i % 500 == 0 { 2_000_000_000 } else { (i % 7) as i64 * 100 };
            PodInfo::from_json(json!({
                "metadata": {"name": format!("pod-{i}"), "namespace": "bench", "uid": format!("uid-{i}")},
                "spec": {"priority": priority, "containers": [{"name": "c", "resources": resources}]}
            }))
            .expect("valid pod")
        })
        .collect()
}

fn admit() -> PodInfo {
    PodInfo::from_json(json!({
        "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
        "spec": {"priority": 2_000_001_000, "priorityClassName": "system-node-critical", "containers": []}
    }))
    .expect("valid pod")
}

fn shortage(resource: &str, amount: i64) -> AdmitFailure {
    AdmitFailure::InsufficientResource {
        resource: resource.to_string(),
        requested: amount,
        used: 0,
        capacity: 0,
    }
}

fn bench(c: &mut Criterion) {
    let pods = node_pods(10_000);
    let admit = admit();
    let cases = [
        ("memory_1Gi", vec![shortage("memory", 1024 * MI)]),
        (
            "memory_2Gi_cpu_1500m",
            vec![shortage("memory", 2048 * MI), shortage("cpu", 1500)],
        ),
        (
            "memory_100Gi_many_victims",
            vec![shortage("memory", 100 * 1024 * MI)],
        ),
        ("unsatisfiable", vec![shortage("nvidia.com/gpu", 1)]),
    ];
    let mut group = c.benchmark_group("preempt_10k_pods");
    for (name, failures) in &cases {
        let d = handle_admission_failure(&admit, &pods, failures);
        eprintln!("{name}: admit={} victims={}", d.admit, d.preempt.len());
        group.bench_function(*name, |b| {
            b.iter(|| {
                handle_admission_failure(black_box(&admit), black_box(&pods), black_box(failures))
            })
        });
    }
    group.finish();

    // The whole offline path for reference: parse 10,000 kubectl-shaped pods, decide, answer.
    let doc = json!({
        "pods": (0..10_000).map(|i| json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("pod-{i}"), "namespace": "bench", "uid": format!("uid-{i}"),
                         "creationTimestamp": "2026-11-22T09:00:00Z", "labels": {"app": "bench"}},
            "spec": {"priority": (i % 7) * 100, "containers": [{"name": "c", "image": "x:1",
                "resources": {"requests": {"cpu": format!("{}m", 10 + i % 990), "memory": format!("{}Mi", 64 + i % 2000)}}}]},
            "status": {"phase": "Running", "qosClass": "Burstable"}
        })).collect::<Vec<_>>(),
        "admit": {"metadata": {"name": "kube-proxy", "namespace": "kube-system"},
                  "spec": {"priority": 2_000_001_000, "containers": []}},
        "failures": [{"type": "InsufficientResource", "resource": "memory",
                      "requested": "1Gi", "used": "64Gi", "capacity": "64Gi"}]
    });
    let bytes = serde_json::to_vec(&doc).expect("serialize");
    let mut group = c.benchmark_group("plan_preempt_json");
    group.sample_size(10);
    group.bench_function("parse_and_decide_10k_pods", |b| {
        b.iter(|| reactor::plan::preempt::run(black_box(&bytes)).expect("valid"))
    });
    group.finish();
}

/// Criterion's generated entry point lives in a private module: it needs no public docs.
mod entry {
    criterion::criterion_group!(benches, super::bench);
}
criterion_main!(entry::benches);
