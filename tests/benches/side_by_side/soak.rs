//! Part 9: the soak (issue 23; not in the default run: about 10 minutes). The release
//! `reactor run` on part 6's node (512 MiB, evicting below 128 MiB allocatable, every source
//! on, SCHED_FIFO) under part 6's load — 50 gRPC clients applying, listing and removing pods
//! without pause — for `--soak-minutes` (10 by default), with a hog every 30 s (part 6's:
//! 600 MiB at 350 MiB/s) that the agent must evict. The agent's RSS (`VmRSS`) is sampled
//! every second; each hog's end (evicted, or OOM-killed by the kernel) and its eviction
//! record's reaction are kept.
//!
//! Reported, never judged: the RSS growth over the last half (the median of the first 10 s
//! of the last half against the median of the last 10 s; target ≤ 5 %, the README's open
//! question of whether RSS levels off), the reaction p99 of the last third's evictions
//! against the first third's (target within 1.5×), and the evictions and OOM kills.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use reactor_proto::reactor_v1 as pb;
use reactor_tests::agent::TestAgent;
use serde_json::json;

use crate::api_load::{client, load_client, one_eviction, Ended, CLIENTS, NODE, SENSE};
use crate::footprint::status_kib;
use crate::opts::Opts;
use crate::report::{ratio, ratio_json, Dist, Part, Table};

/// How often a hog starts.
const PERIOD: Duration = Duration::from_secs(30);
/// When the first hog starts, after the load has built up.
const FIRST: Duration = Duration::from_secs(5);
/// The window the RSS is taken over at the middle and at the end (a median of samples).
const WINDOW: f64 = 10.0;

/// One hog of the soak.
struct Hog {
    /// Seconds into the soak when it started.
    at_s: f64,
    /// How it ended, or why the harness could not tell.
    ended: Result<Ended, String>,
}

/// The median of `v` (0 for none).
fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Run part 9.
pub fn run(opts: &Opts) -> Result<Part> {
    let minutes = opts.soak_minutes.unwrap_or(10.0);
    let total = Duration::from_secs_f64(minutes * 60.0);
    let agent = TestAgent::start_sensing("bench-soak", SENSE, NODE);
    let pid = agent.pid();
    let socket = agent.socket.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (rss, hogs, calls_per_s) = rt.block_on(async {
        let stop = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicUsize::new(0));
        let clients: Vec<_> = (0..CLIENTS)
            .map(|i| {
                tokio::spawn(load_client(
                    socket.clone(),
                    i,
                    Arc::clone(&stop),
                    Arc::clone(&calls),
                ))
            })
            .collect();
        let started = Instant::now();
        let sampler = {
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let mut out: Vec<(f64, u64)> = Vec::new();
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                while !stop.load(Ordering::SeqCst) {
                    tick.tick().await;
                    out.push((started.elapsed().as_secs_f64(), status_kib(pid, "VmRSS:")));
                }
                out
            })
        };
        let mut c = client(&socket).await?;
        let mut events = c
            .events(pb::EventsRequest {
                kinds: vec!["eviction".into()],
            })
            .await?
            .into_inner();
        let mut hogs: Vec<Hog> = Vec::new();
        for k in 0u32.. {
            let due = FIRST + PERIOD * k;
            if due >= total {
                break;
            }
            tokio::time::sleep_until((started + due).into()).await;
            let at_s = started.elapsed().as_secs_f64();
            let ended = one_eviction(&mut c, &mut events, &format!("soak-hog-{k}"))
                .await
                .map_err(|e| format!("{e:#}"));
            if let Err(e) = &ended {
                eprintln!("bench: soak hog {k}: {e}");
            }
            hogs.push(Hog { at_s, ended });
        }
        tokio::time::sleep_until((started + total).into()).await;
        let calls_per_s = calls.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
        stop.store(true, Ordering::SeqCst);
        for cl in clients {
            cl.await.context("a load client panicked")??;
        }
        let rss = sampler.await.context("the RSS sampler panicked")?;
        Ok::<_, anyhow::Error>((rss, hogs, calls_per_s))
    })?;
    let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
    if let Some(path) = std::env::var_os("REACTOR_BENCH_AGENT_LOG") {
        std::fs::write(&path, agent.log())
            .with_context(|| format!("writing the agent log to {}", path.to_string_lossy()))?;
    }
    drop(agent);
    Ok(summarise(minutes, &rss, &hogs, calls_per_s, alive))
}

fn summarise(
    minutes: f64,
    rss: &[(f64, u64)],
    hogs: &[Hog],
    calls_per_s: f64,
    alive: bool,
) -> Part {
    let total_s = minutes * 60.0;
    let in_window = |from: f64, to: f64| {
        median(
            rss.iter()
                .filter(|(t, _)| *t >= from && *t < to)
                .map(|&(_, k)| k)
                .collect(),
        )
    };
    let first_rss = rss.iter().map(|&(_, k)| k).find(|&k| k > 0).unwrap_or(0);
    let mid_rss = in_window(total_s / 2.0, total_s / 2.0 + WINDOW);
    let end_rss = in_window(total_s - WINDOW, f64::INFINITY);
    let max_rss = rss.iter().map(|&(_, k)| k).max().unwrap_or(0);
    let growth = (mid_rss > 0).then(|| (end_rss as f64 / mid_rss as f64 - 1.0) * 100.0);
    let third = |lo: f64, hi: f64| {
        Dist::of(
            &hogs
                .iter()
                .filter(|h| h.at_s >= lo && h.at_s < hi)
                .filter_map(|h| h.ended.as_ref().ok()?.reaction)
                .collect::<Vec<_>>(),
        )
    };
    let first = third(0.0, total_s / 3.0);
    let last = third(total_s * 2.0 / 3.0, f64::INFINITY);
    let all = third(0.0, f64::INFINITY);
    let ended: Vec<&Ended> = hogs.iter().filter_map(|h| h.ended.as_ref().ok()).collect();
    let evicted = ended.iter().filter(|e| e.evicted).count();
    let oom = ended.iter().filter(|e| e.oom_killed).count();
    let failed = hogs.iter().filter(|h| h.ended.is_err()).count();
    let mib = |k: u64| format!("{:.1} MiB", k as f64 / 1024.0);
    let some = |d: &Dist| (d.n > 0).then_some(d.p99);

    let mut t = Table::new(
        &format!("9. Soak: {minutes} min under {CLIENTS} API clients, a hog every 30 s"),
        &["figure", "value", "target"],
    )
    .text_columns(1);
    t.row(vec![
        "hogs evicted by the agent".into(),
        format!("{evicted}/{}", hogs.len()),
        "all".into(),
    ]);
    t.row(vec![
        "hogs OOM-killed by the kernel".into(),
        format!("{oom}/{}", hogs.len()),
        "0".into(),
    ]);
    t.row(vec![
        "agent RSS first sample / middle / end / max".into(),
        format!(
            "{} / {} / {} / {}",
            mib(first_rss),
            mib(mid_rss),
            mib(end_rss),
            mib(max_rss)
        ),
        "-".into(),
    ]);
    t.row(vec![
        "RSS growth over the last half".into(),
        growth.map_or("-".into(), |g| format!("{g:+.1} %")),
        "≤ 5 %".into(),
    ]);
    t.row(vec![
        "reaction p50 / p99, all evictions".into(),
        format!("{} / {} (n {})", all.p50_text(), all.p99_text(), all.n),
        "-".into(),
    ]);
    t.row(vec![
        "reaction p99 first third / last third".into(),
        format!(
            "{} (n {}) / {} (n {})",
            first.p99_text(),
            first.n,
            last.p99_text(),
            last.n
        ),
        "-".into(),
    ]);
    t.row(vec![
        "reaction p99 last third ÷ first third".into(),
        ratio(some(&last), some(&first)),
        "≤ 1.5x".into(),
    ]);
    t.row(vec![
        "API calls/s".into(),
        format!("{calls_per_s:.0}"),
        "-".into(),
    ]);
    t.note(format!(
        "the release `reactor run` on a 512 MiB node (allocatableMemory.available<128Mi, every \
         source on, SCHED_FIFO 10), {CLIENTS} gRPC clients applying, listing and removing pods \
         without pause; a BestEffort hog (600 MiB at 350 MiB/s) every {} s from {} s on; RSS \
         is VmRSS every second, middle and end the medians of the {WINDOW:.0} s from the \
         middle and of the last {WINDOW:.0} s; reaction: the eviction record's own figure \
         (waking kernel event → SIGKILL; evictions the close watch woke carry none); \
         {failed} hogs the harness could not follow to their end; agent {} at the end",
        PERIOD.as_secs(),
        FIRST.as_secs(),
        if alive { "still running" } else { "gone" }
    ));
    t.note("targets from issue 23, reported, never judged; `--soak-minutes N` shortens the run");
    Part {
        key: "soak",
        tables: vec![t],
        json: json!({
            "minutes": minutes,
            "clients": CLIENTS,
            "hog_period_seconds": PERIOD.as_secs(),
            "hogs": hogs.len(),
            "evicted": evicted,
            "oom_killed": oom,
            "not_followed": failed,
            "agent_alive_at_end": alive,
            "rss_kib": {"first": first_rss, "middle": mid_rss, "end": end_rss, "max": max_rss},
            "rss_growth_last_half_percent": growth,
            "reaction": all.json(),
            "reaction_first_third": first.json(),
            "reaction_last_third": last.json(),
            "p99_ratio_last_to_first_third": ratio_json(some(&last), some(&first)),
            "api_calls_per_second": calls_per_s,
            "rss_samples": rss.iter().map(|&(t, k)| json!([t, k])).collect::<Vec<_>>(),
            "evictions": hogs.iter().map(|h| match &h.ended {
                Ok(e) => json!({"at_s": h.at_s, "evicted": e.evicted,
                                "oom_killed": e.oom_killed, "reaction_ns": e.reaction}),
                Err(why) => json!({"at_s": h.at_s, "error": why}),
            }).collect::<Vec<_>>(),
        }),
        samples: ended.len(),
    }
}
