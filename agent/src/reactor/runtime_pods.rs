//! [`PodControl`] without a pod manager: the loop's port implemented directly over a
//! [`Runtime`] and the cgroup writer, for nodes (and tests) that run their pods through a
//! runtime themselves. Its kills are [`crate::act::kill`]'s, as the pod manager's are.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::pods::{
    writable_layers_of, ActivePod, ActivePods, EvictError, Evicted, EvictionStatus, PodControl,
};
use crate::act::cgroups::{CgroupManager, CgroupPath};
use crate::act::kill::{kill_cgroup_now, stop_and_kill};
use crate::act::runtime::{Runtime, RuntimeError};
use crate::decide::summary::FsStats;

/// [`PodControl`] over a [`Runtime`] and the cgroup writer: the pods are registered by the
/// caller (who created their cgroups and ran them), eviction stops them through the runtime
/// and removes the pod cgroup, and the final statuses are kept for the caller to read.
pub struct RuntimePods<R> {
    runtime: Arc<R>,
    cgroups: CgroupManager,
    pods: Mutex<BTreeMap<String, ActivePod>>,
    /// `pods` as the loop asks for them, rebuilt on every change: an eviction's pass takes
    /// them at once instead of copying every pod on its way to the SIGKILL. Also the change
    /// feed ([`PodControl::changes`]): the loop opens a new pod's files when it is added, as
    /// it does under the pod manager, not between the kernel's event and the kill.
    listed: tokio::sync::watch::Sender<ActivePods>,
    evicted: Mutex<BTreeMap<String, EvictionStatus>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<R: Runtime> RuntimePods<R> {
    /// An adapter with no pods yet.
    pub fn new(runtime: Arc<R>, cgroups: CgroupManager) -> RuntimePods<R> {
        RuntimePods {
            runtime,
            cgroups,
            pods: Mutex::new(BTreeMap::new()),
            listed: tokio::sync::watch::Sender::new(Arc::new([])),
            evicted: Mutex::new(BTreeMap::new()),
        }
    }

    /// Changes the pods and the list [`PodControl::pods`] hands out, under one lock.
    fn change<T>(&self, f: impl FnOnce(&mut BTreeMap<String, ActivePod>) -> T) -> T {
        let mut pods = lock(&self.pods);
        let out = f(&mut pods);
        self.listed.send_replace(pods.values().cloned().collect());
        out
    }

    /// Registers a pod the caller runs through the runtime.
    pub fn add(&self, pod: ActivePod) {
        self.change(|pods| pods.insert(pod.info.uid.clone(), pod));
    }

    /// Forgets a pod (stopped by the caller).
    pub fn remove(&self, uid: &str) -> Option<ActivePod> {
        self.change(|pods| pods.remove(uid))
    }

    /// The final status of an evicted pod.
    pub fn eviction_status(&self, uid: &str) -> Option<EvictionStatus> {
        lock(&self.evicted).get(uid).cloned()
    }

    /// Every eviction so far, by uid.
    pub fn evictions(&self) -> BTreeMap<String, EvictionStatus> {
        lock(&self.evicted).clone()
    }
}

impl<R: Runtime> PodControl for RuntimePods<R> {
    fn pods(&self) -> ActivePods {
        self.listed.borrow().clone()
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<ActivePods>> {
        let mut rx = self.listed.subscribe();
        rx.mark_unchanged();
        Some(rx)
    }

    fn kill_now(&self, uid: &str) -> Option<Evicted> {
        let cgroup = lock(&self.pods).get(uid).map(|p| p.cgroup.clone())?;
        self.runtime.fence(uid);
        let known = self.runtime.known_processes(uid);
        Some(kill_cgroup_now(&self.cgroups, &cgroup, known))
    }

    fn escalate(&self, _uid: &str, cgroup: &CgroupPath) -> Evicted {
        kill_cgroup_now(&self.cgroups, cgroup, Vec::new())
    }

    async fn evict(
        &self,
        uid: &str,
        grace: Duration,
        status: EvictionStatus,
        killed: Option<Evicted>,
    ) -> Result<Evicted, EvictError> {
        let Some(pod) = lock(&self.pods).get(uid).cloned() else {
            return Err(RuntimeError::NotFound {
                uid: uid.to_string(),
            }
            .into());
        };
        let kill_in = Some(&pod.cgroup).filter(|_| killed.is_none());
        let (result, mut out) =
            stop_and_kill(&*self.runtime, uid, grace, kill_in, &self.cgroups).await;
        if let Some(k) = killed {
            out = k;
        }
        // The pod is gone from the node whatever the runtime says about its last moments.
        self.change(|pods| pods.remove(uid));
        lock(&self.evicted).insert(uid.to_string(), status);
        match result {
            Ok(_) | Err(RuntimeError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        self.cgroups
            .remove_off_runtime(&pod.cgroup, Duration::from_secs(2))
            .await?;
        Ok(out)
    }

    async fn writable_layers(&self) -> BTreeMap<String, BTreeMap<String, FsStats>> {
        let uids: Vec<String> = lock(&self.pods).keys().cloned().collect();
        writable_layers_of(uids, |uid| async move {
            self.runtime.writable_layers(&uid).await
        })
        .await
    }
}
