//! Image garbage collection against a real containerd (Debian's 1.6), started privately per
//! test by the harness; where usage matters its root (the image filesystem) is a small tmpfs
//! the harness mounts in the test's temp dir, so thresholds are crossed with a few MiB.
//!
//! What "freed" means here: a round reports, as the kubelet does, the sum of the deleted
//! images' sizes as CRI `ListImages` reports them (containerd 1.6: the sum of the image's
//! blobs). The tests check that figure exactly against the listing taken before the round,
//! and check the filesystem separately: statvfs on the tmpfs must show at least that much
//! more space (containerd drops the blobs and the unpacked snapshot), and `ImageFsInfo`'s
//! snapshot usage — refreshed by containerd's stats syncer every second — must drop by at
//! least the deleted images' filler, read only once a sample newer than the round is in.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reactor::act::cri::{
    ContainerSpec, CriClient, ImageFsInfo, NamespaceMode, PodSandboxSpec, Timeouts,
};
use reactor::decide::image_gc::{bytes_to_free, usage_percent, ImageGcPolicy};
use reactor::images::{GcTrigger, ImageGcEvent, ImageGcManager, ImageGcSettings, ImageRecords};
use reactor_tests::{
    containerd_available, require, BuiltImage, Containerd, TestCgroupTree, TestImage,
};
use tokio::sync::broadcast;

const MIB: u64 = 1 << 20;
const MIN_AGE_2M: i64 = 120_000_000_000;

fn ready() -> bool {
    require(
        containerd_available(),
        "root, containerd, runc and busybox-static for the image GC tests",
    )
}

fn policy(high: i64, low: i64, min_age_nanos: i64) -> ImageGcPolicy {
    ImageGcPolicy {
        high_threshold_percent: high,
        low_threshold_percent: low,
        min_age_nanos,
        max_age_nanos: 0,
    }
}

fn settings(policy: ImageGcPolicy, state_dir: Option<PathBuf>) -> ImageGcSettings {
    ImageGcSettings {
        policy,
        period: Duration::from_secs(300),
        list_refresh: Duration::from_secs(30),
        state_dir,
        // The sandbox image comes from containerd's status, as on a real node.
        sandbox_image: None,
        imagefs_path: None,
        dry_run: false,
    }
}

async fn manager(ctd: &Containerd, s: ImageGcSettings) -> ImageGcManager {
    let client = CriClient::connect(&ctd.endpoint(), Timeouts::default())
        .await
        .expect("client");
    ImageGcManager::new(client, s).expect("image GC manager")
}

fn import(ctd: &Containerd, name: &str, filler: u64) -> BuiltImage {
    ctd.build_and_import(&TestImage::busybox(
        &format!("localhost/reactor/gc-{name}:1"),
        filler,
    ))
    .unwrap_or_else(|e| panic!("import {name}: {e}"))
}

/// Image ids and sizes as CRI lists them now.
async fn listed(client: &CriClient) -> BTreeMap<String, u64> {
    client
        .list_images()
        .await
        .expect("ListImages")
        .into_iter()
        .map(|i| (i.id, i.size_bytes))
        .collect()
}

fn ids<'a>(images: impl IntoIterator<Item = &'a BuiltImage>) -> BTreeSet<String> {
    images.into_iter().map(|i| i.id.clone()).collect()
}

fn statvfs(path: &Path) -> (i64, i64) {
    let st = rustix::fs::statvfs(path).expect("statvfs");
    (
        (st.f_blocks * st.f_frsize) as i64,
        (st.f_bavail * st.f_frsize) as i64,
    )
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as i64
}

/// The image filesystem's snapshot usage from a stats-syncer sample taken after `after_ns`.
async fn used_after(client: &CriClient, after_ns: i64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info: ImageFsInfo = client.image_fs_info().await.expect("ImageFsInfo");
        let fs = &info.image_filesystems[0];
        if fs.timestamp_ns > after_ns {
            return fs.used_bytes.expect("used bytes");
        }
        assert!(
            Instant::now() < deadline,
            "no ImageFsInfo sample newer than {after_ns}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Receives events until one matches `want`, failing after 30 s.
async fn wait_event(
    rx: &mut broadcast::Receiver<ImageGcEvent>,
    what: &str,
    want: impl Fn(&ImageGcEvent) -> bool,
) -> ImageGcEvent {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Err(_) => panic!("timed out waiting for {what}"),
            Ok(Ok(e)) if want(&e) => return e,
            Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(e)) => panic!("event channel: {e}"),
        }
    }
}

/// A pod sandbox in the node's network namespace under the test's cgroup tree.
struct Pod {
    id: String,
    spec: PodSandboxSpec,
}

async fn run_pod(client: &CriClient, tree: &TestCgroupTree, name: &str, ctd: &Containerd) -> Pod {
    let spec = PodSandboxSpec {
        name: name.into(),
        uid: format!("{name}-{}", std::process::id()),
        namespace: "default".into(),
        cgroup_parent: tree.cgroup(&format!("/{name}")),
        network: NamespaceMode::Node,
        ..Default::default()
    };
    let id = client
        .run_pod_sandbox(&spec)
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", ctd.log_tail()));
    Pod { id, spec }
}

async fn run_container(
    client: &CriClient,
    pod: &Pod,
    name: &str,
    image: &BuiltImage,
    command: &[&str],
    ctd: &Containerd,
) -> String {
    let spec = ContainerSpec {
        name: name.into(),
        image: image.name.clone(),
        command: command.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let id = client
        .create_container(&pod.id, &spec, &pod.spec)
        .await
        .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}\n{}", ctd.log_tail()));
    client
        .start_container(&id)
        .await
        .unwrap_or_else(|e| panic!("StartContainer {name}: {e}\n{}", ctd.log_tail()));
    id
}

const SLEEP: &[&str] = &["/bin/sleep", "3600"];

/// A dozen images on a 160 MiB image filesystem: one periodic round frees the unused,
/// old-enough images least recently used first and stops once usage is at the low
/// threshold; images of running containers, the sandbox image and images younger than
/// `imageMinimumGCAge` stay. Then a policy that cannot be met reports FreeDiskSpaceFailed,
/// and again ImageGCFailed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_frees_lru_first_down_to_the_low_threshold() {
    if !ready() {
        return;
    }
    let tree = TestCgroupTree::new("image-gc");
    let ctd = Containerd::start_on_tmpfs("gc", 160 * MIB).expect("start containerd");
    let client = ctd.client().await;
    let state = tempfile::tempdir().expect("state dir");

    let run1 = import(&ctd, "run1", MIB);
    let run2 = import(&ctd, "run2", 2 * MIB);
    let past1 = import(&ctd, "past1", 6 * MIB);
    let past2 = import(&ctd, "past2", 3 * MIB);
    let old_filler = [1, 2, 3, 2, 1, 1];
    let old: Vec<BuiltImage> = old_filler
        .iter()
        .enumerate()
        .map(|(i, m)| import(&ctd, &format!("old{i}"), m * MIB))
        .collect();

    // A manager with GC off does the detections that build the history: the first finds
    // every image present (dated to the unknown past, as the kubelet's first detection).
    let history = manager(
        &ctd,
        settings(policy(100, 90, MIN_AGE_2M), Some(state.path().into())),
    )
    .await;
    history.detect_images().await.expect("initial detection");
    // past1, then past2, run and stop: past1 is the less recently used.
    let pod = run_pod(&client, &tree, "gc", &ctd).await;
    for (name, image) in [("past1", &past1), ("past2", &past2)] {
        let id = run_container(&client, &pod, name, image, SLEEP, &ctd).await;
        let in_use = history.detect_images().await.expect("detection");
        assert!(in_use.contains(&image.id), "{name} in use while it runs");
        client
            .stop_container(&id, Duration::ZERO)
            .await
            .expect("StopContainer");
    }
    run_container(&client, &pod, "run1", &run1, SLEEP, &ctd).await;
    run_container(&client, &pod, "run2", &run2, SLEEP, &ctd).await;
    // Pulled after the first detection: younger than the minimum age.
    let young = [
        import(&ctd, "young1", 2 * MIB),
        import(&ctd, "young2", 3 * MIB),
    ];
    let in_use = history.detect_images().await.expect("detection");
    assert_eq!(
        in_use,
        ids([&run1, &run2, &ctd.sandbox_image]),
        "running containers and the sandbox image (from containerd's status) are in use"
    );
    let records = history.records().await;
    assert_eq!(records.len(), 13, "a dozen images and the pause image");
    let r = |i: &BuiltImage| records.get(&i.id).expect("record").clone();
    assert!(r(&past1).last_used < r(&past2).last_used);
    assert!(r(&old[0]).first_detected.is_none() && r(&old[0]).last_used.is_none());
    assert!(r(&young[0]).first_detected.is_some());
    drop(history);

    // Thresholds from the filesystem as it is now: the amount to free lies inside past1,
    // so every old image and past1 must go, and past2 must stay.
    let sizes = listed(&client).await;
    let size = |i: &BuiltImage| sizes[&i.id] as i64;
    let old_total: i64 = old.iter().map(size).sum();
    let (capacity, available) = statvfs(ctd.root());
    let usage = usage_percent(capacity, available);
    let target = old_total + size(&past1) / 2;
    let low = 100 - ((target + available) * 100 / capacity);
    let planned = bytes_to_free(capacity, available, low);
    assert!(
        planned > old_total + MIB as i64 && planned < old_total + size(&past1) - MIB as i64,
        "test design: {planned} bytes to free should fall inside past1 (old images {old_total}, past1 {})",
        size(&past1)
    );
    // Anywhere from the low threshold to the usage now starts the round.
    let high = (low + usage + 1) / 2;
    eprintln!(
        "image fs {capacity} bytes, {available} available ({usage}%); policy high {high} low {low}; \
         plan frees {planned} bytes (old images {old_total}, past1 {})",
        size(&past1)
    );

    let gc = manager(
        &ctd,
        settings(policy(high, low, MIN_AGE_2M), Some(state.path().into())),
    )
    .await;
    assert_eq!(
        gc.records().await,
        records,
        "the history manager's records, restored"
    );
    let mut events = gc.subscribe();
    let t0 = now_ns();
    let used_before = used_after(&client, t0).await;
    let (_, available_before) = statvfs(ctd.root());
    let started = Instant::now();
    let round = gc.garbage_collect().await.expect("GC round");
    eprintln!("round took {:?}: {round:?}", started.elapsed());

    let deleted: Vec<String> = round.deleted.iter().map(|d| d.id.clone()).collect();
    assert_eq!(deleted.len(), 7, "{deleted:?}");
    assert_eq!(
        deleted[..6].iter().cloned().collect::<BTreeSet<_>>(),
        ids(&old),
        "never-used images first"
    );
    assert_eq!(deleted[6], past1.id, "then the least recently used");
    let expected_freed: u64 = deleted.iter().map(|id| sizes[id]).sum();
    assert_eq!(
        round.freed_bytes, expected_freed,
        "sum of the sizes CRI listed"
    );
    let need = round.bytes_to_free.expect("over the high threshold");
    assert!(
        expected_freed as i64 >= need && (expected_freed - sizes[&past1.id]) < need as u64,
        "stopped once enough was freed"
    );
    assert_eq!(round.shortfall, None);
    let left: BTreeSet<String> = listed(&client).await.into_keys().collect();
    assert_eq!(
        left,
        ids([
            &run1,
            &run2,
            &past2,
            &young[0],
            &young[1],
            &ctd.sandbox_image
        ]),
        "in use, sandbox, young and the more recently used image remain"
    );
    match wait_event(&mut events, "RoundFinished", |e| {
        matches!(e, ImageGcEvent::RoundFinished { .. })
    })
    .await
    {
        ImageGcEvent::RoundFinished {
            trigger,
            freed_bytes,
            deleted: d,
            errors,
            ..
        } => {
            assert_eq!(trigger, GcTrigger::Periodic);
            assert_eq!((freed_bytes, d), (expected_freed, deleted.clone()));
            assert!(errors.is_empty());
        }
        _ => unreachable!(),
    }
    assert!(events.try_recv().is_err(), "no FreeDiskSpaceFailed");
    let c = gc.counters();
    assert_eq!(
        (c.runs, c.failures, c.freed_bytes, c.images_deleted),
        (1, 0, expected_freed, 7)
    );

    // The filesystem: tmpfs frees at once; containerd's snapshot usage once sampled again.
    let (_, available_after) = statvfs(ctd.root());
    assert!(
        available_after - available_before >= expected_freed as i64,
        "statvfs gained {} bytes for {expected_freed} reported",
        available_after - available_before
    );
    assert!(
        usage_percent(capacity, available_after) <= low,
        "usage {}% is at or under the low threshold {low}%",
        usage_percent(capacity, available_after)
    );
    let used_after_round = used_after(&client, now_ns()).await;
    let filler: u64 = (old_filler.iter().sum::<u64>() + 6) * MIB;
    eprintln!(
        "reported {expected_freed}; statvfs +{}; ImageFsInfo used {used_before} -> {used_after_round}",
        available_after - available_before
    );
    assert!(
        used_before.saturating_sub(used_after_round) >= filler,
        "snapshot usage dropped by the fillers at least"
    );
    drop(gc);

    // Now a policy that asks for everything: only past2 may go; the shortfall is the
    // kubelet's FreeDiskSpaceFailed, twice in a row also ImageGCFailed.
    let greedy = manager(
        &ctd,
        settings(policy(0, 0, MIN_AGE_2M), Some(state.path().into())),
    )
    .await;
    let mut events = greedy.subscribe();
    let round = greedy.garbage_collect().await.expect("greedy round");
    assert_eq!(
        round
            .deleted
            .iter()
            .map(|d| d.id.as_str())
            .collect::<Vec<_>>(),
        [past2.id.as_str()]
    );
    let message = match wait_event(&mut events, "FreeDiskSpaceFailed", |e| {
        matches!(e, ImageGcEvent::FreeDiskSpaceFailed { .. })
    })
    .await
    {
        ImageGcEvent::FreeDiskSpaceFailed { message } => message,
        _ => unreachable!(),
    };
    assert!(
        message
            .starts_with("Failed to garbage collect required amount of images. Attempted to free ")
            && message.ends_with(&format!(
                "but only found {} bytes eligible to free.",
                sizes[&past2.id]
            )),
        "{message}"
    );
    greedy.garbage_collect().await.expect("second greedy round");
    wait_event(&mut events, "ImageGCFailed", |e| {
        matches!(e, ImageGcEvent::ImageGcFailed { .. })
    })
    .await;
    assert_eq!(greedy.counters().failures, 2);
    let left: BTreeSet<String> = listed(&client).await.into_keys().collect();
    assert_eq!(
        left,
        ids([&run1, &run2, &young[0], &young[1], &ctd.sandbox_image])
    );
}

/// The disk-pressure reclaim with periodic GC off (high threshold 100): dead containers and
/// not-ready sandboxes go first, then every unused image old enough; the running
/// container's image, the sandbox image and a fresh image stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_unused_images_reclaims_with_periodic_gc_off() {
    if !ready() {
        return;
    }
    let tree = TestCgroupTree::new("image-reclaim");
    let ctd = Containerd::start("reclaim").expect("start containerd");
    let client = ctd.client().await;
    let keep = import(&ctd, "keep", MIB);
    let dead = import(&ctd, "dead", 2 * MIB);
    let idle = [import(&ctd, "idle1", MIB), import(&ctd, "idle2", 3 * MIB)];

    let mut s = settings(policy(100, 90, MIN_AGE_2M), None);
    s.period = Duration::from_millis(100);
    s.list_refresh = Duration::from_millis(100);
    let m = manager(&ctd, s).await;
    let task = m.spawn();
    let detections = |n: u64| {
        let m = m.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            while m.counters().detections < n {
                assert!(Instant::now() < deadline, "detections stalled");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    detections(1).await;
    let fresh = import(&ctd, "fresh", MIB);
    let live = run_pod(&client, &tree, "live", &ctd).await;
    run_container(&client, &live, "keep", &keep, SLEEP, &ctd).await;
    let gone = run_pod(&client, &tree, "gone", &ctd).await;
    let exited = run_container(&client, &gone, "dead", &dead, &["/bin/true"], &ctd).await;
    client
        .stop_pod_sandbox(&gone.id)
        .await
        .expect("StopPodSandbox");
    let n = m.counters().detections;
    detections(n + 2).await;
    let c = m.counters();
    assert_eq!(c.runs, 0, "no periodic round with a high threshold of 100");
    assert_eq!(
        listed(&client).await.len(),
        6,
        "nothing deleted by the loop"
    );
    assert_eq!(
        m.image_list().map(|l| l.len()),
        Some(6),
        "the cached image list is refreshed"
    );
    assert!(m
        .records()
        .await
        .get(&fresh.id)
        .and_then(|r| r.first_detected)
        .is_some());

    let sizes = listed(&client).await;
    let mut events = m.subscribe();
    let r = m.delete_unused_images().await.expect("reclaim");
    eprintln!("reclaim: {r:?}");
    assert_eq!(r.containers_removed, std::slice::from_ref(&exited));
    assert_eq!(r.sandboxes_removed, std::slice::from_ref(&gone.id));
    let deleted: BTreeSet<String> = r.deleted.iter().map(|d| d.id.clone()).collect();
    assert_eq!(deleted, ids([&dead, &idle[0], &idle[1]]));
    let freed: u64 = deleted.iter().map(|id| sizes[id]).sum();
    assert_eq!(r.freed_bytes, freed);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let left: BTreeSet<String> = listed(&client).await.into_keys().collect();
    assert_eq!(left, ids([&keep, &fresh, &ctd.sandbox_image]));
    match wait_event(&mut events, "the reclaim's RoundFinished", |e| {
        matches!(
            e,
            ImageGcEvent::RoundFinished {
                trigger: GcTrigger::Reclaim,
                ..
            }
        )
    })
    .await
    {
        ImageGcEvent::RoundFinished { freed_bytes, .. } => assert_eq!(freed_bytes, freed),
        _ => unreachable!(),
    }
    let c = m.counters();
    assert_eq!(
        (
            c.reclaims,
            c.freed_bytes,
            c.containers_removed,
            c.sandboxes_removed
        ),
        (1, freed, 1, 1)
    );
    assert!(client
        .container_status(&exited)
        .await
        .expect_err("removed container")
        .is_not_found());
    task.stop().await;
}

/// `dryRun`: the disk-pressure reclaim plans as always and removes nothing. It lists the
/// exited container, the not-ready sandbox and the unused images it would have removed
/// (the event marked a dry run), and containerd still holds every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_reclaim_lists_what_it_would_delete_and_deletes_nothing() {
    if !ready() {
        return;
    }
    let tree = TestCgroupTree::new("image-dry-run");
    let ctd = Containerd::start("dry-run").expect("start containerd");
    let client = ctd.client().await;
    let keep = import(&ctd, "keep", MIB);
    let dead = import(&ctd, "dead", 2 * MIB);
    let idle = [import(&ctd, "idle1", MIB), import(&ctd, "idle2", 3 * MIB)];
    let mut s = settings(policy(100, 90, 0), None);
    s.dry_run = true;
    let m = manager(&ctd, s).await;
    let live = run_pod(&client, &tree, "live", &ctd).await;
    run_container(&client, &live, "keep", &keep, SLEEP, &ctd).await;
    let gone = run_pod(&client, &tree, "gone", &ctd).await;
    let exited = run_container(&client, &gone, "dead", &dead, &["/bin/true"], &ctd).await;
    client
        .stop_pod_sandbox(&gone.id)
        .await
        .expect("StopPodSandbox");
    let before = listed(&client).await;

    let mut events = m.subscribe();
    let r = m.delete_unused_images().await.expect("reclaim");
    eprintln!("dry-run reclaim: {r:?}");
    // What it would have removed: as a real reclaim would.
    assert_eq!(r.containers_removed, std::slice::from_ref(&exited));
    assert_eq!(r.sandboxes_removed, std::slice::from_ref(&gone.id));
    let would: BTreeSet<String> = r.deleted.iter().map(|d| d.id.clone()).collect();
    assert_eq!(would, ids([&dead, &idle[0], &idle[1]]));
    let freed: u64 = would.iter().map(|id| before[id]).sum();
    assert_eq!(r.freed_bytes, freed);
    match wait_event(&mut events, "the reclaim's RoundFinished", |e| {
        matches!(
            e,
            ImageGcEvent::RoundFinished {
                trigger: GcTrigger::Reclaim,
                ..
            }
        )
    })
    .await
    {
        ImageGcEvent::RoundFinished {
            dry_run, deleted, ..
        } => {
            assert!(dry_run, "the event is marked a dry run");
            assert_eq!(deleted.into_iter().collect::<BTreeSet<_>>(), would);
        }
        _ => unreachable!(),
    }
    // Nothing was removed: every image, the exited container and its records are there.
    assert_eq!(listed(&client).await, before);
    client
        .container_status(&exited)
        .await
        .expect("the exited container is still there");
    let records = m.records().await;
    for id in &would {
        assert!(records.get(id).is_some(), "{id}: its record is kept");
    }
    let c = m.counters();
    assert_eq!(
        (
            c.freed_bytes,
            c.images_deleted,
            c.containers_removed,
            c.sandboxes_removed
        ),
        (0, 0, 0, 0)
    );
}

/// A restarted manager takes each image's first-detected time from its checkpoint: an image
/// seen a moment before the restart stays protected by the minimum age, where a manager
/// without history dates everything it finds to the unknown past.
#[tokio::test]
async fn a_restarted_manager_keeps_first_detected_times() {
    if !ready() {
        return;
    }
    let ctd = Containerd::start("restart").expect("start containerd");
    let state = tempfile::tempdir().expect("state dir");
    let a = import(&ctd, "a", MIB);
    let b = import(&ctd, "b", MIB);
    let one_hour = 3_600_000_000_000;

    let first = manager(
        &ctd,
        settings(policy(0, 0, one_hour), Some(state.path().into())),
    )
    .await;
    first.detect_images().await.expect("detection");
    let c = import(&ctd, "c", MIB);
    first.detect_images().await.expect("detection");
    let before: ImageRecords = first.records().await;
    let c_seen = before
        .get(&c.id)
        .and_then(|r| r.first_detected)
        .expect("c dated");
    assert!(before.get(&a.id).expect("a").first_detected.is_none());
    drop(first);
    assert!(state.path().join("image-records.json").exists());

    // Pulled while the agent was down.
    let d = import(&ctd, "d", MIB);
    let second = manager(
        &ctd,
        settings(policy(0, 0, one_hour), Some(state.path().into())),
    )
    .await;
    assert_eq!(second.records().await, before, "restored as saved");
    second.detect_images().await.expect("detection");
    let after = second.records().await;
    assert_eq!(
        after.get(&c.id).and_then(|r| r.first_detected),
        Some(c_seen)
    );
    assert!(after.get(&a.id).expect("a").first_detected.is_none());
    let d_seen = after
        .get(&d.id)
        .and_then(|r| r.first_detected)
        .expect("d dated at the restart");
    assert!(d_seen > c_seen);

    // GC wants everything (high 0, low 0); only the images older than an hour may go.
    let round = second.garbage_collect().await.expect("round");
    let deleted: BTreeSet<String> = round.deleted.iter().map(|d| d.id.clone()).collect();
    assert_eq!(deleted, ids([&a, &b]));
    assert!(
        round.shortfall.is_some(),
        "the rest is protected: FreeDiskSpaceFailed"
    );

    // Without history, the same images would all look old.
    let fresh = manager(&ctd, settings(policy(0, 0, one_hour), None)).await;
    fresh.detect_images().await.expect("detection");
    assert!(fresh
        .records()
        .await
        .get(&c.id)
        .expect("c")
        .first_detected
        .is_none());
}

/// containerd stopped under a running loop: the round that meets the dead socket fails with
/// RoundFailed, the next with ImageGCFailed too; the loop keeps going and its rounds succeed
/// again once containerd is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_survives_containerd_going_away_and_recovers() {
    if !ready() {
        return;
    }
    let mut ctd = Containerd::start_on_tmpfs("gc-down", 64 * MIB).expect("start containerd");
    import(&ctd, "x", MIB);
    import(&ctd, "y", 2 * MIB);
    let mut s = settings(policy(90, 80, MIN_AGE_2M), None);
    s.period = Duration::from_millis(200);
    s.list_refresh = Duration::from_millis(200);
    let m = manager(&ctd, s).await;
    let mut events = m.subscribe();
    let task = m.spawn();
    let finished = |e: &ImageGcEvent| {
        matches!(
            e,
            ImageGcEvent::RoundFinished {
                usage_percent: Some(_),
                ..
            }
        )
    };
    wait_event(&mut events, "a first round", finished).await;

    ctd.stop();
    let reason = match wait_event(&mut events, "RoundFailed: runtime unavailable", |e| {
        matches!(e, ImageGcEvent::RoundFailed { reason, .. } if reason.contains("container runtime unavailable"))
    })
    .await
    {
        ImageGcEvent::RoundFailed { trigger, reason } => {
            assert_eq!(trigger, GcTrigger::Periodic);
            reason
        }
        _ => unreachable!(),
    };
    eprintln!("round with containerd gone: {reason}");
    wait_event(&mut events, "ImageGCFailed", |e| {
        matches!(e, ImageGcEvent::ImageGcFailed { .. })
    })
    .await;
    assert!(task.is_running(), "the loop carries on");
    assert_eq!(
        m.image_list().map(|l| l.len()),
        Some(3),
        "the cached list is kept"
    );

    ctd.restart().expect("restart containerd");
    wait_event(&mut events, "a round after the restart", finished).await;
    let c = m.counters();
    assert!(c.failures >= 2 && c.runs > c.failures, "{c:?}");
    assert!(task.is_running());
    task.stop().await;
}

/// containerd killed while a round is deleting: the round stops at once with RoundFailed
/// naming what it had already deleted, the records (and their checkpoint) drop exactly the
/// deleted images, and once containerd is back the next round deletes the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_killed_mid_round_fails_it_and_the_next_round_finishes() {
    if !ready() {
        return;
    }
    let mut ctd = Containerd::start("gc-kill").expect("start containerd");
    let state = tempfile::tempdir().expect("state dir");
    let images: Vec<BuiltImage> = (0..10)
        .map(|i| import(&ctd, &format!("k{i}"), 256 * 1024))
        .collect();
    // High 0, low 0: every unused image (all but the pause image) is to go.
    let m = manager(
        &ctd,
        settings(policy(0, 0, MIN_AGE_2M), Some(state.path().into())),
    )
    .await;
    m.detect_images().await.expect("initial detection");
    let order: Vec<String> = m
        .records()
        .await
        .iter()
        .map(|(id, _)| id.clone())
        .filter(|id| *id != ctd.sandbox_image.id)
        .collect();
    assert_eq!(order.len(), images.len());

    // Kill containerd (by its pid) the moment the second image's config blob is gone from
    // its content store: the first deletion has been answered (deletions are one at a
    // time), the second is being carried out inside containerd, eight are still to come.
    let watched = ctd
        .root()
        .join("io.containerd.content.v1.content/blobs/sha256")
        .join(order[1].trim_start_matches("sha256:"));
    assert!(watched.exists(), "{}", watched.display());
    let pid = ctd.pid();
    let killer = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while watched.exists() {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::yield_now();
        }
        let pid = rustix::process::Pid::from_raw(pid as i32).expect("containerd pid");
        rustix::process::kill_process(pid, rustix::process::Signal::KILL).is_ok()
    });
    let mut events = m.subscribe();
    let e = m
        .garbage_collect()
        .await
        .expect_err("the round must fail mid-way");
    assert!(killer.join().expect("killer thread"), "containerd killed");
    eprintln!("interrupted round: {e}");
    assert!(e.is_runtime_down(), "{e}");
    let (deleted, freed) = match &e {
        reactor::images::ImageGcError::Interrupted {
            deleted,
            freed_bytes,
            ..
        } => (*deleted, *freed_bytes),
        other => panic!("expected an interrupted round, got {other}"),
    };
    assert!(
        (1..order.len()).contains(&deleted),
        "stopped part way: {deleted} of {} deleted",
        order.len()
    );
    let reason = match wait_event(&mut events, "RoundFailed", |e| {
        matches!(e, ImageGcEvent::RoundFailed { .. })
    })
    .await
    {
        ImageGcEvent::RoundFailed { reason, .. } => reason,
        _ => unreachable!(),
    };
    assert!(
        reason.contains(&format!("the round had deleted {deleted} image(s)")),
        "{reason}"
    );
    assert_eq!(m.counters().freed_bytes, freed);
    let records = m.records().await;
    for (i, id) in order.iter().enumerate() {
        assert_eq!(
            records.get(id).is_none(),
            i < deleted,
            "record of {id} (#{i})"
        );
    }
    // A manager started now from the checkpoint sees the same.
    let restored = manager(
        &ctd,
        settings(policy(0, 0, MIN_AGE_2M), Some(state.path().into())),
    )
    .await;
    assert_eq!(restored.records().await, records);
    drop(restored);

    ctd.restart().expect("restart containerd");
    let client = ctd.client().await;
    let present = listed(&client).await;
    for id in &order[..deleted] {
        assert!(!present.contains_key(id), "{id} reported deleted and gone");
    }
    // The deletion in flight may have completed inside containerd; the rest are untouched.
    for id in &order[deleted + 1..] {
        assert!(
            present.contains_key(id),
            "{id} never attempted, still there"
        );
    }
    let round = m.garbage_collect().await.expect("round after the restart");
    let rest: BTreeSet<String> = round.deleted.iter().map(|d| d.id.clone()).collect();
    let left: BTreeSet<String> = listed(&client).await.into_keys().collect();
    assert_eq!(
        left,
        ids([&ctd.sandbox_image]),
        "the next round finished the job"
    );
    assert!(rest.iter().all(|id| !order[..deleted].contains(id)));
    assert_eq!(m.counters().images_deleted as usize, deleted + rest.len());
}

/// `imageMaximumGCAge`: once the manager has been up longer than the maximum age, unused
/// images not used for that long go even far below the high threshold; the running
/// container's image and the sandbox image stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_age_removes_stale_images_whatever_the_usage() {
    if !ready() {
        return;
    }
    let tree = TestCgroupTree::new("image-max-age");
    let ctd = Containerd::start_on_tmpfs("gc-max-age", 64 * MIB).expect("start containerd");
    let client = ctd.client().await;
    let used = import(&ctd, "used", MIB);
    let stale = [import(&ctd, "stale1", MIB), import(&ctd, "stale2", 2 * MIB)];
    let mut p = policy(90, 80, MIN_AGE_2M);
    p.max_age_nanos = 1_000_000_000;
    let m = manager(&ctd, settings(p, None)).await;
    let created = Instant::now();
    let pod = run_pod(&client, &tree, "max-age", &ctd).await;
    run_container(&client, &pod, "used", &used, SLEEP, &ctd).await;
    m.detect_images().await.expect("detection");
    // Up for longer than the maximum age.
    tokio::time::sleep(Duration::from_millis(1100).saturating_sub(created.elapsed())).await;
    let round = m.garbage_collect().await.expect("round");
    assert!(round.usage_percent.expect("usage") < 90, "{round:?}");
    assert_eq!(round.bytes_to_free, None, "below the high threshold");
    let deleted: BTreeSet<String> = round.deleted.iter().map(|d| d.id.clone()).collect();
    assert_eq!(deleted, ids(&stale));
    assert!(round
        .deleted
        .iter()
        .all(|d| d.reason == reactor::decide::image_gc::DeleteReason::Age));
    let left: BTreeSet<String> = listed(&client).await.into_keys().collect();
    assert_eq!(left, ids([&used, &ctd.sandbox_image]));
}
