//! Command-line front end: parses arguments and hands each subcommand to its module.
//!
//! Exit codes: 0 done, 1 a runtime failure, 2 bad input (arguments, config, JSON), so scripts
//! can tell "you asked wrongly" from "the node said no".

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod client;
mod config;
mod device_metrics;
mod events;
mod failure;
mod logging;
mod node_run;
mod plan;
mod pod;
mod run;
mod sense_args;
mod shutdown;
mod status;
mod watch;

pub(crate) use failure::Failure;

/// A node agent that handles memory, disk and pid pressure by the kubelet's rules,
/// woken by the kernel's own pressure events.
#[derive(Parser)]
#[command(name = "reactor", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the default config or validate a config file.
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// Run the agent: load the config, start the sense layer, log each pressure event with
    /// its detection lag; stops on SIGTERM/SIGINT.
    Run(run::RunArgs),
    /// Print live pressure events from the kernel with their detection lag; on Ctrl-C or
    /// SIGTERM print the lag summary per source (stderr).
    Watch(watch::WatchArgs),
    /// What the agent would decide for a JSON snapshot (no root, no kernel, no runtime).
    #[command(subcommand)]
    Plan(plan::PlanCommand),
    /// Pods on a running agent: apply, rm, ls (over its API socket).
    #[command(subcommand)]
    Pod(pod::PodCommand),
    /// The node as the running agent sees it: signals, sources, allocatable, next to evict.
    Status(status::StatusArgs),
    /// What happens on the node, as it happens (admissions, preemptions, removals, pressure).
    Events(events::EventsArgs),
}

pub(crate) fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Config(cmd) => config::run(cmd),
        Command::Run(args) => run::run(args),
        Command::Watch(args) => watch::run(args),
        Command::Plan(cmd) => plan::run(cmd),
        Command::Pod(cmd) => pod::run(cmd),
        Command::Status(args) => status::run(args),
        Command::Events(args) => events::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Input(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
        Err(Failure::Runtime(e)) => {
            // Each cause once (`human::error_chain`), not anyhow's `{:#}`, which repeats a
            // cause that an error both prints and returns as its source.
            let e: &(dyn std::error::Error + 'static) = e.as_ref();
            eprintln!("error: {}", reactor::human::error_chain(e));
            ExitCode::from(1)
        }
    }
}
