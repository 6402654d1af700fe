//! A modelled node for the reactor loop on the real kernel: its own test cgroup root whose
//! kubepods memory limit is the allocatable memory, pods run by the process runtime (each a
//! `memhog`), and the reactor loop woken by the sense layer. Shared by the eviction tests and
//! the OOM-avoidance benchmark so both drive the same storm on the same setup.
//!
//! Everything lives below the node's own cgroup root and temp state dir and is removed by
//! [`Node::finish`] (and the root's guard on drop).

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
    memcg_targets, spawn, thread::LoopThread, Action, ActivePod, Decision, PodContainer, Reactor,
    ReactorHandle, ReactorSettings, RuntimePods,
};
use reactor::sense::{Sense, SenseOptions, Source};
use tokio::sync::{broadcast, watch};

use crate::cgroup_root::{TestCgroupRoot, MOUNT_ROOT};
use crate::memhog_bin;

/// One mebibyte.
pub const MI: u64 = 1 << 20;

/// A modelled node: its own cgroup root, kubepods limited to the allocatable memory, a
/// process runtime, and the reactor loop over them.
pub struct Node {
    /// The node's cgroup root (its `cgroupRoot`).
    pub root: TestCgroupRoot,
    /// The runtime's state dir, also the node's filesystems.
    pub state: tempfile::TempDir,
    /// The cgroup writer rooted at the node's root.
    pub cgroups: CgroupManager,
    /// The process runtime running the pods.
    pub runtime: Arc<ProcessRuntime>,
    /// The pods the loop may evict.
    pub pods: Arc<RuntimePods<ProcessRuntime>>,
    /// The config the loop is built from.
    pub config: Config,
    /// The running loop, if started.
    pub loop_: Option<Loop>,
    /// Whether the last loop started had the eBPF source attached.
    pub ebpf_attached: bool,
    /// The sources the last loop started with.
    pub attached: Vec<Source>,
    /// Metrics the next loop started keeps up to date (none unless a test sets them).
    pub metrics: Option<Arc<reactor::record::metrics::Metrics>>,
    /// Run the next loops as `reactor run` does: on a thread of their own
    /// ([`LoopThread`]) at this `SCHED_FIFO` priority (0: normal scheduling), the node's pod
    /// manager and runtime staying on the caller's runtime. `None`: the loop is a task on
    /// the caller's runtime, at whatever scheduling its threads have.
    pub loop_thread: Option<u8>,
}

/// A running reactor loop.
pub struct Loop {
    /// Its outputs.
    pub handle: ReactorHandle,
    /// Its decisions, subscribed before it started.
    pub decisions: broadcast::Receiver<Decision>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<reactor::sense::Sense>,
    /// The loop's own thread, when it has one: held only to live as long as the loop.
    _thread: Option<LoopThread>,
}

/// How to model the node.
pub struct NodeSpec {
    /// Part of the cgroup root's name.
    pub name: &'static str,
    /// The node's memory capacity, also kubepods' limit, MiB.
    pub capacity_mi: u64,
    /// `evictionHard`.
    pub hard: &'static [(&'static str, &'static str)],
    /// `evictionSoft` with each one's grace period.
    pub soft: &'static [(&'static str, &'static str, &'static str)],
    /// `evictionMinimumReclaim`.
    pub min_reclaim: &'static [(&'static str, &'static str)],
    /// `evictionPressureTransitionPeriod`.
    pub transition: Duration,
    /// `sense.ebpf`.
    pub ebpf: bool,
    /// Start the loop only when the caller calls [`Node::start_loop`].
    pub deferred: bool,
}

impl Node {
    /// Creates the node (cgroup root, kubepods limited to the capacity, process runtime) and,
    /// unless deferred, starts the loop with the sense sources the config asks for.
    pub async fn start(spec: NodeSpec) -> Node {
        let root = TestCgroupRoot::v1(spec.name).expect("node setup");
        let cgroups = CgroupManager::v1(
            Path::new(MOUNT_ROOT),
            &CgroupPath::parse(&root.name).expect("node setup"),
        )
        .expect("node setup");
        cgroups
            .ensure_pod_tree(&Resources {
                memory_limit_bytes: Some(i64::try_from(spec.capacity_mi * MI).expect("node setup")),
                ..Default::default()
            })
            .expect("node setup");
        let state = tempfile::tempdir().expect("node setup");
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
            .expect("node setup"),
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
            attached: Vec::new(),
            metrics: None,
            loop_thread: None,
        };
        if !spec.deferred {
            node.start_loop();
        }
        node
    }

    /// Starts the reactor loop over the node.
    pub fn start_loop(&mut self) {
        self.start_loop_with(|_, _| {});
    }

    /// An observer of the node as its loop's: the config's settings, image and container
    /// filesystems on the node's state directory.
    pub fn observer(&self) -> Observer {
        let mut observe =
            ObserveSettings::from_config(&self.config, None, None).expect("node setup");
        observe.imagefs = self.state.path().to_path_buf();
        observe.containerfs = self.state.path().to_path_buf();
        Observer::new(observe).expect("node setup")
    }

    /// Starts the reactor loop with the sense options and loop settings the config gives,
    /// adjusted by `adjust` (restrict the sources, change the tick).
    pub fn start_loop_with(
        &mut self,
        adjust: impl FnOnce(&mut SenseOptions, &mut ReactorSettings),
    ) {
        assert!(self.loop_.is_none(), "a loop is already running");
        let config = &self.config;
        let mut settings = ReactorSettings::from_config(config).expect("node setup");
        let observer = self.observer();
        let targets = memcg_targets(&settings, &observer);
        assert!(!targets.is_empty(), "memory thresholds give memcg targets");
        let mut opts = SenseOptions::from_config(config, targets);
        adjust(&mut opts, &mut settings);
        let thread = self
            .loop_thread
            .map(|priority| LoopThread::start(priority).expect("the loop's thread"));
        let sense = match &thread {
            Some(t) => t.start_sense(&opts),
            None => Sense::start(&opts),
        }
        .expect("node setup");
        self.ebpf_attached = sense.report().has(Source::Ebpf);
        self.attached = Source::ALL
            .into_iter()
            .filter(|&s| sense.report().has(s))
            .collect();
        let reactor = Reactor::new(
            settings,
            observer,
            self.pods.clone(),
            self.cgroups.clone(),
            None,
        );
        let reactor = match &self.metrics {
            Some(m) => reactor.with_metrics(m.clone()),
            None => reactor,
        };
        let (tx, rx) = watch::channel(false);
        // Subscribed before the loop runs: its first pass, at start, may already evict.
        let decisions = reactor.handle().subscribe();
        let (handle, task) = match &thread {
            Some(t) => t.spawn(reactor, sense, rx),
            None => spawn(reactor, sense, rx),
        };
        self.loop_ = Some(Loop {
            handle,
            decisions,
            shutdown: tx,
            task,
            _thread: thread,
        });
    }

    /// Stops the running loop (if any) and waits for it to end.
    pub async fn stop_loop(&mut self) {
        self.stop_loop_draining().await;
    }

    /// Stops the running loop (if any), waits for it to end, and returns the decisions it
    /// made that nobody had received yet (those recorded while it was stopping included).
    pub async fn stop_loop_draining(&mut self) -> Vec<Decision> {
        let mut left = Vec::new();
        if let Some(mut l) = self.loop_.take() {
            l.shutdown.send_replace(true);
            let _ = l.task.await;
            loop {
                match l.decisions.try_recv() {
                    Ok(d) => left.push(d),
                    Err(broadcast::error::TryRecvError::Lagged(_)) => {}
                    Err(_) => break,
                }
            }
        }
        left
    }

    /// The running loop.
    pub fn lp(&mut self) -> &mut Loop {
        self.loop_.as_mut().expect("the loop is running")
    }

    /// Runs a pod of one container (`memhog` with `args`) in its QoS tier.
    pub async fn run(
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

    /// Like `run`, with environment variables for the container (`memhog`'s progress
    /// record, say).
    pub async fn run_env(
        &self,
        uid: &str,
        qos_dir: Option<&str>,
        resources: serde_json::Value,
        args: &[&str],
        env: &[(&str, &str)],
        policy: RestartPolicy,
    ) {
        self.run_pod(uid, qos_dir, resources, args, env, policy, None)
            .await;
    }

    /// Like `run`, with a memory limit on the container cgroup. The container's
    /// `oom_score_adj` is 0 whatever its QoS class: the kubelet's -997 for Guaranteed pods
    /// needs CAP_SYS_RESOURCE, which a test process may lack, and 0 keeps every pod an equal
    /// candidate for the kernel OOM killer, so a kill shows the agent was too late.
    pub async fn run_limited(
        &self,
        uid: &str,
        qos_dir: Option<&str>,
        resources: serde_json::Value,
        args: &[&str],
        policy: RestartPolicy,
        memory_limit: Option<i64>,
    ) {
        self.run_pod(uid, qos_dir, resources, args, &[], policy, memory_limit)
            .await;
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_pod(
        &self,
        uid: &str,
        qos_dir: Option<&str>,
        resources: serde_json::Value,
        args: &[&str],
        env: &[(&str, &str)],
        policy: RestartPolicy,
        memory_limit: Option<i64>,
    ) {
        let info = PodInfo::from_json(serde_json::json!({
            "metadata": {"name": format!("pod-{uid}"), "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "app", "resources": resources}]}
        }))
        .expect("node setup");
        let cgroup = CgroupPath::pod(qos_dir, uid).expect("node setup");
        self.cgroups.create(&cgroup).expect("node setup");
        // Known to the loop before its processes run, as the pod manager makes it: a
        // container the kernel OOM-kills at once is still recorded as this pod's.
        self.pods.add(ActivePod {
            info,
            cgroup: cgroup.clone(),
            containers: vec![PodContainer::named("app")],
            restart_policy: policy,
            termination_grace_period: Some(30),
        });
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
                    env: env
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    resources: Resources {
                        memory_limit_bytes: memory_limit,
                        ..Resources::default()
                    },
                    oom_score_adj: 0,
                    ..ContainerSpec::default()
                }],
                document: None,
            })
            .await
            .expect("node setup");
    }

    /// Sets a running pod's `terminationGracePeriodSeconds` as the loop sees it (the pods
    /// run here start with 30), which caps a soft eviction's grace period.
    pub fn set_termination_grace(&self, uid: &str, seconds: i64) {
        if let Some(mut p) = self.pods.remove(uid) {
            p.termination_grace_period = Some(seconds);
            self.pods.add(p);
        }
    }

    /// A cgroup's memory usage in bytes (0 when it cannot be read).
    pub fn usage(&self, cgroup: &CgroupPath) -> u64 {
        self.cgroups
            .memory_usage(cgroup)
            .map_or(0, |m| m.usage_bytes)
    }

    /// Waits for the pod's usage to reach `bytes`.
    pub async fn wait_usage(&self, uid: &str, qos_dir: Option<&str>, bytes: u64) {
        let cgroup = CgroupPath::pod(qos_dir, uid).expect("node setup");
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
    pub async fn next_action(&mut self, timeout: Duration) -> Option<Decision> {
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

    /// The second record of pod `uid`'s eviction ([`Action::Released`]: its memory back, or
    /// still pending at the bound), up to `timeout`; the decisions before it are dropped.
    pub async fn released(&mut self, uid: &str, timeout: Duration) -> Option<Decision> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let d = tokio::time::timeout_at(deadline, self.lp().decisions.recv())
                .await
                .ok()?;
            match d {
                Ok(d) if matches!(&d.action, Action::Released { uid: u, .. } if u == uid) => {
                    return Some(d)
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// Whether every container of the pod runs.
    pub async fn is_running(&self, uid: &str) -> bool {
        match self.runtime.pod_status(uid).await {
            Ok(s) => s
                .containers
                .iter()
                .all(|c| matches!(c.state, ContainerState::Running { .. })),
            Err(_) => false,
        }
    }

    /// Stops the loop and every pod, removes kubepods and checks nothing is left.
    pub async fn finish(mut self) {
        self.stop_loop().await;
        for p in reactor::reactor::PodControl::pods(&*self.pods).iter() {
            let _ = self.runtime.stop_pod(&p.info.uid, Duration::ZERO).await;
            self.pods.remove(&p.info.uid);
        }
        self.cgroups
            .remove(&CgroupPath::kubepods(), Duration::from_secs(5))
            .expect("node setup");
        assert!(
            self.root.leftovers().is_empty(),
            "{:?}",
            self.root.leftovers()
        );
    }
}

/// Resources of a Guaranteed pod (100m CPU, 100Mi).
pub fn guaranteed() -> serde_json::Value {
    serde_json::json!({"requests": {"cpu": "100m", "memory": "100Mi"}, "limits": {"cpu": "100m", "memory": "100Mi"}})
}

/// Resources of a Burstable pod requesting `request` of memory.
pub fn burstable(request: &str) -> serde_json::Value {
    serde_json::json!({"requests": {"memory": request}})
}
