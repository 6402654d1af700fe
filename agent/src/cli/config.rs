//! `reactor config`: the default config, and validation of a config file before it is used.

use std::path::PathBuf;

use clap::Subcommand;
use reactor::config::Config;

use super::Failure;

/// Config subcommands.
#[derive(Subcommand)]
pub(crate) enum ConfigCommand {
    /// Print the full default config (every key, with its default).
    Defaults,
    /// Validate a config file; exits 2 with the key path and reason when it is bad.
    Check {
        /// The config file (YAML or JSON).
        file: PathBuf,
    },
}

pub(crate) fn run(cmd: ConfigCommand) -> Result<(), Failure> {
    match cmd {
        ConfigCommand::Defaults => {
            print!("{}", Config::default().to_yaml());
            Ok(())
        }
        ConfigCommand::Check { file } => {
            let (_, ignored) =
                Config::load_reporting(&file).map_err(|e| Failure::Input(e.to_string()))?;
            println!("{}: ok", file.display());
            if !ignored.is_empty() {
                println!(
                    "KubeletConfiguration fields not used by the agent (ignored): {}",
                    ignored.join(", ")
                );
            }
            Ok(())
        }
    }
}
