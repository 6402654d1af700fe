//! A pod document as it arrives (the API's bytes, a static manifest): size limit, JSON or
//! YAML, and the checks that refuse it before anything on the node changes.

use serde_json::Value;

use super::NodeError;
use crate::decide::pod::{PodInfo, CONFIG_SOURCE_ANNOTATION};

/// Documents over this size are refused before they are parsed: a pod is a few kilobytes,
/// and parsing an arbitrarily large document would let one request exhaust the agent.
pub const MAX_DOCUMENT_BYTES: usize = 10 * 1024 * 1024;

/// How the document is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// JSON.
    Json,
    /// YAML (one document).
    Yaml,
}

impl Format {
    /// The format a manifest file's name says (`.json`, `.yaml`, `.yml`).
    pub(crate) fn from_path(path: &std::path::Path) -> Option<Format> {
        match path.extension()?.to_str()? {
            "json" => Some(Format::Json),
            "yaml" | "yml" => Some(Format::Yaml),
            _ => None,
        }
    }
}

/// Parses `bytes` into a JSON value, refusing oversize documents unread and anything that
/// is not one object.
pub fn parse(bytes: &[u8], format: Format) -> Result<Value, NodeError> {
    if bytes.len() > MAX_DOCUMENT_BYTES {
        return Err(NodeError::TooLarge {
            size: bytes.len(),
            limit: MAX_DOCUMENT_BYTES,
        });
    }
    let value: Value = match format {
        Format::Json => serde_json::from_slice(bytes)
            .map_err(|e| NodeError::Invalid(format!("pod document is not valid JSON: {e}")))?,
        Format::Yaml => {
            let text = std::str::from_utf8(bytes)
                .map_err(|e| NodeError::Invalid(format!("pod document is not UTF-8: {e}")))?;
            serde_saphyr::from_str(text).map_err(|e| {
                NodeError::Invalid(format!(
                    "pod document is not valid YAML: {}",
                    one_line(&e.to_string())
                ))
            })?
        }
    };
    if !value.is_object() {
        return Err(NodeError::Invalid(
            "pod document must be one v1.Pod object".into(),
        ));
    }
    if let Some(kind) = value.get("kind").and_then(Value::as_str) {
        if kind != "Pod" {
            return Err(NodeError::Invalid(format!("kind: {kind:?} is not Pod")));
        }
    }
    Ok(value)
}

/// A checked pod: the document with namespace and uid filled in, and its domain form.
#[derive(Clone, Debug)]
pub struct Checked {
    /// The document as it will be kept (namespace defaulted, uid set).
    pub document: Value,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// The decision rules' view.
    pub info: PodInfo,
    /// `spec.terminationGracePeriodSeconds` (30 when unset, as in Kubernetes).
    pub grace_period_seconds: i64,
}

/// The pod's runtime class must be one this node has: the agent runs exactly one runtime
/// (`runtime.kind`), so `spec.runtimeClassName` may be unset or name that runtime
/// (`process` or `cri`); anything else would have nowhere to run.
pub fn check(
    mut document: Value,
    runtime_kind: &str,
    static_source: bool,
    new_uid: impl FnOnce() -> String,
) -> Result<Checked, NodeError> {
    let meta = document
        .as_object_mut()
        .ok_or_else(|| NodeError::Invalid("pod document must be an object".into()))?
        .entry("metadata")
        .or_insert_with(|| Value::Object(Default::default()));
    let meta = meta
        .as_object_mut()
        .ok_or_else(|| NodeError::Invalid("metadata: must be an object".into()))?;
    let name = match meta.get("name") {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            return Err(NodeError::Invalid("metadata.name: missing".into()))
        }
        Some(_) => return Err(NodeError::Invalid("metadata.name: must be a string".into())),
    };
    if !is_dns_label_like(&name) {
        return Err(NodeError::Invalid(format!(
            "metadata.name: {name:?} must be lowercase letters, digits, '-' and '.', at most 253 characters"
        )));
    }
    let namespace = match meta.get("namespace") {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        Some(Value::String(_)) | None | Some(Value::Null) => "default".to_string(),
        Some(_) => {
            return Err(NodeError::Invalid(
                "metadata.namespace: must be a string".into(),
            ))
        }
    };
    if !is_dns_label_like(&namespace) {
        return Err(NodeError::Invalid(format!(
            "metadata.namespace: {namespace:?} must be lowercase letters, digits, '-' and '.'"
        )));
    }
    meta.insert("namespace".into(), Value::String(namespace.clone()));
    let uid = match meta.get("uid") {
        Some(Value::String(u)) if !u.is_empty() => u.clone(),
        Some(Value::String(_)) | None | Some(Value::Null) => new_uid(),
        Some(_) => return Err(NodeError::Invalid("metadata.uid: must be a string".into())),
    };
    if !uid
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        || uid.len() > 128
    {
        return Err(NodeError::Invalid(format!(
            "metadata.uid: {uid:?} must be letters, digits, '-' or '_' (it names the pod cgroup)"
        )));
    }
    meta.insert("uid".into(), Value::String(uid.clone()));
    if static_source {
        let ann = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        let ann = ann
            .as_object_mut()
            .ok_or_else(|| NodeError::Invalid("metadata.annotations: must be an object".into()))?;
        ann.insert(
            CONFIG_SOURCE_ANNOTATION.into(),
            Value::String("file".into()),
        );
    }
    let spec = document
        .get("spec")
        .ok_or_else(|| NodeError::Invalid("spec: missing".into()))?;
    if let Some(class) = spec.get("runtimeClassName").and_then(Value::as_str) {
        if !class.is_empty() && class != runtime_kind {
            return Err(NodeError::Invalid(format!(
                "spec.runtimeClassName: {class:?} is not a runtime on this node (it runs {runtime_kind:?})"
            )));
        }
    }
    let grace_period_seconds = match spec.get("terminationGracePeriodSeconds") {
        None | Some(Value::Null) => 30,
        Some(v) => v.as_i64().filter(|g| *g >= 0).ok_or_else(|| {
            NodeError::Invalid(
                "spec.terminationGracePeriodSeconds: must be a non-negative integer".into(),
            )
        })?,
    };
    let info =
        PodInfo::from_json(document.clone()).map_err(|e| NodeError::Invalid(e.to_string()))?;
    Ok(Checked {
        document,
        namespace,
        name,
        uid,
        info,
        grace_period_seconds,
    })
}

/// The checks a client can make on its own, before it connects: [`parse`] and [`check`]
/// with everything that needs no node (the runtime class is the node's to judge, so it is
/// not checked here). `reactor pod apply` runs this first, so a bad file gets the file's
/// error even when no agent is running; the agent runs the full checks again.
pub fn validate(bytes: &[u8], format: Format) -> Result<(), NodeError> {
    let value = parse(bytes, format)?;
    let class = value
        .pointer("/spec/runtimeClassName")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    check(value, &class, false, || "client-side-check".into()).map(|_| ())
}

fn is_dns_label_like(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

/// A random uid in the form Kubernetes gives them (a version-4 UUID from the kernel).
pub(crate) fn new_uid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            format!("{:032x}", nanos ^ (u128::from(std::process::id()) << 64))
        })
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(v: Value) -> Result<Checked, NodeError> {
        check(v, "process", false, || "gen-1".into())
    }

    #[test]
    fn uid_is_generated_and_namespace_defaulted() {
        let c = doc(json!({"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c"}]}}))
            .unwrap();
        assert_eq!((c.uid.as_str(), c.namespace.as_str()), ("gen-1", "default"));
        assert_eq!(c.document["metadata"]["uid"], "gen-1");
        assert_eq!(c.grace_period_seconds, 30);
    }

    #[test]
    fn refusals_name_the_field() {
        let e = doc(json!({"metadata": {}, "spec": {"containers": []}})).unwrap_err();
        assert_eq!(e.to_string(), "metadata.name: missing");
        let e = doc(json!({"metadata": {"name": "a"}, "spec": {"containers": [
            {"name": "c", "resources": {"requests": {"memory": "12Q"}}}]}}))
        .unwrap_err()
        .to_string();
        assert!(e.contains("resources.requests.memory"), "{e}");
        let e = doc(
            json!({"metadata": {"name": "a"}, "spec": {"runtimeClassName": "gvisor",
            "containers": []}}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("spec.runtimeClassName: \"gvisor\""), "{e}");
        let e = doc(json!({"metadata": {"name": "a", "uid": "../x"}, "spec": {}}))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("metadata.uid"), "{e}");
    }

    #[test]
    fn static_pods_are_marked_critical() {
        let c = check(
            json!({"metadata": {"name": "s"}, "spec": {"containers": []}}),
            "process",
            true,
            || "u".into(),
        )
        .unwrap();
        assert!(c.info.is_static && c.info.is_critical());
    }

    #[test]
    fn a_number_in_a_kept_document_reads_back_the_same() {
        // Found by the `pod` fuzz target: the document is kept as JSON (the pod checkpoint),
        // and 1.271428805885373e18 read back from it was 1.2714288058853727e18.
        let doc = parse(
            b"metadata: {name: a}\nspec: {overhead: {x: 1.271428805885373e+18}}\n",
            Format::Yaml,
        )
        .unwrap();
        let kept = serde_json::to_vec(&doc).unwrap();
        assert_eq!(parse(&kept, Format::Json).unwrap(), doc);
    }

    #[test]
    fn oversize_is_refused_unread() {
        let big = vec![b' '; MAX_DOCUMENT_BYTES + 1];
        assert!(matches!(
            parse(&big, Format::Json),
            Err(NodeError::TooLarge { .. })
        ));
        assert!(parse(b"kind: Service\n", Format::Yaml).is_err());
        assert!(parse(b"{\"metadata\":{\"name\":\"x\"}}", Format::Json).is_ok());
    }
}
