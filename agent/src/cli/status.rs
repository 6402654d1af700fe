//! `reactor status`: the node as the running agent sees it — the node conditions, each
//! eviction signal against its thresholds (as the reactor loop's last pass read them), the
//! kernel sources attached, capacity and allocatable, and the pods the agent would evict
//! next for memory, with why (QoS class, priority, working set).
//!
//! `--json` prints the same as one object: `conditions`, `signals` (each with its
//! `thresholds`), `sources`, `capacity`, `allocatable`, `nextToEvict`, `cgroupVersion`,
//! `cgroupRoot`. Every value is the API's (`NodeStatus`, `ListPods`) unchanged: exact
//! integers and quantity strings. The text form prints quantities as kubectl does
//! (`reactor::human`: `24Gi`, `~23.4Gi`, `1900m`, `10% (~2.35Gi)`).

use clap::Args;
use reactor::human;
use reactor_proto::reactor_v1 as pb;
use serde_json::{json, Value};

use super::client::{failure, SocketArgs};
use super::watch::runtime;
use super::Failure;

/// `status`.
#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArgs,
}

fn to_map(pairs: Vec<(String, String)>) -> serde_json::Map<String, Value> {
    pairs
        .into_iter()
        .map(|(k, v)| (k, Value::String(v)))
        .collect()
}

/// A pod the agent would evict next for memory, and what puts it there.
struct Next {
    pod: String,
    qos: &'static str,
    priority: i32,
    working_set: u64,
}

pub(crate) fn run(a: StatusArgs) -> Result<(), Failure> {
    runtime()?.block_on(async {
        let mut client = a.socket.connect().await?;
        let s = client
            .node_status(pb::NodeStatusRequest {})
            .await
            .map_err(failure)?
            .into_inner();
        let pods = client
            .list_pods(pb::ListPodsRequest::default())
            .await
            .map_err(failure)?
            .into_inner()
            .pods;
        // Next to evict for memory: running pods by rank, critical ones skipped.
        let mut next: Vec<(u32, Next)> = pods
            .iter()
            .filter(|p| p.phase == "Running" || p.phase == "Pending")
            .filter_map(|p| {
                let r = p.eviction_rank.iter().find(|r| r.signal == "memory.available")?;
                let name = p.pod.as_ref().map(|r| format!("{}/{}", r.namespace, r.name))?;
                let usage = p.usage.unwrap_or_default();
                (!r.exempt).then(|| {
                    (
                        r.rank,
                        Next {
                            pod: name,
                            qos: super::pod::qos_name(p.qos),
                            priority: p.priority,
                            working_set: usage.memory_working_set_bytes,
                        },
                    )
                })
            })
            .collect();
        next.sort_by_key(|(rank, _)| *rank);
        let resources = s.resources.clone().unwrap_or_default();
        let sorted = |m: &std::collections::HashMap<String, String>| {
            let mut v: Vec<(String, String)> = m.clone().into_iter().collect();
            v.sort();
            v
        };
        if a.json {
            let out = json!({
                "cgroupVersion": s.cgroup_version,
                "cgroupRoot": s.cgroup_root,
                "conditions": s.conditions.iter().map(|c| json!({
                    "type": c.r#type, "status": c.status, "reason": c.reason,
                    "message": c.message,
                    "lastTransitionUnixNanos": c.last_transition_unix_nanos})).collect::<Vec<_>>(),
                "signals": s.signals.iter().map(|sig| json!({
                    "name": sig.name, "available": sig.available, "capacity": sig.capacity,
                    "observedUnixNanos": sig.observed_unix_nanos,
                    "thresholds": sig.thresholds.iter().map(|t| json!({
                        "kind": t.kind, "value": t.value, "resolved": t.resolved,
                        "gracePeriod": t.grace_period, "minimumReclaim": t.minimum_reclaim,
                        "met": t.met, "metSinceUnixNanos": t.met_since_unix_nanos,
                    })).collect::<Vec<_>>()})).collect::<Vec<_>>(),
                "sources": s.sources.iter().map(|x| json!({
                    "name": x.name, "attached": x.attached, "reason": x.reason})).collect::<Vec<_>>(),
                "chargeProgram": s.charge_watches.iter().map(|w| json!({
                    "cgroup": w.cgroup, "on": w.on, "state": w.state, "why": charge_why(w),
                    "usageBytes": w.usage_bytes, "inactiveFileBytes": w.inactive_file_bytes,
                    "levelBytes": w.level_bytes, "reachBytes": w.reach_bytes,
                })).collect::<Vec<_>>(),
                "swap": s.swap.as_ref().map(|w| json!({
                    "totalBytes": w.total_bytes, "usedBytes": w.used_bytes})),
                "psi": s.psi.iter().map(|p| json!({
                    "condition": p.condition, "source": p.source,
                    "full": p.read.then(|| json!({"avg10": p.full_avg10, "avg60": p.full_avg60})),
                    "threshold": p.threshold})).collect::<Vec<_>>(),
                "capacity": to_map(sorted(&resources.capacity)),
                "allocatable": to_map(sorted(&resources.allocatable)),
                "dryRun": s.dry_run,
                "wouldEvict": s.would_evict.iter().map(|w| json!({
                    "pod": w.pod.as_ref().map(|r| format!("{}/{}", r.namespace, r.name)),
                    "uid": w.uid, "signal": w.signal, "message": w.message,
                    "atUnixNanos": w.at_unix_nanos})).collect::<Vec<_>>(),
                "nextToEvict": next.iter().map(|(rank, n)| json!({
                    "pod": n.pod, "rank": rank, "qos": n.qos, "priority": n.priority,
                    "memoryWorkingSetBytes": n.working_set})).collect::<Vec<_>>(),
            });
            println!("{out}");
            return Ok(());
        }
        println!("cgroups: {} below {}", s.cgroup_version, s.cgroup_root);
        if s.dry_run {
            println!(
                "dry run: on (evictions, preemptions and image deletions are recorded, none is made)"
            );
        }
        for w in &s.would_evict {
            let pod = w
                .pod
                .as_ref()
                .map(|r| format!("{}/{}", r.namespace, r.name))
                .unwrap_or_default();
            println!(
                "would evict (dry run): {pod} ({}): {}",
                w.signal, w.message
            );
        }
        if s.conditions.is_empty() {
            println!("conditions: (not evaluated: the eviction loop is not running)");
        }
        for c in &s.conditions {
            println!("condition {}: {} ({})", c.r#type, c.status, c.reason);
        }
        for sig in &s.signals {
            let th: Vec<String> = sig
                .thresholds
                .iter()
                .map(|t| {
                    let mut text = format!(
                        "{} {}",
                        t.kind,
                        human::threshold(&sig.name, &t.value, &t.resolved)
                    );
                    if !t.grace_period.is_empty() {
                        text.push_str(&format!(" for {}", t.grace_period));
                    }
                    if t.met {
                        text.push_str(" MET");
                    }
                    text
                })
                .collect();
            println!(
                "signal {}: available {} of {} (thresholds: {})",
                sig.name,
                human::signal_value(&sig.name, &sig.available),
                human::signal_value(&sig.name, &sig.capacity),
                if th.is_empty() { "none".into() } else { th.join(", ") }
            );
        }
        for p in &s.psi {
            let figure = if p.read {
                format!("full avg10 {:.2}, avg60 {:.2}", p.full_avg10, p.full_avg60)
            } else {
                "not read".to_string()
            };
            let threshold = if p.threshold > 0.0 {
                format!("threshold {}", p.threshold)
            } else {
                "threshold 0: off".to_string()
            };
            println!("psi {} ({}): {figure} ({threshold})", p.source, p.condition);
        }
        for x in &s.sources {
            println!(
                "source {}: {} {}",
                x.name,
                if x.attached { "attached" } else { "missing" },
                x.reason
            );
        }
        for w in &s.charge_watches {
            println!(
                "charge program {}: {} ({})",
                w.cgroup,
                if w.on { "on" } else { "off" },
                charge_why(w)
            );
        }
        if let Some(w) = &s.swap {
            println!(
                "swap: used {} of {} (no eviction signal counts swap)",
                human::bytes(i128::from(w.used_bytes)),
                human::bytes(i128::from(w.total_bytes))
            );
        }
        for (k, v) in sorted(&resources.allocatable) {
            let cap = resources.capacity.get(&k).cloned().unwrap_or_default();
            println!(
                "resource {k}: allocatable {}, capacity {}",
                human::resource(&k, &v),
                human::resource(&k, &cap)
            );
        }
        if next.is_empty() {
            println!("next to evict (memory): none");
        }
        for (rank, n) in &next {
            println!(
                "next to evict (memory) #{rank}: {} ({}, priority {}, working set {})",
                n.pod,
                n.qos,
                n.priority,
                human::bytes(i128::from(n.working_set))
            );
        }
        Ok(())
    })
}

/// Why the charge program is on or off for one watched cgroup, in kubectl's units.
fn charge_why(w: &pb::ChargeWatch) -> String {
    let b = |v: u64| human::bytes(i128::from(v));
    let floor = w.level_bytes.saturating_sub(w.reach_bytes);
    let working_set = w.usage_bytes.saturating_sub(w.inactive_file_bytes);
    match w.state.as_str() {
        "far" => format!(
            "usage {} is below {} (level {} - reach {})",
            b(w.usage_bytes),
            b(floor),
            b(w.level_bytes),
            b(w.reach_bytes)
        ),
        "cached" => format!(
            "working set {} is below {} (level {} - reach {}); usage {} is within reach only \
             by {} of inactive page cache, which never arms it",
            b(working_set),
            b(floor),
            b(w.level_bytes),
            b(w.reach_bytes),
            b(w.usage_bytes),
            b(w.inactive_file_bytes)
        ),
        _ => format!(
            "working set {} is within reach {} of its level {}",
            b(working_set),
            b(w.reach_bytes),
            b(w.level_bytes)
        ),
    }
}
