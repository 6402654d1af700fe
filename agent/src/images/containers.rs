//! Dead-container removal ahead of a disk-pressure reclaim, as the kubelet's container GC
//! does when the eviction manager asks it to reclaim (`DeleteAllUnusedContainers`): exited
//! containers hold writable layers and logs, and a not-ready sandbox holds its own; removing
//! them frees that space and releases nothing a running pod needs.

use std::collections::BTreeSet;

use crate::act::cri::{
    ContainerFilter, ContainerState, CriClient, CriError, SandboxFilter, SandboxState,
};

/// What the removal did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DeadRemoved {
    /// Exited containers removed.
    pub containers: Vec<String>,
    /// Not-ready sandboxes removed.
    pub sandboxes: Vec<String>,
    /// Removals the runtime refused, one line each; they do not stop the others.
    pub errors: Vec<String>,
}

/// Removes every exited container, then every not-ready sandbox that has no container left
/// that is not exited (a sandbox still holding a created or running container is left
/// alone). Fails only when the runtime cannot be reached. With `dry_run` nothing is
/// removed: the result lists what would have been.
pub(crate) async fn remove_dead_containers(
    client: &CriClient,
    dry_run: bool,
) -> Result<DeadRemoved, CriError> {
    let mut out = DeadRemoved::default();
    let containers = client.list_containers(&ContainerFilter::default()).await?;
    for c in containers
        .iter()
        .filter(|c| c.state == ContainerState::Exited)
    {
        if dry_run {
            out.containers.push(c.id.clone());
            continue;
        }
        match client.remove_container(&c.id).await {
            Ok(()) => out.containers.push(c.id.clone()),
            Err(e) if e.is_not_found() => {}
            Err(e) if e.is_runtime_down() => return Err(e),
            Err(e) => out.errors.push(format!("container {}: {e}", c.id)),
        }
    }
    // Sandboxes with a live (non-exited) container stay; exited ones that could not be
    // removed above also keep their sandbox, since RemovePodSandbox would force them.
    let removed: BTreeSet<&str> = out.containers.iter().map(String::as_str).collect();
    let busy: BTreeSet<&str> = containers
        .iter()
        .filter(|c| !removed.contains(c.id.as_str()))
        .map(|c| c.pod_sandbox_id.as_str())
        .collect();
    let not_ready = client
        .list_pod_sandboxes(&SandboxFilter {
            state: Some(SandboxState::NotReady),
            ..Default::default()
        })
        .await?;
    for s in not_ready.iter().filter(|s| !busy.contains(s.id.as_str())) {
        if dry_run {
            out.sandboxes.push(s.id.clone());
            continue;
        }
        match client.remove_pod_sandbox(&s.id).await {
            Ok(()) => out.sandboxes.push(s.id.clone()),
            Err(e) if e.is_not_found() => {}
            Err(e) if e.is_runtime_down() => return Err(e),
            Err(e) => out.errors.push(format!("sandbox {}: {e}", s.id)),
        }
    }
    Ok(out)
}
