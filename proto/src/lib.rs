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
