//! Part 2's tables and JSON: the plain node's ([`summarise`], its slowest kills taken apart
//! by [`slowest_kill`]) and the cache-full variant's ([`summarise_cache_full`]).

use std::collections::BTreeMap;

use reactor_tests::node::MI;
use serde_json::{json, Value};

use super::modes::{CACHE_EXTRA_MI, CACHE_FULL_MODES, CAPACITY_MI, HARD_MI, HOG_MI, MODES};
use super::records::{Rep, Row, CHARGE_BATCH_BYTES};
use crate::report::{Dist, Part, Table};

/// The cache-full variant's table and JSON, and its sample count.
pub(super) fn summarise_cache_full(
    rows: &[Row],
    reps: usize,
    realtime: bool,
) -> (Table, Value, usize) {
    let mut t = Table::new(
        "2b. OOM avoidance on a node full of page cache: the hog grows by reclaiming it",
        &[
            "rate",
            "mode",
            "OOM killer first",
            "right pod evicted",
            "crossing→SIGKILL p50",
            "crossing→SIGKILL p99",
            "kill at the crossing: at the charge that crossed; page cache followed − the kernel's",
            "killed at the crossing",
            "woken by",
            "kubepods before the hog: usage / inactive file (median)",
        ],
    )
    .text_columns(2);
    let mib = |b: u64| b as f64 / MI as f64;
    let median_of = |v: Vec<u64>| {
        let mut v = v;
        v.sort_unstable();
        v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
    };
    let mut out = Vec::new();
    let mut samples = 0;
    for r in rows {
        let n = r.reps.len();
        samples += n;
        let oom = r.reps.iter().filter(|x| x.oom_first).count();
        let right = r.reps.iter().filter(|x| x.right && !x.oom_first).count();
        let at_crossing = r.reps.iter().filter(|x| x.at_crossing).count();
        let to_kill = Dist::of(
            &r.reps
                .iter()
                .filter_map(|x| x.crossing_to_kill_ns)
                .collect::<Vec<_>>(),
        );
        // Each kill at the crossing: made at the charge that crossed the program's level
        // (usage past it by less than one charge's step), and the program's page cache count
        // against the kernel's folded one.
        let past: Vec<i64> = r.reps.iter().filter_map(Rep::past_level_bytes).collect();
        let parts: Vec<(i64, i64)> = r.reps.iter().filter_map(Rep::kill_parts).collect();
        let within = parts
            .iter()
            .filter(|(over, _)| (0..CHARGE_BATCH_BYTES).contains(over))
            .count();
        let drift_kib = |pick: fn(&mut dyn Iterator<Item = i64>) -> Option<i64>| {
            pick(&mut parts.iter().map(|p| p.1))
                .map_or("-".to_string(), |b| format!("{:+}", b / 1024))
        };
        let mut woken: BTreeMap<&str, usize> = BTreeMap::new();
        for w in r.reps.iter().filter_map(|x| x.woken_by.as_deref()) {
            *woken.entry(w).or_default() += 1;
        }
        let woken_text = woken
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        let usage = median_of(r.reps.iter().map(|x| x.clock.base).collect());
        let inactive = median_of(r.reps.iter().map(|x| x.clock.inactive_file).collect());
        t.row(vec![
            format!("{} MiB/s", r.rate),
            r.mode.to_string(),
            format!("{oom}/{n}"),
            format!("{right}/{n}"),
            to_kill.p50_text(),
            to_kill.p99_text(),
            if parts.is_empty() {
                "-".into()
            } else {
                format!(
                    "{within} of {}; {} to {} KiB",
                    parts.len(),
                    drift_kib(|i| i.min()),
                    drift_kib(|i| i.max()),
                )
            },
            format!("{at_crossing}/{n}"),
            if woken_text.is_empty() {
                "-".into()
            } else {
                woken_text
            },
            format!("{:.0} / {:.0} MiB", mib(usage), mib(inactive)),
        ]);
        out.push(json!({
            "rate_mib_s": r.rate, "mode": r.mode,
            "attached": r.attached.iter().map(|s| s.name()).collect::<Vec<_>>(),
            "repetitions": n, "oom_killer_first": oom, "right_pod_evicted_first": right,
            "crossing_to_kill": to_kill.json(),
            "kill_at_crossing_past_level_bytes": past,
            "kill_at_crossing_at_the_crossing_charge": within,
            "kill_at_crossing_followed_less_kernel_bytes": parts.iter().map(|p| p.1).collect::<Vec<_>>(),
            "killed_at_crossing": at_crossing,
            "woken_by": woken,
            "crossings": r.reps.iter().map(|x| json!({
                "past_level_bytes": x.past_level_bytes(),
                "crossing_kill": x.crossing_kill,
                "clock_basis": x.clock.basis.key(),
                "working_set_level_bytes": x.clock.level,
                "working_set_without_hog_bytes": x.clock.offset,
                "kubepods_before_hog_bytes": x.clock.base,
                "inactive_file_bytes": x.clock.inactive_file,
                "kubepods_after_filling": x.filled.map(|(m, _)| m.json()),
                "filling_seconds": x.filled.map(|(_, d)| d.as_secs_f64()),
                "oom_killer_first": x.oom_first,
                "evicted": x.evicted,
                "killed_at_crossing": x.at_crossing,
                "piece": x.clock.piece,
                "killed_inside_piece": x.clock.incomplete,
                "no_crossing": x.clock.none,
                "kill_after_crossing_ns": x.kill_after_crossing_ns,
                "reaction_ns": x.reaction_ns,
                "event_after_crossing_ns": x.event_after_crossing_ns,
                "event_usage_bytes": x.event_usage,
                "event_threshold_bytes": x.event_threshold,
                "unfolded_working_set_bytes": x.clock.unfolded_working_set,
                "kubepods_after_kill_folded": x.after_kill.map(|m| m.json()),
                "woken_by": x.woken_by,
                "wake_event": x.wake_event,
            })).collect::<Vec<_>>(),
        }));
    }
    let all = || rows.iter().flat_map(|r| &r.reps);
    let uncrossed = all().filter(|x| x.clock.none.is_some()).count();
    let early = all()
        .filter(|x| x.kill_after_crossing_ns.is_some_and(|d| d < 0))
        .count();
    let shares: Vec<f64> = all()
        .filter_map(|x| x.filled.map(|(m, _)| m.inactive_share()))
        .collect();
    let share_text = match (
        shares.iter().copied().reduce(f64::min),
        shares.iter().copied().reduce(f64::max),
    ) {
        (Some(lo), Some(hi)) => format!("{:.0}–{:.0} %", lo * 100.0, hi * 100.0),
        _ => "-".into(),
    };
    t.note(format!(
        "{reps} repetitions per mode and rate, the modes taking turns; the node of the table \
         above (Guaranteed and Burstable pods at 48 MiB each, the BestEffort hog allocating \
         {HOG_MI} MiB); before each repetition a cgroup of the bench's own in kubepods (no \
         pod) writes a file {CACHE_EXTRA_MI} MiB larger than kubepods' limit to /var/tmp (dd, \
         conv=fsync: clean cache), drops its cache and reads it back once (no buffer heads, \
         whose kernel memory would leave the working set with the cache) and idles, so \
         kubepods is at its limit with mostly inactive \
         file pages ({share_text} of its usage after writing), and the hog grows by reclaiming \
         them; the file is removed after the repetition"
    ));
    t.note(format!(
        "crossing→SIGKILL: kubepods' working set passing {} MiB, clocked as the hog's own pod \
         cgroup usage (read by the hog after each 256 KiB piece) plus kubepods' working set \
         without it just before the hog, its statistics folded first (usage stays at the \
         limit while the cache is reclaimed, so kubepods' usage cannot clock it) → the \
         agent's SIGKILL; its error is \
         what the rest of kubepods' working set moves meanwhile (kernel memory leaving with \
         the reclaimed cache, per-CPU charge batches: about 1 MiB in the runs seen, a few ms \
         at 350 MiB/s, so a SIGKILL at the crossing itself can read a few ms, and a hog killed \
         there just short of the clock's level leaves no crossing in its record); {uncrossed} repetitions had no crossing in the record, \
         {early} SIGKILLs came before the clock's crossing and read 0; OOM killer first, \
         right pod evicted and killed at the crossing as in the table above",
        CAPACITY_MI - HARD_MI
    ));
    t.note(
        "kill at the crossing, by the kernel's figures, independent of the hog-record clock: \
         \"at the charge that crossed\" counts kills whose usage (the page counter, from the \
         program's record) was past the program's usage level by less than one charge's step \
         (the counter moves 64 pages, 256 KiB, at a charge); \"page cache followed − the \
         kernel's\" is the program's inactive file count then (its level less the working-set \
         level) less kubepods' inactive file pages read folded once the hog was dead: how far \
         the program's working set was off the kernel's, so how late (+) or early it killed; \
         at 150 MiB/s, 150 KiB is 1 ms",
    );
    t.note(crate::lag::node_scheduling_note(realtime));
    let json = json!({
        "modes": CACHE_FULL_MODES.map(|mi| MODES[mi].name),
        "extra_written_mib": CACHE_EXTRA_MI,
        "repetitions": reps,
        "rows": out,
    });
    (t, json, samples)
}

/// The slowest crossing → SIGKILL of a row taken apart, for its note: where the time went
/// (the kernel's event after the crossing, the event's wait for the loop's pass, the pass to
/// the kill) and whether the loop's thread ran through its pass (its CPU time beside it).
fn slowest_kill(reps: &[Rep]) -> String {
    let Some((i, x)) = reps
        .iter()
        .enumerate()
        .filter(|(_, x)| x.crossing_to_kill_ns.is_some())
        .max_by_key(|(_, x)| x.crossing_to_kill_ns)
    else {
        return String::new();
    };
    let ms = |ns: f64| format!("{:.2} ms", ns / 1e6);
    let mut parts = Vec::new();
    if let Some(e) = x.event_after_crossing_ns {
        parts.push(format!("event {} after the crossing", ms(e as f64)));
    }
    if let (Some(r), Some(o)) = (x.reaction_ns, x.observe_to_kill_ns) {
        parts.push(format!("event → pass {}", ms(r.saturating_sub(o) as f64)));
    }
    if let Some(o) = x.observe_to_kill_ns {
        let cpu = x.observe_to_kill_cpu_ns.map_or(String::new(), |c| {
            format!(" (loop thread on CPU {})", ms(c as f64))
        });
        parts.push(format!("pass → SIGKILL {}{cpu}", ms(o as f64)));
    }
    format!(
        "; the slowest, repetition {i}: {} = {}, woken by {}",
        ms(x.crossing_to_kill_ns.unwrap_or(0) as f64),
        parts.join(" + "),
        x.woken_by.as_deref().unwrap_or("-")
    )
}

pub(super) fn summarise(
    rows: &[Row],
    reps: usize,
    realtime: bool,
    reaping: bool,
    reclaim: bool,
    close_watch_always: bool,
) -> Part {
    let mut t = Table::new(
        "2. OOM avoidance: BestEffort hog on a 512 MiB node, allocatableMemory.available<128Mi",
        &[
            "rate",
            "mode",
            "OOM killer first",
            "right pod evicted",
            "reaction p50",
            "reaction p99",
            "crossing→released p50",
            "crossing→released p99",
            "SIGKILL→empty p50",
            "SIGKILL→empty p99",
            "killed at the crossing",
            "woken by",
        ],
    )
    .text_columns(2);
    let mut out = Vec::new();
    let mut samples = 0;
    let mut halves_notes: Vec<String> = Vec::new();
    for r in rows {
        let oom = r.reps.iter().filter(|x| x.oom_first).count();
        let right = r.reps.iter().filter(|x| x.right && !x.oom_first).count();
        let wrong: Vec<&str> = r
            .reps
            .iter()
            .filter(|x| !x.right)
            .filter_map(|x| x.evicted.as_deref())
            .collect();
        let reaction = Dist::of(
            &r.reps
                .iter()
                .filter_map(|x| x.reaction_ns)
                .collect::<Vec<_>>(),
        );
        let release = Dist::of(
            &r.reps
                .iter()
                .filter_map(|x| x.crossing_to_released_ns)
                .collect::<Vec<_>>(),
        );
        let halves =
            |f: fn(&Rep) -> Option<u64>| Dist::of(&r.reps.iter().filter_map(f).collect::<Vec<_>>());
        let to_kill = halves(|x| x.crossing_to_kill_ns);
        let to_released = halves(|x| x.kill_to_released_ns);
        let to_empty = halves(|x| x.kill_to_empty_ns);
        let empty_first = r.reps.iter().filter(|x| x.empty_at_first_look).count();
        if r.mode == "full agent" && to_kill.n > 0 {
            halves_notes.push(format!(
                "{} MiB/s full agent: crossing → SIGKILL p50 {} p99 {}, SIGKILL → released (the \
                 agent's record) p50 {} p99 {}{}",
                r.rate,
                to_kill.p50_text(),
                to_kill.p99_text(),
                to_released.p50_text(),
                to_released.p99_text(),
                slowest_kill(&r.reps)
            ));
        }
        let mut woken: BTreeMap<&str, usize> = BTreeMap::new();
        for w in r.reps.iter().filter_map(|x| x.woken_by.as_deref()) {
            *woken.entry(w).or_default() += 1;
        }
        samples += r.reps.len();
        let woken_text = woken
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        let n = r.reps.len();
        let at_crossing = r.reps.iter().filter(|x| x.at_crossing).count();
        t.row(vec![
            format!("{} MiB/s", r.rate),
            r.mode.to_string(),
            format!("{oom}/{n}"),
            format!("{right}/{n}"),
            reaction.p50_text(),
            reaction.p99_text(),
            release.p50_text(),
            release.p99_text(),
            to_empty.p50_text(),
            to_empty.p99_text(),
            format!("{at_crossing}/{n}"),
            if woken_text.is_empty() {
                "-".into()
            } else {
                woken_text
            },
        ]);
        out.push(json!({
            "rate_mib_s": r.rate, "mode": r.mode,
            "attached": r.attached.iter().map(|s| s.name()).collect::<Vec<_>>(),
            "repetitions": n, "oom_killer_first": oom, "right_pod_evicted_first": right,
            "wrong_pods_evicted": wrong,
            "reaction_lag": reaction.json(), "crossing_to_released": release.json(),
            "crossing_to_kill": to_kill.json(), "kill_to_released": to_released.json(),
            "kill_to_empty_watched": to_empty.json(), "empty_at_first_look": empty_first,
            "woken_by": woken,
            "killed_at_crossing": at_crossing,
            "crossings": r.reps.iter().map(|x| json!({
                "killed_at_crossing": x.at_crossing,
                "level_bytes": x.clock.level,
                "inactive_file_bytes": x.clock.inactive_file,
                "kubepods_before_hog_bytes": x.clock.base,
                "piece": x.clock.piece,
                "killed_inside_piece": x.clock.incomplete,
                "no_crossing": x.clock.none,
                "mean_burst_ns": x.clock.mean_burst_ns,
                "fraction": x.clock.fraction,
                "kill_after_crossing_ns": x.kill_after_crossing_ns,
                "kill_to_empty_watched_ns": x.kill_to_empty_ns,
                "kill_to_released_ns": x.kill_to_released_ns,
                "reaction_ns": x.reaction_ns,
                "observe_to_kill_ns": x.observe_to_kill_ns,
                "observe_to_kill_cpu_ns": x.observe_to_kill_cpu_ns,
                "event_after_crossing_ns": x.event_after_crossing_ns,
                "event_usage_past_level_bytes":
                    x.event_usage.map(|u| u.wrapping_sub(x.clock.level) as i64),
            })).collect::<Vec<_>>(),
        }));
    }
    t.note(format!(
        "{reps} repetitions per mode and rate, the modes taking turns (one repetition of \
         each per round, in an order rotated every round); Guaranteed and Burstable pods hold 48 MiB each, \
         the BestEffort pod allocates 600 MiB (the node has 512 MiB) with restartPolicy Never; \
         all pods at oom_score_adj 0 (the Guaranteed -997 needs CAP_SYS_RESOURCE)"
    ));
    t.note(
        "OOM killer first: a pod's memcg oom_kill counter moved before the agent's SIGKILL (or with \
         no eviction); right pod evicted: the BestEffort hog evicted with no OOM kill before it"
            .to_string(),
    );
    t.note(
        "killed at the crossing: the eBPF charge program sent the SIGKILL itself, the hog being \
         the staged victim and the task charging the crossing page (killAtCrossing); its \
         reaction is 0 from its own record and its time is the record's, and the pass → SIGKILL \
         figures count the loop's kills only"
            .to_string(),
    );
    let added = rows
        .iter()
        .flat_map(|r| &r.reps)
        .map(|x| x.clock.inactive_file);
    let mib = |b: u64| format!("{:.1}", b as f64 / MI as f64);
    let added = match (added.clone().min(), added.max()) {
        (Some(lo), Some(hi)) => format!("{}–{} MiB", mib(lo), mib(hi)),
        _ => "-".to_string(),
    };
    let all = || rows.iter().flat_map(|r| &r.reps);
    let bursts = all().filter_map(|x| x.clock.mean_burst_ns);
    let us = |ns: u64| format!("{:.0}", ns as f64 / 1e3);
    let bursts = match (bursts.clone().min(), bursts.max()) {
        (Some(lo), Some(hi)) => format!("{}–{} µs", us(lo), us(hi)),
        _ => "-".to_string(),
    };
    let killed_inside = all().filter(|x| x.clock.incomplete).count();
    let uncrossed = all().filter(|x| x.clock.none.is_some()).count();
    let first_look = all().filter(|x| x.empty_at_first_look).count();
    let early = all()
        .filter(|x| x.kill_after_crossing_ns.is_some_and(|d| d < 0))
        .count();
    t.note(format!(
        "reaction: the decision's waking kernel event → SIGKILL (decisions the loop's own close \
         watch woke have no kernel event and are left out); crossing→released: the working-set \
         crossing, where the threshold is met, by the hog's own clock → the agent's release \
         record (the victim's pod cgroup empty and its usage no longer falling, as the loop \
         looks every close_poll); SIGKILL→empty: the agent's SIGKILL → the victim's pod cgroup \
         empty by the bench's own 100 µs watch, begun when the eviction's record arrives, as \
         the reference row times it ({first_look} found it empty at the first look, an upper \
         bound). The hog records CLOCK_MONOTONIC before and after touching each 256 KiB piece and \
         kubepods' usage after; the crossing is where kubepods' usage reaches 384 MiB + \
         kubepods' inactive_file just before the hog started ({added} \
         added over the repetitions), placed linearly inside the crossing piece's touch burst \
         by the usage it added, so its precision is one burst (a hog's mean burst {bursts}). \
         {killed_inside} crossings fell in a piece the hog was killed inside (taken as 256 KiB \
         over the hog's mean burst); {uncrossed} repetitions had no crossing in the record and \
         have no figure; {early} SIGKILLs came before the clock's crossing and read 0"
    ));
    for n in halves_notes {
        t.note(if reaping {
            format!(
                "{n} (the agent reaps the victim's memory with process_mrelease right after \
                 the SIGKILL; the cgroup empties when the victim has also exited)"
            )
        } else {
            format!("{n} (--no-mrelease: the memory comes back through the victim's exit)")
        });
    }
    t.note(crate::lag::node_scheduling_note(realtime));
    t.note(
        "single-source modes: that source alone plus the loop's own 10 s re-check; poll modes: \
         the tick alone with the loop re-reading only on it, as the kubelet does (no 1 ms close \
         watch), the hog started at a different phase of the tick each repetition, as against \
         a tick running all along"
            .to_string(),
    );
    if close_watch_always {
        t.note(
            "--close-watch-always: the loops re-read every 1 ms near the threshold even while \
             an armed eBPF slot watches it (kernel_watched_poll = close_poll)"
                .to_string(),
        );
    }
    if reclaim {
        t.note(
            "--memory-reclaim: every loop started with memoryReclaim.enabled (timeout 100ms); \
             on cgroup v1 the agent warns and turns it off at start, as it would for a user"
                .to_string(),
        );
    }
    Part {
        key: "oom",
        tables: vec![t],
        json: json!({
            "capacity_mib": CAPACITY_MI, "hard_threshold": "allocatableMemory.available<128Mi",
            "process_mrelease": reaping, "memory_reclaim": reclaim,
            "close_watch_always": close_watch_always,
            "repetitions": reps, "rows": out,
        }),
        samples,
    }
}
