//! `reactor plan <what> --input FILE`: what the agent would decide for a JSON snapshot.
//!
//! Each plan is one variant here and one module beside this file; the library does the work
//! (`reactor::plan::<what>::run(bytes)`), this front end only reads the file, prints the
//! answer and maps a bad document to exit 2. Adding a plan: one variant, one match arm.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use reactor::plan::input::{read_input, render, InputError};
use serde::Serialize;

use super::Failure;

mod cgroups;
mod evict;
mod image_gc;
mod preempt;
mod pressure;

/// Plans, one per decision the agent takes.
#[derive(Subcommand)]
pub(crate) enum PlanCommand {
    /// The cgroup values the kubelet would write for a node and its pods (v1 or v2).
    Cgroups(InputArgs),
    /// Whether a pod that failed admission gets in by preempting others, and whom.
    Preempt(InputArgs),
    /// The order in which pods would be evicted for a signal, first to go first.
    Evict(InputArgs),
    /// Thresholds met, node conditions and what to reclaim, over a series of observations.
    Pressure(InputArgs),
    /// Which unused images one image-GC round would delete, and why it could not free more.
    ImageGc(InputArgs),
}

/// Where the snapshot comes from and how to print the answer.
#[derive(Args)]
pub(crate) struct InputArgs {
    /// The JSON snapshot; `-` reads stdin.
    #[arg(long, value_name = "FILE")]
    input: PathBuf,
    /// Print the answer on one line instead of indented.
    #[arg(long)]
    compact: bool,
}

impl InputArgs {
    /// Reads the snapshot, runs `plan` on it and prints the answer on stdout.
    fn answer<T: Serialize>(
        &self,
        plan: impl FnOnce(&[u8]) -> Result<T, InputError>,
    ) -> Result<(), Failure> {
        let bytes = read_input(&self.input).map_err(|e| Failure::Input(e.to_string()))?;
        let answer = plan(&bytes).map_err(|e| Failure::Input(e.to_string()))?;
        println!("{}", render(&answer, !self.compact));
        Ok(())
    }
}

pub(crate) fn run(cmd: PlanCommand) -> Result<(), Failure> {
    match cmd {
        PlanCommand::Cgroups(args) => cgroups::run(&args),
        PlanCommand::Preempt(args) => preempt::run(&args),
        PlanCommand::Evict(args) => evict::run(&args),
        PlanCommand::Pressure(args) => pressure::run(&args),
        PlanCommand::ImageGc(args) => image_gc::run(&args),
    }
}
