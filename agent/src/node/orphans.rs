//! Orphans: pods found running on the node that no known pod owns, as the kubelet finds
//! orphaned pod cgroups.
//!
//! Recovery at start ([`super::recover`]) finds them: every
//! `kubepods[/burstable|/besteffort]/pod<uid>` cgroup with processes that no known pod owns,
//! and every pod the runtime runs without a spec. From then on they live here, for the
//! agent's whole life. An orphan is listed (`Running`, reason [`ORPHANED`], the message says
//! where it was found and when it goes), ranked for eviction as a pod with no requests
//! (BestEffort), evictable, and removed (processes killed, runtime told, cgroup removed) when
//! `orphanGracePeriod` ends ([`Actor::expire_orphans`], the owner task's tick), unless a pod
//! with its uid or `namespace/name` is applied: then the orphan's processes are stopped and
//! the applied pod takes its place ([`Actor::replace_orphan`]).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::manager::{Actor, After, Entry};
use super::pod_record::{Orphan, PodRecord, PodSource};
use super::stop::stop_processes;
use super::NodeError;
use crate::act::cgroups::{CgroupPath, DEFAULT_REMOVE_WAIT};
use crate::act::runtime::{PodPhase, Runtime};
use crate::decide::pod::PodInfo;
use crate::node::document::Checked;

/// `status.reason` of an orphan.
pub(crate) const ORPHANED: &str = "Orphaned";

/// Seconds since the Unix epoch now: the clock an orphan's removal time is kept in (it
/// must survive a restart, so not an `Instant`).
pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A minimal `v1.Pod` for an orphan: its identity and one container per container cgroup,
/// no requests — so it ranks as BestEffort.
fn orphan_document(
    uid: &str,
    namespace: &str,
    name: &str,
    containers: &[String],
) -> serde_json::Value {
    let containers: Vec<serde_json::Value> = if containers.is_empty() {
        vec![serde_json::json!({"name": "unknown", "image": "unknown"})]
    } else {
        containers
            .iter()
            .map(|c| serde_json::json!({"name": c, "image": "unknown"}))
            .collect()
    };
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"containers": containers, "terminationGracePeriodSeconds": 0},
    })
}

impl<R: Runtime + 'static> Actor<R> {
    /// Lists `uid` as an orphan found in `found_in`, to be removed at `remove_at_unix`.
    pub(super) fn add_orphan(
        &mut self,
        uid: &str,
        (namespace, name): (String, String),
        cgroup: CgroupPath,
        containers: &[String],
        found_in: String,
        remove_at_unix: u64,
    ) {
        let document = orphan_document(uid, &namespace, &name, containers);
        let info = match PodInfo::from_json(document.clone()) {
            Ok(i) => i,
            Err(e) => {
                tracing::error!(%uid, %cgroup, "orphan could not be modelled: {e}");
                return;
            }
        };
        let message = format!(
            "found running in {found_in} with no pod spec to re-admit it from; removed in {}s (at Unix time {remove_at_unix}) unless a pod with uid {uid} or name {namespace}/{name} is applied",
            remove_at_unix.saturating_sub(unix_now())
        );
        let record = PodRecord {
            uid: uid.to_string(),
            namespace,
            name,
            document,
            source: PodSource::Api,
            cgroup: Some(cgroup),
            grace_period_seconds: 0,
            phase: PodPhase::Running,
            reason: ORPHANED.to_string(),
            message: message.clone(),
            ended_by_agent: false,
            containers: Vec::new(),
            oom_score_adj: BTreeMap::new(),
            stopping: None,
            orphan: Some(Orphan {
                found_in,
                remove_at_unix,
            }),
        };
        let full = record.full_name();
        self.pods.insert(
            uid.to_string(),
            Entry {
                record,
                info,
                stopping: false,
            },
        );
        self.recovery("orphaned", &full, uid, message);
    }

    /// Removes the orphans whose grace period has ended (the owner task's tick).
    pub(super) fn expire_orphans(&mut self) {
        let now = unix_now();
        let due: Vec<String> = self
            .pods
            .values()
            .filter(|e| !e.stopping)
            .filter(|e| {
                e.record
                    .orphan
                    .as_ref()
                    .is_some_and(|o| o.remove_at_unix <= now)
            })
            .map(|e| e.record.uid.clone())
            .collect();
        // A dry run stops nothing: each orphan past its grace period is said once (and
        // kept, listed and ranked as before).
        if self.dry_run {
            for uid in due {
                if !self.orphans_kept.insert(uid.clone()) {
                    continue;
                }
                let pod = self
                    .pods
                    .get(&uid)
                    .map(|e| e.record.full_name())
                    .unwrap_or_default();
                self.recovery(
                    "orphan-kept",
                    &pod,
                    &uid,
                    "dry run: past its orphanGracePeriod, it would be removed now; it keeps running"
                        .to_string(),
                );
            }
            return;
        }
        for uid in due {
            self.begin_stop(
                &uid,
                Some(Duration::ZERO),
                After::Remove {
                    reply: None,
                    cause: "orphan-grace-period".into(),
                },
            );
        }
    }

    /// An applied pod with an orphan's uid or `namespace/name` takes the orphan's place: the
    /// orphan's processes are stopped, the runtime told, its cgroup removed. `Err` when the
    /// orphan is being stopped already.
    pub(super) async fn replace_orphan(&mut self, checked: &Checked) -> Result<(), NodeError> {
        let Some(uid) = self
            .pods
            .values()
            .find(|e| {
                e.record.orphan.is_some()
                    && (e.record.uid == checked.uid
                        || (e.record.namespace == checked.namespace
                            && e.record.name == checked.name))
            })
            .map(|e| e.record.uid.clone())
        else {
            return Ok(());
        };
        if self.pods.get(&uid).is_some_and(|e| e.stopping) {
            return Err(NodeError::Stopping(format!("with uid {uid} (an orphan)")));
        }
        let Some(entry) = self.pods.remove(&uid) else {
            return Ok(());
        };
        let _ = self.rt.stop_pod(&uid, Duration::ZERO).await;
        if let Some(cg) = &entry.record.cgroup {
            stop_processes(&self.cgroups, cg, Duration::ZERO).await;
            let _ = self
                .cgroups
                .remove_off_runtime(cg, DEFAULT_REMOVE_WAIT)
                .await;
        }
        self.recovery(
            "orphan-replaced",
            &entry.record.full_name(),
            &uid,
            format!(
                "the orphan's processes were stopped for the applied pod {}/{} (uid {})",
                checked.namespace, checked.name, checked.uid
            ),
        );
        self.save();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_orphan_is_best_effort_with_its_containers() {
        let doc = orphan_document("u1", "ns", "web", &["app".into(), "side".into()]);
        let info = PodInfo::from_json(doc).unwrap();
        assert_eq!(info.qos, crate::decide::qos::QosClass::BestEffort);
        assert_eq!(info.containers.len(), 2);
        assert_eq!(info.uid, "u1");
    }
}
