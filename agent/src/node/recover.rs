//! Rebuilding the pod manager's view from the node after a restart.
//!
//! Why: the pod checkpoint says what the agent admitted, but the node says what runs. A
//! checkpoint can be lost (set aside as damaged, an older generation used) while pods keep
//! running, and a pod the agent cannot see is a pod it can neither show, rank nor evict. So
//! at start, after the checkpoint is loaded, the node is the truth:
//!
//! 1. **Stops under way finish.** A pod whose record carries a [`StopIntent`] was being
//!    evicted, preempted or removed when the agent died: the stop is completed (SIGKILL,
//!    runtime told, pod cgroup removed) and the pod ends as it was meant to — never started
//!    again, never evicted twice.
//! 2. **Pods the runtime runs are re-admitted** when the runtime kept the `v1.Pod` they were
//!    admitted with ([`PodSpec::document`](crate::act::runtime::PodSpec::document): the
//!    process runtime's checkpoint, the CRI sandbox annotation).
//! 3. **The rest are orphans**, as the kubelet finds orphaned pod cgroups: every
//!    `kubepods[/burstable|/besteffort]/pod<uid>` cgroup with processes that no known pod
//!    owns, and every pod the runtime runs without a spec. They are listed, ranked and
//!    evictable, and removed when `orphanGracePeriod` ends (`node::orphans`). An empty
//!    orphan cgroup is removed at once.
//!
//! Names come from what can be recovered: the runtime's view, else the process runtime's log
//! directory (`<stateDir>/logs/<namespace>_<name>_<uid>`), else `unknown/pod<uid>`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::events::NodeEventKind;
use super::manager::{Actor, Entry, PREEMPTION_MESSAGE, PREEMPTION_REASON};
use super::orphans::unix_now;
use super::pod_record::{PodRecord, PodSource, StopIntent};
use super::stop::stop_processes;
use super::NodeError;
use crate::act::cgroups::{CgroupManager, CgroupPath, Resources, DEFAULT_REMOVE_WAIT};
use crate::act::runtime::{PodPhase, PodStatus, Runtime};
use crate::decide::cgroups::pod_config;
use crate::decide::pod::PodInfo;
use crate::node::document::Checked;

/// The pod cgroups under `kubepods`, `kubepods/burstable` and `kubepods/besteffort`, by uid.
pub(super) fn pod_cgroups(cgroups: &CgroupManager) -> BTreeMap<String, CgroupPath> {
    let mut out = BTreeMap::new();
    let top = CgroupPath::kubepods();
    let tiers = [
        Some(top.clone()),
        top.join("burstable").ok(),
        top.join("besteffort").ok(),
    ];
    for tier in tiers.into_iter().flatten() {
        for name in cgroups.children(&tier) {
            if let Some(uid) = name.strip_prefix("pod").filter(|u| !u.is_empty()) {
                if let Ok(cg) = tier.join(&name) {
                    out.insert(uid.to_string(), cg);
                }
            }
        }
    }
    out
}

/// `namespace/name` of pod `uid` from the process runtime's log directory, if it has one.
fn name_from_logs(state_dir: &Path, uid: &str) -> Option<(String, String)> {
    let suffix = format!("_{uid}");
    std::fs::read_dir(state_dir.join("logs"))
        .ok()?
        .filter_map(Result::ok)
        .find_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let rest = name.strip_suffix(&suffix)?;
            // Namespaces and pod names are DNS labels/subdomains: no `_` in either.
            let (ns, pod) = rest.split_once('_')?;
            Some((ns.to_string(), pod.to_string()))
        })
}

impl<R: Runtime + 'static> Actor<R> {
    /// Logs a recovery step and publishes it as a `recovery` event.
    pub(super) fn recovery(&self, action: &str, pod: &str, uid: &str, message: String) {
        tracing::warn!(%pod, %uid, action, "{message}");
        self.events.publish(NodeEventKind::Recovery {
            action: action.to_string(),
            file: String::new(),
            pod: pod.to_string(),
            uid: uid.to_string(),
            message,
        });
    }

    /// At start: the checkpoint's pods, then the node's truth (see the module doc). Pods in
    /// the checkpoint whose runtime pods exist are kept as they are; live ones the runtime
    /// lost are started again by their restart policy (`Never`: marked Failed). Nothing a
    /// known pod runs is killed.
    ///
    /// `stale`: the records come from the checkpoint's previous generation, so a pod in them
    /// may have been removed since; one with nothing running is dropped, not started again.
    pub(super) async fn reconcile(
        &mut self,
        records: Vec<PodRecord>,
        stale: bool,
    ) -> Result<(), NodeError> {
        let statuses: BTreeMap<String, PodStatus> = self
            .rt
            .list_pods()
            .await?
            .into_iter()
            .map(|s| (s.uid.clone(), s))
            .collect();
        for record in records {
            let info = match PodInfo::from_json(record.document.clone()) {
                Ok(i) => i,
                Err(e) => {
                    tracing::error!(pod = %record.full_name(), "checkpointed pod unreadable, dropped: {e}");
                    continue;
                }
            };
            self.pods.insert(
                record.uid.clone(),
                Entry {
                    record,
                    info,
                    stopping: false,
                },
            );
        }
        let intents: Vec<(String, StopIntent)> = self
            .pods
            .values()
            .filter_map(|e| Some((e.record.uid.clone(), e.record.stopping.clone()?)))
            .collect();
        for (uid, intent) in intents {
            self.finish_stop(&uid, intent).await;
        }
        self.recover_from_node(&statuses).await;
        let restart: Vec<String> = self
            .pods
            .values()
            .filter(|e| {
                e.record.orphan.is_none()
                    && !e.record.ended_by_agent
                    && e.record.cgroup.is_some()
                    && !e.record.is_terminal()
                    && !statuses.contains_key(&e.record.uid)
            })
            .map(|e| e.record.uid.clone())
            .collect();
        for uid in restart {
            let idle = self
                .pods
                .get(&uid)
                .and_then(|e| e.record.cgroup.clone())
                .is_none_or(|cg| {
                    self.cgroups
                        .procs_recursive(&cg)
                        .map_or(true, |p| p.is_empty())
                });
            if stale && idle {
                if let Some(e) = self.pods.remove(&uid) {
                    tracing::warn!(pod = %e.record.full_name(), %uid, "pod from the previous checkpoint generation runs nowhere: dropped (it was most likely removed since)");
                }
                continue;
            }
            self.restart_lost(&uid).await;
        }
        self.update_tiers()?;
        self.save();
        Ok(())
    }

    /// Completes a stop the previous agent began: the pod's processes are killed, the
    /// runtime is told, the pod cgroup removed, and the pod ends as the stop meant.
    async fn finish_stop(&mut self, uid: &str, intent: StopIntent) {
        let Some(e) = self.pods.get(uid) else {
            return;
        };
        let (name, cgroup) = (e.record.full_name(), e.record.cgroup.clone());
        // The runtime's answer is the containers' end: without it the pod's record kept the
        // states of the checkpoint, and `pod ls` showed an evicted pod's container running
        // (nothing refreshes an ended pod's containers afterwards).
        if let Ok(status) = self.rt.stop_pod(uid, Duration::ZERO).await {
            if let Some(e) = self.pods.get_mut(uid) {
                e.record.containers = status.containers;
            }
        }
        if let Some(cg) = &cgroup {
            stop_processes(&self.cgroups, cg, Duration::ZERO).await;
            if let Err(err) = self
                .cgroups
                .remove_off_runtime(cg, DEFAULT_REMOVE_WAIT)
                .await
            {
                tracing::error!(pod = %name, "pod cgroup not removed: {err}");
            }
        }
        // A runtime that had finished its part of the stop no longer knows the pod and
        // answers nothing.
        if let Some(e) = self.pods.get_mut(uid) {
            e.record.end_unknown_containers();
        }
        let what = match &intent {
            StopIntent::Evict { .. } => "eviction",
            StopIntent::Preempt { .. } => "preemption",
            StopIntent::Remove { .. } => "removal",
        };
        self.recovery(
            "stop-finished",
            &name,
            uid,
            format!("the {what} under way when the agent stopped was finished"),
        );
        match intent {
            StopIntent::Remove { cause } => {
                self.pods.remove(uid);
                self.events.publish(NodeEventKind::Removed {
                    pod: name,
                    uid: uid.to_string(),
                    cause,
                });
            }
            StopIntent::Evict { reason, message } => self.mark_ended(uid, reason, message),
            StopIntent::Preempt { .. } => {
                self.mark_ended(uid, PREEMPTION_REASON.into(), PREEMPTION_MESSAGE.into())
            }
        }
    }

    fn mark_ended(&mut self, uid: &str, reason: String, message: String) {
        if let Some(e) = self.pods.get_mut(uid) {
            e.record.phase = PodPhase::Failed;
            e.record.reason = reason;
            e.record.message = message;
            e.record.ended_by_agent = true;
            e.record.stopping = None;
        }
    }

    /// Steps 2 and 3 of the module doc: what runs on the node and is not in the checkpoint.
    async fn recover_from_node(&mut self, statuses: &BTreeMap<String, PodStatus>) {
        let now = unix_now();
        let remove_at = now + self.orphan_grace.as_secs();
        // Orphans from a previous run keep their deadline while their cgroup still exists.
        let gone: Vec<String> = self
            .pods
            .values()
            .filter(|e| e.record.orphan.is_some())
            .filter(|e| {
                !e.record.is_terminal()
                    && !statuses.contains_key(&e.record.uid)
                    && e.record.cgroup.as_ref().is_none_or(|cg| {
                        self.cgroups
                            .procs_recursive(cg)
                            .map_or(true, |p| p.is_empty())
                    })
            })
            .map(|e| e.record.uid.clone())
            .collect();
        for uid in gone {
            if let Some(e) = self.pods.remove(&uid) {
                if let Some(cg) = &e.record.cgroup {
                    let _ = self
                        .cgroups
                        .remove_off_runtime(cg, DEFAULT_REMOVE_WAIT)
                        .await;
                }
            }
        }
        for (uid, status) in statuses {
            if self.pods.contains_key(uid) {
                continue;
            }
            if !self.cgroups.exists(&status.cgroup) {
                // The pod cgroup is removed last when a pod stops: a runtime record without
                // one is of a pod stopped after the runtime's state was last written (a full
                // disk), not of one that runs. Let the runtime forget it.
                let _ = self.rt.stop_pod(uid, Duration::ZERO).await;
                tracing::warn!(pod = %format!("{}/{}", status.namespace, status.name), %uid, cgroup = %status.cgroup, "the runtime's record of a pod whose cgroup is gone: forgotten");
                continue;
            }
            let document = self.rt.pod_document(uid);
            match document.map(|d| (PodInfo::from_json(d.clone()), d)) {
                Some((Ok(info), document)) => {
                    let grace = document
                        .pointer("/spec/terminationGracePeriodSeconds")
                        .and_then(serde_json::Value::as_i64)
                        .unwrap_or(30);
                    let record = PodRecord {
                        uid: uid.clone(),
                        namespace: status.namespace.clone(),
                        name: status.name.clone(),
                        document,
                        source: PodSource::Api,
                        cgroup: Some(status.cgroup.clone()),
                        grace_period_seconds: grace,
                        phase: status.phase,
                        reason: String::new(),
                        message: String::new(),
                        ended_by_agent: false,
                        containers: status.containers.clone(),
                        oom_score_adj: BTreeMap::new(),
                        stopping: None,
                        orphan: None,
                    };
                    let name = record.full_name();
                    self.pods.insert(
                        uid.clone(),
                        Entry {
                            record,
                            info,
                            stopping: false,
                        },
                    );
                    self.recovery(
                        "re-admitted",
                        &name,
                        uid,
                        "not in the pod checkpoint but run by the runtime: re-admitted from the pod spec the runtime kept".to_string(),
                    );
                }
                _ => {
                    let containers = self.cgroups.children(&status.cgroup);
                    self.add_orphan(
                        uid,
                        (status.namespace.clone(), status.name.clone()),
                        status.cgroup.clone(),
                        &containers,
                        "the runtime, with no pod spec".to_string(),
                        remove_at,
                    );
                }
            }
        }
        for (uid, cgroup) in pod_cgroups(&self.cgroups) {
            if self.pods.contains_key(&uid) {
                continue;
            }
            let procs = self.cgroups.procs_recursive(&cgroup).unwrap_or_default();
            if procs.is_empty() {
                match self
                    .cgroups
                    .remove_off_runtime(&cgroup, DEFAULT_REMOVE_WAIT)
                    .await
                {
                    Ok(()) => tracing::info!(%cgroup, "empty pod cgroup of no known pod removed"),
                    Err(e) => tracing::warn!(%cgroup, "empty orphaned pod cgroup not removed: {e}"),
                }
                continue;
            }
            let name = name_from_logs(&self.state_dir, &uid)
                .unwrap_or_else(|| ("unknown".to_string(), format!("pod{uid}")));
            let containers = self.cgroups.children(&cgroup);
            self.add_orphan(
                &uid,
                name,
                cgroup.clone(),
                &containers,
                format!("cgroup {cgroup} ({} processes)", procs.len()),
                remove_at,
            );
        }
    }

    /// A pod the checkpoint knows as live but the runtime lost: started again by its
    /// restart policy; `Never` (or a start that fails) ends it Failed, with whatever was left
    /// in its cgroup killed, so no process runs for a pod listed as ended.
    async fn restart_lost(&mut self, uid: &str) {
        let Some(e) = self.pods.get(uid) else {
            return;
        };
        let policy = e
            .record
            .document
            .pointer("/spec/restartPolicy")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("Always");
        let cgroup = e.record.cgroup.clone();
        let checked = Checked {
            document: e.record.document.clone(),
            namespace: e.record.namespace.clone(),
            name: e.record.name.clone(),
            uid: uid.to_string(),
            info: e.info.clone(),
            grace_period_seconds: e.record.grace_period_seconds,
        };
        let started = if policy == "Never" {
            Err(None)
        } else {
            async {
                let spec = self.spec_for(&checked, &BTreeMap::new())?;
                if let Some(cg) = &cgroup {
                    self.cgroups.create_pod_cgroup(
                        cg,
                        &Resources::from(&pod_config(&self.plan.cgroups, &checked.info)),
                    )?;
                }
                self.rt.run_pod(spec).await?;
                Ok::<(), NodeError>(())
            }
            .await
            .map_err(Some)
        };
        let message = match started {
            Ok(()) => {
                tracing::info!(pod = %checked.name, %uid, "pod missing from the runtime after restart: started again");
                return;
            }
            Err(None) => "The pod's containers were gone when the agent restarted".to_string(),
            Err(Some(err)) => {
                tracing::error!(pod = %checked.name, %uid, "pod could not be restarted: {err}");
                format!("could not be restarted after an agent restart: {err}")
            }
        };
        if let Some(cg) = &cgroup {
            stop_processes(&self.cgroups, cg, Duration::ZERO).await;
            let _ = self
                .cgroups
                .remove_off_runtime(cg, DEFAULT_REMOVE_WAIT)
                .await;
        }
        self.mark_ended(uid, "ContainerStatusUnknown".into(), message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_log_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("logs/team-a_web-1_abc-123/app")).unwrap();
        assert_eq!(
            name_from_logs(dir.path(), "abc-123"),
            Some(("team-a".into(), "web-1".into()))
        );
        assert_eq!(name_from_logs(dir.path(), "zzz"), None);
    }
}
