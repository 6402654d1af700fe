//! Part 3: what one decision costs as the node grows. Ranking for `memory.available`
//! (joining the Summary by uid and sorting, as the loop does per eviction), critical-pod
//! preemption (a 1 GiB memory shortage), and an image-GC plan on a full disk, at 100, 1,000,
//! 10,000 and 100,000 pods or images. Inputs are built once outside the timed part, as the
//! live agent holds them; the time is the median of repeated calls.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use reactor::decide::image_gc::{plan, ImageFs, ImageGcPolicy, ImageRecord};
use reactor::decide::pod::PodInfo;
use reactor::decide::preempt::{handle_admission_failure, AdmitFailure};
use reactor::decide::rank::rank;
use reactor::decide::signal::{FsLayout, Signal};
use reactor::decide::summary::Summary;
use serde_json::json;

use crate::opts::Opts;
use crate::report::{Dist, Part, Table};

const SIZES: [usize; 4] = [100, 1_000, 10_000, 100_000];
const SEC: i128 = 1_000_000_000;
const NOW: i128 = 1_800_000_000 * SEC;

/// Calls `f` until `budget` is spent (at least `min` times, at most 100,000); the time of
/// each call in nanoseconds.
fn time(budget: Duration, min: usize, mut f: impl FnMut()) -> Vec<u64> {
    let mut out = Vec::new();
    let start = Instant::now();
    while (out.len() < min || start.elapsed() < budget) && out.len() < 100_000 {
        let t = Instant::now();
        f();
        out.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
    out
}

/// `n` pods with a spread of requests, priorities and usage; every 50th lacks stats.
fn rank_fixture(n: usize) -> Result<(Vec<PodInfo>, Summary)> {
    let mut pods = Vec::with_capacity(n);
    let mut stats = Vec::with_capacity(n);
    for i in 0..n {
        let uid = format!("0b6f3f1e-{i:05x}-4c1a-9d5e-{:012x}", i * 7919);
        let request = (i % 17) * (16 << 20);
        pods.push(PodInfo::from_json(json!({
            "metadata": {"name": format!("pod-{i}"), "namespace": "bench", "uid": uid},
            "spec": {"priority": (i % 5) as i32 * 1000,
                     "containers": [{"name": "app", "resources": {"requests": {"memory": request.to_string()}}}]}
        }))?);
        if i % 50 != 0 {
            stats.push(json!({"podRef": {"uid": uid}, "memory": {"workingSetBytes": (i * 104_729) % (512 << 20)}}));
        }
    }
    let summary = Summary::from_value(json!({ "pods": stats }), "summary")?;
    Ok((pods, summary))
}

/// `n` running pods, a third each BestEffort, Burstable and Guaranteed, a few critical.
fn preempt_fixture(n: usize) -> Result<(Vec<PodInfo>, PodInfo)> {
    let pods = (0..n)
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
        })
        .collect::<Result<Vec<_>, _>>()?;
    let admit = PodInfo::from_json(json!({
        "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
        "spec": {"priority": 2_000_001_000, "priorityClassName": "system-node-critical", "containers": []}
    }))?;
    Ok((pods, admit))
}

fn images_fixture(n: usize) -> Vec<ImageRecord> {
    (0..n)
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

/// Run part 3.
pub fn run(opts: &Opts) -> Result<Part> {
    let (budget, min) = if opts.quick {
        (Duration::from_millis(60), 3)
    } else {
        (Duration::from_millis(800), 10)
    };
    let mut rows: Vec<(&str, Vec<Dist>)> = Vec::new();

    let mut dists = Vec::new();
    for n in SIZES {
        let (pods, summary) = rank_fixture(n).context("rank fixture")?;
        dists.push(Dist::of(&time(budget, min, || {
            let index = summary.index();
            black_box(rank(
                Signal::MemoryAvailable,
                FsLayout::Shared,
                black_box(&pods),
                &index,
            ));
        })));
    }
    rows.push(("rank pods (memory.available)", dists));

    let failures = [AdmitFailure::InsufficientResource {
        resource: "memory".to_string(),
        requested: 1 << 30,
        used: 0,
        capacity: 0,
    }];
    let mut dists = Vec::new();
    for n in SIZES {
        let (pods, admit) = preempt_fixture(n).context("preemption fixture")?;
        dists.push(Dist::of(&time(budget, min, || {
            black_box(handle_admission_failure(
                black_box(&admit),
                black_box(&pods),
                &failures,
            ));
        })));
    }
    rows.push(("preempt for a critical pod (1 GiB short)", dists));

    let policy = ImageGcPolicy {
        high_threshold_percent: 85,
        low_threshold_percent: 20,
        min_age_nanos: 120 * 1_000_000_000,
        max_age_nanos: 24 * 3600 * 1_000_000_000,
    };
    let mut dists = Vec::new();
    for n in SIZES {
        let images = images_fixture(n);
        let total: i64 = images.iter().map(|i| i.size_bytes).sum();
        let fs = ImageFs {
            capacity_bytes: total + total / 20,
            available_bytes: total / 100,
        };
        dists.push(Dist::of(&time(budget, min, || {
            black_box(plan(
                &policy,
                fs,
                black_box(&images),
                NOW,
                Some(NOW - 48 * 3600 * SEC),
            ));
        })));
    }
    rows.push(("image-GC plan (disk full)", dists));

    let mut header: Vec<String> = vec!["decision".into()];
    header.extend(SIZES.iter().map(|n| format!("{n} p50")));
    header.extend(SIZES.windows(2).map(|w| format!("×{}→{}", w[0], w[1])));
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = Table::new(
        "3. Decision cost as the node grows (time per decision, growth per decade)",
        &header_refs,
    );
    let mut out = Vec::new();
    let mut samples = 0;
    for (name, dists) in &rows {
        let mut cells = vec![name.to_string()];
        cells.extend(dists.iter().map(Dist::p50_text));
        let growth: Vec<Option<f64>> = dists
            .windows(2)
            .map(|w| (w[0].n > 0 && w[0].p50 > 0).then(|| w[1].p50 as f64 / w[0].p50 as f64))
            .collect();
        cells.extend(
            growth
                .iter()
                .map(|g| g.map_or("-".to_string(), |g| format!("{g:.1}x"))),
        );
        t.row(cells);
        samples += dists.iter().map(|d| d.n).sum::<usize>();
        out.push(json!({
            "decision": name,
            "sizes": SIZES,
            "time": dists.iter().map(Dist::json).collect::<Vec<_>>(),
            "growth_per_decade": growth,
        }));
    }
    t.note(format!(
        "median of repeated calls ({} ms budget per cell, at least {min} calls); 10x the \
         growth of a decade means linear, about 13x n·log n",
        budget.as_millis()
    ));
    Ok(Part {
        key: "cost",
        tables: vec![t],
        json: json!({ "rows": out }),
        samples,
    })
}
