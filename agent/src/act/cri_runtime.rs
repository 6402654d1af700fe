//! The CRI runtime: runs pods through a container runtime's CRI endpoint (containerd,
//! CRI-O), with the semantics of the [process runtime](super::process) — restart policy with
//! the kubelet's back-off, `OOMKilled` recorded, container exits published, re-adoption after
//! an agent restart.
//!
//! How, and why that way:
//! - **One sandbox per pod**, created with `cgroup_parent` set to the pod cgroup the caller
//!   made (cgroupfs form, `/<cgroupRoot>/kubepods[/qos]/pod<uid>`), so the runtime creates
//!   every container cgroup below it (`<pod cgroup>/<container id>`) and the pod-level
//!   limits bind them all. The sandbox uses the node's network namespace (no CNI here) and
//!   one PID namespace for the pod, so a container's main process is not PID 1 and gets its
//!   SIGTERM like anywhere else.
//! - **Labels as the kubelet sets them** (`io.kubernetes.pod.uid`, `.name`, `.namespace`,
//!   `io.kubernetes.container.name`) plus `reactor.io/managed-by`, so the agent finds its
//!   own sandboxes and containers again; the whole [`PodSpec`] rides along as a sandbox
//!   annotation, so a re-adopted pod can still restart its containers.
//! - **Supervision by relisting**, as the kubelet's PLEG does (1 s by default): a task lists
//!   the containers, reads the status of those that exited (exit code, and containerd's
//!   reason: `Completed`, `Error`, `OOMKilled`), publishes the exit, and applies
//!   `restartPolicy` with the kubelet back-off by creating the next attempt (`attempt` =
//!   restart count, as the kubelet numbers them). The previous attempt is removed once the
//!   next one exists. All CRI sequences (run, stop, relist) are serialised by one lock, so a
//!   relist never races a stop; status calls relist first and so report what the runtime
//!   reports now.
//! - **Runtime down**: every call fails with [`RuntimeError::Unavailable`] naming the
//!   endpoint; the relist task logs the outage once and carries on, and picks up whatever
//!   changed (exits included) when the runtime answers again.
//! - **Re-adoption**: [`CriRuntime::open`] lists the sandboxes carrying the agent's label and
//!   rebuilds the view from them and their containers; it kills nothing. Dropping a
//!   [`CriRuntime`] stops the relist task and likewise kills nothing.
//!
//! Images are not pulled: a container's image must already be in the runtime (imported, or
//! pulled by whoever deploys the pod); a missing one is a `StartError` naming it, restarted by
//! the restart policy like any failed start.
//!
//! Only the cgroupfs cgroup driver is supported (the `cgroup_parent` form). The pid in
//! [`ContainerState::Running`] comes from the runtime's verbose status (containerd reveals
//! it); it is 0 where a runtime does not. The PID namespace is shared by the pod (the
//! kubelet's `shareProcessNamespace: true`), unlike the kubelet's default, so signals reach
//! a container's main process as they do under the process runtime.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant, SystemTime};

use tokio::task::JoinHandle;

use super::cgroups::{CgroupPath, Resources};
use super::cri::{self, CriClient, CriError};
use super::runtime::{
    pod_phase, ContainerExit, ContainerSpec, ContainerState, ContainerStatus, PodSpec, PodStatus,
    RestartPolicy, Runtime, RuntimeError, Terminated,
};
use crate::decide::backoff::{BackOffEntry, BackOffPolicy};

/// The kubelet's label for the pod uid on sandboxes and containers.
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
/// The kubelet's label for the pod name.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// The kubelet's label for the pod namespace.
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// The kubelet's label for the container name.
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Marks what this agent created, so it never adopts (or stops) a kubelet's pods.
pub const LABEL_MANAGED_BY: &str = "reactor.io/managed-by";
/// The value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "reactor";
/// The sandbox annotation holding the pod's [`PodSpec`] as JSON.
pub const ANNOTATION_POD_SPEC: &str = "reactor.io/pod-spec";
/// How many container exits a slow subscriber may fall behind by.
const EXIT_EVENTS: usize = 1024;

/// What the CRI runtime needs.
#[derive(Debug, Clone)]
pub struct CriRuntimeConfig {
    /// The CRI client for the runtime's endpoint.
    pub client: CriClient,
    /// The agent's `cgroupRoot`: pod cgroups are below it, and CRI wants the full cgroupfs
    /// path as `cgroup_parent`.
    pub cgroup_root: CgroupPath,
    /// Where the runtime writes container logs (`<dir>/<ns>_<name>_<uid>/<container>_<n>.log`).
    pub log_dir: PathBuf,
    /// Restart back-off (the kubelet's 10 s doubling to 5 min unless a test says otherwise).
    pub backoff: BackOffPolicy,
    /// How often the runtime is relisted for exits (the kubelet's PLEG: 1 s).
    pub relist_period: Duration,
}

impl CriRuntimeConfig {
    /// The kubelet's defaults: its back-off and a 1 s relist.
    pub fn new(client: CriClient, cgroup_root: CgroupPath, log_dir: PathBuf) -> CriRuntimeConfig {
        CriRuntimeConfig {
            client,
            cgroup_root,
            log_dir,
            backoff: BackOffPolicy::default(),
            relist_period: Duration::from_secs(1),
        }
    }
}

/// The CRI runtime; see the module doc.
pub struct CriRuntime {
    inner: Arc<Inner>,
    relist: JoinHandle<()>,
}

struct Inner {
    client: CriClient,
    cgroup_root: CgroupPath,
    log_dir: PathBuf,
    backoff: BackOffPolicy,
    origin: Instant,
    pods: Mutex<BTreeMap<String, PodEntry>>,
    /// Serialises every CRI sequence (run, stop, relist).
    ops: tokio::sync::Mutex<()>,
    exits: tokio::sync::broadcast::Sender<ContainerExit>,
    /// Whether the last relist found the runtime down (to log transitions once).
    down: AtomicBool,
}

struct PodEntry {
    spec: PodSpec,
    sandbox_id: String,
    sandbox: cri::PodSandboxSpec,
    slots: Vec<Slot>,
}

/// One container of a pod, across its attempts.
struct Slot {
    status: ContainerStatus,
    /// The current attempt's container, if one exists.
    id: Option<String>,
    /// Earlier attempts still to be removed.
    old: Vec<String>,
    backoff: Option<BackOffEntry>,
    /// When (runtime-monotonic) to create the next attempt.
    restart_at: Option<Duration>,
}

fn lock(m: &Mutex<BTreeMap<String, PodEntry>>) -> MutexGuard<'_, BTreeMap<String, PodEntry>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn waiting(reason: &str, message: String) -> ContainerState {
    ContainerState::Waiting {
        reason: reason.to_string(),
        message,
    }
}

fn time_of(ns: i64) -> SystemTime {
    u64::try_from(ns)
        .ok()
        .filter(|n| *n > 0)
        .map_or(SystemTime::UNIX_EPOCH, |n| {
            SystemTime::UNIX_EPOCH + Duration::from_nanos(n)
        })
}

/// The cgroup values as CRI carries them: "unlimited" (`-1`) is CRI's "unset".
fn cri_resources(r: &Resources, oom_score_adj: i32) -> cri::LinuxResources {
    cri::LinuxResources {
        cpu_shares: r.cpu_shares,
        cpu_quota_us: r.cpu_quota_us.and_then(|q| u64::try_from(q).ok()),
        cpu_period_us: r.cpu_period_us,
        memory_limit_bytes: r.memory_limit_bytes.and_then(|m| u64::try_from(m).ok()),
        oom_score_adj: Some(i64::from(oom_score_adj)),
    }
}

/// How long after a SIGKILL exit the runtime may still fill in the reason (`OOMKilled`).
const REASON_SETTLE: Duration = Duration::from_millis(500);

/// Whether an exit is too fresh to judge: killed by SIGKILL (137), no reason yet, and
/// finished less than [`REASON_SETTLE`] ago.
fn reason_may_follow(s: &cri::ContainerStatus, now: SystemTime) -> bool {
    s.reason.is_empty()
        && s.exit_code == 137
        && now
            .duration_since(time_of(s.finished_at_ns))
            .is_ok_and(|age| age < REASON_SETTLE)
}

/// How an exited container ended, from its CRI status.
fn terminated(s: &cri::ContainerStatus) -> Terminated {
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
            return Err(format!(
                "init container {:?}: the CRI runtime does not run init containers yet",
                c.name
            ));
        }
        if c.image.is_empty() {
            return Err(format!("container {:?} has no image", c.name));
        }
        Ok(())
    })
}

impl Inner {
    fn mono(&self) -> Duration {
        self.origin.elapsed()
    }

    /// A CRI failure as the runtime trait reports it; "down" names the endpoint.
    fn err(&self, e: CriError) -> RuntimeError {
        if e.is_runtime_down() {
            RuntimeError::Unavailable {
                reason: format!(
                    "container runtime at unix://{} is unavailable: {e}",
                    self.client.socket().display()
                ),
            }
        } else {
            RuntimeError::Cri(e)
        }
    }

    fn sandbox_spec(&self, pod: &PodSpec) -> Result<cri::PodSandboxSpec, RuntimeError> {
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
    async fn start_attempt(
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

    /// Records how a run of container `idx` ended and applies the restart policy.
    fn on_exit(&self, entry: &mut PodEntry, idx: usize, ended: Terminated, publish: bool) {
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
    async fn restart_due(&self) -> Result<(), CriError> {
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

    fn status_of(entry: &PodEntry) -> PodStatus {
        let containers: Vec<ContainerStatus> =
            entry.slots.iter().map(|s| s.status.clone()).collect();
        PodStatus {
            uid: entry.spec.uid.clone(),
            namespace: entry.spec.namespace.clone(),
            name: entry.spec.name.clone(),
            cgroup: entry.spec.cgroup.clone(),
            phase: pod_phase(&containers),
            containers,
        }
    }

    /// A relist under the lock, reporting an outage as the trait does.
    async fn refresh(&self) -> Result<(), RuntimeError> {
        let _ops = self.ops.lock().await;
        self.relist().await.map_err(|e| self.err(e))
    }

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
            let mut slot = Slot {
                status: ContainerStatus {
                    name: c.name.clone(),
                    state: waiting("ContainerCreating", String::new()),
                    restart_count: 0,
                    last_termination: None,
                },
                id: None,
                old: Vec::new(),
                backoff: None,
                restart_at: None,
            };
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

/// A container the runtime no longer knows (removed behind the agent's back).
fn lost() -> Terminated {
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

/// The relist task: one pass per period until the runtime is dropped; an outage is logged
/// once per transition and never ends the task.
async fn relist_loop(inner: Weak<Inner>, period: Duration) {
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

    /// Every container that ends on its own from now on (crashes, completions, OOM kills),
    /// for the event stream; stops the agent asked for are not included.
    pub fn subscribe_exits(&self) -> tokio::sync::broadcast::Receiver<ContainerExit> {
        self.inner.exits.subscribe()
    }

    /// The CRI client this runtime uses (for stats and the image service).
    pub fn client(&self) -> &CriClient {
        &self.inner.client
    }

    /// The sandbox id and the current container ids (by name) of a pod, as the runtime
    /// knows them: what to ask CRI for stats, and where the container cgroups are
    /// (`<pod cgroup>/<container id>`).
    pub fn container_ids(&self, uid: &str) -> Option<(String, BTreeMap<String, String>)> {
        lock(&self.inner.pods).get(uid).map(|e| {
            let ids = e
                .slots
                .iter()
                .filter_map(|s| s.id.clone().map(|id| (s.status.name.clone(), id)))
                .collect();
            (e.sandbox_id.clone(), ids)
        })
    }
}

impl Drop for CriRuntime {
    /// Stops relisting (as an agent crash would) and kills nothing: the next
    /// [`CriRuntime::open`] re-adopts the pods.
    fn drop(&mut self) {
        self.relist.abort();
    }
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
        let slots = pod
            .containers
            .iter()
            .map(|c| Slot {
                status: ContainerStatus {
                    name: c.name.clone(),
                    state: waiting("ContainerCreating", String::new()),
                    restart_count: 0,
                    last_termination: None,
                },
                id: None,
                old: Vec::new(),
                backoff: None,
                restart_at: None,
            })
            .collect();
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
        self.inner.refresh().await?;
        Ok(lock(&self.inner.pods)
            .values()
            .map(Inner::status_of)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            },
            1000,
        );
        assert_eq!(r.cpu_quota_us, None);
        assert_eq!(r.memory_limit_bytes, None);
        assert_eq!(r.cpu_shares, Some(2));
        assert_eq!(r.oom_score_adj, Some(1000));
    }

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

        // A fresh SIGKILL exit with no reason waits for containerd's OOM event; an old one,
        // another exit code, or one with a reason is judged at once.
        let finished = SystemTime::UNIX_EPOCH + Duration::from_secs(2);
        s.reason.clear();
        assert!(reason_may_follow(&s, finished + Duration::from_millis(100)));
        assert!(!reason_may_follow(&s, finished + Duration::from_secs(1)));
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
