//! The device manager's public handle: starts the registration server and the reaper over
//! the shared state (`devices::plugins`), answers capacity and snapshots, allocates at
//! admission (RPCs to plugins outside the lock), and shuts down.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reactor_proto::deviceplugin_v1beta1 as api;
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::allocate::{choose, Need};
use super::checkpoint;
use super::endpoint::{allocate_request, preferred_request};
use super::error::DeviceError;
use super::plugins::{lock, restore, Inner, State};
use super::registration::RegistrationService;
use super::settings::DeviceManagerConfig;
use super::types::{
    Capacity, ContainerAllocation, ContainerRequest, DeviceSet, Insufficient, PodAllocation,
    PodRequest, ResourceCapacity,
};
use crate::record::state_file::{Notices, Refusal, StateFile};

/// The device manager. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct DeviceManager {
    inner: Arc<Inner>,
    server: Mutex<Option<(oneshot::Sender<()>, JoinHandle<()>)>>,
    reaper: Mutex<Option<JoinHandle<()>>>,
    checkpoint_warning: Option<String>,
}

impl DeviceManager {
    /// Starts the manager: reads the checkpoint (a refused one is logged, reported by
    /// [`Self::checkpoint_warning`], and the manager starts clean), then serves
    /// `Registration` on `<plugin_dir>/kubelet.sock`, replacing a stale socket. Plugins watch
    /// that socket and register again when it is re-created.
    pub async fn start(config: DeviceManagerConfig) -> Result<DeviceManager, DeviceError> {
        Self::start_with(config, Notices::default()).await
    }

    /// [`Self::start`], sending what happens to the checkpoint file (set aside, failed
    /// writes) to `notices`. A damaged checkpoint falls back to its previous generation,
    /// else to no assignments; it never stops the start.
    pub async fn start_with(
        config: DeviceManagerConfig,
        notices: Notices,
    ) -> Result<DeviceManager, DeviceError> {
        let mut state = State::default();
        let path = config.checkpoint_path();
        let file = StateFile::new(&path).with_notices(notices);
        let loaded = file.load(|bytes| {
            checkpoint::decode(&path, bytes).map_err(|e| Refusal::Damaged(e.to_string()))
        });
        if let Some(data) = loaded.value {
            restore(&mut state, data, Instant::now());
        }
        let checkpoint_warning = loaded.notices.first().map(|n| n.message.clone());
        let socket = config.socket_path();
        let serve_err = |source| DeviceError::Serve {
            path: socket.clone(),
            source,
        };
        std::fs::create_dir_all(&config.plugin_dir).map_err(serve_err)?;
        match std::fs::remove_file(&socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(serve_err(e)),
        }
        let listener = UnixListener::bind(&socket).map_err(serve_err)?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o660))
                .map_err(serve_err)?;
        }
        let inner = Arc::new(Inner {
            config,
            state: Mutex::new(state),
            write_lock: tokio::sync::Mutex::new(()),
            file,
            changes: tokio::sync::watch::Sender::new(0),
        });
        let reaper = tokio::spawn(Arc::clone(&inner).reap());
        let service = api::registration_server::RegistrationServer::new(RegistrationService {
            inner: Arc::clone(&inner),
        });
        let (tx, rx) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
            if let Err(e) = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await
            {
                tracing::error!("device-plugin registration server stopped: {e}");
            }
        });
        tracing::info!(socket = %inner.config.socket_path().display(), "serving device-plugin registration");
        Ok(DeviceManager {
            inner,
            server: Mutex::new(Some((tx, server))),
            reaper: Mutex::new(Some(reaper)),
            checkpoint_warning,
        })
    }

    /// The one-line reason the checkpoint was set aside at start, if it was (what was wrong,
    /// where the file was kept, which generation the manager started from).
    pub fn checkpoint_warning(&self) -> Option<&str> {
        self.checkpoint_warning.as_deref()
    }

    /// The configuration in use.
    pub fn config(&self) -> &DeviceManagerConfig {
        &self.inner.config
    }

    /// Capacity (healthy + unhealthy) and allocatable (healthy) per resource, like the
    /// kubelet's `GetCapacity`, for node status. Resources whose plugin has been gone longer
    /// than the grace period are dropped here and listed once in `deleted`.
    pub async fn capacity(&self) -> Capacity {
        self.capacity_at(Instant::now()).await
    }

    /// [`Self::capacity`] at a given instant (the grace period is measured against `now`).
    /// Resources the background reaper already dropped are reported in `deleted` here too,
    /// once.
    pub(crate) async fn capacity_at(&self, now: Instant) -> Capacity {
        if self.inner.expire(now) {
            self.inner.write_checkpoint_logged().await;
        }
        let mut st = self.inner.state();
        let deleted = std::mem::take(&mut st.deleted);
        Capacity {
            resources: Self::counts(&st),
            deleted,
        }
    }

    /// Capacity, allocatable, allocated and free per registered resource as they are now,
    /// without dropping expired resources or consuming the `deleted` report (which stays
    /// for [`Self::capacity`]): for observers such as metrics, which must not take the
    /// once-only report from node status.
    pub fn snapshot(&self) -> BTreeMap<String, ResourceCapacity> {
        Self::counts(&self.inner.state())
    }

    fn counts(st: &State) -> BTreeMap<String, ResourceCapacity> {
        st.book
            .healthy
            .keys()
            .chain(st.book.unhealthy.keys())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .map(|r| (r.clone(), st.book.counts(r)))
            .collect()
    }

    /// A receiver that changes after every change of devices, health or assignments (a
    /// plugin registered or went away, `ListAndWatch` pushed, devices allocated or freed, a
    /// resource deleted). Read the state with [`Self::snapshot`] after each change.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// Whether the pod's device requests can be met now: for every resource, enough healthy
    /// devices that no active pod holds (devices of pods outside `active_pods` count as
    /// free, since they are freed before allocation). Admission calls this before
    /// [`Self::allocate`]; a resource no plugin registered is insufficient.
    pub fn can_admit(
        &self,
        pod: &PodRequest,
        active_pods: &BTreeSet<String>,
    ) -> Result<(), Insufficient> {
        self.inner.state().book.check_admit(pod, active_pods)
    }

    /// Assigns devices to every container of an admitted pod and returns what each container
    /// gets. First frees the devices of pods not in `active_pods` (the pod itself always
    /// counts as active); then init containers in order, each able to reuse the devices of
    /// the ones before, then app containers, reusing init devices first. Each new assignment
    /// calls the plugin's `Allocate` (after `GetPreferredAllocation` when offered) outside the
    /// lock. On any failure every assignment this call made is rolled back. The checkpoint is
    /// written before returning.
    ///
    /// Devices the init containers held beyond what the app containers reuse stay with the
    /// pod until it leaves `active_pods`, as in the kubelet (see [`super::allocate`] for why).
    pub async fn allocate(
        &self,
        pod: &PodRequest,
        active_pods: &BTreeSet<String>,
    ) -> Result<PodAllocation, DeviceError> {
        let mut active = active_pods.clone();
        active.insert(pod.uid.clone());
        let freed = self.inner.state().book.remove_inactive(&active);
        let mut added = Vec::new();
        let walked = self.allocate_walk(pod, &mut added).await;
        if let Err(e) = walked {
            {
                let mut st = self.inner.state();
                for (container, resource) in &added {
                    st.book.remove(&pod.uid, container, resource);
                }
            }
            // Observers are told even when nothing was added: a snapshot taken while the
            // failed call's devices were reserved (a plugin that died in Allocate also ends
            // its ListAndWatch, which notifies) counted them allocated, and must not stay so.
            if freed {
                self.inner.write_checkpoint_logged().await;
            } else {
                self.inner.notify();
            }
            return Err(e);
        }
        if freed || !added.is_empty() {
            self.inner.write_checkpoint().await?;
        }
        Ok(self.pod_allocation(&pod.uid))
    }

    async fn allocate_walk(
        &self,
        pod: &PodRequest,
        added: &mut Vec<(String, String)>,
    ) -> Result<(), DeviceError> {
        let mut reusable: BTreeMap<String, DeviceSet> = BTreeMap::new();
        for c in &pod.init_containers {
            self.allocate_container(&pod.uid, c, &reusable, added)
                .await?;
            let st = self.inner.state();
            if c.restartable {
                st.book.remove_reusable(&pod.uid, &c.name, &mut reusable);
            } else {
                st.book.add_reusable(&pod.uid, &c.name, &mut reusable);
            }
        }
        for c in &pod.containers {
            self.allocate_container(&pod.uid, c, &reusable, added)
                .await?;
            self.inner
                .state()
                .book
                .remove_reusable(&pod.uid, &c.name, &mut reusable);
        }
        Ok(())
    }

    async fn allocate_container(
        &self,
        uid: &str,
        c: &ContainerRequest,
        reusable: &BTreeMap<String, DeviceSet>,
        added: &mut Vec<(String, String)>,
    ) -> Result<(), DeviceError> {
        for (resource, &required) in &c.devices {
            let (reused, more, available, client, options) = {
                let st = self.inner.state();
                let need =
                    st.book
                        .plan(uid, &c.name, resource, required, reusable.get(resource))?;
                let Need::Devices {
                    reused,
                    more,
                    available,
                } = need
                else {
                    continue;
                };
                let endpoint = st.endpoints.get(resource);
                let client = endpoint
                    .and_then(|e| e.client.clone())
                    .ok_or_else(|| DeviceError::NotConnected(resource.clone()))?;
                let options = endpoint.map(|e| e.options).unwrap_or_default();
                (reused, more, available, client, options)
            };
            let mut chosen = DeviceSet::new();
            if more > 0 {
                let mut preferred = Vec::new();
                if options.get_preferred_allocation_available {
                    let req = preferred_request(&available, &reused, required);
                    let resp = client
                        .clone()
                        .get_preferred_allocation(req)
                        .await
                        .map_err(|s| DeviceError::rpc(resource, "GetPreferredAllocation", s))?;
                    preferred = resp
                        .into_inner()
                        .container_responses
                        .into_iter()
                        .next()
                        .map(|r| r.device_i_ds)
                        .unwrap_or_default();
                }
                // The lock was released for the call: choose from what is free now.
                let mut st = self.inner.state();
                let available = st.book.available(resource, None);
                if available.len() < more {
                    return Err(Insufficient {
                        resource: resource.clone(),
                        requested: more as u64,
                        available: available.len() as u64,
                    }
                    .into());
                }
                chosen = choose(&available, more, &preferred);
                st.book.reserve(resource, &chosen);
            }
            let devices: DeviceSet = reused.union(&chosen).cloned().collect();
            tracing::debug!(pod = %uid, container = %c.name, %resource, ?devices, "Allocate");
            let answer = client.clone().allocate(allocate_request(&devices)).await;
            let mut st = self.inner.state();
            st.book.unreserve(resource, &chosen);
            let answer = answer.map_err(|s| DeviceError::rpc(resource, "Allocate", s))?;
            let Some(first) = answer.into_inner().container_responses.into_iter().next() else {
                return Err(DeviceError::EmptyResponse(resource.clone()));
            };
            st.book
                .insert(uid, &c.name, resource, &devices, first.into());
            added.push((c.name.clone(), resource.clone()));
        }
        Ok(())
    }

    /// The pod's current assignments.
    pub fn pod_allocation(&self, pod_uid: &str) -> PodAllocation {
        let st = self.inner.state();
        let containers = st
            .book
            .pods
            .get(pod_uid)
            .map(|cs| {
                cs.keys()
                    .filter_map(|c| {
                        st.book
                            .container_allocation(pod_uid, c)
                            .map(|a| (c.clone(), a))
                    })
                    .collect()
            })
            .unwrap_or_default();
        PodAllocation {
            uid: pod_uid.to_string(),
            containers,
        }
    }

    /// What one container gets (devices, envs, mounts, device nodes, annotations), if it
    /// holds any devices.
    pub fn container_allocation(
        &self,
        pod_uid: &str,
        container: &str,
    ) -> Option<ContainerAllocation> {
        self.inner
            .state()
            .book
            .container_allocation(pod_uid, container)
    }

    /// Called right before a container starts (the kubelet's `GetDeviceRunContainerOptions`):
    /// calls `PreStartContainer` on every plugin of the container that asked for it, then
    /// returns the container's runtime options (`None` if it holds no devices).
    pub async fn prepare_container(
        &self,
        pod_uid: &str,
        container: &str,
    ) -> Result<Option<ContainerAllocation>, DeviceError> {
        let (allocation, calls) = {
            let st = self.inner.state();
            let Some(allocation) = st.book.container_allocation(pod_uid, container) else {
                return Ok(None);
            };
            let mut calls = Vec::new();
            for (resource, devices) in &allocation.devices {
                let Some(endpoint) = st.endpoints.get(resource) else {
                    continue;
                };
                if !endpoint.options.pre_start_required {
                    continue;
                }
                let client = endpoint
                    .client
                    .clone()
                    .ok_or_else(|| DeviceError::NotConnected(resource.clone()))?;
                calls.push((resource.clone(), client, devices.clone()));
            }
            (allocation, calls)
        };
        for (resource, mut client, devices) in calls {
            client
                .pre_start_container(api::PreStartContainerRequest {
                    devices_ids: devices.into_iter().collect(),
                })
                .await
                .map_err(|s| DeviceError::rpc(&resource, "PreStartContainer", s))?;
        }
        Ok(Some(allocation))
    }

    /// Frees the devices of every pod not in `active_pods` (the kubelet's
    /// `UpdateAllocatedDevices`), writing the checkpoint if anything was freed.
    pub async fn remove_inactive_pods(
        &self,
        active_pods: &BTreeSet<String>,
    ) -> Result<(), DeviceError> {
        let freed = self.inner.state().book.remove_inactive(active_pods);
        if freed {
            self.inner.write_checkpoint().await?;
        }
        Ok(())
    }

    /// Pod UIDs that hold devices.
    pub fn pods_with_devices(&self) -> BTreeSet<String> {
        self.inner.state().book.pods.keys().cloned().collect()
    }

    /// Healthy and unhealthy device IDs per registered resource.
    pub fn devices(&self) -> BTreeMap<String, (DeviceSet, DeviceSet)> {
        let st = self.inner.state();
        st.book
            .healthy
            .iter()
            .map(|(r, h)| {
                let u = st.book.unhealthy.get(r).cloned().unwrap_or_default();
                (r.clone(), (h.clone(), u))
            })
            .collect()
    }

    /// Stops serving: plugin streams are dropped, the server stops, `kubelet.sock` is
    /// removed. The checkpoint stays as last written; nothing is written after this.
    pub async fn shutdown(&self) {
        self.inner.stop();
        if let Some(reaper) = lock(&self.reaper).take() {
            reaper.abort();
        }
        let server = lock(&self.server).take();
        if let Some((tx, handle)) = server {
            let _ = tx.send(());
            let abort = handle.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), handle)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        let _ = std::fs::remove_file(self.inner.config.socket_path());
    }
}

impl Drop for DeviceManager {
    fn drop(&mut self) {
        self.inner.stop();
        if let Some(reaper) = lock(&self.reaper).take() {
            reaper.abort();
        }
        if let Some((tx, handle)) = lock(&self.server).take() {
            let _ = tx.send(());
            handle.abort();
            let _ = std::fs::remove_file(self.inner.config.socket_path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Admission shares the manager across tasks: its futures must be `Send` and the
    /// manager `Send + Sync`. This only has to compile.
    #[expect(dead_code, reason = "a compile-time check, never called")]
    fn futures_are_send(m: &DeviceManager, pod: &PodRequest, active: &BTreeSet<String>) {
        fn send<T: Send>(_: T) {}
        fn shared<T: Send + Sync>() {}
        shared::<DeviceManager>();
        send(m.allocate(pod, active));
        send(m.capacity());
        send(m.prepare_container("pod", "container"));
        send(m.remove_inactive_pods(active));
        send(DeviceManager::start(DeviceManagerConfig::new("/p", "/s")));
    }
}
