//! `reactor run`: the agent. For now it loads and checks the config, starts the sense layer,
//! serves the Prometheus metrics and logs every pressure event with its detection lag; the
//! reactor loop (observe, decide, act) joins in a later issue. It stops cleanly on
//! SIGTERM/SIGINT.
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
//! Other lines: `sense source attached` (`source`, `what`), `sense source missing`
//! (`source`, `reason`), `metrics endpoint listening` (`address`), `reactor running`
//! (`pid`), and at the end one `detection lag` line per source (`count`, `p50_ns`,
//! `p99_ns`, `max_ns`) and `stopped`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use reactor::record::metrics::serve::{parse_address, MetricsServer};
use reactor::record::metrics::Metrics;
use reactor::sense::lag::format_ns;
use reactor::sense::{AttachReport, Kind, Sense, Source};

use super::logging::LogFormat;
use super::sense_args::SenseArgs;
use super::shutdown::Shutdown;
use super::watch::{load_config, runtime};
use super::Failure;

/// How long the metrics endpoint may take to finish its connections at shutdown.
const METRICS_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// `reactor run` arguments.
#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// The config file (YAML or JSON); without it, the defaults.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The log format (overrides `log.format`).
    #[arg(long, value_enum, value_name = "FORMAT")]
    log_format: Option<LogFormat>,
    #[command(flatten)]
    sense: SenseArgs,
}

/// Runs the agent until SIGTERM/SIGINT. Bad config or flags exit 2 before anything attaches;
/// a node where no sense source can start, or a metrics address that cannot be bound, exits 1
/// naming the reason.
pub(crate) fn run(args: RunArgs) -> Result<(), Failure> {
    // Everything that can be wrong with the input is found before anything attaches.
    let config = load_config(args.config.as_ref())?;
    let mut log = config.log.clone();
    if let Some(format) = args.log_format {
        log.format = format.as_str().to_string();
    }
    super::logging::init(&log)?;
    let opts = args.sense.options(&config)?;
    let metrics_address = match config.metrics_address.as_str() {
        "" => None,
        text => Some(parse_address(text).map_err(|e| Failure::Input(e.to_string()))?),
    };
    runtime()?.block_on(async move {
        let mut shutdown = Shutdown::install()
            .map_err(|e| anyhow::anyhow!("cannot install signal handlers: {e}"))?;
        let metrics = Arc::new(Metrics::new());
        // Bound before the sense layer attaches, so a taken port fails the start at once.
        let endpoint = match metrics_address {
            Some(address) => Some(start_endpoint(address, &metrics, &shutdown).await?),
            None => {
                tracing::info!("metrics endpoint off (metricsAddress is empty)");
                None
            }
        };
        let mut sense = Sense::start(&opts)?;
        for source in Source::ALL {
            metrics.set_source_attached(source, sense.report().has(source));
        }
        let oom_source = oom_kill_source(sense.report());
        let node = super::node_run::start(&config, sense.report(), &metrics).await?;
        tracing::info!(pid = std::process::id(), "reactor running");
        loop {
            let received = tokio::select! {
                biased;
                _ = shutdown.wait() => break,
                received = sense.next() => received,
            };
            let Some(r) = received else {
                tracing::warn!("every sense source stopped");
                break;
            };
            metrics.record_event(&r);
            node.publish_pressure(&r);
            let e = &r.event;
            if matches!(e.kind, Kind::OomKill { .. }) && Some(e.source) == oom_source {
                metrics.record_oom_kill();
            }
            let cgroup = e.cgroup.as_deref().unwrap_or("-");
            // The tick carries no news; it is logged at debug so an idle node stays quiet.
            if e.kind == Kind::Tick {
                tracing::debug!(source = %e.source, lag = %format_ns(r.lag_ns), lag_ns = r.lag_ns, "tick");
            } else {
                tracing::info!(source = %e.source, cgroup, kind = %e.kind, at_ns = e.at_ns, lag = %format_ns(r.lag_ns), lag_ns = r.lag_ns, "pressure event");
            }
        }
        node.stop().await;
        let lag = sense.shutdown().await;
        for s in lag.snapshot() {
            tracing::info!(source = %s.source, count = s.count, p50_ns = s.p50_ns, p99_ns = s.p99_ns, max_ns = s.max_ns, "detection lag");
        }
        if let Some(endpoint) = endpoint {
            endpoint.stop().await;
        }
        tracing::info!("stopped");
        Ok(())
    })
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
