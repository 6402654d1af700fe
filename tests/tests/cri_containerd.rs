//! The CRI client against a real containerd (Debian's 1.6 here) started privately per test:
//! version and status, images (import, list, status, remove, ImageFsInfo), a pod sandbox in a
//! cgroup parent this test owns, a container with limits checked in cgroupfs and /proc, stats,
//! stop/remove, and the error a stopped runtime gives.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use reactor::act::cri::{
    CgroupDriver, ContainerFilter, ContainerSpec, ContainerState, CriClient, CriError, Device,
    ImageFsInfo, LinuxResources, Mount, NamespaceMode, PodSandboxSpec, SandboxFilter, SandboxState,
    StatsFilter, Timeouts,
};
use reactor_tests::{containerd_available, require, Containerd, TestCgroupTree, TestImage};

const MIB: u64 = 1 << 20;

fn ready() -> bool {
    require(
        containerd_available(),
        "root, containerd, runc and busybox-static for the CRI tests",
    )
}

/// Polls `probe` until it yields `Some`, for values the runtime refreshes in the background
/// (containerd 1.6 updates snapshot usage every `stats_collect_period`).
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
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn image_fs_used(info: &ImageFsInfo) -> u64 {
    info.image_filesystems
        .iter()
        .filter_map(|f| f.used_bytes)
        .sum()
}

#[tokio::test]
async fn version_status_and_unimplemented_rpcs() {
    if !ready() {
        return;
    }
    let ctd = Containerd::start("version").expect("start containerd");
    let client = ctd.client().await;

    let v = client.version().await.expect("Version");
    assert_eq!(v.runtime_name, "containerd");
    assert_eq!(v.runtime_api_version, "v1");
    assert!(!v.runtime_version.is_empty());

    let status = client.status().await.expect("Status");
    let runtime_ready = status
        .conditions
        .iter()
        .find(|c| c.kind == "RuntimeReady")
        .expect("a RuntimeReady condition");
    assert!(runtime_ready.status, "{status:?}");
    assert_eq!(
        status.sandbox_image.as_deref(),
        Some(ctd.sandbox_image.name.as_str()),
        "the sandbox image from containerd's verbose config"
    );

    // RuntimeConfig came after containerd 1.6: an old runtime must say Unimplemented (and a
    // newer one must report the cgroupfs driver this harness configures).
    match client.cgroup_driver().await {
        Err(e @ CriError::Unimplemented { .. }) => {
            assert_eq!(e.rpc(), Some("RuntimeConfig"));
            assert!(!e.is_runtime_down());
        }
        Ok(driver) => assert_eq!(driver, CgroupDriver::Cgroupfs),
        Err(other) => panic!("unexpected RuntimeConfig error: {other}"),
    }
}

#[tokio::test]
async fn images_list_status_remove_and_image_fs_usage() {
    if !ready() {
        return;
    }
    let ctd = Containerd::start("images").expect("start containerd");
    let small = ctd
        .build_and_import(&TestImage::busybox("localhost/reactor/small:1", MIB))
        .expect("import small image");
    let big = ctd
        .build_and_import(&TestImage::busybox("localhost/reactor/big:2", 24 * MIB))
        .expect("import big image");
    let client = ctd.client().await;

    let images = client.list_images().await.expect("ListImages");
    assert_eq!(images.len(), 3, "pause, small, big: {images:?}");
    for built in [&small, &big, &ctd.sandbox_image] {
        let listed = images
            .iter()
            .find(|i| i.id == built.id)
            .unwrap_or_else(|| panic!("{} not listed: {images:?}", built.name));
        assert_eq!(listed.repo_tags, vec![built.name.clone()]);
        // containerd counts an image's size as the sum of its blobs.
        assert_eq!(listed.size_bytes, built.blob_bytes, "{}", built.name);
    }
    let by_tag = client
        .image_status(&small.name)
        .await
        .expect("ImageStatus")
        .expect("small image present");
    assert_eq!(by_tag.id, small.id);
    let by_id = client
        .image_status(&big.id)
        .await
        .expect("ImageStatus by id")
        .expect("big image present");
    assert_eq!(by_id.repo_tags, vec![big.name.clone()]);
    assert_eq!(
        client
            .image_status("localhost/reactor/absent:1")
            .await
            .expect("ImageStatus of an absent image"),
        None
    );

    // Usage covers both unpacked layers once the CRI plugin's syncer has run.
    let before = eventually("image fs usage to cover both images", || async {
        let info = client.image_fs_info().await.expect("ImageFsInfo");
        (image_fs_used(&info) >= small.layer_bytes + big.layer_bytes).then_some(info)
    })
    .await;
    let fs = &before.image_filesystems[0];
    assert!(
        fs.mount_point.starts_with(ctd.root()),
        "{:?} under {:?}",
        fs.mount_point,
        ctd.root()
    );
    let capacity = fs.capacity_bytes.expect("capacity from statvfs");
    assert!(capacity >= fs.available_bytes.expect("available from statvfs"));
    assert!(fs.inodes_used.is_some() && fs.inodes_total.is_some());

    client.remove_image(&big.name).await.expect("RemoveImage");
    assert_eq!(
        client.image_status(&big.id).await.expect("ImageStatus"),
        None
    );
    let ids: Vec<String> = client
        .list_images()
        .await
        .expect("ListImages")
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert!(!ids.contains(&big.id) && ids.contains(&small.id), "{ids:?}");
    let used_before = image_fs_used(&before);
    let after = eventually("image fs usage to drop by the big layer", || async {
        let info = client.image_fs_info().await.expect("ImageFsInfo");
        (image_fs_used(&info) + 24 * MIB <= used_before).then_some(info)
    })
    .await;
    eprintln!(
        "image fs used: {used_before} -> {} bytes",
        image_fs_used(&after)
    );
    // CRI: removing an image that is not there succeeds.
    client
        .remove_image(&big.name)
        .await
        .expect("RemoveImage of an absent image");
}

#[tokio::test]
async fn pod_and_container_land_in_the_cgroup_parent_with_their_limits() {
    if !ready() {
        return;
    }
    let tree = TestCgroupTree::new("cri-pod");
    let uid = format!("uid-{}", std::process::id());
    let pod_rel = format!("/kubepods/pod{uid}");
    tree.create(&pod_rel, &["memory", "cpu"])
        .expect("create the pod cgroup");
    let ctd = Containerd::start("pod").expect("start containerd");
    let image = ctd
        .build_and_import(&TestImage::busybox("localhost/reactor/app:1", 0))
        .expect("import app image");
    let client = ctd.client().await;
    let logs = ctd.dir().join("pod-logs");
    let shared = ctd.dir().join("shared");
    std::fs::create_dir_all(&shared).expect("shared dir");
    std::fs::write(shared.join("hello"), "from the host").expect("shared file");

    let labels = BTreeMap::from([("reactor.test/pod".to_string(), uid.clone())]);
    let sandbox = PodSandboxSpec {
        name: "web".into(),
        uid: uid.clone(),
        namespace: "default".into(),
        hostname: "web".into(),
        log_directory: Some(logs.clone()),
        labels: labels.clone(),
        annotations: BTreeMap::from([("reactor.test/note".into(), "pod".into())]),
        cgroup_parent: tree.cgroup(&pod_rel),
        network: NamespaceMode::Node,
        ..Default::default()
    };
    let sandbox_id = client
        .run_pod_sandbox(&sandbox)
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", ctd.log_tail()));
    let listed = client
        .list_pod_sandboxes(&SandboxFilter {
            labels: labels.clone(),
            ..Default::default()
        })
        .await
        .expect("ListPodSandbox");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].id, sandbox_id);
    assert_eq!(listed[0].state, SandboxState::Ready);
    assert_eq!(
        (listed[0].uid.as_str(), listed[0].name.as_str()),
        (uid.as_str(), "web")
    );
    assert_eq!(
        listed[0]
            .annotations
            .get("reactor.test/note")
            .map(String::as_str),
        Some("pod")
    );

    // cgroupfs driver: the sandbox's cgroup is <cgroup_parent>/<sandbox id>.
    let sandbox_cgroup = format!("{pod_rel}/{sandbox_id}");
    let pause_pids = procs(&tree.path("memory", &sandbox_cgroup));
    assert!(
        !pause_pids.is_empty(),
        "the pause process is in the pod's memory cgroup"
    );
    assert_eq!(
        memory_cgroup_of(pause_pids[0]),
        tree.cgroup(&sandbox_cgroup),
        "/proc/<pause>/cgroup names the sandbox cgroup under the parent"
    );

    let container = ContainerSpec {
        name: "sleeper".into(),
        image: image.name.clone(),
        // Write 4 MiB into the writable layer, then become a lone `sleep`.
        command: vec!["/bin/sh".into(), "-c".into()],
        args: vec![
            "dd if=/dev/zero of=/scratch bs=1M count=4 2>/dev/null && exec sleep 3600".into(),
        ],
        env: vec![("REACTOR_TEST".into(), "yes".into())],
        mounts: vec![Mount {
            container_path: "/shared".into(),
            host_path: shared.display().to_string(),
            readonly: true,
        }],
        devices: vec![Device {
            container_path: "/dev/reactor-null".into(),
            host_path: "/dev/null".into(),
            permissions: "rw".into(),
        }],
        labels: BTreeMap::from([("reactor.test/container".into(), "sleeper".into())]),
        annotations: BTreeMap::from([("reactor.test/note".into(), "ctr".into())]),
        log_path: Some("sleeper.log".into()),
        resources: LinuxResources {
            cpu_shares: Some(256),
            cpu_quota_us: Some(50_000),
            cpu_period_us: Some(100_000),
            memory_limit_bytes: Some(48 * MIB),
            oom_score_adj: Some(789),
            ..Default::default()
        },
        ..Default::default()
    };
    let container_id = client
        .create_container(&sandbox_id, &container, &sandbox)
        .await
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", ctd.log_tail()));
    client
        .start_container(&container_id)
        .await
        .unwrap_or_else(|e| panic!("StartContainer: {e}\n{}", ctd.log_tail()));

    let containers = client
        .list_containers(&ContainerFilter {
            pod_sandbox_id: Some(sandbox_id.clone()),
            ..Default::default()
        })
        .await
        .expect("ListContainers");
    assert_eq!(containers.len(), 1, "{containers:?}");
    let c = &containers[0];
    assert_eq!(
        (c.id.as_str(), c.name.as_str()),
        (container_id.as_str(), "sleeper")
    );
    assert_eq!(c.state, ContainerState::Running);
    assert_eq!(
        c.image_ref, image.id,
        "containerd 1.6 resolves the image to its id"
    );
    assert_eq!(
        c.annotations.get("reactor.test/note").map(String::as_str),
        Some("ctr")
    );

    // The container's process: in <parent>/<container id>, with our limits.
    let container_cgroup = format!("{pod_rel}/{container_id}");
    let mem_dir = tree.path("memory", &container_cgroup);
    let pid = eventually("the container to be one sleep process", || async {
        match procs(&mem_dir)[..] {
            [pid] => std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "sleep")
                .then_some(pid),
            _ => None,
        }
    })
    .await;
    assert_eq!(memory_cgroup_of(pid), tree.cgroup(&container_cgroup));
    assert_eq!(read_trim(format!("/proc/{pid}/oom_score_adj")), "789");
    assert_eq!(
        read_trim(mem_dir.join("memory.limit_in_bytes")),
        (48 * MIB).to_string()
    );
    let cpu_dir = tree.path("cpu", &container_cgroup);
    assert_eq!(read_trim(cpu_dir.join("cpu.shares")), "256");
    assert_eq!(read_trim(cpu_dir.join("cpu.cfs_quota_us")), "50000");
    assert_eq!(read_trim(cpu_dir.join("cpu.cfs_period_us")), "100000");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
    assert!(
        environ.split(|b| *b == 0).any(|v| v == b"REACTOR_TEST=yes"),
        "env reaches the process"
    );
    let root = format!("/proc/{pid}/root");
    assert_eq!(read_trim(format!("{root}/shared/hello")), "from the host");
    assert!(
        Path::new(&format!("{root}/dev/reactor-null")).exists(),
        "device node"
    );
    assert!(
        logs.join("sleeper.log").exists(),
        "log file under the sandbox's log dir"
    );

    // In-place update: a new memory limit and CPU quota reach the same cgroup.
    client
        .update_container_resources(
            &container_id,
            &LinuxResources {
                cpu_shares: Some(512),
                cpu_quota_us: Some(20_000),
                cpu_period_us: Some(100_000),
                memory_limit_bytes: Some(40 * MIB),
                oom_score_adj: Some(789),
                ..Default::default()
            },
        )
        .await
        .expect("UpdateContainerResources");
    assert_eq!(
        read_trim(mem_dir.join("memory.limit_in_bytes")),
        (40 * MIB).to_string()
    );
    assert_eq!(read_trim(cpu_dir.join("cpu.cfs_quota_us")), "20000");
    assert_eq!(read_trim(cpu_dir.join("cpu.shares")), "512");

    let sandbox_status = client
        .pod_sandbox_status(&sandbox_id)
        .await
        .expect("PodSandboxStatus");
    assert_eq!(sandbox_status.state, SandboxState::Ready);
    assert_eq!(sandbox_status.labels, labels);

    let status = client
        .container_status(&container_id)
        .await
        .expect("ContainerStatus");
    assert_eq!(status.info.state, ContainerState::Running);
    assert!(status.started_at_ns > 0);

    let stats = client
        .container_stats(&container_id)
        .await
        .expect("ContainerStats");
    assert_eq!(stats.id, container_id);
    assert_eq!(stats.name, "sleeper");
    let working_set = stats.memory_working_set_bytes.expect("working set");
    assert!(working_set > 0 && working_set <= 40 * MIB, "{stats:?}");
    assert!(stats.cpu_usage_core_ns.is_some(), "{stats:?}");
    let layer = eventually("the writable layer's usage", || async {
        let s = client
            .container_stats(&container_id)
            .await
            .expect("ContainerStats");
        s.writable_layer_bytes
            .filter(|b| *b >= 4 * MIB && s.writable_layer_inodes.is_some())
    })
    .await;
    eprintln!("container stats: {stats:?}, writable layer {layer} bytes");
    let all = client
        .list_container_stats(&StatsFilter {
            pod_sandbox_id: Some(sandbox_id.clone()),
            ..Default::default()
        })
        .await
        .expect("ListContainerStats");
    assert_eq!(
        all.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        [container_id.as_str()]
    );

    // Stop: busybox sleep is not PID 1 (the pod shares the pause's PID namespace), so
    // SIGTERM ends it within the grace period.
    client
        .stop_container(&container_id, Duration::from_secs(2))
        .await
        .expect("StopContainer");
    let stopped = client
        .container_status(&container_id)
        .await
        .expect("ContainerStatus");
    assert_eq!(stopped.info.state, ContainerState::Exited);
    assert!(stopped.finished_at_ns >= stopped.started_at_ns);
    client
        .remove_container(&container_id)
        .await
        .expect("RemoveContainer");
    let e = client
        .container_status(&container_id)
        .await
        .expect_err("a removed container has no status");
    assert!(e.is_not_found(), "{e}");
    assert!(!mem_dir.exists(), "runc removed the container's cgroup");

    client
        .stop_pod_sandbox(&sandbox_id)
        .await
        .expect("StopPodSandbox");
    let listed = client
        .list_pod_sandboxes(&SandboxFilter {
            id: Some(sandbox_id.clone()),
            ..Default::default()
        })
        .await
        .expect("ListPodSandbox");
    assert_eq!(listed[0].state, SandboxState::NotReady);
    client
        .stop_pod_sandbox(&sandbox_id)
        .await
        .expect("StopPodSandbox is idempotent");
    client
        .remove_pod_sandbox(&sandbox_id)
        .await
        .expect("RemovePodSandbox");
    let left = client
        .list_pod_sandboxes(&SandboxFilter::default())
        .await
        .expect("ListPodSandbox");
    assert!(left.is_empty(), "{left:?}");
    let e = client
        .pod_sandbox_status(&sandbox_id)
        .await
        .expect_err("a removed sandbox has no status");
    assert!(e.is_not_found(), "{e}");
    assert!(
        procs(&tree.path("memory", &sandbox_cgroup)).is_empty(),
        "no process left in the sandbox cgroup"
    );
}

#[tokio::test]
async fn a_stopped_runtime_is_unavailable_and_the_client_reconnects_after_a_restart() {
    if !ready() {
        return;
    }
    let mut ctd = Containerd::start("down").expect("start containerd");
    let client = CriClient::connect(
        &ctd.endpoint(),
        Timeouts {
            connect: Duration::from_secs(2),
            request: Duration::from_secs(20),
        },
    )
    .await
    .expect("client");
    client.version().await.expect("Version while up");

    ctd.stop();
    let t = Instant::now();
    let e = client
        .list_containers(&ContainerFilter::default())
        .await
        .expect_err("no runtime");
    let took = t.elapsed();
    eprintln!("ListContainers against a stopped containerd: {e} (after {took:?})");
    assert!(
        matches!(
            e,
            CriError::Unavailable {
                rpc: "ListContainers",
                ..
            }
        ),
        "a down runtime is Unavailable, not a timeout: {e}"
    );

    ctd.restart().expect("restart containerd");
    let v = eventually("the same client to reach the restarted runtime", || async {
        client.version().await.ok()
    })
    .await;
    assert_eq!(v.runtime_name, "containerd");
}

#[tokio::test]
async fn dropping_the_harness_cleans_up_a_running_pod() {
    if !ready() {
        return;
    }
    let tree = TestCgroupTree::new("cri-drop");
    let ctd = Containerd::start("drop").expect("start containerd");
    let client = ctd.client().await;
    let sandbox = PodSandboxSpec {
        name: "left-behind".into(),
        uid: format!("drop-{}", std::process::id()),
        namespace: "default".into(),
        cgroup_parent: tree.cgroup("/pod"),
        network: NamespaceMode::Node,
        ..Default::default()
    };
    let id = client
        .run_pod_sandbox(&sandbox)
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", ctd.log_tail()));
    let pause = procs(&tree.path("memory", &format!("/pod/{id}")));
    assert_eq!(pause.len(), 1, "the pause process");
    let (dir, daemon) = (ctd.dir().to_path_buf(), ctd.pid());
    let shims = ctd.shim_pids();
    assert_eq!(shims.len(), 1, "one shim for the sandbox");

    drop(ctd);
    for pid in [pause[0], daemon, shims[0]] {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid),
            "pid {pid} ended"
        );
    }
    assert!(!dir.exists(), "{} removed", dir.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(&dir.display().to_string()),
        "nothing left mounted"
    );
    drop(tree);
    assert!(!Path::new("/sys/fs/cgroup/memory")
        .join(format!("reactor-test-cri-drop-{}", std::process::id()))
        .exists());
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

fn procs(cgroup_dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(cgroup_dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn memory_cgroup_of(pid: u32) -> String {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("/proc/pid/cgroup");
    cgroups
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next(), f.next()?, f.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_string())
        })
        .expect("a memory line in /proc/pid/cgroup")
}

fn read_trim(path: impl AsRef<Path>) -> String {
    let path = path.as_ref();
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .trim()
        .to_string()
}
