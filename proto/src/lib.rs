//! gRPC definitions the agent speaks, generated at build time from the `.proto` files under
//! `proto/` (vendored upstream files carry a provenance line).
//!
//! Generated types stay at the edge: the agent converts them to its own domain types where a
//! request enters, so the core never depends on wire shapes.

/// The Container Runtime Interface, `runtime.v1` (vendored from `kubernetes/cri-api`): the
/// agent talks to containerd or CRI-O through it to run, stop and inspect pods and to
/// garbage-collect images, exactly as the kubelet does.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod runtime_v1 {
    tonic::include_proto!("runtime.v1");
}

/// The Kubernetes device-plugin API `v1beta1` (Registration and DevicePlugin services), as the
/// kubelet serves and dials it; vendored upstream in `proto/deviceplugin/v1beta1/api.proto`.
pub mod deviceplugin_v1beta1 {
    #![expect(
        missing_docs,
        reason = "generated from the upstream .proto, whose messages are not all documented"
    )]
    tonic::include_proto!("v1beta1");
}

/// The agent's own API, `reactor.v1` (`proto/reactor/v1/agent.proto`): pods (apply, remove,
/// list), the node's pressure status, the event stream and the plan engine, served on the
/// agent's root-only unix socket.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod reactor_v1 {
    tonic::include_proto!("reactor.v1");
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::reactor_v1::{event, Event, OomKillEvent, PodRef, RemovePodRequest};

    #[test]
    fn event_oneof_round_trips() {
        let event = Event {
            at_unix_nanos: 1_700_000_000_000_000_000,
            sequence: 42,
            kind: Some(event::Kind::OomKill(OomKillEvent {
                pod: Some(PodRef {
                    namespace: "default".into(),
                    name: "hog".into(),
                }),
                container: "hog".into(),
                cgroup: "/kubepods/besteffort/podu1/hog".into(),
                pid: 4242,
            })),
        };
        let back = Event::decode(event.encode_to_vec().as_slice()).unwrap();
        assert_eq!(back, event);
    }

    #[test]
    fn grace_period_distinguishes_unset_from_zero() {
        let unset = RemovePodRequest {
            target: None,
            grace_period_seconds: None,
        };
        let zero = RemovePodRequest {
            target: None,
            grace_period_seconds: Some(0),
        };
        let decode = |r: &RemovePodRequest| {
            RemovePodRequest::decode(r.encode_to_vec().as_slice())
                .unwrap()
                .grace_period_seconds
        };
        assert_eq!(decode(&unset), None);
        assert_eq!(decode(&zero), Some(0));
    }

    #[test]
    fn service_is_named_reactor_v1_agent() {
        use super::reactor_v1::agent_server::SERVICE_NAME;
        assert_eq!(SERVICE_NAME, "reactor.v1.Agent");
    }
}
