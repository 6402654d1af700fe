//! Ranking 10,000 pods for `memory.available` (target: under 2 ms per decision).
//!
//! Pods and stats are built once outside the timed loop, as the live agent holds them; the
//! timed part is what one eviction decision costs: joining stats by uid and sorting.
#![expect(
    missing_docs,
    reason = "criterion_group! generates an undocumented function"
)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use reactor::decide::pod::PodInfo;
use reactor::decide::rank::rank;
use reactor::decide::signal::{FsLayout, Signal};
use reactor::decide::summary::Summary;
use serde_json::json;

const PODS: usize = 10_000;

fn fixture() -> (Vec<PodInfo>, Summary) {
    let mut pods = Vec::with_capacity(PODS);
    let mut stats = Vec::with_capacity(PODS);
    for i in 0..PODS {
        // A spread of requests, priorities and usage, with some pods lacking stats.
        let uid = format!("0b6f3f1e-{i:04x}-4c1a-9d5e-{:012x}", i * 7919);
        let request = (i % 17) * (16 << 20);
        pods.push(
            PodInfo::from_json(json!({
                "metadata": {"name": format!("pod-{i}"), "namespace": "bench", "uid": uid},
                "spec": {"priority": (i % 5) as i32 * 1000,
                         "containers": [{"name": "app", "resources": {"requests": {"memory": request.to_string()}}}]}
            }))
            .expect("fixture pod"),
        );
        if i % 50 != 0 {
            stats.push(json!({"podRef": {"uid": uid}, "memory": {"workingSetBytes": (i * 104_729) % (512 << 20)}}));
        }
    }
    let summary =
        Summary::from_value(json!({ "pods": stats }), "summary").expect("fixture summary");
    (pods, summary)
}

fn bench(c: &mut Criterion) {
    let (pods, summary) = fixture();
    c.bench_function("rank 10k pods memory.available (with uid index)", |b| {
        b.iter(|| {
            let index = summary.index();
            black_box(rank(
                Signal::MemoryAvailable,
                FsLayout::Shared,
                black_box(&pods),
                &index,
            ))
        })
    });
    let index = summary.index();
    c.bench_function("rank 10k pods memory.available (index prebuilt)", |b| {
        b.iter(|| {
            black_box(rank(
                Signal::MemoryAvailable,
                FsLayout::Shared,
                black_box(&pods),
                &index,
            ))
        })
    });
}

/// The sort alone, on keys shaped like the ranking's, to see what building keys costs.
fn bench_sort_only(c: &mut Criterion) {
    let keys: Vec<(u128, u32)> = (0..PODS as u32)
        .map(|i| {
            (
                (u128::from(i % 3) << 126) | u128::from(i.wrapping_mul(2_654_435_761)),
                i,
            )
        })
        .collect();
    c.bench_function("sort 10k packed keys (reference)", |b| {
        b.iter(|| {
            let mut k = keys.clone();
            k.sort_unstable();
            black_box(k)
        })
    });
}

criterion_group!(benches, bench, bench_sort_only);
criterion_main!(benches);
