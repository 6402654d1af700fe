//! `reactor events --follow`: what happens on the node, as it happens. The agent keeps no
//! history; the stream starts at the moment of the call and runs until interrupted. Text lines
//! print sizes and times as kubectl and Go do (`reactor::human`); `--json` keeps the
//! exact integers.

use clap::Args;
use reactor::human;
use reactor_proto::reactor_v1 as pb;
use serde_json::json;

use super::client::{failure, SocketArgs};
use super::watch::runtime;
use super::Failure;

/// `events`.
#[derive(Args, Debug)]
pub(crate) struct EventsArgs {
    /// Keep streaming (the only mode: the agent keeps no history; accepted for kubectl habit).
    #[arg(long, short = 'f')]
    follow: bool,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    /// Only these kinds (`pressure`, `admission`, `preemption`, `eviction`, `oom_kill`,
    /// `removed`, `recovery`, `condition`, ...).
    #[arg(long = "kind", value_name = "KIND")]
    kinds: Vec<String>,
    #[command(flatten)]
    socket: SocketArgs,
}

fn name(p: &Option<pb::PodRef>) -> String {
    p.as_ref()
        .map(|r| format!("{}/{}", r.namespace, r.name))
        .unwrap_or_default()
}

fn describe(e: &pb::Event) -> (&'static str, serde_json::Value, String) {
    use pb::event::Kind as K;
    match &e.kind {
        Some(K::Pressure(p)) => (
            "pressure",
            json!({"source": p.source, "cgroup": p.cgroup, "kind": p.kind, "lagNanos": p.lag_nanos}),
            format!(
                "{} {} {} lag {}",
                p.source,
                p.kind,
                if p.cgroup.is_empty() { "-" } else { &p.cgroup },
                human::duration_ns(u64::try_from(p.lag_nanos).unwrap_or(0))
            ),
        ),
        Some(K::Admission(a)) => (
            "admission",
            json!({"pod": name(&a.pod), "uid": a.uid, "admitted": a.admitted, "reason": a.reason, "message": a.message}),
            if a.admitted {
                format!("{} admitted", name(&a.pod))
            } else {
                format!("{} rejected: {}: {}", name(&a.pod), a.reason, a.message)
            },
        ),
        Some(K::Preemption(p)) => {
            let victims: Vec<String> = p
                .victims
                .iter()
                .map(|v| format!("{}/{}", v.namespace, v.name))
                .collect();
            (
                "preemption",
                json!({"preemptor": name(&p.preemptor), "victims": victims, "reasons": p.reasons,
                       "dryRun": p.dry_run}),
                if p.dry_run {
                    format!(
                        "(dry run) {} would preempt {} ({}); nothing stopped, {} refused",
                        name(&p.preemptor),
                        victims.join(", "),
                        p.reasons.join(", "),
                        name(&p.preemptor)
                    )
                } else {
                    format!(
                        "{} preempts {} ({})",
                        name(&p.preemptor),
                        victims.join(", "),
                        p.reasons.join(", ")
                    )
                },
            )
        }
        Some(K::Eviction(v)) => (
            "eviction",
            json!({"pod": name(&v.pod), "uid": v.uid, "signal": v.signal, "message": v.message,
                   "gracePeriodSeconds": v.grace_period_seconds, "reactionNanos": v.reaction_nanos,
                   "killedAtCrossingPid": v.killed_at_crossing_pid, "dryRun": v.dry_run,
                   "escalated": v.escalated}),
            if v.dry_run {
                format!(
                    "(dry run) {} would be evicted ({}), nothing killed: {}",
                    name(&v.pod),
                    v.signal,
                    v.message
                )
            } else if v.escalated {
                format!(
                    "{} eviction escalated ({}, a hard threshold met in its grace period): \
                     SIGKILL",
                    name(&v.pod),
                    v.signal
                )
            } else if v.killed_at_crossing_pid != 0 {
                format!(
                    "{} evicted ({}, killed at the crossing, pid {}): {}",
                    name(&v.pod),
                    v.signal,
                    v.killed_at_crossing_pid,
                    v.message
                )
            } else if v.reaction_nanos > 0 {
                format!(
                    "{} evicted ({}, reaction {}): {}",
                    name(&v.pod),
                    v.signal,
                    human::duration_ns(u64::try_from(v.reaction_nanos).unwrap_or(0)),
                    v.message
                )
            } else {
                format!("{} evicted ({}): {}", name(&v.pod), v.signal, v.message)
            },
        ),
        Some(K::OomKill(o)) => (
            "oom_kill",
            json!({"pod": name(&o.pod), "container": o.container, "cgroup": o.cgroup}),
            format!("{} container {} OOM-killed", name(&o.pod), o.container),
        ),
        Some(K::Removed(r)) => (
            "removed",
            json!({"pod": name(&r.pod), "uid": r.uid, "cause": r.cause}),
            format!("{} removed ({})", name(&r.pod), r.cause),
        ),
        Some(K::ImageGc(g)) => (
            "image_gc",
            json!({"trigger": g.trigger, "removed": g.removed, "freedBytes": g.freed_bytes,
                   "reason": g.reason, "message": g.message, "dryRun": g.dry_run}),
            if g.dry_run && g.reason.is_empty() {
                format!(
                    "(dry run) image GC ({}): {} would be removed, {} would be freed; nothing deleted",
                    g.trigger,
                    g.removed.len(),
                    human::bytes(i128::from(g.freed_bytes))
                )
            } else if g.reason.is_empty() {
                format!(
                    "image GC ({}): {} removed, {} freed",
                    g.trigger,
                    g.removed.len(),
                    human::bytes(i128::from(g.freed_bytes))
                )
            } else {
                format!("image GC ({}) {}: {}", g.trigger, g.reason, g.message)
            },
        ),
        Some(K::MemoryReclaim(m)) => (
            "memory_reclaim",
            json!({"signal": m.signal, "cgroup": m.cgroup, "outcome": m.outcome,
                   "shortfallBytes": m.shortfall_bytes, "activeFileBytes": m.active_file_bytes,
                   "requestedBytes": m.requested_bytes, "freedBytes": m.freed_bytes,
                   "steps": m.steps, "tookNanos": m.took_nanos, "error": m.error}),
            format!(
                "memory reclaim {} ({}): {} freed of {} short ({} active file) in {}, {} steps{}",
                m.outcome,
                m.signal,
                human::bytes(i128::from(m.freed_bytes)),
                human::bytes(i128::from(m.shortfall_bytes)),
                human::bytes(i128::from(m.active_file_bytes)),
                human::duration_ns(m.took_nanos),
                m.steps,
                if m.error.is_empty() {
                    String::new()
                } else {
                    format!(": {}", m.error)
                }
            ),
        ),
        Some(K::Recovery(r)) => (
            "recovery",
            json!({"action": r.action, "file": r.file, "pod": name(&r.pod), "uid": r.uid,
                   "message": r.message}),
            if r.file.is_empty() {
                format!("{} {}: {}", name(&r.pod), r.action, r.message)
            } else {
                format!("{} {}: {}", r.file, r.action, r.message)
            },
        ),
        Some(K::Device(d)) => (
            "device",
            json!({"resource": d.resource, "change": d.change, "devices": d.devices}),
            format!("{} {}", d.resource, d.change),
        ),
        Some(K::Condition(c)) => (
            "condition",
            json!({"type": c.r#type, "status": c.status, "reason": c.reason, "message": c.message}),
            format!("{} {} ({}): {}", c.r#type, c.status, c.reason, c.message),
        ),
        None => ("unknown", json!({}), String::new()),
    }
}

pub(crate) fn run(a: EventsArgs) -> Result<(), Failure> {
    let _ = a.follow;
    runtime()?.block_on(async {
        let mut client = a.socket.connect().await?;
        let mut stream = client
            .events(pb::EventsRequest {
                kinds: a.kinds.clone(),
            })
            .await
            .map_err(failure)?
            .into_inner();
        use std::io::Write as _;
        let mut out = std::io::stdout();
        while let Some(e) = stream.message().await.map_err(failure)? {
            let (kind, body, text) = describe(&e);
            let line = if a.json {
                json!({"sequence": e.sequence, "atUnixNanos": e.at_unix_nanos, "kind": kind, "event": body}).to_string()
            } else {
                format!("#{} {kind}: {text}", e.sequence)
            };
            if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
                break;
            }
        }
        Ok(())
    })
}
