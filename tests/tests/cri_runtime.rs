//! The CRI runtime against a real containerd (a private one per test, stopped by its pid):
//! the pod lifecycle the process runtime's tests cover, through CRI — containers in
//! `<pod cgroup>/<container id>` with `decide`'s values, restarts with back-off, an OOM kill
//! recorded as `OOMKilled`, stop with a grace period, re-adoption by a new runtime object, and
//! a runtime outage. Every test works below its own cgroup root and checks nothing is left.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns: a failed setup should panic with its backtrace"
)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reactor::act::cgroups::{CgroupManager, CgroupPath, Resources};
use reactor::act::cri::{ContainerFilter, SandboxFilter};
use reactor::act::cri_runtime::{CriRuntime, CriRuntimeConfig, LABEL_MANAGED_BY, MANAGED_BY};
use reactor::act::pod_spec::pod_spec;
use reactor::act::runtime::{
    BindMount, ContainerSpec, ContainerState, DeviceNode, PodPhase, PodSpec, PodStatus,
    RestartPolicy, Runtime, RuntimeError,
};
use reactor::decide::backoff::BackOffPolicy;
use reactor::decide::cgroups::{
    container_config, files, pod_config, CgroupVersion, FileValue, NodeSettings,
    DEFAULT_QUOTA_PERIOD_US,
};
use reactor::decide::oom_score::oom_score_adj;
use reactor::decide::pod::PodInfo;
use reactor::decide::quantity::Quantity;
use reactor_tests::cgroup_root::{TestCgroupRoot, MOUNT_ROOT};
use reactor_tests::freezer::Freezer;
use reactor_tests::{containerd_available, require, Containerd, TestImage};

const IMAGE: &str = "localhost/reactor/app:1";

fn ready() -> bool {
    require(
        containerd_available(),
        "root, containerd, runc and busybox-static for the CRI tests",
    ) && require(
        Path::new("/sys/fs/cgroup/memory/memory.oom_control").exists(),
        "cgroup v1 memory hierarchy under /sys/fs/cgroup",
    )
}

fn node() -> NodeSettings {
    NodeSettings {
        version: CgroupVersion::V1,
        allocatable_cpu: Some(Quantity::parse("2").unwrap()),
        allocatable_memory: Some(Quantity::parse("4Gi").unwrap()),
        qos_reserved_memory_percent: Some(100),
        enforce_cpu_limits: true,
        cpu_period_us: DEFAULT_QUOTA_PERIOD_US,
        memory_capacity: Some(8 << 30),
        single_process_oom_kill: None,
        memory_qos: false,
        memory_throttling_factor: Default::default(),
        swap_behavior: Default::default(),
        swap_capacity: 0,
        swap_controller: false,
    }
}

/// A private containerd with the test image, a cgroup root, and the writer rooted there.
struct Setup {
    // Field order is drop order: containerd (and what it runs) goes before the cgroups.
    ctd: Containerd,
    root: TestCgroupRoot,
    cgroups: CgroupManager,
    logs: PathBuf,
}

fn setup(name: &str) -> Setup {
    let root = TestCgroupRoot::v1(name).unwrap();
    let cgroups = CgroupManager::v1(
        Path::new(MOUNT_ROOT),
        &CgroupPath::parse(&root.name).unwrap(),
    )
    .unwrap();
    let ctd = Containerd::start(name).expect("start containerd");
    ctd.build_and_import(&TestImage::busybox(IMAGE, 0))
        .expect("import the test image");
    let logs = ctd.dir().join("pod-logs");
    Setup {
        ctd,
        root,
        cgroups,
        logs,
    }
}

impl Setup {
    async fn runtime(&self) -> CriRuntime {
        let mut config = CriRuntimeConfig::new(
            self.ctd.client().await,
            CgroupPath::parse(&self.root.name).unwrap(),
            self.logs.clone(),
        );
        config.backoff = BackOffPolicy {
            initial: Duration::from_millis(300),
            max: Duration::from_millis(1200),
        };
        config.relist_period = Duration::from_millis(100);
        CriRuntime::open(config).await.unwrap()
    }

    /// What the pod lifecycle does for a kubectl-shaped pod: decide's pod values in the pod
    /// cgroup (the same path as pod_on_node.rs), then the runtime spec.
    fn pod_from_yaml(&self, node: &NodeSettings, yaml: &str) -> (PodInfo, CgroupPath, PodSpec) {
        let doc: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        let info = PodInfo::from_json(doc.clone()).unwrap();
        let pod_cg = CgroupPath::for_pod(&info).unwrap();
        self.cgroups
            .create_pod_cgroup(&pod_cg, &Resources::from(&pod_config(node, &info)))
            .unwrap();
        let spec = pod_spec(
            &serde_json::from_value(doc).unwrap(),
            &info,
            node,
            &BTreeMap::new(),
        )
        .unwrap();
        (info, pod_cg, spec)
    }

    /// What the pod lifecycle does before calling the runtime: the pod cgroup.
    fn pod(&self, uid: &str, policy: RestartPolicy, containers: Vec<ContainerSpec>) -> PodSpec {
        let cgroup = CgroupPath::pod(Some("burstable"), uid).unwrap();
        self.cgroups
            .create_pod_cgroup(
                &cgroup,
                &Resources {
                    cpu_shares: Some(1024),
                    ..Default::default()
                },
            )
            .unwrap();
        PodSpec {
            uid: uid.into(),
            namespace: "default".into(),
            name: format!("pod-{uid}"),
            cgroup,
            restart_policy: policy,
            containers,
            document: None,
        }
    }

    /// The memory-hierarchy directory of a cgroup below the test root.
    fn memory_dir(&self, cgroup: &CgroupPath) -> PathBuf {
        cgroup.under(&Path::new(MOUNT_ROOT).join("memory").join(&self.root.name))
    }

    /// No sandbox and no container of ours is left in containerd; then the pod cgroups go
    /// and nothing is left below the test root.
    async fn finish(self, pods: &[&PodSpec]) {
        let client = self.ctd.client().await;
        let ours = BTreeMap::from([(LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string())]);
        let sandboxes = client
            .list_pod_sandboxes(&SandboxFilter {
                labels: ours.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(sandboxes.is_empty(), "{sandboxes:?}");
        let containers = client
            .list_containers(&ContainerFilter {
                labels: ours,
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(containers.is_empty(), "{containers:?}");
        for pod in pods {
            // Only the pod cgroup itself: the runtime removed the container cgroups (runc
            // removes a just-killed container's cgroup once its last task is gone, so this
            // may trail the stop a little).
            let dir = self.memory_dir(&pod.cgroup);
            let children = || -> Vec<PathBuf> {
                std::fs::read_dir(&dir)
                    .unwrap()
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path())
                    .collect()
            };
            let deadline = Instant::now() + Duration::from_secs(5);
            while !children().is_empty() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let left = children();
            assert!(left.is_empty(), "container cgroups left: {left:?}");
            self.cgroups
                .remove_pod_cgroup(&pod.cgroup, Duration::from_secs(2))
                .unwrap();
        }
        self.cgroups
            .remove(&CgroupPath::kubepods(), Duration::from_secs(2))
            .unwrap();
        assert!(
            self.root.leftovers().is_empty(),
            "{:?}",
            self.root.leftovers()
        );
    }
}

fn busybox(name: &str, cmd: &[&str]) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        image: IMAGE.into(),
        command: cmd.iter().map(|s| s.to_string()).collect(),
        oom_score_adj: 1000,
        ..Default::default()
    }
}

async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn running_pid(s: &PodStatus, i: usize) -> u32 {
    match &s.containers[i].state {
        ContainerState::Running { pid, .. } => *pid,
        other => panic!("container {i} not running: {other:?}"),
    }
}

fn procs(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Whether SIGKILL is pending for `pid` (bit 8 of `SigPnd` or `ShdPnd` in its status).
fn sigkill_pending(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("SigPnd:") || l.starts_with("ShdPnd:"))
        .filter_map(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok())
        .any(|mask| mask & (1 << 8) != 0)
}

fn read_trim(p: impl AsRef<Path>) -> String {
    std::fs::read_to_string(p.as_ref())
        .unwrap_or_else(|e| panic!("{}: {e}", p.as_ref().display()))
        .trim()
        .to_string()
}

const PODS: &str = r#"
metadata: {name: web, namespace: prod, uid: crirt-b-0002}
spec:
  containers:
  - name: front
    image: localhost/reactor/app:1
    command: [sh, -c, 'echo serving $(POD); exec sleep 300']
    env:
    - {name: POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    resources:
      requests: {cpu: 250m, memory: 32Mi}
      limits: {cpu: "1", memory: 128Mi}
  - name: sidecar
    image: localhost/reactor/app:1
    command: [sleep, "301"]
    resources:
      requests: {cpu: 100m}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burstable_pod_runs_in_its_pod_cgroup_with_decides_values_and_stops_with_grace() {
    if !ready() {
        return;
    }
    let s = setup("crirt-life");
    let rt = s.runtime().await;
    let node = node();
    let (info, pod_cg, spec) = s.pod_from_yaml(&node, PODS);
    assert_eq!(spec.cgroup, pod_cg);
    let started = Instant::now();
    rt.run_pod(spec.clone())
        .await
        .unwrap_or_else(|e| panic!("run_pod: {e}\n{}", s.ctd.log_tail()));
    eprintln!("run_pod of two containers: {:?}", started.elapsed());
    let err = rt.run_pod(spec.clone()).await.unwrap_err();
    assert!(matches!(err, RuntimeError::AlreadyExists { .. }), "{err}");

    let status = rt.pod_status(&info.uid).await.unwrap();
    assert_eq!(status.phase, PodPhase::Running);
    let (_, ids) = rt.container_ids(&info.uid).unwrap();
    for (i, (c, ci)) in spec.containers.iter().zip(&info.containers).enumerate() {
        let pid = running_pid(&status, i);
        let cg = pod_cg.join(&ids[&c.name]).unwrap();
        let dir = s.memory_dir(&cg);
        assert!(procs(&dir).contains(&pid), "{pid} in {}", dir.display());
        // Every value decide computes for the container is in its cgroup (v1 files).
        for (file, value) in files(&container_config(&node, &info, ci), CgroupVersion::V1) {
            let want = match value {
                FileValue::Int(i) => i.to_string(),
                FileValue::Text(t) => t,
            };
            assert_eq!(s.cgroups.read_file(&cg, file).unwrap(), want, "{cg}/{file}");
        }
        let adj = oom_score_adj(&info, ci, node.memory_capacity).unwrap();
        assert!(adj > 0, "a burstable container's adj is positive: {adj}");
        assert_eq!(
            read_trim(format!("/proc/{pid}/oom_score_adj")),
            adj.to_string()
        );
    }
    let front_log = s
        .logs
        .join(format!("prod_web_{}", info.uid))
        .join("front_0.log");
    eventually("front's output in its CRI log", || async {
        std::fs::read_to_string(&front_log)
            .unwrap_or_default()
            .contains("serving web")
            .then_some(())
    })
    .await;
    let listed = rt.list_pods().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].uid, info.uid);

    // sleep is not PID 1 (one PID namespace per pod): SIGTERM ends it well within the grace.
    let t = Instant::now();
    let last = rt
        .stop_pod(&info.uid, Duration::from_secs(10))
        .await
        .unwrap();
    let took = t.elapsed();
    eprintln!("stop_pod with 10 s grace: {took:?}");
    for c in &last.containers {
        let ContainerState::Terminated(t) = &c.state else {
            panic!("{c:?}")
        };
        assert_eq!(t.exit_code, 143, "SIGTERM, not SIGKILL: {c:?}");
    }
    assert!(matches!(
        rt.pod_status(&info.uid).await,
        Err(RuntimeError::NotFound { .. })
    ));
    assert!(rt.list_pods().await.unwrap().is_empty());
    drop(rt);
    let spec_ref = &spec;
    s.finish(&[spec_ref]).await;
}

/// A stop of a container that cannot exit (its processes frozen: the SIGKILL is pending, and
/// containerd waits for the exit) holds the runtime's operations for as long as containerd
/// waits. Chaos under containerd saw `reactor pod ls` take 60–82 s there: the pod manager's
/// owner task lists through `list_pods`, which waited behind the stop. The listing now
/// answers from the last relist while the stop is still pending, and the stop ends once the
/// processes are thawed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_waiting_on_a_frozen_container_does_not_hold_up_the_listing() {
    if !ready() || !require(Freezer::available(), "the v1 freezer hierarchy") {
        return;
    }
    let s = setup("crirt-frozen");
    let rt = Arc::new(s.runtime().await);
    let uid = "crirt-f-0001";
    let spec = s.pod(
        uid,
        RestartPolicy::Never,
        vec![busybox("app", &["sleep", "3600"])],
    );
    rt.run_pod(spec.clone())
        .await
        .unwrap_or_else(|e| panic!("run_pod: {e}\n{}", s.ctd.log_tail()));
    let (_, ids) = rt.container_ids(uid).unwrap();
    let dir = s.memory_dir(&spec.cgroup.join(&ids["app"]).unwrap());
    let pids = eventually("the container's processes", || async {
        let p = procs(&dir);
        (!p.is_empty()).then_some(p)
    })
    .await;
    let freezer = Freezer::new(&format!("{}-frozen", s.root.name)).unwrap();
    for pid in &pids {
        freezer.add(*pid).unwrap();
    }
    assert!(freezer.freeze(Duration::from_secs(10)).unwrap(), "frozen");

    let stopping = Arc::clone(&rt);
    let stop = tokio::spawn(async move { stopping.stop_pod(uid, Duration::ZERO).await });
    // The stop's SIGKILL reaches the frozen processes, which cannot act on it.
    eventually(
        "the stop's SIGKILL pending on the frozen processes",
        || async { pids.iter().any(|p| sigkill_pending(*p)).then_some(()) },
    )
    .await;
    // A deadlock guard, not a measure: the old listing waited for the stop, which cannot end
    // while the processes are frozen.
    let listed = tokio::time::timeout(Duration::from_secs(30), rt.list_pods())
        .await
        .expect("the listing answered while the stop was pending")
        .unwrap();
    assert!(!stop.is_finished(), "the stop ended before the thaw");
    assert!(listed.iter().any(|p| p.uid == uid), "{listed:?}");

    drop(freezer);
    let last = tokio::time::timeout(Duration::from_secs(60), stop)
        .await
        .expect("the stop ended after the thaw")
        .unwrap()
        .unwrap_or_else(|e| panic!("stop_pod: {e}\n{}", s.ctd.log_tail()));
    assert!(
        last.containers
            .iter()
            .all(|c| matches!(c.state, ContainerState::Terminated(_))),
        "{last:?}"
    );
    assert!(rt.list_pods().await.unwrap().is_empty());
    drop(rt);
    s.finish(&[&spec]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_failure_restarts_with_back_off_and_an_oom_kill_is_recorded() {
    if !ready() {
        return;
    }
    let s = setup("crirt-restart");
    let rt = s.runtime().await;
    let mut exits = rt.subscribe_exits();
    let mut hog = busybox(
        "hog",
        // 64 MiB buffer filled from /dev/zero under a 16 MiB limit, a second after the
        // start: containerd 1.6's runc shim starts watching a container's OOM events only
        // once its start has returned, so a kill in the first moments is reported by
        // containerd itself as `Error` (seen 26 times in 30 with both CPUs busy, when dd
        // ran at once). The agent's kernel sources record such a kill whatever containerd
        // says (`reactor::oom`); this checks what the runtime reports.
        &[
            "/bin/busybox",
            "sh",
            "-c",
            "sleep 1; exec /bin/busybox dd if=/dev/zero of=/dev/null bs=64M count=1",
        ],
    );
    hog.resources.memory_limit_bytes = Some(16 << 20);
    let pod = s.pod(
        "crirt-r1",
        RestartPolicy::OnFailure,
        vec![
            busybox("crash", &["/bin/sh", "-c", "sleep 0.2; exit 1"]),
            hog,
        ],
    );
    rt.run_pod(pod.clone())
        .await
        .unwrap_or_else(|e| panic!("run_pod: {e}\n{}", s.ctd.log_tail()));

    let mut seen_oom = None;
    let mut crash_exits = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen_oom.is_none() || crash_exits < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        let e = tokio::time::timeout(left, exits.recv())
            .await
            .expect("exits within 20 s")
            .unwrap();
        assert_eq!(e.uid, pod.uid);
        assert!(e.restarting, "OnFailure restarts a failure: {e:?}");
        match e.container.as_str() {
            "crash" => {
                assert_eq!(
                    (e.terminated.exit_code, e.terminated.reason.as_str()),
                    (1, "Error")
                );
                crash_exits += 1;
            }
            "hog" => seen_oom = Some(e),
            other => panic!("{other}"),
        }
    }
    let oom = seen_oom.unwrap();
    assert_eq!(oom.terminated.reason, "OOMKilled", "{oom:?}");
    assert_eq!(oom.terminated.exit_code, 137);
    assert!(
        oom.cgroup.names().starts_with(pod.cgroup.names()),
        "the run's cgroup is below the pod's: {}",
        oom.cgroup
    );

    // Restarted as new attempts, and the back-off shows between them.
    let status = eventually("two restarts of crash", || async {
        let st = rt.pod_status(&pod.uid).await.unwrap();
        (st.containers[0].restart_count >= 2).then_some(st)
    })
    .await;
    let crash = &status.containers[0];
    let last = crash.last_termination.as_ref().expect("last termination");
    assert_eq!(last.exit_code, 1);
    assert_eq!(status.phase, PodPhase::Running);
    let back_off = eventually("crash in CrashLoopBackOff", || async {
        let st = rt.pod_status(&pod.uid).await.unwrap();
        match &st.containers[0].state {
            ContainerState::Waiting { reason, .. } if reason == "CrashLoopBackOff" => Some(()),
            _ => None,
        }
    })
    .await;
    let () = back_off;
    // Earlier attempts are removed: at most the current and the previous one per container.
    let (sandbox_id, _) = rt.container_ids(&pod.uid).unwrap();
    let listed = s
        .ctd
        .client()
        .await
        .list_containers(&ContainerFilter {
            pod_sandbox_id: Some(sandbox_id),
            ..Default::default()
        })
        .await
        .unwrap();
    for name in ["crash", "hog"] {
        let n = listed.iter().filter(|c| c.name == name).count();
        assert!(
            (1..=2).contains(&n),
            "{name}: {n} attempts kept: {listed:?}"
        );
    }

    // Grace 0: killed at once; a container waiting out its back-off reports its last run.
    let last = rt.stop_pod(&pod.uid, Duration::ZERO).await.unwrap();
    for c in &last.containers {
        assert!(matches!(c.state, ContainerState::Terminated(_)), "{c:?}");
    }
    drop(rt);
    s.finish(&[&pod]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_runtime_readopts_the_pod_and_survives_a_runtime_outage() {
    if !ready() {
        return;
    }
    let mut s = setup("crirt-adopt");
    // A device plugin's allocation: a device node, a mount and an annotation.
    let shared = s.ctd.dir().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(shared.join("hello"), "from the host").unwrap();
    let mut main = busybox("main", &["/bin/sleep", "300"]);
    main.devices = vec![DeviceNode {
        container_path: "/dev/reactor-null".into(),
        host_path: "/dev/null".into(),
        permissions: "rw".into(),
    }];
    main.mounts = vec![BindMount {
        container_path: "/shared".into(),
        host_path: shared.display().to_string(),
        read_only: true,
    }];
    main.annotations = vec![("vendor.example/dev".into(), "dev-1".into())];
    let pod = s.pod(
        "crirt-a1",
        RestartPolicy::Always,
        vec![main, busybox("side", &["/bin/sleep", "301"])],
    );
    let first = s.runtime().await;
    first.run_pod(pod.clone()).await.unwrap();
    let before = first.pod_status(&pod.uid).await.unwrap();
    let ids_before = first.container_ids(&pod.uid).unwrap();
    let root = format!("/proc/{}/root", running_pid(&before, 0));
    assert_eq!(read_trim(format!("{root}/shared/hello")), "from the host");
    assert!(Path::new(&format!("{root}/dev/reactor-null")).exists());
    let listed = s
        .ctd
        .client()
        .await
        .list_containers(&ContainerFilter {
            id: Some(ids_before.1["main"].clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        listed[0]
            .annotations
            .get("vendor.example/dev")
            .map(String::as_str),
        Some("dev-1")
    );
    drop(first); // the agent goes away; nothing is killed

    let rt = s.runtime().await;
    let after = rt.pod_status(&pod.uid).await.unwrap();
    assert_eq!(after.phase, PodPhase::Running);
    assert_eq!(rt.container_ids(&pod.uid).unwrap(), ids_before);
    for i in 0..2 {
        assert_eq!(running_pid(&after, i), running_pid(&before, i));
        assert_eq!(after.containers[i].restart_count, 0);
    }
    assert_eq!(after.cgroup, pod.cgroup);

    // The runtime goes down: calls say so, naming it; the relist task lives on.
    let mut exits = rt.subscribe_exits();
    s.ctd.stop_daemon();
    // A container ends while the runtime is down (its shim stays and keeps the exit).
    let side_pid = running_pid(&after, 1);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(i32::try_from(side_pid).unwrap()).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let err = rt.pod_status(&pod.uid).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, RuntimeError::Unavailable { .. }), "{text}");
    assert!(
        text.contains("unavailable") && text.contains(&s.ctd.socket().display().to_string()),
        "{text}"
    );
    let other = s.pod(
        "crirt-a2",
        RestartPolicy::Always,
        vec![busybox("x", &["/bin/sleep", "1"])],
    );
    let err = rt.run_pod(other.clone()).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Unavailable { .. }), "{err}");
    tokio::time::sleep(Duration::from_millis(400)).await; // a few failed relists
    s.ctd.start_daemon().unwrap();
    let back = eventually("the runtime to answer again", || async {
        rt.pod_status(&pod.uid).await.ok()
    })
    .await;
    assert_eq!(running_pid(&back, 0), running_pid(&before, 0));
    // The exit during the outage is found once the runtime is back, and restarted.
    let exit = tokio::time::timeout(Duration::from_secs(20), exits.recv())
        .await
        .expect("the side container's exit after the outage")
        .unwrap();
    assert_eq!(
        (
            exit.container.as_str(),
            exit.terminated.exit_code,
            exit.restarting
        ),
        ("side", 137, true),
        "{exit:?}"
    );
    let restarted = eventually("side restarted", || async {
        let st = rt.pod_status(&pod.uid).await.ok()?;
        (st.containers[1].restart_count == 1
            && matches!(st.containers[1].state, ContainerState::Running { .. }))
        .then_some(st)
    })
    .await;
    assert_ne!(running_pid(&restarted, 1), side_pid);

    let last = rt.stop_pod(&pod.uid, Duration::from_secs(5)).await.unwrap();
    assert!(last
        .containers
        .iter()
        .all(|c| matches!(&c.state, ContainerState::Terminated(t) if t.exit_code == 143)));
    drop(rt);
    s.finish(&[&pod, &other]).await;
}

const GUARANTEED: &str = r#"
metadata: {name: db, namespace: prod, uid: crirt-g-0001}
spec:
  containers:
  - name: db
    image: localhost/reactor/app:1
    command: [sleep, "300"]
    resources:
      requests: {cpu: 500m, memory: 64Mi}
      limits: {cpu: 500m, memory: 64Mi}
"#;

/// A Guaranteed container's -997 needs CAP_SYS_RESOURCE, which this machine does not grant;
/// the harness's containerd runs with `restrict_oom_score_adj`, which raises a score below
/// containerd's own to containerd's own. The pod runs, with that score: what a node with
/// this setting does, recorded here so a change in containerd's behaviour shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guaranteed_pod_runs_with_the_score_containerd_restricts_it_to() {
    if !ready() {
        return;
    }
    let s = setup("crirt-guar");
    let rt = s.runtime().await;
    let node = node();
    let (info, pod_cg, spec) = s.pod_from_yaml(&node, GUARANTEED);
    assert_eq!(spec.containers[0].oom_score_adj, -997);
    rt.run_pod(spec.clone())
        .await
        .unwrap_or_else(|e| panic!("run_pod: {e}\n{}", s.ctd.log_tail()));
    let status = rt.pod_status(&info.uid).await.unwrap();
    let pid = running_pid(&status, 0);
    let containerd_adj: i32 = read_trim(format!("/proc/{}/oom_score_adj", s.ctd.pid()))
        .parse()
        .unwrap();
    let got: i32 = read_trim(format!("/proc/{pid}/oom_score_adj"))
        .parse()
        .unwrap();
    eprintln!("decide: -997, containerd's own: {containerd_adj}, the container got: {got}");
    assert_eq!(
        got,
        containerd_adj.max(-997),
        "restricted to containerd's own"
    );
    let (_, ids) = rt.container_ids(&info.uid).unwrap();
    let cg = pod_cg.join(&ids["db"]).unwrap();
    assert_eq!(
        s.cgroups.read_file(&cg, "memory.limit_in_bytes").unwrap(),
        (64u64 << 20).to_string()
    );
    rt.stop_pod(&info.uid, Duration::ZERO).await.unwrap();
    drop(rt);
    s.finish(&[&spec]).await;
}
