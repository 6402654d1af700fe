//! The [`Runtime`] trait for [`CriRuntime`]: validating a pod, running its sandbox and
//! first attempts, fencing and stopping it (all containers at once, each with the full grace
//! period, as the kubelet does), and reporting what the runtime reports.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use super::relist::{lost, terminated};
use super::{lock, CriRuntime, Inner, PodEntry, Slot};
use crate::act::cri::{self, CriError};
use crate::act::runtime::{
    ContainerRefused, ContainerState, PodSpec, PodStatus, RestartPolicy, Runtime, RuntimeError,
};

fn validate(pod: &PodSpec) -> Result<(), RuntimeError> {
    let invalid = |reason: &str| RuntimeError::InvalidPod {
        pod: pod.full_name(),
        reason: reason.into(),
    };
    if pod.name.is_empty() || pod.namespace.is_empty() {
        return Err(invalid(
            "a pod needs metadata.uid, metadata.name and metadata.namespace",
        ));
    }
    if pod.containers.is_empty() {
        return Err(invalid("no containers"));
    }
    pod.validate(|c| {
        if c.init {
            return Err(ContainerRefused(format!(
                "init container {:?}: the CRI runtime does not run init containers yet",
                c.name
            )));
        }
        if c.image.is_empty() {
            return Err(ContainerRefused(format!(
                "container {:?} has no image",
                c.name
            )));
        }
        Ok(())
    })
}

/// No container of `entry` is created again: the restart policy is `Never` from now on and
/// no back-off restart is pending. Runs under the `pods` lock only, never `ops`, so an
/// eviction can fence a pod while a relist or another stop holds the CRI connection.
fn fence_entry(entry: &mut PodEntry) {
    entry.spec.restart_policy = RestartPolicy::Never;
    for slot in &mut entry.slots {
        slot.restart_at = None;
    }
}

impl Runtime for CriRuntime {
    async fn run_pod(&self, pod: PodSpec) -> Result<(), RuntimeError> {
        validate(&pod)?;
        let inner = &self.inner;
        let sandbox = inner.sandbox_spec(&pod)?;
        let _ops = inner.ops.lock().await;
        if let Some(existing) = lock(&inner.pods).get(&pod.uid) {
            return Err(RuntimeError::AlreadyExists {
                uid: pod.uid.clone(),
                name: existing.spec.full_name(),
            });
        }
        if let Some(dir) = &sandbox.log_directory {
            std::fs::create_dir_all(dir).map_err(|source| RuntimeError::Io {
                what: format!("create log dir {}", dir.display()),
                source,
            })?;
        }
        let sandbox_id = inner
            .client
            .run_pod_sandbox(&sandbox)
            .await
            .map_err(|e| inner.err(e))?;
        let slots = pod.containers.iter().map(|c| Slot::new(&c.name)).collect();
        lock(&inner.pods).insert(
            pod.uid.clone(),
            PodEntry {
                spec: pod.clone(),
                sandbox_id: sandbox_id.clone(),
                sandbox: sandbox.clone(),
                slots,
            },
        );
        for idx in 0..pod.containers.len() {
            let started = match inner
                .start_attempt(&pod, &sandbox_id, &sandbox, idx, 0)
                .await
            {
                Ok(s) => s,
                Err(e) => {
                    // Half a pod must not be left behind: undo what exists.
                    lock(&inner.pods).remove(&pod.uid);
                    let _ = inner.client.stop_pod_sandbox(&sandbox_id).await;
                    let _ = inner.client.remove_pod_sandbox(&sandbox_id).await;
                    return Err(inner.err(e));
                }
            };
            let mut pods = lock(&inner.pods);
            let Some(entry) = pods.get_mut(&pod.uid) else {
                break;
            };
            match started {
                Ok((id, pid)) => {
                    if let Some(slot) = entry.slots.get_mut(idx) {
                        slot.status.state = ContainerState::Running {
                            pid: pid.unwrap_or(0),
                            started_at: SystemTime::now(),
                        };
                        slot.id = Some(id);
                    }
                }
                Err(t) => inner.on_exit(entry, idx, t, true),
            }
        }
        // A container that could not start at once and restarts without delay.
        inner.restart_due().await.map_err(|e| inner.err(e))?;
        Ok(())
    }

    fn fence(&self, uid: &str) {
        if let Some(entry) = lock(&self.inner.pods).get_mut(uid) {
            fence_entry(entry);
        }
    }

    async fn stop_pod(&self, uid: &str, grace: Duration) -> Result<PodStatus, RuntimeError> {
        let inner = &self.inner;
        let _ops = inner.ops.lock().await;
        let (sandbox_id, ids) = {
            let mut pods = lock(&inner.pods);
            let entry = pods.get_mut(uid).ok_or_else(|| RuntimeError::NotFound {
                uid: uid.to_string(),
            })?;
            // From here on the pod never restarts, even if this stop fails midway (the
            // runtime went down): a later relist must not bring back containers the caller
            // killed (an eviction SIGKILLs them itself), only a later stop finishes the job.
            fence_entry(entry);
            let ids: Vec<(usize, String)> = entry
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| matches!(s.status.state, ContainerState::Running { .. }))
                .filter_map(|(i, s)| s.id.clone().map(|id| (i, id)))
                .collect();
            (entry.sandbox_id.clone(), ids)
        };
        // All containers at once, each with the full grace period, as the kubelet does.
        let mut stops = tokio::task::JoinSet::new();
        for (idx, id) in ids {
            let client = inner.client.clone();
            stops.spawn(async move {
                let status = match client.stop_container(&id, grace).await {
                    Ok(()) | Err(CriError::NotFound { .. }) => client.container_status(&id).await,
                    Err(e) => Err(e),
                };
                (idx, status)
            });
        }
        let mut finals = Vec::new();
        let mut failure = None;
        while let Some(done) = stops.join_next().await {
            let Ok((idx, status)) = done else { continue };
            match status {
                Ok(s) => finals.push((idx, terminated(&s))),
                Err(e) if e.is_not_found() => finals.push((idx, lost())),
                Err(e) => failure = Some(e),
            }
        }
        if let Some(e) = failure {
            return Err(inner.err(e));
        }
        for r in [
            inner.client.stop_pod_sandbox(&sandbox_id).await,
            inner.client.remove_pod_sandbox(&sandbox_id).await,
        ] {
            match r {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(inner.err(e)),
            }
        }
        let mut pods = lock(&inner.pods);
        let mut entry = pods.remove(uid).ok_or_else(|| RuntimeError::NotFound {
            uid: uid.to_string(),
        })?;
        for (idx, t) in finals {
            if let Some(slot) = entry.slots.get_mut(idx) {
                slot.status.state = ContainerState::Terminated(t);
            }
        }
        for slot in &mut entry.slots {
            if let ContainerState::Waiting { .. } = slot.status.state {
                if let Some(t) = slot.status.last_termination.clone() {
                    slot.status.state = ContainerState::Terminated(t);
                }
            }
        }
        Ok(Inner::status_of(&entry))
    }

    async fn pod_status(&self, uid: &str) -> Result<PodStatus, RuntimeError> {
        self.inner.refresh().await?;
        lock(&self.inner.pods)
            .get(uid)
            .map(Inner::status_of)
            .ok_or_else(|| RuntimeError::NotFound {
                uid: uid.to_string(),
            })
    }

    fn container_cgroups(&self, uid: &str) -> Option<BTreeMap<String, String>> {
        // Container cgroups are named by container id (`<pod cgroup>/<id>`).
        self.container_ids(uid).map(|(_, ids)| ids)
    }

    async fn writable_layers(
        &self,
        uid: &str,
    ) -> Result<BTreeMap<String, crate::decide::summary::FsStats>, RuntimeError> {
        let Some((sandbox, ids)) = self.container_ids(uid) else {
            return Err(RuntimeError::NotFound {
                uid: uid.to_string(),
            });
        };
        let stats = self
            .inner
            .client
            .list_container_stats(&cri::StatsFilter {
                pod_sandbox_id: Some(sandbox),
                ..Default::default()
            })
            .await
            .map_err(|e| self.inner.err(e))?;
        // Stats name containers by id; the loop knows them by name.
        Ok(stats
            .into_iter()
            .filter(|s| s.writable_layer_bytes.is_some() || s.writable_layer_inodes.is_some())
            .filter_map(|s| {
                let name = ids.iter().find(|(_, id)| **id == s.id)?.0.clone();
                let fs = crate::decide::summary::FsStats {
                    used_bytes: s.writable_layer_bytes,
                    inodes_used: s.writable_layer_inodes,
                };
                Some((name, fs))
            })
            .collect())
    }

    fn pod_document(&self, uid: &str) -> Option<serde_json::Value> {
        lock(&self.inner.pods)
            .get(uid)
            .and_then(|p| p.spec.document.clone())
    }

    async fn list_pods(&self) -> Result<Vec<PodStatus>, RuntimeError> {
        self.inner.refresh_unless_busy().await?;
        Ok(lock(&self.inner.pods)
            .values()
            .map(Inner::status_of)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::cgroups::CgroupPath;
    use crate::act::runtime::ContainerSpec;

    fn pod(containers: Vec<ContainerSpec>) -> PodSpec {
        PodSpec {
            uid: "u1".into(),
            namespace: "default".into(),
            name: "p".into(),
            cgroup: CgroupPath::pod(Some("burstable"), "u1").unwrap(),
            restart_policy: Default::default(),
            containers,
            document: None,
        }
    }

    fn c(name: &str, image: &str) -> ContainerSpec {
        ContainerSpec {
            name: name.into(),
            image: image.into(),
            ..Default::default()
        }
    }

    #[test]
    fn validation_names_the_problem() {
        let e = validate(&pod(vec![c("a", "")])).unwrap_err().to_string();
        assert!(e.contains("has no image"), "{e}");
        let e = validate(&pod(vec![c("a", "i"), c("a", "i")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("used twice"), "{e}");
        let e = validate(&pod(vec![])).unwrap_err().to_string();
        assert!(e.contains("no containers"), "{e}");
        let init = ContainerSpec {
            init: true,
            ..c("setup", "i")
        };
        let e = validate(&pod(vec![init, c("a", "i")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("init container \"setup\""), "{e}");
        let mut bad = c("a", "i");
        bad.oom_score_adj = -1001;
        assert!(validate(&pod(vec![bad]))
            .unwrap_err()
            .to_string()
            .contains("outside"));
        assert!(validate(&pod(vec![c("a", "i")])).is_ok());
    }
}
