//! The reactor loop on the real kernel: a node modelled by a test cgroup root whose kubepods
//! memory limit is the allocatable memory, pods run by the process runtime, pressure from
//! memhog inside the pods, the loop woken by the sense layer (eBPF, PSI, memcg notification).
#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns: a failed setup should panic with its backtrace"
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reactor::act::cgroups::{CgroupManager, CgroupPath, Resources};
use reactor::act::process::{ProcessRuntime, ProcessRuntimeConfig};
use reactor::act::runtime::{ContainerSpec, ContainerState, PodSpec, RestartPolicy, Runtime};
use reactor::config::{Config, GoDuration};
use reactor::decide::backoff::BackOffPolicy;
use reactor::decide::pod::PodInfo;
use reactor::observe::{ObserveSettings, Observer};
use reactor::reactor::{
    memcg_targets, spawn, Action, ActivePod, Decision, PodContainer, Reactor, ReactorHandle,
    ReactorSettings, RuntimePods,
};
use reactor::sense::{Sense, SenseOptions, Source};
use reactor_tests::cgroup_root::{TestCgroupRoot, MOUNT_ROOT};
use reactor_tests::{is_root, memhog_bin, require};
use tokio::sync::{broadcast, watch};

const MI: u64 = 1 << 20;

fn ready() -> bool {
    require(is_root(), "root, to create cgroups")
        && require(
            Path::new("/sys/fs/cgroup/memory/memory.oom_control").exists(),
            "cgroup v1 memory hierarchy under /sys/fs/cgroup",
        )
        && require(
            memhog_bin().exists(),
            "the memhog binary (cargo build --workspace --bins)",
        )
}

/// A modelled node: its own cgroup root, kubepods limited to the allocatable memory, a
/// process runtime, and the reactor loop over them.
struct Node {
    root: TestCgroupRoot,
    state: tempfile::TempDir,
    cgroups: CgroupManager,
    runtime: Arc<ProcessRuntime>,
    pods: Arc<RuntimePods<ProcessRuntime>>,
    config: Config,
    loop_: Option<Loop>,
    ebpf_attached: bool,
}

/// A running reactor loop.
struct Loop {
    handle: ReactorHandle,
    decisions: broadcast::Receiver<Decision>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<reactor::sense::Sense>,
}

struct NodeSpec {
    name: &'static str,
    capacity_mi: u64,
    hard: &'static [(&'static str, &'static str)],
    soft: &'static [(&'static str, &'static str, &'static str)],
    min_reclaim: &'static [(&'static str, &'static str)],
    transition: Duration,
    ebpf: bool,
    /// Start the loop only when the test calls `start_loop`.
    deferred: bool,
}

impl Node {
    async fn start(spec: NodeSpec) -> Node {
        let root = TestCgroupRoot::v1(spec.name).unwrap();
        let cgroups = CgroupManager::v1(
            Path::new(MOUNT_ROOT),
            &CgroupPath::parse(&root.name).unwrap(),
        )
        .unwrap();
        cgroups
            .ensure_pod_tree(&Resources {
                memory_limit_bytes: Some(i64::try_from(spec.capacity_mi * MI).unwrap()),
                ..Default::default()
            })
            .unwrap();
        let state = tempfile::tempdir().unwrap();
        let runtime = Arc::new(
            ProcessRuntime::open(ProcessRuntimeConfig {
                cgroups: cgroups.clone(),
                state_dir: state.path().to_path_buf(),
                backoff: BackOffPolicy {
                    initial: Duration::from_millis(100),
                    max: Duration::from_secs(1),
                },
            })
            .await
            .unwrap(),
        );
        let pods = Arc::new(RuntimePods::new(runtime.clone(), cgroups.clone()));

        let map = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let mut config = Config {
            cgroup_root: format!("/{}", root.name),
            eviction_hard: map(spec.hard),
            ..Config::default()
        };
        config.node.memory_capacity = format!("{}Mi", spec.capacity_mi);
        config.node.nodefs_path = state.path().to_path_buf();
        config.eviction_soft = spec
            .soft
            .iter()
            .map(|(k, v, _)| (k.to_string(), v.to_string()))
            .collect();
        config.eviction_soft_grace_period = spec
            .soft
            .iter()
            .map(|(k, _, g)| (k.to_string(), g.to_string()))
            .collect();
        config.eviction_minimum_reclaim = map(spec.min_reclaim);
        config.eviction_pressure_transition_period = GoDuration(spec.transition);
        config.housekeeping_interval = GoDuration(Duration::from_secs(1));
        config.sense.ebpf = spec.ebpf;

        let mut node = Node {
            root,
            state,
            cgroups,
            runtime,
            pods,
            config,
            loop_: None,
            ebpf_attached: false,
        };
        if !spec.deferred {
            node.start_loop();
        }
        node
    }

    /// Starts the reactor loop over the node.
    fn start_loop(&mut self) {
        let (config, state) = (&self.config, &self.state);
        let settings = ReactorSettings::from_config(config).unwrap();
        let mut observe = ObserveSettings::from_config(config, None, None).unwrap();
        observe.imagefs = state.path().to_path_buf();
        observe.containerfs = state.path().to_path_buf();
        let observer = Observer::new(observe).unwrap();
        let targets = memcg_targets(&settings, &observer);
        assert!(!targets.is_empty(), "memory thresholds give memcg targets");
        let sense = Sense::start(&SenseOptions::from_config(config, targets)).unwrap();
        self.ebpf_attached = sense.report().has(Source::Ebpf);
        let reactor = Reactor::new(
            settings,
            observer,
            self.pods.clone(),
            self.cgroups.clone(),
            None,
        );
        let (tx, rx) = watch::channel(false);
        let (handle, task) = spawn(reactor, sense, rx);
        let decisions = handle.subscribe();
        self.loop_ = Some(Loop {
            handle,
            decisions,
            shutdown: tx,
            task,
        });
    }

    fn lp(&mut self) -> &mut Loop {
        self.loop_.as_mut().unwrap()
    }

    /// Runs a pod of one container (`memhog` with `args`) in its QoS tier.
    async fn run(
        &self,
        uid: &str,
        qos_dir: Option<&str>,
        resources: serde_json::Value,
        args: &[&str],
        policy: RestartPolicy,
    ) {
        self.run_limited(uid, qos_dir, resources, args, policy, None)
            .await;
    }

    /// Like `run`, with a memory limit on the container cgroup.
    async fn run_limited(
        &self,
        uid: &str,
        qos_dir: Option<&str>,
        resources: serde_json::Value,
        args: &[&str],
        policy: RestartPolicy,
        memory_limit: Option<i64>,
    ) {
        let info = PodInfo::from_json(serde_json::json!({
            "metadata": {"name": format!("pod-{uid}"), "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "app", "resources": resources}]}
        }))
        .unwrap();
        let cgroup = CgroupPath::pod(qos_dir, uid).unwrap();
        self.cgroups.create(&cgroup).unwrap();
        let mut command = vec![memhog_bin().display().to_string()];
        command.extend(args.iter().map(|a| a.to_string()));
        self.runtime
            .run_pod(PodSpec {
                uid: uid.into(),
                namespace: "default".into(),
                name: format!("pod-{uid}"),
                cgroup: cgroup.clone(),
                restart_policy: policy,
                containers: vec![ContainerSpec {
                    name: "app".into(),
                    image: String::new(),
                    command,
                    args: vec![],
                    env: vec![],
                    resources: Resources {
                        memory_limit_bytes: memory_limit,
                        ..Resources::default()
                    },
                    oom_score_adj: 0,
                    ..ContainerSpec::default()
                }],
            })
            .await
            .unwrap();
        self.pods.add(ActivePod {
            info,
            cgroup,
            containers: vec![PodContainer::named("app")],
            restart_policy: policy,
            termination_grace_period: Some(30),
        });
    }

    fn usage(&self, cgroup: &CgroupPath) -> u64 {
        self.cgroups
            .memory_usage(cgroup)
            .map_or(0, |m| m.usage_bytes)
    }

    /// Waits for the pod's usage to reach `bytes`.
    async fn wait_usage(&self, uid: &str, qos_dir: Option<&str>, bytes: u64) {
        let cgroup = CgroupPath::pod(qos_dir, uid).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.usage(&cgroup) < bytes {
            assert!(
                Instant::now() < deadline,
                "pod {uid} never reached {bytes} bytes"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The next decision whose action is not `None`, up to `timeout`.
    async fn next_action(&mut self, timeout: Duration) -> Option<Decision> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let d = tokio::time::timeout_at(deadline, self.lp().decisions.recv())
                .await
                .ok()?;
            match d {
                Ok(d) if d.action != Action::None => return Some(d),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    async fn is_running(&self, uid: &str) -> bool {
        match self.runtime.pod_status(uid).await {
            Ok(s) => s
                .containers
                .iter()
                .all(|c| matches!(c.state, ContainerState::Running { .. })),
            Err(_) => false,
        }
    }

    async fn finish(self) {
        if let Some(l) = self.loop_ {
            l.shutdown.send_replace(true);
            let _ = l.task.await;
        }
        for p in reactor::reactor::PodControl::pods(&*self.pods) {
            let _ = self.runtime.stop_pod(&p.info.uid, Duration::ZERO).await;
            self.pods.remove(&p.info.uid);
        }
        self.cgroups
            .remove(&CgroupPath::kubepods(), Duration::from_secs(5))
            .unwrap();
        assert!(
            self.root.leftovers().is_empty(),
            "{:?}",
            self.root.leftovers()
        );
    }
}

fn guaranteed() -> serde_json::Value {
    serde_json::json!({"requests": {"cpu": "100m", "memory": "100Mi"}, "limits": {"cpu": "100m", "memory": "100Mi"}})
}

fn burstable(request: &str) -> serde_json::Value {
    serde_json::json!({"requests": {"memory": request}})
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs `reps` repetitions of a fast BestEffort hog beside a Guaranteed and a Burstable pod;
/// returns how many times the hog was evicted with no kernel OOM kill, and the lags.
async fn besteffort_storm(node: &mut Node, reps: usize) -> (usize, Vec<u64>, Vec<String>) {
    node.run("g", None, guaranteed(), &["48", "0"], RestartPolicy::Always)
        .await;
    node.run(
        "b",
        Some("burstable"),
        burstable("64Mi"),
        &["48", "0"],
        RestartPolicy::Always,
    )
    .await;
    node.wait_usage("g", None, 48 * MI).await;
    node.wait_usage("b", Some("burstable"), 48 * MI).await;
    let mut ok = 0;
    let mut lags = Vec::new();
    let mut sources = Vec::new();
    for rep in 0..reps {
        let uid = format!("be{rep}");
        // 600 MiB at 350 MiB/s: the 512 MiB node runs out in about a second.
        node.run(
            &uid,
            Some("besteffort"),
            serde_json::json!({}),
            &["600", "350"],
            RestartPolicy::Always,
        )
        .await;
        let mut evicted = false;
        let mut oom = false;
        while let Some(d) = node.next_action(Duration::from_secs(10)).await {
            match &d.action {
                Action::Evicted {
                    uid: victim,
                    message,
                    released,
                    ..
                } => {
                    assert_eq!(victim, &uid, "only the BestEffort pod is evicted: {d:?}");
                    assert!(
                        message.starts_with("The node was low on resource: memory. Threshold quantity: 128Mi, available: "),
                        "{message}"
                    );
                    assert!(message.contains("Container app was using"), "{message}");
                    assert!(*released, "the victim's cgroup emptied");
                    let status = node.pods.eviction_status(&uid).unwrap();
                    assert_eq!(
                        (status.phase.as_str(), status.reason.as_str()),
                        ("Failed", "Evicted")
                    );
                    assert_eq!(status.message, *message);
                    assert_eq!(
                        d.ranking.first().map(|p| p.uid.as_str()),
                        Some(uid.as_str())
                    );
                    eprintln!(
                        "rep {rep}: timer={} coalesced={} detection={:?} event={:?} observed-after-event={:?} reaction={:?} decide-to-kill={:?} release={:?}",
                        d.wake.timer,
                        d.wake.coalesced,
                        d.wake.detection_lag_ns,
                        d.wake.event.as_ref().map(|e| e.kind.to_string()),
                        d.wake.event.as_ref().map(|e| d.observed_at_ns.saturating_sub(e.at_ns)),
                        d.reaction_lag_ns,
                        d.decide_to_kill_ns,
                        d.release_ns
                    );
                    if let Some(l) = d.reaction_lag_ns {
                        lags.push(l);
                    }
                    sources.push(
                        d.wake
                            .event
                            .as_ref()
                            .map_or("timer".to_string(), |e| e.source.name().to_string()),
                    );
                    evicted = true;
                    break;
                }
                Action::OomKilled { .. } => {
                    oom = true;
                    eprintln!("rep {rep}: kernel OOM kill: {d:?}");
                    break;
                }
                _ => {}
            }
        }
        if evicted && !oom {
            ok += 1;
        } else {
            eprintln!("rep {rep}: evicted={evicted} oom={oom}");
            let _ = node.runtime.stop_pod(&uid, Duration::ZERO).await;
            node.pods.remove(&uid);
            let _ = node.cgroups.remove(
                &CgroupPath::pod(Some("besteffort"), &uid).unwrap(),
                Duration::from_secs(2),
            );
        }
        assert!(
            node.is_running("g").await,
            "the Guaranteed pod is untouched"
        );
        assert!(node.is_running("b").await, "the Burstable pod is untouched");
    }
    (ok, lags, sources)
}

fn report(mode: &str, ok: usize, reps: usize, lags: &mut [u64], sources: &[String]) {
    lags.sort_unstable();
    let mut by_source: BTreeMap<&str, usize> = BTreeMap::new();
    for s in sources {
        *by_source.entry(s.as_str()).or_default() += 1;
    }
    eprintln!(
        "{mode}: evicted before any OOM kill in {ok}/{reps}; reaction lag (kernel event -> SIGKILL) \
         p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms over {} decisions; woken by {by_source:?}",
        percentile(lags, 0.5) as f64 / 1e6,
        percentile(lags, 0.99) as f64 / 1e6,
        lags.last().copied().unwrap_or(0) as f64 / 1e6,
        lags.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn besteffort_hog_is_evicted_before_the_oom_killer_20_times() {
    if !ready() {
        return;
    }
    let mut node = Node::start(NodeSpec {
        name: "reactor-storm",
        capacity_mi: 512,
        hard: &[("allocatableMemory.available", "128Mi")],
        soft: &[],
        min_reclaim: &[],
        transition: Duration::from_secs(2),
        ebpf: true,
        deferred: false,
    })
    .await;
    let (ok, mut lags, sources) = besteffort_storm(&mut node, 20).await;
    report(
        if node.ebpf_attached {
            "eBPF on"
        } else {
            "eBPF requested, not attached"
        },
        ok,
        20,
        &mut lags,
        &sources,
    );
    node.finish().await;
    assert!(ok >= 19, "evicted before the OOM killer in only {ok} of 20");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_ebpf_psi_and_memcg_notifications_still_evict() {
    if !ready() {
        return;
    }
    let mut node = Node::start(NodeSpec {
        name: "reactor-noebpf",
        capacity_mi: 512,
        hard: &[("allocatableMemory.available", "128Mi")],
        soft: &[],
        min_reclaim: &[],
        transition: Duration::from_secs(2),
        ebpf: false,
        deferred: false,
    })
    .await;
    assert!(!node.ebpf_attached);
    let (ok, mut lags, sources) = besteffort_storm(&mut node, 5).await;
    report("eBPF off", ok, 5, &mut lags, &sources);
    node.finish().await;
    assert!(ok >= 4, "evicted before the OOM killer in only {ok} of 5");
    assert!(sources.iter().all(|s| s != "ebpf"), "{sources:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evictions_follow_the_ranking_one_pod_at_a_time() {
    if !ready() {
        return;
    }
    let mut node = Node::start(NodeSpec {
        name: "reactor-order",
        capacity_mi: 512,
        // Met with the pods below; the minimum reclaim can never be satisfied, so the loop
        // keeps evicting, one pod per evaluation, down the ranking.
        hard: &[("allocatableMemory.available", "400Mi")],
        soft: &[],
        min_reclaim: &[("allocatableMemory.available", "200Mi")],
        transition: Duration::from_secs(2),
        ebpf: true,
        deferred: true,
    })
    .await;
    // Burstable 200Mi over its 50Mi request (excess 150Mi), BestEffort 80Mi (excess 80Mi),
    // Guaranteed within its request: the ranking is burstable, besteffort, guaranteed.
    node.run("g", None, guaranteed(), &["40", "0"], RestartPolicy::Always)
        .await;
    node.run(
        "b",
        Some("burstable"),
        burstable("50Mi"),
        &["200", "0"],
        RestartPolicy::Always,
    )
    .await;
    node.run(
        "be",
        Some("besteffort"),
        serde_json::json!({}),
        &["80", "0"],
        RestartPolicy::Always,
    )
    .await;
    node.wait_usage("g", None, 40 * MI).await;
    node.wait_usage("b", Some("burstable"), 200 * MI).await;
    node.wait_usage("be", Some("besteffort"), 80 * MI).await;
    node.start_loop();
    let mut order = Vec::new();
    let mut last_release_at = 0u64;
    while let Some(d) = node.next_action(Duration::from_secs(15)).await {
        match &d.action {
            Action::Evicted { uid, released, .. } => {
                assert!(*released);
                assert!(
                    d.observed_at_ns >= last_release_at,
                    "one pod at a time: {d:?}"
                );
                last_release_at = d.observed_at_ns + d.release_ns.unwrap_or(0);
                assert_eq!(d.ranking.first().map(|p| p.uid.clone()), Some(uid.clone()));
                order.push(uid.clone());
                if order.len() == 3 {
                    break;
                }
            }
            Action::OomKilled { .. } => panic!("kernel OOM kill: {d:?}"),
            _ => {}
        }
    }
    node.finish().await;
    assert_eq!(order, ["b", "be", "g"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_threshold_shorter_than_its_grace_evicts_nothing_and_conditions_clear() {
    if !ready() {
        return;
    }
    let mut node = Node::start(NodeSpec {
        name: "reactor-soft",
        capacity_mi: 512,
        hard: &[("allocatableMemory.available", "16Mi")],
        soft: &[("allocatableMemory.available", "400Mi", "4s")],
        min_reclaim: &[],
        transition: Duration::from_secs(3),
        ebpf: true,
        deferred: false,
    })
    .await;
    let mut conditions = node.lp().handle.conditions();
    // 200Mi held for one second, then the process ends (restartPolicy Never).
    node.run(
        "be",
        Some("besteffort"),
        serde_json::json!({}),
        &["200", "0", "1"],
        RestartPolicy::Never,
    )
    .await;
    let pressure = tokio::time::timeout(
        Duration::from_secs(10),
        conditions.wait_for(|c| c.iter().any(|c| c == "MemoryPressure")),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    assert!(pressure, "MemoryPressure was never reported");
    let cgroup = CgroupPath::pod(Some("besteffort"), "be").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while node.usage(&cgroup) > 100 * MI {
        assert!(
            Instant::now() < deadline,
            "the pod never gave its memory back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Pressure is over but the transition period (3s) keeps the condition.
    assert!(conditions.borrow().iter().any(|c| c == "MemoryPressure"));
    let cleared = tokio::time::timeout(
        Duration::from_secs(15),
        conditions.wait_for(|c| c.is_empty()),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    assert!(cleared, "MemoryPressure never cleared");
    let mut actions = Vec::new();
    while let Ok(d) = node.lp().decisions.try_recv() {
        if d.action != Action::None {
            actions.push(d.action);
        }
    }
    assert!(actions.is_empty(), "{actions:?}");
    assert!(node.pods.evictions().is_empty());
    node.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_oom_kill_is_mapped_to_its_pod_and_container() {
    if !ready() {
        return;
    }
    let mut node = Node::start(NodeSpec {
        name: "reactor-oom",
        capacity_mi: 512,
        hard: &[("allocatableMemory.available", "16Mi")],
        soft: &[],
        min_reclaim: &[],
        transition: Duration::from_secs(2),
        ebpf: true,
        deferred: false,
    })
    .await;
    require(
        node.ebpf_attached,
        "eBPF attached (oom:mark_victim names the victim's cgroup)",
    );
    // A container limited to 32Mi that wants 128Mi: the kernel kills it, not the agent.
    node.run_limited(
        "o",
        Some("burstable"),
        burstable("16Mi"),
        &["128", "0"],
        RestartPolicy::Always,
        Some(32 << 20),
    )
    .await;
    let mut found = None;
    while let Some(d) = node.next_action(Duration::from_secs(15)).await {
        if let Action::OomKilled { .. } = d.action {
            found = Some(d);
            break;
        }
    }
    let d = found.expect("an OOMKilled record");
    let Action::OomKilled {
        uid,
        container,
        restarting,
        reason,
        ..
    } = &d.action
    else {
        unreachable!()
    };
    assert_eq!(uid.as_deref(), Some("o"));
    assert_eq!(container.as_deref(), Some("app"));
    assert_eq!(
        *restarting,
        Some(true),
        "restartPolicy Always brings it back"
    );
    assert_eq!(reason, "OOMKilled");
    assert!(d.unprevented_ooms >= 1);
    assert_eq!(d.wake.event.as_ref().map(|e| e.source), Some(Source::Ebpf));
    node.finish().await;
}
