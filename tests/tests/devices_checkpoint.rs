//! The device checkpoint across restarts: a restarted manager restores every assignment and
//! the plugin registers again; corrupt and truncated checkpoints are refused with one clear
//! line and a clean start; a checkpoint in the kubelet's format (fixture with the kubelet's
//! checksum) is read.

mod devices_common;

use std::path::PathBuf;
use std::time::Duration;

use devices_common::*;
use reactor::devices::checkpoint;

fn fixture() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/devices/kubelet_internal_checkpoint");
    std::fs::read_to_string(&path).expect("fixture")
}

fn place_checkpoint(node: &Node, text: &str) -> PathBuf {
    let path = node.config(Duration::ZERO).checkpoint_path();
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(&path, text).expect("write checkpoint");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_manager_restores_every_allocation() {
    let node = Node::new();
    let first = node.start().await;
    let plugin = Plugin::start(&node, 4, &[]);
    wait_registered(&first, 4).await;
    let p1 = pod(
        "pod-1",
        vec![container("init", 1)],
        vec![container("app", 1)],
    );
    let p2 = pod("pod-2", vec![], vec![container("a", 1), container("b", 1)]);
    let active = uids(&["pod-1", "pod-2"]);
    let a1 = first.allocate(&p1, &active).await.expect("pod-1");
    let a2 = first.allocate(&p2, &active).await.expect("pod-2");
    first.shutdown().await;
    drop(first);

    let second = node.start().await;
    assert_eq!(second.checkpoint_warning(), None);
    assert_eq!(second.pod_allocation("pod-1"), a1);
    assert_eq!(second.pod_allocation("pod-2"), a2);
    // The plugin notices the new kubelet.sock and registers again.
    wait_registered(&second, 4).await;
    let c = second.capacity().await.resources[R];
    assert_eq!((c.allocated, c.free), (3, 1));
    // A restarted container gets its devices back without a new Allocate.
    let allocs_before = plugin.journal().lines().count();
    assert_eq!(second.allocate(&p1, &active).await.expect("restart"), a1);
    assert_eq!(plugin.journal().lines().count(), allocs_before);
    // A new pod gets only the device nobody holds.
    let held: std::collections::BTreeSet<String> = a1
        .containers
        .values()
        .chain(a2.containers.values())
        .flat_map(|c| c.devices[R].iter().cloned())
        .collect();
    let p3 = pod("pod-3", vec![], vec![container("app", 1)]);
    let a3 = second
        .allocate(&p3, &uids(&["pod-1", "pod-2", "pod-3"]))
        .await
        .expect("pod-3");
    assert!(a3.containers["app"].devices[R].is_disjoint(&held));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_checkpoint_is_refused_and_the_manager_starts_clean() {
    let node = Node::new();
    let tampered = fixture().replace("\"worker\"", "\"wórker\"");
    let path = place_checkpoint(&node, &tampered);
    let m = node.start().await;
    let warning = m.checkpoint_warning().expect("a warning").to_string();
    assert!(!warning.contains('\n'), "one line: {warning}");
    assert!(warning.contains(&path.display().to_string()), "{warning}");
    assert!(
        warning.contains("is corrupt (checksum 428756076 does not match"),
        "{warning}"
    );
    assert!(
        warning.contains("starting with no device assignments"),
        "{warning}"
    );
    assert!(m.pods_with_devices().is_empty());
    assert!(m.capacity().await.resources.is_empty());

    // It serves normally, and the next change replaces the bad file with a valid one.
    let _plugin = Plugin::start(&node, 2, &[]);
    wait_registered(&m, 2).await;
    m.allocate(
        &pod("pod-n", vec![], vec![container("app", 2)]),
        &uids(&["pod-n"]),
    )
    .await
    .expect("allocates");
    let data = checkpoint::read(&path).expect("valid now").expect("exists");
    assert_eq!(data.entries.expect("entries")[0].pod_uid, "pod-n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_checkpoint_is_refused_and_the_manager_starts_clean() {
    let node = Node::new();
    let text = fixture();
    let path = place_checkpoint(&node, &text[..text.len() / 3]);
    let m = node.start().await;
    let warning = m.checkpoint_warning().expect("a warning").to_string();
    assert!(!warning.contains('\n'), "one line: {warning}");
    assert!(
        warning.starts_with(&format!(
            "device checkpoint {} is unreadable (",
            path.display()
        )),
        "{warning}"
    );
    assert!(m.pods_with_devices().is_empty());
    let _plugin = Plugin::start(&node, 1, &[]);
    wait_registered(&m, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_written_checkpoint_is_read() {
    let node = Node::new();
    place_checkpoint(&node, &fixture());
    let m = node.start().await;
    assert_eq!(m.checkpoint_warning(), None);
    let a = "7c0f6a52-3d1e-4b8e-9a61-0d5be2f4a101";
    let b = "e2b94d17-58c0-4f3a-b7d2-6a1c9e0f8b22";
    let app = m
        .container_allocation(a, "app")
        .expect("pod A app restored");
    assert_eq!(app.envs["SAMPLE_DEVICES"], "dev-1");
    assert_eq!(app.device_nodes[0].container_path, "/dev/sample/dev-1");
    let worker = m.container_allocation(b, "worker").expect("pod B restored");
    assert_eq!(worker.devices[R].len(), 2);
    assert_eq!(worker.annotations["sample.example/devices"], "dev-3,dev-2");
    // Registered before the restart: listed with no devices until the plugin is back.
    let c = m.capacity().await.resources[R];
    assert_eq!((c.capacity, c.allocatable, c.allocated), (0, 0, 3));

    let _plugin = Plugin::start(&node, 4, &[]);
    wait_registered(&m, 4).await;
    assert_eq!(m.capacity().await.resources[R].free, 1);
    let active = uids(&[a, b, "pod-new"]);
    let two = pod("pod-new", vec![], vec![container("app", 2)]);
    assert_eq!(m.can_admit(&two, &active).unwrap_err().available, 1);
    let one = pod("pod-new", vec![], vec![container("app", 1)]);
    let got = m.allocate(&one, &active).await.expect("one fits");
    assert_eq!(got.containers["app"].envs["SAMPLE_DEVICES"], "dev-0");
}
