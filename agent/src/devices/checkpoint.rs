//! The device checkpoint in the kubelet's own format (`kubelet_internal_checkpoint`), so a
//! checkpoint written by a kubelet is read here and one written here would verify in a kubelet.
//!
//! The file is JSON: `{"Data":{"PodDeviceEntries":[...],"RegisteredDevices":{...}},"Checksum":N}`.
//! `Checksum` is the kubelet's `checksum.New(Data)`: FNV-32a over `hashutil.DeepHashObject`,
//! which prints the Go value with go-spew's `%#v` formatter (types shown, map keys sorted,
//! methods disabled). [`spew_dump`] reproduces that text for this one struct exactly: field
//! order, `(type)` prefixes, `<nil>` for nil slices and maps (JSON `null` or absent), `[]` for
//! empty ones, `[]byte` as decimal bytes, NUMA keys sorted as numbers. Unit tests check it
//! against checkpoints written by real kubelets.
//!
//! Reads and writes go through [`crate::record::state_file`], like every state file of the
//! agent: atomic writes keeping the previous generation, damaged files set aside.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize};

/// The kubelet's checkpoint file name.
pub const CHECKPOINT_FILE: &str = "kubelet_internal_checkpoint";

/// One container's devices of one resource, as the kubelet's `PodDevicesEntry`.
/// `None` stands for Go's nil (JSON `null` or a missing field), which hashes differently
/// from an empty value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entry {
    /// Pod UID.
    pub pod_uid: String,
    /// Container name.
    pub container_name: String,
    /// Resource name.
    pub resource_name: String,
    /// NUMA node → device IDs (`DevicesPerNUMA`); node `-1` = no topology.
    pub device_ids: Option<BTreeMap<i64, Option<Vec<String>>>>,
    /// The plugin's `ContainerAllocateResponse`, protobuf-encoded.
    pub alloc_resp: Option<Vec<u8>>,
}

/// The checksummed part of the checkpoint (the kubelet's `checkpointData`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Data {
    /// Assignments; `None` = nil.
    pub entries: Option<Vec<Entry>>,
    /// Resource → healthy device IDs at the time of writing; `None` = nil.
    pub registered: Option<BTreeMap<String, Option<Vec<String>>>>,
}

/// Why a checkpoint was refused.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file could not be read or written.
    #[error("device checkpoint {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Not the kubelet's JSON shape (truncated, garbage, wrong types).
    #[error(
        "device checkpoint {path} is unreadable ({reason}); starting with no device assignments"
    )]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What the parser said, one line.
        reason: String,
    },
    /// The JSON parsed but the checksum does not match its data.
    #[error("device checkpoint {path} is corrupt (checksum {stored} does not match its data, which sums to {computed}); starting with no device assignments")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Checksum in the file.
        stored: u64,
        /// Checksum of the data in the file.
        computed: u64,
    },
}

/// FNV-32a, the hash the kubelet's checksum uses.
pub(crate) fn fnv32a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The kubelet's checksum of the data.
pub(crate) fn checksum(data: &Data) -> u64 {
    u64::from(fnv32a(spew_dump(data).as_bytes()))
}

fn dump_strings(out: &mut String, v: &Option<Vec<String>>) {
    match v {
        None => out.push_str("<nil>"),
        Some(v) => {
            out.push('[');
            out.push_str(&v.join(" "));
            out.push(']');
        }
    }
}

/// go-spew's `%#v` text of the kubelet's `checkpointData` holding `data`.
pub(crate) fn spew_dump(data: &Data) -> String {
    let mut out =
        String::from("(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)");
    match &data.entries {
        None => out.push_str("<nil>"),
        Some(entries) => {
            out.push('[');
            for (i, e) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                let _ = write!(
                    out,
                    "{{PodUID:(string){} ContainerName:(string){} ResourceName:(string){} DeviceIDs:(checkpoint.DevicesPerNUMA)",
                    e.pod_uid, e.container_name, e.resource_name
                );
                match &e.device_ids {
                    None => out.push_str("<nil>"),
                    Some(m) => {
                        out.push_str("map[");
                        for (j, (numa, ids)) in m.iter().enumerate() {
                            if j > 0 {
                                out.push(' ');
                            }
                            let _ = write!(out, "{numa}:");
                            dump_strings(&mut out, ids);
                        }
                        out.push(']');
                    }
                }
                out.push_str(" AllocResp:([]uint8)");
                match &e.alloc_resp {
                    None => out.push_str("<nil>"),
                    Some(b) => {
                        out.push('[');
                        for (j, byte) in b.iter().enumerate() {
                            if j > 0 {
                                out.push(' ');
                            }
                            let _ = write!(out, "{byte}");
                        }
                        out.push(']');
                    }
                }
                out.push('}');
            }
            out.push(']');
        }
    }
    out.push_str(" RegisteredDevices:(map[string][]string)");
    match &data.registered {
        None => out.push_str("<nil>"),
        Some(m) => {
            out.push_str("map[");
            for (j, (resource, ids)) in m.iter().enumerate() {
                if j > 0 {
                    out.push(' ');
                }
                let _ = write!(out, "{resource}:");
                dump_strings(&mut out, ids);
            }
            out.push(']');
        }
    }
    out.push('}');
    out
}

// ---- JSON, shaped as Go's encoding/json reads and writes it ----

/// Go's decoder leaves a field at its zero value for JSON `null`.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Serialize, Deserialize, Default)]
struct FileJson {
    #[serde(rename = "Data", default, deserialize_with = "null_as_default")]
    data: DataJson,
    #[serde(rename = "Checksum", default, deserialize_with = "null_as_default")]
    checksum: u64,
}

#[derive(Serialize, Deserialize, Default)]
struct DataJson {
    #[serde(rename = "PodDeviceEntries", default)]
    entries: Option<Vec<EntryJson>>,
    #[serde(rename = "RegisteredDevices", default)]
    registered: Option<BTreeMap<String, Option<Vec<String>>>>,
}

#[derive(Serialize, Deserialize, Default)]
struct EntryJson {
    #[serde(rename = "PodUID", default, deserialize_with = "null_as_default")]
    pod_uid: String,
    #[serde(
        rename = "ContainerName",
        default,
        deserialize_with = "null_as_default"
    )]
    container_name: String,
    #[serde(rename = "ResourceName", default, deserialize_with = "null_as_default")]
    resource_name: String,
    /// Go writes int64 map keys as decimal strings.
    #[serde(rename = "DeviceIDs", default)]
    device_ids: Option<BTreeMap<String, Option<Vec<String>>>>,
    /// Go writes `[]byte` as standard base64.
    #[serde(rename = "AllocResp", default)]
    alloc_resp: Option<String>,
}

/// Encodes the checkpoint file, checksum included, byte-for-byte as Go's `json.Marshal`
/// would (map keys sorted as strings, `<`, `>`, `&` escaped).
pub fn encode(data: &Data) -> Vec<u8> {
    let file = FileJson {
        checksum: checksum(data),
        data: DataJson {
            entries: data.entries.as_ref().map(|es| {
                es.iter()
                    .map(|e| EntryJson {
                        pod_uid: e.pod_uid.clone(),
                        container_name: e.container_name.clone(),
                        resource_name: e.resource_name.clone(),
                        device_ids: e
                            .device_ids
                            .as_ref()
                            .map(|m| m.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()),
                        alloc_resp: e
                            .alloc_resp
                            .as_ref()
                            .map(|b| base64::engine::general_purpose::STANDARD.encode(b)),
                    })
                    .collect()
            }),
            registered: data.registered.clone(),
        },
    };
    // serde_json cannot fail on these plain types; an empty file would be refused on read.
    let text = serde_json::to_string(&file).unwrap_or_default();
    text.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
        .into_bytes()
}

/// Parses a checkpoint and verifies its checksum.
pub fn decode(path: &Path, bytes: &[u8]) -> Result<Data, CheckpointError> {
    let malformed = |reason: String| CheckpointError::Malformed {
        path: path.to_path_buf(),
        reason,
    };
    let file: FileJson =
        serde_json::from_slice(bytes).map_err(|e| malformed(e.to_string().replace('\n', " ")))?;
    let mut entries = None;
    if let Some(es) = file.data.entries {
        let mut out = Vec::with_capacity(es.len());
        for e in es {
            let device_ids = match e.device_ids {
                None => None,
                Some(m) => {
                    let mut by_numa = BTreeMap::new();
                    for (k, v) in m {
                        let numa: i64 = k.parse().map_err(|_| {
                            malformed(format!(
                                "NUMA node {k:?} of pod {:?} is not an integer",
                                e.pod_uid
                            ))
                        })?;
                        by_numa.insert(numa, v);
                    }
                    Some(by_numa)
                }
            };
            let alloc_resp = match e.alloc_resp {
                None => None,
                Some(s) => {
                    let clean: String = s.chars().filter(|c| *c != '\r' && *c != '\n').collect();
                    Some(
                        base64::engine::general_purpose::STANDARD
                            .decode(clean)
                            .map_err(|err| {
                                malformed(format!(
                                    "AllocResp of pod {:?} is not base64: {err}",
                                    e.pod_uid
                                ))
                            })?,
                    )
                }
            };
            out.push(Entry {
                pod_uid: e.pod_uid,
                container_name: e.container_name,
                resource_name: e.resource_name,
                device_ids,
                alloc_resp,
            });
        }
        entries = Some(out);
    }
    let data = Data {
        entries,
        registered: file.data.registered,
    };
    let computed = checksum(&data);
    if computed != file.checksum {
        return Err(CheckpointError::Corrupt {
            path: path.to_path_buf(),
            stored: file.checksum,
            computed,
        });
    }
    Ok(data)
}

/// Reads and verifies the checkpoint at `path`; `Ok(None)` if there is none.
pub fn read(path: &Path) -> Result<Option<Data>, CheckpointError> {
    match std::fs::read(path) {
        Ok(bytes) => decode(path, &bytes).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checkpoints as real kubelets wrote them (published in node operators' write-ups),
    /// with the checksums those kubelets computed. If the dump is off by one byte, these fail.
    const KUBELET_WRITTEN: &[&str] = &[
        r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-0650a168-e770-3ea8-8ac3-8a1d419763e0"]}},"Checksum":3952659280}"#,
        r#"{"Data":{"PodDeviceEntries":[{"PodUID":"bf52b2cd-b611-4e79-86b1-280b283185c3","ContainerName":"check","ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["tegra"]},"AllocResp":"Ch8KFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSBXRlZ3Jh"}],"RegisteredDevices":{"nvidia.com/gpu":["tegra"]}},"Checksum":3660592824}"#,
        r#"{"Data":{"PodDeviceEntries":[{"PodUID":"513cb897-0262-4868-826f-aa943ee45a38","ContainerName":"app","ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["GPU-77a702db-e37f-3a74-d46d-c5713f66058c"]},"AllocResp":"CkIKFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSKEdQVS03N2E3MDJkYi1lMzdmLTNhNzQtZDQ2ZC1jNTcxM2Y2NjA1OGMaJAoOL2Rldi9udmlkaWFjdGwSDi9kZXYvbnZpZGlhY3RsGgJydxomCg8vZGV2L252aWRpYS11dm0SDy9kZXYvbnZpZGlhLXV2bRoCcncaMgoVL2Rldi9udmlkaWEtdXZtLXRvb2xzEhUvZGV2L252aWRpYS11dm0tdG9vbHMaAnJ3Gi4KEy9kZXYvbnZpZGlhLW1vZGVzZXQSEy9kZXYvbnZpZGlhLW1vZGVzZXQaAnJ3GiAKDC9kZXYvbnZpZGlhMBIML2Rldi9udmlkaWEwGgJydw=="}],"RegisteredDevices":{"nvidia.com/gpu":["GPU-77a702db-e37f-3a74-d46d-c5713f66058c","GPU-9b341c59-f96b-ba85-c137-78c3652fea65","GPU-c1e9f249-b37b-81c2-a8d9-ba5ca0294841"]}},"Checksum":133412836}"#,
    ];

    #[test]
    fn kubelet_written_checkpoints_verify() {
        for (i, text) in KUBELET_WRITTEN.iter().enumerate() {
            let data = decode(Path::new("k"), text.as_bytes())
                .unwrap_or_else(|e| panic!("vector {i}: {e}"));
            // And our encoding of the same data is the kubelet's, byte for byte.
            assert_eq!(
                String::from_utf8(encode(&data)).unwrap(),
                *text,
                "vector {i}"
            );
        }
    }

    #[test]
    fn spew_text_has_go_shape() {
        let data = Data {
            entries: Some(vec![Entry {
                pod_uid: "u".into(),
                container_name: "c".into(),
                resource_name: "r/x".into(),
                device_ids: Some(
                    [(1, Some(vec!["b".into()])), (-1, Some(vec!["a".into()]))].into(),
                ),
                alloc_resp: Some(vec![]),
            }]),
            registered: Some([("r/x".into(), None)].into()),
        };
        assert_eq!(
            spew_dump(&data),
            "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)[{PodUID:(string)u ContainerName:(string)c ResourceName:(string)r/x DeviceIDs:(checkpoint.DevicesPerNUMA)map[-1:[a] 1:[b]] AllocResp:([]uint8)[]}] RegisteredDevices:(map[string][]string)map[r/x:<nil>]}"
        );
        assert_eq!(
            spew_dump(&Data::default()),
            "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)<nil> RegisteredDevices:(map[string][]string)<nil>}"
        );
    }

    #[test]
    fn tampered_and_truncated_checkpoints_are_refused() {
        let good = KUBELET_WRITTEN[1];
        let tampered = good.replace("tegra\"]}}", "tegrb\"]}}");
        let err = decode(Path::new("/x/cp"), tampered.as_bytes()).unwrap_err();
        assert!(
            matches!(
                err,
                CheckpointError::Corrupt {
                    stored: 3660592824,
                    ..
                }
            ),
            "{err}"
        );
        let truncated = &good[..good.len() / 2];
        let err = decode(Path::new("/x/cp"), truncated.as_bytes()).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, CheckpointError::Malformed { .. }));
        assert!(msg.contains("/x/cp is unreadable"), "{msg}");
        assert!(!msg.contains('\n'));
        assert!(decode(Path::new("p"), b"").is_err());
        assert!(decode(Path::new("p"), b"{\"Data\":{},\"Checksum\":\"x\"}").is_err());
    }

    #[test]
    fn a_pod_uid_with_a_line_break_is_quoted_in_the_refusal() {
        // The uid is the file's text: a refusal naming it must stay on one line.
        for entry in [
            r#"{"PodUID":"a\nb","DeviceIDs":{"x":null}}"#,
            r#"{"PodUID":"a\rb","AllocResp":"*"}"#,
        ] {
            let file = format!(r#"{{"Data":{{"PodDeviceEntries":[{entry}]}},"Checksum":0}}"#);
            let msg = decode(Path::new("p"), file.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(msg.contains("of pod \"a\\"), "{msg}");
            assert!(!msg.contains(['\n', '\r']), "{msg:?}");
        }
    }

    #[test]
    fn atomic_write_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join(CHECKPOINT_FILE);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let data = decode(Path::new("k"), KUBELET_WRITTEN[2].as_bytes()).unwrap();
        crate::record::state_file::StateFile::new(&path)
            .write(&encode(&data))
            .unwrap();
        assert_eq!(read(&path).unwrap(), Some(data));
        assert_eq!(read(&dir.path().join("absent")).unwrap(), None);
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "no temp file left behind: {names:?}");
    }

    #[test]
    fn go_html_escaping_is_reproduced() {
        let data = Data {
            entries: None,
            registered: Some([("a.example/x".into(), Some(vec!["<&>".into()]))].into()),
        };
        let text = String::from_utf8(encode(&data)).unwrap();
        assert!(text.contains(r#"["\u003c\u0026\u003e"]"#), "{text}");
        assert_eq!(decode(Path::new("p"), text.as_bytes()).unwrap(), data);
    }
}
