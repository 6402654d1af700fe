//! `reactor plan cgroups`: the kubelet's cgroup values for a node and its pods.

use super::{Failure, InputArgs};

pub(super) fn run(args: &InputArgs) -> Result<(), Failure> {
    args.answer(reactor::plan::cgroups::run)
}
