//! The part of the kubelet Summary API (`/stats/summary`) that eviction ranking reads.
//!
//! Ranking charges each pod with the usage the kubelet would: working set for memory, rootfs,
//! logs and local volumes for disk and inodes, process count for pids. Operators capture
//! `/stats/summary` from a real node and feed it to `reactor plan evict`, so the field names
//! are the Summary API's own and anything else in the document is ignored. Stats join pods by
//! `podRef.uid` alone, as in the kubelet.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use serde::{Deserialize, Deserializer};

/// Deserializes a JSON `null` as the type's default, as Go's decoder leaves a nil slice.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A Summary API document (only `pods` is read).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Summary {
    /// Per-pod statistics.
    #[serde(default, deserialize_with = "nullable")]
    pub pods: Vec<PodStats>,
}

/// Which pod a stats entry belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct PodRef {
    /// Pod name (informational).
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// Pod namespace (informational).
    #[serde(default, deserialize_with = "nullable")]
    pub namespace: String,
    /// The pod's uid: the join key.
    #[serde(default, deserialize_with = "nullable")]
    pub uid: String,
}

/// Memory statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// The working set the kubelet charges (absent reads as zero).
    #[serde(default)]
    pub working_set_bytes: Option<u64>,
}

/// Filesystem usage of one container layer, log directory or volume.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    /// Bytes used (absent reads as zero).
    #[serde(default)]
    pub used_bytes: Option<u64>,
    /// Inodes used (absent reads as zero).
    #[serde(default)]
    pub inodes_used: Option<u64>,
}

/// One container's statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct ContainerStats {
    /// The container name, matched against the pod spec for eviction messages.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// The writable layer.
    #[serde(default)]
    pub rootfs: Option<FsStats>,
    /// The container's logs.
    #[serde(default)]
    pub logs: Option<FsStats>,
    /// The container's memory.
    #[serde(default)]
    pub memory: Option<MemoryStats>,
}

/// One volume's usage.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStats {
    /// The volume name from the pod spec.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// Bytes used.
    #[serde(default)]
    pub used_bytes: Option<u64>,
    /// Inodes used.
    #[serde(default)]
    pub inodes_used: Option<u64>,
}

/// Process statistics (the Summary API spells these in snake case).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct ProcessStats {
    /// Processes in the pod.
    #[serde(default)]
    pub process_count: Option<u64>,
}

/// One pod's statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    /// Which pod.
    #[serde(default)]
    pub pod_ref: PodRef,
    /// Pod memory; absent means the pod uses none.
    #[serde(default)]
    pub memory: Option<MemoryStats>,
    /// Per-container statistics.
    #[serde(default, deserialize_with = "nullable")]
    pub containers: Vec<ContainerStats>,
    /// Per-volume statistics.
    #[serde(default, deserialize_with = "nullable")]
    pub volume: Vec<VolumeStats>,
    /// Total local ephemeral storage of the pod.
    #[serde(default, rename = "ephemeral-storage")]
    pub ephemeral_storage: Option<FsStats>,
    /// Process statistics.
    #[serde(default, rename = "process_stats")]
    pub process_stats: Option<ProcessStats>,
}

impl PodStats {
    /// The pod's working set in bytes (zero without a memory block).
    pub fn working_set_bytes(&self) -> u64 {
        self.memory.and_then(|m| m.working_set_bytes).unwrap_or(0)
    }

    /// The pod's process count (zero without process statistics).
    pub fn process_count(&self) -> u64 {
        self.process_stats
            .and_then(|p| p.process_count)
            .unwrap_or(0)
    }
}

/// A fast hasher for pod uids. Uids come from the node's own API server or runtime, not from
/// an adversary, so the collision resistance of the default hasher buys nothing on the
/// eviction hot path, where every pod is looked up once per decision.
#[derive(Default, Clone, Copy)]
pub struct UidHasher(u64);

impl Hasher for UidHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut h = self.0;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(c);
            h = (h.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            h = (h.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
        self.0 = h;
    }
}

/// Pod statistics by uid (see [`Summary::index`]).
pub(crate) type StatsIndex<'a> = HashMap<&'a str, &'a PodStats, BuildHasherDefault<UidHasher>>;

/// Why a Summary document was refused: the JSON path and the reason, in one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct SummaryError {
    /// Where in the document (`pods[3].memory.workingSetBytes`).
    pub path: String,
    /// What is wrong.
    pub reason: String,
}

impl Summary {
    /// Reads a Summary document from a JSON value, naming the path of anything malformed
    /// relative to `prefix` (the field the document sits under in a larger input).
    pub fn from_value(value: serde_json::Value, prefix: &str) -> Result<Summary, SummaryError> {
        serde_path_to_error::deserialize(value).map_err(|e| {
            let inner = e.path().to_string();
            let path = if inner == "." {
                prefix.to_string()
            } else if prefix.is_empty() {
                inner
            } else if inner.starts_with('[') {
                format!("{prefix}{inner}")
            } else {
                format!("{prefix}.{inner}")
            };
            let reason = e
                .into_inner()
                .to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            SummaryError { path, reason }
        })
    }

    /// Stats by pod uid; a later entry for the same uid replaces an earlier one, as in the
    /// kubelet's lookup.
    pub fn index(&self) -> StatsIndex<'_> {
        let mut index = StatsIndex::with_capacity_and_hasher(self.pods.len(), Default::default());
        for p in &self.pods {
            index.insert(p.pod_ref.uid.as_str(), p);
        }
        index
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_fields_eviction_needs_and_ignores_the_rest() {
        let s = Summary::from_value(
            json!({
                "node": {"nodeName": "n1", "memory": {"availableBytes": 1}},
                "pods": [{
                    "podRef": {"name": "a", "namespace": "default", "uid": "u1"},
                    "startTime": "2026-01-01T00:00:00Z",
                    "memory": {"workingSetBytes": 100, "usageBytes": 200},
                    "containers": [{"name": "c", "rootfs": {"usedBytes": 5, "inodesUsed": 2},
                                    "logs": {"usedBytes": 7}}],
                    "volume": [{"name": "data", "usedBytes": 11, "inodesUsed": 3}],
                    "ephemeral-storage": {"usedBytes": 23},
                    "process_stats": {"process_count": 4}
                }, {
                    "podRef": {"uid": "u2"},
                    "containers": null
                }]
            }),
            "summary",
        )
        .unwrap();
        assert_eq!(s.pods.len(), 2);
        let a = &s.pods[0];
        assert_eq!(a.working_set_bytes(), 100);
        assert_eq!(a.process_count(), 4);
        assert_eq!(a.containers[0].logs.unwrap().inodes_used, None);
        assert_eq!(a.volume[0].used_bytes, Some(11));
        assert_eq!(s.pods[1].working_set_bytes(), 0);
        assert!(s.index().contains_key("u2"));
    }

    #[test]
    fn errors_name_the_path() {
        let err = Summary::from_value(
            json!({"pods": [{"podRef": {"uid": "u"}}, {"memory": {"workingSetBytes": -5}}]}),
            "summary",
        )
        .unwrap_err();
        assert_eq!(err.path, "summary.pods[1].memory.workingSetBytes");
        let err = Summary::from_value(json!({"pods": {"a": 1}}), "summary").unwrap_err();
        assert_eq!(err.path, "summary.pods");
        let err = Summary::from_value(json!([1]), "summary").unwrap_err();
        assert!(err.path.starts_with("summary"), "{err}");
    }
}
