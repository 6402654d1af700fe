//! The runtime as the cloneable [`PodManager`](super::PodManager) handle sees it: what the
//! reactor loop asks of the runtime outside the owner task (container cgroups, writable
//! layers, the fence before the eviction's kill), so the loop's hot path never queues behind
//! admissions. Below both the manager (which holds one) and the loop's `PodControl` impl
//! (`node::control`, which asks it).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::act::runtime::{Runtime, RuntimeError};
use crate::decide::summary::FsStats;

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
