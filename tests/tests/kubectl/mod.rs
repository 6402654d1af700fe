//! Pods as `kubectl get pods -o json` prints them (status, timestamps, managed fields and
//! all), so the plan tests feed the binary what an operator would.

use serde_json::{json, Value};

/// A container with the given requests and limits (JSON objects, possibly empty).
pub fn container(name: &str, requests: Value, limits: Value) -> Value {
    json!({
        "name": name,
        "image": format!("registry.example/{name}:1.0"),
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"containerPort": 8080, "protocol": "TCP"}],
        "resources": {"requests": requests, "limits": limits},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "volumeMounts": [{"mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                          "name": "kube-api-access", "readOnly": true}]
    })
}

/// A running pod in `namespace` with the given containers, priority and QoS class as the API
/// server would report them.
pub fn pod(
    namespace: &str,
    name: &str,
    uid: &str,
    priority: Option<i64>,
    priority_class: Option<&str>,
    containers: Vec<Value>,
    qos: &str,
) -> Value {
    let statuses: Vec<Value> = containers
        .iter()
        .map(|c| {
            json!({
                "name": c["name"], "ready": true, "restartCount": 0, "started": true,
                "image": c["image"], "imageID": "registry.example/x@sha256:0123",
                "containerID": "containerd://abcdef",
                "state": {"running": {"startedAt": "2026-11-22T09:00:05Z"}}
            })
        })
        .collect();
    let mut spec = json!({
        "containers": containers,
        "dnsPolicy": "ClusterFirst",
        "enableServiceLinks": true,
        "nodeName": "node-1",
        "preemptionPolicy": "PreemptLowerPriority",
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
        "securityContext": {},
        "serviceAccountName": "default",
        "terminationGracePeriodSeconds": 30,
        "tolerations": [
            {"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists", "tolerationSeconds": 300}
        ],
        "volumes": [{"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}]
    });
    if let Some(p) = priority {
        spec["priority"] = json!(p);
    }
    if let Some(c) = priority_class {
        spec["priorityClassName"] = json!(c);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": "123456",
            "creationTimestamp": "2026-11-22T09:00:00Z",
            "labels": {"app": name},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{name}-rs"),
                                 "uid": "0000-rs", "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [{"apiVersion": "v1", "fieldsType": "FieldsV1", "manager": "kube-controller-manager",
                               "operation": "Update", "time": "2026-11-22T09:00:00Z", "fieldsV1": {"f:metadata": {}}}]
        },
        "spec": spec,
        "status": {
            "phase": "Running",
            "qosClass": qos,
            "hostIP": "10.0.0.1",
            "podIP": "10.244.0.5",
            "startTime": "2026-11-22T09:00:01Z",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-22T09:00:06Z"}],
            "containerStatuses": statuses
        }
    })
}
