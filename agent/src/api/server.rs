//! The agent's gRPC API (`reactor.v1.Agent`) on the root-only unix socket.
//!
//! A thin front end: every request is converted to domain types here, handed to the pod
//! manager (or the plan engine), and the answer converted back. Domain errors become gRPC
//! statuses in one place, [`status`], so a client can tell its own mistake
//! (`InvalidArgument`, `NotFound`, `AlreadyExists`) from the node's state
//! (`FailedPrecondition`, `ResourceExhausted`) and from trouble (`Unavailable`, `Internal`).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use reactor_proto::reactor_v1 as pb;
use reactor_proto::reactor_v1::agent_server::{Agent, AgentServer};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::socket::ApiSocket;
use crate::decide::qos::QosClass;
use crate::devices::DeviceManager;
use crate::node::document::Format;
use crate::node::manager::{container_state, phase_name};
use crate::node::{NodeError, NodeEventKind, PodManager, PodView, RemoveTarget};

/// Requests larger than this are refused by the transport; it is above the document limit
/// so an oversize pod document reaches the agent's own check and its one-line reason.
pub const MAX_MESSAGE_BYTES: usize = crate::node::document::MAX_DOCUMENT_BYTES + (1 << 20);

/// Connections served at once; the next one waits in the listen backlog until one closes.
/// With the per-connection limits below this bounds what clients can make the agent hold
/// (each request's body is buffered up to [`MAX_MESSAGE_BYTES`] while it is decoded), so a
/// flood of clients slows the API down instead of growing the agent without end.
pub const MAX_CONNECTIONS: usize = 128;
/// HTTP/2 streams (calls) one connection may have open; more are refused by the HTTP/2
/// layer (`REFUSED_STREAM`), which clients see as `Unavailable` and may retry.
pub(crate) const MAX_STREAMS_PER_CONNECTION: u32 = 64;
/// Calls of one connection being handled at once; the rest wait their turn.
pub(crate) const MAX_CALLS_PER_CONNECTION: usize = 16;
/// Request headers larger than this are refused (the API's own headers are a few hundred
/// bytes).
pub(crate) const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// HTTP/2 pings on idle connections, and how long an answer may take before the connection
/// is dropped: a peer that vanished without closing its socket does not keep its streams.
pub(crate) const KEEPALIVE: (Duration, Duration) =
    (Duration::from_secs(30), Duration::from_secs(10));

/// The one place domain errors become gRPC statuses.
pub fn status(e: &NodeError) -> Status {
    let msg = e.to_string();
    match e {
        NodeError::Invalid(_) => Status::invalid_argument(msg),
        NodeError::TooLarge { .. } => Status::resource_exhausted(msg),
        NodeError::AlreadyExists(_) => Status::already_exists(msg),
        NodeError::NotFound(_) => Status::not_found(msg),
        NodeError::Stopping(_) => Status::failed_precondition(msg),
        NodeError::Runtime(r) => match r {
            crate::act::runtime::RuntimeError::NotFound { .. } => Status::not_found(msg),
            crate::act::runtime::RuntimeError::AlreadyExists { .. } => Status::already_exists(msg),
            crate::act::runtime::RuntimeError::InvalidPod { .. } => Status::invalid_argument(msg),
            crate::act::runtime::RuntimeError::Unavailable { .. } => Status::unavailable(msg),
            _ => Status::internal(msg),
        },
        NodeError::Cgroup(_) | NodeError::Checkpoint(_) => Status::internal(msg),
        NodeError::Stopped => Status::unavailable(msg),
    }
}

/// What `NodeStatus` reports besides the pods: filled at start by `reactor run`.
#[derive(Clone, Default)]
pub struct NodeFacts {
    /// Sense sources: (name, attached, reason).
    pub sources: Vec<(String, bool, String)>,
    /// The agent's cgroup root.
    pub cgroup_root: String,
    /// The reactor loop's view of the node's pressure (signals, thresholds, conditions), as
    /// of its last pass: the status reports exactly what the decisions were based on.
    pub pressure: Option<tokio::sync::watch::Receiver<Option<crate::reactor::NodePressure>>>,
    /// What the in-kernel usage thresholds watch, and whether the charge program is on.
    pub charge: Option<crate::sense::ebpf::kernel_watch::KernelWatch>,
}

/// The service.
#[derive(Clone)]
pub struct AgentService {
    pods: PodManager,
    devices: Option<Arc<DeviceManager>>,
    facts: Arc<NodeFacts>,
}

impl AgentService {
    /// A service over `pods`.
    pub fn new(pods: PodManager, devices: Option<Arc<DeviceManager>>, facts: NodeFacts) -> Self {
        AgentService {
            pods,
            devices,
            facts: Arc::new(facts),
        }
    }
}

fn qos(q: QosClass) -> i32 {
    match q {
        QosClass::Guaranteed => pb::QosClass::Guaranteed as i32,
        QosClass::Burstable => pb::QosClass::Burstable as i32,
        QosClass::BestEffort => pb::QosClass::BestEffort as i32,
    }
}

fn pod_ref(namespace: &str, name: &str) -> pb::PodRef {
    pb::PodRef {
        namespace: namespace.to_string(),
        name: name.to_string(),
    }
}

fn split(full: &str) -> pb::PodRef {
    match full.split_once('/') {
        Some((ns, n)) => pod_ref(ns, n),
        None => pod_ref("default", full),
    }
}

/// A pod view in the API's terms.
pub fn summary(v: &PodView) -> pb::PodSummary {
    pb::PodSummary {
        uid: v.uid.clone(),
        pod: Some(pod_ref(&v.namespace, &v.name)),
        qos: qos(v.info.qos),
        phase: phase_name(v.phase).to_string(),
        reason: v.reason.clone(),
        message: v.message.clone(),
        cgroup: v.cgroup.as_ref().map(|c| c.to_string()).unwrap_or_default(),
        usage: Some(pb::PodUsage {
            memory_working_set_bytes: v.memory.map_or(0, |m| m.working_set_bytes),
            ephemeral_storage_bytes: 0,
            process_count: 0,
            oom_kills: v.oom_kills.unwrap_or(0),
        }),
        eviction_rank: v
            .memory_rank
            .map(|rank| pb::EvictionRank {
                signal: "memory.available".into(),
                rank,
                exempt: v.info.is_critical(),
            })
            .into_iter()
            .collect(),
        priority: v.info.priority_or_zero(),
        containers: v
            .containers
            .iter()
            .map(|c| {
                let (state, reason) = container_state(c);
                pb::ContainerSummary {
                    name: c.name.clone(),
                    state: state.to_string(),
                    reason,
                    restart_count: c.restart_count,
                    last_exit_code: c.last_termination.as_ref().map(|t| t.exit_code).or(
                        match &c.state {
                            crate::act::runtime::ContainerState::Terminated(t) => Some(t.exit_code),
                            _ => None,
                        },
                    ),
                    oom_score_adj: v.oom_score_adj.get(&c.name).copied().unwrap_or(0),
                }
            })
            .collect(),
    }
}

fn event(e: &crate::node::NodeEvent) -> pb::Event {
    use pb::event::Kind as K;
    let kind = match &e.kind {
        NodeEventKind::Pressure {
            source,
            cgroup,
            kind,
            at_monotonic_ns,
            lag_ns,
        } => K::Pressure(pb::PressureEvent {
            source: source.clone(),
            cgroup: cgroup.clone(),
            kind: kind.clone(),
            at_monotonic_nanos: i64::try_from(*at_monotonic_ns).unwrap_or(i64::MAX),
            lag_nanos: i64::try_from(*lag_ns).unwrap_or(i64::MAX),
        }),
        NodeEventKind::Admission {
            namespace,
            name,
            uid,
            admitted,
            reason,
            message,
        } => K::Admission(pb::AdmissionEvent {
            pod: Some(pod_ref(namespace, name)),
            uid: uid.clone(),
            admitted: *admitted,
            reason: reason.clone(),
            message: message.clone(),
        }),
        NodeEventKind::Preemption {
            preemptor,
            victims,
            reasons,
            dry_run,
        } => K::Preemption(pb::PreemptionEvent {
            preemptor: Some(split(preemptor)),
            victims: victims.iter().map(|v| split(v)).collect(),
            reasons: reasons.clone(),
            dry_run: *dry_run,
        }),
        NodeEventKind::Eviction {
            pod,
            uid,
            signal,
            message,
            grace_period_seconds,
            reaction_ns,
            killed_at_crossing,
            dry_run,
            escalated,
        } => K::Eviction(pb::EvictionEvent {
            pod: Some(split(pod)),
            uid: uid.clone(),
            signal: signal.clone(),
            message: message.clone(),
            grace_period_seconds: *grace_period_seconds,
            reaction_nanos: *reaction_ns,
            killed_at_crossing_pid: killed_at_crossing.unwrap_or(0),
            dry_run: *dry_run,
            escalated: *escalated,
        }),
        NodeEventKind::OomKill {
            pod,
            container,
            cgroup,
        } => K::OomKill(pb::OomKillEvent {
            pod: Some(split(pod)),
            container: container.clone(),
            cgroup: cgroup.clone(),
            pid: 0,
        }),
        NodeEventKind::ImageGc {
            trigger,
            removed,
            freed_bytes,
            reason,
            message,
            dry_run,
        } => K::ImageGc(pb::ImageGcEvent {
            trigger: trigger.clone(),
            removed: removed.clone(),
            freed_bytes: *freed_bytes,
            reason: reason.clone(),
            message: message.clone(),
            dry_run: *dry_run,
        }),
        NodeEventKind::MemoryReclaim {
            signal,
            cgroup,
            outcome,
            shortfall_bytes,
            active_file_bytes,
            requested_bytes,
            freed_bytes,
            steps,
            took_ns,
            error,
        } => K::MemoryReclaim(pb::MemoryReclaimEvent {
            signal: signal.clone(),
            cgroup: cgroup.clone(),
            outcome: outcome.clone(),
            shortfall_bytes: *shortfall_bytes,
            active_file_bytes: *active_file_bytes,
            requested_bytes: *requested_bytes,
            freed_bytes: *freed_bytes,
            steps: *steps,
            took_nanos: *took_ns,
            error: error.clone(),
        }),
        NodeEventKind::Condition {
            condition,
            on,
            reason,
            message,
        } => K::Condition(pb::NodeConditionEvent {
            r#type: condition.clone(),
            status: if *on { "True" } else { "False" }.to_string(),
            reason: reason.clone(),
            message: message.clone(),
        }),
        NodeEventKind::Removed { pod, uid, cause } => K::Removed(pb::PodRemovedEvent {
            pod: Some(split(pod)),
            uid: uid.clone(),
            cause: cause.clone(),
        }),
        NodeEventKind::Recovery {
            action,
            file,
            pod,
            uid,
            message,
        } => K::Recovery(pb::RecoveryEvent {
            action: action.clone(),
            file: file.clone(),
            pod: (!pod.is_empty()).then(|| split(pod)),
            uid: uid.clone(),
            message: message.clone(),
        }),
    };
    pb::Event {
        at_unix_nanos: e
            .at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
        sequence: e.sequence,
        kind: Some(kind),
    }
}

fn kind_name(k: &pb::event::Kind) -> &'static str {
    use pb::event::Kind as K;
    match k {
        K::Pressure(_) => "pressure",
        K::Admission(_) => "admission",
        K::Preemption(_) => "preemption",
        K::Eviction(_) => "eviction",
        K::OomKill(_) => "oom_kill",
        K::ImageGc(_) => "image_gc",
        K::Device(_) => "device",
        K::Removed(_) => "removed",
        K::Recovery(_) => "recovery",
        K::MemoryReclaim(_) => "memory_reclaim",
        K::Condition(_) => "condition",
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send>>;

#[tonic::async_trait]
impl Agent for AgentService {
    async fn apply_pod(
        &self,
        request: Request<pb::ApplyPodRequest>,
    ) -> Result<Response<pb::ApplyPodResponse>, Status> {
        let r = request.into_inner();
        let format = apply_format(r.format)?;
        let applied = self
            .pods
            .apply(&r.pod, format)
            .await
            .map_err(|e| status(&e))?;
        let v = &applied.pod;
        Ok(Response::new(pb::ApplyPodResponse {
            uid: v.uid.clone(),
            pod: Some(pod_ref(&v.namespace, &v.name)),
            qos: qos(v.info.qos),
            admitted: applied.admitted,
            reason: if applied.admitted {
                String::new()
            } else {
                v.reason.clone()
            },
            message: if applied.admitted {
                String::new()
            } else {
                v.message.clone()
            },
            preempted: applied.preempted.clone(),
            cgroup: v.cgroup.as_ref().map(|c| c.to_string()).unwrap_or_default(),
        }))
    }

    async fn remove_pod(
        &self,
        request: Request<pb::RemovePodRequest>,
    ) -> Result<Response<pb::RemovePodResponse>, Status> {
        let (target, grace) = remove_request(request.into_inner())?;
        let removed = self
            .pods
            .remove(target, grace)
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(pb::RemovePodResponse {
            pod: Some(summary(&removed.pod)),
        }))
    }

    async fn list_pods(
        &self,
        request: Request<pb::ListPodsRequest>,
    ) -> Result<Response<pb::ListPodsResponse>, Status> {
        let ns = request.into_inner().namespace;
        let pods = self.pods.pods().await.map_err(|e| status(&e))?;
        Ok(Response::new(pb::ListPodsResponse {
            pods: pods
                .iter()
                .filter(|p| ns.is_empty() || p.namespace == ns)
                .map(summary)
                .collect(),
        }))
    }

    async fn node_status(
        &self,
        _request: Request<pb::NodeStatusRequest>,
    ) -> Result<Response<pb::NodeStatusResponse>, Status> {
        let plan = self.pods.plan();
        let mut capacity: HashMap<String, String> = plan
            .resources
            .capacity
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut allocatable: HashMap<String, String> = plan
            .resources
            .allocatable
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if let Some(d) = &self.devices {
            for (resource, (healthy, unhealthy)) in d.devices() {
                capacity.insert(
                    resource.clone(),
                    (healthy.len() + unhealthy.len()).to_string(),
                );
                allocatable.insert(resource, healthy.len().to_string());
            }
        }
        let pressure = self
            .facts
            .pressure
            .as_ref()
            .and_then(|rx| rx.borrow().clone());
        let (signals, conditions) = pressure.as_ref().map(pressure_status).unwrap_or_default();
        Ok(Response::new(pb::NodeStatusResponse {
            signals,
            conditions,
            sources: self
                .facts
                .sources
                .iter()
                .map(|(name, attached, reason)| pb::SenseSource {
                    name: name.clone(),
                    attached: *attached,
                    reason: reason.clone(),
                    events: 0,
                })
                .collect(),
            resources: Some(pb::NodeResources {
                capacity,
                allocatable,
            }),
            cgroup_version: match self.pods.cgroups().version() {
                crate::decide::cgroups::CgroupVersion::V1 => "v1".into(),
                crate::decide::cgroups::CgroupVersion::V2 => "v2".into(),
            },
            cgroup_root: self.facts.cgroup_root.clone(),
            dry_run: pressure.as_ref().is_some_and(|p| p.dry_run),
            would_evict: pressure.as_ref().map(would_evict).unwrap_or_default(),
            charge_watches: self
                .facts
                .charge
                .as_ref()
                .map(charge_watches)
                .unwrap_or_default(),
            // Read at the request: the loop's passes do not read swap (no signal counts it).
            swap: crate::observe::procfs::ProcFs::new("/proc".into())
                .swap_bytes()
                .ok()
                .map(|s| pb::NodeSwap {
                    total_bytes: s.total,
                    used_bytes: s.used,
                }),
            psi: pressure.as_ref().map(psi_figures).unwrap_or_default(),
        }))
    }

    type EventsStream = EventStream;

    async fn events(
        &self,
        request: Request<pb::EventsRequest>,
    ) -> Result<Response<Self::EventsStream>, Status> {
        let kinds = request.into_inner().kinds;
        // The recovery events of the start first (nobody can have been listening then),
        // then everything from now on.
        let (replay, rx) = self.pods.events().subscribe_with_replay();
        let live = tokio_stream::wrappers::BroadcastStream::new(rx).filter_map(|item| item.ok());
        let stream = tokio_stream::iter(replay).chain(live).filter_map(move |e| {
            let pe = event(&e);
            let k = pe.kind.as_ref()?;
            (kinds.is_empty() || kinds.iter().any(|w| w == kind_name(k))).then_some(Ok(pe))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn plan(
        &self,
        request: Request<pb::PlanRequest>,
    ) -> Result<Response<pb::PlanResponse>, Status> {
        let r = request.into_inner();
        let out = plan_output(&r.what, &r.input_json)?;
        Ok(Response::new(pb::PlanResponse { output_json: out }))
    }
}

// The request checks below are functions of the message alone, apart from the handlers, so
// the fuzz targets (`fuzz/`) run exactly what the API runs on a decoded request.

/// `ApplyPodRequest.format` as a document format; anything else is the client's mistake.
pub fn apply_format(format: i32) -> Result<Format, Status> {
    match pb::DocumentFormat::try_from(format) {
        Ok(pb::DocumentFormat::Json) => Ok(Format::Json),
        Ok(pb::DocumentFormat::Yaml) => Ok(Format::Yaml),
        _ => Err(Status::invalid_argument(
            "format: must be DOCUMENT_FORMAT_JSON or DOCUMENT_FORMAT_YAML",
        )),
    }
}

/// Which pod a `RemovePodRequest` names, and the grace it asks for.
pub fn remove_request(r: pb::RemovePodRequest) -> Result<(RemoveTarget, Option<Duration>), Status> {
    let target = match r.target {
        Some(pb::remove_pod_request::Target::Pod(p)) if !p.name.is_empty() => RemoveTarget::Name {
            namespace: if p.namespace.is_empty() {
                "default".into()
            } else {
                p.namespace
            },
            name: p.name,
        },
        Some(pb::remove_pod_request::Target::Uid(u)) if !u.is_empty() => RemoveTarget::Uid(u),
        _ => {
            return Err(Status::invalid_argument(
                "target: a pod name or uid is required",
            ))
        }
    };
    let grace = match r.grace_period_seconds {
        None => None,
        Some(g) if g >= 0 => Some(Duration::from_secs(g as u64)),
        Some(g) => {
            return Err(Status::invalid_argument(format!(
                "grace_period_seconds: {g} is negative"
            )))
        }
    };
    Ok((target, grace))
}

/// A `PlanRequest`'s answer: the plan named by `what` run on `input`, as indented JSON.
pub fn plan_output(what: &str, input: &[u8]) -> Result<Vec<u8>, Status> {
    let bad = |e: crate::plan::input::InputError| Status::invalid_argument(e.to_string());
    let value = match what {
        "evict" => crate::plan::evict::run(input).map_err(bad)?,
        "preempt" => serde_json::to_value(crate::plan::preempt::run(input).map_err(bad)?)
            .map_err(|e| Status::internal(e.to_string()))?,
        "image-gc" => crate::plan::image_gc::run(input).map_err(bad)?,
        "cgroups" => crate::plan::cgroups::run(input).map_err(bad)?,
        "pressure" => crate::plan::pressure::run(input).map_err(bad)?,
        other => {
            return Err(Status::invalid_argument(format!(
                "what: {other:?} is not evict, preempt, image-gc, cgroups or pressure"
            )))
        }
    };
    serde_json::to_vec_pretty(&value).map_err(|e| Status::internal(e.to_string()))
}

/// An accepted connection holding one of the [`MAX_CONNECTIONS`] permits until it closes.
struct Connection {
    stream: tokio::net::UnixStream,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = <tokio::net::UnixStream as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl tokio::io::AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Gives the transport's own refusals of a request body the codes of the gRPC spec, so a
/// client can tell its own mistake from the agent's trouble: tonic answers a message over the
/// size limit `OutOfRange` (grpc-go and the spec: `ResourceExhausted`) and a body that is not
/// the protobuf message it should be `Internal` (it is the client's bad input:
/// `InvalidArgument`). Both refusals come before the handler runs, as a trailers-only response
/// (the status in the headers); the service itself never answers `OutOfRange`, and its own
/// `Internal` messages never start with prost's decode error.
fn transport_refusal_codes<B>(
    mut response: tonic::codegen::http::Response<B>,
) -> tonic::codegen::http::Response<B> {
    use tonic::codegen::http::HeaderValue;
    let headers = response.headers_mut();
    let code = headers.get("grpc-status").map(|v| v.as_bytes().to_vec());
    let decode_error = headers.get("grpc-message").is_some_and(|m| {
        m.as_bytes()
            .starts_with(b"failed%20to%20decode%20Protobuf%20message")
    });
    match code.as_deref() {
        Some(b"11") => {
            headers.insert("grpc-status", HeaderValue::from_static("8"));
        }
        Some(b"13") if decode_error => {
            headers.insert("grpc-status", HeaderValue::from_static("3"));
        }
        _ => {}
    }
    response
}

/// Serves `service` on `socket` until `shutdown` resolves, within the limits above: at most
/// [`MAX_CONNECTIONS`] connections, each with at most [`MAX_STREAMS_PER_CONNECTION`] open
/// calls of which [`MAX_CALLS_PER_CONNECTION`] are handled at once, messages up to
/// [`MAX_MESSAGE_BYTES`] (a larger one is answered `ResourceExhausted`, a body that is not the
/// message it claims `InvalidArgument`: `transport_refusal_codes`), bytes that are not HTTP/2 close that
/// connection only), and keepalive pings that drop dead peers.
pub async fn serve(
    socket: ApiSocket,
    service: AgentService,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Connection>>(16);
    let socket = Arc::new(socket);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let accept = {
        let socket = Arc::clone(&socket);
        tokio::spawn(async move {
            loop {
                // A free slot first, then the next connection: beyond the limit, clients
                // wait in the kernel's backlog rather than in the agent's memory.
                let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
                    return;
                };
                let r = socket
                    .listener()
                    .accept()
                    .await
                    .map(|(stream, _)| Connection {
                        stream,
                        _permit: permit,
                    });
                if tx.send(r).await.is_err() {
                    return;
                }
            }
        })
    };
    let incoming = tokio_stream::wrappers::ReceiverStream::new(rx);
    let result = tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .concurrency_limit_per_connection(MAX_CALLS_PER_CONNECTION)
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
        .http2_keepalive_interval(Some(KEEPALIVE.0))
        .http2_keepalive_timeout(Some(KEEPALIVE.1))
        .layer(tower::util::MapResponseLayer::new(
            transport_refusal_codes::<tonic::body::Body>,
        ))
        .add_service(
            AgentServer::new(service)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    accept.abort();
    let _ = accept.await;
    drop(socket);
    result
}

fn unix_nanos(t: std::time::SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Each watched cgroup's arming as the charge program's last look found it.
fn charge_watches(watch: &crate::sense::ebpf::kernel_watch::KernelWatch) -> Vec<pb::ChargeWatch> {
    let on = watch.attached();
    watch
        .arming()
        .into_iter()
        .map(|w| pb::ChargeWatch {
            cgroup: w.cgroup,
            on,
            state: w.report.arming.as_str().to_string(),
            usage_bytes: w.report.usage_bytes,
            inactive_file_bytes: w.report.inactive_file_bytes,
            level_bytes: w.report.level_bytes,
            reach_bytes: w.report.reach_bytes,
        })
        .collect()
}

/// The PSI figures KEP-5394's conditions read at the loop's last pass (none with the gate
/// off).
fn psi_figures(p: &crate::reactor::NodePressure) -> Vec<pb::PsiFigure> {
    p.psi
        .iter()
        .map(|f| pb::PsiFigure {
            condition: f.condition.name().to_string(),
            source: f.source.to_string(),
            read: f.full.is_some(),
            full_avg10: f.full.map_or(0.0, |a| a.avg10),
            full_avg60: f.full.map_or(0.0, |a| a.avg60),
            threshold: f.threshold,
        })
        .collect()
}

/// A dry run's would-be evictions of the open episodes, from the loop's last pass.
fn would_evict(p: &crate::reactor::NodePressure) -> Vec<pb::DryRunEviction> {
    p.would_evict
        .iter()
        .map(|w| pb::DryRunEviction {
            pod: Some(split(&w.pod)),
            uid: w.uid.clone(),
            signal: w.signal.clone(),
            message: w.message.clone(),
            at_unix_nanos: unix_nanos(w.at),
        })
        .collect()
}

/// The signals with their thresholds, and the conditions, from the loop's last pass.
fn pressure_status(p: &crate::reactor::NodePressure) -> (Vec<pb::Signal>, Vec<pb::NodeCondition>) {
    use crate::reactor::status::show;
    let signals = p
        .signals
        .iter()
        .map(|s| pb::Signal {
            name: s.signal.name().to_string(),
            available: show(s.signal, s.available),
            capacity: s.capacity.map(|c| show(s.signal, c)).unwrap_or_default(),
            thresholds: p
                .thresholds
                .iter()
                .filter(|t| t.signal == s.signal)
                .map(|t| pb::Threshold {
                    kind: if t.hard { "hard" } else { "soft" }.to_string(),
                    value: t.value.clone(),
                    resolved: t.resolved.map(|r| show(t.signal, r)).unwrap_or_default(),
                    grace_period: if t.hard {
                        String::new()
                    } else {
                        crate::decide::duration::format_go_duration(t.grace_period)
                    },
                    minimum_reclaim: t.minimum_reclaim.clone().unwrap_or_default(),
                    met: t.met,
                    met_since_unix_nanos: t.met_since.map_or(0, unix_nanos),
                })
                .collect(),
            observed_unix_nanos: unix_nanos(p.observed_at),
        })
        .collect();
    let conditions = p
        .conditions
        .iter()
        .map(|c| pb::NodeCondition {
            r#type: c.condition.name().to_string(),
            status: if c.on { "True" } else { "False" }.to_string(),
            reason: c.reason().to_string(),
            message: c.message().to_string(),
            last_transition_unix_nanos: unix_nanos(c.last_transition),
        })
        .collect();
    (signals, conditions)
}
