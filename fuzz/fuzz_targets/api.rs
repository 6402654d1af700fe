//! The agent's API messages (`reactor.v1.Agent` on the unix socket): a request's protobuf
//! bytes as the transport decodes them, and the checks the handler runs on them before the
//! pod manager is asked anything. The first byte picks the message, the rest is its bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use reactor::api::server::{apply_format, plan_output, remove_request};
use reactor::node::document;
use reactor_fuzz::one_line;
use reactor_proto::reactor_v1 as pb;

/// Decodes `bytes` as `M`; what decodes encodes to bytes that decode to the same message.
fn decoded<M: Message + Default + PartialEq + std::fmt::Debug>(bytes: &[u8]) -> Option<M> {
    let m = M::decode(bytes).ok()?;
    let encoded = m.encode_to_vec();
    let again = M::decode(encoded.as_slice()).expect("an encoded message decodes");
    assert_eq!(again, m, "protobuf round trip");
    assert_eq!(again.encode_to_vec(), encoded, "second encoding");
    Some(m)
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match which % 6 {
        0 => {
            let Some(r) = decoded::<pb::ApplyPodRequest>(bytes) else {
                return;
            };
            // What `apply_pod` and `PodManager::apply` check before the node is touched.
            let format = match apply_format(r.format) {
                Ok(f) => f,
                Err(s) => return one_line("format", s.message()),
            };
            match document::parse(&r.pod, format) {
                Err(e) => one_line("apply", &e.to_string()),
                Ok(v) => {
                    if let Err(e) = document::check(v, "process", false, || "fuzz-uid".into()) {
                        one_line("apply", &e.to_string());
                    }
                }
            }
        }
        1 => {
            if let Some(r) = decoded::<pb::RemovePodRequest>(bytes) {
                if let Err(s) = remove_request(r) {
                    one_line("remove", s.message());
                }
            }
        }
        2 => {
            if let Some(r) = decoded::<pb::PlanRequest>(bytes) {
                match plan_output(&r.what, &r.input_json) {
                    Err(s) => one_line("plan", s.message()),
                    Ok(out) => {
                        serde_json::from_slice::<serde_json::Value>(&out)
                            .expect("a plan's answer is JSON");
                    }
                }
            }
        }
        3 => {
            decoded::<pb::ListPodsRequest>(bytes);
        }
        4 => {
            decoded::<pb::EventsRequest>(bytes);
        }
        _ => {
            decoded::<pb::NodeStatusRequest>(bytes);
        }
    }
});
