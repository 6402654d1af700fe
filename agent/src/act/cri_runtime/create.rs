//! Creating what runs a pod: the sandbox spec (cgroup parent, kubelet labels, the pod spec
//! as an annotation), each container's CRI spec, and one attempt of a container created and
//! started. A refused create or start becomes the attempt's `StartError`, so the restart
//! policy treats it like any failed run.

use std::collections::BTreeMap;
use std::time::SystemTime;

use super::{
    Inner, ANNOTATION_POD_SPEC, LABEL_CONTAINER_NAME, LABEL_MANAGED_BY, LABEL_POD_NAME,
    LABEL_POD_NAMESPACE, LABEL_POD_UID, MANAGED_BY,
};
use crate::act::cgroups::Resources;
use crate::act::cri::{self, CriError};
use crate::act::runtime::{ContainerSpec, PodSpec, RuntimeError, Terminated};
use crate::decide::cgroups::{MEMORY_HIGH, MEMORY_LOW, MEMORY_MIN, MEMORY_SWAP_MAX};

/// The cgroup values as CRI carries them: "unlimited" (`-1`) is CRI's "unset".
fn cri_resources(r: &Resources, oom_score_adj: i32) -> cri::LinuxResources {
    cri::LinuxResources {
        cpu_shares: r.cpu_shares,
        cpu_quota_us: r.cpu_quota_us.and_then(|q| u64::try_from(q).ok()),
        cpu_period_us: r.cpu_period_us,
        memory_limit_bytes: r.memory_limit_bytes.and_then(|m| u64::try_from(m).ok()),
        oom_score_adj: Some(i64::from(oom_score_adj)),
        unified: unified(r),
    }
}

/// The container's cgroup v2 files that CRI carries only in `unified`, as the kubelet passes
/// them: `memory.oom.group` (only ever set on v2, `NodeSettings::oom_group`, so the kernel's
/// OOM killer ends the whole container), and Memory QoS's `memory.min` / `memory.high` and
/// the swap limit `memory.swap.max` (decided on v2 only).
fn unified(r: &Resources) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if r.memory_oom_group == Some(true) {
        out.insert("memory.oom.group".to_string(), "1".to_string());
    }
    for (name, value) in [
        (MEMORY_MIN, r.memory_min),
        (MEMORY_LOW, r.memory_low),
        (MEMORY_HIGH, r.memory_high),
        (MEMORY_SWAP_MAX, r.memory_swap_max),
    ] {
        if let Some(v) = value {
            out.insert(name.to_string(), v.to_string());
        }
    }
    out
}

fn start_error(message: String) -> Terminated {
    let now = SystemTime::now();
    Terminated {
        exit_code: 128,
        signal: None,
        reason: "StartError".into(),
        message,
        started_at: now,
        finished_at: now,
    }
}

impl Inner {
    pub(super) fn sandbox_spec(&self, pod: &PodSpec) -> Result<cri::PodSandboxSpec, RuntimeError> {
        let spec_json = serde_json::to_string(pod).map_err(|e| RuntimeError::InvalidPod {
            pod: pod.full_name(),
            reason: format!("cannot record the pod spec: {e}"),
        })?;
        let mut parent = self.cgroup_root.clone();
        for n in pod.cgroup.names() {
            parent = parent.join(n)?;
        }
        Ok(cri::PodSandboxSpec {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            attempt: 0,
            hostname: pod.name.clone(),
            log_directory: Some(
                self.log_dir
                    .join(format!("{}_{}_{}", pod.namespace, pod.name, pod.uid)),
            ),
            labels: BTreeMap::from([
                (LABEL_POD_UID.to_string(), pod.uid.clone()),
                (LABEL_POD_NAME.to_string(), pod.name.clone()),
                (LABEL_POD_NAMESPACE.to_string(), pod.namespace.clone()),
                (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
            ]),
            annotations: BTreeMap::from([(ANNOTATION_POD_SPEC.to_string(), spec_json)]),
            cgroup_parent: parent.to_string(),
            network: cri::NamespaceMode::Node,
            pid: cri::NamespaceMode::Pod,
            ipc: cri::NamespaceMode::Pod,
            resources: None,
        })
    }

    fn container_spec(pod: &PodSpec, c: &ContainerSpec, attempt: u32) -> cri::ContainerSpec {
        cri::ContainerSpec {
            name: c.name.clone(),
            attempt,
            image: c.image.clone(),
            command: c.command.clone(),
            args: c.args.clone(),
            working_dir: None,
            env: c.env.clone(),
            mounts: c
                .mounts
                .iter()
                .map(|m| cri::Mount {
                    container_path: m.container_path.clone(),
                    host_path: m.host_path.clone(),
                    readonly: m.read_only,
                })
                .collect(),
            devices: c
                .devices
                .iter()
                .map(|d| cri::Device {
                    container_path: d.container_path.clone(),
                    host_path: d.host_path.clone(),
                    permissions: d.permissions.clone(),
                })
                .collect(),
            labels: BTreeMap::from([
                (LABEL_POD_UID.to_string(), pod.uid.clone()),
                (LABEL_POD_NAME.to_string(), pod.name.clone()),
                (LABEL_POD_NAMESPACE.to_string(), pod.namespace.clone()),
                (LABEL_CONTAINER_NAME.to_string(), c.name.clone()),
                (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
            ]),
            annotations: c.annotations.iter().cloned().collect(),
            log_path: Some(format!("{}_{attempt}.log", c.name)),
            resources: cri_resources(&c.resources, c.oom_score_adj),
        }
    }

    /// Creates and starts one attempt of container `idx`. `Err` only when the runtime is
    /// down; a refused create or start comes back as the run's [`Terminated`].
    pub(super) async fn start_attempt(
        &self,
        pod: &PodSpec,
        sandbox_id: &str,
        sandbox: &cri::PodSandboxSpec,
        idx: usize,
        attempt: u32,
    ) -> Result<Result<(String, Option<u32>), Terminated>, CriError> {
        let Some(c) = pod.containers.get(idx) else {
            return Ok(Err(start_error("no such container".into())));
        };
        let spec = Self::container_spec(pod, c, attempt);
        let id = match self
            .client
            .create_container(sandbox_id, &spec, sandbox)
            .await
        {
            Ok(id) => id,
            Err(e) if e.is_runtime_down() => return Err(e),
            Err(e) => {
                tracing::warn!(pod = %pod.full_name(), container = %c.name, error = %e, "container not created");
                return Ok(Err(start_error(e.to_string())));
            }
        };
        if let Err(e) = self.client.start_container(&id).await {
            if e.is_runtime_down() {
                return Err(e);
            }
            tracing::warn!(pod = %pod.full_name(), container = %c.name, error = %e, "container did not start");
            let _ = self.client.remove_container(&id).await;
            let mut hint = String::new();
            if c.oom_score_adj < 0 {
                hint = " (a negative oom_score_adj needs CAP_SYS_RESOURCE)".into();
            }
            return Ok(Err(start_error(format!("{e}{hint}"))));
        }
        let pid = self.client.container_pid(&id).await?;
        tracing::info!(pod = %pod.full_name(), container = %c.name, id = %id, attempt, "container started");
        Ok(Ok((id, pid)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_values_are_left_unset_for_cri() {
        let r = cri_resources(
            &Resources {
                cpu_shares: Some(2),
                cpu_quota_us: Some(-1),
                cpu_period_us: Some(100_000),
                memory_limit_bytes: Some(-1),
                pids_max: None,
                memory_oom_group: None,
                ..Default::default()
            },
            1000,
        );
        assert_eq!(r.cpu_quota_us, None);
        assert_eq!(r.memory_limit_bytes, None);
        assert_eq!(r.cpu_shares, Some(2));
        assert_eq!(r.oom_score_adj, Some(1000));
        assert!(r.unified.is_empty());
    }

    #[test]
    fn a_container_oom_group_goes_to_the_runtime_as_unified() {
        let group = |g| {
            cri_resources(
                &Resources {
                    memory_oom_group: g,
                    ..Default::default()
                },
                0,
            )
            .unified
        };
        assert_eq!(
            group(Some(true)),
            BTreeMap::from([("memory.oom.group".to_string(), "1".to_string())])
        );
        assert!(group(Some(false)).is_empty());
        assert!(group(None).is_empty());
    }

    #[test]
    fn memory_qos_and_swap_go_to_the_runtime_as_unified() {
        let u = cri_resources(
            &Resources {
                memory_oom_group: Some(true),
                memory_min: Some(128 << 20),
                memory_high: Some(255_012_864),
                memory_swap_max: Some(0),
                ..Default::default()
            },
            0,
        )
        .unified;
        assert_eq!(
            u,
            BTreeMap::from([
                ("memory.high".to_string(), "255012864".to_string()),
                ("memory.min".to_string(), "134217728".to_string()),
                ("memory.oom.group".to_string(), "1".to_string()),
                ("memory.swap.max".to_string(), "0".to_string()),
            ])
        );
    }
}
