//! `cargo xtask chaos`: a seeded mix of pods, pressure and agent crashes against a real
//! `reactor run` on the real kernel, with the invariants of docs/reliability.md checked
//! throughout (issue 41).
//!
//! The run owns everything it makes: a [`TestAgent`](crate::agent::TestAgent) (its temp dir, its own cgroup root in
//! every v1 hierarchy, or in the v2 guest in the unified one, and a modelled node, 768 MiB
//! here ([`HOST`]) and 384 MiB in the guest ([`GUEST`]), whose `kubepods` gets that limit,
//! so memory pressure never reaches the machine), a directory on the real disk for
//! page-cache writers, and a 64 MiB tmpfs that is the agent's nodefs. The schedule is drawn from the seed alone
//! ([`schedule::schedule`]); what the node does with it is checked by [`check`]. Processes
//! are ended only by pid (the agent's, and on drop whatever is left in the run's cgroups).

pub mod check;
mod node;
pub mod pods;
mod report;
mod run;
pub mod schedule;

pub use node::{Model, GUEST, HOST};
pub use run::{run, Options, Outcome};

use schedule::{PodPlan, Work};

/// MiB a pod allocates while it ramps up and how fast (MiB/s, 0: as fast as it can), for
/// the OOM excuses; `None` for pods whose memory is small or reclaimable.
pub fn ramp(plan: &PodPlan) -> Option<(u64, u64)> {
    match plan.work {
        Work::Hog { mib, rate, .. } => Some((mib, rate)),
        Work::MultiHog { procs, mib, rate } => Some((procs * mib, procs * rate)),
        _ => None,
    }
}
