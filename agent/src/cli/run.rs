//! `reactor run`: the agent. It loads and checks the config, serves the Prometheus metrics,
//! starts the pod side (devices, runtime, pods, image GC), the sense layer and the reactor
//! loop (`reactor::reactor`: observe, decide, act on every pressure event), then the agent
//! API. It stops cleanly on SIGTERM/SIGINT; pods keep running and a restarted agent
//! re-adopts them.
//!
//! **Data flow.** The reactor loop owns the sense layer. Every event it receives is handed
//! to a tap that only queues it; a recorder task off the hot path counts it in the metrics,
//! puts it on the event stream and logs it. The loop's decisions (evictions, kernel OOM
//! kills) go to the event stream from a second task, and the loop keeps the signal,
//! condition, eviction and reaction-lag metrics itself.
//!
//! **Metrics.** With a non-empty `metricsAddress`, `/metrics` and `/healthz` are served
//! there (see `reactor::record::metrics`). Every sense event is counted by source and kind
//! with its detection lag, ring-buffer drops are added up, and kernel OOM kills are counted
//! once each: from the eBPF `oom:mark_victim` program when it is attached (node-wide), else
//! from the memcg notifications (the watched cgroups only).
//!
//! **Logs** (stderr; `log.format` or `--log-format`: plain or JSON). One line per pressure
//! event, message `pressure event`, with these fields:
//!
//! | field | meaning |
//! | --- | --- |
//! | `source` | the sense source: `ebpf`, `psi`, `memcg-threshold`, `poll` |
//! | `cgroup` | the cgroup (path in the memory hierarchy), `-` for node-wide events |
//! | `kind` | what happened, on one line (`oom-kill pid=… comm=…`, `psi-trigger some …`) |
//! | `at_ns` | `CLOCK_MONOTONIC` ns of the event (the kernel's own timestamp where it has one) |
//! | `lag` | the detection lag for people (`12.3µs`) |
//! | `lag_ns` | the detection lag in nanoseconds, for machines |
//!
//! The housekeeping tick is logged at debug with `source`, `lag` and `lag_ns`, message `tick`.
//! Each evaluation that found a threshold met, changed a condition or acted is one line,
//! message `eviction decision` (see `reactor::reactor::decision`), and each kernel OOM kill the
//! agent did not prevent is one such line with an `OOMKilled` action.
//! Other lines: `sense source attached` (`source`, `what`), `sense source missing`
//! (`source`, `reason`), `metrics endpoint listening` (`address`), `reactor running`
//! (`pid`), and at the end one `detection lag` line per source (`count`, `p50_ns`,
//! `p99_ns`, `max_ns`) and `stopped`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use reactor::decide::signal::NodeCondition;
use reactor::human;
use reactor::node::{EventHub, NodeEventKind};
use reactor::observe::{ObserveSettings, Observer};
use reactor::reactor::thread::LoopThread;
use reactor::reactor::{
    concerns_node, memcg_targets, Action, Decision, NodePressure, Reactor, ReactorSettings,
};
use reactor::record::metrics::serve::{parse_address, MetricsServer};
use reactor::record::metrics::Metrics;
use reactor::sense::{AttachReport, Kind, Received, Source};
use tokio::sync::{broadcast, mpsc};

use super::logging::LogFormat;
use super::sense_args::SenseArgs;
use super::shutdown::Shutdown;
use super::watch::{load_config_reporting, runtime};
use super::Failure;

/// How long the metrics endpoint may take to finish its connections at shutdown.
const METRICS_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Sense events queued between the loop's tap and the recorder; beyond this the recorder is
/// hopelessly behind and events are counted as not recorded rather than held in memory.
const RECORD_QUEUE: usize = 8192;

/// `reactor run` arguments.
#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// The config file (YAML or JSON); without it, the defaults.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The log format (overrides `log.format`).
    #[arg(long, value_enum, value_name = "FORMAT")]
    log_format: Option<LogFormat>,
    /// Observe and decide, record every eviction, preemption and image deletion the agent
    /// would make, and make none (sets `dryRun: true`).
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    sense: SenseArgs,
}

/// Runs the agent until SIGTERM/SIGINT. Bad config or flags exit 2 before anything attaches;
/// a node where no sense source can start, or a metrics address that cannot be bound, exits 1
/// naming the reason.
pub(crate) fn run(args: RunArgs) -> Result<(), Failure> {
    // Everything that can be wrong with the input is found before anything attaches.
    let (mut config, ignored) = load_config_reporting(args.config.as_ref())?;
    config.dry_run |= args.dry_run;
    let mut log = config.log.clone();
    if let Some(format) = args.log_format {
        log.format = format.as_str().to_string();
    }
    super::logging::init(&log)?;
    if !ignored.is_empty() {
        tracing::info!(keys = %ignored.join(","), "KubeletConfiguration fields not used by the agent, ignored");
    }
    match reactor::limits::raise_open_files() {
        Ok((was, now)) if now > was => tracing::info!(
            was,
            now,
            "open-file limit raised to the hard limit (the observer keeps each pod's and \
             container's memory files open)"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "the open-file limit is left as it is"),
    }
    if config.dry_run {
        tracing::warn!(
            "dry run: the agent observes and decides, and records every eviction, preemption \
             and image deletion it would make; it kills, stops and deletes nothing"
        );
    }
    let mut opts = args.sense.options(&config)?;
    let settings = ReactorSettings::from_config(&config)
        .map_err(|e| Failure::Input(format!("eviction thresholds: {e}")))?;
    // The reactor loop's thread alone runs at `realtimePriority` (`reactor::thread`); every
    // other agent thread keeps normal scheduling. Real-time API threads under load would
    // take both CPUs of a small node from the kernel's own workers (cgroup removal, RCU),
    // and the loop then waits in the kernel behind locks those starved workers hold: with
    // 50 API clients on 2 cores that put the reaction's p99 at 3 ms against 1.4 ms.
    if config.realtime_priority > 0 {
        tracing::info!(
            loop_priority = config.realtime_priority,
            "the reactor loop's thread on SCHED_FIFO (the agent's other threads and the pods \
             keep normal scheduling)"
        );
    }
    let loop_thread = LoopThread::start(config.realtime_priority).map_err(|e| {
        Failure::Runtime(anyhow::anyhow!(
            "cannot start the reactor loop's thread: {e}"
        ))
    })?;
    if let Err(e) = reactor::priority::set_normal() {
        tracing::warn!(error = %e, "the main thread keeps the scheduling it was started with");
    }
    let metrics_address = match config.metrics_address.as_str() {
        "" => None,
        text => Some(parse_address(text).map_err(|e| Failure::Input(e.to_string()))?),
    };
    runtime()?.block_on(async move {
        let mut shutdown = Shutdown::install()
            .map_err(|e| anyhow::anyhow!("cannot install signal handlers: {e}"))?;
        let metrics = Arc::new(Metrics::new());
        metrics.set_dry_run(config.dry_run);
        // Bound before anything else starts, so a taken port fails the start at once.
        let endpoint = match metrics_address {
            Some(address) => Some(start_endpoint(address, &metrics, &shutdown).await?),
            None => {
                tracing::info!("metrics endpoint off (metricsAddress is empty)");
                None
            }
        };
        let mut node = super::node_run::start(&config, &metrics).await?;
        let (imagefs, containerfs) = node.runtime_filesystems();
        let observe = ObserveSettings::from_config(&config, imagefs, containerfs)
            .map_err(|e| Failure::Input(e.to_string()))?;
        let observer = Observer::new(observe).map_err(|e| anyhow::anyhow!("observer: {e}"))?;
        if !args.sense.explicit_targets() {
            let targets = memcg_targets(&settings, &observer);
            if !targets.is_empty() {
                opts.targets = targets;
            }
        }
        let sense = loop_thread.start_sense(&opts)?;
        for source in Source::ALL {
            metrics.set_source_attached(source, sense.report().has(source));
        }
        let events = node.pods().events().clone();
        let (tap_tx, tap_rx) = mpsc::channel::<Received>(RECORD_QUEUE);
        let recorder = tokio::spawn(record_events(
            tap_rx,
            Arc::clone(&metrics),
            events.clone(),
            oom_kill_source(sense.report()),
            settings.cgroup_root.clone(),
        ));
        let reactor = Reactor::new(
            settings,
            observer,
            Arc::new(node.pods().clone()),
            node.pods().cgroups().clone(),
            node.reclaimer(),
        )
        .with_metrics(Arc::clone(&metrics))
        .with_tap(move |r| {
            // Never blocks the loop: a full queue means the recorder is far behind.
            if tap_tx.try_send(r.clone()).is_err() {
                tracing::debug!("sense event not recorded: recorder queue full");
            }
        });
        let handle = reactor.handle();
        node.serve_api(&config, sense.report(), &handle, sense.kernel_watch())?;
        let conditions = tokio::spawn(forward_conditions(handle.pressure(), events.clone()));
        let forwarder = tokio::spawn(forward_decisions(handle.subscribe(), events));
        let (_, mut task) = loop_thread.spawn(reactor, sense, shutdown.subscribe());
        tracing::info!(pid = std::process::id(), "reactor running");
        let sense = tokio::select! {
            biased;
            _ = shutdown.wait() => (&mut task).await,
            done = &mut task => {
                tracing::warn!("every sense source stopped");
                done
            }
        };
        forwarder.abort();
        conditions.abort();
        let _ = recorder.await;
        node.stop().await;
        match sense {
            Ok(sense) => {
                let lag = sense.shutdown().await;
                for s in lag.snapshot() {
                    tracing::info!(source = %s.source, count = s.count, p50 = %human::duration_ns(s.p50_ns), p99 = %human::duration_ns(s.p99_ns), max = %human::duration_ns(s.max_ns), p50_ns = s.p50_ns, p99_ns = s.p99_ns, max_ns = s.max_ns, "detection lag");
                }
            }
            Err(e) => tracing::error!(error = %e, "reactor loop task failed"),
        }
        if let Some(endpoint) = endpoint {
            endpoint.stop().await;
        }
        tracing::info!("stopped");
        Ok(())
    })
}

/// The recorder: every sense event the loop received is counted (by source and kind, with
/// its detection lag); the events that concern this node (below `cgroup_root`, or
/// node-wide) are put on the event stream and logged, their kernel OOM kills counted once
/// each (see [`oom_kill_source`]), and the rest of the machine's logged only at debug. Ends when the loop
/// drops its tap.
async fn record_events(
    mut rx: mpsc::Receiver<Received>,
    metrics: Arc<Metrics>,
    events: EventHub,
    oom_source: Option<Source>,
    cgroup_root: String,
) {
    while let Some(r) = rx.recv().await {
        metrics.record_event(&r);
        let e = &r.event;
        let cgroup = e.cgroup.as_deref().unwrap_or("-");
        if !concerns_node(&cgroup_root, e) {
            tracing::debug!(source = %e.source, cgroup, kind = %e.kind, lag_ns = r.lag_ns, "pressure event outside cgroupRoot");
            continue;
        }
        if matches!(e.kind, Kind::OomKill { .. }) && Some(e.source) == oom_source {
            metrics.record_oom_kill();
        }
        events.publish(NodeEventKind::Pressure {
            source: e.source.to_string(),
            cgroup: e.cgroup.clone().unwrap_or_default(),
            kind: e.kind.to_string(),
            at_monotonic_ns: e.at_ns,
            lag_ns: r.lag_ns,
        });
        // The tick carries no news; it is logged at debug so an idle node stays quiet.
        if e.kind == Kind::Tick {
            tracing::debug!(source = %e.source, lag = %human::duration_ns(r.lag_ns), lag_ns = r.lag_ns, "tick");
        } else {
            tracing::info!(source = %e.source, cgroup, kind = %e.kind, at_ns = e.at_ns, lag = %human::duration_ns(r.lag_ns), lag_ns = r.lag_ns, "pressure event");
        }
    }
}

/// Node condition changes on the event stream and in the log, with the kubelet's reason and
/// message, and for a PSI condition (KEP-5394) the figure and threshold it was set on, as
/// the KEP asks of the event ("record the reasons (based on PSI data)"). A condition starts
/// False; only a change makes an event. Ends when the loop ends.
async fn forward_conditions(
    mut rx: tokio::sync::watch::Receiver<Option<NodePressure>>,
    events: EventHub,
) {
    let mut was: Vec<(NodeCondition, bool)> = Vec::new();
    while rx.changed().await.is_ok() {
        let mut changed = Vec::new();
        if let Some(p) = rx.borrow_and_update().as_ref() {
            for c in &p.conditions {
                let before = match was.iter_mut().find(|(k, _)| *k == c.condition) {
                    Some((_, on)) => std::mem::replace(on, c.on),
                    None => {
                        was.push((c.condition, c.on));
                        false
                    }
                };
                if before == c.on {
                    continue;
                }
                let mut message = c.message().to_string();
                if let Some(f) = p.psi.iter().find(|f| f.condition == c.condition) {
                    match f.full {
                        Some(a) => message.push_str(&format!(
                            " ({} full avg10 {:.2}, avg60 {:.2}; threshold {})",
                            f.source, a.avg10, a.avg60, f.threshold
                        )),
                        None => message.push_str(&format!(" ({} not read)", f.source)),
                    }
                }
                changed.push((c.condition, c.on, c.reason(), message));
            }
        }
        for (condition, on, reason, message) in changed {
            tracing::info!(condition = condition.name(), status = on, reason, message = %message, "node condition");
            events.publish(NodeEventKind::Condition {
                condition: condition.name().to_string(),
                on,
                reason: reason.to_string(),
                message,
            });
        }
    }
}

/// The loop's evictions (and the memory reclaims before them) on the event stream, with the kubelet's message and the reaction
/// time (kernel OOM kills reach the stream from the runtime, which knows the container).
async fn forward_decisions(mut rx: broadcast::Receiver<Decision>, events: EventHub) {
    loop {
        let d = match rx.recv().await {
            Ok(d) => d,
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(
                    missed = n,
                    "eviction decisions fell behind the event stream"
                );
                continue;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if let Some(m) = &d.memory_reclaim {
            events.publish(NodeEventKind::MemoryReclaim {
                signal: m.signal.clone(),
                cgroup: m.cgroup.clone(),
                outcome: m.outcome.clone(),
                shortfall_bytes: m.shortfall_bytes,
                active_file_bytes: m.active_file_bytes,
                requested_bytes: m.requested_bytes,
                freed_bytes: m.freed_bytes,
                steps: m.steps,
                took_ns: m.took_ns,
                error: m.error.clone().unwrap_or_default(),
            });
        }
        // A victim past its bound, still holding memory: said on the stream, since the
        // next eviction (if any) is because of it.
        if let Action::Released {
            uid,
            pod,
            released: false,
            pending_bytes,
            ..
        } = &d.action
        {
            events.publish(NodeEventKind::Recovery {
                action: "eviction-pending".to_string(),
                file: String::new(),
                pod: pod.clone(),
                uid: uid.clone(),
                message: format!(
                    "not gone past its bound after the kill, still holding {}; the next pod is evicted if a threshold is still met",
                    reactor::human::bytes(i128::from(pending_bytes.unwrap_or(0)))
                ),
            });
        }
        if let Action::WouldEvict {
            uid,
            pod,
            signal,
            grace_seconds,
            message,
            ..
        } = &d.action
        {
            events.publish(NodeEventKind::Eviction {
                pod: pod.clone(),
                uid: uid.clone(),
                signal: signal.clone(),
                message: message.clone(),
                grace_period_seconds: *grace_seconds,
                reaction_ns: -1,
                killed_at_crossing: None,
                dry_run: true,
                escalated: false,
            });
        }
        if let Action::Evicted {
            uid,
            pod,
            signal,
            grace_seconds,
            message,
            error: None,
            escalated,
            ..
        } = d.action
        {
            events.publish(NodeEventKind::Eviction {
                pod,
                uid,
                signal,
                message,
                grace_period_seconds: grace_seconds,
                reaction_ns: d
                    .reaction_lag_ns
                    .map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX)),
                killed_at_crossing: d.killed_at_crossing,
                dry_run: false,
                escalated,
            });
        }
    }
}

/// The running metrics endpoint and the means to stop it.
struct Endpoint {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), reactor::record::metrics::serve::ServeError>>,
}

/// Binds `metricsAddress` and serves until the shutdown signal or [`Endpoint::stop`].
async fn start_endpoint(
    address: SocketAddr,
    metrics: &Arc<Metrics>,
    shutdown: &Shutdown,
) -> Result<Endpoint, Failure> {
    let server = MetricsServer::bind(address)
        .await
        .map_err(|e| Failure::Runtime(e.into()))?;
    tracing::info!(address = %server.local_addr(), "metrics endpoint listening");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut signal = shutdown.subscribe();
    let task = tokio::spawn(server.serve(Arc::clone(metrics), async move {
        tokio::select! {
            _ = signal.wait_for(|&down| down) => {}
            _ = stopped => {}
        }
    }));
    Ok(Endpoint { stop, task })
}

impl Endpoint {
    /// Stops serving (the agent is stopping for another reason than the signal, or after it)
    /// and waits a bounded time for the connections in flight.
    async fn stop(self) {
        let _ = self.stop.send(());
        match tokio::time::timeout(METRICS_STOP_TIMEOUT, self.task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::error!(error = %e, "metrics endpoint failed"),
            Ok(Err(e)) => tracing::error!(error = %e, "metrics endpoint task failed"),
            Err(_) => tracing::warn!("metrics endpoint still had connections open at shutdown"),
        }
    }
}

/// Which source's `OomKill` events count as kernel OOM kills, so that one kill reported by
/// both eBPF and a memcg notification is counted once: eBPF when its `oom:mark_victim`
/// program attached (it sees every kill on the node), else the memcg notifications.
fn oom_kill_source(report: &AttachReport) -> Option<Source> {
    let mark_victim_missing = report
        .missing
        .iter()
        .any(|m| m.source == Source::Ebpf && m.reason.starts_with("oom_mark_victim:"));
    if report.has(Source::Ebpf) && !mark_victim_missing {
        Some(Source::Ebpf)
    } else if report.has(Source::MemcgThreshold) {
        Some(Source::MemcgThreshold)
    } else {
        None
    }
}
