//! The pod as the decision rules see it, built once from a Kubernetes `v1.Pod`.
//!
//! A `v1.Pod` is a deep tree of optional fields with quantities as strings; every rule (QoS,
//! effective requests, criticality, preemptability) would otherwise re-walk and re-parse it.
//! [`PodInfo`] is that work done once at the edge, with exact quantities, so ranking and
//! preemption over thousands of pods touch only plain fields. Where the kubelet reads a field
//! in a particular way (a missing priority is not zero, a sidecar's requests add up, pod-level
//! resources replace the containers' sum) the rule is applied here, once.

use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

use super::qos::{self, QosClass};
use super::quantity::Quantity;
use super::resources::{ResourceList, CPU, HUGEPAGES_PREFIX, MEMORY};

/// Priority at and above which a pod is critical (`scheduling.SystemCriticalPriority`).
pub(crate) const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// The priority class whose critical pods get the kubelet's lowest `oom_score_adj`.
pub(crate) const SYSTEM_NODE_CRITICAL: &str = "system-node-critical";
/// Annotation naming where the kubelet got the pod from (`"api"`, `"file"`, `"http"`).
pub(crate) const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// Annotation present on the API server's copy (mirror) of a static pod.
pub(crate) const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Marks a deserialization error whose text starts with a path relative to the value being
/// deserialized (`"<mark>spec.containers[0].name: ..."`), so the input reader can join it to
/// the outer path and name the field exactly (`pods[2].spec.containers[0].name: ...`).
pub(crate) const RELATIVE_PATH_MARK: char = '\u{1e}';

/// One container's name, kind and resources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerInfo {
    /// `name`.
    pub name: String,
    /// An init container with `restartPolicy: Always`: it keeps running beside the app
    /// containers, so its requests add to the pod's instead of being maxed against them.
    pub sidecar: bool,
    /// `resources.requests`.
    pub requests: ResourceList,
    /// `resources.limits`.
    pub limits: ResourceList,
}

/// A pod reduced to what the kubelet's eviction, preemption and cgroup rules read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    /// `namespace/name`, the name every output uses.
    pub name: String,
    /// `metadata.uid` (empty when absent); stats join on it, cgroups are named by it.
    pub uid: String,
    /// `spec.priority`. `None` is not zero: `Preemptable` treats a missing priority as
    /// "cannot compare", while eviction ranking reads it as 0 ([`PodInfo::priority_or_zero`]).
    pub priority: Option<i32>,
    /// `spec.priorityClassName`.
    pub priority_class_name: Option<String>,
    /// A static pod: `kubernetes.io/config.source` is present and not `"api"`.
    pub is_static: bool,
    /// A mirror pod: `kubernetes.io/config.mirror` is present.
    pub is_mirror: bool,
    /// The QoS class, computed from the spec as `ComputePodQOS` does (init containers
    /// included; pod-level resources decide alone when set).
    pub qos: QosClass,
    /// Effective pod requests as `PodRequests` computes them: app containers and sidecars
    /// summed, maxed against each init container (plus the sidecars started before it),
    /// supported pod-level requests replacing that, plus `spec.overhead`.
    pub requests: ResourceList,
    /// Effective pod limits as `PodLimits` computes them: the same aggregation over limits,
    /// pod-level limits replacing it, overhead added only to limits that are set and non-zero.
    pub limits: ResourceList,
    /// Requests as eviction ranking and preemption read them (`GetResourceRequestQuantity`):
    /// pod-level requests alone when pod-level resources are set, else the container
    /// aggregate; overhead added only to a resource whose request is non-zero.
    pub ranking_requests: ResourceList,
    /// `spec.containers`, in order.
    pub containers: Vec<ContainerInfo>,
    /// `spec.initContainers`, in order (sidecars flagged).
    pub init_containers: Vec<ContainerInfo>,
    /// `spec.overhead`.
    pub overhead: ResourceList,
    /// `spec.resources.requests` when pod-level resources are set.
    pub pod_level_requests: Option<ResourceList>,
    /// `spec.resources.limits` when pod-level resources are set.
    pub pod_level_limits: Option<ResourceList>,
    /// Volumes whose usage the eviction manager charges to the pod's disk when ranking
    /// (`localVolumeNames`: hostPath, an emptyDir not backed by memory, configMap, gitRepo).
    pub local_volumes: Vec<String>,
    /// Volumes counted against the pod's ephemeral-storage limit (`IsLocalEphemeralVolume`:
    /// gitRepo, an emptyDir on the default medium, configMap, downwardAPI).
    pub ephemeral_volumes: Vec<String>,
}

/// Why a pod could not be read; `path` is relative to the pod object. Printed with control
/// characters escaped: the path holds the document's own map keys, and a key with a line
/// break would split the one-line error (found by the `pod` fuzz target).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{}: {}",
    crate::decide::printable(path),
    crate::decide::printable(message)
)]
pub struct PodError {
    /// Where in the pod (`spec.containers[0].resources.requests.memory`).
    pub path: String,
    /// What is wrong there.
    pub message: String,
}

impl PodError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        PodError {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl PodInfo {
    /// Whether the pod is critical (`kubetypes.IsCriticalPod`): static, mirror, or a priority
    /// of at least [`SYSTEM_CRITICAL_PRIORITY`].
    pub(crate) fn is_critical(&self) -> bool {
        self.is_static
            || self.is_mirror
            || self.priority.is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
    }

    /// Whether the pod is critical and in the `system-node-critical` class
    /// (`kubetypes.IsNodeCriticalPod`), which earns the lowest `oom_score_adj`.
    pub(crate) fn is_node_critical(&self) -> bool {
        self.is_critical() && self.priority_class_name.as_deref() == Some(SYSTEM_NODE_CRITICAL)
    }

    /// The priority as eviction ranking reads it (`GetPodPriority`): 0 when unset.
    pub(crate) fn priority_or_zero(&self) -> i32 {
        self.priority.unwrap_or(0)
    }

    /// The request for `resource` as eviction ranking compares it
    /// (`GetResourceRequestQuantity`), zero when the pod requests none.
    pub(crate) fn ranking_request(&self, resource: &str) -> Quantity {
        self.ranking_requests.get_or_zero(resource)
    }

    /// The request as an integer the way preemption counts it (`GetResourceRequest`):
    /// millicores for cpu, 1 for `pods`, whole units (rounded up) for anything else.
    pub(crate) fn request_units(&self, resource: &str) -> i64 {
        if resource == super::resources::PODS {
            return 1;
        }
        let nanos = self.ranking_request(resource).nanos();
        let per_unit = if resource == CPU {
            1_000_000
        } else {
            1_000_000_000
        };
        clamp_i64(ceil_div_nanos(nanos, per_unit))
    }

    /// Builds the domain pod from its JSON form, accepting quantities written as plain JSON
    /// numbers as well as strings; errors name the field relative to the pod.
    pub fn from_json(value: Value) -> Result<PodInfo, PodError> {
        let mut value = value;
        normalize_quantities(&mut value);
        fill_required(&mut value);
        let pod: k8s::Pod = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            PodError::new(path, e.into_inner().to_string())
        })?;
        build(&pod)
    }
}

/// `nanos / per_unit` rounded up (as `Quantity.Value`/`MilliValue` round), on 64-bit
/// arithmetic whenever the value fits: preemption reads thousands of requests per decision
/// and 128-bit division is several times slower.
fn ceil_div_nanos(nanos: i128, per_unit: i64) -> i128 {
    if let Ok(n) = i64::try_from(nanos) {
        let q = n / per_unit;
        let up = n % per_unit != 0 && n > 0;
        return (q + i64::from(up)) as i128;
    }
    let d = per_unit as i128;
    let q = nanos / d;
    if nanos % d != 0 && nanos > 0 {
        q + 1
    } else {
        q
    }
}

/// Go's `int64` view of an exact value, saturating instead of wrapping.
pub(crate) fn clamp_i64(v: i128) -> i64 {
    v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// `Preemptable(preemptor, preemptee)`: a critical pod may preempt any pod that is not
/// critical; otherwise only a strictly higher priority may preempt, and only when both pods
/// have a priority (a missing one never compares).
pub(crate) fn preemptable(preemptor: &PodInfo, preemptee: &PodInfo) -> bool {
    if preemptor.is_critical() && !preemptee.is_critical() {
        return true;
    }
    match (preemptor.priority, preemptee.priority) {
        (Some(a), Some(b)) => a > b,
        _ => false,
    }
}

impl<'de> Deserialize<'de> for PodInfo {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        if !value.is_object() {
            return Err(serde::de::Error::custom(
                "expected a Pod object (with metadata and spec)",
            ));
        }
        PodInfo::from_json(value).map_err(|e| {
            if e.path.is_empty() || e.path == "." {
                serde::de::Error::custom(e.message)
            } else {
                serde::de::Error::custom(format!("{RELATIVE_PATH_MARK}{e}"))
            }
        })
    }
}

/// Keys whose object values are resource lists (name → quantity) in the Pod schema.
const QUANTITY_MAP_KEYS: &[&str] = &[
    "requests",
    "limits",
    "overhead",
    "allocatedResources",
    "capacity",
    "allocatable",
];
/// Keys whose values are single quantities in the Pod schema.
const QUANTITY_KEYS: &[&str] = &["sizeLimit"];

/// Rewrites quantities written as JSON numbers into strings, the only form the typed API
/// accepts, without touching other numbers (priority, ports, ...).
fn normalize_quantities(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if QUANTITY_MAP_KEYS.contains(&key.as_str()) {
                    if let Value::Object(inner) = v {
                        for q in inner.values_mut() {
                            number_to_string(q);
                        }
                        continue;
                    }
                } else if QUANTITY_KEYS.contains(&key.as_str()) {
                    number_to_string(v);
                    continue;
                }
                normalize_quantities(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize_quantities),
        _ => {}
    }
}

fn number_to_string(v: &mut Value) {
    if let Value::Number(n) = v {
        *v = Value::String(n.to_string());
    }
}

/// A pod with no containers is valid input: supply the empty list the typed schema requires.
fn fill_required(value: &mut Value) {
    if let Some(spec) = value.get_mut("spec").and_then(Value::as_object_mut) {
        spec.entry("containers")
            .or_insert_with(|| Value::Array(Vec::new()));
    }
}

fn parse_list(
    list: Option<&BTreeMap<String, K8sQuantity>>,
    path: &str,
) -> Result<ResourceList, PodError> {
    let mut out = ResourceList::new();
    let Some(list) = list else {
        return Ok(out);
    };
    for (name, q) in list {
        let parsed = Quantity::parse(&q.0)
            .map_err(|e| PodError::new(format!("{path}.{name}"), e.to_string()))?;
        if parsed.is_negative() {
            return Err(PodError::new(
                format!("{path}.{name}"),
                format!("quantity {:?} must not be negative", q.0),
            ));
        }
        out.set(name, parsed);
    }
    Ok(out)
}

fn container(c: &k8s::Container, path: &str, init: bool) -> Result<ContainerInfo, PodError> {
    let resources = c.resources.as_ref();
    Ok(ContainerInfo {
        name: c.name.clone(),
        sidecar: init && c.restart_policy.as_deref() == Some("Always"),
        requests: parse_list(
            resources.and_then(|r| r.requests.as_ref()),
            &format!("{path}.resources.requests"),
        )?,
        limits: parse_list(
            resources.and_then(|r| r.limits.as_ref()),
            &format!("{path}.resources.limits"),
        )?,
    })
}

/// Whether a resource may be set at pod level (`IsSupportedPodLevelResource`).
fn pod_level_supported(name: &str) -> bool {
    name == CPU || name == MEMORY || name.starts_with(HUGEPAGES_PREFIX)
}

fn any_pod_level_supported(list: &ResourceList) -> bool {
    list.iter().any(|(n, _)| pod_level_supported(n))
}

/// The container aggregate of one side (requests or limits), sidecar-aware: app containers
/// and sidecars sum; each regular init container runs with the sidecars started before it,
/// and the pod needs the largest of those moments.
fn aggregate<F: Fn(&ContainerInfo) -> &ResourceList>(
    containers: &[ContainerInfo],
    init_containers: &[ContainerInfo],
    side: F,
) -> ResourceList {
    let mut total = ResourceList::new();
    for c in containers {
        total.add_all(side(c));
    }
    let mut sidecars = ResourceList::new();
    let mut init_peak = ResourceList::new();
    for c in init_containers {
        if c.sidecar {
            total.add_all(side(c));
            sidecars.add_all(side(c));
            init_peak.max_all(&sidecars);
        } else {
            let mut moment = side(c).clone();
            moment.add_all(&sidecars);
            init_peak.max_all(&moment);
        }
    }
    total.max_all(&init_peak);
    total
}

fn apply_pod_level(target: &mut ResourceList, pod_level: &ResourceList) {
    for (name, q) in pod_level.iter() {
        if pod_level_supported(name) {
            target.set(name, q);
        }
    }
}

fn volumes(spec: Option<&k8s::PodSpec>) -> (Vec<String>, Vec<String>) {
    let mut local = Vec::new();
    let mut ephemeral = Vec::new();
    for v in spec.and_then(|s| s.volumes.as_deref()).unwrap_or_default() {
        let medium = v
            .empty_dir
            .as_ref()
            .map(|e| e.medium.as_deref().unwrap_or(""));
        let disk_empty_dir = medium.is_some_and(|m| m != "Memory");
        if v.host_path.is_some() || disk_empty_dir || v.config_map.is_some() || v.git_repo.is_some()
        {
            local.push(v.name.clone());
        }
        if v.git_repo.is_some()
            || medium == Some("")
            || v.config_map.is_some()
            || v.downward_api.is_some()
        {
            ephemeral.push(v.name.clone());
        }
    }
    (local, ephemeral)
}

fn build(pod: &k8s::Pod) -> Result<PodInfo, PodError> {
    let meta = &pod.metadata;
    let name = meta
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| PodError::new("metadata.name", "missing: every pod needs a name"))?;
    let namespace = meta
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or("default");
    let annotations = meta.annotations.as_ref();
    let is_static = annotations
        .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION))
        .is_some_and(|s| s != "api");
    let is_mirror = annotations.is_some_and(|a| a.contains_key(CONFIG_MIRROR_ANNOTATION));

    let spec = pod.spec.as_ref();
    let mut containers = Vec::new();
    for (i, c) in spec
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        containers.push(container(c, &format!("spec.containers[{i}]"), false)?);
    }
    let mut init_containers = Vec::new();
    for (i, c) in spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        init_containers.push(container(c, &format!("spec.initContainers[{i}]"), true)?);
    }
    let overhead = parse_list(spec.and_then(|s| s.overhead.as_ref()), "spec.overhead")?;
    let pod_resources = spec.and_then(|s| s.resources.as_ref());
    let pod_requests = parse_list(
        pod_resources.and_then(|r| r.requests.as_ref()),
        "spec.resources.requests",
    )?;
    let pod_limits = parse_list(
        pod_resources.and_then(|r| r.limits.as_ref()),
        "spec.resources.limits",
    )?;
    // IsPodLevelResourcesSet / IsPodLevelRequestsSet / IsPodLevelLimitsSet.
    let pod_level_requests_set = any_pod_level_supported(&pod_requests);
    let pod_level_set = pod_level_requests_set || any_pod_level_supported(&pod_limits);

    // PodRequests.
    let container_requests = aggregate(&containers, &init_containers, |c| &c.requests);
    let mut requests = container_requests.clone();
    if pod_level_requests_set {
        apply_pod_level(&mut requests, &pod_requests);
    }
    requests.add_all(&overhead);

    // PodLimits.
    let mut limits = aggregate(&containers, &init_containers, |c| &c.limits);
    if pod_level_set {
        apply_pod_level(&mut limits, &pod_limits);
    }
    for (name, q) in overhead.iter() {
        if limits.get(name).is_some_and(|l| l.nanos() != 0) {
            limits.add(name, q);
        }
    }

    // GetResourceRequestQuantity: pod-level requests replace the container aggregate
    // entirely when pod-level resources are set; overhead only on non-zero requests.
    let mut ranking_requests = if pod_level_set {
        let mut r = ResourceList::new();
        if pod_level_requests_set {
            apply_pod_level(&mut r, &pod_requests);
        }
        r
    } else {
        container_requests
    };
    for (name, q) in overhead.iter() {
        if ranking_requests.get(name).is_some_and(|r| r.nanos() != 0) {
            ranking_requests.add(name, q);
        }
    }

    // ComputePodQOS from the spec. The API server's `status.qosClass` is the same value for
    // any real pod (the class is fixed at creation and a resize may not change it), and the
    // plan inputs are specified by their spec fields, so the status is not read.
    // Like ComputePodQOS, the mere presence of `spec.resources` makes it decide.
    let qos = if pod_resources.is_some() {
        qos::resources_qos(&pod_requests, &pod_limits)
    } else {
        qos::combine(
            init_containers
                .iter()
                .chain(containers.iter())
                .map(|c| qos::resources_qos(&c.requests, &c.limits)),
        )
    };

    let (local_volumes, ephemeral_volumes) = volumes(spec);
    Ok(PodInfo {
        name: format!("{namespace}/{name}"),
        uid: meta.uid.clone().unwrap_or_default(),
        priority: spec.and_then(|s| s.priority),
        priority_class_name: spec.and_then(|s| s.priority_class_name.clone()),
        is_static,
        is_mirror,
        qos,
        requests,
        limits,
        ranking_requests,
        containers,
        init_containers,
        overhead,
        pod_level_requests: pod_level_set.then_some(pod_requests),
        pod_level_limits: pod_level_set.then_some(pod_limits),
        local_volumes,
        ephemeral_volumes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    fn pod(v: Value) -> PodInfo {
        PodInfo::from_json(v).unwrap()
    }

    fn c(name: &str, req: Value, lim: Value) -> Value {
        json!({"name": name, "resources": {"requests": req, "limits": lim}})
    }

    #[test]
    fn name_namespace_uid_and_defaults() {
        let p = pod(json!({"metadata": {"name": "a", "uid": "u1"}, "spec": {"containers": []}}));
        assert_eq!(p.name, "default/a");
        assert_eq!(p.uid, "u1");
        assert_eq!(p.priority, None);
        assert_eq!(p.qos, QosClass::BestEffort);
        assert!(!p.is_critical());
        let p = pod(json!({"metadata": {"name": "a", "namespace": "kube-system"}}));
        assert_eq!(p.name, "kube-system/a");
        assert!(p.containers.is_empty());
    }

    #[test]
    fn a_key_with_line_breaks_is_named_on_one_line() {
        // Found by the `pod` fuzz target: a resource name holding line breaks was printed
        // raw in the error's path.
        let e = PodInfo::from_json(json!({"metadata": {"name": "a"}, "spec": {"containers": [
            {"name": "c", "resources": {"limits": {"(requests\n\n\n\n\nna": null}}}]}}))
        .unwrap_err()
        .to_string();
        assert!(!e.contains(['\n', '\r']), "{e:?}");
        assert!(
            e.starts_with("spec.containers[0].resources.limits.(requests\\n"),
            "{e}"
        );
    }

    #[test]
    fn missing_name_is_an_error() {
        let e = PodInfo::from_json(json!({"metadata": {}, "spec": {}})).unwrap_err();
        assert_eq!(e.path, "metadata.name");
    }

    #[test]
    fn static_mirror_and_priority_make_critical() {
        let stat = pod(json!({"metadata": {"name": "s",
            "annotations": {"kubernetes.io/config.source": "file"}}}));
        assert!(stat.is_static && stat.is_critical());
        let api = pod(json!({"metadata": {"name": "s",
            "annotations": {"kubernetes.io/config.source": "api"}}}));
        assert!(!api.is_static && !api.is_critical());
        let mirror = pod(json!({"metadata": {"name": "m",
            "annotations": {"kubernetes.io/config.mirror": "abc"}}}));
        assert!(mirror.is_mirror && mirror.is_critical());
        let high = pod(json!({"metadata": {"name": "h"}, "spec": {"priority": 2000000000}}));
        assert!(high.is_critical());
        let below = pod(json!({"metadata": {"name": "h"}, "spec": {"priority": 1999999999}}));
        assert!(!below.is_critical());
    }

    #[test]
    fn node_critical_needs_critical_and_the_class() {
        let p = pod(
            json!({"metadata": {"name": "n"}, "spec": {"priority": 2000001000,
            "priorityClassName": "system-node-critical"}}),
        );
        assert!(p.is_node_critical());
        // The class name alone does not make a pod critical.
        let p = pod(json!({"metadata": {"name": "n"}, "spec": {
            "priorityClassName": "system-node-critical"}}));
        assert!(!p.is_node_critical());
    }

    #[test]
    fn preemptable_follows_the_kubelet() {
        let crit = pod(json!({"metadata": {"name": "c"}, "spec": {"priority": 2000000000}}));
        let node_crit = pod(json!({"metadata": {"name": "c"}, "spec": {"priority": 2000001000}}));
        let stat = pod(json!({"metadata": {"name": "s",
            "annotations": {"kubernetes.io/config.source": "file"}}}));
        let none = pod(json!({"metadata": {"name": "n"}}));
        let zero = pod(json!({"metadata": {"name": "z"}, "spec": {"priority": 0}}));
        let ten = pod(json!({"metadata": {"name": "t"}, "spec": {"priority": 10}}));
        // Critical over non-critical, priorities or not.
        assert!(preemptable(&crit, &none));
        assert!(preemptable(&stat, &ten));
        // Critical over critical: only by strictly higher priority, both set.
        assert!(!preemptable(&crit, &crit));
        assert!(preemptable(&node_crit, &crit));
        assert!(!preemptable(&node_crit, &stat));
        assert!(!preemptable(&stat, &crit));
        // Non-critical: only strictly higher, and a missing priority never compares.
        assert!(preemptable(&ten, &zero));
        assert!(!preemptable(&zero, &ten));
        assert!(!preemptable(&ten, &none));
        assert!(!preemptable(&none, &zero));
        assert!(!preemptable(&ten, &ten));
    }

    #[test]
    fn qos_from_containers_including_init() {
        let g = json!({"cpu": "1", "memory": "1Gi"});
        let p = pod(
            json!({"metadata": {"name": "g"}, "spec": {"containers": [c("a", g.clone(), g.clone())]}}),
        );
        assert_eq!(p.qos, QosClass::Guaranteed);
        // A best-effort init container makes a guaranteed app container's pod burstable.
        let p = pod(json!({"metadata": {"name": "g"}, "spec": {
            "containers": [c("a", g.clone(), g.clone())],
            "initContainers": [{"name": "i"}]}}));
        assert_eq!(p.qos, QosClass::Burstable);
        let p = pod(json!({"metadata": {"name": "b"}, "spec": {"containers": [
            c("a", json!({"cpu": "1"}), json!({}))]}}));
        assert_eq!(p.qos, QosClass::Burstable);
    }

    #[test]
    fn qos_from_pod_level_resources_overrides_containers() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
            "containers": [{"name": "a"}]}}));
        assert_eq!(p.qos, QosClass::Guaranteed);
        assert_eq!(p.requests.cpu(), Some(q("1")));
    }

    #[test]
    fn an_empty_pod_level_block_still_decides_qos() {
        let g = json!({"cpu": "1", "memory": "1Gi"});
        let p = pod(json!({"metadata": {"name": "e"}, "spec": {"resources": {},
            "containers": [c("a", g.clone(), g)]}}));
        assert_eq!(p.qos, QosClass::BestEffort);
        // But it sets no pod-level requests or limits.
        assert!(p.pod_level_requests.is_none());
        assert_eq!(p.requests.cpu(), Some(q("1")));
    }

    #[test]
    fn qos_comes_from_the_spec_not_the_status() {
        let p = pod(
            json!({"metadata": {"name": "s"}, "spec": {"containers": [{"name": "a"}]},
            "status": {"qosClass": "Burstable"}}),
        );
        assert_eq!(p.qos, QosClass::BestEffort);
    }

    #[test]
    fn requests_sum_app_containers_and_max_init() {
        let p = pod(json!({"metadata": {"name": "r"}, "spec": {
            "containers": [c("a", json!({"cpu": "100m", "memory": "100Mi"}), json!({})),
                           c("b", json!({"cpu": "200m"}), json!({}))],
            "initContainers": [c("i", json!({"cpu": "250m", "memory": "50Mi"}), json!({}))]}}));
        assert_eq!(p.requests.cpu(), Some(q("300m")));
        assert_eq!(p.requests.memory(), Some(q("100Mi")));
        let p = pod(json!({"metadata": {"name": "r"}, "spec": {
            "containers": [c("a", json!({"cpu": "100m"}), json!({}))],
            "initContainers": [c("i", json!({"cpu": "500m"}), json!({}))]}}));
        assert_eq!(p.requests.cpu(), Some(q("500m")));
    }

    #[test]
    fn sidecars_add_and_count_before_later_init_containers() {
        // sidecar s (200m) then init i (500m) then app a (100m):
        // running: a + s = 300m; init moment: i + s = 700m → 700m.
        let p = pod(json!({"metadata": {"name": "r"}, "spec": {
            "containers": [c("a", json!({"cpu": "100m"}), json!({}))],
            "initContainers": [
                {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "200m"}}},
                c("i", json!({"cpu": "500m"}), json!({}))]}}));
        assert!(p.init_containers[0].sidecar && !p.init_containers[1].sidecar);
        assert_eq!(p.requests.cpu(), Some(q("700m")));
        // Init before the sidecar does not see it: max(500m, 300m) = 500m.
        let p = pod(json!({"metadata": {"name": "r"}, "spec": {
            "containers": [c("a", json!({"cpu": "100m"}), json!({}))],
            "initContainers": [
                c("i", json!({"cpu": "500m"}), json!({})),
                {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "200m"}}}]}}));
        assert_eq!(p.requests.cpu(), Some(q("500m")));
    }

    #[test]
    fn overhead_adds_to_requests_and_only_to_set_limits() {
        let p = pod(json!({"metadata": {"name": "o"}, "spec": {
            "overhead": {"cpu": "250m", "memory": "120Mi"},
            "containers": [c("a", json!({"cpu": "1"}), json!({"cpu": "2"}))]}}));
        assert_eq!(p.requests.cpu(), Some(q("1250m")));
        assert_eq!(p.requests.memory(), Some(q("120Mi")));
        assert_eq!(p.limits.cpu(), Some(q("2250m")));
        assert_eq!(p.limits.memory(), None);
        // Ranking adds overhead only on a non-zero request.
        assert_eq!(p.ranking_request("cpu"), q("1250m"));
        assert_eq!(p.ranking_request("memory"), Quantity::ZERO);
    }

    #[test]
    fn pod_level_requests_replace_container_sum() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {
            "resources": {"requests": {"memory": "2Gi"}},
            "containers": [c("a", json!({"cpu": "1", "memory": "1Gi", "ephemeral-storage": "1Gi"}), json!({}))]}}));
        assert_eq!(p.requests.memory(), Some(q("2Gi")));
        // Unsupported-at-pod-level resources still come from the containers.
        assert_eq!(p.requests.cpu(), Some(q("1")));
        assert_eq!(
            p.requests.get(crate::decide::resources::EPHEMERAL_STORAGE),
            Some(q("1Gi"))
        );
        // Ranking reads pod-level requests alone.
        assert_eq!(p.ranking_request("memory"), q("2Gi"));
        assert_eq!(p.ranking_request("cpu"), Quantity::ZERO);
        assert!(p.pod_level_requests.is_some());
    }

    #[test]
    fn numbers_are_quantities_too() {
        let p = pod(
            json!({"metadata": {"name": "n", "namespace": "x"}, "spec": {"priority": 5,
            "containers": [c("a", json!({"cpu": 2, "memory": 1073741824}), json!({"cpu": 1.5}))]}}),
        );
        assert_eq!(p.priority, Some(5));
        assert_eq!(p.requests.cpu(), Some(q("2")));
        assert_eq!(p.requests.memory(), Some(q("1Gi")));
        assert_eq!(p.limits.cpu(), Some(q("1500m")));
    }

    #[test]
    fn bad_quantity_names_the_field() {
        let e = PodInfo::from_json(json!({"metadata": {"name": "b"}, "spec": {
            "containers": [c("a", json!({"memory": "12Qi"}), json!({}))]}}))
        .unwrap_err();
        assert_eq!(e.path, "spec.containers[0].resources.requests.memory");
        assert!(e.to_string().contains("\"12Qi\""), "{e}");
        let e = PodInfo::from_json(json!({"metadata": {"name": "b"}, "spec": {
            "containers": [c("a", json!({"memory": "-1"}), json!({}))]}}))
        .unwrap_err();
        assert!(e.message.contains("negative"), "{e}");
    }

    #[test]
    fn bad_type_names_the_field() {
        let e =
            PodInfo::from_json(json!({"metadata": {"name": "b"}, "spec": {"priority": "high"}}))
                .unwrap_err();
        assert_eq!(e.path, "spec.priority");
    }

    #[test]
    fn request_units_as_preemption_counts() {
        let p = pod(json!({"metadata": {"name": "u"}, "spec": {
            "containers": [c("a", json!({"cpu": "1500m", "memory": "1.5"}), json!({}))]}}));
        assert_eq!(p.request_units("cpu"), 1500);
        assert_eq!(p.request_units("memory"), 2);
        assert_eq!(p.request_units("pods"), 1);
        assert_eq!(p.request_units("nvidia.com/gpu"), 0);
    }

    #[test]
    fn fast_rounding_matches_quantity_rounding() {
        for text in [
            "1",
            "1500m",
            "1n",
            "-1n",
            "-1500m",
            "0",
            "999999999n",
            "9223372036854775807",
            "1Ei",
            "1e20",
        ] {
            let q = q(text);
            assert_eq!(
                ceil_div_nanos(q.nanos(), 1_000_000),
                q.milli_value(),
                "{text}"
            );
            assert_eq!(
                ceil_div_nanos(q.nanos(), 1_000_000_000),
                q.value(),
                "{text}"
            );
        }
    }

    #[test]
    fn local_volumes_as_the_eviction_manager_counts() {
        let p = pod(json!({"metadata": {"name": "v"}, "spec": {"volumes": [
            {"name": "disk", "emptyDir": {}},
            {"name": "ram", "emptyDir": {"medium": "Memory"}},
            {"name": "huge", "emptyDir": {"medium": "HugePages"}},
            {"name": "cm", "configMap": {"name": "x"}},
            {"name": "git", "gitRepo": {"repository": "r"}},
            {"name": "host", "hostPath": {"path": "/x"}},
            {"name": "dapi", "downwardAPI": {}},
            {"name": "sec", "secret": {"secretName": "s"}},
            {"name": "pvc", "persistentVolumeClaim": {"claimName": "c"}}]}}));
        assert_eq!(p.local_volumes, vec!["disk", "huge", "cm", "git", "host"]);
        assert_eq!(p.ephemeral_volumes, vec!["disk", "cm", "git", "dapi"]);
    }

    #[test]
    fn deserialize_marks_relative_paths() {
        let v = json!({"metadata": {"name": "b"}, "spec": {"containers": [c("a", json!({"cpu": "x"}), json!({}))]}});
        let e = serde_json::from_value::<PodInfo>(v)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(RELATIVE_PATH_MARK), "{e:?}");
        assert!(
            e.contains("spec.containers[0].resources.requests.cpu: "),
            "{e}"
        );
    }
}
