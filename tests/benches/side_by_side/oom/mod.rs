//! Part 2: OOM avoidance. The storm of the eviction tests (`reactor_tests::node`): a
//! modelled 512 MiB node (kubepods limited to it) with a Guaranteed and a Burstable pod
//! holding 48 MiB each, and a BestEffort pod allocating 600 MiB at a set rate, under the hard
//! threshold `allocatableMemory.available<128Mi`. The reactor loop runs with every source and
//! with each source alone; per repetition the bench records whether the kernel OOM killer
//! fired before the agent's SIGKILL (the pods' memcg `oom_kill` counters, read every 2 ms), which pod
//! the agent evicted, the decision's reaction lag (waking kernel event → SIGKILL) and the
//! time from the threshold crossing to the victim's memory being released.
//!
//! The modes take turns: per rate, each round runs one repetition of every mode (in an
//! order that rotates from round to round, [`round_order`]), with a loop started for that
//! repetition alone. Run one mode's repetitions after another's, the machine's drift over
//! the minutes between them showed as a difference between the modes. A poll-only mode's
//! hog starts at a different phase of the loop's tick in each repetition ([`tick_phase`]),
//! as it would against a tick that had been running all along.
//!
//! The crossing is timed by the workload itself, so every mode is timed alike and by none of
//! the kernel notifications under test: the hog keeps a progress record
//! ([`reactor_tests::hog_record`]) of the CLOCK_MONOTONIC times just before and just after it
//! touches each 256 KiB piece of its 1 MiB chunks and kubepods' usage after (the page
//! counter every threshold under test watches, read by the hog itself). The threshold is met when kubepods' *working
//! set* (usage − inactive_file) passes 384 MiB, i.e. at usage
//! [`working_set_level`](reactor::sense::memcg::working_set_level)`(384 MiB, inactive_file)`, with inactive_file read just before the
//! hog starts; the crossing is inside the first piece after which kubepods' usage has
//! reached that level, interpolated linearly over the piece's touch burst by the usage it
//! added (a piece the hog was killed inside is taken as 256 KiB over the earlier pieces' mean
//! burst). Its precision is one piece's touch burst. (A first version added the hog's own
//! usage to kubepods' usage U0 read before it started; charges handed back elsewhere in kubepods in
//! between, per-CPU charge batches and freed pages of earlier hogs, made it place the
//! crossing a whole chunk early in most repetitions: the eBPF records, stamped at the charge
//! that met the level, came about one chunk's pause, 2.3 ms at 350 MiB/s, after it.)
//! Within the burst the page
//! counter moves in charge batches of 64 pages (one piece) rather than page by page, so the
//! linear placement can be off by up to a piece's burst either way. Per repetition the
//! JSON keeps the waking kernel event's own time and usage against the crossing
//! (`event_after_crossing_ns`, `event_usage_past_level_bytes`): an eBPF record is stamped
//! at the charge that met its level, so it checks the clock.
//!
//! The reference before it was a v1 memcg threshold eventfd on kubepods at that level, but
//! the kernel checks v1 thresholds only every 128 charged pages per CPU (about 1.4 ms at
//! 350 MiB/s): an eBPF-woken SIGKILL (its threshold checked every 16 pages) often came
//! first, and crossing → SIGKILL read 0 or the reference fired only on the way down.
//!
//! The cache-full variant (issue 42; `--oom-variants cache-full`, in the default run, both
//! rates even with `--quick`): before each repetition a cgroup of the bench's own inside
//! kubepods (no pod) writes a file 128 MiB larger than kubepods' limit to `/var/tmp`, drops
//! its cache and reads it back once ([`crate::page_cache::fill`]: no buffer heads, whose
//! kernel memory would leave the working set as the cache is reclaimed) and idles, so
//! kubepods sits at its limit with mostly inactive file pages and the hog grows by
//! reclaiming them; the file is removed after the repetition and written afresh for the
//! next. The full agent and eBPF only take turns as the modes do above. kubepods' usage
//! stays at the limit there, so the crossing is clocked on its working set instead
//! ([`Basis::WorkingSet`]): the hog's record holds its own pod cgroup's usage, and the
//! crossing is where that plus kubepods' working set without the hog just before it reaches
//! 384 MiB. Its own table gives, per mode and rate, the OOM killer first, crossing →
//! SIGKILL p50/p99 and the kills at the crossing.

mod hog;
mod modes;
mod records;
mod reference;
mod repetition;
mod summary;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use reactor::act::runtime::Runtime;
use reactor::reactor::PodControl;
use reactor_tests::node::{Node, NodeSpec, MI};
use serde_json::json;

pub(crate) use modes::{start_mode_with, HOG_MI, MODES, MODE_KEYS, VARIANT_KEYS};
pub(crate) use records::{Basis, Clock};

use crate::opts::Opts;
use crate::page_cache::CacheCgroup;
use crate::report::Part;
use hog::ensure_base_pods;
use modes::{round_order, tick_phase, CACHE_EXTRA_MI, CACHE_FULL_MODES, CAPACITY_MI};
use records::Row;
use repetition::repetition;
use summary::{summarise, summarise_cache_full};

/// `memoryReclaim.timeout`'s default, for `--memory-reclaim`.
const MEMORY_RECLAIM_TIMEOUT: Duration = Duration::from_millis(100);

/// Run part 2.
pub fn run(opts: &Opts) -> Result<Part> {
    let rates = opts.oom_rates.clone().unwrap_or_else(|| {
        if opts.quick {
            vec![350]
        } else {
            vec![350, 150]
        }
    });
    let reps = opts.oom_reps.unwrap_or(if opts.quick { 1 } else { 20 });
    let variant = |k: &str| {
        opts.oom_variants
            .as_ref()
            .is_none_or(|v| v.iter().any(|x| x == k))
    };
    let (plain, cache_full) = (variant(VARIANT_KEYS[0]), variant(VARIANT_KEYS[1]));
    // The cache-full variant runs the same rates, even when the plain one is left out.
    let cache_rates = rates.clone();
    let rates = if plain { rates } else { Vec::new() };
    // As `reactor run` runs the agent: the loop on its own `SCHED_FIFO` thread, the rest at
    // normal scheduling (see `node_runtime`).
    let (rt, realtime) = crate::lag::node_runtime()?;
    let rows = rt.block_on(async {
        let mut node = Node::start(NodeSpec {
            name: "bench-oom",
            capacity_mi: CAPACITY_MI,
            hard: &[("allocatableMemory.available", "128Mi")],
            soft: &[],
            min_reclaim: &[],
            transition: Duration::from_secs(2),
            ebpf: true,
            deferred: true,
        })
        .await;
        node.loop_thread = crate::lag::node_loop_thread(realtime);
        ensure_base_pods(&node).await;
        let mut rows = Vec::new();
        let mut references: BTreeMap<u64, Vec<reference::RefRep>> = BTreeMap::new();
        for &rate in &rates {
            let mut rate_rows: Vec<Row> = MODES
                .iter()
                .map(|mode| Row {
                    rate,
                    mode: mode.name,
                    attached: Vec::new(),
                    reps: Vec::new(),
                })
                .collect();
            for rep in 0..reps {
                for mi in round_order(MODES.len(), rep) {
                    let asked = opts.oom_modes.as_ref();
                    if asked.is_some_and(|m| !m.iter().any(|k| k == MODE_KEYS[mi])) {
                        continue;
                    }
                    let mode = &MODES[mi];
                    start_mode_with(&mut node, mode, |s| {
                        if opts.memory_reclaim {
                            s.memory_reclaim = Some(MEMORY_RECLAIM_TIMEOUT);
                        }
                        if opts.close_watch_always {
                            s.kernel_watched_poll = s.close_poll;
                        }
                    });
                    let row = &mut rate_rows[mi];
                    if rep == 0 {
                        row.attached = node.attached.clone();
                    } else if row.attached != node.attached {
                        eprintln!(
                            "bench: oom {rate} MiB/s {} repetition {rep}: sources {:?}, the \
                             first repetition had {:?}",
                            mode.name, node.attached, row.attached
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(500) + tick_phase(mode, rep)).await;
                    let uid = format!("be-{rate}-{mi}-{rep}");
                    let result = repetition(&mut node, &uid, rate, None).await;
                    node.stop_loop().await;
                    row.reps.push(result?);
                }
                // The reference takes its turn after the round's modes, with no loop.
                let uid = format!("be-{rate}-ref-{rep}");
                let r = reference::repetition(&mut node, &uid, rate).await?;
                references.entry(rate).or_default().push(r);
            }
            for row in rate_rows.iter().filter(|r| !r.reps.is_empty()) {
                eprintln!(
                    "bench: oom {rate} MiB/s {}: {} of {reps} evicted before any OOM kill",
                    row.mode,
                    row.reps.iter().filter(|r| r.right && !r.oom_first).count()
                );
            }
            rows.extend(rate_rows.into_iter().filter(|r| !r.reps.is_empty()));
        }
        let cache_rows = if cache_full {
            cache_full_rounds(&mut node, opts, &cache_rates, reps).await?
        } else {
            Vec::new()
        };
        for p in node.pods.pods().iter() {
            let _ = node.runtime.stop_pod(&p.info.uid, Duration::ZERO).await;
        }
        node.finish().await;
        Ok::<_, anyhow::Error>((rows, references, cache_rows))
    })?;
    let (rows, references, cache_rows) = rows;
    let mut part = if plain {
        let mut part = summarise(
            &rows,
            reps,
            realtime,
            !opts.no_mrelease,
            opts.memory_reclaim,
            opts.close_watch_always,
        );
        reference::add_to(&mut part, &reference::full_agent_times(&rows), &references);
        part
    } else {
        Part {
            key: "oom",
            tables: Vec::new(),
            json: json!({"capacity_mib": CAPACITY_MI, "repetitions": reps, "rows": []}),
            samples: 0,
        }
    };
    if cache_full {
        let (table, json, samples) = summarise_cache_full(&cache_rows, reps, realtime);
        part.tables.push(table);
        part.samples += samples;
        if let Some(obj) = part.json.as_object_mut() {
            obj.insert("cache_full".into(), json);
        }
    }
    Ok(part)
}

/// The cache-full variant: before each repetition kubepods of the modelled node is filled
/// with page cache up to its limit (a cgroup of the bench's own in kubepods fills a file
/// [`CACHE_EXTRA_MI`] larger than the limit on `/var/tmp`, [`crate::page_cache::fill`], then
/// idles), so the hog grows by
/// reclaiming it; its crossing is clocked on kubepods' working set ([`Basis::WorkingSet`]).
/// The modes of [`CACHE_FULL_MODES`] (those `--oom-modes` leaves) take turns as in the plain
/// variant; the cache is written afresh for each repetition (a file read again would be
/// activated, and a hog leaves part of it reclaimed).
async fn cache_full_rounds(
    node: &mut Node,
    opts: &Opts,
    rates: &[u64],
    reps: usize,
) -> Result<Vec<Row>> {
    let kubepods = std::path::Path::new(reactor_tests::MEMCG_V1_ROOT)
        .join(&node.root.name)
        .join("kubepods");
    let limit = crate::page_cache::limit(&kubepods)?;
    if limit > (CAPACITY_MI + 64) * MI {
        bail!(
            "kubepods' memory limit is {limit} bytes, not the modelled node's {CAPACITY_MI} \
             MiB: page cache could not fill it"
        );
    }
    let bytes = (limit / MI + CACHE_EXTRA_MI) * MI;
    let modes: Vec<usize> = CACHE_FULL_MODES
        .into_iter()
        .filter(|&mi| {
            opts.oom_modes
                .as_ref()
                .is_none_or(|m| m.iter().any(|k| k == MODE_KEYS[mi]))
        })
        .collect();
    if modes.is_empty() {
        bail!(
            "--oom-variants cache-full runs the modes {}; --oom-modes left none of them",
            CACHE_FULL_MODES.map(|mi| MODE_KEYS[mi]).join(",")
        );
    }
    let mut cache = CacheCgroup::new(&kubepods, "bench-cache-writer")?;
    let mut rows = Vec::new();
    for &rate in rates {
        let mut rate_rows: Vec<Row> = modes
            .iter()
            .map(|&mi| Row {
                rate,
                mode: MODES[mi].name,
                attached: Vec::new(),
                reps: Vec::new(),
            })
            .collect();
        for rep in 0..reps {
            for k in 0..modes.len() {
                let j = (k + rep) % modes.len();
                let mode = &MODES[modes[j]];
                let took = cache.fill(bytes)?.took;
                // kubepods' statistics hold the cache before the clock reads them.
                let filled = crate::page_cache::settled(&kubepods, &cache.dir)?;
                start_mode_with(node, mode, |s| {
                    if opts.memory_reclaim {
                        s.memory_reclaim = Some(MEMORY_RECLAIM_TIMEOUT);
                    }
                    if opts.close_watch_always {
                        s.kernel_watched_poll = s.close_poll;
                    }
                });
                let row = &mut rate_rows[j];
                if rep == 0 {
                    row.attached = node.attached.clone();
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                let uid = format!("bc-{rate}-{}-{rep}", modes[j]);
                let result = repetition(node, &uid, rate, Some(&mut cache)).await;
                node.stop_loop().await;
                let mut r = result.with_context(|| {
                    format!("cache-full {rate} MiB/s {} repetition {rep}", mode.name)
                })?;
                r.filled = Some((filled, took));
                row.reps.push(r);
            }
        }
        for row in &rate_rows {
            eprintln!(
                "bench: oom cache-full {rate} MiB/s {}: {} of {reps} evicted before any OOM kill",
                row.mode,
                row.reps.iter().filter(|r| r.right && !r.oom_first).count()
            );
        }
        rows.extend(rate_rows);
    }
    Ok(rows)
}
