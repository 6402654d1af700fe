//! The pod manager as the reactor loop's [`PodControl`], and the runtime view the cloneable
//! handle keeps for the loop's hot path (container cgroups, writable layers, the eviction's fence) so it never
//! queues behind admissions.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::manager::PodManager;
use super::NodeError;
use crate::act::runtime::{Runtime, RuntimeError};
use crate::decide::summary::FsStats;
use crate::reactor::pods::{
    writable_layers_of, ActivePods, EvictError, Evicted, EvictionStatus, PodControl,
};

/// The reactor loop drives eviction through the pod manager, so an evicted pod ends with its
/// status recorded, checkpointed and published like any other change on the node.
impl PodControl for PodManager {
    fn pods(&self) -> ActivePods {
        self.active()
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<ActivePods>> {
        let mut rx = self.active.clone();
        rx.mark_unchanged();
        Some(rx)
    }

    fn kill_now(&self, uid: &str, status: &EvictionStatus) -> Option<Evicted> {
        PodManager::kill_now(self, uid, &status.reason, &status.message)
    }

    async fn evict(
        &self,
        uid: &str,
        grace: Duration,
        status: EvictionStatus,
        killed: Option<Evicted>,
    ) -> Result<Evicted, EvictError> {
        PodManager::evict_killed(self, uid, grace, &status.reason, &status.message, killed)
            .await
            .map_err(|e| match e {
                NodeError::Runtime(r) => EvictError::Runtime(r),
                NodeError::Cgroup(c) => EvictError::Cgroup(c),
                NodeError::NotFound(_) => EvictError::Runtime(RuntimeError::NotFound {
                    uid: uid.to_string(),
                }),
                other => EvictError::Runtime(RuntimeError::Unavailable {
                    reason: other.to_string(),
                }),
            })
            .map(|done| done.killed)
    }

    async fn writable_layers(&self) -> BTreeMap<String, BTreeMap<String, FsStats>> {
        let uids: Vec<String> = self
            .active
            .borrow()
            .iter()
            .map(|p| p.info.uid.clone())
            .collect();
        writable_layers_of(uids, |uid| async move {
            self.runtime.writable_layers(&uid).await
        })
        .await
    }
}

/// The boxed future [`RuntimeView::writable_layers`] returns.
type LayersFuture<'a> = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = Result<BTreeMap<String, FsStats>, RuntimeError>>
            + Send
            + 'a,
    >,
>;

/// What the reactor loop asks of the runtime outside the owner task (it must not queue
/// behind admissions): container cgroup names, writable-layer figures, and the fence before the eviction's kill. Object safe, so
/// the cloneable [`PodManager`] handle holds any runtime.
pub(super) trait RuntimeView: Send + Sync {
    fn container_cgroups(&self, uid: &str) -> Option<BTreeMap<String, String>>;
    fn fence(&self, uid: &str);
    fn known_processes(&self, uid: &str) -> Vec<crate::act::kill::KnownProcess>;
    fn writable_layers<'a>(&'a self, uid: &'a str) -> LayersFuture<'a>;
}

pub(super) struct View<R>(pub(super) Arc<R>);

impl<R: Runtime> RuntimeView for View<R> {
    fn container_cgroups(&self, uid: &str) -> Option<BTreeMap<String, String>> {
        self.0.container_cgroups(uid)
    }

    fn fence(&self, uid: &str) {
        self.0.fence(uid);
    }

    fn known_processes(&self, uid: &str) -> Vec<crate::act::kill::KnownProcess> {
        self.0.known_processes(uid)
    }

    fn writable_layers<'a>(&'a self, uid: &'a str) -> LayersFuture<'a> {
        Box::pin(self.0.writable_layers(uid))
    }
}
