//! Re-adoption: [`CriRuntime::open`] finds the sandboxes this agent made (by its label),
//! rebuilds each pod from the spec annotated on its sandbox and the containers in it, and
//! starts the relist task. Nothing is killed; exits that happened while the agent was away
//! are applied as the restart policy says.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::relist::{relist_loop, terminated};
use super::{
    lock, time_of, CriRuntime, CriRuntimeConfig, Inner, PodEntry, Slot, ANNOTATION_POD_SPEC,
    EXIT_EVENTS, LABEL_MANAGED_BY, MANAGED_BY,
};
use crate::act::cri::{self, CriError};
use crate::act::runtime::{ContainerState, PodSpec, RuntimeError};

impl Inner {
    /// Rebuilds one pod from its sandbox and containers (re-adoption).
    async fn adopt(&self, sandbox: &cri::SandboxInfo) -> Result<Option<PodEntry>, CriError> {
        let Some(spec) = sandbox
            .annotations
            .get(ANNOTATION_POD_SPEC)
            .and_then(|j| serde_json::from_str::<PodSpec>(j).ok())
        else {
            tracing::warn!(sandbox = %sandbox.id, uid = %sandbox.uid, "sandbox without a readable pod spec: left alone");
            return Ok(None);
        };
        let containers = self
            .client
            .list_containers(&cri::ContainerFilter {
                pod_sandbox_id: Some(sandbox.id.clone()),
                ..Default::default()
            })
            .await?;
        let sandbox_spec = self
            .sandbox_spec(&spec)
            .map_err(|e| CriError::BadResponse {
                rpc: "ListPodSandbox",
                what: e.to_string(),
            })?;
        let mut slots = Vec::new();
        for c in &spec.containers {
            let mut attempts: Vec<&cri::ContainerInfo> =
                containers.iter().filter(|x| x.name == c.name).collect();
            attempts.sort_by_key(|x| (x.attempt, x.created_at_ns));
            let mut slot = Slot::new(&c.name);
            let Some(current) = attempts.pop() else {
                slot.restart_at = Some(self.mono());
                slots.push(slot);
                continue;
            };
            slot.old = attempts.iter().map(|x| x.id.clone()).collect();
            slot.status.restart_count = current.attempt;
            slot.id = Some(current.id.clone());
            let status = self.client.container_status(&current.id).await?;
            match current.state {
                cri::ContainerState::Running => {
                    let pid = self.client.container_pid(&current.id).await?;
                    slot.status.state = ContainerState::Running {
                        pid: pid.unwrap_or(0),
                        started_at: time_of(status.started_at_ns),
                    };
                }
                cri::ContainerState::Created => {
                    // Created but never started (the agent stopped in between): replace it.
                    slot.restart_at = Some(self.mono());
                    if let Some(id) = slot.id.take() {
                        slot.old.push(id);
                    }
                }
                cri::ContainerState::Exited | cri::ContainerState::Unknown => {
                    // Ended while the agent was away: its state now, restart if the policy
                    // says so (the back-off starts afresh, as after a kubelet restart).
                    let ended = terminated(&status);
                    if spec.restart_policy.restarts(ended.exit_code) {
                        slot.status.last_termination = Some(ended);
                        slot.restart_at = Some(self.mono());
                        if let Some(id) = slot.id.take() {
                            slot.old.push(id);
                        }
                    } else {
                        slot.status.state = ContainerState::Terminated(ended);
                    }
                }
            }
            slots.push(slot);
        }
        tracing::info!(pod = %spec.full_name(), sandbox = %sandbox.id, "pod re-adopted");
        Ok(Some(PodEntry {
            spec,
            sandbox_id: sandbox.id.clone(),
            sandbox: sandbox_spec,
            slots,
        }))
    }
}

impl CriRuntime {
    /// Opens the runtime: re-adopts every pod this agent runs in the container runtime (see
    /// the module doc) and starts the relist task. Must be called inside a tokio runtime.
    /// Fails with [`RuntimeError::Unavailable`] if the container runtime cannot be reached,
    /// since the pods it runs could not be known.
    pub async fn open(config: CriRuntimeConfig) -> Result<CriRuntime, RuntimeError> {
        let inner = Arc::new(Inner {
            client: config.client,
            cgroup_root: config.cgroup_root,
            log_dir: config.log_dir,
            backoff: config.backoff,
            origin: Instant::now(),
            pods: Mutex::new(BTreeMap::new()),
            ops: tokio::sync::Mutex::new(()),
            exits: tokio::sync::broadcast::channel(EXIT_EVENTS).0,
            down: AtomicBool::new(false),
        });
        {
            let _ops = inner.ops.lock().await;
            let sandboxes = inner
                .client
                .list_pod_sandboxes(&cri::SandboxFilter {
                    labels: BTreeMap::from([(
                        LABEL_MANAGED_BY.to_string(),
                        MANAGED_BY.to_string(),
                    )]),
                    ..Default::default()
                })
                .await
                .map_err(|e| inner.err(e))?;
            let mut sandboxes = sandboxes;
            // Two sandboxes for one uid (a crash mid-run): the newest one wins.
            sandboxes.sort_by_key(|s| s.created_at_ns);
            for sb in &sandboxes {
                if let Some(entry) = inner.adopt(sb).await.map_err(|e| inner.err(e))? {
                    lock(&inner.pods).insert(entry.spec.uid.clone(), entry);
                }
            }
        }
        let relist = tokio::spawn(relist_loop(Arc::downgrade(&inner), config.relist_period));
        Ok(CriRuntime { inner, relist })
    }
}
