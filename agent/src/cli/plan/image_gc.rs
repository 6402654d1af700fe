//! `reactor plan image-gc`: which images one image-GC round would delete.

use super::{Failure, InputArgs};

pub(super) fn run(args: &InputArgs) -> Result<(), Failure> {
    args.answer(reactor::plan::image_gc::run)
}
