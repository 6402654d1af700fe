//! The device manager: owns the bookkeeping ([`Book`]) behind one short-held lock, serves
//! registration, follows each plugin's `ListAndWatch`, allocates at admission, and keeps the
//! checkpoint current. RPCs to plugins are always made outside the lock.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use reactor_proto::deviceplugin_v1beta1 as api;
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio::task::{AbortHandle, JoinHandle};

use super::allocate::{choose, Assignment, Book, Need, PlanError};
use super::checkpoint::{self, CheckpointError, Data, Entry, CHECKPOINT_FILE};
use super::endpoint::{
    allocate_request, decode_response, dial, encode_response, listed_devices, preferred_request,
    PluginClient, PluginOptions,
};
use super::registration::RegistrationService;
use super::types::{
    Capacity, ContainerAllocation, ContainerRequest, DeviceSet, Insufficient, PodAllocation,
    PodRequest, ResourceCapacity,
};
use crate::record::state_file::{Notices, Refusal, StateFile};

/// How often a checkpoint whose last write failed is written again.
const SAVE_RETRY: Duration = Duration::from_secs(2);

/// The socket the manager serves `Registration` on, inside the plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// How long a resource whose plugin went away stays in capacity (all unhealthy) before it is
/// dropped: the kubelet's `endpointStopGracePeriod`.
pub const DEFAULT_STOP_GRACE_PERIOD: Duration = Duration::from_secs(5 * 60);

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
    pub fn socket_path(&self) -> PathBuf {
        self.plugin_dir.join(KUBELET_SOCKET)
    }

    /// The checkpoint file.
    pub fn checkpoint_path(&self) -> PathBuf {
        self.state_dir.join("device-manager").join(CHECKPOINT_FILE)
    }
}

/// What went wrong in the device manager.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The registration socket could not be served.
    #[error("cannot serve device-plugin registration on {path}: {source}")]
    Serve {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The plugin's socket could not be dialed (the kubelet's wording).
    #[error("failed to dial device plugin: {0}")]
    Dial(String),
    /// The allocation rules refused.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The resource has no connected plugin (it went away, or the agent restarted and the
    /// plugin has not registered again yet).
    #[error("device plugin for {0} is not connected")]
    NotConnected(String),
    /// A plugin call failed.
    #[error("device plugin for {resource}: {call} failed: {message}")]
    Rpc {
        /// Resource.
        resource: String,
        /// The RPC.
        call: &'static str,
        /// What the plugin said.
        message: String,
    },
    /// `Allocate` answered without a container response.
    #[error("no containers return in allocation response from device plugin for {0}")]
    EmptyResponse(String),
    /// The checkpoint could not be written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

impl From<Insufficient> for DeviceError {
    fn from(e: Insufficient) -> Self {
        DeviceError::Plan(PlanError::Insufficient(e))
    }
}

impl DeviceError {
    /// The one place domain errors become gRPC statuses for a plugin.
    pub(crate) fn to_status(&self) -> tonic::Status {
        match self {
            DeviceError::Dial(_) | DeviceError::Rpc { .. } | DeviceError::NotConnected(_) => {
                tonic::Status::unavailable(self.to_string())
            }
            DeviceError::Plan(_) => tonic::Status::failed_precondition(self.to_string()),
            _ => tonic::Status::internal(self.to_string()),
        }
    }

    fn rpc(resource: &str, call: &'static str, status: tonic::Status) -> Self {
        DeviceError::Rpc {
            resource: resource.to_string(),
            call,
            message: status.message().to_string(),
        }
    }
}

struct EndpointEntry {
    generation: u64,
    client: Option<PluginClient>,
    options: PluginOptions,
    stopped_at: Option<Instant>,
    task: Option<AbortHandle>,
}

#[derive(Default)]
struct State {
    book: Book,
    endpoints: BTreeMap<String, EndpointEntry>,
    next_generation: u64,
    closed: bool,
    /// Resources dropped after their grace period that [`DeviceManager::capacity`] has not
    /// reported yet.
    deleted: Vec<String>,
}

/// Shared by the public handle, the registration service and the endpoint tasks.
pub(crate) struct Inner {
    config: DeviceManagerConfig,
    state: Mutex<State>,
    write_lock: tokio::sync::Mutex<()>,
    /// The checkpoint file, with its previous generation (`record::state_file`).
    file: StateFile,
    /// Bumped after every change of devices, health or assignments, so metrics and the
    /// grace-period reaper follow the state without polling it.
    changes: tokio::sync::watch::Sender<u64>,
}

/// The device manager. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct DeviceManager {
    inner: Arc<Inner>,
    server: Mutex<Option<(oneshot::Sender<()>, JoinHandle<()>)>>,
    reaper: Mutex<Option<JoinHandle<()>>>,
    checkpoint_warning: Option<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep serving it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Builds the kubelet-format checkpoint data from the bookkeeping.
fn to_checkpoint(book: &Book) -> Data {
    let mut entries = Vec::new();
    for (uid, containers) in &book.pods {
        for (container, resources) in containers {
            for (resource, a) in resources {
                entries.push(Entry {
                    pod_uid: uid.clone(),
                    container_name: container.clone(),
                    resource_name: resource.clone(),
                    device_ids: Some(
                        a.by_numa
                            .iter()
                            .map(|(k, v)| (*k, Some(v.clone())))
                            .collect(),
                    ),
                    alloc_resp: Some(encode_response(&a.response)),
                });
            }
        }
    }
    Data {
        entries: (!entries.is_empty()).then_some(entries),
        registered: Some(
            book.healthy
                .iter()
                .map(|(r, d)| (r.clone(), Some(d.iter().cloned().collect())))
                .collect(),
        ),
    }
}

/// Loads checkpointed assignments; registered resources come back with no devices and a
/// stopped endpoint, so capacity stays zero until their plugins register again and the
/// grace period drops those that never do.
fn restore(state: &mut State, data: Data, now: Instant) {
    for e in data.entries.unwrap_or_default() {
        let Some(bytes) = e.alloc_resp else {
            tracing::warn!(pod = %e.pod_uid, container = %e.container_name,
                "checkpoint entry without an allocation response; skipped");
            continue;
        };
        let response = match decode_response(&bytes) {
            Ok(r) => r,
            Err(err) => {
                tracing::warn!(pod = %e.pod_uid, container = %e.container_name,
                    "checkpoint allocation response does not decode ({err}); skipped");
                continue;
            }
        };
        let by_numa = e
            .device_ids
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.unwrap_or_default()))
            .collect();
        state
            .book
            .pods
            .entry(e.pod_uid)
            .or_default()
            .entry(e.container_name)
            .or_default()
            .insert(e.resource_name, Assignment { by_numa, response });
    }
    for resource in data.registered.unwrap_or_default().into_keys() {
        state
            .book
            .healthy
            .insert(resource.clone(), DeviceSet::new());
        state
            .book
            .unhealthy
            .insert(resource.clone(), DeviceSet::new());
        state.endpoints.insert(
            resource,
            EndpointEntry {
                generation: 0,
                client: None,
                options: PluginOptions::default(),
                stopped_at: Some(now),
                task: None,
            },
        );
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Tells subscribers that the bookkeeping changed.
    fn notify(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Drops every resource whose plugin has been gone for the grace period at `now`, as
    /// the kubelet does when it next reports capacity; the dropped ones wait in
    /// `State::deleted` for [`DeviceManager::capacity`]. Returns whether any was dropped
    /// (the caller then writes the checkpoint).
    fn expire(&self, now: Instant) -> bool {
        let grace = self.config.stop_grace_period;
        let mut st = self.state();
        let expired: Vec<String> = st
            .endpoints
            .iter()
            .filter(|(_, e)| {
                e.stopped_at
                    .is_some_and(|t| now.saturating_duration_since(t) >= grace)
            })
            .map(|(r, _)| r.clone())
            .collect();
        for r in &expired {
            st.endpoints.remove(r);
            st.book.drop_resource(r);
            tracing::info!(resource = %r, "device plugin gone past its grace period; resource deleted");
        }
        let any = !expired.is_empty();
        st.deleted.extend(expired);
        any
    }

    /// When the next stopped endpoint's grace period ends, if any endpoint is stopped.
    fn next_expiry(&self) -> Option<Instant> {
        let grace = self.config.stop_grace_period;
        self.state()
            .endpoints
            .values()
            .filter_map(|e| e.stopped_at)
            .min()
            .map(|t| t + grace)
    }

    /// Deletes resources when their grace period ends, without waiting for someone to ask
    /// for capacity: node status, metrics and admission then agree that the resource is
    /// gone. Sleeps until the earliest deadline, waking on every change (an endpoint that
    /// stops starts a new deadline; one that re-registers cancels its own).
    async fn reap(self: Arc<Self>) {
        let mut changes = self.changes.subscribe();
        loop {
            let deadline = self.next_expiry();
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(d.into()).await,
                        None => std::future::pending().await,
                    }
                } => {
                    if self.expire(Instant::now()) {
                        self.write_checkpoint_logged().await;
                    }
                }
                // A checkpoint whose last write failed (a full disk) is written again until
                // it succeeds, changed or not.
                _ = tokio::time::sleep(SAVE_RETRY), if self.file.is_failing() => {
                    self.write_checkpoint_logged().await;
                }
            }
            if self.state().closed {
                return;
            }
        }
    }

    /// Writes the checkpoint of the current state. Writers queue on `write_lock` and each
    /// snapshots under it, so files land in the order the state changed.
    async fn write_checkpoint(&self) -> Result<(), DeviceError> {
        // Every change that is checkpointed passes here: tell the subscribers first.
        self.notify();
        let _guard = self.write_lock.lock().await;
        let bytes = {
            let st = self.state();
            if st.closed {
                return Ok(());
            }
            checkpoint::encode(&to_checkpoint(&st.book))
        };
        let file = self.file.clone();
        let err_path = self.config.checkpoint_path();
        tokio::task::spawn_blocking(move || {
            if let Some(dir) = file.path().parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            file.write(&bytes)
        })
        .await
        .map_err(|e| CheckpointError::Io {
            path: err_path,
            source: std::io::Error::other(e.to_string()),
        })?
        .map_err(|e| CheckpointError::Io {
            path: e.path,
            source: std::io::Error::new(e.source.kind(), format!("{}: {}", e.op, e.source)),
        })?;
        Ok(())
    }

    async fn write_checkpoint_logged(&self) {
        if let Err(e) = self.write_checkpoint().await {
            tracing::error!("{e}");
        }
    }

    /// Connects a registered plugin: dial its socket, read its options, then follow its
    /// `ListAndWatch` in a task. A new registration for a resource replaces the old endpoint.
    pub(crate) async fn connect_plugin(
        self: &Arc<Self>,
        resource: String,
        endpoint: &str,
    ) -> Result<(), DeviceError> {
        let socket = self.config.plugin_dir.join(endpoint);
        let mut client = dial(&socket)
            .await
            .map_err(|e| DeviceError::Dial(format!("{}: {e}", socket.display())))?;
        let options: PluginOptions = client
            .get_device_plugin_options(api::Empty {})
            .await
            .map_err(|s| DeviceError::rpc(&resource, "GetDevicePluginOptions", s))?
            .into_inner()
            .into();
        let generation = {
            let mut st = self.state();
            if st.closed {
                return Err(DeviceError::NotConnected(resource));
            }
            st.next_generation += 1;
            let generation = st.next_generation;
            let old = st.endpoints.insert(
                resource.clone(),
                EndpointEntry {
                    generation,
                    client: Some(client.clone()),
                    options,
                    stopped_at: None,
                    task: None,
                },
            );
            if let Some(task) = old.and_then(|o| o.task) {
                task.abort();
            }
            st.book.healthy.entry(resource.clone()).or_default();
            st.book.unhealthy.entry(resource.clone()).or_default();
            generation
        };
        self.notify();
        tracing::info!(%resource, ?options, "device plugin connected");
        let inner = Arc::clone(self);
        let task_resource = resource.clone();
        let handle = tokio::spawn(async move {
            inner.run_endpoint(task_resource, generation, client).await;
        });
        let mut st = self.state();
        match st.endpoints.get_mut(&resource) {
            Some(e) if e.generation == generation => e.task = Some(handle.abort_handle()),
            _ => handle.abort(),
        }
        Ok(())
    }

    fn is_current(st: &State, resource: &str, generation: u64) -> bool {
        st.endpoints
            .get(resource)
            .is_some_and(|e| e.generation == generation)
    }

    /// Follows one plugin's `ListAndWatch`, replacing the resource's device sets on every
    /// answer. When the stream ends, every device of the resource turns unhealthy and the
    /// grace period starts.
    async fn run_endpoint(
        self: Arc<Self>,
        resource: String,
        generation: u64,
        mut client: PluginClient,
    ) {
        let ended = async {
            let mut stream = client
                .list_and_watch(api::Empty {})
                .await?
                .into_inner();
            while let Some(resp) = stream.message().await? {
                let devices = listed_devices(&resp);
                {
                    let mut st = self.state();
                    if !Self::is_current(&st, &resource, generation) {
                        return Ok(());
                    }
                    st.book.update_devices(&resource, &devices);
                }
                tracing::debug!(%resource, devices = devices.len(), "device plugin pushed its devices");
                self.write_checkpoint_logged().await;
            }
            Ok::<(), tonic::Status>(())
        }
        .await;
        match &ended {
            Ok(()) => tracing::warn!(%resource, "ListAndWatch ended; devices marked unhealthy"),
            Err(s) => {
                tracing::warn!(%resource, "ListAndWatch failed ({}); devices marked unhealthy", s.message())
            }
        }
        {
            let mut st = self.state();
            if !Self::is_current(&st, &resource, generation) {
                return;
            }
            st.book.mark_unhealthy(&resource);
            if let Some(e) = st.endpoints.get_mut(&resource) {
                e.client = None;
                e.stopped_at = Some(Instant::now());
                e.task = None;
            }
        }
        self.write_checkpoint_logged().await;
    }

    fn stop(&self) {
        let mut st = self.state();
        st.closed = true;
        for e in st.endpoints.values_mut() {
            if let Some(task) = e.task.take() {
                task.abort();
            }
            e.client = None;
        }
    }
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
    pub async fn capacity_at(&self, now: Instant) -> Capacity {
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

    #[test]
    fn checkpoint_data_mirrors_the_book() {
        let mut book = Book::default();
        book.update_devices(
            "vendor.example/dev",
            &[("d0".into(), true, vec![]), ("d1".into(), false, vec![])],
        );
        let data = to_checkpoint(&book);
        assert_eq!(
            data.entries, None,
            "no assignments: null, as the kubelet writes"
        );
        assert_eq!(
            data.registered,
            Some(
                [(
                    "vendor.example/dev".to_string(),
                    Some(vec!["d0".to_string()])
                )]
                .into()
            ),
            "only healthy devices are registered"
        );
        let set: DeviceSet = ["d0".to_string()].into();
        book.insert("p", "c", "vendor.example/dev", &set, Default::default());
        let mut state = State::default();
        restore(&mut state, to_checkpoint(&book), Instant::now());
        assert_eq!(state.book.pods, book.pods);
        assert!(state.book.healthy["vendor.example/dev"].is_empty());
        assert!(state.endpoints["vendor.example/dev"].stopped_at.is_some());
    }
}
