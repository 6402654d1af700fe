//! `reactor plan evict`: the order in which pods would be evicted for a signal.

use super::{Failure, InputArgs};

pub(super) fn run(args: &InputArgs) -> Result<(), Failure> {
    args.answer(reactor::plan::evict::run)
}
