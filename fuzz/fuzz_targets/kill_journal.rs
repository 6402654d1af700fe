//! The kill journal (`<stateDir>/evictions.journal`): one JSON line per eviction killed
//! before its stop reached the pod checkpoint, read at every start.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use reactor::node::journal::{KillJournal, FILE_NAME};

fuzz_target!(|data: &[u8]| {
    let path = Path::new(FILE_NAME);
    let notes = KillJournal::parse(data, path);
    // The lines `note` appends for what was read are read back as the same notes.
    let mut written = Vec::new();
    for n in &notes {
        written.extend(KillJournal::line(n).expect("a note serializes"));
    }
    assert_eq!(KillJournal::parse(&written, path), notes, "round trip");
    // A line torn off by a crash loses that note only.
    if let Some(last) = notes.last() {
        let line = KillJournal::line(last).expect("a note serializes");
        let mut torn = written.clone();
        torn.extend_from_slice(&line[..line.len() / 2]);
        assert_eq!(KillJournal::parse(&torn, path), notes, "torn tail");
    }
});
