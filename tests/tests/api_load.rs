//! Issue 15, the API under load: a real `reactor run` on a modelled 512 MiB node, 50
//! concurrent gRPC clients on its unix socket applying, listing and removing pods for 30 s,
//! malformed requests beside them (bytes that are not HTTP/2, a gRPC request whose body is
//! not the protobuf message it names, a message beyond the server's size limit, a pod
//! document beyond the agent's own limit), and, in the middle of it, a BestEffort pod
//! allocating fast. What must hold:
//! - every request gets an answer or a refusal (a gRPC status, or a closed connection for
//!   bytes that are not HTTP/2); none hangs (each has a generous deadline, a hang detector,
//!   not a timed assertion);
//! - the refusals carry the codes a client can act on: `ResourceExhausted` for too large,
//!   `InvalidArgument` for a corrupt body;
//! - the agent stays up and its resident memory stays bounded (a generous bound on growth);
//! - the pods listed at the end are exactly the ones the clients left;
//! - the eviction still happens under load: the right pod, before the OOM killer.
//!
//! How much the load slows the eviction down is a speed figure: `cargo xtask bench` measures
//! it (part `api-load`), never this test.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns: a failed setup should panic with its backtrace"
)]

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reactor::api::server::MAX_MESSAGE_BYTES;
use reactor::node::document::MAX_DOCUMENT_BYTES;
use reactor_proto::reactor_v1 as pb;
use reactor_proto::reactor_v1::agent_client::AgentClient;
use reactor_tests::agent::TestAgent;
use reactor_tests::{is_root, memhog_bin, reactor_bin, require};
use serde_json::{json, Value};
use tonic::transport::Channel;
use tonic::Code;

const CLIENTS: usize = 50;
const LOAD: Duration = Duration::from_secs(30);
/// Rounds per client at most, so the load is bounded in count as well as in time.
const MAX_ROUNDS: usize = 400;
/// A request not answered within this is a hang (the agent answers in milliseconds).
const HANG: Duration = Duration::from_secs(60);
/// How much the agent's resident memory may grow over the whole test. Generous: the point is
/// "bounded", not a size figure (the agent idles at about 20 MiB).
const RSS_GROWTH_BOUND_KIB: u64 = 96 * 1024;

/// As `agent_eviction.rs`: a 512 MiB node evicting below 128 MiB allocatable, woken by eBPF
/// and the memcg notification.
const NODE: &str = "node: {memoryCapacity: 512Mi, cpuCapacity: '2'}\n\
                    evictionHard: {allocatableMemory.available: 128Mi}\n\
                    housekeepingInterval: 1s\n\
                    realtimePriority: 10\n\
                    sense: {ebpf: true, psi: false, memcgThreshold: true}\n";

fn ready() -> bool {
    require(is_root(), "root, to create cgroups and run pods")
        && require(
            Path::new("/sys/fs/cgroup/memory/memory.oom_control").exists(),
            "cgroup v1 memory hierarchy under /sys/fs/cgroup",
        )
        && require(
            memhog_bin().exists() && reactor_bin().exists(),
            "the reactor and memhog binaries (cargo build --workspace --bins)",
        )
}

/// `VmRSS` or `VmHWM` of a process, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

fn doc(namespace: &str, name: &str, command: Vec<String>, resources: Value) -> Vec<u8> {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": namespace},
           "spec": {"terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
                    "containers": [{"name": "app", "command": command,
                                    "resources": resources}]}})
    .to_string()
    .into_bytes()
}

fn apply_request(pod: Vec<u8>) -> pb::ApplyPodRequest {
    pb::ApplyPodRequest {
        pod,
        format: pb::DocumentFormat::Json as i32,
    }
}

async fn client(socket: &Path) -> AgentClient<Channel> {
    AgentClient::new(reactor::devices::dial_unix(socket).await.unwrap())
}

/// What the clients did and what went wrong.
#[derive(Default)]
struct Tally {
    applied: usize,
    listed: usize,
    removed: usize,
    /// Every request that got no answer in time, or an answer it should not have.
    failures: Vec<String>,
    /// The pods each client left on the node.
    left: BTreeSet<String>,
}

/// One client: apply a pod, list the namespace, remove the pod before, until the time is up;
/// the last pod stays.
async fn run_client(socket: &Path, i: usize, until: Instant, tally: Arc<Mutex<Tally>>) {
    let mut c = client(socket).await;
    let mut previous: Option<String> = None;
    let note = |what: String| tally.lock().unwrap().failures.push(what);
    for round in 0..MAX_ROUNDS {
        if Instant::now() >= until {
            break;
        }
        let name = format!("c{i}-{round}");
        let pod = doc(
            "load",
            &name,
            vec!["/bin/sleep".into(), "3600".into()],
            json!({}),
        );
        match tokio::time::timeout(HANG, c.apply_pod(apply_request(pod))).await {
            Err(_) => note(format!("apply {name}: no answer within {HANG:?}")),
            Ok(Err(s)) => note(format!("apply {name}: {:?} {}", s.code(), s.message())),
            Ok(Ok(r)) if !r.get_ref().admitted => {
                note(format!("apply {name}: refused {}", r.get_ref().reason))
            }
            Ok(Ok(_)) => {
                tally.lock().unwrap().applied += 1;
                let list = pb::ListPodsRequest {
                    namespace: "load".into(),
                };
                match tokio::time::timeout(HANG, c.list_pods(list)).await {
                    Err(_) => note(format!("list after {name}: no answer within {HANG:?}")),
                    Ok(Err(s)) => note(format!("list: {:?} {}", s.code(), s.message())),
                    Ok(Ok(r)) => {
                        if !r
                            .get_ref()
                            .pods
                            .iter()
                            .any(|p| p.pod.as_ref().is_some_and(|r| r.name == name))
                        {
                            note(format!(
                                "list after {name}: the pod just applied is missing"
                            ));
                        }
                        tally.lock().unwrap().listed += 1;
                    }
                }
                if let Some(old) = previous.replace(name) {
                    let rm = pb::RemovePodRequest {
                        target: Some(pb::remove_pod_request::Target::Pod(pb::PodRef {
                            namespace: "load".into(),
                            name: old.clone(),
                        })),
                        grace_period_seconds: Some(0),
                    };
                    match tokio::time::timeout(HANG, c.remove_pod(rm)).await {
                        Err(_) => note(format!("remove {old}: no answer within {HANG:?}")),
                        Ok(Err(s)) => note(format!("remove {old}: {:?} {}", s.code(), s.message())),
                        Ok(Ok(_)) => tally.lock().unwrap().removed += 1,
                    }
                }
            }
        }
    }
    if let Some(last) = previous {
        tally.lock().unwrap().left.insert(last);
    }
}

/// A codec that sends and receives bytes as they are: a well-formed gRPC request (HTTP/2,
/// length-prefixed frame) around any body.
#[derive(Clone, Copy, Default)]
struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut as _;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf as _;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// Sends `body` as the request message of `ApplyPod`; returns the status code.
async fn raw_apply(socket: &Path, body: Vec<u8>) -> Result<Code, String> {
    let channel = reactor::devices::dial_unix(socket)
        .await
        .map_err(|e| e.to_string())?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| e.to_string())?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/reactor.v1.Agent/ApplyPod");
    match tokio::time::timeout(HANG, grpc.unary(tonic::Request::new(body), path, Raw)).await {
        Err(_) => Err(format!("no answer within {HANG:?}")),
        Ok(Ok(_)) => Ok(Code::Ok),
        Ok(Err(s)) => Ok(s.code()),
    }
}

/// Bytes that are not HTTP/2: the agent must close that connection (and only that one).
async fn garbage(socket: &Path) -> Result<(), String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| e.to_string())?;
    let mut junk = b"GET / HTTP/1.1\r\nHost: reactor\r\n\r\n".to_vec();
    junk.extend((0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    // The agent may close before it read everything: a write error is a refusal too.
    let _ = s.write_all(&junk).await;
    let mut buf = vec![0u8; 4096];
    let closed = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(HANG, closed)
        .await
        .map_err(|_| format!("connection not closed within {HANG:?}"))
}

/// Every malformed request once; returns what went wrong.
async fn malformed_round(socket: &Path) -> Vec<String> {
    let mut wrong = Vec::new();
    if let Err(e) = garbage(socket).await {
        wrong.push(format!("garbage bytes: {e}"));
    }
    // Field 1 (`pod`, bytes) claiming 2^35 bytes that are not there.
    let corrupt = vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x01, 0x02];
    match raw_apply(socket, corrupt).await {
        Ok(Code::InvalidArgument) => {}
        other => wrong.push(format!("corrupt protobuf: {other:?}, want InvalidArgument")),
    }
    match raw_apply(socket, vec![0u8; MAX_MESSAGE_BYTES + 1]).await {
        Ok(Code::ResourceExhausted) => {}
        other => wrong.push(format!(
            "oversized message: {other:?}, want ResourceExhausted"
        )),
    }
    // Within the transport's limit but beyond the pod document's: the agent's own check.
    let mut c = client(socket).await;
    let big = apply_request(vec![b' '; MAX_DOCUMENT_BYTES + 1]);
    match tokio::time::timeout(HANG, c.apply_pod(big)).await {
        Ok(Err(s)) if s.code() == Code::ResourceExhausted => {}
        Ok(Err(s)) => wrong.push(format!(
            "oversized document: {:?} {}",
            s.code(),
            s.message()
        )),
        Ok(Ok(_)) => wrong.push("oversized document: admitted".into()),
        Err(_) => wrong.push(format!("oversized document: no answer within {HANG:?}")),
    }
    wrong
}

fn pod_named<'a>(
    pods: &'a [pb::PodSummary],
    namespace: &str,
    name: &str,
) -> Option<&'a pb::PodSummary> {
    pods.iter().find(|p| {
        p.pod
            .as_ref()
            .is_some_and(|r| r.namespace == namespace && r.name == name)
    })
}

#[test]
fn fifty_clients_and_malformed_requests_leave_the_agent_serving_and_evicting() {
    if !ready() {
        return;
    }
    let agent = TestAgent::start("api-load", NODE);
    let pid = agent.pid();
    let socket = agent.socket.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let memhog = memhog_bin().display().to_string();

    // A Burstable pod holding 48 MiB: it must survive the eviction.
    rt.block_on(async {
        let mut c = client(&socket).await;
        let steady = doc(
            "default",
            "steady",
            vec![memhog.clone(), "48".into(), "0".into()],
            json!({"requests": {"memory": "64Mi"}, "limits": {"memory": "128Mi"}}),
        );
        let r = c.apply_pod(apply_request(steady)).await.unwrap();
        assert!(r.get_ref().admitted, "{:?}", r.get_ref());
    });
    agent.wait("the Burstable pod to hold its memory", || {
        agent
            .pod("default/steady")
            .and_then(|p| p["memoryWorkingSetBytes"].as_u64())
            .is_some_and(|ws| ws >= 40 << 20)
    });
    let rss_before = status_kib(pid, "VmRSS");

    let tally = Arc::new(Mutex::new(Tally::default()));
    let started = Instant::now();
    let until = started + LOAD;
    let (malformed_rounds, malformed_wrong, hog) = rt.block_on(async {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let (socket, tally) = (socket.clone(), Arc::clone(&tally));
                tokio::spawn(async move { run_client(&socket, i, until, tally).await })
            })
            .collect();
        // Malformed requests, one round every few seconds while the clients run.
        let malformed = {
            let socket = socket.clone();
            tokio::spawn(async move {
                let (mut rounds, mut wrong) = (0, Vec::new());
                while Instant::now() < until {
                    wrong.extend(malformed_round(&socket).await);
                    rounds += 1;
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
                (rounds, wrong)
            })
        };
        // A third of the way in, the BestEffort hog: 600 MiB at 350 MiB/s on a node with
        // 384 MiB before the threshold.
        tokio::time::sleep(LOAD / 3).await;
        let mut c = client(&socket).await;
        let hog = doc(
            "default",
            "hog",
            vec![memhog.clone(), "600".into(), "350".into()],
            json!({}),
        );
        let r = tokio::time::timeout(HANG, c.apply_pod(apply_request(hog)))
            .await
            .expect("apply the hog: no answer")
            .expect("apply the hog");
        assert!(r.get_ref().admitted, "{:?}", r.get_ref());
        let hog = loop {
            let pods = tokio::time::timeout(HANG, c.list_pods(pb::ListPodsRequest::default()))
                .await
                .expect("list: no answer")
                .expect("list")
                .into_inner()
                .pods;
            let hog = pod_named(&pods, "default", "hog").cloned().unwrap();
            if hog.phase == "Failed" || Instant::now() > until + HANG {
                break hog;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        for c in clients {
            c.await.unwrap();
        }
        let (rounds, wrong) = malformed.await.unwrap();
        (rounds, wrong, hog)
    });
    let elapsed = started.elapsed();
    let rss_after = status_kib(pid, "VmRSS");
    let hwm = status_kib(pid, "VmHWM");
    let tally = Arc::try_unwrap(tally).ok().unwrap().into_inner().unwrap();
    eprintln!(
        "{CLIENTS} clients for {elapsed:?}: {} applied, {} listed, {} removed; \
         {malformed_rounds} rounds of malformed requests; agent RSS {rss_before} KiB before, \
         {rss_after} KiB after, peak {hwm} KiB",
        tally.applied, tally.listed, tally.removed
    );

    // Every request answered as it should be, the agent still up.
    assert!(
        tally.failures.is_empty(),
        "{} requests failed, first ones: {:?}\n{}",
        tally.failures.len(),
        &tally.failures[..tally.failures.len().min(10)],
        agent.log()
    );
    assert!(malformed_rounds > 0);
    assert!(malformed_wrong.is_empty(), "{malformed_wrong:?}");
    assert!(
        tally.applied >= CLIENTS,
        "every client applied at least once"
    );
    let status = agent.cli(&["status", "--json"]);
    assert!(
        status.status.success(),
        "the agent stopped serving: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(
        rss_after <= rss_before + RSS_GROWTH_BOUND_KIB,
        "agent RSS grew from {rss_before} KiB to {rss_after} KiB"
    );

    // The pods listed are exactly those the clients left, all running.
    let pods = agent.pods();
    let listed: BTreeSet<String> = pods
        .iter()
        .filter(|p| p["namespace"] == "load")
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed, tally.left);
    assert_eq!(listed.len(), CLIENTS);
    for p in pods.iter().filter(|p| p["namespace"] == "load") {
        assert_eq!(p["phase"], "Running", "{p}");
    }

    // The eviction happened under the load: the hog, by the agent, not the OOM killer.
    assert_eq!(
        hog.phase,
        "Failed",
        "the hog was never evicted: {hog:?}\n{}",
        agent.log()
    );
    assert_eq!(hog.reason, "Evicted", "{hog:?}");
    for c in &hog.containers {
        assert_ne!(c.reason, "OOMKilled", "{hog:?}");
    }
    let steady = agent.pod("default/steady").unwrap();
    assert_eq!(steady["phase"], "Running", "the Burstable pod is untouched");
    let oom_kills = reactor_tests::exposition::sample(&agent.scrape(), "reactor_oom_kills_total");
    assert_eq!(oom_kills.unwrap_or(0.0), 0.0, "the OOM killer acted first");
}
