//! Device bookkeeping for device plugins, by the kubelet's rules and on the kubelet's wire:
//! the Kubernetes device-plugin API `v1beta1` over unix sockets, allocation at admission with
//! init-container reuse, and the kubelet's own checkpoint format.
//!
//! How it fits together:
//! - [`DeviceManager::start`] reads the checkpoint and serves `Registration` on
//!   `<devicePluginDir>/kubelet.sock`. A plugin registers (version and resource name are
//!   checked as the kubelet checks them); the manager dials the plugin's socket, reads its
//!   options, and follows its `ListAndWatch`.
//! - Admission asks [`DeviceManager::can_admit`] and then [`DeviceManager::allocate`], which
//!   returns per container the devices, envs, mounts, device nodes and annotations for the
//!   runtime. Before a container starts, [`DeviceManager::prepare_container`] runs the
//!   plugin's `PreStartContainer` where asked for.
//! - Node status reads [`DeviceManager::capacity`]. A plugin whose `ListAndWatch` ends turns
//!   all its devices unhealthy; when the grace period (`devicePluginGracePeriod`, the
//!   kubelet's 5 minutes by default) ends without it registering again, the manager deletes
//!   the resource on its own, without waiting for a capacity call.
//! - Observers (the device metrics in `reactor run`) wait on [`DeviceManager::subscribe`],
//!   which changes after every change of devices, health or assignments, and read
//!   [`DeviceManager::snapshot`].
//!
//! The rooms, bottom first (none imports a room above it):
//! - `types`, `names`, `settings`, `error`: plain data, the kubelet's names and messages,
//!   where the manager listens, what can go wrong;
//! - [`allocate`]: the allocation rules, pure and tested on their own; [`checkpoint`]: the
//!   kubelet's checkpoint format;
//! - `endpoint`: the plugin side of the wire (dialing, protobuf conversions);
//! - `plugins`: the shared state behind one lock, each plugin's `ListAndWatch` task, the
//!   grace-period reaper, the checkpoint writes;
//! - `registration`: the `Registration` service on `kubelet.sock`, handing plugins to
//!   `plugins`;
//! - `manager`: the public [`DeviceManager`] handle over all of it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), reactor::devices::DeviceError> {
//! use reactor::devices::{ContainerRequest, DeviceManager, DeviceManagerConfig, PodRequest};
//! let manager = DeviceManager::start(DeviceManagerConfig::new(
//!     "/var/lib/reactor/device-plugins",
//!     "/var/lib/reactor",
//! ))
//! .await?;
//! let pod = PodRequest {
//!     uid: "4f1c…".into(),
//!     init_containers: vec![],
//!     containers: vec![ContainerRequest {
//!         name: "app".into(),
//!         devices: [("vendor.example/dev".to_string(), 2)].into(),
//!         restartable: false,
//!     }],
//! };
//! let active = [pod.uid.clone()].into();
//! manager.can_admit(&pod, &active)?;
//! let allocation = manager.allocate(&pod, &active).await?;
//! println!("{:?}", allocation.containers["app"].envs);
//! # Ok(()) }
//! ```

pub mod allocate;
pub mod checkpoint;
mod endpoint;
pub use endpoint::dial_unix;
/// The checkpoint's `AllocResp` codec, public for the fuzz targets (`fuzz/`): a restored
/// checkpoint's answers are decoded with it.
pub use endpoint::{decode_response, encode_response};
mod error;
mod manager;
pub mod names;
mod plugins;
mod registration;
mod settings;
mod types;

pub use error::DeviceError;
pub use manager::DeviceManager;
pub use settings::DeviceManagerConfig;
pub use types::{
    Capacity, ContainerAllocation, ContainerRequest, DeviceMount, DeviceNode, DeviceSet,
    Insufficient, PluginResponse, PodAllocation, PodRequest, ResourceCapacity,
};
