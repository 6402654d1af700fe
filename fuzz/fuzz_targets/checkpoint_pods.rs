//! The pod manager's checkpoint (`<stateDir>/pods.json`, kind `reactor-pods`): the pods the
//! agent admitted and what became of them, read at every start.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reactor::node::pod_record::{PodRecord, CHECKPOINT_KIND, CHECKPOINT_VERSION};
use reactor::record::checkpoint::Checkpoint;
use reactor::record::state_file::Refusal;

fuzz_target!(|data: &[u8]| {
    // The same decoder `PodManager::start` loads the file with.
    let cp = Checkpoint::new("pods.json", CHECKPOINT_KIND, CHECKPOINT_VERSION);
    reactor_fuzz::checkpoint(CHECKPOINT_KIND, CHECKPOINT_VERSION, data, |bytes| {
        let records: Vec<PodRecord> = cp.decode(bytes)?;
        for r in &records {
            // What start and listing do with each record.
            let _ = (r.full_name(), r.is_terminal());
        }
        cp.encode(&records)
            .map_err(|e| Refusal::Damaged(e.to_string()))
    });
});
