//! The pod manager as the reactor loop's [`PodControl`]: the loop drives eviction through the
//! pod manager's handle. The runtime view that handle keeps for the loop's hot path is
//! `node::runtime_view`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::manager::PodManager;
use super::NodeError;
use crate::act::cgroups::CgroupPath;
use crate::act::runtime::RuntimeError;
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

    fn kill_now(&self, uid: &str) -> Option<Evicted> {
        PodManager::kill_now(self, uid)
    }

    fn escalate(&self, uid: &str, cgroup: &CgroupPath) -> Evicted {
        PodManager::escalate(self, uid, cgroup)
    }

    fn note_eviction(&self, uid: &str, status: &EvictionStatus) {
        PodManager::note_eviction(self, uid, &status.reason, &status.message);
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
