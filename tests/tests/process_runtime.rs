//! The process runtime on the real kernel: processes in their v1 container cgroups,
//! oom_score_adj, restarts with back-off, OOM kills, stop with a grace period, and re-adoption
//! after the runtime object is dropped (an agent restart). Every test works below its own
//! cgroup root and state dir, and checks nothing is left.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns: a failed setup should panic with its backtrace"
)]

use std::path::Path;
use std::time::{Duration, Instant};

use reactor::act::cgroups::{CgroupManager, CgroupPath, Resources};
use reactor::act::process::{ProcessRuntime, ProcessRuntimeConfig};
use reactor::act::runtime::{
    ContainerSpec, ContainerState, PodPhase, PodSpec, PodStatus, RestartPolicy, Runtime,
};
use reactor::decide::backoff::BackOffPolicy;
use reactor_tests::cgroup_root::{TestCgroupRoot, MOUNT_ROOT};
use reactor_tests::{is_root, memhog_bin, require};

fn ready() -> bool {
    require(is_root(), "root, to create cgroups and set oom_score_adj")
        && require(
            Path::new("/sys/fs/cgroup/memory/memory.oom_control").exists(),
            "cgroup v1 memory hierarchy under /sys/fs/cgroup",
        )
}

struct Setup {
    root: TestCgroupRoot,
    state: tempfile::TempDir,
    cgroups: CgroupManager,
}

fn setup(name: &str) -> Setup {
    let root = TestCgroupRoot::v1(name).unwrap();
    let cgroups = CgroupManager::v1(
        Path::new(MOUNT_ROOT),
        &CgroupPath::parse(&root.name).unwrap(),
    )
    .unwrap();
    Setup {
        root,
        state: tempfile::tempdir().unwrap(),
        cgroups,
    }
}

impl Setup {
    async fn runtime(&self, backoff: BackOffPolicy) -> ProcessRuntime {
        ProcessRuntime::open(ProcessRuntimeConfig {
            cgroups: self.cgroups.clone(),
            state_dir: self.state.path().to_path_buf(),
            backoff,
        })
        .await
        .unwrap()
    }

    /// What the pod lifecycle does before calling the runtime: the pod cgroup.
    fn pod(&self, uid: &str, policy: RestartPolicy, containers: Vec<ContainerSpec>) -> PodSpec {
        let cgroup = CgroupPath::pod(Some("burstable"), uid).unwrap();
        self.cgroups.create(&cgroup).unwrap();
        self.cgroups
            .apply(
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

    fn finish(self) {
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

fn container(name: &str, cmd: &[&str], oom_score_adj: i32) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        image: String::new(),
        command: cmd.iter().map(|s| s.to_string()).collect(),
        args: vec![],
        env: vec![],
        resources: Resources::default(),
        oom_score_adj,
        ..Default::default()
    }
}

/// Whether this process may lower oom_score_adj below 0 (CAP_SYS_RESOURCE, bit 24).
fn has_cap_sys_resource() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

fn short_backoff() -> BackOffPolicy {
    BackOffPolicy {
        initial: Duration::from_millis(200),
        max: Duration::from_millis(800),
    }
}

fn running_pid(s: &PodStatus, i: usize) -> u32 {
    match &s.containers[i].state {
        ContainerState::Running { pid, .. } => *pid,
        other => panic!(
            "container {i} not running: {other:?} after {:?}",
            s.containers[i].last_termination
        ),
    }
}

/// A process is gone when /proc has no entry or only its zombie (a re-adopted process is
/// not our child once the first runtime is dropped, so nobody reaps it until the test ends).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

async fn wait_for(
    rt: &ProcessRuntime,
    uid: &str,
    what: &str,
    f: impl Fn(&PodStatus) -> bool,
) -> PodStatus {
    let start = Instant::now();
    loop {
        let s = rt.pod_status(uid).await.unwrap();
        if f(&s) {
            return s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_containers_in_their_cgroups_with_oom_score_adj_env_and_grace() {
    if !ready() {
        return;
    }
    let s = setup("proc-two");
    let rt = s.runtime(BackOffPolicy::default()).await;
    // The kubelet's Guaranteed value needs CAP_SYS_RESOURCE, which some sandboxes drop.
    let web_adj = if has_cap_sys_resource() { -997 } else { 2 };
    let mut web = container(
        "web",
        &["sh", "-c", "echo FOO=$FOO; sleep 300 & exec sleep 301"],
        web_adj,
    );
    web.env = vec![("FOO".into(), "from-device".into())];
    web.resources.memory_limit_bytes = Some(64 << 20);
    let stubborn = container(
        "stubborn",
        &["sh", "-c", "trap '' TERM; exec sleep 302"],
        1000,
    );
    let pod = s.pod("aaaa-1", RestartPolicy::Always, vec![web, stubborn]);
    rt.run_pod(pod.clone()).await.unwrap();
    let status = rt.pod_status("aaaa-1").await.unwrap();
    assert_eq!(status.phase, PodPhase::Running);
    let (web_pid, stubborn_pid) = (running_pid(&status, 0), running_pid(&status, 1));

    for (pid, name, adj) in [
        (web_pid, "web", &*web_adj.to_string()),
        (stubborn_pid, "stubborn", "1000"),
    ] {
        let cg = pod.cgroup.join(name).unwrap();
        assert!(s.cgroups.procs(&cg).unwrap().contains(&pid), "{name}");
        assert_eq!(
            std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
                .unwrap()
                .trim(),
            adj
        );
        // Its own session: the whole tree is one process group.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        assert_eq!(fields[3], pid.to_string(), "session of {name}");
    }
    let web_cg = pod.cgroup.join("web").unwrap();
    assert_eq!(
        s.cgroups
            .read_file(&web_cg, "memory.limit_in_bytes")
            .unwrap(),
        "67108864"
    );
    // The background sleep is in the container cgroup too.
    let start = Instant::now();
    while s.cgroups.procs(&web_cg).unwrap().len() < 2 {
        assert!(start.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let tree = s.cgroups.procs(&web_cg).unwrap();
    // stubborn has set its trap once its shell has exec'd sleep.
    let comm = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    while comm(stubborn_pid).trim() != "sleep" {
        assert!(start.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let log = std::fs::read_to_string(rt.log_path(&pod, "web", 0)).unwrap();
    assert!(log.contains("FOO=from-device"), "{log}");

    // Stop with a grace period: web ends on SIGTERM, stubborn ignores it and is killed after.
    let t0 = Instant::now();
    let last = rt
        .stop_pod("aaaa-1", Duration::from_millis(600))
        .await
        .unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(600),
        "SIGKILL came before the grace"
    );
    let ContainerState::Terminated(w) = &last.containers[0].state else {
        panic!("{last:?}")
    };
    assert_eq!(
        (w.exit_code, w.signal, w.reason.as_str()),
        (143, Some(15), "Error")
    );
    let ContainerState::Terminated(t) = &last.containers[1].state else {
        panic!("{last:?}")
    };
    assert_eq!((t.exit_code, t.signal), (137, Some(9)));
    for pid in tree.iter().chain([&stubborn_pid]) {
        assert!(gone(*pid), "pid {pid} survived the stop");
    }
    assert!(!s.cgroups.exists(&web_cg));
    assert!(rt.list_pods().await.unwrap().is_empty());
    drop(rt);
    s.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_container_is_restarted_with_back_off() {
    if !ready() {
        return;
    }
    let s = setup("proc-crash");
    let rt = s.runtime(short_backoff()).await;
    let pod = s.pod(
        "bbbb-2",
        RestartPolicy::Always,
        vec![container("crash", &["sh", "-c", "exit 3"], 500)],
    );
    let t0 = Instant::now();
    rt.run_pod(pod).await.unwrap();
    let s1 = wait_for(&rt, "bbbb-2", "a CrashLoopBackOff", |p| {
        matches!(&p.containers[0].state, ContainerState::Waiting { reason, .. } if reason == "CrashLoopBackOff")
    })
    .await;
    let ContainerState::Waiting { message, .. } = &s1.containers[0].state else {
        unreachable!()
    };
    assert!(
        message.contains("back-off") && message.contains("container=crash"),
        "{message}"
    );
    let s4 = wait_for(&rt, "bbbb-2", "four restarts", |p| {
        p.containers[0].restart_count >= 4
    })
    .await;
    // Delays 0, 200, 400, 800 ms: the fourth restart cannot come sooner than 1.4 s.
    assert!(
        t0.elapsed() >= Duration::from_millis(1400),
        "restarted faster than the back-off"
    );
    let last = s4.containers[0].last_termination.clone().unwrap();
    assert_eq!((last.exit_code, last.reason.as_str()), (3, "Error"));
    assert_eq!(s4.phase, PodPhase::Running);

    // OnFailure does not restart a clean exit; Never does not restart a failure.
    let ok = s.pod(
        "bbbb-3",
        RestartPolicy::OnFailure,
        vec![container("ok", &["true"], 0)],
    );
    rt.run_pod(ok).await.unwrap();
    let done = wait_for(&rt, "bbbb-3", "Succeeded", |p| {
        p.phase == PodPhase::Succeeded
    })
    .await;
    assert_eq!(done.containers[0].restart_count, 0);
    let bad = s.pod(
        "bbbb-4",
        RestartPolicy::Never,
        vec![container("bad", &["false"], 0)],
    );
    rt.run_pod(bad).await.unwrap();
    let failed = wait_for(&rt, "bbbb-4", "Failed", |p| p.phase == PodPhase::Failed).await;
    assert_eq!(failed.containers[0].restart_count, 0);
    // A command that does not exist is a StartError, not a panic.
    let missing = s.pod(
        "bbbb-5",
        RestartPolicy::Never,
        vec![container("nope", &["/nonexistent/x"], 0)],
    );
    rt.run_pod(missing).await.unwrap();
    let se = wait_for(&rt, "bbbb-5", "StartError", |p| p.phase == PodPhase::Failed).await;
    let ContainerState::Terminated(t) = &se.containers[0].state else {
        panic!("{se:?}")
    };
    assert_eq!((t.exit_code, t.reason.as_str()), (128, "StartError"));

    for uid in ["bbbb-2", "bbbb-3", "bbbb-4", "bbbb-5"] {
        rt.stop_pod(uid, Duration::ZERO).await.unwrap();
    }
    drop(rt);
    s.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oom_kill_is_recorded_as_oomkilled() {
    if !ready() {
        return;
    }
    let s = setup("proc-oom");
    let rt = s.runtime(short_backoff()).await;
    let hog = memhog_bin();
    let mut c = container("hog", &[hog.to_str().unwrap(), "64", "0", "60"], 1000);
    c.resources.memory_limit_bytes = Some(16 << 20);
    let pod = s.pod("cccc-3", RestartPolicy::Never, vec![c]);
    let mut exits = rt.subscribe_exits();
    rt.run_pod(pod).await.unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(30), exits.recv())
        .await
        .expect("an exit event")
        .unwrap();
    assert_eq!(
        (exit.pod.as_str(), exit.container.as_str()),
        ("default/pod-cccc-3", "hog")
    );
    assert_eq!(exit.terminated.reason, "OOMKilled");
    assert!(!exit.restarting);
    assert_eq!(exit.cgroup.to_string(), "/kubepods/burstable/podcccc-3/hog");
    let st = wait_for(&rt, "cccc-3", "the OOM kill", |p| {
        p.phase == PodPhase::Failed
    })
    .await;
    let ContainerState::Terminated(t) = &st.containers[0].state else {
        panic!("{st:?}")
    };
    assert_eq!(
        (t.exit_code, t.signal, t.reason.as_str()),
        (137, Some(9), "OOMKilled")
    );
    rt.stop_pod("cccc-3", Duration::ZERO).await.unwrap();
    drop(rt);
    s.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_are_re_adopted_after_the_runtime_is_dropped() {
    if !ready() {
        return;
    }
    let s = setup("proc-adopt");
    let rt = s.runtime(short_backoff()).await;
    let pod = s.pod(
        "dddd-4",
        RestartPolicy::Always,
        vec![
            container("a", &["sleep", "300"], 0),
            container("b", &["sleep", "301"], 0),
        ],
    );
    rt.run_pod(pod).await.unwrap();
    let before = rt.pod_status("dddd-4").await.unwrap();
    let (a, b) = (running_pid(&before, 0), running_pid(&before, 1));
    drop(rt); // the agent "crashes": supervision stops, nothing is killed
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!gone(a) && !gone(b), "dropping the runtime must not kill");
    // While the agent is down, container b dies.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(b as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let start = Instant::now();
    while !gone(b) {
        assert!(start.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let rt = s.runtime(short_backoff()).await;
    let pods = rt.list_pods().await.unwrap();
    assert_eq!(pods.len(), 1);
    // a is the same process, not restarted.
    assert_eq!(running_pid(&pods[0], 0), a);
    assert_eq!(pods[0].containers[0].restart_count, 0);
    // b was lost while the agent was away: restarted under Always, its end unknown.
    let after = wait_for(&rt, "dddd-4", "b restarted", |p| {
        p.containers[1].restart_count == 1
            && matches!(p.containers[1].state, ContainerState::Running { .. })
    })
    .await;
    let lost = after.containers[1].last_termination.clone().unwrap();
    assert_eq!(lost.reason, "ContainerStatusUnknown");
    let b2 = running_pid(&after, 1);
    assert_ne!(b2, b);

    let last = rt.stop_pod("dddd-4", Duration::from_secs(2)).await.unwrap();
    assert!(matches!(
        last.containers[0].state,
        ContainerState::Terminated(_)
    ));
    assert!(gone(a) && gone(b2));
    drop(rt);
    // The checkpoint no longer lists the pod.
    let rt = s.runtime(short_backoff()).await;
    assert!(rt.list_pods().await.unwrap().is_empty());
    drop(rt);
    s.finish();
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftovers_of_a_lost_run_are_cleared_and_a_corrupt_checkpoint_set_aside() {
    use std::os::unix::process::CommandExt;
    if !ready() {
        return;
    }
    let s = setup("proc-left");
    let pod = s.pod(
        "gggg-7",
        RestartPolicy::Never,
        vec![container("c", &["sleep", "300"], 0)],
    );
    // A process from a run the runtime never recorded (a crash between start and save).
    let cg = pod.cgroup.join("c").unwrap();
    s.cgroups.create(&cg).unwrap();
    let files = s.cgroups.procs_files(&cg);
    let mut cmd = std::process::Command::new("sleep");
    cmd.arg("300");
    // SAFETY: the hook only writes small files; the test holds no locks at spawn.
    unsafe {
        cmd.pre_exec(move || {
            for f in &files {
                std::fs::write(f, "0")?;
            }
            Ok(())
        });
    }
    let mut stray = cmd.spawn().unwrap();
    assert_eq!(s.cgroups.procs(&cg).unwrap(), vec![stray.id()]);

    let rt = s.runtime(short_backoff()).await;
    rt.run_pod(pod).await.unwrap();
    let st = rt.pod_status("gggg-7").await.unwrap();
    let pid = running_pid(&st, 0);
    assert_eq!(s.cgroups.procs(&cg).unwrap(), vec![pid]);
    let status = stray.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    rt.stop_pod("gggg-7", Duration::ZERO).await.unwrap();
    let checkpoint = rt.checkpoint_path().to_path_buf();
    drop(rt);

    // A damaged checkpoint never stops the runtime: it is set aside (kept, one line in the
    // log) and the runtime opens from the previous generation — the state before the stop,
    // whose pod has no live process any more, so it is forgotten, not started again.
    std::fs::write(&checkpoint, "{\"kind\":\"process-runtime\",\"vers").unwrap();
    let rt = ProcessRuntime::open(ProcessRuntimeConfig {
        cgroups: s.cgroups.clone(),
        state_dir: s.state.path().to_path_buf(),
        backoff: short_backoff(),
    })
    .await
    .expect("a damaged checkpoint is set aside, not refused");
    assert!(rt.list_pods().await.unwrap().is_empty());
    let kept: Vec<_> = std::fs::read_dir(s.state.path())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("process-runtime.json.corrupt-")
        })
        .collect();
    assert_eq!(kept.len(), 1);
    assert_eq!(
        std::fs::read_to_string(kept[0].path()).unwrap(),
        "{\"kind\":\"process-runtime\",\"vers"
    );
    drop(rt);
    s.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_waiting_out_its_back_off_is_restarted_after_reopen() {
    if !ready() {
        return;
    }
    let s = setup("proc-reopen");
    let long = BackOffPolicy {
        initial: Duration::from_secs(60),
        max: Duration::from_secs(120),
    };
    let rt = s.runtime(long).await;
    let pod = s.pod(
        "hhhh-8",
        RestartPolicy::Always,
        vec![container("crash", &["false"], 0)],
    );
    rt.run_pod(pod).await.unwrap();
    // Dies, restarts at once, dies again: now in a 60 s back-off.
    let waiting = wait_for(&rt, "hhhh-8", "CrashLoopBackOff", |p| {
        matches!(&p.containers[0].state, ContainerState::Waiting { reason, .. } if reason == "CrashLoopBackOff")
    })
    .await;
    assert_eq!(waiting.containers[0].restart_count, 1);
    drop(rt);
    // A new agent does not remember the back-off (the kubelet keeps it in memory too): the
    // container is restarted at once and the restart is counted.
    let rt = s.runtime(long).await;
    let again = wait_for(&rt, "hhhh-8", "the restart after reopen", |p| {
        p.containers[0].restart_count >= 2
    })
    .await;
    assert_eq!(
        again.containers[0]
            .last_termination
            .as_ref()
            .unwrap()
            .exit_code,
        1
    );
    rt.stop_pod("hhhh-8", Duration::ZERO).await.unwrap();
    drop(rt);
    s.finish();
}

fn init(name: &str, script: &str) -> ContainerSpec {
    ContainerSpec {
        init: true,
        ..container(name, &["sh", "-c", script], 0)
    }
}

fn pod_cgroup(uid: &str) -> CgroupPath {
    CgroupPath::pod(Some("burstable"), uid).unwrap()
}

fn lines(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_run_in_order_to_completion_before_the_app_and_resume_after_reopen() {
    if !ready() {
        return;
    }
    let s = setup("proc-init");
    let dir = s.state.path();
    let (log, marker, gate) = (dir.join("order"), dir.join("failed-once"), dir.join("gate"));
    let (log, marker, gate) = (log.display(), marker.display(), gate.display());
    let rt = s.runtime(short_backoff()).await;
    let pod = s.pod(
        "iiii-1",
        RestartPolicy::Always,
        vec![
            init("one", &format!("echo one >> {log}")),
            // Fails its first run: restarted (with the back-off), not skipped.
            init(
                "two",
                &format!(
                    "if [ -e {marker} ]; then echo two >> {log}; else touch {marker}; exit 3; fi"
                ),
            ),
            // Runs until the test opens the gate, so the runtime can be reopened meanwhile.
            init(
                "three",
                &format!("while [ ! -e {gate} ]; do sleep 0.05; done; echo three >> {log}"),
            ),
            container(
                "app",
                &["sh", "-c", &format!("echo app >> {log}; exec sleep 300")],
                0,
            ),
        ],
    );
    rt.run_pod(pod).await.unwrap();
    let status = rt.pod_status("iiii-1").await.unwrap();
    assert_eq!(
        status.containers.len(),
        1,
        "the status lists app containers"
    );
    assert_eq!(status.phase, PodPhase::Pending);
    let order = s.state.path().join("order");
    let start = Instant::now();
    while lines(&order) != ["one", "two"] {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "init order: {:?}",
            lines(&order)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let waiting = rt.pod_status("iiii-1").await.unwrap();
    assert_eq!(waiting.phase, PodPhase::Pending);
    assert!(
        matches!(&waiting.containers[0].state, ContainerState::Waiting { reason, .. } if reason == "PodInitializing"),
        "{waiting:?}"
    );

    // The agent goes away while "three" runs (recorded as running, with "two" recorded as
    // done: the checkpoint names three's pid) and comes back: initialisation resumes at
    // "three" (one and two are not run again). "three" was re-adopted, so its exit code
    // cannot be read: it is run again, as init containers must be idempotent.
    let three = pod_cgroup("iiii-1").join("three").unwrap();
    let checkpoint = s.state.path().join("process-runtime.json");
    let start = Instant::now();
    loop {
        let saved: String = std::fs::read_to_string(&checkpoint)
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        let pids = s.cgroups.procs(&three).unwrap_or_default();
        if pids
            .iter()
            .any(|p| saved.contains(&format!("\"pid\":{p},")))
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "three never recorded running"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(rt);
    let rt = s.runtime(short_backoff()).await;
    std::fs::write(s.state.path().join("gate"), "").unwrap();
    let running = wait_for(&rt, "iiii-1", "the app running", |p| {
        matches!(p.containers[0].state, ContainerState::Running { .. })
    })
    .await;
    assert_eq!(running.phase, PodPhase::Running);
    let start = Instant::now();
    while !lines(&order).contains(&"app".to_string()) {
        assert!(start.elapsed() < Duration::from_secs(30));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(lines(&order), ["one", "two", "three", "three", "app"]);
    let app = running_pid(&running, 0);
    rt.stop_pod("iiii-1", Duration::from_secs(2)).await.unwrap();
    assert!(gone(app));
    drop(rt);
    s.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_init_container_fails_a_pod_that_never_restarts() {
    if !ready() {
        return;
    }
    let s = setup("proc-init-fail");
    let started = s.state.path().join("app-started");
    let rt = s.runtime(short_backoff()).await;
    let pod = s.pod(
        "iiii-2",
        RestartPolicy::Never,
        vec![
            init("setup", "exit 4"),
            container(
                "app",
                &[
                    "sh",
                    "-c",
                    &format!("touch {}; exec sleep 300", started.display()),
                ],
                0,
            ),
        ],
    );
    rt.run_pod(pod).await.unwrap();
    let failed = wait_for(&rt, "iiii-2", "the pod failed", |p| {
        p.phase == PodPhase::Failed
    })
    .await;
    assert!(
        matches!(&failed.containers[0].state, ContainerState::Waiting { reason, .. } if reason == "PodInitializing"),
        "{failed:?}"
    );
    assert!(!started.exists(), "the app container must not start");
    rt.stop_pod("iiii-2", Duration::ZERO).await.unwrap();
    drop(rt);
    s.finish();
}

/// The eviction's kill takes the containers' own processes from the runtime (pidfds it holds
/// while it supervises them) and signals them before it walks the pod cgroup; the walk then
/// signals the rest (a container's fork) and nothing twice. A container that exited is no
/// longer offered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kill_signals_the_runtimes_own_processes_first_and_the_walk_the_rest() {
    if !ready() {
        return;
    }
    let s = setup("proc-known");
    let rt = s.runtime(short_backoff()).await;
    let pod = s.pod(
        "kkkk-1",
        RestartPolicy::Never,
        vec![
            // The main process forks a child that stays in the container cgroup.
            container("app", &["sh", "-c", "sleep 300 & exec sleep 301"], 0),
            container("quick", &["true"], 0),
        ],
    );
    let cgroup = pod.cgroup.clone();
    rt.run_pod(pod).await.unwrap();
    let status = wait_for(&rt, "kkkk-1", "app running, quick ended", |p| {
        matches!(p.containers[0].state, ContainerState::Running { .. })
            && matches!(p.containers[1].state, ContainerState::Terminated(_))
    })
    .await;
    let main = running_pid(&status, 0);
    let known = rt.known_processes("kkkk-1");
    assert_eq!(
        known.iter().map(|k| k.pid).collect::<Vec<_>>(),
        [main],
        "the running container's process alone, not the ended one's"
    );
    let start = Instant::now();
    let all = loop {
        let pids = s.cgroups.memory_procs_recursive(&cgroup).unwrap();
        if pids.len() == 2 || start.elapsed() > Duration::from_secs(5) {
            break pids;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(all.len(), 2, "the main process and its fork: {all:?}");
    // Not fenced first: a fence with grace 0 has the supervisor kill the process too, and
    // whichever kill came first would take the count.
    let evicted = reactor::act::kill::kill_cgroup_now(&s.cgroups, &cgroup, known);
    assert_eq!(
        evicted.killed, 2,
        "each process signalled once: {evicted:?}"
    );
    assert!(evicted.killed_at_ns.is_some());
    let start = Instant::now();
    while !all.iter().all(|&p| gone(p)) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{all:?} still run"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_for(&rt, "kkkk-1", "app ended", |p| {
        matches!(p.containers[0].state, ContainerState::Terminated(_))
    })
    .await;
    assert!(
        rt.known_processes("kkkk-1").is_empty(),
        "an exited process is let go"
    );
    rt.stop_pod("kkkk-1", Duration::ZERO).await.unwrap();
    drop(rt);
    s.finish();
}
