//! Conversions between CRI wire types and the agent's domain types, in one place so the
//! rest of the agent never sees a generated type. Requests are checked here (values that do
//! not fit CRI's signed fields become an `InvalidArgument` naming the field) instead of being
//! silently wrapped.

use std::collections::{BTreeMap, HashMap};

use reactor_proto::runtime_v1 as pb;

use super::error::CriError;
use super::types::*;

fn map_in(m: HashMap<String, String>) -> BTreeMap<String, String> {
    m.into_iter().collect()
}

fn map_out(m: &BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn signed(rpc: &'static str, field: &str, v: Option<u64>) -> Result<i64, CriError> {
    match v {
        None => Ok(0),
        Some(v) => i64::try_from(v).map_err(|_| CriError::InvalidArgument {
            rpc,
            message: format!("{field} = {v} does not fit CRI's int64"),
        }),
    }
}

fn namespace_mode(m: NamespaceMode) -> i32 {
    match m {
        NamespaceMode::Pod => pb::NamespaceMode::Pod as i32,
        NamespaceMode::Container => pb::NamespaceMode::Container as i32,
        NamespaceMode::Node => pb::NamespaceMode::Node as i32,
    }
}

/// Converts cgroup settings, rejecting values CRI cannot carry.
pub(crate) fn resources(
    rpc: &'static str,
    r: &LinuxResources,
) -> Result<pb::LinuxContainerResources, CriError> {
    if let Some(adj) = r.oom_score_adj {
        if !(-1000..=1000).contains(&adj) {
            return Err(CriError::InvalidArgument {
                rpc,
                message: format!("oom_score_adj = {adj} is outside -1000..=1000"),
            });
        }
    }
    Ok(pb::LinuxContainerResources {
        cpu_period: signed(rpc, "cpu_period_us", r.cpu_period_us)?,
        cpu_quota: signed(rpc, "cpu_quota_us", r.cpu_quota_us)?,
        cpu_shares: signed(rpc, "cpu_shares", r.cpu_shares)?,
        memory_limit_in_bytes: signed(rpc, "memory_limit_bytes", r.memory_limit_bytes)?,
        oom_score_adj: r.oom_score_adj.unwrap_or(0),
        unified: r
            .unified
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        ..Default::default()
    })
}

/// Builds the sandbox config the runtime gets in `RunPodSandbox`.
pub(crate) fn sandbox_config(
    rpc: &'static str,
    s: &PodSandboxSpec,
) -> Result<pb::PodSandboxConfig, CriError> {
    if s.name.is_empty() || s.uid.is_empty() || s.namespace.is_empty() {
        return Err(CriError::InvalidArgument {
            rpc,
            message: "a pod sandbox needs a name, a uid and a namespace".into(),
        });
    }
    let resources = s
        .resources
        .as_ref()
        .map(|r| resources(rpc, r))
        .transpose()?;
    Ok(pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata {
            name: s.name.clone(),
            uid: s.uid.clone(),
            namespace: s.namespace.clone(),
            attempt: s.attempt,
        }),
        // As the kubelet does: a pod in the node's network namespace shares the node's UTS
        // namespace too, and runc refuses to set a hostname there.
        hostname: if s.network == NamespaceMode::Node {
            String::new()
        } else {
            s.hostname.clone()
        },
        log_directory: s
            .log_directory
            .as_ref()
            .map(|d| d.display().to_string())
            .unwrap_or_default(),
        labels: map_out(&s.labels),
        annotations: map_out(&s.annotations),
        linux: Some(pb::LinuxPodSandboxConfig {
            cgroup_parent: s.cgroup_parent.clone(),
            security_context: Some(pb::LinuxSandboxSecurityContext {
                namespace_options: Some(pb::NamespaceOption {
                    network: namespace_mode(s.network),
                    pid: namespace_mode(s.pid),
                    ipc: namespace_mode(s.ipc),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            resources,
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// Builds the container config the runtime gets in `CreateContainer`.
pub fn container_config(
    rpc: &'static str,
    c: &ContainerSpec,
) -> Result<pb::ContainerConfig, CriError> {
    if c.name.is_empty() || c.image.is_empty() {
        return Err(CriError::InvalidArgument {
            rpc,
            message: "a container needs a name and an image".into(),
        });
    }
    Ok(pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata {
            name: c.name.clone(),
            attempt: c.attempt,
        }),
        image: Some(pb::ImageSpec {
            image: c.image.clone(),
            ..Default::default()
        }),
        command: c.command.clone(),
        args: c.args.clone(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: c
            .env
            .iter()
            .map(|(k, v)| pb::KeyValue {
                key: k.clone(),
                value: v.clone().into_bytes(),
            })
            .collect(),
        mounts: c
            .mounts
            .iter()
            .map(|m| pb::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                readonly: m.readonly,
                ..Default::default()
            })
            .collect(),
        devices: c
            .devices
            .iter()
            .map(|d| pb::Device {
                container_path: d.container_path.clone(),
                host_path: d.host_path.clone(),
                permissions: d.permissions.clone(),
            })
            .collect(),
        labels: map_out(&c.labels),
        annotations: map_out(&c.annotations),
        log_path: c.log_path.clone().unwrap_or_default(),
        linux: Some(pb::LinuxContainerConfig {
            resources: Some(resources(rpc, &c.resources)?),
            security_context: None,
        }),
        ..Default::default()
    })
}

pub(crate) fn sandbox_state_out(s: SandboxState) -> i32 {
    match s {
        SandboxState::Ready => pb::PodSandboxState::SandboxReady as i32,
        SandboxState::NotReady => pb::PodSandboxState::SandboxNotready as i32,
    }
}

fn sandbox_state_in(s: i32) -> SandboxState {
    match pb::PodSandboxState::try_from(s) {
        Ok(pb::PodSandboxState::SandboxReady) => SandboxState::Ready,
        _ => SandboxState::NotReady,
    }
}

pub(crate) fn container_state_out(s: ContainerState) -> i32 {
    match s {
        ContainerState::Created => pb::ContainerState::ContainerCreated as i32,
        ContainerState::Running => pb::ContainerState::ContainerRunning as i32,
        ContainerState::Exited => pb::ContainerState::ContainerExited as i32,
        ContainerState::Unknown => pb::ContainerState::ContainerUnknown as i32,
    }
}

fn container_state_in(s: i32) -> ContainerState {
    match pb::ContainerState::try_from(s) {
        Ok(pb::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(pb::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(pb::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    }
}

pub(crate) fn sandbox_filter(f: &SandboxFilter) -> pb::PodSandboxFilter {
    pb::PodSandboxFilter {
        id: f.id.clone().unwrap_or_default(),
        state: f.state.map(|s| pb::PodSandboxStateValue {
            state: sandbox_state_out(s),
        }),
        label_selector: map_out(&f.labels),
    }
}

pub(crate) fn container_filter(f: &ContainerFilter) -> pb::ContainerFilter {
    pb::ContainerFilter {
        id: f.id.clone().unwrap_or_default(),
        state: f.state.map(|s| pb::ContainerStateValue {
            state: container_state_out(s),
        }),
        pod_sandbox_id: f.pod_sandbox_id.clone().unwrap_or_default(),
        label_selector: map_out(&f.labels),
    }
}

pub(crate) fn stats_filter(f: &StatsFilter) -> pb::ContainerStatsFilter {
    pb::ContainerStatsFilter {
        id: f.id.clone().unwrap_or_default(),
        pod_sandbox_id: f.pod_sandbox_id.clone().unwrap_or_default(),
        label_selector: map_out(&f.labels),
    }
}

pub(crate) fn sandbox(p: pb::PodSandbox) -> SandboxInfo {
    let meta = p.metadata.unwrap_or_default();
    SandboxInfo {
        id: p.id,
        name: meta.name,
        uid: meta.uid,
        namespace: meta.namespace,
        attempt: meta.attempt,
        state: sandbox_state_in(p.state),
        created_at_ns: p.created_at,
        labels: map_in(p.labels),
        annotations: map_in(p.annotations),
    }
}

pub(crate) fn sandbox_status(p: pb::PodSandboxStatus) -> SandboxInfo {
    let meta = p.metadata.unwrap_or_default();
    SandboxInfo {
        id: p.id,
        name: meta.name,
        uid: meta.uid,
        namespace: meta.namespace,
        attempt: meta.attempt,
        state: sandbox_state_in(p.state),
        created_at_ns: p.created_at,
        labels: map_in(p.labels),
        annotations: map_in(p.annotations),
    }
}

pub(crate) fn container(c: pb::Container) -> ContainerInfo {
    let meta = c.metadata.unwrap_or_default();
    ContainerInfo {
        id: c.id,
        pod_sandbox_id: c.pod_sandbox_id,
        name: meta.name,
        attempt: meta.attempt,
        image: c.image.map(|i| i.image).unwrap_or_default(),
        image_ref: c.image_ref,
        state: container_state_in(c.state),
        created_at_ns: c.created_at,
        labels: map_in(c.labels),
        annotations: map_in(c.annotations),
    }
}

/// `pod_sandbox_id` is not part of CRI's `ContainerStatus`; the caller supplies it if known.
pub fn container_status(s: pb::ContainerStatus) -> ContainerStatus {
    let meta = s.metadata.unwrap_or_default();
    ContainerStatus {
        info: ContainerInfo {
            id: s.id,
            pod_sandbox_id: String::new(),
            name: meta.name,
            attempt: meta.attempt,
            image: s.image.map(|i| i.image).unwrap_or_default(),
            image_ref: s.image_ref,
            state: container_state_in(s.state),
            created_at_ns: s.created_at,
            labels: map_in(s.labels),
            annotations: map_in(s.annotations),
        },
        started_at_ns: s.started_at,
        finished_at_ns: s.finished_at,
        exit_code: s.exit_code,
        reason: s.reason,
        message: s.message,
    }
}

/// The main process's pid from a verbose `ContainerStatus` (containerd: a JSON document
/// under `info` with a `pid` field; 0 once the process is gone).
pub(crate) fn container_pid(info: &HashMap<String, String>) -> Option<u32> {
    let doc: serde_json::Value = serde_json::from_str(info.get("info")?).ok()?;
    let pid = u32::try_from(doc.get("pid")?.as_u64()?).ok()?;
    (pid != 0).then_some(pid)
}

pub fn container_stats(s: pb::ContainerStats) -> ContainerStats {
    let attrs = s.attributes.unwrap_or_default();
    let cpu = s.cpu.unwrap_or_default();
    let mem = s.memory.unwrap_or_default();
    let layer = s.writable_layer.unwrap_or_default();
    ContainerStats {
        id: attrs.id,
        name: attrs.metadata.map(|m| m.name).unwrap_or_default(),
        labels: map_in(attrs.labels),
        cpu_usage_core_ns: cpu.usage_core_nano_seconds.map(|v| v.value),
        cpu_usage_nano_cores: cpu.usage_nano_cores.map(|v| v.value),
        memory_working_set_bytes: mem.working_set_bytes.map(|v| v.value),
        memory_usage_bytes: mem.usage_bytes.map(|v| v.value),
        memory_rss_bytes: mem.rss_bytes.map(|v| v.value),
        writable_layer_bytes: layer.used_bytes.map(|v| v.value),
        writable_layer_inodes: layer.inodes_used.map(|v| v.value),
    }
}

pub(crate) fn image(i: pb::Image) -> ImageInfo {
    ImageInfo {
        id: i.id,
        repo_tags: i.repo_tags,
        repo_digests: i.repo_digests,
        size_bytes: i.size,
        pinned: i.pinned,
    }
}

/// The runtime's part of a filesystem's usage; capacity is filled in by the caller.
pub(crate) fn filesystem_usage(u: pb::FilesystemUsage) -> FilesystemUsage {
    FilesystemUsage {
        timestamp_ns: u.timestamp,
        mount_point: u.fs_id.map(|f| f.mountpoint).unwrap_or_default().into(),
        used_bytes: u.used_bytes.map(|v| v.value),
        inodes_used: u.inodes_used.map(|v| v.value),
        capacity_bytes: None,
        available_bytes: None,
        inodes_total: None,
        inodes_free: None,
    }
}

pub fn cgroup_driver(d: i32) -> Option<CgroupDriver> {
    match pb::CgroupDriver::try_from(d) {
        Ok(pb::CgroupDriver::Cgroupfs) => Some(CgroupDriver::Cgroupfs),
        Ok(pb::CgroupDriver::Systemd) => Some(CgroupDriver::Systemd),
        Err(_) => None,
    }
}

/// Finds the sandbox image in a runtime's verbose status: containerd puts its CRI config as
/// JSON under `config`, with the image under `sandboxImage` (1.x) or, in 2.x, under
/// `pinnedImages.sandbox`.
pub(crate) fn sandbox_image(info: &HashMap<String, String>) -> Option<String> {
    let config: serde_json::Value = serde_json::from_str(info.get("config")?).ok()?;
    let found = config
        .get("sandboxImage")
        .or_else(|| config.get("pinnedImages").and_then(|p| p.get("sandbox")))?;
    found.as_str().filter(|s| !s.is_empty()).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_reject_what_cri_cannot_carry() {
        let r = LinuxResources {
            memory_limit_bytes: Some(u64::MAX),
            ..Default::default()
        };
        let e = resources("CreateContainer", &r).unwrap_err();
        assert!(e.to_string().contains("memory_limit_bytes"), "{e}");
        let r = LinuxResources {
            oom_score_adj: Some(1001),
            ..Default::default()
        };
        assert!(resources("CreateContainer", &r).is_err());
        let r = LinuxResources {
            cpu_shares: Some(512),
            cpu_quota_us: Some(50_000),
            cpu_period_us: Some(100_000),
            memory_limit_bytes: Some(64 << 20),
            oom_score_adj: Some(-997),
            unified: BTreeMap::from([("memory.oom.group".into(), "1".into())]),
        };
        let p = resources("CreateContainer", &r).unwrap();
        assert_eq!(
            (
                p.cpu_shares,
                p.cpu_quota,
                p.cpu_period,
                p.memory_limit_in_bytes,
                p.oom_score_adj
            ),
            (512, 50_000, 100_000, 64 << 20, -997)
        );
        assert_eq!(
            p.unified.get("memory.oom.group").map(String::as_str),
            Some("1")
        );
    }

    #[test]
    fn sandbox_config_needs_identity_and_carries_cgroup_parent() {
        let mut s = PodSandboxSpec {
            name: "p".into(),
            uid: "u".into(),
            namespace: "n".into(),
            cgroup_parent: "/kubepods/podu".into(),
            network: NamespaceMode::Node,
            ..Default::default()
        };
        let c = sandbox_config("RunPodSandbox", &s).unwrap();
        let linux = c.linux.unwrap();
        assert_eq!(linux.cgroup_parent, "/kubepods/podu");
        let ns = linux.security_context.unwrap().namespace_options.unwrap();
        assert_eq!(ns.network, pb::NamespaceMode::Node as i32);
        s.hostname = "web".into();
        assert_eq!(sandbox_config("RunPodSandbox", &s).unwrap().hostname, "");
        s.network = NamespaceMode::Pod;
        assert_eq!(sandbox_config("RunPodSandbox", &s).unwrap().hostname, "web");
        s.uid.clear();
        assert!(sandbox_config("RunPodSandbox", &s).is_err());
    }

    #[test]
    fn container_pid_is_read_from_containerd_verbose_info() {
        let mut info = HashMap::new();
        assert_eq!(container_pid(&info), None);
        info.insert(
            "info".to_string(),
            r#"{"sandboxID":"x","pid":4242}"#.to_string(),
        );
        assert_eq!(container_pid(&info), Some(4242));
        info.insert("info".to_string(), r#"{"pid":0}"#.to_string());
        assert_eq!(container_pid(&info), None);
        info.insert("info".to_string(), "not json".to_string());
        assert_eq!(container_pid(&info), None);
    }

    #[test]
    fn sandbox_image_is_read_from_containerd_verbose_config() {
        let mut info = HashMap::new();
        info.insert(
            "config".to_string(),
            r#"{"sandboxImage":"localhost/pause:1","other":1}"#.to_string(),
        );
        assert_eq!(sandbox_image(&info).as_deref(), Some("localhost/pause:1"));
        info.insert(
            "config".to_string(),
            r#"{"pinnedImages":{"sandbox":"p:2"}}"#.to_string(),
        );
        assert_eq!(sandbox_image(&info).as_deref(), Some("p:2"));
        info.insert("config".to_string(), "not json".to_string());
        assert_eq!(sandbox_image(&info), None);
    }

    #[test]
    fn unknown_states_are_not_mistaken_for_running() {
        assert_eq!(container_state_in(42), ContainerState::Unknown);
        assert_eq!(sandbox_state_in(42), SandboxState::NotReady);
    }
}
