//! The device manager's checkpoint (`kubelet_internal_checkpoint`, the kubelet's own
//! format): which devices each container holds and the plugin's answer for them, read when
//! the device manager starts.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use reactor::devices::checkpoint::{decode, encode, CheckpointError, CHECKPOINT_FILE};
use reactor::devices::{decode_response, encode_response};
use reactor_fuzz::one_line;

fuzz_target!(|data: &[u8]| {
    let path = Path::new(CHECKPOINT_FILE);
    let mut inputs = vec![data.to_vec()];
    // Random bytes almost never carry a matching checksum: the same file with the checksum
    // its data sums to goes on to the entries.
    if let Err(CheckpointError::Corrupt { computed, .. }) = decode(path, data) {
        if let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(data) {
            if let Some(o) = v.as_object_mut() {
                o.insert("Checksum".into(), computed.into());
                inputs.push(serde_json::to_vec(&v).expect("a JSON value serializes"));
            }
        }
    }
    for bytes in inputs {
        let data = match decode(path, &bytes) {
            Ok(d) => d,
            Err(e) => {
                one_line("device checkpoint", &e.to_string());
                continue;
            }
        };
        let written = encode(&data);
        let again = decode(path, &written).unwrap_or_else(|e| {
            panic!(
                "the checkpoint written is refused: {e}\n{}",
                String::from_utf8_lossy(&written)
            )
        });
        assert_eq!(again, data, "round trip");
        assert_eq!(encode(&again), written, "second round trip");
        // What `restore` does with each entry's plugin answer.
        for e in data.entries.iter().flatten() {
            if let Some(resp) = &e.alloc_resp {
                if let Ok(r) = decode_response(resp) {
                    let bytes = encode_response(&r);
                    assert_eq!(
                        decode_response(&bytes).ok(),
                        Some(r),
                        "AllocResp round trip"
                    );
                }
            }
        }
    }
});
