//! The owner task's side of applying a pod: a re-apply or a replaced orphan, admission (the
//! kubelet's fit checks, preemption of lower-priority pods for a critical one, device
//! allocation), the cgroup and the runtime's start, and the refusal a pod gets when it
//! does not fit. Split from `manager` (which keeps the task's loop and the handle) so each
//! file holds one concern; the pure rules are in `admit` and `decide`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1 as k8s;

use super::admit::{fit, is_extended, rejection};
use super::document::Checked;
use super::events::NodeEventKind;
use super::manager::{Actor, After, Entry, Pending, Reply};
use super::pod_record::{PodRecord, PodSource};
use super::view::Applied;
use super::NodeError;
use crate::act::cgroups::{CgroupPath, Resources, DEFAULT_REMOVE_WAIT};
use crate::act::pod_spec::pod_spec;
use crate::act::runtime::{PodPhase, PodSpec, Runtime};
use crate::decide::cgroups::pod_config;
use crate::decide::pod::PodInfo;
use crate::decide::preempt::{handle_admission_failure, AdmitFailure};
use crate::devices::{ContainerRequest, PodRequest};

impl<R: Runtime + 'static> Actor<R> {
    /// What the runtime runs for `checked`, carrying the pod document so the runtime's own
    /// state can re-admit the pod if the pod checkpoint is lost.
    pub(super) fn spec_for(
        &self,
        checked: &Checked,
        device_env: &BTreeMap<String, Vec<(String, String)>>,
    ) -> Result<PodSpec, NodeError> {
        let k8s_pod: k8s::Pod = serde_json::from_value(checked.document.clone())
            .map_err(|e| NodeError::Invalid(format!("pod document: {e}")))?;
        let mut spec = pod_spec(&k8s_pod, &checked.info, &self.plan.cgroups, device_env)
            .map_err(|e| NodeError::Invalid(e.to_string()))?;
        spec.document = Some(checked.document.clone());
        Ok(spec)
    }

    fn device_request(info: &PodInfo) -> Option<PodRequest> {
        let req = |c: &crate::decide::pod::ContainerInfo| ContainerRequest {
            name: c.name.clone(),
            devices: c
                .limits
                .iter()
                .chain(c.requests.iter())
                .filter(|(n, _)| is_extended(n))
                .map(|(n, q)| (n.to_string(), u64::try_from(q.value()).unwrap_or(0)))
                .collect(),
            restartable: c.sidecar,
        };
        let pod = PodRequest {
            uid: info.uid.clone(),
            init_containers: info.init_containers.iter().map(req).collect(),
            containers: info.containers.iter().map(req).collect(),
        };
        let any = pod
            .containers
            .iter()
            .chain(&pod.init_containers)
            .any(|c| !c.devices.is_empty());
        any.then_some(pod)
    }

    /// Admission. `None`: waiting for preempted pods to stop; `reply` was moved into the
    /// pending admission and is answered when they are gone.
    pub(super) async fn apply(
        &mut self,
        checked: Box<Checked>,
        source: PodSource,
        reply_to: &mut Option<Reply<Applied>>,
    ) -> Option<Result<Applied, NodeError>> {
        if let Err(e) = self.replace_orphan(&checked).await {
            return Some(Err(e));
        }
        if let Some(e) = self.pods.get(&checked.uid) {
            return Some(Err(NodeError::AlreadyExists(format!(
                "a pod with uid {} is on this node already ({})",
                checked.uid,
                e.record.full_name()
            ))));
        }
        if self.pending.contains_key(&checked.uid) {
            return Some(Err(NodeError::AlreadyExists(format!(
                "a pod with uid {} is being admitted already",
                checked.uid
            ))));
        }
        let name_taken = self
            .pods
            .values()
            .map(|e| (&e.record.namespace, &e.record.name, &e.record.uid))
            .chain(
                self.pending
                    .values()
                    .map(|p| (&p.checked.namespace, &p.checked.name, &p.checked.uid)),
            )
            .find(|(ns, n, _)| **ns == checked.namespace && **n == checked.name)
            .map(|(_, _, uid)| uid.clone());
        if let Some(uid) = name_taken {
            return Some(Err(NodeError::AlreadyExists(format!(
                "pod {}/{} is on this node already (uid {uid})",
                checked.namespace, checked.name
            ))));
        }
        // Everything that can be wrong with the document is found before the node changes.
        if let Err(e) = self.spec_for(&checked, &BTreeMap::new()) {
            return Some(Err(e));
        }
        // Devices first, as in the kubelet, whose resource-allocation admit handler runs
        // before the predicate handler: a pod the device manager cannot serve is refused with
        // that handler's reason and message, and preemption (which frees cpu, memory and
        // pods, never devices) is not tried for it.
        if let (Some(devices), Some(req)) = (&self.devices, Self::device_request(&checked.info)) {
            if let Err(short) = devices.can_admit(&req, &self.active_uids()) {
                return Some(Ok(self.reject(
                    *checked,
                    source,
                    "UnexpectedAdmissionError".to_string(),
                    format!("Allocate failed due to {short}, which is unexpected"),
                )));
            }
        }
        let mut failures = fit(
            &checked.info,
            &self.holding(),
            &self.plan.resources.allocatable,
        );
        if self.devices.is_none() {
            if let Some(req) = Self::device_request(&checked.info) {
                let (resource, n) = req
                    .containers
                    .iter()
                    .chain(&req.init_containers)
                    .flat_map(|c| c.devices.iter())
                    .next()
                    .map(|(r, n)| (r.clone(), *n))
                    .unwrap_or_default();
                failures.push(AdmitFailure::InsufficientResource {
                    resource,
                    requested: i64::try_from(n).unwrap_or(i64::MAX),
                    used: 0,
                    capacity: 0,
                });
            }
        }
        if failures.is_empty() {
            return Some(self.admit(checked, source, Vec::new()).await);
        }
        let running: Vec<(String, PodInfo)> = self
            .pods
            .values()
            .filter(|e| !e.record.is_terminal() && e.record.cgroup.is_some() && !e.stopping)
            .map(|e| (e.record.uid.clone(), e.info.clone()))
            .collect();
        let infos: Vec<PodInfo> = running.iter().map(|(_, i)| i.clone()).collect();
        let decision = handle_admission_failure(&checked.info, &infos, &failures);
        if !decision.admit {
            let (reason, message) = match &decision.error {
                Some(e) => (
                    "UnexpectedAdmissionError".to_string(),
                    format!(
                        "Unexpected error while attempting to recover from admission failure: {e}"
                    ),
                ),
                None => rejection(&failures[0]),
            };
            return Some(Ok(self.reject(*checked, source, reason, message)));
        }
        if decision.preempt.is_empty() {
            return Some(self.admit(checked, source, Vec::new()).await);
        }
        let victims: Vec<String> = decision
            .preempt
            .iter()
            .map(|&i| running[i].0.clone())
            .collect();
        let preempted: Vec<String> = victims
            .iter()
            .filter_map(|uid| self.pods.get(uid).map(|e| e.record.full_name()))
            .collect();
        self.events.publish(NodeEventKind::Preemption {
            preemptor: format!("{}/{}", checked.namespace, checked.name),
            victims: preempted.clone(),
            reasons: failures.iter().map(AdmitFailure::reason).collect(),
            dry_run: self.dry_run,
        });
        // A dry run stops nothing: the critical pod does not fit without the preemption, so
        // it is refused as if none were possible, its message naming who would have gone.
        if self.dry_run {
            let (reason, message) = rejection(&failures[0]);
            tracing::info!(preemptor = %format!("{}/{}", checked.namespace, checked.name), victims = %preempted.join(","), "dry run: preemption not made; the critical pod is refused");
            let message = format!(
                "{message} (dry run: admitting it would have preempted {})",
                preempted.join(", ")
            );
            return Some(Ok(self.reject(*checked, source, reason, message)));
        }
        let uid = checked.uid.clone();
        for v in &victims {
            tracing::info!(victim = %v, preemptor = %uid, "preempting pod to admit critical pod");
            // The kubelet kills preemption victims with their own grace period.
            self.begin_stop(
                v,
                None,
                After::Preempted {
                    preemptor: uid.clone(),
                },
            );
        }
        self.pending.insert(
            uid,
            Pending {
                checked,
                source,
                victims: victims.into_iter().collect(),
                preempted,
                reply: reply_to.take(),
            },
        );
        None
    }

    fn reject(
        &mut self,
        checked: Checked,
        source: PodSource,
        reason: String,
        message: String,
    ) -> Applied {
        tracing::info!(pod = %format!("{}/{}", checked.namespace, checked.name), %reason, %message, "pod rejected");
        self.events.publish(NodeEventKind::Admission {
            namespace: checked.namespace.clone(),
            name: checked.name.clone(),
            uid: checked.uid.clone(),
            admitted: false,
            reason: reason.clone(),
            message: message.clone(),
        });
        let record = PodRecord {
            uid: checked.uid.clone(),
            namespace: checked.namespace.clone(),
            name: checked.name.clone(),
            document: checked.document,
            source,
            cgroup: None,
            grace_period_seconds: checked.grace_period_seconds,
            phase: PodPhase::Failed,
            reason,
            message,
            ended_by_agent: true,
            containers: Vec::new(),
            oom_score_adj: BTreeMap::new(),
            stopping: None,
            orphan: None,
        };
        let entry = Entry {
            record,
            info: checked.info,
            stopping: false,
        };
        let view = self.view(&entry, None, None);
        self.pods.insert(entry.record.uid.clone(), entry);
        self.save();
        Applied {
            pod: view,
            admitted: false,
            preempted: Vec::new(),
        }
    }

    /// Tiers first, then the pod cgroup, device allocation, then the runtime; undone on a
    /// failure so a pod that could not start leaves nothing behind.
    pub(super) async fn admit(
        &mut self,
        checked: Box<Checked>,
        source: PodSource,
        preempted: Vec<String>,
    ) -> Result<Applied, NodeError> {
        let cgroup = CgroupPath::for_pod(&checked.info)?;
        let mut device_env = BTreeMap::new();
        if let (Some(devices), Some(req)) =
            (self.devices.clone(), Self::device_request(&checked.info))
        {
            // A plugin that fails (or dies) in Allocate or PreStartContainer is the node's
            // trouble, not the client's: the pod is refused as the kubelet's device admit
            // handler refuses it (UnexpectedAdmissionError, "Allocate failed due to ...") and
            // whatever was assigned to it is freed, so no device stays held by a pod that
            // never ran.
            let all = || {
                checked
                    .info
                    .init_containers
                    .iter()
                    .chain(&checked.info.containers)
            };
            let allocated = async {
                let alloc = devices.allocate(&req, &self.active_uids()).await?;
                // The plugin's PreStartContainer (where it asked for one) before the
                // containers start, as the kubelet does when it builds each container's run
                // options.
                for c in all() {
                    devices.prepare_container(&req.uid, &c.name).await?;
                }
                Ok::<_, crate::devices::DeviceError>(alloc)
            }
            .await;
            let alloc = match allocated {
                Ok(alloc) => alloc,
                Err(e) => {
                    tracing::warn!(pod = %req.uid, "device allocation failed: {e}");
                    let refused = self.reject(
                        *checked,
                        source,
                        "UnexpectedAdmissionError".to_string(),
                        format!("Allocate failed due to {e}, which is unexpected"),
                    );
                    self.release_devices().await;
                    return Ok(refused);
                }
            };
            for c in all() {
                if let Some(ca) = alloc.containers.get(&c.name) {
                    device_env.insert(
                        c.name.clone(),
                        ca.envs
                            .iter()
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect(),
                    );
                }
            }
        }
        let spec = self.spec_for(&checked, &device_env)?;
        let record = PodRecord {
            uid: checked.uid.clone(),
            namespace: checked.namespace.clone(),
            name: checked.name.clone(),
            document: checked.document.clone(),
            source,
            cgroup: Some(cgroup.clone()),
            grace_period_seconds: checked.grace_period_seconds,
            phase: PodPhase::Pending,
            reason: String::new(),
            message: String::new(),
            ended_by_agent: false,
            containers: Vec::new(),
            oom_score_adj: spec
                .containers
                .iter()
                .map(|c| (c.name.clone(), c.oom_score_adj))
                .collect(),
            stopping: None,
            orphan: None,
        };
        let uid = record.uid.clone();
        self.pods.insert(
            uid.clone(),
            Entry {
                record,
                info: checked.info.clone(),
                stopping: false,
            },
        );
        let started = async {
            self.update_tiers()?;
            self.cgroups.create_pod_cgroup(
                &cgroup,
                &Resources::from(&pod_config(&self.plan.cgroups, &checked.info)),
            )?;
            // The loop knows the pod, its cgroup there to open, before its processes run: a
            // container the kernel OOM-kills in its first milliseconds is then recorded as
            // this pod's, not only as a cgroup's.
            self.publish_active();
            self.rt.run_pod(spec).await?;
            Ok::<(), NodeError>(())
        }
        .await;
        if let Err(e) = started {
            tracing::error!(pod = %uid, "pod could not be started: {e}");
            let _ = self.rt.stop_pod(&uid, Duration::ZERO).await;
            let _ = self
                .cgroups
                .remove_off_runtime(&cgroup, DEFAULT_REMOVE_WAIT)
                .await;
            self.pods.remove(&uid);
            let _ = self.update_tiers();
            // The devices allocated to it above go back at once (a runtime that is down must
            // not leave them held by a pod that does not exist).
            self.release_devices().await;
            return Err(e);
        }
        if let Ok(status) = self.rt.pod_status(&uid).await {
            if let Some(e) = self.pods.get_mut(&uid) {
                e.record.phase = status.phase;
                e.record.containers = status.containers;
            }
        }
        self.save();
        self.events.publish(NodeEventKind::Admission {
            namespace: checked.namespace.clone(),
            name: checked.name.clone(),
            uid: uid.clone(),
            admitted: true,
            reason: String::new(),
            message: String::new(),
        });
        tracing::info!(pod = %format!("{}/{}", checked.namespace, checked.name), %uid, qos = %checked.info.qos, %cgroup, "pod admitted");
        let entry = &self.pods[&uid];
        Ok(Applied {
            pod: self.view(entry, None, None),
            admitted: true,
            preempted,
        })
    }
}
