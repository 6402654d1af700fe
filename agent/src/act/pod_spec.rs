//! From a Kubernetes `v1.Pod` to what a [`Runtime`](super::runtime::Runtime) runs: the
//! container commands and environment the kubelet would give, with `decide`'s cgroup values
//! and `oom_score_adj` filled in.
//!
//! Why here and not in each runtime: the process runtime and CRI must start the same
//! containers with the same environment, the same `$(VAR)` expansion and the same cgroup
//! values. What the kubelet does and this follows:
//! - Environment: device plugins' variables first, then the container's `env` in order, a
//!   later entry winning (`GenerateRunContainerOptions`). `value` may reference variables
//!   defined before it with `$(NAME)`; `$$` is a literal `$`; an unknown reference stays as
//!   written. `valueFrom.fieldRef` gives `metadata.name`, `metadata.namespace`,
//!   `metadata.uid` and `spec.serviceAccountName`; anything that needs the API server
//!   (`secretKeyRef`, `configMapKeyRef`, `envFrom`) is refused with the field named, since a
//!   node without one cannot resolve it.
//! - `command` and `args` are expanded with the container's final environment.
//! - `restartPolicy` defaults to `Always`.
//! - Init containers come first in the runtime's container list, flagged `init`, in order
//!   (the process runtime runs each to completion before the next; CRI refuses them for
//!   now). Sidecars (`restartPolicy: Always` on an init container) are refused for now.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as k8s;

use super::cgroups::{CgroupPath, Resources};
use super::runtime::{ContainerSpec, PodSpec, RestartPolicy};
use crate::decide::cgroups::{container_config, NodeSettings};
use crate::decide::oom_score::oom_score_adj;
use crate::decide::pod::PodInfo;

/// Why a pod cannot be turned into something to run; names the field.
#[derive(Debug, thiserror::Error)]
#[error("pod {pod}: {field}: {reason}")]
pub struct PodSpecError {
    /// `namespace/name`.
    pub pod: String,
    /// The field path (`spec.containers[0].env[2].valueFrom`).
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

/// Expands `$(NAME)` references in `input` as the kubelet does (`expansion.Expand`).
pub(crate) fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let mut chars = after.chars();
        match chars.next() {
            None => {
                out.push('$');
                rest = after;
            }
            Some('$') => {
                out.push('$');
                rest = &after[1..];
            }
            Some('(') => match after.find(')') {
                Some(close) => {
                    let name = &after[1..close];
                    match lookup(name) {
                        Some(v) => out.push_str(&v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &after[close + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            Some(c) => {
                out.push('$');
                out.push(c);
                rest = &after[c.len_utf8()..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn lookup_in(env: &[(String, String)]) -> impl Fn(&str) -> Option<String> + '_ {
    move |name| {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

/// Builds the runtime's [`PodSpec`] for `pod` (whose domain form is `info`) on a node with
/// `node` settings. `device_env` holds, per container name, the variables its device
/// allocations set.
pub fn pod_spec(
    pod: &k8s::Pod,
    info: &PodInfo,
    node: &NodeSettings,
    device_env: &BTreeMap<String, Vec<(String, String)>>,
) -> Result<PodSpec, PodSpecError> {
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_string());
    let name = pod.metadata.name.clone().unwrap_or_default();
    let err = |field: String, reason: String| PodSpecError {
        pod: format!("{namespace}/{name}"),
        field,
        reason,
    };
    let spec = pod
        .spec
        .as_ref()
        .ok_or_else(|| err("spec".into(), "missing".into()))?;
    let cgroup =
        CgroupPath::for_pod(info).map_err(|e| err("metadata.uid".into(), e.to_string()))?;
    let restart_policy = match spec.restart_policy.as_deref() {
        None | Some("Always") => RestartPolicy::Always,
        Some("OnFailure") => RestartPolicy::OnFailure,
        Some("Never") => RestartPolicy::Never,
        Some(other) => {
            return Err(err(
                "spec.restartPolicy".into(),
                format!("{other:?} is not Always, OnFailure or Never"),
            ))
        }
    };
    let mut containers = Vec::new();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| (format!("spec.initContainers[{i}]"), c, true));
    let app = spec
        .containers
        .iter()
        .enumerate()
        .map(|(i, c)| (format!("spec.containers[{i}]"), c, false));
    for (at, c, is_init) in init.chain(app) {
        if is_init && c.restart_policy.as_deref() == Some("Always") {
            return Err(err(
                format!("{at}.restartPolicy"),
                "sidecar containers (restartPolicy: Always) are not supported by the agent's runtimes yet".into(),
            ));
        }
        let model = if is_init {
            &info.init_containers
        } else {
            &info.containers
        };
        let ci = model
            .iter()
            .find(|x| x.name == c.name)
            .ok_or_else(|| err(format!("{at}.name"), "not in the pod model".into()))?;
        if c.env_from.as_ref().is_some_and(|e| !e.is_empty()) {
            return Err(err(
                format!("{at}.envFrom"),
                "needs the API server (ConfigMaps/Secrets), which this node does not have".into(),
            ));
        }
        let mut env: Vec<(String, String)> = device_env.get(&c.name).cloned().unwrap_or_default();
        for (j, var) in c.env.iter().flatten().enumerate() {
            let field = format!("{at}.env[{j}]");
            let value = match (&var.value, &var.value_from) {
                (_, Some(from)) => {
                    let path = from.field_ref.as_ref().map(|f| f.field_path.as_str());
                    match path {
                        Some("metadata.name") => name.clone(),
                        Some("metadata.namespace") => namespace.clone(),
                        Some("metadata.uid") => info.uid.clone(),
                        Some("spec.serviceAccountName") => {
                            spec.service_account_name.clone().unwrap_or_default()
                        }
                        Some(other) => {
                            return Err(err(
                                format!("{field}.valueFrom.fieldRef.fieldPath"),
                                format!("{other:?} is not available to the agent"),
                            ))
                        }
                        None => {
                            return Err(err(
                                format!("{field}.valueFrom"),
                                "only fieldRef can be resolved without the API server".into(),
                            ))
                        }
                    }
                }
                (Some(v), None) => expand(v, lookup_in(&env)),
                (None, None) => String::new(),
            };
            env.push((var.name.clone(), value));
        }
        let (command, args) = {
            let lookup = lookup_in(&env);
            let expand_all = |list: &Option<Vec<String>>| -> Vec<String> {
                list.iter().flatten().map(|s| expand(s, &lookup)).collect()
            };
            (expand_all(&c.command), expand_all(&c.args))
        };
        let adj = oom_score_adj(info, ci, node.memory_capacity).ok_or_else(|| {
            err(
                format!("{at}.resources"),
                "a burstable container's oom_score_adj needs the node's memory capacity".into(),
            )
        })?;
        containers.push(ContainerSpec {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            command,
            args,
            env,
            resources: Resources::from(&container_config(node, info, ci)),
            oom_score_adj: i32::try_from(adj).unwrap_or(1000),
            init: is_init,
            ..Default::default()
        });
    }
    Ok(PodSpec {
        uid: info.uid.clone(),
        namespace,
        name,
        cgroup,
        restart_policy,
        containers,
        document: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::cgroups::{CgroupVersion, DEFAULT_QUOTA_PERIOD_US};
    use serde_json::json;

    #[test]
    fn expansion_follows_the_kubelet() {
        let env = vec![
            ("A".to_string(), "x".to_string()),
            ("B".to_string(), "y".to_string()),
        ];
        let f = lookup_in(&env);
        assert_eq!(expand("$(A)-$(B)", &f), "x-y");
        assert_eq!(expand("$$(A)", &f), "$(A)");
        assert_eq!(expand("$(C) stays", &f), "$(C) stays");
        assert_eq!(expand("open $(A", &f), "open $(A");
        assert_eq!(expand("cost $5 and $", &f), "cost $5 and $");
        assert_eq!(expand("é$(A)é", &f), "éxé");
    }

    fn node() -> NodeSettings {
        NodeSettings {
            version: CgroupVersion::V1,
            allocatable_cpu: None,
            allocatable_memory: None,
            qos_reserved_memory_percent: None,
            enforce_cpu_limits: true,
            cpu_period_us: DEFAULT_QUOTA_PERIOD_US,
            memory_capacity: Some(8 << 30),
            single_process_oom_kill: None,
            memory_qos: false,
            memory_throttling_factor: Default::default(),
            swap_behavior: Default::default(),
            swap_capacity: 0,
            swap_controller: false,
        }
    }

    fn build(pod: serde_json::Value) -> Result<PodSpec, PodSpecError> {
        let info = PodInfo::from_json(pod.clone()).unwrap();
        let k: k8s::Pod = serde_json::from_value(pod).unwrap();
        let devices = [(
            "app".to_string(),
            vec![("GPU".to_string(), "0".to_string())],
        )]
        .into_iter()
        .collect();
        pod_spec(&k, &info, &node(), &devices)
    }

    #[test]
    fn a_guaranteed_pod_becomes_a_runtime_spec() {
        let spec = build(json!({
            "metadata": {"name": "web", "namespace": "prod", "uid": "u-9"},
            "spec": {"restartPolicy": "OnFailure", "containers": [{
                "name": "app", "image": "busybox",
                "command": ["sh", "-c"], "args": ["echo $(GREETING) on $(GPU) in $(NS)"],
                "env": [
                    {"name": "WHO", "value": "world"},
                    {"name": "GREETING", "value": "hello $(WHO)"},
                    {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
                ],
                "resources": {"limits": {"cpu": "500m", "memory": "128Mi"},
                              "requests": {"cpu": "500m", "memory": "128Mi"}}
            }]}
        }))
        .unwrap();
        assert_eq!(spec.cgroup.to_string(), "/kubepods/podu-9");
        assert_eq!(spec.restart_policy, RestartPolicy::OnFailure);
        let c = &spec.containers[0];
        assert_eq!(c.args, ["echo hello world on 0 in prod"]);
        assert_eq!(c.env[0], ("GPU".to_string(), "0".to_string()));
        assert_eq!(c.oom_score_adj, -997);
        assert_eq!(c.resources.cpu_shares, Some(512));
        assert_eq!(c.resources.cpu_quota_us, Some(50_000));
        assert_eq!(c.resources.memory_limit_bytes, Some(128 << 20));
    }

    #[test]
    fn init_containers_come_first_flagged_and_sidecars_are_refused() {
        let pod = |init_policy: serde_json::Value| {
            json!({
                "metadata": {"name": "web", "uid": "u-3"},
                "spec": {
                    "initContainers": [
                        {"name": "one", "command": ["true"]},
                        {"name": "app-init", "command": ["true"], "restartPolicy": init_policy}
                    ],
                    "containers": [{"name": "app", "command": ["sleep", "1"]}]
                }
            })
        };
        let spec = build(pod(serde_json::Value::Null)).unwrap();
        let order: Vec<(&str, bool)> = spec
            .containers
            .iter()
            .map(|c| (c.name.as_str(), c.init))
            .collect();
        assert_eq!(order, [("one", true), ("app-init", true), ("app", false)]);
        assert_eq!(spec.init_count(), 2);
        let err = build(pod(json!("Always"))).unwrap_err().to_string();
        assert!(
            err.starts_with("pod default/web: spec.initContainers[1].restartPolicy: sidecar"),
            "{err}"
        );
    }

    #[test]
    fn what_needs_an_api_server_is_refused_with_the_field() {
        let err = build(json!({
            "metadata": {"name": "web", "uid": "u-1"},
            "spec": {"containers": [{"name": "app", "env": [
                {"name": "P", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
            ]}]}
        }))
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("pod default/web: spec.containers[0].env[0].valueFrom"),
            "{err}"
        );
        let err = build(json!({
            "metadata": {"name": "web", "uid": "u-1"},
            "spec": {"restartPolicy": "Sometimes", "containers": [{"name": "app"}]}
        }))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("spec.restartPolicy") && err.contains("Sometimes"),
            "{err}"
        );
    }
}
