//! `reactor plan preempt`: critical-pod admission preemption for a snapshot.

use super::{Failure, InputArgs};

pub(super) fn run(args: &InputArgs) -> Result<(), Failure> {
    args.answer(reactor::plan::preempt::run)
}
