//! `reactor plan <what> --input FILE`: what the agent would decide for a JSON snapshot.
//!
//! Each plan is one variant here and one module beside this file; the library does the work
//! (`reactor::plan::<what>::run(bytes)`), this front end only reads the file, prints the
//! answer and maps a bad document to exit 2. Adding a plan: one variant, one match arm.

use clap::Subcommand;

use super::Failure;

mod cgroups;
mod evict;
mod image_gc;
mod input_args;
mod preempt;
mod pressure;

pub(crate) use input_args::InputArgs;

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

pub(crate) fn run(cmd: PlanCommand) -> Result<(), Failure> {
    match cmd {
        PlanCommand::Cgroups(args) => cgroups::run(&args),
        PlanCommand::Preempt(args) => preempt::run(&args),
        PlanCommand::Evict(args) => evict::run(&args),
        PlanCommand::Pressure(args) => pressure::run(&args),
        PlanCommand::ImageGc(args) => image_gc::run(&args),
    }
}
