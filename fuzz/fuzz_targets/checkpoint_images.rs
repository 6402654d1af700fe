//! The image GC's records (`<stateDir>/image-records.json`, kind `image-records`): when each
//! image was first seen and last used, read when the image manager starts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reactor::images::manager::{CHECKPOINT_FILE, CHECKPOINT_KIND, CHECKPOINT_VERSION};
use reactor::images::records::{ImageRecords, StoredRecords};
use reactor::record::checkpoint::Checkpoint;
use reactor::record::state_file::Refusal;

fuzz_target!(|data: &[u8]| {
    let cp = Checkpoint::new(CHECKPOINT_FILE, CHECKPOINT_KIND, CHECKPOINT_VERSION);
    reactor_fuzz::checkpoint(CHECKPOINT_KIND, CHECKPOINT_VERSION, data, |bytes| {
        let stored: StoredRecords = cp.decode(bytes)?;
        // What `ImageGcManager::with_notices` makes of them, and what it saves next.
        let records = ImageRecords::from_stored(stored.clone());
        assert_eq!(records.to_stored(), stored, "records lost in memory");
        cp.encode(&records.to_stored())
            .map_err(|e| Refusal::Damaged(e.to_string()))
    });
});
