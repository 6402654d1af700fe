//! Memory QoS and swap on v2 through `reactor run` (process runtime): the `memory.min` /
//! `memory.high` tree equals `reactor plan cgroups` with the `MemoryQoS` gate on; a Burstable
//! container pushed past its `memory.high` is throttled, not OOM-killed; with a swap disk and
//! LimitedSwap, a Burstable container's anonymous memory goes to swap within the planned
//! `memory.swap.max`, and a Guaranteed container's never does.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use super::agent::{apply, plan_cgroups, pod, procs, start};
use super::pods::{assert_tree_matches, plan_node, three_pods, wait_running, NODE};
use super::{counter, read, wait_until};
use crate::memhog_bin;

/// The guest's swap disk (`xtask/src/vm.rs`: a blank virtio-blk disk each boot).
const SWAP_DISK: &str = "/dev/vda";

/// Runs a busybox tool, panicking with its output when it fails.
fn run(tool: &str, args: &[&str]) {
    let out = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Swap on the guest's disk for as long as it lives; off again when dropped, so the checks
/// after this one (whose agents keep `failSwapOn`'s default) see a node without swap.
struct SwapOn;

impl SwapOn {
    fn on() -> SwapOn {
        assert!(
            Path::new(SWAP_DISK).exists(),
            "no {SWAP_DISK}: the guest has no swap disk (xtask/src/vm.rs)"
        );
        run("mkswap", &[SWAP_DISK]);
        run("swapon", &[SWAP_DISK]);
        SwapOn
    }
}

impl Drop for SwapOn {
    fn drop(&mut self) {
        let _ = Command::new("swapoff").arg(SWAP_DISK).status();
    }
}

/// `SwapTotal` of the guest, bytes.
fn swap_total() -> u64 {
    let meminfo = read(Path::new("/proc/meminfo"));
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("SwapTotal:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|k| k.parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .unwrap_or_else(|| panic!("no SwapTotal in /proc/meminfo:\n{meminfo}"))
}

/// With `featureGates: {MemoryQoS: true}` every `memory.min` / `memory.low` / `memory.high`
/// of the tree (kubepods, the QoS tiers, the pods, their containers) equals `reactor plan
/// cgroups` for the same pods, and a few of them equal the kubelet's figures worked out by
/// hand, so a bug shared by plan and writer still fails.
pub fn tree_matches_plan() -> String {
    let agent = start(
        "v2-mqos",
        &format!("{NODE}featureGates: {{MemoryQoS: true}}\n"),
    );
    let pods = three_pods(&agent);
    let mut node = plan_node();
    node["featureGates"] = json!({"MemoryQoS": true});
    let plan = plan_cgroups(&node, &pods);
    assert_tree_matches(&agent, &plan);
    let cgroup = |name: &str| {
        plan["pods"][name]["cgroup"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let (g, b, e) = (
        cgroup("default/guaranteed"),
        cgroup("default/burstable"),
        cgroup("default/besteffort"),
    );
    const MI: u64 = 1 << 20;
    for (cg, file, want) in [
        // Guaranteed 64Mi + Burstable 32Mi + 16Mi.
        ("kubepods".to_string(), "memory.min", 112 * MI),
        ("kubepods/burstable".to_string(), "memory.min", 48 * MI),
        ("kubepods/besteffort".to_string(), "memory.min", 0),
        (g.clone(), "memory.min", 64 * MI),
        (format!("{g}/app"), "memory.min", 64 * MI),
        (b.clone(), "memory.min", 48 * MI),
        (format!("{b}/limited"), "memory.min", 32 * MI),
        // 32Mi + 0.9 × (96Mi − 32Mi), rounded down to a page.
        (format!("{b}/limited"), "memory.high", 93_949_952),
        // No limit: 16Mi + 0.9 × (640Mi allocatable − 16Mi), rounded down to a page.
        (format!("{b}/open"), "memory.high", 605_655_040),
        (e.clone(), "memory.min", 0),
    ] {
        assert_eq!(
            read(&agent.v2_dir(&cg).join(file)),
            want.to_string(),
            "{cg}/{file} against the kubelet's value"
        );
    }
    // A Guaranteed container and the pods themselves keep no memory.high.
    for cg in [format!("{g}/app"), g, b] {
        assert_eq!(read(&agent.v2_dir(&cg).join("memory.high")), "max", "{cg}");
    }
    let notes = format!(
        "kubepods {} burstable {}",
        plan["kubepods"]["memory.min"], plan["burstable"]["memory.min"]
    );
    // The requests gone, the tiers protect nothing any more (where the kubelet would leave
    // the last value in place): the agent writes 0.
    for name in ["default/guaranteed", "default/burstable"] {
        let out = agent.cli(&["pod", "rm", name, "--grace", "0"]);
        assert!(
            out.status.success(),
            "pod rm {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let min = |cg: &str| read(&agent.v2_dir(cg).join("memory.min"));
    wait_until(
        "kubepods' and burstable's memory.min back to 0",
        120,
        || min("kubepods") == "0" && min("kubepods/burstable") == "0",
        || {
            format!(
                "kubepods {} burstable {}\n{}",
                min("kubepods"),
                min("kubepods/burstable"),
                agent.log()
            )
        },
    );
    notes
}

/// A Burstable container (16Mi request, 64Mi limit, `memoryThrottlingFactor: 0.5`, so
/// `memory.high` 40Mi) whose hog takes 52Mi: the kernel throttles it at `memory.high`
/// (`high` events rise) and it lives on, with no OOM kill, below its `memory.max`.
pub fn high_throttles_not_oom_kills() -> String {
    let agent = start(
        "v2-mhigh",
        &format!("{NODE}featureGates: {{MemoryQoS: true}}\nmemoryThrottlingFactor: 0.5\n"),
    );
    let hog = vec![
        memhog_bin().display().to_string(),
        "52".into(),
        "0".into(),
        "3600".into(),
    ];
    let doc = apply(
        &agent,
        &pod(
            "throttled",
            &[(
                "app",
                hog,
                json!({"requests": {"memory": "16Mi"}, "limits": {"memory": "64Mi"}}),
            )],
        ),
    );
    let uid = doc["metadata"]["uid"].as_str().unwrap_or_default();
    let dir = agent.v2_dir(&format!("kubepods/burstable/pod{uid}/app"));
    let events = dir.join("memory.events");
    wait_until(
        "the hog's container to exist",
        120,
        || events.exists() && !procs(&dir).is_empty(),
        || agent.log(),
    );
    assert_eq!(read(&dir.join("memory.high")), "41943040");
    wait_until(
        "memory.events high to rise",
        180,
        || counter(&events, "high") > 0,
        || format!("{}\n{}", read(&events), agent.log()),
    );
    // Let it run on against the throttle for a while: still alive, never OOM-killed.
    std::thread::sleep(Duration::from_secs(10));
    let high = counter(&events, "high");
    let current: u64 = read(&dir.join("memory.current")).parse().unwrap_or(0);
    assert_eq!(
        counter(&events, "oom_kill"),
        0,
        "OOM-killed: {}",
        read(&events)
    );
    assert_eq!(counter(&events, "oom"), 0, "{}", read(&events));
    assert!(
        !procs(&dir).is_empty(),
        "the hog is gone: {}",
        read(&events)
    );
    assert!(current < 64 << 20, "memory.current {current} at the limit");
    // Over memory.high, where the kernel holds it back rather than killing it.
    assert!(
        current > 40 << 20,
        "memory.current {current} never passed memory.high"
    );
    let pod = agent.pod("default/throttled").unwrap_or(Value::Null);
    assert_ne!(pod["phase"], "Failed", "{pod}");
    format!("high events {high}, memory.current {current} (memory.high 40Mi, max 64Mi)")
}

/// Swap on (a 256 MiB disk), LimitedSwap, `failSwapOn: false`: a Burstable container
/// (48Mi request, 64Mi limit) gets `memory.swap.max` = 48Mi / 768Mi of `SwapTotal`, equal
/// to the plan, and its hog of 72Mi pushes anonymous memory to swap (`memory.swap.current`
/// above 0, within the limit); a Guaranteed container beside it has `memory.swap.max` 0 and
/// nothing in swap.
pub fn limited_swap() -> String {
    let _swap = SwapOn::on();
    let total = swap_total();
    assert!(total > 0, "swapon left SwapTotal at 0");
    let agent = start(
        "v2-swap",
        &format!("{NODE}memorySwap: {{swapBehavior: LimitedSwap}}\nfailSwapOn: false\n"),
    );
    // Paced (24 MiB/s): allocated as fast as it can, the swapper outran the guest's swap
    // device on a busy host, and the kernel OOM-killed it at its limit 2 s in, before
    // anything reached swap (CI, with other work on the host); paced, reclaim has the time
    // to write pages out, as a workload that grows does.
    let hog = |mib: &str| {
        vec![
            memhog_bin().display().to_string(),
            mib.into(),
            "24".into(),
            "3600".into(),
        ]
    };
    let b = apply(
        &agent,
        &pod(
            "swapper",
            &[(
                "app",
                hog("72"),
                json!({"requests": {"memory": "48Mi"}, "limits": {"memory": "64Mi"}}),
            )],
        ),
    );
    let g = apply(
        &agent,
        &pod(
            "steady",
            &[(
                "app",
                hog("24"),
                json!({"requests": {"memory": "32Mi", "cpu": "100m"},
                       "limits": {"memory": "32Mi", "cpu": "100m"}}),
            )],
        ),
    );
    let mut node = plan_node();
    node["memorySwap"] = json!({"swapBehavior": "LimitedSwap"});
    node["swapCapacity"] = json!(total);
    let plan = plan_cgroups(&node, &[b.clone(), g.clone()]);
    wait_running(&agent, &plan);
    let b_dir = agent.v2_dir(&format!(
        "{}/app",
        plan["pods"]["default/swapper"]["cgroup"]
            .as_str()
            .unwrap_or_default()
    ));
    let g_dir = agent.v2_dir(&format!(
        "{}/app",
        plan["pods"]["default/steady"]["cgroup"]
            .as_str()
            .unwrap_or_default()
    ));
    let planned = plan["pods"]["default/swapper"]["containers"]["app"]["memory.swap.max"]
        .as_u64()
        .unwrap_or_else(|| panic!("no memory.swap.max in the plan: {plan:#}"));
    // 48Mi of the 768Mi node: a sixteenth of the swap, worked out by hand.
    assert_eq!(planned, total / 16, "plan against the kubelet's share");
    // The kernel keeps the limit in whole pages, rounding the written bytes down.
    let in_pages = planned / 4096 * 4096;
    assert_eq!(read(&b_dir.join("memory.swap.max")), in_pages.to_string());
    assert_eq!(
        plan["pods"]["default/steady"]["containers"]["app"]["memory.swap.max"],
        0
    );
    assert_eq!(read(&g_dir.join("memory.swap.max")), "0");
    let swapped = || {
        read(&b_dir.join("memory.swap.current"))
            .parse::<u64>()
            .unwrap_or(0)
    };
    wait_until(
        "the Burstable hog's memory in swap",
        240,
        || swapped() > 0,
        || {
            format!(
                "memory.current {} swap.current {} events {}\n{}",
                read(&b_dir.join("memory.current")),
                read(&b_dir.join("memory.swap.current")),
                read(&b_dir.join("memory.events")),
                agent.log()
            )
        },
    );
    let in_swap = swapped();
    assert!(in_swap <= planned, "swap.current {in_swap} over {planned}");
    wait_until(
        "the Guaranteed hog to hold its memory",
        120,
        || {
            read(&g_dir.join("memory.current"))
                .parse::<u64>()
                .unwrap_or(0)
                >= 24 << 20
        },
        || read(&g_dir.join("memory.stat")),
    );
    assert_eq!(read(&g_dir.join("memory.swap.current")), "0");
    assert_eq!(
        counter(&b_dir.join("memory.events"), "oom_kill"),
        0,
        "{}",
        read(&b_dir.join("memory.events"))
    );
    // `reactor status` shows the node's swap as the kernel does.
    let status = agent.cli(&["status", "--json"]);
    let status: Value = serde_json::from_slice(&status.stdout).unwrap_or_else(|e| {
        panic!(
            "status --json: {e}: {}",
            String::from_utf8_lossy(&status.stdout)
        )
    });
    assert_eq!(status["swap"]["totalBytes"], total, "{status}");
    assert!(
        status["swap"]["usedBytes"].as_u64().unwrap_or(0) > 0,
        "swap in use after the hog: {status}"
    );
    format!("SwapTotal {total}, Burstable swap.max {planned}, in swap {in_swap}, Guaranteed 0")
}
