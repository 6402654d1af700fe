//! The loop's close watch on the real kernel (cgroup v1): near a memory threshold the loop
//! re-reads the signals every 1 ms only where nothing in the kernel watches the crossing; an
//! armed eBPF usage threshold that follows the page cache leaves it a 100 ms safety net, and
//! its record still wakes the loop at the crossing.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reactor::act::cgroups::CgroupPath;
use reactor::act::runtime::RestartPolicy;
use reactor::reactor::Action;
use reactor::record::metrics::Metrics;
use reactor_tests::node::{Node, NodeSpec, MI};
use reactor_tests::{is_root, memhog_bin, require};

fn ready() -> bool {
    require(is_root(), "root, to create cgroups")
        && require(
            Path::new("/sys/fs/cgroup/memory/memory.oom_control").exists(),
            "cgroup v1 memory hierarchy under /sys/fs/cgroup",
        )
        && require(
            memhog_bin().exists(),
            "the memhog binary (cargo build --workspace --bins)",
        )
}

/// 512 MiB, evicting below 128 MiB allocatable: the threshold is met past 384 MiB of
/// kubepods' working set and the loop watches closely from 352 MiB (a quarter of the level).
fn spec(name: &'static str, ebpf: bool) -> NodeSpec {
    NodeSpec {
        name,
        capacity_mi: 512,
        hard: &[("allocatableMemory.available", "128Mi")],
        soft: &[],
        min_reclaim: &[],
        transition: Duration::from_secs(2),
        ebpf,
        deferred: true,
    }
}

/// Starts the node's loop with metrics, PSI off and, with eBPF, the memcg notification
/// off too (each mode hears one kernel source); `None`, the node finished, where eBPF was
/// asked for and cannot attach.
async fn start(name: &'static str, ebpf: bool) -> Option<(Node, Arc<Metrics>)> {
    let mut node = Node::start(spec(name, ebpf)).await;
    let metrics = Arc::new(Metrics::new());
    node.metrics = Some(metrics.clone());
    node.start_loop_with(|o, _| {
        o.psi = false;
        o.memcg = !ebpf;
    });
    if ebpf && !require(node.ebpf_attached, "the eBPF source attached (root, BTF)") {
        node.finish().await;
        return None;
    }
    Some((node, metrics))
}

/// `reactor_close_watch_rereads_total{watch="<watch>"}`.
fn rereads(metrics: &Metrics, watch: &str) -> f64 {
    let label = format!("reactor_close_watch_rereads_total{{watch=\"{watch}\"}} ");
    metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(&label)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {label}in the exposition"))
}

/// Starts a BestEffort hog holding `mib` MiB and waits until kubepods holds `until_mib` MiB.
async fn hold(node: &Node, uid: &str, mib: u64, until_mib: u64) {
    node.run(
        uid,
        Some("besteffort"),
        serde_json::json!({}),
        &[&mib.to_string(), "200"],
        RestartPolicy::Never,
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while node.usage(&CgroupPath::kubepods()) < until_mib * MI {
        assert!(
            Instant::now() < deadline,
            "kubepods did not reach {until_mib} MiB: {} bytes",
            node.usage(&CgroupPath::kubepods())
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The close watch's re-reads, by watch, over two seconds with kubepods' working set held
/// inside the close margin (about 366 MiB, the level at 384), after a housekeeping pass
/// (1 s) has seen it there.
async fn rereads_while_close(node: &Node, metrics: &Metrics) -> (f64, f64) {
    hold(node, "near", 366, 360).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = (
        rereads(metrics, "close"),
        rereads(metrics, "kernel_watched"),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    (
        rereads(metrics, "close") - before.0,
        rereads(metrics, "kernel_watched") - before.1,
    )
}

/// eBPF alone: the charge program attaches near the level and its following slot watches
/// the crossing, so the loop re-reads at the safety net's 100 ms instead of every 1 ms; a
/// second hog then crosses and is evicted before any OOM kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_armed_ebpf_slot_relaxes_the_close_watch_and_still_catches_the_crossing() {
    if !ready() {
        return;
    }
    let Some((mut node, metrics)) = start("reactor-closewatch-ebpf", true).await else {
        return;
    };
    let (close, watched) = rereads_while_close(&node, &metrics).await;
    eprintln!(
        "2 s near the level under an armed eBPF slot: close {close}, kernel_watched {watched}"
    );
    assert_eq!(close, 0.0, "no 1 ms re-reads while the kernel watches");
    assert!(
        (5.0..=40.0).contains(&watched),
        "about 20 safety-net re-reads in 2 s (one per 100 ms): {watched}"
    );
    // The crossing: 64 MiB more at 350 MiB/s.
    node.run(
        "cross",
        Some("besteffort"),
        serde_json::json!({}),
        &["64", "350"],
        RestartPolicy::Never,
    )
    .await;
    let decision = loop {
        let Some(d) = node.next_action(Duration::from_secs(10)).await else {
            panic!("no eviction within 10 s of the crossing");
        };
        match &d.action {
            Action::Evicted { .. } => break d,
            Action::OomKilled { .. } => panic!("kernel OOM kill before the eviction: {d:?}"),
            _ => {}
        }
    };
    let event = decision
        .wake
        .event
        .as_ref()
        .map(|e| format!("{} {}", e.source.name(), e.kind));
    eprintln!(
        "eviction: timer={} event={event:?} reaction={:?}",
        decision.wake.timer, decision.reaction_lag_ns
    );
    assert!(
        event.as_deref().is_some_and(|e| e.starts_with("ebpf")),
        "the eviction answers the eBPF record: {event:?}"
    );
    node.finish().await;
}

/// The memcg notification alone (no eBPF): its v1 threshold is checked every 128 charged
/// pages per CPU and moves only when re-registered, so near the level the loop re-reads
/// every 1 ms, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_ebpf_slot_the_loop_re_reads_every_millisecond_near_the_level() {
    if !ready() {
        return;
    }
    let Some((node, metrics)) = start("reactor-closewatch-memcg", false).await else {
        return;
    };
    let (close, watched) = rereads_while_close(&node, &metrics).await;
    eprintln!(
        "2 s near the level, memcg notification alone: close {close}, kernel_watched {watched}"
    );
    assert_eq!(
        watched, 0.0,
        "nothing in the kernel watches the working set"
    );
    assert!(
        close >= 200.0,
        "1 ms re-reads near the level (about 2000 in 2 s): {close}"
    );
    node.finish().await;
}
