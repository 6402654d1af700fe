//! Supervision by relisting, as the kubelet's PLEG does: each pass reads the exits the
//! runtime reports (waiting briefly for containerd's `OOMKilled`), publishes them, applies
//! `restartPolicy` with the back-off by creating the next attempt when it is due, and removes
//! attempts no longer needed. The relist task runs one pass per period and rides out a
//! runtime outage.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::{Duration, SystemTime};

use super::{lock, time_of, waiting, Inner, PodEntry, LABEL_MANAGED_BY, MANAGED_BY};
use crate::act::cri::{self, CriError};
use crate::act::runtime::{ContainerExit, ContainerState, PodSpec, RuntimeError, Terminated};

/// How long a listing waits for a CRI sequence in flight before it answers from the last
/// relist ([`Inner::refresh_unless_busy`]).
const LIST_WAIT: Duration = Duration::from_secs(1);

/// How long after a SIGKILL exit the runtime may still fill in the reason (`OOMKilled`).
const REASON_SETTLE: Duration = Duration::from_millis(500);

/// Whether an exit is too fresh to judge: killed by SIGKILL (137), no reason yet, and
/// finished less than [`REASON_SETTLE`] ago. containerd's CRI answers `Error` for an exited
/// container whose reason is still empty (it fills the word in when it builds the status),
/// so a fresh `Error` is no reason yet either; the wait was dead code against containerd
/// before it took that word in. (An OOM kill before containerd's shim watches the container,
/// in its first moments, stays `Error` for good: containerd never learns of it.)
fn reason_may_follow(s: &cri::ContainerStatus, now: SystemTime) -> bool {
    (s.reason.is_empty() || s.reason == "Error")
        && s.exit_code == 137
        && now
            .duration_since(time_of(s.finished_at_ns))
            .is_ok_and(|age| age < REASON_SETTLE)
}

/// How an exited container ended, from its CRI status.
pub(super) fn terminated(s: &cri::ContainerStatus) -> Terminated {
    let reason = if !s.reason.is_empty() {
        s.reason.clone()
    } else if s.exit_code == 0 {
        "Completed".into()
    } else {
        "Error".into()
    };
    Terminated {
        exit_code: s.exit_code,
        signal: None,
        reason,
        message: s.message.clone(),
        started_at: time_of(s.started_at_ns),
        finished_at: time_of(s.finished_at_ns),
    }
}

/// A container the runtime no longer knows (removed behind the agent's back).
pub(super) fn lost() -> Terminated {
    let now = SystemTime::now();
    Terminated {
        exit_code: 137,
        signal: None,
        reason: "ContainerStatusUnknown".into(),
        message: "the container runtime no longer knows this container".into(),
        started_at: now,
        finished_at: now,
    }
}

impl Inner {
    /// Records how a run of container `idx` ended and applies the restart policy.
    pub(super) fn on_exit(
        &self,
        entry: &mut PodEntry,
        idx: usize,
        ended: Terminated,
        publish: bool,
    ) {
        let now = self.mono();
        let policy = entry.spec.restart_policy;
        let pod_name = entry.spec.full_name();
        let Some(slot) = entry.slots.get_mut(idx) else {
            return;
        };
        let restarting = policy.restarts(ended.exit_code);
        tracing::info!(pod = %pod_name, container = %slot.status.name, exit_code = ended.exit_code, reason = %ended.reason, restarting, "container ended");
        if publish {
            let cgroup = slot
                .id
                .as_deref()
                .and_then(|id| entry.spec.cgroup.join(id).ok())
                .unwrap_or_else(|| entry.spec.cgroup.clone());
            // No subscriber is fine: the status keeps the same facts.
            let _ = self.exits.send(ContainerExit {
                uid: entry.spec.uid.clone(),
                pod: pod_name.clone(),
                container: slot.status.name.clone(),
                cgroup,
                terminated: ended.clone(),
                restarting,
            });
        }
        if !restarting {
            slot.status.state = ContainerState::Terminated(ended);
            return;
        }
        let delay = self.backoff.on_exit(&mut slot.backoff, now);
        slot.status.state = if delay.is_zero() {
            ContainerState::Terminated(ended.clone())
        } else {
            waiting(
                "CrashLoopBackOff",
                format!(
                    "back-off {delay:?} restarting failed container={} pod={pod_name}",
                    slot.status.name
                ),
            )
        };
        slot.status.last_termination = Some(ended);
        slot.restart_at = Some(now + delay);
        if let Some(id) = slot.id.take() {
            slot.old.push(id);
        }
    }

    /// One relist pass (caller holds `ops`): exits recorded, due restarts made, old attempts
    /// removed.
    async fn relist(&self) -> Result<(), CriError> {
        let listed = self
            .client
            .list_containers(&cri::ContainerFilter {
                labels: BTreeMap::from([(LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string())]),
                ..Default::default()
            })
            .await?;
        let by_id: BTreeMap<&str, &cri::ContainerInfo> =
            listed.iter().map(|c| (c.id.as_str(), c)).collect();
        // What to look at, taken out of the lock (CRI calls are awaited without it).
        // Containers whose end is recorded already (and that will not restart) are skipped.
        let todo: Vec<(String, usize, String, bool)> = lock(&self.pods)
            .iter()
            .flat_map(|(uid, e)| {
                e.slots.iter().enumerate().filter_map(move |(i, s)| {
                    let running = matches!(s.status.state, ContainerState::Running { .. });
                    let ended = matches!(s.status.state, ContainerState::Terminated(_));
                    s.id.clone()
                        .filter(|_| !ended)
                        .map(|id| (uid.clone(), i, id, running))
                })
            })
            .collect();
        for (uid, idx, id, was_running) in todo {
            let state = by_id.get(id.as_str()).map(|c| c.state);
            let ended = match state {
                Some(cri::ContainerState::Running) => {
                    if !was_running {
                        let pid = self.client.container_pid(&id).await?;
                        let status = self.client.container_status(&id).await?;
                        self.set_running(&uid, idx, &id, pid, time_of(status.started_at_ns));
                    }
                    continue;
                }
                Some(cri::ContainerState::Created) => continue,
                Some(cri::ContainerState::Exited | cri::ContainerState::Unknown) => {
                    match self.client.container_status(&id).await {
                        // containerd handles the task's exit and its OOM event separately: a
                        // container SIGKILLed moments ago with no reason yet may be an OOM
                        // kill whose reason lands a little later. Look again next relist.
                        Ok(s) if reason_may_follow(&s, SystemTime::now()) => continue,
                        Ok(s) => terminated(&s),
                        Err(e) if e.is_not_found() => lost(),
                        Err(e) => return Err(e),
                    }
                }
                None => lost(),
            };
            let mut pods = lock(&self.pods);
            let Some(entry) = pods.get_mut(&uid) else {
                continue;
            };
            let already = entry.slots.get(idx).is_some_and(|s| {
                s.id.as_deref() == Some(id.as_str())
                    && matches!(s.status.state, ContainerState::Terminated(_))
            });
            if !already {
                self.on_exit(entry, idx, ended, true);
            }
        }
        self.restart_due().await?;
        self.remove_old().await
    }

    fn set_running(&self, uid: &str, idx: usize, id: &str, pid: Option<u32>, at: SystemTime) {
        let mut pods = lock(&self.pods);
        if let Some(slot) = pods.get_mut(uid).and_then(|e| e.slots.get_mut(idx)) {
            if slot.id.as_deref() == Some(id) {
                slot.status.state = ContainerState::Running {
                    pid: pid.unwrap_or(0),
                    started_at: at,
                };
            }
        }
    }

    /// Creates the next attempt of every container whose back-off is over.
    pub(super) async fn restart_due(&self) -> Result<(), CriError> {
        let now = self.mono();
        type Due = (PodSpec, String, cri::PodSandboxSpec, usize, u32);
        let due: Vec<Due> = lock(&self.pods)
            .values()
            .flat_map(|e| {
                e.slots.iter().enumerate().filter_map(move |(i, s)| {
                    s.restart_at.filter(|t| *t <= now).map(|_| {
                        (
                            e.spec.clone(),
                            e.sandbox_id.clone(),
                            e.sandbox.clone(),
                            i,
                            s.status.restart_count + u32::from(s.status.last_termination.is_some()),
                        )
                    })
                })
            })
            .collect();
        for (pod, sandbox_id, sandbox, idx, attempt) in due {
            let started = self
                .start_attempt(&pod, &sandbox_id, &sandbox, idx, attempt)
                .await?;
            let mut pods = lock(&self.pods);
            let Some(entry) = pods.get_mut(&pod.uid) else {
                continue;
            };
            let Some(slot) = entry.slots.get_mut(idx) else {
                continue;
            };
            slot.restart_at = None;
            slot.status.restart_count = attempt;
            match started {
                Ok((id, pid)) => {
                    slot.status.state = ContainerState::Running {
                        pid: pid.unwrap_or(0),
                        started_at: SystemTime::now(),
                    };
                    slot.id = Some(id);
                }
                Err(t) => self.on_exit(entry, idx, t, true),
            }
        }
        Ok(())
    }

    /// Removes earlier attempts of containers (the kubelet keeps one dead container per
    /// container for logs; the current attempt's predecessor is removed once it exists).
    async fn remove_old(&self) -> Result<(), CriError> {
        let old: Vec<(String, usize, String)> = lock(&self.pods)
            .iter()
            .flat_map(|(uid, e)| {
                e.slots.iter().enumerate().flat_map(move |(i, s)| {
                    // Keep the last dead attempt while waiting out a back-off.
                    let keep = usize::from(s.id.is_none());
                    s.old[..s.old.len().saturating_sub(keep)]
                        .iter()
                        .map(move |id| (uid.clone(), i, id.clone()))
                })
            })
            .collect();
        for (uid, idx, id) in old {
            match self.client.remove_container(&id).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) if e.is_runtime_down() => return Err(e),
                Err(e) => {
                    tracing::warn!(container = %id, error = %e, "old container attempt not removed");
                    continue;
                }
            }
            if let Some(slot) = lock(&self.pods)
                .get_mut(&uid)
                .and_then(|e| e.slots.get_mut(idx))
            {
                slot.old.retain(|o| *o != id);
            }
        }
        Ok(())
    }

    /// A relist under the lock, reporting an outage as the trait does.
    pub(super) async fn refresh(&self) -> Result<(), RuntimeError> {
        let _ops = self.ops.lock().await;
        self.relist().await.map_err(|e| self.err(e))
    }

    /// [`refresh`](Self::refresh), unless a CRI sequence holds the lock for longer than
    /// [`LIST_WAIT`]: then the last relist stands. A relist or a start holds it for
    /// milliseconds; a stop whose container cannot exit (frozen, or stuck in the kernel) holds
    /// it for as long as the runtime waits, a minute and more under containerd, and a listing
    /// of every pod must not wait behind one pod: the pod manager lists from its owner task.
    /// What the sequence in flight changes, it records itself as it goes.
    pub(super) async fn refresh_unless_busy(&self) -> Result<(), RuntimeError> {
        let Ok(_ops) = tokio::time::timeout(LIST_WAIT, self.ops.lock()).await else {
            tracing::debug!("a runtime operation is in flight: listing from the last relist");
            return Ok(());
        };
        self.relist().await.map_err(|e| self.err(e))
    }
}

/// The relist task: one pass per period until the runtime is dropped; an outage is logged
/// once per transition and never ends the task.
pub(super) async fn relist_loop(inner: Weak<Inner>, period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let result = {
            let _ops = inner.ops.lock().await;
            inner.relist().await
        };
        match result {
            Ok(()) => {
                if inner.down.swap(false, Ordering::Relaxed) {
                    tracing::info!(endpoint = %inner.client.socket().display(), "container runtime answers again");
                }
            }
            Err(e) if e.is_runtime_down() => {
                if !inner.down.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "container runtime unavailable; relisting on");
                }
            }
            Err(e) => tracing::warn!(error = %e, "relist failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_reasons_default_like_containerd() {
        let mut s = cri::ContainerStatus {
            info: cri::ContainerInfo {
                id: "x".into(),
                pod_sandbox_id: String::new(),
                name: "c".into(),
                attempt: 0,
                image: String::new(),
                image_ref: String::new(),
                state: cri::ContainerState::Exited,
                created_at_ns: 0,
                labels: BTreeMap::new(),
                annotations: BTreeMap::new(),
            },
            started_at_ns: 1_000_000_000,
            finished_at_ns: 2_000_000_000,
            exit_code: 1,
            reason: String::new(),
            message: String::new(),
        };
        assert_eq!(terminated(&s).reason, "Error");
        s.exit_code = 0;
        assert_eq!(terminated(&s).reason, "Completed");
        s.exit_code = 137;
        s.reason = "OOMKilled".into();
        let t = terminated(&s);
        assert_eq!((t.exit_code, t.reason.as_str()), (137, "OOMKilled"));
        assert_eq!(
            t.finished_at,
            SystemTime::UNIX_EPOCH + Duration::from_secs(2)
        );

        // A fresh SIGKILL exit with no reason (or containerd's filler `Error`) waits for
        // containerd's OOM event; an old one, another exit code, or one with a reason is
        // judged at once.
        let finished = SystemTime::UNIX_EPOCH + Duration::from_secs(2);
        s.reason.clear();
        assert!(reason_may_follow(&s, finished + Duration::from_millis(100)));
        assert!(!reason_may_follow(&s, finished + Duration::from_secs(1)));
        s.reason = "Error".into();
        assert!(reason_may_follow(&s, finished + Duration::from_millis(100)));
        assert!(!reason_may_follow(&s, finished + Duration::from_secs(1)));
        assert_eq!(
            terminated(&s).reason,
            "Error",
            "judged as it reads once settled"
        );
        s.exit_code = 1;
        assert!(!reason_may_follow(
            &s,
            finished + Duration::from_millis(100)
        ));
        s.exit_code = 137;
        s.reason = "OOMKilled".into();
        assert!(!reason_may_follow(
            &s,
            finished + Duration::from_millis(100)
        ));
    }
}
