//! Where the device manager listens and keeps its checkpoint, and how long a resource whose
//! plugin went away stays in capacity: the manager's settings, from the agent's config.

use std::path::PathBuf;
use std::time::Duration;

use super::checkpoint::CHECKPOINT_FILE;

/// The socket the manager serves `Registration` on, inside the plugin directory.
pub(crate) const KUBELET_SOCKET: &str = "kubelet.sock";

/// How long a resource whose plugin went away stays in capacity (all unhealthy) before it is
/// dropped: the kubelet's `endpointStopGracePeriod`.
pub(crate) const DEFAULT_STOP_GRACE_PERIOD: Duration = Duration::from_secs(5 * 60);

/// Where the manager listens and keeps its checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceManagerConfig {
    /// Directory of `kubelet.sock` and of the plugins' sockets (config `devicePluginDir`).
    pub plugin_dir: PathBuf,
    /// The agent's state directory (config `stateDir`); the checkpoint lives in
    /// `<stateDir>/device-manager/kubelet_internal_checkpoint`.
    pub state_dir: PathBuf,
    /// Grace period for plugins that went away.
    pub stop_grace_period: Duration,
}

impl DeviceManagerConfig {
    /// Config with the kubelet's five-minute grace period.
    pub fn new(plugin_dir: impl Into<PathBuf>, state_dir: impl Into<PathBuf>) -> Self {
        DeviceManagerConfig {
            plugin_dir: plugin_dir.into(),
            state_dir: state_dir.into(),
            stop_grace_period: DEFAULT_STOP_GRACE_PERIOD,
        }
    }

    /// From the agent's config file (`devicePluginDir`, `stateDir`,
    /// `devicePluginGracePeriod`).
    pub fn from_config(config: &crate::config::Config) -> Self {
        DeviceManagerConfig {
            stop_grace_period: config.device_plugin_grace_period.0,
            ..Self::new(&config.device_plugin_dir, &config.state_dir)
        }
    }

    /// The registration socket.
    pub(crate) fn socket_path(&self) -> PathBuf {
        self.plugin_dir.join(KUBELET_SOCKET)
    }

    /// The checkpoint file.
    pub fn checkpoint_path(&self) -> PathBuf {
        self.state_dir.join("device-manager").join(CHECKPOINT_FILE)
    }
}
