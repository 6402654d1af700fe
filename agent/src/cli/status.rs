//! `reactor status`: the node as the running agent sees it.

use clap::Args;
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
        let mut next: Vec<(u32, String)> = pods
            .iter()
            .filter(|p| p.phase == "Running" || p.phase == "Pending")
            .filter_map(|p| {
                let r = p.eviction_rank.iter().find(|r| r.signal == "memory.available")?;
                let name = p.pod.as_ref().map(|r| format!("{}/{}", r.namespace, r.name))?;
                (!r.exempt).then_some((r.rank, name))
            })
            .collect();
        next.sort();
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
                    "type": c.r#type, "status": c.status, "reason": c.reason})).collect::<Vec<_>>(),
                "signals": s.signals.iter().map(|sig| json!({
                    "name": sig.name, "available": sig.available, "capacity": sig.capacity,
                    "thresholds": sig.thresholds.iter().map(|t| json!({
                        "kind": t.kind, "value": t.value})).collect::<Vec<_>>()})).collect::<Vec<_>>(),
                "sources": s.sources.iter().map(|x| json!({
                    "name": x.name, "attached": x.attached, "reason": x.reason})).collect::<Vec<_>>(),
                "capacity": to_map(sorted(&resources.capacity)),
                "allocatable": to_map(sorted(&resources.allocatable)),
                "nextToEvict": next.iter().map(|(_, n)| n.clone()).collect::<Vec<_>>(),
            });
            println!("{out}");
            return Ok(());
        }
        println!("cgroups: {} below {}", s.cgroup_version, s.cgroup_root);
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
                .map(|t| format!("{} {}", t.kind, t.value))
                .collect();
            println!(
                "signal {}: available {} of {} (thresholds: {})",
                sig.name,
                sig.available,
                sig.capacity,
                if th.is_empty() { "none".into() } else { th.join(", ") }
            );
        }
        for x in &s.sources {
            println!(
                "source {}: {} {}",
                x.name,
                if x.attached { "attached" } else { "missing" },
                x.reason
            );
        }
        for (k, v) in sorted(&resources.allocatable) {
            let cap = resources.capacity.get(&k).cloned().unwrap_or_default();
            println!("resource {k}: allocatable {v}, capacity {cap}");
        }
        if next.is_empty() {
            println!("next to evict (memory): none");
        } else {
            let names: Vec<&str> = next.iter().map(|(_, n)| n.as_str()).collect();
            println!("next to evict (memory): {}", names.join(", "));
        }
        Ok(())
    })
}
