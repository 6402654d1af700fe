//! `reactor pod apply|rm|ls`: pods on a running agent, over its API socket. `pod ls` prints
//! the working set as kubectl does (`496Ki`, `~12.3Mi`: `reactor::human`); `--json`
//! keeps the exact bytes.

use std::io::Read as _;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use reactor::human;
use reactor::node::document::{self, MAX_DOCUMENT_BYTES};
use reactor_proto::reactor_v1 as pb;
use serde_json::{json, Value};

use super::client::{failure, SocketArgs};
use super::watch::runtime;
use super::Failure;

/// `reactor pod ...`.
#[derive(Subcommand, Debug)]
pub(crate) enum PodCommand {
    /// Admit and run a pod from a v1.Pod document (JSON or YAML; `-` reads stdin).
    Apply(ApplyArgs),
    /// Stop a pod and remove its cgroups.
    Rm(RmArgs),
    /// List the pods on the node.
    Ls(LsArgs),
}

/// `pod apply`.
#[derive(Args, Debug)]
pub(crate) struct ApplyArgs {
    /// The pod document: `.json`, `.yaml`/`.yml`, or `-` for stdin (YAML, which includes JSON).
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    file: PathBuf,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArgs,
}

/// `pod rm`.
#[derive(Args, Debug)]
pub(crate) struct RmArgs {
    /// `NAME` (namespace `default`) or `NAMESPACE/NAME`.
    pod: String,
    /// Seconds between SIGTERM and SIGKILL (default: the pod's terminationGracePeriodSeconds).
    #[arg(long, value_name = "N")]
    grace: Option<i64>,
    #[command(flatten)]
    socket: SocketArgs,
}

/// `pod ls`.
#[derive(Args, Debug)]
pub(crate) struct LsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Only this namespace.
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    #[command(flatten)]
    socket: SocketArgs,
}

pub(crate) fn run(cmd: PodCommand) -> Result<(), Failure> {
    match cmd {
        PodCommand::Apply(a) => apply(a),
        PodCommand::Rm(a) => rm(a),
        PodCommand::Ls(a) => ls(a),
    }
}

/// Reads the document, refusing an oversize one before reading it.
fn read_document(path: &PathBuf) -> Result<(Vec<u8>, pb::DocumentFormat), Failure> {
    let too_big = |n: u64| {
        Failure::Input(format!(
            "{}: {n} bytes is over the {MAX_DOCUMENT_BYTES}-byte pod document limit",
            path.display()
        ))
    };
    if path.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .take(MAX_DOCUMENT_BYTES as u64 + 1)
            .read_to_end(&mut buf)
            .map_err(|e| Failure::Input(format!("stdin: {e}")))?;
        if buf.len() > MAX_DOCUMENT_BYTES {
            return Err(too_big(buf.len() as u64));
        }
        return Ok((buf, pb::DocumentFormat::Yaml));
    }
    let meta =
        std::fs::metadata(path).map_err(|e| Failure::Input(format!("{}: {e}", path.display())))?;
    if meta.len() > MAX_DOCUMENT_BYTES as u64 {
        return Err(too_big(meta.len()));
    }
    let bytes =
        std::fs::read(path).map_err(|e| Failure::Input(format!("{}: {e}", path.display())))?;
    let format = match path.extension().and_then(|e| e.to_str()) {
        Some("json") => pb::DocumentFormat::Json,
        Some("yaml" | "yml") => pb::DocumentFormat::Yaml,
        _ if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') => {
            pb::DocumentFormat::Json
        }
        _ => pb::DocumentFormat::Yaml,
    };
    Ok((bytes, format))
}

fn apply(a: ApplyArgs) -> Result<(), Failure> {
    let (pod, format) = read_document(&a.file)?;
    // The file's own mistakes first, with no agent needed: the agent checks it again.
    let doc_format = match format {
        pb::DocumentFormat::Json => document::Format::Json,
        _ => document::Format::Yaml,
    };
    document::validate(&pod, doc_format)
        .map_err(|e| Failure::Input(format!("{}: {e}", a.file.display())))?;
    runtime()?.block_on(async {
        let mut client = a.socket.connect().await?;
        let r = client
            .apply_pod(pb::ApplyPodRequest {
                pod,
                format: format as i32,
            })
            .await
            .map_err(failure)?
            .into_inner();
        let name = r
            .pod
            .as_ref()
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .unwrap_or_default();
        if a.json {
            println!(
                "{}",
                json!({
                    "uid": r.uid, "pod": name, "qos": qos_name(r.qos), "admitted": r.admitted,
                    "reason": r.reason, "message": r.message, "preempted": r.preempted,
                    "cgroup": r.cgroup,
                })
            );
        } else if r.admitted {
            println!(
                "pod {name} admitted ({}, uid {}, cgroup {})",
                qos_name(r.qos),
                r.uid,
                r.cgroup
            );
            for p in &r.preempted {
                println!("preempted {p}");
            }
        }
        if !r.admitted {
            return Err(Failure::Runtime(anyhow::anyhow!(
                "pod {name} rejected: {}: {}",
                r.reason,
                r.message
            )));
        }
        Ok(())
    })
}

fn rm(a: RmArgs) -> Result<(), Failure> {
    let (namespace, name) = match a.pod.split_once('/') {
        Some((ns, n)) => (ns.to_string(), n.to_string()),
        None => ("default".to_string(), a.pod.clone()),
    };
    if name.is_empty() || namespace.is_empty() {
        return Err(Failure::Input(format!(
            "{:?}: expected NAME or NAMESPACE/NAME",
            a.pod
        )));
    }
    if let Some(g) = a.grace {
        if g < 0 {
            return Err(Failure::Input(format!("--grace {g}: must not be negative")));
        }
    }
    runtime()?.block_on(async {
        let mut client = a.socket.connect().await?;
        let r = client
            .remove_pod(pb::RemovePodRequest {
                target: Some(pb::remove_pod_request::Target::Pod(pb::PodRef {
                    namespace: namespace.clone(),
                    name: name.clone(),
                })),
                grace_period_seconds: a.grace,
            })
            .await
            .map_err(failure)?
            .into_inner();
        let phase = r.pod.map(|p| p.phase).unwrap_or_default();
        println!("pod {namespace}/{name} removed (was {phase})");
        Ok(())
    })
}

/// The QoS class's kubelet name.
pub(crate) fn qos_name(q: i32) -> &'static str {
    match pb::QosClass::try_from(q) {
        Ok(pb::QosClass::Guaranteed) => "Guaranteed",
        Ok(pb::QosClass::Burstable) => "Burstable",
        Ok(pb::QosClass::BestEffort) => "BestEffort",
        _ => "",
    }
}

fn pod_json(p: &pb::PodSummary) -> Value {
    let (ns, name) = p
        .pod
        .as_ref()
        .map(|r| (r.namespace.clone(), r.name.clone()))
        .unwrap_or_default();
    let usage = p.usage.unwrap_or_default();
    json!({
        "namespace": ns, "name": name, "uid": p.uid, "qos": qos_name(p.qos),
        "phase": p.phase, "reason": p.reason, "message": p.message, "cgroup": p.cgroup,
        "priority": p.priority,
        "memoryWorkingSetBytes": usage.memory_working_set_bytes,
        "oomKills": usage.oom_kills,
        "evictionRank": p.eviction_rank.iter().map(|r| json!({
            "signal": r.signal, "rank": r.rank, "exempt": r.exempt})).collect::<Vec<_>>(),
        "containers": p.containers.iter().map(|c| json!({
            "name": c.name, "state": c.state, "reason": c.reason,
            "restartCount": c.restart_count, "lastExitCode": c.last_exit_code,
            "oomScoreAdj": c.oom_score_adj})).collect::<Vec<_>>(),
    })
}

fn ls(a: LsArgs) -> Result<(), Failure> {
    runtime()?.block_on(async {
        let mut client = a.socket.connect().await?;
        let r = client
            .list_pods(pb::ListPodsRequest {
                namespace: a.namespace.clone().unwrap_or_default(),
            })
            .await
            .map_err(failure)?
            .into_inner();
        if a.json {
            let pods: Vec<Value> = r.pods.iter().map(pod_json).collect();
            println!("{}", Value::Array(pods));
            return Ok(());
        }
        println!(
            "{:<16} {:<24} {:<11} {:<10} {:<14} {:>5} {:>12}  CGROUP",
            "NAMESPACE", "NAME", "QOS", "PHASE", "REASON", "RANK", "WORKING-SET"
        );
        for p in &r.pods {
            let (ns, name) = p
                .pod
                .as_ref()
                .map(|r| (r.namespace.as_str(), r.name.as_str()))
                .unwrap_or_default();
            let rank = p
                .eviction_rank
                .first()
                .map(|r| {
                    if r.exempt {
                        format!("{}*", r.rank)
                    } else {
                        r.rank.to_string()
                    }
                })
                .unwrap_or_else(|| "-".into());
            let ws = human::bytes(i128::from(
                p.usage.as_ref().map_or(0, |u| u.memory_working_set_bytes),
            ));
            println!(
                "{ns:<16} {name:<24} {:<11} {:<10} {:<14} {rank:>5} {ws:>12}  {}",
                qos_name(p.qos),
                p.phase,
                if p.reason.is_empty() { "-" } else { &p.reason },
                p.cgroup
            );
        }
        Ok(())
    })
}
