//! The [`Runtime`] trait for [`ProcessRuntime`]: validating a pod, creating its container
//! cgroups and starting its supervision; stopping, fencing and reporting it.

use std::time::Duration;

use super::supervise::{initialize, supervise};
use super::{lock, waiting, ContainerRecord, First, Inner, PodEntry, ProcessRuntime};
use crate::act::cgroups::DEFAULT_REMOVE_WAIT;
use crate::act::kill::KnownProcess;
use crate::act::runtime::{
    ContainerRefused, ContainerStatus, PodSpec, PodStatus, Runtime, RuntimeError,
};

fn validate(pod: &PodSpec) -> Result<(), RuntimeError> {
    pod.validate(|c| {
        if pod.cgroup.join(&c.name).is_err() {
            return Err(ContainerRefused(format!(
                "container name {:?} cannot name a cgroup",
                c.name
            )));
        }
        if c.command.is_empty() {
            return Err(ContainerRefused(format!(
                "container {:?}: the process runtime has no images, so it needs a command",
                c.name
            )));
        }
        Ok(())
    })
}

impl Runtime for ProcessRuntime {
    async fn run_pod(&self, pod: PodSpec) -> Result<(), RuntimeError> {
        validate(&pod)?;
        let inner = &self.inner;
        if let Some(existing) = lock(&inner.pods).get(&pod.uid) {
            return Err(RuntimeError::AlreadyExists {
                uid: pod.uid.clone(),
                name: existing.spec.full_name(),
            });
        }
        // Container cgroups first, so the processes start inside them.
        let mut created = Vec::new();
        for c in &pod.containers {
            let cgroup = Inner::container_cgroup(&pod, c)?;
            let made = inner
                .cgroups
                .create(&cgroup)
                .and_then(|()| inner.cgroups.apply(&cgroup, &c.resources));
            created.push(cgroup);
            if let Err(e) = made {
                for cg in &created {
                    let _ = inner.cgroups.remove(cg, DEFAULT_REMOVE_WAIT);
                }
                return Err(e.into());
            }
        }
        let (stop, stop_rx) = inner.new_stop(&pod.uid);
        let init = pod.init_count();
        let containers = pod
            .containers
            .iter()
            .enumerate()
            .map(|(i, c)| ContainerRecord {
                status: ContainerStatus {
                    name: c.name.clone(),
                    state: if i < init || init == 0 {
                        waiting("ContainerCreating", String::new())
                    } else {
                        waiting("PodInitializing", String::new())
                    },
                    restart_count: 0,
                    last_termination: None,
                },
                pid: None,
                start_ticks: None,
                oom_kills_at_start: 0,
            })
            .collect();
        lock(&inner.pods).insert(
            pod.uid.clone(),
            PodEntry {
                spec: pod.clone(),
                containers,
                stop,
                tasks: Vec::new(),
            },
        );
        let mut tasks = Vec::new();
        if init > 0 {
            // The init containers run one after the other, then the app containers: all of
            // it in one task, which `stop_pod` awaits like any supervisor.
            for cg in &created {
                inner.clear_cgroup(cg).await;
            }
            let firsts = pod
                .containers
                .iter()
                .map(|_| Some(First::Restart))
                .collect();
            tasks.push(tokio::spawn(initialize(
                inner.clone(),
                pod.clone(),
                firsts,
                stop_rx.clone(),
            )));
        } else {
            for (i, c) in pod.containers.iter().enumerate() {
                if let Some(cg) = created.get(i) {
                    inner.clear_cgroup(cg).await;
                }
                let first = match inner.start(&pod, c, 0) {
                    Ok(p) => {
                        // Recorded before returning, so a status right after run_pod shows
                        // it; saved once below for all containers.
                        inner.record_running(&pod.uid, i, &p, false);
                        First::Running(p)
                    }
                    Err(t) => First::Failed(t),
                };
                tasks.push(tokio::spawn(supervise(
                    inner.clone(),
                    pod.clone(),
                    i,
                    first,
                    stop_rx.clone(),
                )));
            }
        }
        let saved = {
            let mut pods = lock(&inner.pods);
            if let Some(entry) = pods.get_mut(&pod.uid) {
                entry.tasks = tasks;
            }
            inner.save(&pods)
        };
        if let Err(e) = saved {
            // Processes the checkpoint does not know would be orphans after a restart: undo.
            let _ = self.stop_pod(&pod.uid, Duration::ZERO).await;
            return Err(e);
        }
        Ok(())
    }

    async fn stop_pod(&self, uid: &str, grace: Duration) -> Result<PodStatus, RuntimeError> {
        let inner = &self.inner;
        let (tasks, spec) = {
            let mut pods = lock(&inner.pods);
            let entry = pods.get_mut(uid).ok_or_else(|| RuntimeError::NotFound {
                uid: uid.to_string(),
            })?;
            entry.stop.send_replace(Some(grace));
            (std::mem::take(&mut entry.tasks), entry.spec.clone())
        };
        for task in tasks {
            let _ = task.await;
        }
        for c in &spec.containers {
            let cgroup = Inner::container_cgroup(&spec, c)?;
            inner
                .cgroups
                .remove_off_runtime(&cgroup, DEFAULT_REMOVE_WAIT)
                .await?;
        }
        let mut pods = lock(&inner.pods);
        let entry = pods.remove(uid).ok_or_else(|| RuntimeError::NotFound {
            uid: uid.to_string(),
        })?;
        lock(&inner.stops).remove(uid);
        lock(&inner.held).remove(uid);
        // The pod is stopped whether or not this is written (a full disk): the failure is
        // reported by the checkpoint and the write retried until it succeeds.
        let _ = inner.save(&pods);
        Ok(Inner::status_of(&entry))
    }

    fn fence(&self, uid: &str) {
        // A stop with grace 0 asked now: the supervisors restart nothing from here on
        // (`supervise` checks it before every restart) and kill what still runs.
        if let Some(signal) = lock(&self.inner.stops).get(uid) {
            signal.send_if_modified(|stop| {
                let first = stop.is_none();
                if first {
                    *stop = Some(Duration::ZERO);
                }
                first
            });
        }
    }

    fn known_processes(&self, uid: &str) -> Vec<KnownProcess> {
        lock(&self.inner.held)
            .get(uid)
            .into_iter()
            .flat_map(|pod| pod.values())
            .filter_map(|(pid, fd)| {
                Some(KnownProcess {
                    pid: *pid,
                    pidfd: fd.try_clone().ok()?,
                })
            })
            .collect()
    }

    async fn pod_status(&self, uid: &str) -> Result<PodStatus, RuntimeError> {
        lock(&self.inner.pods)
            .get(uid)
            .map(Inner::status_of)
            .ok_or_else(|| RuntimeError::NotFound {
                uid: uid.to_string(),
            })
    }

    async fn list_pods(&self) -> Result<Vec<PodStatus>, RuntimeError> {
        Ok(lock(&self.inner.pods)
            .values()
            .map(Inner::status_of)
            .collect())
    }

    fn pod_document(&self, uid: &str) -> Option<serde_json::Value> {
        lock(&self.inner.pods)
            .get(uid)
            .and_then(|p| p.spec.document.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::cgroups::CgroupPath;
    use crate::act::runtime::ContainerSpec;

    #[test]
    fn validation_names_the_problem() {
        let pod = |c: ContainerSpec| PodSpec {
            uid: "u".into(),
            namespace: "default".into(),
            name: "p".into(),
            cgroup: CgroupPath::pod(None, "u").unwrap(),
            restart_policy: Default::default(),
            containers: vec![c],
            document: None,
        };
        let c = ContainerSpec {
            name: "web".into(),
            image: String::new(),
            command: vec![],
            args: vec![],
            env: vec![],
            resources: Default::default(),
            oom_score_adj: 0,
            ..Default::default()
        };
        let err = validate(&pod(c.clone())).unwrap_err().to_string();
        assert!(err.contains("needs a command"), "{err}");
        let bad = ContainerSpec {
            name: "..".into(),
            command: vec!["x".into()],
            ..c.clone()
        };
        assert!(validate(&pod(bad))
            .unwrap_err()
            .to_string()
            .contains("cannot name a cgroup"));
        let bad = ContainerSpec {
            oom_score_adj: 1001,
            command: vec!["x".into()],
            ..c.clone()
        };
        assert!(validate(&pod(bad))
            .unwrap_err()
            .to_string()
            .contains("outside"));
        // Init containers lead the list and need an app container after them.
        let init = ContainerSpec {
            name: "setup".into(),
            command: vec!["x".into()],
            init: true,
            ..c.clone()
        };
        let app = ContainerSpec {
            command: vec!["x".into()],
            ..c
        };
        let mut p = pod(init.clone());
        let err = validate(&p).unwrap_err().to_string();
        assert!(err.contains("no app containers"), "{err}");
        p.containers = vec![app.clone(), init.clone()];
        let err = validate(&p).unwrap_err().to_string();
        assert!(err.contains("must come before"), "{err}");
        p.containers = vec![init, app];
        validate(&p).unwrap();
    }
}
