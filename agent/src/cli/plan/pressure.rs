//! `reactor plan pressure`: thresholds, grace periods and node conditions over a sequence of observations.

use super::{Failure, InputArgs};

pub(super) fn run(args: &InputArgs) -> Result<(), Failure> {
    args.answer(reactor::plan::pressure::run)
}
