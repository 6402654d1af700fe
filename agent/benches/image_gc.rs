//! An image-GC plan over 5,000 image records (target: under 2 ms).
#![expect(
    missing_docs,
    reason = "criterion_group! generates an undocumented function"
)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use reactor::decide::image_gc::{plan, ImageFs, ImageGcPolicy, ImageRecord};

const IMAGES: usize = 5_000;
const SEC: i128 = 1_000_000_000;
const NOW: i128 = 1_800_000_000 * SEC;

fn fixture() -> Vec<ImageRecord> {
    (0..IMAGES)
        .map(|i| ImageRecord {
            id: format!("sha256:{:064x}", i * 2_654_435_761usize),
            size_bytes: 50_000_000 + (i as i64 % 97) * 1_000_000,
            first_detected: (i % 13 != 0).then(|| NOW - (i as i128 % 5000) * 60 * SEC),
            last_used: (i % 7 != 0).then(|| NOW - ((i * 7919) as i128 % 100_000) * SEC),
            in_use: i % 11 == 0,
            pinned: i % 101 == 0,
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let images = fixture();
    let total: i64 = images.iter().map(|i| i.size_bytes).sum();
    // Full disk: space-driven GC walks most of the list.
    let fs = ImageFs {
        capacity_bytes: total + total / 20,
        available_bytes: total / 100,
    };
    let policy = ImageGcPolicy {
        high_threshold_percent: 85,
        low_threshold_percent: 20,
        min_age_nanos: 120 * 1_000_000_000,
        max_age_nanos: 24 * 3600 * 1_000_000_000,
    };
    c.bench_function("image-gc plan 5k images", |b| {
        b.iter(|| {
            black_box(plan(
                &policy,
                fs,
                black_box(&images),
                NOW,
                Some(NOW - 48 * 3600 * SEC),
            ))
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
