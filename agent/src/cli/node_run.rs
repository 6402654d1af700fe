//! The pod side of `reactor run`: device manager, pod manager (with its runtime and the
//! static-pod watcher) and the API server, started after the sense layer and stopped before
//! it. Kept apart from `run.rs` so the agent's main loop only gains three calls.

use std::path::Path;
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
use reactor::devices::{DeviceManager, DeviceManagerConfig};
use reactor::node::manager::PodManagerConfig;
use reactor::node::{static_pods, EventHub, NodeEventKind, NodePlan, PodManager};
use reactor::record::metrics::Metrics;
use reactor::sense::{AttachReport, Received};
use tokio::sync::oneshot;

/// The running pod side.
pub(crate) struct NodeParts {
    pods: PodManager,
    devices: Arc<DeviceManager>,
    stop_server: oneshot::Sender<()>,
    server: tokio::task::JoinHandle<()>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts the device manager, the runtime `runtime.kind` names, the pod manager (which
/// re-adopts what its checkpoint and the runtime know), the static-pod watcher and the API
/// server on `apiSocket`. The device gauges in `metrics` follow the device manager.
pub(crate) async fn start(
    config: &Config,
    report: &AttachReport,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<NodeParts> {
    let devices = Arc::new(
        DeviceManager::start(DeviceManagerConfig::from_config(config))
            .await
            .context("device manager")?,
    );
    let device_metrics = super::device_metrics::spawn(&devices, metrics);
    let cgroups =
        CgroupManager::from_config(config, Path::new(DEFAULT_MOUNT_ROOT)).context("cgroupRoot")?;
    let plan = NodePlan::from_config(config, cgroups.version()).map_err(anyhow::Error::msg)?;
    let events = EventHub::new();
    let mut tasks = vec![device_metrics];
    let pods = match config.runtime.kind.as_str() {
        "process" => {
            let rt = ProcessRuntime::open(ProcessRuntimeConfig {
                cgroups: cgroups.clone(),
                state_dir: config.state_dir.clone(),
                backoff: BackOffPolicy::default(),
            })
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
    if !config.static_pod_path.is_empty() {
        tasks.push(static_pods::watch(
            pods.clone(),
            config.static_pod_path.clone().into(),
        ));
    }
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
        eviction_hard: config
            .eviction_hard
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        cgroup_root: config.cgroup_root.clone(),
    };
    let service = AgentService::new(pods.clone(), Some(Arc::clone(&devices)), facts);
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
    Ok(NodeParts {
        pods,
        devices,
        stop_server,
        server,
        tasks,
    })
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

impl NodeParts {
    /// The pod manager, for the reactor loop (list pods with QoS/cgroup/requests/priority,
    /// evict one with a status, publish eviction events).
    #[expect(dead_code, reason = "the reactor loop (branch `loop`) is its caller")]
    pub(crate) fn pods(&self) -> &PodManager {
        &self.pods
    }

    /// Puts a pressure event on the event stream.
    pub(crate) fn publish_pressure(&self, r: &Received) {
        let e = &r.event;
        self.pods.events().publish(NodeEventKind::Pressure {
            source: e.source.to_string(),
            cgroup: e.cgroup.clone().unwrap_or_default(),
            kind: e.kind.to_string(),
            at_monotonic_ns: e.at_ns,
            lag_ns: r.lag_ns,
        });
    }

    /// Stops the API server and the watchers. Pods keep running (a restarted agent
    /// re-adopts them).
    pub(crate) async fn stop(self) {
        let _ = self.stop_server.send(());
        let _ = self.server.await;
        for t in self.tasks {
            t.abort();
        }
        drop(self.pods);
        drop(self.devices);
    }
}
