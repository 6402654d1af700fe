//! The kubelet's eviction message and event annotations: what an evicted pod's status says
//! and which containers the event names, in the kubelet's own words and number formats, so
//! that operators and tools reading them find what Kubernetes writes. Which pod goes is
//! [`crate::decide::rank`]'s; this is only what is said about it.

use std::collections::BTreeMap;

use crate::decide::pod::PodInfo;
use crate::decide::quantity::{Quantity, NANO};
use crate::decide::quantity_text::binary_si;
use crate::decide::resources::MEMORY;
use crate::decide::signal::Resource;
use crate::decide::summary::PodStats;

/// The kubelet's eviction message and event annotations for an evicted pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EvictionMessage {
    /// The pod status message (`"The node was low on resource: memory. ..."`).
    pub message: String,
    /// Event annotations (`offending_containers`, `offending_containers_usage`,
    /// `starved_resource`, and `offending_pod`/`offending_pod_usage` with pod-level requests).
    pub annotations: BTreeMap<String, String>,
}

/// Builds the message the kubelet records when it evicts `pod` for `resource`.
///
/// `threshold` is the threshold quantity and the available amount, already printed, when a
/// threshold for the resource was observed. The pod's name is its bare name (the kubelet uses
/// `pod.Name`); container usage is compared with each container's own request.
pub(crate) fn eviction_message(
    resource: Resource,
    pod: &PodInfo,
    stats: Option<&PodStats>,
    threshold: Option<(&str, &str)>,
) -> EvictionMessage {
    let resource_name = resource.name();
    let mut message = format!("The node was low on resource: {resource_name}. ");
    if let Some((quantity, available)) = threshold {
        message.push_str(&format!(
            "Threshold quantity: {quantity}, available: {available}. "
        ));
    }
    let mut annotations = BTreeMap::new();
    let Some(stats) = stats else {
        return EvictionMessage {
            message,
            annotations,
        };
    };
    let bare_name = pod
        .name
        .split_once('/')
        .map_or(pod.name.as_str(), |(_, n)| n);
    if resource == Resource::Memory {
        if let (Some(request), Some(mem)) = (
            pod.pod_level_requests.as_ref().and_then(|r| r.get(MEMORY)),
            stats.memory,
        ) {
            let usage = binary_si(i128::from(mem.working_set_bytes.unwrap_or(0)));
            message.push_str(&format!(
                "Pod {bare_name} was using {usage}, request is {}, has larger consumption of {resource_name}. ",
                request_text(request)
            ));
            annotations.insert("offending_pod".to_string(), bare_name.to_string());
            annotations.insert("offending_pod_usage".to_string(), usage);
        }
    }
    let mut offenders = Vec::new();
    let mut usages = Vec::new();
    for cs in &stats.containers {
        let Some(spec) = pod
            .containers
            .iter()
            .chain(pod.init_containers.iter())
            .find(|c| c.name == cs.name)
        else {
            continue;
        };
        let request = spec.requests.get_or_zero(resource_name);
        let usage: Option<i128> = match resource {
            Resource::EphemeralStorage => match (
                cs.rootfs.and_then(|f| f.used_bytes),
                cs.logs.and_then(|f| f.used_bytes),
            ) {
                (Some(r), Some(l)) => Some(i128::from(r) + i128::from(l)),
                _ => None,
            },
            Resource::Memory => cs.memory.and_then(|m| m.working_set_bytes).map(i128::from),
            Resource::Inodes | Resource::Pids => None,
        };
        if let Some(units) = usage {
            if units.saturating_mul(NANO) > request.nanos() {
                let usage_text = binary_si(units);
                message.push_str(&format!(
                    "Container {} was using {usage_text}, request is {}, has larger consumption of {resource_name}. ",
                    spec.name,
                    request_text(request)
                ));
                offenders.push(spec.name.clone());
                usages.push(usage_text);
            }
        }
    }
    annotations.insert("offending_containers".to_string(), offenders.join(","));
    annotations.insert("offending_containers_usage".to_string(), usages.join(","));
    annotations.insert("starved_resource".to_string(), resource_name.to_string());
    EvictionMessage {
        message,
        annotations,
    }
}

/// A request as the kubelet prints it; the original suffix is not kept, so a whole number
/// prints with binary suffixes when it divides by 1024 but not by 1000, decimal otherwise.
fn request_text(q: Quantity) -> String {
    if q.nanos() % NANO != 0 {
        return q.to_string();
    }
    let units = q.nanos() / NANO;
    if units != 0 && units % 1024 == 0 && units % 1000 != 0 {
        binary_si(units)
    } else {
        crate::decide::quantity_text::decimal_si(units)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::summary::Summary;
    use serde_json::json;

    fn summary(entries: serde_json::Value) -> Summary {
        Summary::from_value(entries, "summary").unwrap()
    }

    #[test]
    fn message_names_containers_over_their_request() {
        let p = PodInfo::from_json(
            json!({"metadata": {"name": "web", "namespace": "shop", "uid": "u"},
            "spec": {"containers": [
                {"name": "x", "resources": {"requests": {"memory": "100Mi"}}},
                {"name": "y", "resources": {"requests": {"memory": "1Gi"}}}]}}),
        )
        .unwrap();
        let s = summary(json!({"pods": [{"podRef": {"uid": "u"},
            "memory": {"workingSetBytes": 300u64 << 20},
            "containers": [
                {"name": "x", "memory": {"workingSetBytes": 200u64 << 20}},
                {"name": "y", "memory": {"workingSetBytes": 100u64 << 20}}]}]}));
        let m = eviction_message(
            Resource::Memory,
            &p,
            Some(&s.pods[0]),
            Some(("100Mi", "50Mi")),
        );
        assert_eq!(
            m.message,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. \
             Container x was using 200Mi, request is 100Mi, has larger consumption of memory. "
        );
        assert_eq!(m.annotations["offending_containers"], "x");
        assert_eq!(m.annotations["offending_containers_usage"], "200Mi");
        assert_eq!(m.annotations["starved_resource"], "memory");
        let none = eviction_message(Resource::Memory, &p, None, None);
        assert_eq!(none.message, "The node was low on resource: memory. ");
        assert!(none.annotations.is_empty());
        let inodes = eviction_message(Resource::Inodes, &p, Some(&s.pods[0]), None);
        assert_eq!(inodes.message, "The node was low on resource: inodes. ");
        assert_eq!(inodes.annotations["offending_containers"], "");
    }

    #[test]
    fn message_for_disk_needs_both_rootfs_and_logs() {
        let p = PodInfo::from_json(json!({"metadata": {"name": "w", "uid": "u"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]}}))
        .unwrap();
        let s = summary(json!({"pods": [{"podRef": {"uid": "u"}, "containers": [
            {"name": "a", "rootfs": {"usedBytes": 1024}, "logs": {"usedBytes": 1024}},
            {"name": "b", "rootfs": {"usedBytes": 4096}}]}]}));
        let m = eviction_message(Resource::EphemeralStorage, &p, Some(&s.pods[0]), None);
        assert_eq!(
            m.message,
            "The node was low on resource: ephemeral-storage. Container a was using 2Ki, request is 0, has larger consumption of ephemeral-storage. "
        );
    }
}
