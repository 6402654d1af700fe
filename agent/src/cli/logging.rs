//! Logging for the long-running commands: plain or JSON lines on stderr, filtered by the
//! config's `log.level`. Only the binary installs a subscriber; the library emits events.
//!
//! Every line is an event with structured fields (`source=psi lag_ns=1234` in plain text,
//! `{"timestamp":…,"level":"INFO","fields":{"message":…,"source":"psi","lag_ns":1234},
//! "target":…}` in JSON), so a log pipeline can filter on the fields rather than parse text.

use clap::ValueEnum;
use reactor::config::LogConfig;
use tracing_subscriber::EnvFilter;

use super::Failure;

/// `--log-format`: the config's `log.format` values, for a flag that overrides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines: time, level, message, `key=value` fields.
    Plain,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// The config's spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LogFormat::Plain => "plain",
            LogFormat::Json => "json",
        }
    }
}

/// Installs the global subscriber. A level the filter syntax refuses is bad config (exit 2).
pub(crate) fn init(log: &LogConfig) -> Result<(), Failure> {
    let filter = EnvFilter::builder().parse(&log.level).map_err(|e| {
        Failure::Input(format!(
            "config key log.level: {:?} is not a level or filter: {e}",
            log.level
        ))
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let installed = match log.format.as_str() {
        "json" => builder.json().try_init(),
        _ => builder.try_init(),
    };
    installed.map_err(|e| Failure::Runtime(anyhow::anyhow!("cannot install the logger: {e}")))
}
