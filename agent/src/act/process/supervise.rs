//! Supervision: one task per container watches its process and applies `restartPolicy`
//! with the kubelet's back-off, publishing every exit; a pod with init containers gets one
//! task that runs them in order before it supervises the app containers. Both end when the
//! pod is stopped (the `stop` watch channel carries the grace period).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{lock, waiting, First, Inner};
use crate::act::runtime::{ContainerExit, ContainerState, PodSpec, RestartPolicy};
use crate::decide::backoff::BackOffEntry;

/// Waits until a stop is asked for; returns its grace period.
async fn stop_requested(rx: &mut watch::Receiver<Option<Duration>>) -> Duration {
    loop {
        if let Some(grace) = *rx.borrow_and_update() {
            return grace;
        }
        if rx.changed().await.is_err() {
            return Duration::ZERO;
        }
    }
}

/// Supervises container `idx` of pod `uid` until it is stopped or ends for good.
pub(super) async fn supervise(
    inner: Arc<Inner>,
    pod: PodSpec,
    idx: usize,
    first: First,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    let Some(spec) = pod.containers.get(idx).cloned() else {
        return;
    };
    let Ok(cgroup) = Inner::container_cgroup(&pod, &spec) else {
        return;
    };
    let mut backoff: Option<BackOffEntry> = None;
    let mut next = first;
    loop {
        let ended = match std::mem::replace(&mut next, First::Restart) {
            First::Failed(t) => t,
            First::Started(proc) => {
                inner.record_running(&pod.uid, idx, &proc, true);
                next = First::Running(proc);
                continue;
            }
            First::Running(proc) => {
                inner.hold(&pod.uid, idx, &proc);
                tokio::select! {
                    () = proc.exited() => {
                        inner.release(&pod.uid, idx);
                        inner.finish(&cgroup, proc)
                    }
                    grace = stop_requested(&mut stop) => {
                        inner.terminate(&cgroup, &proc, grace).await;
                        inner.release(&pod.uid, idx);
                        let t = inner.finish(&cgroup, proc);
                        // stop_pod saves once all containers are down.
                        inner.change(&pod.uid, idx, false, |r| {
                            r.status.state = ContainerState::Terminated(t);
                            r.pid = None;
                        });
                        return;
                    }
                }
            }
            First::Restart => {
                let run = {
                    let pods = lock(&inner.pods);
                    pods.get(&pod.uid)
                        .and_then(|p| p.containers.get(idx))
                        .map_or(0, |r| r.status.restart_count)
                };
                next = match inner.start(&pod, &spec, run) {
                    Ok(p) => First::Started(p),
                    Err(t) => First::Failed(t),
                };
                continue;
            }
        };
        tracing::info!(pod = %pod.full_name(), container = %spec.name, exit_code = ended.exit_code, reason = %ended.reason, "container ended");
        let finished = inner.mono();
        let restarting = pod.restart_policy.restarts(ended.exit_code) && stop.borrow().is_none();
        // No subscriber is fine: the status keeps the same facts.
        let _ = inner.exits.send(ContainerExit {
            uid: pod.uid.clone(),
            pod: pod.full_name(),
            container: spec.name.clone(),
            cgroup: cgroup.clone(),
            terminated: ended.clone(),
            restarting,
        });
        if !restarting {
            inner.update(&pod.uid, idx, |r| {
                r.status.state = ContainerState::Terminated(ended);
                r.pid = None;
            });
            return;
        }
        let delay = inner.backoff.on_exit(&mut backoff, finished);
        inner.update(&pod.uid, idx, |r| {
            r.status.state = if delay.is_zero() {
                ContainerState::Terminated(ended.clone())
            } else {
                waiting(
                    "CrashLoopBackOff",
                    format!(
                        "back-off {delay:?} restarting failed container={} pod={}",
                        spec.name,
                        pod.full_name()
                    ),
                )
            };
            r.status.last_termination = Some(ended);
            r.pid = None;
        });
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stop_requested(&mut stop) => {
                inner.update(&pod.uid, idx, |r| {
                    if let Some(t) = r.status.last_termination.clone() {
                        r.status.state = ContainerState::Terminated(t);
                    }
                });
                return;
            }
        }
        inner.update(&pod.uid, idx, |r| r.status.restart_count += 1);
    }
}

/// Aborts the app containers' supervisors when [`initialize`] is dropped (the runtime
/// dropped without a stop, as in an agent crash), as the runtime's drop aborts the others.
struct AbortOnDrop(Vec<JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// Runs a pod that has init containers: each init container in order, supervised until it
/// exits 0 (its restarts on failure follow the back-off; with `restartPolicy: Never` a
/// failure ends the pod's start), then supervises the app containers until they end.
/// `firsts` holds, per container, how its supervision begins (`None`: nothing to do, e.g.
/// an init container that already succeeded before an agent restart).
pub(super) async fn initialize(
    inner: Arc<Inner>,
    pod: PodSpec,
    mut firsts: Vec<Option<First>>,
    stop: watch::Receiver<Option<Duration>>,
) {
    let init = pod.init_count();
    // An init container is restarted after a failure unless the pod never restarts, and
    // never after it succeeded, whatever the pod's policy.
    let init_pod = PodSpec {
        restart_policy: match pod.restart_policy {
            RestartPolicy::Never => RestartPolicy::Never,
            RestartPolicy::Always | RestartPolicy::OnFailure => RestartPolicy::OnFailure,
        },
        ..pod.clone()
    };
    for idx in 0..init {
        if let Some(first) = firsts.get_mut(idx).and_then(Option::take) {
            supervise(inner.clone(), init_pod.clone(), idx, first, stop.clone()).await;
        }
        if stop.borrow().is_some() {
            return;
        }
        if !inner.succeeded(&pod.uid, idx) {
            tracing::info!(pod = %pod.full_name(), container = %pod.containers[idx].name, "init container failed; the app containers are not started");
            return;
        }
    }
    let mut apps = AbortOnDrop(
        firsts
            .into_iter()
            .enumerate()
            .skip(init)
            .filter_map(|(i, f)| {
                f.map(|f| tokio::spawn(supervise(inner.clone(), pod.clone(), i, f, stop.clone())))
            })
            .collect(),
    );
    // Awaited here so that stopping the pod, which awaits this task, awaits them too.
    for t in &mut apps.0 {
        let _ = t.await;
    }
}
