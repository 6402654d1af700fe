//! Logging for the long-running commands: plain or JSON lines on stderr, filtered by the
//! config's `log.level`. Only the binary installs a subscriber; the library emits events.

use reactor::config::LogConfig;
use tracing_subscriber::EnvFilter;

use super::Failure;

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
