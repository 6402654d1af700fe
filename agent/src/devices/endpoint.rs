//! The connection to one device plugin: dial its unix socket, and convert between the wire
//! types of `v1beta1` and the manager's domain types. Only this module and
//! [`super::registration`] touch protobuf types.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use reactor_proto::deviceplugin_v1beta1 as api;
use tonic::transport::{Channel, Endpoint};

use super::types::{DeviceMount, DeviceNode, DeviceSet, PluginResponse};

/// The gRPC client of one plugin.
pub(crate) type PluginClient = api::device_plugin_client::DevicePluginClient<Channel>;

/// How long dialing a plugin may take, as the kubelet's dial timeout.
pub(crate) const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// The options a plugin announced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PluginOptions {
    /// Call `PreStartContainer` before each container start.
    pub pre_start_required: bool,
    /// `GetPreferredAllocation` is implemented.
    pub get_preferred_allocation_available: bool,
}

impl From<api::DevicePluginOptions> for PluginOptions {
    fn from(o: api::DevicePluginOptions) -> Self {
        PluginOptions {
            pre_start_required: o.pre_start_required,
            get_preferred_allocation_available: o.get_preferred_allocation_available,
        }
    }
}

/// Opens a gRPC channel over the unix socket at `path`. The URI is a placeholder: the
/// connector ignores it and always dials the socket.
pub async fn dial_unix(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_path_buf();
    // The URI is constant and valid; `from_static` cannot fail.
    Endpoint::from_static("http://localhost")
        .connect_timeout(DIAL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
}

/// Dials a plugin and returns its client.
pub(crate) async fn dial(path: &Path) -> Result<PluginClient, tonic::transport::Error> {
    Ok(PluginClient::new(dial_unix(path).await?))
}

/// One device of a `ListAndWatch` answer: ID, healthy, NUMA nodes.
pub(crate) type ListedDevice = (String, bool, Vec<i64>);

/// Converts a `ListAndWatch` answer. Anything but the exact string `Healthy` counts as
/// unhealthy, as in the kubelet.
pub(crate) fn listed_devices(resp: &api::ListAndWatchResponse) -> Vec<ListedDevice> {
    resp.devices
        .iter()
        .map(|d| {
            let numa = d
                .topology
                .as_ref()
                .map(|t| t.nodes.iter().map(|n| n.id).collect())
                .unwrap_or_default();
            (d.id.clone(), d.health == "Healthy", numa)
        })
        .collect()
}

/// The `Allocate` request for one container.
pub(crate) fn allocate_request(devices: &DeviceSet) -> api::AllocateRequest {
    api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: devices.iter().cloned().collect(),
        }],
    }
}

/// The `GetPreferredAllocation` request for one container.
pub(crate) fn preferred_request(
    available: &DeviceSet,
    must_include: &DeviceSet,
    size: u64,
) -> api::PreferredAllocationRequest {
    api::PreferredAllocationRequest {
        container_requests: vec![api::ContainerPreferredAllocationRequest {
            available_device_i_ds: available.union(must_include).cloned().collect(),
            must_include_device_i_ds: must_include.iter().cloned().collect(),
            allocation_size: i32::try_from(size).unwrap_or(i32::MAX),
        }],
    }
}

impl From<api::ContainerAllocateResponse> for PluginResponse {
    fn from(r: api::ContainerAllocateResponse) -> Self {
        PluginResponse {
            envs: r.envs.into_iter().collect(),
            mounts: r
                .mounts
                .into_iter()
                .map(|m| DeviceMount {
                    container_path: m.container_path,
                    host_path: m.host_path,
                    read_only: m.read_only,
                })
                .collect(),
            device_nodes: r
                .devices
                .into_iter()
                .map(|d| DeviceNode {
                    container_path: d.container_path,
                    host_path: d.host_path,
                    permissions: d.permissions,
                })
                .collect(),
            annotations: r.annotations.into_iter().collect(),
            cdi_devices: r.cdi_devices.into_iter().map(|c| c.name).collect(),
        }
    }
}

impl From<&PluginResponse> for api::ContainerAllocateResponse {
    fn from(r: &PluginResponse) -> Self {
        api::ContainerAllocateResponse {
            envs: r.envs.clone().into_iter().collect(),
            mounts: r
                .mounts
                .iter()
                .map(|m| api::Mount {
                    container_path: m.container_path.clone(),
                    host_path: m.host_path.clone(),
                    read_only: m.read_only,
                })
                .collect(),
            devices: r
                .device_nodes
                .iter()
                .map(|d| api::DeviceSpec {
                    container_path: d.container_path.clone(),
                    host_path: d.host_path.clone(),
                    permissions: d.permissions.clone(),
                })
                .collect(),
            annotations: r.annotations.clone().into_iter().collect(),
            cdi_devices: r
                .cdi_devices
                .iter()
                .map(|n| api::CdiDevice { name: n.clone() })
                .collect(),
        }
    }
}

/// Encodes an allocation answer as the checkpoint's `AllocResp` bytes.
pub fn encode_response(r: &PluginResponse) -> Vec<u8> {
    use prost::Message as _;
    api::ContainerAllocateResponse::from(r).encode_to_vec()
}

/// Decodes a checkpoint's `AllocResp` bytes.
pub fn decode_response(bytes: &[u8]) -> Result<PluginResponse, prost::DecodeError> {
    use prost::Message as _;
    api::ContainerAllocateResponse::decode(bytes).map(PluginResponse::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    #[test]
    fn a_kubelet_alloc_resp_decodes_and_re_encodes_identically() {
        // A ContainerAllocateResponse as a kubelet checkpointed it (gogo encoding).
        let b64 = "Ch8KFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSBXRlZ3Jh";
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        let resp = decode_response(&bytes).unwrap();
        assert_eq!(resp.envs["NVIDIA_VISIBLE_DEVICES"], "tegra");
        assert_eq!(encode_response(&resp), bytes);
    }

    #[test]
    fn responses_round_trip_through_bytes() {
        let r = PluginResponse {
            envs: [("B".into(), "2".into()), ("A".into(), "1".into())].into(),
            mounts: vec![DeviceMount {
                container_path: "/c".into(),
                host_path: "/h".into(),
                read_only: true,
            }],
            device_nodes: vec![DeviceNode {
                container_path: "/dev/x".into(),
                host_path: "/dev/null".into(),
                permissions: "rw".into(),
            }],
            annotations: [("k".into(), "v".into())].into(),
            cdi_devices: vec!["vendor.example/dev=0".into()],
        };
        assert_eq!(decode_response(&encode_response(&r)).unwrap(), r);
    }
}
