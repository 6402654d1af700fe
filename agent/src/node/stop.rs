//! Stopping pods: removal, eviction and preemption share one path. The stop is written ahead
//! in the pod's record ([`StopIntent`]) so an agent killed halfway finishes it after the
//! restart (`node::recover`); the runtime call runs in its own task, which reports back to
//! the owner, so a slow stop never holds up a decision or a `pod ls`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::events::NodeEventKind;
use super::manager::{reply, Actor, After, Command, PREEMPTION_MESSAGE, PREEMPTION_REASON};
use super::pod_record::StopIntent;
use super::view::{EvictedPod, Removed};
use super::NodeError;
use crate::act::cgroups::{CgroupManager, CgroupPath, DEFAULT_REMOVE_WAIT};
use crate::act::kill::{begin_kill, finish_kill, kill_cgroup, Evicted};
use crate::act::runtime::{PodPhase, Runtime, RuntimeError};

impl<R: Runtime + 'static> Actor<R> {
    pub(super) fn begin_stop(&mut self, uid: &str, grace: Option<Duration>, after: After) {
        let Some(entry) = self.pods.get_mut(uid) else {
            return;
        };
        entry.stopping = true;
        let orphan = entry.record.orphan.is_some();
        // Written ahead: an agent killed during the stop finishes it after the restart
        // (`node::recover`) instead of starting the pod again.
        entry.record.stopping = Some(match &after {
            After::Remove { cause, .. } => StopIntent::Remove {
                cause: cause.clone(),
            },
            After::Evict {
                reason, message, ..
            } => StopIntent::Evict {
                reason: reason.clone(),
                message: message.clone(),
            },
            After::Preempted { preemptor } => StopIntent::Preempt {
                preemptor: preemptor.clone(),
            },
        });
        let grace = grace.unwrap_or_else(|| {
            Duration::from_secs(u64::try_from(entry.record.grace_period_seconds).unwrap_or(0))
        });
        let cgroup = entry.record.cgroup.clone();
        // An eviction whose caller killed the processes already (`PodManager::kill_now`):
        // the stop does not kill again, and reports that kill.
        let prekilled = match &after {
            After::Evict { killed, .. } => *killed,
            _ => None,
        };
        // An eviction killed here, not by `kill_now`, is noted as that one is: the kill
        // comes before the checkpoint's write below.
        if let (
            After::Evict {
                reason, message, ..
            },
            None,
            true,
        ) = (&after, prekilled, grace.is_zero())
        {
            self.journal.note(uid, reason, message);
        }
        let live = !entry.record.ended_by_agent;
        let rt = Arc::clone(&self.rt);
        let cgroups = self.cgroups.clone();
        let tx = self.tx.clone();
        let uid = uid.to_string();
        // The runtime is told and, with grace 0, the processes killed before the record is
        // written: the disk never delays an eviction's kill. An agent killed in between
        // finds the pod's containers gone and no stop recorded: an eviction's note in the
        // kill journal (above) finishes it then; a removal's or preemption's pod is treated
        // like any pod its runtime lost.
        let begun = (live && !orphan).then(|| {
            let stop = {
                let (rt, uid) = (Arc::clone(&rt), uid.clone());
                async move { rt.stop_pod(&uid, grace).await }
            };
            let kill_in = cgroup.as_ref().filter(|_| prekilled.is_none());
            begin_kill(stop, grace, kill_in, &cgroups, || rt.known_processes(&uid))
        });
        self.save();
        tokio::spawn(async move {
            let mut killed = Evicted::default();
            let status = if let Some((first, evicted)) = begun {
                let status;
                (status, killed) = finish_kill(first, evicted).await;
                match status {
                    Ok(s) => Ok(Some(s)),
                    Err(RuntimeError::NotFound { .. }) => Ok(None),
                    Err(e) => Err(e),
                }
            } else if live && orphan {
                // No runtime supervises an orphan's processes: signal them here, then tell
                // the runtime in case it knows the pod without its spec.
                if let (Some(cg), None) = (&cgroup, prekilled) {
                    killed.killed = stop_processes(&cgroups, cg, grace).await;
                    killed.killed_at_ns = Some(crate::sense::monotonic_ns());
                }
                match rt.stop_pod(&uid, Duration::ZERO).await {
                    Ok(s) => Ok(Some(s)),
                    Err(_) => Ok(None),
                }
            } else {
                Ok(None)
            };
            if let Some(k) = prekilled {
                killed = k;
            }
            let status = match (status, cgroup) {
                (Ok(s), Some(cg)) if live => {
                    match cgroups.remove_off_runtime(&cg, DEFAULT_REMOVE_WAIT).await {
                        Ok(()) => Ok(s),
                        Err(e) => Err(RuntimeError::Cgroup(e)),
                    }
                }
                (s, _) => s,
            };
            if let Some(tx) = tx.upgrade() {
                let _ = tx
                    .send(Command::Stopped {
                        uid,
                        status,
                        killed,
                        after,
                    })
                    .await;
            }
        });
    }

    pub(super) async fn stopped(
        &mut self,
        uid: String,
        status: Result<Option<crate::act::runtime::PodStatus>, RuntimeError>,
        killed: Evicted,
        after: After,
    ) {
        let failed = status.as_ref().err().map(ToString::to_string);
        if let Some(e) = self.pods.get_mut(&uid) {
            e.stopping = false;
            e.record.stopping = None;
            match &status {
                Ok(Some(s)) => e.record.containers = s.containers.clone(),
                // The processes were killed but the runtime did not answer (down): the pod
                // ends, and so do its containers.
                _ if !matches!(after, After::Remove { .. }) => e.record.end_unknown_containers(),
                _ => {}
            }
        }
        match after {
            After::Remove { reply: tx, cause } => {
                if let Some(err) = failed {
                    reply(
                        tx,
                        Err(NodeError::Runtime(RuntimeError::Unavailable {
                            reason: err,
                        })),
                    );
                    return;
                }
                let Some(entry) = self.pods.remove(&uid) else {
                    return;
                };
                if let Err(e) = self.update_tiers() {
                    tracing::error!("QoS tiers after removing {uid}: {e}");
                }
                self.save();
                self.release_devices().await;
                tracing::info!(pod = %entry.record.full_name(), %uid, %cause, "pod removed");
                self.events.publish(NodeEventKind::Removed {
                    pod: entry.record.full_name(),
                    uid: uid.clone(),
                    cause,
                });
                let view = self.view(&entry, None, None);
                reply(tx, Ok(Removed { pod: view }));
            }
            After::Evict {
                reason,
                message,
                reply: tx,
                ..
            } => {
                if let Some(err) = failed {
                    if killed.killed == 0 {
                        let _ = tx.send(Err(NodeError::Runtime(RuntimeError::Unavailable {
                            reason: err,
                        })));
                        return;
                    }
                    // The runtime failed (down, or died mid-stop), but the agent SIGKILLed
                    // the pod's processes itself: the eviction happened. The pod ends
                    // Evicted now, once, and the runtime is told to stop it when it answers
                    // again, so its sandbox and cgroups do not outlive the outage.
                    tracing::warn!(pod = %uid, "eviction: processes killed, but the runtime failed to stop the pod ({err}); retrying the stop in the background");
                    self.finish_stop_later(&uid);
                }
                self.end(&uid, reason, message);
                self.release_devices().await;
                let view = self.pods.get(&uid).map(|e| self.view(e, None, None));
                let _ = tx.send(
                    view.map(|pod| EvictedPod { pod, killed })
                        .ok_or_else(|| NodeError::NotFound(uid.clone())),
                );
            }
            After::Preempted { preemptor } => {
                if let Some(err) = failed {
                    if let Some(p) = self.pending.remove(&preemptor) {
                        reply(
                            p.reply,
                            Err(NodeError::Runtime(RuntimeError::Unavailable {
                                reason: format!("preempting {uid}: {err}"),
                            })),
                        );
                    }
                    return;
                }
                self.end(&uid, PREEMPTION_REASON.into(), PREEMPTION_MESSAGE.into());
                self.release_devices().await;
                let done = match self.pending.get_mut(&preemptor) {
                    Some(p) => {
                        p.victims.remove(&uid);
                        p.victims.is_empty()
                    }
                    None => false,
                };
                if done {
                    if let Some(p) = self.pending.remove(&preemptor) {
                        let result = self.admit(p.checked, p.source, p.preempted).await;
                        reply(p.reply, result);
                    }
                }
            }
        }
    }

    /// Stops pod `uid` through the runtime in the background, retrying every
    /// [`super::manager::STOP_RETRY`] until the runtime stops it or no longer knows it, then
    /// removes its pod cgroup: what an eviction during a runtime outage leaves behind (the
    /// processes are dead already; the sandbox, its records and the cgroups are not).
    fn finish_stop_later(&self, uid: &str) {
        let Some(cgroup) = self.pods.get(uid).and_then(|e| e.record.cgroup.clone()) else {
            return;
        };
        let (rt, cgroups, uid) = (Arc::clone(&self.rt), self.cgroups.clone(), uid.to_string());
        tokio::spawn(async move {
            loop {
                match rt.stop_pod(&uid, Duration::ZERO).await {
                    Ok(_) | Err(RuntimeError::NotFound { .. }) => break,
                    Err(e) => tracing::debug!(pod = %uid, "stop retry: {e}"),
                }
                tokio::time::sleep(super::manager::STOP_RETRY).await;
            }
            match cgroups
                .remove_off_runtime(&cgroup, DEFAULT_REMOVE_WAIT)
                .await
            {
                Ok(()) => {
                    tracing::info!(pod = %uid, "runtime back: evicted pod stopped and its cgroup removed")
                }
                Err(e) => tracing::error!(pod = %uid, "removing the evicted pod's cgroup: {e}"),
            }
        });
    }

    /// Frees the devices of pods that are no longer active (removed, evicted, preempted) as
    /// soon as they stop, rather than at the next allocation as the kubelet does, so node
    /// status and the device metrics do not count devices nobody holds. The next
    /// allocation would free them anyway; a failure here is only logged.
    pub(super) async fn release_devices(&self) {
        if let Some(devices) = &self.devices {
            if let Err(e) = devices.remove_inactive_pods(&self.active_uids()).await {
                tracing::error!("freeing the devices of stopped pods: {e}");
            }
        }
    }

    /// Marks a stopped pod Failed with `reason`/`message` and gives its memory back to the
    /// tiers.
    pub(super) fn end(&mut self, uid: &str, reason: String, message: String) {
        if let Some(e) = self.pods.get_mut(uid) {
            e.record.phase = PodPhase::Failed;
            e.record.reason = reason;
            e.record.message = message;
            e.record.ended_by_agent = true;
        }
        if let Err(e) = self.update_tiers() {
            tracing::error!("QoS tiers after ending {uid}: {e}");
        }
        self.save();
    }
}

/// How long [`stop_processes`] waits for the processes after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// SIGTERM to every process in `cgroup`, SIGKILL after `grace` (at once when zero), until
/// it is empty or [`KILL_WAIT`] after the SIGKILL: how the processes of a pod no runtime
/// supervises (an orphan, what a lost pod left) are stopped. Returns how many processes got SIGKILL.
pub(super) async fn stop_processes(
    cgroups: &CgroupManager,
    cgroup: &CgroupPath,
    grace: Duration,
) -> usize {
    if !grace.is_zero() {
        for pid in cgroups.procs_recursive(cgroup).unwrap_or_default() {
            if let Some(p) = i32::try_from(pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
            {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
            }
        }
        let until = Instant::now() + grace;
        while Instant::now() < until && !cgroups.is_empty(cgroup).unwrap_or(true) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut killed = 0;
    let until = Instant::now() + KILL_WAIT;
    loop {
        let n = kill_cgroup(cgroups, cgroup).killed;
        killed += n;
        if n == 0 || Instant::now() > until {
            return killed;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
