//! Part 2's pods: the Guaranteed and Burstable pods kept running ([`ensure_base_pods`]), a
//! repetition's BestEffort hog started with its crossing clock armed ([`start_hog`]), and
//! the node put back after it ([`clean_up`]). The modes' repetitions and the reference's
//! share them.

use std::time::{Duration, Instant};

use anyhow::Result;
use reactor::act::cgroups::CgroupPath;
use reactor::act::runtime::{RestartPolicy, Runtime};
use reactor_tests::node::{burstable, guaranteed, Node, MI};
use serde_json::json;

use super::modes::{CAPACITY_MI, HARD_MI, HOG_MI};
use super::records::{Basis, Clock};

/// Makes sure the Guaranteed and Burstable pods run (an eviction or OOM kill of either is
/// recorded as a wrong victim, then they are brought back for the next repetition).
pub(crate) async fn ensure_base_pods(node: &Node) {
    for (uid, qos, resources) in [
        ("g", None, guaranteed()),
        ("b", Some("burstable"), burstable("64Mi")),
    ] {
        if node.is_running(uid).await {
            continue;
        }
        let _ = node.runtime.stop_pod(uid, Duration::ZERO).await;
        node.pods.remove(uid);
        if let Ok(cg) = CgroupPath::pod(qos, uid) {
            let _ = node.cgroups.remove(&cg, Duration::from_secs(2));
        }
        node.run(uid, qos, resources, &["48", "0"], RestartPolicy::Always)
            .await;
        node.wait_usage(uid, qos, 48 * MI).await;
    }
}

/// Starts one repetition's hog (600 MiB at `rate` MiB/s, BestEffort, its clock armed on
/// `basis` just before) and returns the clock and a reader of the pods' OOM kills so far.
pub(crate) async fn start_hog(
    node: &mut Node,
    uid: &str,
    rate: u64,
    basis: Basis,
) -> Result<(Clock, impl Fn() -> u64 + Send + Sync)> {
    let clock = Clock::arm_on(node, uid, CAPACITY_MI - HARD_MI, basis)?;
    let env = clock.hog_env()?;
    node.run_env(
        uid,
        Some("besteffort"),
        json!({}),
        &[&HOG_MI.to_string(), &rate.to_string()],
        &env.each_ref().map(|(k, v)| (*k, v.as_str())),
        RestartPolicy::Never,
    )
    .await;
    let cgroups = node.cgroups.clone();
    // On cgroup v1 an OOM kill is counted in the victim's own memcg only (no propagation to
    // kubepods), so watch every pod's container.
    let containers: Vec<CgroupPath> = [
        (Some("besteffort"), uid),
        (None, "g"),
        (Some("burstable"), "b"),
    ]
    .into_iter()
    .filter_map(|(qos, u)| CgroupPath::pod(qos, u).and_then(|p| p.join("app")).ok())
    .collect();
    let ooms = move || -> u64 {
        containers
            .iter()
            .map(|c| cgroups.oom_kills(c).unwrap_or(0))
            .sum()
    };
    Ok((clock, ooms))
}

/// After a repetition: the hog (evicted, OOM-killed or still running) stopped, its cgroup
/// removed, the node back to its two base pods and settled.
pub(crate) async fn clean_up(node: &mut Node, uid: &str) {
    let _ = node.runtime.stop_pod(uid, Duration::ZERO).await;
    node.pods.remove(uid);
    if let Ok(cg) = CgroupPath::pod(Some("besteffort"), uid) {
        let _ = node.cgroups.remove(&cg, Duration::from_secs(2));
    }
    ensure_base_pods(node).await;
    let t = Instant::now();
    while node.usage(&CgroupPath::kubepods()) > 160 * MI && t.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
}
