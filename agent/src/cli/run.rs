//! `reactor run`: the agent. For now it loads and checks the config, starts the sense layer
//! and logs every pressure event with its detection lag; the reactor loop (observe, decide,
//! act) joins in a later issue. It stops cleanly on SIGTERM/SIGINT.

use std::path::PathBuf;

use clap::Args;
use reactor::sense::lag::format_ns;
use reactor::sense::{Kind, Sense};

use super::sense_args::SenseArgs;
use super::shutdown::Shutdown;
use super::watch::{load_config, runtime};
use super::Failure;

/// `reactor run` arguments.
#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// The config file (YAML or JSON); without it, the defaults.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    sense: SenseArgs,
}

/// Runs the agent until SIGTERM/SIGINT. Bad config or flags exit 2 before anything attaches;
/// a node where no sense source can start exits 1 naming every reason.
pub(crate) fn run(args: RunArgs) -> Result<(), Failure> {
    // Everything that can be wrong with the input is found before anything attaches.
    let config = load_config(args.config.as_ref())?;
    super::logging::init(&config.log)?;
    let opts = args.sense.options(&config)?;
    runtime()?.block_on(async move {
        let mut shutdown = Shutdown::install()
            .map_err(|e| anyhow::anyhow!("cannot install signal handlers: {e}"))?;
        let mut sense = Sense::start(&opts)?;
        let node = super::node_run::start(&config, sense.report()).await?;
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
            node.publish_pressure(&r);
            let e = &r.event;
            let cgroup = e.cgroup.as_deref().unwrap_or("-");
            // The tick carries no news; it is logged at debug so an idle node stays quiet.
            if e.kind == Kind::Tick {
                tracing::debug!(source = %e.source, lag = %format_ns(r.lag_ns), lag_ns = r.lag_ns, "tick");
            } else {
                tracing::info!(source = %e.source, cgroup, kind = %e.kind, lag = %format_ns(r.lag_ns), lag_ns = r.lag_ns, "pressure event");
            }
        }
        node.stop().await;
        let lag = sense.shutdown().await;
        for s in lag.snapshot() {
            tracing::info!(source = %s.source, count = s.count, p50_ns = s.p50_ns, p99_ns = s.p99_ns, max_ns = s.max_ns, "detection lag");
        }
        tracing::info!("stopped");
        Ok(())
    })
}
