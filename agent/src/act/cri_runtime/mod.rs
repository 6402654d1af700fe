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

mod adopt;
mod create;
mod relist;
mod runtime_impl;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use tokio::task::JoinHandle;

use super::cgroups::CgroupPath;
use super::cri::{self, CriClient, CriError};
use super::runtime::{
    pod_phase, ContainerExit, ContainerState, ContainerStatus, PodSpec, PodStatus, RuntimeError,
};
use crate::decide::backoff::{BackOffEntry, BackOffPolicy};

/// The kubelet's label for the pod uid on sandboxes and containers.
pub(crate) const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
/// The kubelet's label for the pod name.
pub(crate) const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// The kubelet's label for the pod namespace.
pub(crate) const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// The kubelet's label for the container name.
pub(crate) const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
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

impl Slot {
    /// A container with no attempt yet, waiting as `ContainerCreating`.
    fn new(name: &str) -> Slot {
        Slot {
            status: ContainerStatus {
                name: name.to_string(),
                state: waiting("ContainerCreating", String::new()),
                restart_count: 0,
                last_termination: None,
            },
            id: None,
            old: Vec::new(),
            backoff: None,
            restart_at: None,
        }
    }
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
}

impl CriRuntime {
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
