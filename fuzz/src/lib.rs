//! What every fuzz target asserts of the agent's parsers, whatever the format.

/// A refusal is one line: the agent logs it, prints it on stderr or sends it as a gRPC
/// status, and a message broken over lines reads as several unrelated ones.
pub fn one_line(what: &str, message: &str) {
    assert!(
        !message.contains('\n') && !message.contains('\r'),
        "{what}: error is not one line: {message:?}"
    );
}

use reactor::record::checkpoint::Checkpoint;
use reactor::record::state_file::Refusal;

/// The one line a checkpoint's decoder gives for bytes it refuses.
pub fn refusal_text(r: &Refusal) -> &str {
    match r {
        Refusal::Damaged(s) | Refusal::OtherVersion(s) => s,
    }
}

/// Runs a checkpoint's decoder, `recode` (decode, then encode what it held as the owner's
/// next save would), on `data` as a whole file and on `data` as the `data` part of an
/// envelope whose checksum matches: random bytes almost never carry a matching CRC-32, so
/// without the second form the fuzzer would seldom get past the checksum to the records.
/// A refusal is one line; what decodes encodes to bytes that decode and encode to the same
/// bytes again.
pub fn checkpoint(
    kind: &str,
    version: u32,
    data: &[u8],
    recode: impl Fn(&[u8]) -> Result<Vec<u8>, Refusal>,
) {
    let mut inputs = vec![data.to_vec()];
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let cp = Checkpoint::new("fuzz.json", kind, version);
        inputs.push(cp.encode(&value).expect("any JSON value encodes"));
    }
    for bytes in inputs {
        match recode(&bytes) {
            Err(r) => one_line(kind, refusal_text(&r)),
            Ok(encoded) => {
                let again = recode(&encoded).unwrap_or_else(|r| {
                    panic!(
                        "{kind}: what was saved is refused: {}\n{}",
                        refusal_text(&r),
                        String::from_utf8_lossy(&encoded)
                    )
                });
                assert_eq!(
                    String::from_utf8_lossy(&again),
                    String::from_utf8_lossy(&encoded),
                    "{kind}: a second round trip changed the file"
                );
            }
        }
    }
}
