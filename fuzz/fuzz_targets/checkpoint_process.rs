//! The process runtime's checkpoint (`<stateDir>/process-runtime.json`, kind
//! `process-runtime`): the pods it runs and each container's pid and start time, read when
//! the runtime opens to re-adopt its processes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reactor::act::process::{recode_checkpoint, CHECKPOINT_KIND, CHECKPOINT_VERSION};

fuzz_target!(|data: &[u8]| {
    reactor_fuzz::checkpoint(CHECKPOINT_KIND, CHECKPOINT_VERSION, data, recode_checkpoint);
});
