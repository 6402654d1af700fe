//! The pod side of `reactor run`: device manager, pod manager (with its runtime and the
//! static-pod watcher), the image GC manager (CRI runtime only: it needs the runtime's image
//! service) and the API server. The pod side starts before the sense layer (the observer
//! needs the runtime's image filesystem), the API server after it (it reports what attached),
//! and all of it stops after the reactor loop. Kept apart from `run.rs` so the agent's main
//! flow stays a handful of calls.
//!
//! What happens here also feeds the record stage: admissions, preemptions and image GC
//! rounds go to the metrics, and image GC rounds to the event stream.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use reactor::act::cgroups::{CgroupManager, CgroupPath, DEFAULT_MOUNT_ROOT};
use reactor::act::cri::{CriClient, Timeouts};
use reactor::act::cri_runtime::{CriRuntime, CriRuntimeConfig};
use reactor::act::process::{ProcessRuntime, ProcessRuntimeConfig};
use reactor::act::runtime::Runtime;
use reactor::api::server::{serve, AgentService, NodeFacts};
use reactor::api::socket::ApiSocket;
use reactor::config::Config;
use reactor::decide::backoff::BackOffPolicy;
use reactor::decide::cgroups::CgroupVersion;
use reactor::decide::memory_qos::SwapBehavior;
use reactor::devices::{DeviceManager, DeviceManagerConfig};
use reactor::images::{GcTask, GcTrigger, ImageGcEvent, ImageGcManager, ImageGcSettings};
use reactor::node::manager::PodManagerConfig;
use reactor::node::{notices_to, static_pods, EventHub, NodeEventKind, NodePlan, PodManager};
use reactor::observe::procfs::ProcFs;
use reactor::reactor::{NodeReclaim, ReactorHandle};
use reactor::record::metrics::{Admission, Metrics};
use reactor::sense::ebpf::kernel_watch::KernelWatch;
use reactor::sense::AttachReport;
use tokio::sync::{broadcast, oneshot};

/// The running pod side.
pub(crate) struct NodeParts {
    pods: PodManager,
    devices: Arc<DeviceManager>,
    image_gc: Option<(ImageGcManager, GcTask)>,
    /// The runtime's image and container filesystems (CRI `ImageFsInfo`).
    runtime_fs: (Option<PathBuf>, Option<PathBuf>),
    server: Option<(oneshot::Sender<()>, tokio::task::JoinHandle<()>)>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts the device manager, the runtime `runtime.kind` names, the pod manager (which
/// re-adopts what its checkpoint and the runtime know), the static-pod watcher and, with the
/// CRI runtime, the image GC manager's loop.
pub async fn start(config: &Config, metrics: &Arc<Metrics>) -> anyhow::Result<NodeParts> {
    // The event hub first: every state file's notices (set aside, failed writes) and the
    // pod recovery go to `reactor events`, the ones of the start replayed to later clients.
    let events = EventHub::new();
    let notices = notices_to(&events);
    let devices = Arc::new(
        DeviceManager::start_with(DeviceManagerConfig::from_config(config), notices.clone())
            .await
            .context("device manager")?,
    );
    // The device gauges follow the device manager's changes.
    let device_metrics = super::device_metrics::spawn(&devices, metrics);
    let cgroups =
        CgroupManager::from_config(config, Path::new(DEFAULT_MOUNT_ROOT)).context("cgroupRoot")?;
    let swap_bytes = ProcFs::new(PathBuf::from("/proc"))
        .swap_total_bytes()
        .context("swap capacity")?;
    config.check_fail_swap_on(swap_bytes)?;
    memory_qos_notice(config, cgroups.version());
    let plan =
        NodePlan::from_config(config, cgroups.version(), swap_bytes).map_err(anyhow::Error::msg)?;
    let mut tasks = vec![
        forward_pod_metrics(events.subscribe(), Arc::clone(metrics)),
        device_metrics,
        swap_metrics(Arc::clone(metrics), config.housekeeping_interval.0),
    ];
    let mut image_gc = None;
    let mut runtime_fs = (None, None);
    let pods = match config.runtime.kind.as_str() {
        "process" => {
            let rt = ProcessRuntime::open_with(
                ProcessRuntimeConfig {
                    cgroups: cgroups.clone(),
                    state_dir: config.state_dir.clone(),
                    backoff: BackOffPolicy::default(),
                },
                notices.clone(),
            )
            .await
            .context("process runtime")?;
            tasks.push(forward_exits(rt.subscribe_exits(), events.clone()));
            start_pods(rt, cgroups.clone(), plan, config, &devices, &events).await?
        }
        "cri" => {
            let client = CriClient::connect(&config.runtime.endpoint, Timeouts::default())
                .await
                .with_context(|| format!("runtime.endpoint {}", config.runtime.endpoint))?;
            let cgroup_root = CgroupPath::parse(&config.cgroup_root).context("cgroupRoot")?;
            runtime_fs = runtime_filesystems(&client).await;
            let gc = ImageGcManager::with_notices(
                client.clone(),
                ImageGcSettings::from_config(config),
                notices.clone(),
            )
            .context("image GC")?;
            tasks.push(forward_image_gc(
                gc.subscribe(),
                events.clone(),
                Arc::clone(metrics),
            ));
            let task = gc.spawn();
            image_gc = Some((gc, task));
            let rt = CriRuntime::open(CriRuntimeConfig::new(
                client,
                cgroup_root,
                config.state_dir.join("pod-logs"),
            ))
            .await
            .context("CRI runtime")?;
            tasks.push(forward_exits(rt.subscribe_exits(), events.clone()));
            start_pods(rt, cgroups.clone(), plan, config, &devices, &events).await?
        }
        other => anyhow::bail!("runtime.kind {other:?} is not a runtime (process | cri)"),
    };
    events.started();
    if !config.static_pod_path.is_empty() {
        tasks.push(static_pods::watch(
            pods.clone(),
            config.static_pod_path.clone().into(),
        ));
    }
    Ok(NodeParts {
        pods,
        devices,
        image_gc,
        runtime_fs,
        server: None,
        tasks,
    })
}

/// Keeps the node's swap gauges current: read at start and every `interval` (the
/// housekeeping tick's), off the reactor loop, which reads no swap.
fn swap_metrics(
    metrics: Arc<Metrics>,
    interval: std::time::Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut proc = ProcFs::new(PathBuf::from("/proc"));
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            match proc.swap_bytes() {
                Ok(s) => metrics.set_node_swap(s.total, s.used),
                Err(e) => tracing::debug!("swap metrics: {e}"),
            }
        }
    })
}

/// Says once at start that Memory QoS and swap limits are cgroup v2 only, when they are asked
/// for on v1 (the kubelet logs the same and carries on).
fn memory_qos_notice(config: &Config, version: CgroupVersion) {
    if version != CgroupVersion::V1 {
        return;
    }
    if config.memory_qos() {
        tracing::warn!("featureGates.MemoryQoS is on, but Memory QoS (memory.min, memory.high) needs cgroup v2: nothing is written on this v1 node");
    }
    if config.swap_behavior() == SwapBehavior::LimitedSwap {
        tracing::warn!("memorySwap.swapBehavior is LimitedSwap, but swap limits (memory.swap.max) need cgroup v2: no container gets a swap limit on this v1 node");
    }
}

/// The image and container filesystems the runtime reports, for the observer's `imagefs` and
/// `containerfs` (the kubelet learns them the same way). A runtime that cannot say leaves
/// them to the config (`node.imagefsPath`) and nodefs, with a warning.
async fn runtime_filesystems(client: &CriClient) -> (Option<PathBuf>, Option<PathBuf>) {
    match client.image_fs_info().await {
        Ok(info) => (
            info.image_filesystems
                .first()
                .map(|f| f.mount_point.clone()),
            info.container_filesystems
                .first()
                .map(|f| f.mount_point.clone()),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "runtime ImageFsInfo failed: imagefs is node.imagefsPath or nodefs");
            (None, None)
        }
    }
}

impl NodeParts {
    /// Serves the agent API on `apiSocket`: started once the sense layer has attached, so
    /// `reactor status` reports what really listens.
    pub(crate) fn serve_api(
        &mut self,
        config: &Config,
        report: &AttachReport,
        reactor: &ReactorHandle,
        charge: KernelWatch,
    ) -> anyhow::Result<()> {
        let socket = ApiSocket::bind(&config.api_socket)?;
        tracing::info!(socket = %config.api_socket.display(), "serving the agent API");
        let mut sources: Vec<(String, bool, String)> = report
            .attached
            .iter()
            .map(|a| (a.source.to_string(), true, a.what.clone()))
            .collect();
        sources.extend(
            report
                .missing
                .iter()
                .map(|m| (m.source.to_string(), false, m.reason.clone())),
        );
        let facts = NodeFacts {
            sources,
            cgroup_root: config.cgroup_root.clone(),
            pressure: Some(reactor.pressure()),
            charge: Some(charge),
        };
        let service = AgentService::new(self.pods.clone(), Some(Arc::clone(&self.devices)), facts);
        let (stop_server, stopped) = oneshot::channel();
        let server = tokio::spawn(async move {
            if let Err(e) = serve(socket, service, async {
                let _ = stopped.await;
            })
            .await
            {
                tracing::error!("agent API server stopped: {e}");
            }
        });
        self.server = Some((stop_server, server));
        Ok(())
    }
}

/// The pod manager over whichever runtime `runtime.kind` chose.
async fn start_pods<R: Runtime + 'static>(
    runtime: R,
    cgroups: CgroupManager,
    plan: NodePlan,
    config: &Config,
    devices: &Arc<DeviceManager>,
    events: &EventHub,
) -> anyhow::Result<PodManager> {
    PodManager::start(PodManagerConfig {
        runtime: Arc::new(runtime),
        cgroups,
        plan,
        state_dir: config.state_dir.clone(),
        devices: Some(Arc::clone(devices)),
        events: events.clone(),
        orphan_grace_period: config.orphan_grace_period.0,
        dry_run: config.dry_run,
    })
    .await
    .context("pod manager")
}

/// Containers that ended on their own: OOM kills become events.
fn forward_exits(
    mut rx: tokio::sync::broadcast::Receiver<reactor::act::runtime::ContainerExit>,
    events: EventHub,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(exit) if exit.terminated.reason == "OOMKilled" => {
                    events.publish(NodeEventKind::OomKill {
                        pod: exit.pod,
                        container: exit.container,
                        cgroup: exit.cgroup.to_string(),
                    })
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    })
}

/// Counts admissions, rejections and preemptions from the pod manager's events.
fn forward_pod_metrics(
    mut rx: broadcast::Receiver<reactor::node::NodeEvent>,
    metrics: Arc<Metrics>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(e) => match e.kind {
                    NodeEventKind::Admission {
                        admitted, reason, ..
                    } => {
                        let result = if admitted {
                            Admission::Admitted
                        } else {
                            Admission::Rejected
                        };
                        metrics.record_admission(result, &reason);
                    }
                    NodeEventKind::Preemption {
                        victims, dry_run, ..
                    } => {
                        if dry_run {
                            metrics.record_dry_run_preemptions(victims.len() as u64);
                        } else {
                            for _ in victims {
                                metrics.record_preemption();
                            }
                        }
                    }
                    _ => {}
                },
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "pod metrics fell behind the event stream");
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    })
}

/// Image GC outcomes: every round and failure on the event stream (with the kubelet's event
/// reason where it has one), and counted in the metrics.
fn forward_image_gc(
    mut rx: broadcast::Receiver<ImageGcEvent>,
    events: EventHub,
    metrics: Arc<Metrics>,
) -> tokio::task::JoinHandle<()> {
    let trigger_name = |t: GcTrigger| match t {
        GcTrigger::Periodic => "periodic",
        GcTrigger::Reclaim => "reclaim",
    };
    tokio::spawn(async move {
        loop {
            let e = match rx.recv().await {
                Ok(e) => e,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "image GC events fell behind");
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            };
            let reason = e.kubelet_reason().unwrap_or_default().to_string();
            let kind = match e {
                ImageGcEvent::RoundFinished {
                    trigger,
                    freed_bytes,
                    deleted,
                    errors,
                    dry_run,
                    ..
                } => {
                    if dry_run {
                        metrics.record_dry_run_image_deletions(deleted.len() as u64);
                    } else {
                        metrics.record_image_gc(freed_bytes, errors.is_empty());
                    }
                    NodeEventKind::ImageGc {
                        trigger: trigger_name(trigger).to_string(),
                        removed: deleted,
                        freed_bytes,
                        reason,
                        message: errors.join("; "),
                        dry_run,
                    }
                }
                ImageGcEvent::RoundFailed {
                    trigger,
                    reason: why,
                } => {
                    metrics.record_image_gc(0, false);
                    NodeEventKind::ImageGc {
                        trigger: trigger_name(trigger).to_string(),
                        removed: Vec::new(),
                        freed_bytes: 0,
                        reason: "RoundFailed".to_string(),
                        message: why,
                        dry_run: false,
                    }
                }
                ImageGcEvent::FreeDiskSpaceFailed { message }
                | ImageGcEvent::ImageGcFailed { message } => NodeEventKind::ImageGc {
                    trigger: trigger_name(GcTrigger::Periodic).to_string(),
                    removed: Vec::new(),
                    freed_bytes: 0,
                    reason,
                    message,
                    dry_run: false,
                },
            };
            events.publish(kind);
        }
    })
}

impl NodeParts {
    /// The pod manager: the reactor loop evicts through it.
    pub fn pods(&self) -> &PodManager {
        &self.pods
    }

    /// The node-level reclaim the reactor runs before evicting for disk pressure: the image
    /// GC manager's dead-container and unused-image deletion (none without a CRI runtime).
    pub(crate) fn reclaimer(&self) -> Option<Arc<dyn NodeReclaim>> {
        self.image_gc
            .as_ref()
            .map(|(gc, _)| Arc::new(gc.clone()) as Arc<dyn NodeReclaim>)
    }

    /// The runtime's image and container filesystem mount points, when it reports them.
    pub(crate) fn runtime_filesystems(&self) -> (Option<&Path>, Option<&Path>) {
        (self.runtime_fs.0.as_deref(), self.runtime_fs.1.as_deref())
    }

    /// Stops the API server, the image GC loop and the watchers. Pods keep running (a
    /// restarted agent re-adopts them).
    pub async fn stop(self) {
        if let Some((stop, server)) = self.server {
            let _ = stop.send(());
            let _ = server.await;
        }
        if let Some((_, task)) = self.image_gc {
            task.stop().await;
        }
        for t in self.tasks {
            t.abort();
        }
        drop(self.pods);
        drop(self.devices);
    }
}
