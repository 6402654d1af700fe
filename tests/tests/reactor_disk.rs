//! The reactor loop under disk pressure on a real image filesystem: a private containerd
//! whose root (content store, snapshots, writable layers) is a small tmpfs the test mounts,
//! pods run through the CRI runtime below the test's own cgroup root, the image GC manager
//! as the loop's node-level reclaim, and the observer reading `imagefs.available` on the
//! filesystem containerd reports in `ImageFsInfo` — as the kubelet learns it.
//!
//! containerd's root on its own tmpfs and the node filesystem elsewhere is seed 003's
//! "separate imagefs" layout: `imagefs` holds images and writable layers, `containerfs`
//! inherits the `imagefs` thresholds, and pods are ranked by their writable layers. The disk
//! signals have no kernel event: the sense layer's housekeeping tick wakes the loop.
//!
//! Everything lives below the test's temp dir (containerd state, the tmpfs, the node
//! filesystem directory, container logs) and its cgroup root; the guards' `Drop` stops
//! containerd and what it runs by pid, unmounts the tmpfs and removes the cgroups, also
//! when a test fails.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns: a failed setup should panic with its backtrace"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reactor::act::cgroups::{CgroupManager, CgroupPath, Resources};
use reactor::act::cri::CriClient;
use reactor::act::cri_runtime::{CriRuntime, CriRuntimeConfig};
use reactor::act::pod_spec::pod_spec;
use reactor::act::runtime::{ContainerState, Runtime};
use reactor::config::{Config, GoDuration};
use reactor::decide::backoff::BackOffPolicy;
use reactor::decide::cgroups::{pod_config, CgroupVersion, NodeSettings, DEFAULT_QUOTA_PERIOD_US};
use reactor::decide::image_gc::ImageGcPolicy;
use reactor::decide::pod::PodInfo;
use reactor::decide::quantity::Quantity;
use reactor::images::{ImageGcManager, ImageGcSettings};
use reactor::observe::{ObserveSettings, Observer};
use reactor::reactor::{
    spawn, Action, ActivePod, Decision, NodeReclaim, PodContainer, PodControl, Reactor,
    ReactorHandle, ReactorSettings, RuntimePods,
};
use reactor::sense::{Kind, Sense, SenseOptions, Source};
use reactor_tests::cgroup_root::{TestCgroupRoot, MOUNT_ROOT};
use reactor_tests::{containerd_available, require, BuiltImage, Containerd, TestImage};
use tokio::sync::{broadcast, watch};

const MIB: u64 = 1 << 20;
const APP: &str = "localhost/reactor/disk-app:1";

fn ready() -> bool {
    require(
        containerd_available(),
        "root, containerd, runc and busybox-static for the disk-pressure tests",
    ) && require(
        Path::new("/sys/fs/cgroup/memory/memory.oom_control").exists(),
        "cgroup v1 memory hierarchy under /sys/fs/cgroup",
    )
}

fn node_settings() -> NodeSettings {
    NodeSettings {
        version: CgroupVersion::V1,
        allocatable_cpu: Some(Quantity::parse("2").unwrap()),
        allocatable_memory: Some(Quantity::parse("1Gi").unwrap()),
        qos_reserved_memory_percent: None,
        enforce_cpu_limits: true,
        cpu_period_us: DEFAULT_QUOTA_PERIOD_US,
        memory_capacity: Some(1 << 30),
        single_process_oom_kill: None,
        memory_qos: false,
        memory_throttling_factor: Default::default(),
        swap_behavior: Default::default(),
        swap_capacity: 0,
        swap_controller: false,
    }
}

fn available(path: &Path) -> u64 {
    let st = rustix::fs::statvfs(path).unwrap();
    st.f_bavail * st.f_frsize
}

fn device(path: &Path) -> u64 {
    rustix::fs::stat(path).unwrap().st_dev
}

/// Image ids and sizes as CRI lists them now.
async fn listed(client: &CriClient) -> BTreeMap<String, u64> {
    client
        .list_images()
        .await
        .unwrap()
        .into_iter()
        .map(|i| (i.id, i.size_bytes))
        .collect()
}

/// A running reactor loop. Dropping it aborts the task (a failed test leaves nothing
/// running); [`Loop::stop`] ends it the ordinary way. The task's output is not used.
struct Loop {
    handle: ReactorHandle,
    decisions: broadcast::Receiver<Decision>,
    shutdown: watch::Sender<bool>,
    abort: tokio::task::AbortHandle,
    done: Option<tokio::task::JoinHandle<()>>,
}

impl Loop {
    async fn stop(mut self) {
        self.shutdown.send_replace(true);
        if let Some(done) = self.done.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), done).await;
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        self.abort.abort();
    }
}

/// A node whose image filesystem is a tmpfs: containerd on it, the CRI runtime below the
/// test's cgroup root, the image GC manager. Field order is drop order: the loop, then the
/// pods and runtime, then containerd (its containers killed by pid, the tmpfs unmounted),
/// then the cgroup root.
struct DiskNode {
    lp: Option<Loop>,
    pods: Arc<RuntimePods<CriRuntime>>,
    runtime: Arc<CriRuntime>,
    gc: ImageGcManager,
    ctd: Containerd,
    root: TestCgroupRoot,
    cgroups: CgroupManager,
    /// The image filesystem's mount point as CRI `ImageFsInfo` reports it.
    imagefs: PathBuf,
    app: BuiltImage,
}

impl DiskNode {
    async fn start(name: &str, tmpfs_bytes: u64) -> DiskNode {
        let root = TestCgroupRoot::v1(name).unwrap();
        let cgroups = CgroupManager::v1(
            Path::new(MOUNT_ROOT),
            &CgroupPath::parse(&root.name).unwrap(),
        )
        .unwrap();
        cgroups
            .ensure_pod_tree(&Resources {
                memory_limit_bytes: Some(1 << 30),
                ..Default::default()
            })
            .unwrap();
        let ctd = Containerd::start_on_tmpfs(name, tmpfs_bytes).expect("start containerd");
        let app = ctd
            .build_and_import(&TestImage::busybox(APP, 0))
            .expect("import the app image");
        std::fs::create_dir_all(ctd.dir().join("nodefs")).unwrap();
        let mut config = CriRuntimeConfig::new(
            ctd.client().await,
            CgroupPath::parse(&root.name).unwrap(),
            ctd.dir().join("pod-logs"),
        );
        config.backoff = BackOffPolicy {
            initial: Duration::from_millis(300),
            max: Duration::from_secs(1),
        };
        config.relist_period = Duration::from_millis(100);
        let runtime = Arc::new(CriRuntime::open(config).await.unwrap());
        let pods = Arc::new(RuntimePods::new(runtime.clone(), cgroups.clone()));
        // Periodic GC off (high threshold 100): only the loop's reclaim deletes images, and
        // no minimum age, so every unused image may go.
        let gc = ImageGcManager::new(
            ctd.client().await,
            ImageGcSettings {
                policy: ImageGcPolicy {
                    high_threshold_percent: 100,
                    low_threshold_percent: 90,
                    min_age_nanos: 0,
                    max_age_nanos: 0,
                },
                period: Duration::from_secs(300),
                list_refresh: Duration::from_secs(30),
                state_dir: None,
                sandbox_image: None,
                imagefs_path: None,
                dry_run: false,
            },
        )
        .unwrap();
        // Where the runtime keeps images, as the kubelet learns it.
        let info = ctd.client().await.image_fs_info().await.unwrap();
        let imagefs = info.image_filesystems[0].mount_point.clone();
        assert_eq!(
            device(&imagefs),
            device(ctd.root()),
            "ImageFsInfo's mount point {} is on containerd's tmpfs",
            imagefs.display()
        );
        DiskNode {
            lp: None,
            pods,
            runtime,
            gc,
            ctd,
            root,
            cgroups,
            imagefs,
            app,
        }
    }

    /// The node filesystem: a directory on the machine's disk, not the tmpfs.
    fn nodefs(&self) -> PathBuf {
        self.ctd.dir().join("nodefs")
    }

    fn import(&self, name: &str, filler: u64) -> BuiltImage {
        self.ctd
            .build_and_import(&TestImage::busybox(
                &format!("localhost/reactor/disk-{name}:1"),
                filler,
            ))
            .unwrap_or_else(|e| panic!("import {name}: {e}"))
    }

    /// Runs a pod of one container from the app image, as the pod lifecycle does: decide's
    /// pod cgroup values, then the runtime spec; registers it with the loop's pod seam.
    async fn run(&self, name: &str, command: &str, resources: &str) -> String {
        let uid = format!("{name}-{}", std::process::id());
        let yaml = format!(
            "metadata: {{name: {name}, namespace: default, uid: {uid}}}\n\
             spec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    \
             image: {APP}\n    command: [sh, -c, '{command}']\n    resources: {resources}\n"
        );
        let doc: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        let info = PodInfo::from_json(doc.clone()).unwrap();
        let node = node_settings();
        let cgroup = CgroupPath::for_pod(&info).unwrap();
        self.cgroups
            .create_pod_cgroup(&cgroup, &Resources::from(&pod_config(&node, &info)))
            .unwrap();
        let spec = pod_spec(
            &serde_json::from_value(doc).unwrap(),
            &info,
            &node,
            &BTreeMap::new(),
        )
        .unwrap();
        self.runtime
            .run_pod(spec.clone())
            .await
            .unwrap_or_else(|e| panic!("run_pod {name}: {e}\n{}", self.ctd.log_tail()));
        let (_, ids) = self.runtime.container_ids(&uid).unwrap();
        self.pods.add(ActivePod {
            info,
            cgroup,
            // CRI puts each container's cgroup below the pod's, named by its id.
            containers: ids
                .into_iter()
                .map(|(name, cgroup)| PodContainer { name, cgroup })
                .collect(),
            restart_policy: spec.restart_policy,
            termination_grace_period: Some(2),
        });
        uid
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

    /// Starts the loop with a hard `{signal}<{threshold_mib}Mi`, woken by the housekeeping
    /// tick every `housekeeping`.
    fn start_loop(&mut self, signal: &str, threshold_mib: u64, housekeeping: Duration) {
        let mut config = Config {
            cgroup_root: format!("/{}", self.root.name),
            eviction_hard: BTreeMap::from([(signal.to_string(), format!("{threshold_mib}Mi"))]),
            ..Config::default()
        };
        config.node.memory_capacity = "1Gi".into();
        config.node.nodefs_path = self.nodefs();
        config.eviction_pressure_transition_period = GoDuration(Duration::from_secs(2));
        config.housekeeping_interval = GoDuration(housekeeping);
        // Disk has no kernel event; eBPF would only cost attach time here, and a node-wide PSI
        // trigger (memory stalls from whatever else the machine runs) could wake a pass the
        // tests expect the tick to wake.
        config.sense.ebpf = false;
        config.sense.psi = false;
        let settings = ReactorSettings::from_config(&config).unwrap();
        let observe = ObserveSettings::from_config(&config, Some(&self.imagefs), None).unwrap();
        assert_eq!(
            (observe.imagefs.as_path(), observe.containerfs.as_path()),
            (self.imagefs.as_path(), self.imagefs.as_path()),
            "imagefs (and containerfs with it) from ImageFsInfo"
        );
        let observer = Observer::new(observe).unwrap();
        let sense = Sense::start(&SenseOptions::from_config(&config, Vec::new())).unwrap();
        assert!(
            sense.report().has(Source::Poll),
            "the housekeeping tick runs"
        );
        let reclaimer: Arc<dyn NodeReclaim> = Arc::new(self.gc.clone());
        let reactor = Reactor::new(
            settings,
            observer,
            self.pods.clone(),
            self.cgroups.clone(),
            Some(reclaimer),
        );
        let (tx, rx) = watch::channel(false);
        // Subscribed before the loop runs: its first pass, at start, may already act.
        let decisions = reactor.handle().subscribe();
        let (handle, task) = spawn(reactor, sense, rx);
        let abort = task.abort_handle();
        let done = tokio::spawn(async move {
            let _ = task.await;
        });
        self.lp = Some(Loop {
            handle,
            decisions,
            shutdown: tx,
            abort,
            done: Some(done),
        });
    }

    /// The next decision whose action is not `None`, up to `timeout`.
    async fn next_action(&mut self, timeout: Duration) -> Option<Decision> {
        let rx = &mut self.lp.as_mut().unwrap().decisions;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await.ok()? {
                Ok(d) if d.action != Action::None => return Some(d),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// Every action decision until none comes for `quiet`.
    async fn actions_until_quiet(&mut self, quiet: Duration) -> Vec<Decision> {
        let mut out = Vec::new();
        while let Some(d) = self.next_action(quiet).await {
            out.push(d);
        }
        out
    }

    /// Stops the loop and the pods left, removes the pod cgroups and checks that nothing is
    /// left below the cgroup root; containerd and its tmpfs go with the guard.
    async fn finish(mut self) {
        if let Some(l) = self.lp.take() {
            l.stop().await;
        }
        for p in self.pods.pods().iter() {
            let _ = self.runtime.stop_pod(&p.info.uid, Duration::ZERO).await;
            self.pods.remove(&p.info.uid);
            self.cgroups
                .remove_pod_cgroup(&p.cgroup, Duration::from_secs(5))
                .unwrap();
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

fn ids<'a>(images: impl IntoIterator<Item = &'a BuiltImage>) -> BTreeSet<String> {
    images.into_iter().map(|i| i.id.clone()).collect()
}

/// The housekeeping tick (or the loop's own housekeeping timer) woke this decision.
fn woken_by_housekeeping(d: &Decision) -> bool {
    d.wake.timer
        || d.wake
            .event
            .as_ref()
            .is_some_and(|e| e.source == Source::Poll && e.kind == Kind::Tick)
}

/// Deleting the unused images relieves the pressure: one `Reclaimed` decision that resolved
/// it, the unused images gone from containerd, the running pod's image and the sandbox image
/// kept, no pod evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_images_are_deleted_and_no_pod_is_evicted() {
    if !ready() {
        return;
    }
    let mut node = DiskNode::start("disk-reclaim", 128 * MIB).await;
    let unused = [
        node.import("old1", 3 * MIB),
        node.import("old2", 4 * MIB),
        node.import("old3", 5 * MIB),
    ];
    let keep = node
        .run("keep", "exec sleep 3600", "{requests: {memory: 16Mi}}")
        .await;
    let client = node.runtime.client().clone();
    let sizes = listed(&client).await;
    let unused_bytes: u64 = unused.iter().map(|i| sizes[&i.id]).sum();

    // Deleting the unused images frees at least their listed size (blobs, plus their
    // unpacked snapshots). The threshold sits half that size below what is available now,
    // and a filler of that size crosses it: deleting the images brings it back above.
    let before = available(&node.imagefs);
    let threshold_mib = (before - unused_bytes / 2) / MIB;
    let threshold = threshold_mib * MIB;
    assert!(
        before > threshold + 4 * MIB && before - unused_bytes + 4 * MIB < threshold,
        "test design: {before} available, {unused_bytes} unused, threshold {threshold}"
    );
    eprintln!(
        "imagefs {}: {before} bytes available, unused images {unused_bytes} bytes, threshold {threshold_mib}Mi",
        node.imagefs.display()
    );
    node.start_loop(
        "imagefs.available",
        threshold_mib,
        Duration::from_millis(200),
    );
    let quiet = node.actions_until_quiet(Duration::from_secs(1)).await;
    assert!(quiet.is_empty(), "no pressure yet: {quiet:?}");

    std::fs::write(
        node.ctd.root().join("filler"),
        vec![0u8; usize::try_from(unused_bytes).unwrap()],
    )
    .unwrap();
    let d = node
        .next_action(Duration::from_secs(15))
        .await
        .expect("a decision once the threshold is crossed");
    eprintln!("{d:?}");
    let Action::Reclaimed {
        freed_bytes,
        resolved,
        error,
    } = &d.action
    else {
        panic!("reclaim first: {d:?}");
    };
    assert!(*resolved, "deleting the unused images was enough: {d:?}");
    assert_eq!(error, &None);
    assert_eq!(
        *freed_bytes, unused_bytes,
        "the deleted images' sizes as CRI listed them"
    );
    assert!(
        d.met
            .iter()
            .any(|m| m == &format!("imagefs.available<{threshold_mib}Mi")),
        "{:?}",
        d.met
    );
    assert!(
        d.met
            .iter()
            .any(|m| m == &format!("containerfs.available<{threshold_mib}Mi")),
        "a separate imagefs holding the writable layers: containerfs inherits the imagefs threshold: {:?}",
        d.met
    );
    assert_eq!(d.conditions, ["DiskPressure"]);
    assert!(woken_by_housekeeping(&d), "{:?}", d.wake);
    assert!(available(&node.imagefs) >= threshold);

    // Nothing else happens: the pressure is gone and nobody is evicted.
    let after = node.actions_until_quiet(Duration::from_secs(2)).await;
    assert!(
        after
            .iter()
            .all(|d| !matches!(d.action, Action::Evicted { .. })),
        "{after:?}"
    );
    assert!(node.pods.evictions().is_empty());
    let left: BTreeSet<String> = listed(&client).await.into_keys().collect();
    assert_eq!(
        left,
        ids([&node.app, &node.ctd.sandbox_image]),
        "the unused images are gone; the running pod's image and the sandbox image stay"
    );
    assert!(node.is_running(&keep).await, "the pod still runs");
    // DiskPressure is held for the transition period (2 s) after the last time the
    // threshold was met, then clears.
    let mut conditions = node.lp.as_ref().unwrap().handle.conditions();
    let cleared = tokio::time::timeout(
        Duration::from_secs(10),
        conditions.wait_for(|c| c.is_empty()),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    assert!(cleared, "DiskPressure never cleared");
    node.finish().await;
}

/// Deleting every unused image is not enough while a pod's writable layer holds the space:
/// the loop reclaims first, then evicts exactly one pod — the first of the ranking, which
/// for `imagefs` on a separate image filesystem goes by the containers' writable layers
/// (seed 003), as containerd measures them — with the kubelet's message for
/// `ephemeral-storage`. Removing the victim frees its writable layer, so the other pod stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_follows_a_reclaim_that_was_not_enough() {
    if !ready() {
        return;
    }
    let mut node = DiskNode::start("disk-evict", 128 * MIB).await;
    let unused = [
        node.import("spare1", 2 * MIB),
        node.import("spare2", 3 * MIB),
    ];
    // Neither pod requests ephemeral storage: without writable-layer figures the two would
    // tie and keep their order (by uid, "idle" first); by writable layer, "writer" is first.
    let idle = node
        .run("idle", "exec sleep 3600", "{requests: {memory: 16Mi}}")
        .await;
    let start = available(&node.imagefs);
    // 40 MiB into the container's writable layer, which lives on the image filesystem.
    let writer = node
        .run(
            "writer",
            "dd if=/dev/zero of=/scratch bs=1048576 count=40 && exec sleep 3600",
            "{}",
        )
        .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while start - available(&node.imagefs) < 40 * MIB {
        assert!(
            Instant::now() < deadline,
            "the writer never wrote its 40 MiB"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // containerd samples writable layers on its own period: wait for a sample with the 40 MiB.
    loop {
        let layers = node.runtime.writable_layers(&writer).await.unwrap();
        if layers
            .values()
            .any(|l| l.used_bytes.unwrap_or(0) >= 40 * MIB)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "containerd never reported the writer's layer: {layers:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let client = node.runtime.client().clone();
    let sizes = listed(&client).await;
    let unused_bytes: u64 = unused.iter().map(|i| sizes[&i.id]).sum();

    // Deleting the unused images frees their blobs and snapshots: at most twice their
    // listed size. The threshold is above what that can reach, and below what removing
    // the writer's 40 MiB layer gives back.
    let before = available(&node.imagefs);
    let threshold_mib = (before + 2 * unused_bytes).div_ceil(MIB) + 6;
    let threshold = threshold_mib * MIB;
    assert!(
        before + unused_bytes + 40 * MIB > threshold + 4 * MIB,
        "test design: {before} available, {unused_bytes} unused, threshold {threshold}"
    );
    eprintln!(
        "imagefs {}: {before} bytes available, unused images {unused_bytes} bytes, threshold {threshold_mib}Mi",
        node.imagefs.display()
    );
    // After a disk eviction the loop holds disk decisions for one housekeeping interval, by
    // when containerd has dropped the victim's writable layer (whatever wakes the loop).
    node.start_loop("imagefs.available", threshold_mib, Duration::from_secs(1));
    let actions = node.actions_until_quiet(Duration::from_secs(3)).await;
    for d in &actions {
        eprintln!("#{} {:?} met={:?}", d.seq, d.action, d.met);
    }
    let evictions: Vec<&Decision> = actions
        .iter()
        .filter(|d| matches!(d.action, Action::Evicted { .. }))
        .collect();
    assert_eq!(evictions.len(), 1, "exactly one pod evicted: {actions:?}");
    let evicted = evictions[0];
    let reclaimed = actions
        .iter()
        .find(|d| matches!(d.action, Action::Reclaimed { .. }))
        .expect("a reclaim");
    assert!(
        reclaimed.seq < evicted.seq,
        "the reclaim comes before the eviction: {actions:?}"
    );
    let Action::Reclaimed {
        freed_bytes,
        resolved,
        error,
    } = &reclaimed.action
    else {
        unreachable!()
    };
    assert_eq!(
        (*freed_bytes, *resolved, error),
        (unused_bytes, false, &None),
        "every unused image deleted, not enough"
    );
    assert!(woken_by_housekeeping(reclaimed), "{:?}", reclaimed.wake);

    let Action::Evicted {
        uid,
        grace_seconds,
        message,
        annotations,
        error,
        ..
    } = &evicted.action
    else {
        unreachable!()
    };
    let ranking: Vec<&str> = evicted.ranking.iter().map(|p| p.uid.as_str()).collect();
    assert_eq!(
        ranking,
        [writer.as_str(), idle.as_str()],
        "ranked by writable layer"
    );
    assert_eq!(uid, &writer, "the first of the ranking is evicted");
    assert_eq!(*grace_seconds, 0, "hard threshold");
    // The eviction's second record: the writer's cgroup emptied.
    assert!(
        actions.iter().any(|d| matches!(&d.action,
            Action::Released { uid: u, released: true, .. } if u == uid)),
        "the writer's cgroup emptied: {actions:?}"
    );
    assert_eq!(error, &None);
    let prefix = format!(
        "The node was low on resource: ephemeral-storage. Threshold quantity: {threshold_mib}Mi, available: "
    );
    assert!(message.starts_with(&prefix), "{message}");
    assert_eq!(
        annotations.get("starved_resource").map(String::as_str),
        Some("ephemeral-storage"),
        "{annotations:?}"
    );
    let status = node
        .pods
        .eviction_status(&writer)
        .expect("the writer's status");
    assert_eq!(
        (
            status.phase.as_str(),
            status.reason.as_str(),
            status.message.as_str()
        ),
        ("Failed", "Evicted", message.as_str())
    );
    // Any reclaim after the eviction resolved the pressure: the writer's layer went with it.
    // (The eviction's own release record aside.)
    for d in actions
        .iter()
        .filter(|d| d.seq > evicted.seq && !matches!(d.action, Action::Released { .. }))
    {
        assert!(
            matches!(d.action, Action::Reclaimed { resolved: true, .. }),
            "{d:?}"
        );
    }
    assert!(
        available(&node.imagefs) >= threshold,
        "removing the evicted pod freed its writable layer"
    );
    assert!(node.is_running(&idle).await, "the other pod still runs");
    let left: BTreeSet<String> = listed(&client).await.into_keys().collect();
    assert_eq!(left, ids([&node.app, &node.ctd.sandbox_image]));
    node.finish().await;
}

/// Pressure on the node filesystem of a node with a separate image filesystem: seed 003
/// reclaims dead containers there but no image (images do not live on nodefs, deleting them
/// would relieve nothing), then evicts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodefs_pressure_with_a_separate_imagefs_deletes_no_image() {
    if !ready() {
        return;
    }
    let mut node = DiskNode::start("disk-nodefs", 96 * MIB).await;
    // The node filesystem: a second small tmpfs inside containerd's temp dir (unmounted with
    // it).
    let data = std::ffi::CString::new(format!("size={},mode=0700", 32 * MIB)).unwrap();
    rustix::mount::mount(
        "tmpfs",
        node.nodefs(),
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        data.as_c_str(),
    )
    .unwrap();
    let unused = [node.import("kept1", 2 * MIB), node.import("kept2", 3 * MIB)];
    let pod = node
        .run("web", "exec sleep 3600", "{requests: {memory: 16Mi}}")
        .await;
    node.start_loop("nodefs.available", 16, Duration::from_millis(200));
    let quiet = node.actions_until_quiet(Duration::from_secs(1)).await;
    assert!(quiet.is_empty(), "no pressure yet: {quiet:?}");

    std::fs::write(node.nodefs().join("filler"), vec![0u8; 24 << 20]).unwrap();
    let reclaimed = node
        .next_action(Duration::from_secs(15))
        .await
        .expect("a decision once the threshold is crossed");
    assert_eq!(
        reclaimed.action,
        Action::Reclaimed {
            freed_bytes: 0,
            resolved: false,
            error: None
        },
        "dead containers only: {reclaimed:?}"
    );
    assert_eq!(reclaimed.met, ["nodefs.available<16Mi"]);
    let evicted = node
        .next_action(Duration::from_secs(15))
        .await
        .expect("an eviction");
    let Action::Evicted { uid, message, .. } = &evicted.action else {
        panic!("{evicted:?}");
    };
    assert_eq!(uid, &pod);
    assert!(
        message.starts_with(
            "The node was low on resource: ephemeral-storage. Threshold quantity: 16Mi, available: "
        ),
        "{message}"
    );
    assert!(reclaimed.seq < evicted.seq);
    let client = node.runtime.client().clone();
    let left: BTreeSet<String> = listed(&client).await.into_keys().collect();
    assert!(
        ids(&unused).is_subset(&left),
        "no image deleted for nodefs pressure: {left:?}"
    );
    node.finish().await;
}
