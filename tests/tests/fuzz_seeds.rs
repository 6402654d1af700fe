//! The fuzz targets' seed corpus (`fuzz/seeds/`): the example pods and configs, the device
//! checkpoint fixture, and state files written by the agent's own encoders from them.
//!
//! Every seed must be accepted by the parser its target runs, so a format change that
//! leaves the committed corpus behind fails here rather than quietly starting the fuzzers
//! from inputs that are all refused. With `REACTOR_FUZZ_SEEDS=DIR` the seeds are also
//! written there (`cargo xtask fuzz --seeds`, which collects the plan tests' inputs the same
//! way).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use k8s_openapi::api::core::v1 as k8s;
use prost::Message as _;
use reactor::act::cgroups::CgroupPath;
use reactor::act::pod_spec::pod_spec;
use reactor::act::process;
use reactor::act::runtime::{ContainerState, ContainerStatus, PodPhase, Terminated};
use reactor::config::Config;
use reactor::decide::cgroups::CgroupVersion;
use reactor::devices::checkpoint as devices;
use reactor::images::manager as images;
use reactor::images::records::{StoredRecord, StoredRecords};
use reactor::node::document::{self, Format};
use reactor::node::journal::{KillJournal, KillNote};
use reactor::node::pod_record::{self, PodRecord, PodSource, StopIntent};
use reactor::node::NodePlan;
use reactor::record::checkpoint::Checkpoint;
use reactor_proto::reactor_v1 as pb;
use reactor_tests::keep_fuzz_seed;
use serde_json::{json, Value};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> Vec<u8> {
    std::fs::read(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The example pods, as YAML (the files) and as JSON.
fn pods() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for rel in ["examples/hog.yaml", "examples/sleeper.yaml"] {
        let yaml = read(rel);
        let value = document::parse(&yaml, Format::Yaml).expect("an example pod parses");
        out.push(yaml);
        out.push(serde_json::to_vec_pretty(&value).expect("JSON"));
    }
    out
}

fn checked(bytes: &[u8], uid: &str) -> document::Checked {
    let format = if bytes.first() == Some(&b'{') {
        Format::Json
    } else {
        Format::Yaml
    };
    let value = document::parse(bytes, format).expect("parses");
    document::check(value, "process", false, || uid.to_string()).expect("checks")
}

fn configs() -> Vec<Vec<u8>> {
    let mut out = vec![
        read("examples/reactor.yaml"),
        read("deploy/debian/config.yaml"),
        Config::default().to_yaml().into_bytes(),
    ];
    // The same as JSON, and a config with a KubeletConfiguration's own fields set aside.
    let tour = Config::from_yaml(&String::from_utf8_lossy(&out[0])).expect("the tour config");
    out.push(serde_json::to_vec(&tour).expect("JSON"));
    out.push(
        b"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
          evictionHard: {memory.available: 10%, nodefs.available: 5%}\n\
          evictionSoft: {memory.available: 20%}\nevictionSoftGracePeriod: {memory.available: 30s}\n\
          node: {memoryCapacity: 2Gi}\nauthentication: {anonymous: {enabled: false}}\n"
            .to_vec(),
    );
    out
}

fn time(secs: u64) -> std::time::SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn statuses() -> Vec<ContainerStatus> {
    let ended = Terminated {
        exit_code: 137,
        signal: Some(9),
        reason: "OOMKilled".into(),
        message: String::new(),
        started_at: time(1_700_000_000),
        finished_at: time(1_700_000_060),
    };
    vec![
        ContainerStatus {
            name: "app".into(),
            state: ContainerState::Running {
                pid: 4242,
                started_at: time(1_700_000_100),
            },
            restart_count: 1,
            last_termination: Some(ended.clone()),
        },
        ContainerStatus {
            name: "app".into(),
            state: ContainerState::Terminated(ended),
            restart_count: 0,
            last_termination: None,
        },
        ContainerStatus {
            name: "app".into(),
            state: ContainerState::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: "back-off 10s".into(),
            },
            restart_count: 3,
            last_termination: None,
        },
    ]
}

fn pod_records() -> Vec<PodRecord> {
    let pods = pods();
    let mut out = Vec::new();
    for (i, (bytes, status)) in pods.iter().zip(statuses().into_iter().cycle()).enumerate() {
        let c = checked(bytes, &format!("uid-{i}"));
        let stopping = match i {
            1 => Some(StopIntent::Evict {
                reason: "Evicted".into(),
                message: "The node was low on resource: memory.".into(),
            }),
            2 => Some(StopIntent::Preempt {
                preemptor: "uid-9".into(),
            }),
            3 => Some(StopIntent::Remove {
                cause: "api".into(),
            }),
            _ => None,
        };
        out.push(PodRecord {
            uid: c.uid.clone(),
            namespace: c.namespace.clone(),
            name: format!("{}-{i}", c.name),
            document: c.document.clone(),
            source: if i % 2 == 0 {
                PodSource::Api
            } else {
                PodSource::File {
                    path: "/etc/reactor/manifests/pod.yaml".into(),
                    hash: 0xdead_beef,
                }
            },
            cgroup: CgroupPath::for_pod(&c.info).ok(),
            grace_period_seconds: c.grace_period_seconds,
            phase: [PodPhase::Running, PodPhase::Failed, PodPhase::Pending][i % 3],
            reason: String::new(),
            message: String::new(),
            ended_by_agent: i == 1,
            containers: vec![status],
            oom_score_adj: [("app".to_string(), 1000)].into(),
            stopping,
            orphan: None,
        });
    }
    out
}

/// The process runtime's saved pods: its private record type, written out as JSON in the
/// shape `SavedPod` serializes to, then put through the runtime's own decoder.
fn process_pods() -> Value {
    let config =
        Config::from_yaml("node: {memoryCapacity: 8Gi, cpuCapacity: \"4\"}\n").expect("config");
    let node = NodePlan::from_config(&config, CgroupVersion::V1, 0)
        .expect("plan")
        .cgroups;
    let mut saved = Vec::new();
    for (i, (bytes, status)) in pods().iter().zip(statuses()).enumerate() {
        let c = checked(bytes, &format!("uid-{i}"));
        let pod: k8s::Pod = serde_json::from_value(c.document.clone()).expect("v1.Pod");
        let mut spec = pod_spec(&pod, &c.info, &node, &BTreeMap::new()).expect("pod spec");
        spec.document = Some(c.document.clone());
        saved.push(json!({
            "spec": spec,
            "containers": [{"status": status, "pid": 4242, "startTicks": 123_456,
                            "oomKillsAtStart": 0}],
        }));
    }
    Value::Array(saved)
}

fn image_records() -> StoredRecords {
    StoredRecords {
        images: [
            (
                "sha256:aaaa".to_string(),
                StoredRecord {
                    first_detected_ns: Some(1_700_000_000_000_000_000),
                    last_used_ns: Some(1_700_000_500_000_000_000),
                    size_bytes: 12 << 20,
                    pinned: false,
                },
            ),
            (
                "sha256:bbbb".to_string(),
                StoredRecord {
                    first_detected_ns: None,
                    last_used_ns: None,
                    size_bytes: 1 << 30,
                    pinned: true,
                },
            ),
        ]
        .into(),
    }
}

fn device_checkpoints() -> Vec<Vec<u8>> {
    let fixture = read("tests/fixtures/devices/kubelet_internal_checkpoint");
    let data = devices::decode(Path::new("fixture"), &fixture).expect("the fixture decodes");
    let empty = devices::Data::default();
    vec![fixture, devices::encode(&empty), devices::encode(&data)]
}

fn journal() -> Vec<u8> {
    let mut out = Vec::new();
    for (uid, reason) in [("uid-0", "Evicted"), ("uid-1", "Evicted")] {
        let note = KillNote {
            uid: uid.into(),
            reason: reason.into(),
            message: "The node was low on resource: memory. Threshold quantity: 100Mi.".into(),
        };
        out.extend(KillJournal::line(&note).expect("a note serializes"));
    }
    out
}

/// API requests: the message's index in the `api` target, then its protobuf bytes.
fn api_requests() -> Vec<Vec<u8>> {
    let with = |which: u8, m: Vec<u8>| [vec![which], m].concat();
    let mut out = Vec::new();
    for pod in pods() {
        let format = if pod.first() == Some(&b'{') {
            pb::DocumentFormat::Json
        } else {
            pb::DocumentFormat::Yaml
        };
        let r = pb::ApplyPodRequest {
            pod,
            format: format as i32,
        };
        out.push(with(0, r.encode_to_vec()));
    }
    let remove = [
        pb::RemovePodRequest {
            target: Some(pb::remove_pod_request::Target::Pod(pb::PodRef {
                namespace: "default".into(),
                name: "hog".into(),
            })),
            grace_period_seconds: Some(5),
        },
        pb::RemovePodRequest {
            target: Some(pb::remove_pod_request::Target::Uid("uid-0".into())),
            grace_period_seconds: None,
        },
    ];
    out.extend(remove.iter().map(|r| with(1, r.encode_to_vec())));
    let evict = json!({"signal": "memory.available", "pods": [
        {"metadata": {"name": "a", "namespace": "x", "uid": "1"}},
        {"metadata": {"name": "b", "uid": "2"}}],
        "summary": {"pods": [{"podRef": {"uid": "1"}, "memory": {"workingSetBytes": 10}}]}});
    let plan = pb::PlanRequest {
        what: "evict".into(),
        input_json: evict.to_string().into_bytes(),
    };
    out.push(with(2, plan.encode_to_vec()));
    out.push(with(
        3,
        pb::ListPodsRequest {
            namespace: "default".into(),
        }
        .encode_to_vec(),
    ));
    out.push(with(
        4,
        pb::EventsRequest {
            kinds: vec!["eviction".into(), "oom_kill".into()],
        }
        .encode_to_vec(),
    ));
    out.push(with(5, pb::NodeStatusRequest {}.encode_to_vec()));
    out
}

/// Every seed by target, each checked by the parser its target runs.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    for c in configs() {
        let text = String::from_utf8(c.clone()).expect("UTF-8");
        Config::from_yaml(&text).unwrap_or_else(|e| panic!("config seed refused: {e}\n{text}"));
        out.push(("config", c));
    }
    for p in pods() {
        checked(&p, "u");
        out.push(("pod", p));
    }
    let pods_cp = Checkpoint::new(
        "pods.json",
        pod_record::CHECKPOINT_KIND,
        pod_record::CHECKPOINT_VERSION,
    );
    let records = pod_records();
    let file = pods_cp.encode(&records).expect("encodes");
    let back: Vec<PodRecord> = pods_cp.decode(&file).expect("the pod checkpoint decodes");
    assert_eq!(back, records);
    // The whole file, and its data alone (the target wraps it in a good envelope).
    out.push(("checkpoint_pods", file));
    out.push((
        "checkpoint_pods",
        serde_json::to_vec(&records).expect("JSON"),
    ));
    let process = process_pods();
    let file = Checkpoint::new(
        "process-runtime.json",
        process::CHECKPOINT_KIND,
        process::CHECKPOINT_VERSION,
    )
    .encode(&process)
    .expect("encodes");
    process::recode_checkpoint(&file).expect("the runtime's checkpoint decodes");
    out.push(("checkpoint_process", file));
    out.push((
        "checkpoint_process",
        serde_json::to_vec(&process).expect("JSON"),
    ));
    let images_cp = Checkpoint::new(
        images::CHECKPOINT_FILE,
        images::CHECKPOINT_KIND,
        images::CHECKPOINT_VERSION,
    );
    let file = images_cp.encode(&image_records()).expect("encodes");
    let back: StoredRecords = images_cp.decode(&file).expect("the image records decode");
    assert_eq!(back, image_records());
    out.push(("checkpoint_images", file));
    out.push((
        "checkpoint_images",
        serde_json::to_vec(&image_records()).expect("JSON"),
    ));
    for d in device_checkpoints() {
        devices::decode(Path::new("seed"), &d).expect("a device checkpoint seed decodes");
        out.push(("checkpoint_devices", d));
    }
    let j = journal();
    assert_eq!(KillJournal::parse(&j, Path::new("seed")).len(), 2);
    out.push(("kill_journal", j));
    for r in api_requests() {
        out.push(("api", r));
    }
    out
}

#[test]
fn every_seed_is_accepted_by_its_parser() {
    let seeds = seeds();
    let targets: std::collections::BTreeSet<&str> = seeds.iter().map(|(t, _)| *t).collect();
    assert_eq!(targets.len(), 8, "{targets:?}");
    for (target, bytes) in &seeds {
        keep_fuzz_seed(target, bytes);
    }
}
