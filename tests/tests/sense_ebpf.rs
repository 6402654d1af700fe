//! The eBPF sense source against the real kernel: programs attach to the tracepoints, a
//! memory hog in a limited cgroup v1 memcg produces reclaim stalls and an OOM kill that arrive
//! attributed to that cgroup, and a flooded ring buffer counts and reports what it dropped.
//!
//! Needs root, tracefs and BTF; in CI (`CI=true`) a missing piece fails instead of skipping.
//! Only one eBPF source is attached at a time (nextest runs this package serially).

use std::process::Command;
use std::time::{Duration, Instant};

use reactor::sense::ebpf::cgroup::CgroupNames;
use reactor::sense::ebpf::{
    monotonic_ns, tracefs, EbpfOptions, EbpfSource, CHARGE_PROGRAMS, TRACEPOINTS,
};
use reactor::sense::{Kind, PressureEvent, Source};
use reactor_tests::{is_root, memhog_bin, require, TestMemcg};
use tokio::sync::mpsc;

const LIMIT: u64 = 64 << 20;

fn can_run() -> bool {
    require(is_root(), "root (to load eBPF programs)")
        && require(
            tracefs::root().is_some(),
            "tracefs mounted at /sys/kernel/tracing (cargo xtask setup mounts it)",
        )
        && require(
            std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
            "kernel BTF at /sys/kernel/btf/vmlinux",
        )
        && require(
            memhog_bin().exists(),
            "the memhog binary (cargo build --workspace --bins)",
        )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// An event as the consumer saw it: with the lag computed when it was taken off the channel.
struct Seen {
    event: PressureEvent,
    lag_ns: i128,
    taken_ns: u64,
}

/// Receives until `done` says so or the deadline passes; returns everything received.
fn collect_until(
    rt: &tokio::runtime::Runtime,
    rx: &mut mpsc::Receiver<PressureEvent>,
    timeout: Duration,
    mut done: impl FnMut(&PressureEvent) -> bool,
) -> Vec<Seen> {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    rt.block_on(async {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, rx.recv()).await {
                Ok(Some(event)) => {
                    let taken_ns = monotonic_ns();
                    let lag_ns = i128::from(taken_ns) - i128::from(event.at_ns);
                    let stop = done(&event);
                    seen.push(Seen {
                        event,
                        lag_ns,
                        taken_ns,
                    });
                    if stop {
                        break;
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
    });
    seen
}

#[test]
fn stall_then_oom_kill_arrive_attributed_to_the_cgroup() {
    if !can_run() {
        return;
    }
    let rt = runtime();
    let mut memcg = TestMemcg::new("ebpf-oom", LIMIT).expect("test memcg");
    let path = memcg.path.clone();
    let source = rt
        .block_on(async { EbpfSource::attach(EbpfOptions::default()) })
        .expect("attach");
    for want in [
        "oom_mark_victim",
        "memcg_reclaim_begin",
        "memcg_reclaim_end",
        "count_memcg_events",
    ] {
        assert!(
            source.attached().contains(&want),
            "{want} not attached: {:?}",
            source.missing()
        );
    }
    // Everything but the charge programs, which attach only when thresholds are asked for.
    assert_eq!(
        source.attached().len(),
        TRACEPOINTS.len() - CHARGE_PROGRAMS.len(),
        "{:?}",
        source.missing()
    );
    assert!(
        source.in_kernel_cgroups(),
        "BTF offsets for the cgroup walk"
    );

    let (tx, mut rx) = mpsc::channel(65_536);
    let task = rt.spawn(source.run(tx));
    // The machine-wide count of the agent's programs' runs (bench part 7b's measure) moves
    // when these ones run.
    let stats = reactor::sense::ebpf::stats::enable_stats().expect("eBPF statistics on");
    let runs_before = reactor::sense::ebpf::stats::loaded_program_totals();
    let started = monotonic_ns();
    let pid = memcg
        .spawn(Command::new(memhog_bin()).args(["256", "0", "60"]))
        .expect("memhog");
    let ours = Some(memcg.cgroup.clone());
    let seen = collect_until(&rt, &mut rx, Duration::from_secs(30), |e| {
        matches!(e.kind, Kind::OomKill { .. }) && e.cgroup == ours
    });

    let first_stall = seen.iter().position(|s| {
        s.event.cgroup == ours && matches!(s.event.kind, Kind::ReclaimStall { memcg: true, .. })
    });
    let oom = seen
        .iter()
        .position(|s| matches!(s.event.kind, Kind::OomKill { .. }) && s.event.cgroup == ours);
    let kinds: Vec<_> = seen
        .iter()
        .filter(|s| s.event.cgroup == ours)
        .map(|s| format!("{:?}", s.event.kind))
        .take(20)
        .collect();
    let (Some(first_stall), Some(oom)) = (first_stall, oom) else {
        panic!(
            "expected a reclaim stall and an OOM kill in {}; got {} events, ours: {kinds:?}",
            memcg.cgroup,
            seen.len()
        );
    };
    assert!(first_stall < oom, "the stall came after the OOM kill");
    let runs_after = reactor::sense::ebpf::stats::loaded_program_totals();
    drop(stats);
    assert!(
        runs_after.runs > runs_before.runs && runs_after.run_ns > runs_before.run_ns,
        "the stall and OOM programs ran: {runs_before:?} → {runs_after:?}"
    );

    let stall = &seen[first_stall];
    let Kind::ReclaimStall {
        duration_ns,
        pid: stalled,
        ..
    } = stall.event.kind
    else {
        unreachable!()
    };
    assert!(duration_ns > 0, "a stall takes time");
    assert_eq!(stalled, pid, "memhog is the task that stalled");
    assert_eq!(stall.event.source, Source::Ebpf);

    let oom = &seen[oom];
    let Kind::OomKill {
        pid: victim,
        comm,
        rss_bytes,
        oom_score_adj,
    } = &oom.event.kind
    else {
        unreachable!()
    };
    assert_eq!(*victim, Some(pid), "the OOM event names memhog's pid");
    assert_eq!(comm.as_deref(), Some("memhog"));
    assert!(
        rss_bytes.is_some_and(|b| b > LIMIT / 2),
        "victim rss {rss_bytes:?} should be near the 64 MiB limit"
    );
    assert_eq!(*oom_score_adj, Some(0));

    // Detection lag: taken from the kernel's clock, so never negative; and sane (the events
    // are from this run, not from before it).
    for s in [stall, oom] {
        assert!(s.event.at_ns >= started, "event predates the test");
        assert!(s.lag_ns >= 0, "negative lag {} ns", s.lag_ns);
        assert!(s.lag_ns < 30_000_000_000, "lag {} ns is not sane", s.lag_ns);
        // The reader's wake-up falls between the kernel's stamp and the take-up.
        let woke = s
            .event
            .woke_ns
            .expect("eBPF events carry their wake-up time");
        assert!(
            s.event.at_ns <= woke && woke <= s.taken_ns,
            "kernel {} ≤ wake {woke} ≤ taken {}",
            s.event.at_ns,
            s.taken_ns
        );
    }
    eprintln!(
        "stall lag {} µs, oom lag {} µs",
        stall.lag_ns / 1000,
        oom.lag_ns / 1000
    );

    // memhog was killed by the kernel.
    let statuses = memcg.wait_all(Duration::from_secs(10));
    assert!(
        statuses.iter().all(|s| s.is_some_and(|s| !s.success())),
        "memhog should have been OOM-killed: {statuses:?}"
    );
    drop(rx);
    task.abort();
    drop(memcg);
    assert!(!path.exists(), "test cgroup {} left behind", path.display());
}

#[test]
fn a_flooded_ring_buffer_counts_and_reports_drops_and_keeps_going() {
    if !can_run() {
        return;
    }
    let rt = runtime();
    // One page of ring buffer, no rate limit, and page faults as a watched item: a memory hog
    // writes thousands of records while nobody reads.
    let opts = EbpfOptions {
        ring_buffer_bytes: 4096,
        min_interval: Duration::ZERO,
        memcg_items: vec!["PGFAULT".into(), "PGSCAN_DIRECT".into()],
        drop_check_interval: Duration::from_millis(20),
        ..EbpfOptions::default()
    };
    let source = rt
        .block_on(async { EbpfSource::attach(opts) })
        .expect("attach");
    assert!(
        source.attached().contains(&"count_memcg_events"),
        "{:?}",
        source.missing()
    );
    // Page faults anywhere on the machine hit the watched tracepoint, so on a busy machine a
    // one-page buffer may overflow before the storm even starts: count from here.
    let before = source.drops();

    {
        let mut storm = TestMemcg::new("ebpf-storm", LIMIT).expect("test memcg");
        storm
            .spawn(Command::new(memhog_bin()).args(["48", "0", "0"]))
            .expect("memhog");
        let statuses = storm.wait_all(Duration::from_secs(30));
        assert!(
            statuses.iter().all(Option::is_some),
            "memhog did not finish"
        );
    }
    let dropped = source.drops();
    assert!(
        dropped > before,
        "a 4 KiB ring buffer nobody reads must overflow ({before} dropped before the storm)"
    );

    let (tx, mut rx) = mpsc::channel(65_536);
    let task = rt.spawn(source.run(tx));
    let reported = collect_until(&rt, &mut rx, Duration::from_secs(10), |e| {
        matches!(e.kind, Kind::Dropped { .. })
    });
    let Some(Kind::Dropped { count }) = reported.last().map(|s| s.event.kind.clone()) else {
        panic!("no Dropped event reported");
    };
    assert!(count >= dropped, "reported {count} of {dropped} drops");

    // The source keeps running: a new cgroup's events still arrive.
    let mut after = TestMemcg::new("ebpf-after", LIMIT).expect("test memcg");
    after
        .spawn(Command::new(memhog_bin()).args(["32", "0", "0"]))
        .expect("memhog");
    let ours = Some(after.cgroup.clone());
    let seen = collect_until(&rt, &mut rx, Duration::from_secs(20), |e| e.cgroup == ours);
    assert!(
        seen.iter().any(|s| s.event.cgroup == ours
            && matches!(s.event.kind, Kind::MemcgEvent { ref item, .. } if item == "pgfault")),
        "no event from {} after the drops ({} others)",
        after.cgroup,
        seen.len()
    );
    after.wait_all(Duration::from_secs(10));
    drop(rx);
    task.abort();
}

#[test]
fn cgroup_ids_resolve_by_file_handle_on_cgroupfs() {
    if !can_run() {
        return;
    }
    let mut names = CgroupNames::discover();
    assert!(
        names.resolves_by_handle(),
        "the memory hierarchy is cgroupfs and we are root: ids resolve without a walk"
    );
    let memcg = TestMemcg::new("ebpf-names", LIMIT).expect("test memcg");
    let id = names.id_of(&memcg.cgroup).expect("the test cgroup's id");
    let cache = names.cache();
    assert_eq!(cache.get(id), None);
    assert_eq!(names.by_id(id).as_deref(), Some(memcg.cgroup.as_str()));
    assert_eq!(cache.get(id).as_deref(), Some(memcg.cgroup.as_str()));
    let root = names.id_of("/").expect("the root's id");
    assert_eq!(names.by_id(root).as_deref(), Some("/"));
    // A removed cgroup's id names nothing.
    let gone = TestMemcg::new("ebpf-names-gone", LIMIT).expect("second memcg");
    let gone_id = names.id_of(&gone.cgroup).expect("its id");
    drop(gone);
    assert_eq!(names.by_id(gone_id), None);
}

/// With `memcg_events_on_reclaim`, `count_memcg_events` is off its tracepoint while nothing
/// is reclaimed (it is entered on every page fault), comes on when a reclaim stall is seen,
/// reports the reclaim's scanning from the stalled cgroup, and goes off again once no stall
/// has come for the hold time.
#[test]
fn memcg_events_attach_on_reclaim_and_leave_after_the_hold() {
    if !can_run() {
        return;
    }
    let rt = runtime();
    let hold = Duration::from_secs(2);
    let source = rt
        .block_on(async {
            EbpfSource::attach(EbpfOptions {
                memcg_events_on_reclaim: Some(hold),
                ..EbpfOptions::default()
            })
        })
        .expect("attach");
    assert!(
        source.attached().contains(&"count_memcg_events"),
        "{:?}",
        source.missing()
    );
    let switch = source.events_switch().expect("the memcg events switch");
    let off_within = |limit: Duration| {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if switch.memcg_events_attached() == Some(false) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    };
    assert!(
        off_within(Duration::from_secs(2)),
        "count_memcg_events still on a calm node: {:?}",
        switch.memcg_events_attached()
    );
    let (tx, mut rx) = mpsc::channel(65_536);
    let task = rt.spawn(source.run(tx));

    // Page cache written through a 32 MiB memcg: its limit reclaim stalls the writer.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("cache");
    let mut memcg = TestMemcg::new("ebpf-events-gate", 32 << 20).expect("test memcg");
    memcg
        .spawn(Command::new("sh").arg("-c").arg(format!(
            "for i in 1 2 3 4 5 6; do dd if=/dev/zero of={} bs=1M count=128 status=none; done",
            file.display()
        )))
        .expect("writer");
    let ours = Some(memcg.cgroup.clone());
    let mut attached_seen = false;
    let seen = collect_until(&rt, &mut rx, Duration::from_secs(30), |e| {
        attached_seen |= switch.memcg_events_attached() == Some(true);
        e.cgroup == ours
            && matches!(e.kind, Kind::MemcgEvent { ref item, .. } if item.starts_with("pgscan") || item.starts_with("pgsteal"))
    });
    let stalls = seen
        .iter()
        .filter(|s| s.event.cgroup == ours && matches!(s.event.kind, Kind::ReclaimStall { .. }))
        .count();
    let scans = seen
        .iter()
        .filter(|s| s.event.cgroup == ours && matches!(s.event.kind, Kind::MemcgEvent { .. }))
        .count();
    assert!(
        stalls > 0,
        "no reclaim stall from {} ({} events)",
        memcg.cgroup,
        seen.len()
    );
    assert!(
        scans > 0 && attached_seen,
        "no scanning reported from {} after {stalls} stalls (program on: {attached_seen})",
        memcg.cgroup
    );
    let statuses = memcg.wait_all(Duration::from_secs(60));
    assert!(
        statuses.iter().all(Option::is_some),
        "the writer did not finish"
    );
    assert!(
        off_within(hold + Duration::from_secs(5)),
        "count_memcg_events still on {:?} after the last reclaim",
        hold + Duration::from_secs(5)
    );
    drop(rx);
    task.abort();
}
