//! `reactor watch`: the sense layer in-process, printing every pressure event as it is taken,
//! with its detection lag, and the lag summary per source on exit.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use reactor::config::Config;
use reactor::human;
use reactor::sense::{Received, Sense};

use super::sense_args::SenseArgs;
use super::shutdown::Shutdown;
use super::Failure;

/// `reactor watch` arguments.
#[derive(Args, Debug)]
pub(crate) struct WatchArgs {
    /// The config file (YAML or JSON); without it, the defaults.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// One JSON object per event and line, instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    sense: SenseArgs,
}

/// Loads the config file if one is given, else the defaults; a bad file is bad input.
pub(crate) fn load_config(path: Option<&PathBuf>) -> Result<Config, Failure> {
    match path {
        None => Ok(Config::default()),
        Some(path) => Config::load(path).map_err(|e| Failure::Input(e.to_string())),
    }
}

/// [`load_config`], also returning the KubeletConfiguration fields the file had that the
/// agent does not use (to be logged once logging is up).
pub(crate) fn load_config_reporting(
    path: Option<&PathBuf>,
) -> Result<(Config, Vec<String>), Failure> {
    match path {
        None => Ok((Config::default(), Vec::new())),
        Some(path) => Config::load_reporting(path).map_err(|e| Failure::Input(e.to_string())),
    }
}

/// A runtime with two workers: the sources are few and mostly asleep.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure::Runtime(anyhow::anyhow!("cannot start the tokio runtime: {e}")))
}

/// Prints events until SIGTERM/SIGINT (or until every source stops), then the lag summary.
pub(crate) fn run(args: WatchArgs) -> Result<(), Failure> {
    let config = load_config(args.config.as_ref())?;
    super::logging::init(&config.log)?;
    let opts = args.sense.options(&config)?;
    runtime()?.block_on(async move {
        let mut shutdown = Shutdown::install()
            .map_err(|e| anyhow::anyhow!("cannot install signal handlers: {e}"))?;
        let mut sense = Sense::start(&opts)?;
        let mut out = std::io::stdout().lock();
        if !args.json {
            writeln!(
                out,
                "{:<14} {:<16} {:<28} {:<50} LAG",
                "MONOTONIC_S", "SOURCE", "CGROUP", "KIND"
            )?;
        }
        loop {
            let received = tokio::select! {
                biased;
                _ = shutdown.wait() => break,
                received = sense.next() => received,
            };
            let Some(received) = received else {
                tracing::warn!("every sense source stopped");
                break;
            };
            print_event(&mut out, &received, args.json)?;
        }
        drop(out);
        let lag = sense.shutdown().await;
        let mut err = std::io::stderr().lock();
        writeln!(err, "detection lag per source:")?;
        let snapshots = lag.snapshot();
        if snapshots.is_empty() {
            writeln!(err, "  (no events)")?;
        }
        for snapshot in snapshots {
            writeln!(err, "  {snapshot}")?;
        }
        Ok(())
    })
}

fn print_event(out: &mut impl Write, r: &Received, json: bool) -> Result<(), Failure> {
    if json {
        serde_json::to_writer(&mut *out, r)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "{:<14.6} {:<16} {:<28} {:<50} {}",
            r.event.at_ns as f64 / 1e9,
            r.event.source.name(),
            r.event.cgroup.as_deref().unwrap_or("-"),
            r.event.kind.to_string(),
            human::duration_ns(r.lag_ns)
        )?;
    }
    out.flush()?;
    Ok(())
}
