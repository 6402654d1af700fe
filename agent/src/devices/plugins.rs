//! The device manager's shared state and the plugins it follows: the bookkeeping ([`Book`])
//! behind one short-held lock, each registered plugin's connection and `ListAndWatch` task,
//! the grace-period reaper, and the checkpoint kept current after every change. Shared by
//! the public handle (`devices::manager`), the registration service
//! (`devices::registration`) and the endpoint tasks; RPCs to plugins are always made outside
//! the lock.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use reactor_proto::deviceplugin_v1beta1 as api;
use tokio::task::AbortHandle;

use super::allocate::{Assignment, Book};
use super::checkpoint::{self, CheckpointError, Data, Entry};
use super::endpoint::{
    decode_response, dial, encode_response, listed_devices, PluginClient, PluginOptions,
};
use super::error::DeviceError;
use super::settings::DeviceManagerConfig;
use super::types::DeviceSet;
use crate::record::state_file::StateFile;

/// How often a checkpoint whose last write failed is written again.
const SAVE_RETRY: Duration = Duration::from_secs(2);

pub(super) struct EndpointEntry {
    pub(super) generation: u64,
    pub(super) client: Option<PluginClient>,
    pub(super) options: PluginOptions,
    pub(super) stopped_at: Option<Instant>,
    pub(super) task: Option<AbortHandle>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) book: Book,
    pub(super) endpoints: BTreeMap<String, EndpointEntry>,
    pub(super) next_generation: u64,
    pub(super) closed: bool,
    /// Resources dropped after their grace period that [`DeviceManager::capacity`] has not
    /// reported yet.
    pub(super) deleted: Vec<String>,
}

/// Shared by the public handle, the registration service and the endpoint tasks.
pub(crate) struct Inner {
    pub(super) config: DeviceManagerConfig,
    pub(super) state: Mutex<State>,
    pub(super) write_lock: tokio::sync::Mutex<()>,
    /// The checkpoint file, with its previous generation (`record::state_file`).
    pub(super) file: StateFile,
    /// Bumped after every change of devices, health or assignments, so metrics and the
    /// grace-period reaper follow the state without polling it.
    pub(super) changes: tokio::sync::watch::Sender<u64>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
pub(super) fn restore(state: &mut State, data: Data, now: Instant) {
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
    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Tells subscribers that the bookkeeping changed.
    pub(super) fn notify(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Drops every resource whose plugin has been gone for the grace period at `now`, as
    /// the kubelet does when it next reports capacity; the dropped ones wait in
    /// `State::deleted` for [`DeviceManager::capacity`]. Returns whether any was dropped
    /// (the caller then writes the checkpoint).
    pub(super) fn expire(&self, now: Instant) -> bool {
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
    pub(super) fn next_expiry(&self) -> Option<Instant> {
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
    pub(super) async fn reap(self: Arc<Self>) {
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
    pub(super) async fn write_checkpoint(&self) -> Result<(), DeviceError> {
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

    pub(super) async fn write_checkpoint_logged(&self) {
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

    pub(super) fn is_current(st: &State, resource: &str, generation: u64) -> bool {
        st.endpoints
            .get(resource)
            .is_some_and(|e| e.generation == generation)
    }

    /// Follows one plugin's `ListAndWatch`, replacing the resource's device sets on every
    /// answer. When the stream ends, every device of the resource turns unhealthy and the
    /// grace period starts.
    pub(super) async fn run_endpoint(
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

    pub(super) fn stop(&self) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
