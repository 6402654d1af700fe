//! The device manager against the real sample device plugin: registration over
//! `kubelet.sock`, `ListAndWatch`, allocation with the plugin's envs, init-container reuse,
//! health changes, a killed plugin, preferred allocation and pre-start, and refusals.

mod devices_common;

use std::time::Duration;

use devices_common::*;
use reactor::devices::{DeviceError, DeviceManager, DeviceSet};

fn set(ids: &[&str]) -> DeviceSet {
    ids.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_registers_and_capacity_reflects_its_devices() {
    let node = Node::new();
    let m = node.start().await;
    assert!(m.capacity().await.resources.is_empty());
    let _plugin = Plugin::start(&node, 4, &[]);
    wait_registered(&m, 4).await;
    let c = m.capacity().await.resources[R];
    assert_eq!(
        (c.capacity, c.allocatable, c.allocated, c.free),
        (4, 4, 0, 4)
    );
    let (healthy, unhealthy) = &m.devices()[R];
    assert_eq!(*healthy, set(&["dev-0", "dev-1", "dev-2", "dev-3"]));
    assert!(unhealthy.is_empty());
    m.shutdown().await;
    assert!(!node.plugin_dir().join("kubelet.sock").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_get_distinct_devices_and_the_plugins_envs() {
    let node = Node::new();
    let m = node.start().await;
    let plugin = Plugin::start(&node, 4, &[]);
    wait_registered(&m, 4).await;

    let p1 = pod("pod-1", vec![], vec![container("app", 2)]);
    let p2 = pod("pod-2", vec![], vec![container("app", 2)]);
    let active = uids(&["pod-1", "pod-2"]);
    m.can_admit(&p1, &active).expect("pod-1 fits");
    let a1 = m.allocate(&p1, &active).await.expect("pod-1 allocated");
    m.can_admit(&p2, &active).expect("pod-2 fits");
    let a2 = m.allocate(&p2, &active).await.expect("pod-2 allocated");

    let d1 = &a1.containers["app"].devices[R];
    let d2 = &a2.containers["app"].devices[R];
    assert_eq!(d1.len(), 2);
    assert_eq!(d2.len(), 2);
    assert!(d1.is_disjoint(d2), "{d1:?} vs {d2:?}");
    for a in [&a1, &a2] {
        let c = &a.containers["app"];
        let ids: Vec<&str> = c.devices[R].iter().map(String::as_str).collect();
        assert_eq!(c.envs["SAMPLE_DEVICES"], ids.join(","));
        assert_eq!(c.envs["SAMPLE_RESOURCE"], R);
        assert_eq!(c.device_nodes.len(), 2);
        assert_eq!(c.annotations["sample.example/devices"], ids.join(","));
    }
    assert_eq!(
        plugin
            .journal()
            .lines()
            .filter(|l| l.starts_with("allocate "))
            .count(),
        2
    );
    let c = m.capacity().await.resources[R];
    assert_eq!((c.allocatable, c.allocated, c.free), (4, 4, 0));

    // A third pod does not fit while both are active...
    let p3 = pod("pod-3", vec![], vec![container("app", 1)]);
    let all = uids(&["pod-1", "pod-2", "pod-3"]);
    let short = m.can_admit(&p3, &all).unwrap_err();
    assert_eq!((short.requested, short.available), (1, 0));
    assert_eq!(
        short.to_string(),
        "requested number of devices unavailable for vendor.example/dev. Requested: 1, Available: 0"
    );
    assert!(matches!(
        m.allocate(&p3, &all).await,
        Err(DeviceError::Plan(_))
    ));
    // ...and does once pod-1 has ended: its devices are freed before the allocation.
    let without_1 = uids(&["pod-2", "pod-3"]);
    m.can_admit(&p3, &without_1)
        .expect("fits after pod-1 ended");
    let a3 = m.allocate(&p3, &without_1).await.expect("pod-3 allocated");
    assert!(a3.containers["app"].devices[R].is_subset(d1));
    assert!(!m.pods_with_devices().contains("pod-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_container_devices_are_reused_by_the_app_container() {
    let node = Node::new();
    let m = node.start().await;
    let plugin = Plugin::start(&node, 4, &[]);
    wait_registered(&m, 4).await;

    let p = pod(
        "pod-i",
        vec![container("init", 2)],
        vec![container("app", 2)],
    );
    let active = uids(&["pod-i"]);
    let a = m.allocate(&p, &active).await.expect("allocated");
    assert_eq!(
        a.containers["init"].devices[R],
        a.containers["app"].devices[R]
    );
    assert_eq!(
        a.containers["app"].envs["SAMPLE_DEVICES"],
        a.containers["init"].envs["SAMPLE_DEVICES"]
    );
    let c = m.capacity().await.resources[R];
    assert_eq!(
        (c.allocated, c.free),
        (2, 2),
        "the app reuses, it does not take more"
    );
    // Each container got its own Allocate call, for the same devices.
    let allocs: Vec<String> = plugin
        .journal()
        .lines()
        .filter(|l| l.starts_with("allocate "))
        .map(String::from)
        .collect();
    assert_eq!(allocs.len(), 2);
    assert_eq!(allocs[0], allocs[1]);

    // A restarted container gets the same devices back, without a new Allocate.
    let again = m.allocate(&p, &active).await.expect("re-admitted");
    assert_eq!(again, a);
    assert_eq!(
        plugin
            .journal()
            .lines()
            .filter(|l| l.starts_with("allocate "))
            .count(),
        2
    );
}

/// Decision (documented in `devices::allocate`): devices the init containers held beyond what
/// the app containers take stay with the pod until it ends, as in the kubelet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn surplus_init_devices_stay_held_until_the_pod_ends() {
    let node = Node::new();
    let m = node.start().await;
    let _plugin = Plugin::start(&node, 4, &[]);
    wait_registered(&m, 4).await;

    let p = pod(
        "pod-s",
        vec![container("init", 3)],
        vec![container("app", 1)],
    );
    let a = m.allocate(&p, &uids(&["pod-s"])).await.expect("allocated");
    assert_eq!(a.containers["app"].devices[R].len(), 1);
    assert!(a.containers["app"].devices[R].is_subset(&a.containers["init"].devices[R]));
    let c = m.capacity().await.resources[R];
    assert_eq!((c.allocated, c.free), (3, 1));

    let q = pod("pod-q", vec![], vec![container("app", 2)]);
    let both = uids(&["pod-s", "pod-q"]);
    let short = m.can_admit(&q, &both).unwrap_err();
    assert_eq!(short.available, 1);
    assert!(m.allocate(&q, &both).await.is_err());
    assert!(!m.pods_with_devices().contains("pod-q"));

    // pod-s ended: all three devices come back.
    m.remove_inactive_pods(&uids(&["pod-q"]))
        .await
        .expect("freed");
    assert_eq!(m.capacity().await.resources[R].free, 4);
    m.allocate(&q, &uids(&["pod-q"])).await.expect("fits now");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_device_shrinks_allocatable() {
    let node = Node::new();
    let m = node.start().await;
    let mut plugin = Plugin::start(&node, 4, &[]);
    wait_registered(&m, 4).await;

    plugin.set_health("dev-1", false);
    let c = wait_counts(&m, "dev-1 unhealthy", |c| c.allocatable == 3).await;
    assert_eq!(c.capacity, 4);
    assert_eq!(m.devices()[R].1, set(&["dev-1"]));

    let big = pod("pod-big", vec![], vec![container("app", 4)]);
    let err = m.can_admit(&big, &uids(&[])).unwrap_err();
    assert_eq!((err.requested, err.available), (4, 3));
    let fits = pod("pod-3", vec![], vec![container("app", 3)]);
    let a = m
        .allocate(&fits, &uids(&["pod-3"]))
        .await
        .expect("three fit");
    assert!(!a.containers["app"].devices[R].contains("dev-1"));

    plugin.set_health("dev-1", true);
    wait_counts(&m, "dev-1 healthy again", |c| c.allocatable == 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_plugin_turns_unhealthy_then_its_resource_is_deleted() {
    let node = Node::new();
    let m = DeviceManager::start(node.config(Duration::from_secs(3)))
        .await
        .expect("starts");
    let mut plugin = Plugin::start(&node, 4, &[]);
    let mut other = Plugin::start_as(&node, "other.example/acc", 2, &[]);
    wait_registered(&m, 4).await;
    wait_for("second plugin", || async {
        m.capacity()
            .await
            .resources
            .get("other.example/acc")
            .filter(|c| c.allocatable == 2)
            .map(|_| ())
    })
    .await;

    plugin.kill();
    let c = wait_counts(&m, "all devices unhealthy", |c| c.allocatable == 0).await;
    assert_eq!(
        c.capacity, 4,
        "devices stay in capacity during the grace period"
    );

    // A pod needing both resources fails on the dead one; what it got of the live one is
    // rolled back.
    let mut first = container("first", 0);
    first.devices = [("other.example/acc".to_string(), 1)].into();
    let p = pod("pod-x", vec![], vec![first, container("second", 1)]);
    assert!(m.allocate(&p, &uids(&["pod-x"])).await.is_err());
    assert!(!m.pods_with_devices().contains("pod-x"));
    assert_eq!(m.capacity().await.resources["other.example/acc"].free, 2);

    let deleted = wait_for("resource deleted after the grace period", || async {
        let c = m.capacity().await;
        c.deleted.contains(&R.to_string()).then_some(c)
    })
    .await;
    assert!(!deleted.resources.contains_key(R));
    assert!(!m.capacity().await.resources.contains_key(R));
    assert!(m
        .capacity()
        .await
        .resources
        .contains_key("other.example/acc"));
    other.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_allocation_and_pre_start_are_used_when_offered() {
    let node = Node::new();
    let m = node.start().await;
    let plugin = Plugin::start(&node, 4, &["--preferred", "--pre-start", "--numa", "1"]);
    wait_registered(&m, 4).await;

    let p = pod("pod-p", vec![], vec![container("app", 2)]);
    let a = m.allocate(&p, &uids(&["pod-p"])).await.expect("allocated");
    // The sample plugin prefers the highest-numbered devices; the manager's own order would
    // have been dev-0, dev-1.
    assert_eq!(a.containers["app"].devices[R], set(&["dev-2", "dev-3"]));
    let journal = plugin.journal();
    assert!(journal.contains("preferred dev-3,dev-2"), "{journal}");
    assert!(journal.contains("allocate dev-2,dev-3"), "{journal}");
    assert!(!journal.contains("prestart"), "{journal}");

    let opts = m
        .prepare_container("pod-p", "app")
        .await
        .expect("pre-start")
        .expect("the container holds devices");
    assert_eq!(opts.envs["SAMPLE_DEVICES"], "dev-2,dev-3");
    assert!(plugin.journal().contains("prestart dev-2,dev-3"));
    assert!(m
        .prepare_container("pod-p", "none")
        .await
        .expect("ok")
        .is_none());

    // The NUMA node the plugin reported is what the checkpoint records.
    let cp = reactor::devices::checkpoint::read(&node.config(Duration::ZERO).checkpoint_path())
        .expect("checkpoint reads")
        .expect("checkpoint exists");
    let entry = &cp.entries.expect("entries")[0];
    assert_eq!(
        entry.device_ids.as_ref().expect("ids")[&1],
        Some(vec!["dev-2".to_string(), "dev-3".to_string()])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_registrations_are_refused_with_the_kubelets_words() {
    let node = Node::new();
    let m = node.start().await;
    let _good = Plugin::start(&node, 2, &[]);
    wait_registered(&m, 2).await;

    let old = Plugin::start_as(
        &node,
        "vendor.example/old",
        1,
        &["--api-version", "v1alpha"],
    );
    let (code, stderr) = old.wait_exit(Duration::from_secs(30));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "requested API version \"v1alpha\" is not supported by kubelet. Supported version is [\"v1beta1\"]"
        ),
        "{stderr}"
    );

    let bad = Plugin::start_as(&node, "bad_name", 1, &[]);
    let (code, stderr) = bad.wait_exit(Duration::from_secs(30));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("the ResourceName \"bad_name\" is invalid"),
        "{stderr}"
    );

    let native = Plugin::start_as(&node, "kubernetes.io/dev", 1, &[]);
    let (code, stderr) = native.wait_exit(Duration::from_secs(30));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("the ResourceName \"kubernetes.io/dev\" is invalid"),
        "{stderr}"
    );

    // The manager still serves the good plugin, and knows nothing of the refused ones.
    let cap = m.capacity().await;
    assert_eq!(cap.resources.keys().collect::<Vec<_>>(), vec![R]);
    let a = m
        .allocate(
            &pod("pod-g", vec![], vec![container("app", 1)]),
            &uids(&["pod-g"]),
        )
        .await
        .expect("still allocates");
    assert_eq!(a.containers["app"].envs["SAMPLE_DEVICES"], "dev-0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_registration_replaces_the_old_endpoint() {
    let node = Node::new();
    let m = node.start().await;
    let mut old = Plugin::start(&node, 4, &["--socket", "old.sock"]);
    wait_registered(&m, 4).await;
    let mut new = Plugin::start(&node, 2, &["--socket", "new.sock"]);
    wait_registered(&m, 2).await;

    // The old plugin dying no longer matters: the manager follows the new one.
    old.kill();
    new.set_health("dev-1", false);
    let c = wait_counts(&m, "the new plugin's health change", |c| c.allocatable == 1).await;
    assert_eq!(
        c.capacity, 2,
        "the old plugin's death did not touch the new endpoint"
    );
    let a = m
        .allocate(
            &pod("pod-r", vec![], vec![container("app", 1)]),
            &uids(&["pod-r"]),
        )
        .await
        .expect("allocated through the new plugin");
    assert_eq!(a.containers["app"].envs["SAMPLE_DEVICES"], "dev-0");
    assert!(new.journal().contains("allocate dev-0"));
    assert!(!old.journal().contains("allocate"));

    new.kill();
    wait_counts(&m, "the new plugin's devices unhealthy", |c| {
        c.allocatable == 0 && c.capacity == 2
    })
    .await;
}

/// Waits until `done` holds for the manager's counts, re-checking after each change it
/// announces (bounded, so a change that is never announced fails the test).
async fn until(
    m: &DeviceManager,
    changes: &mut tokio::sync::watch::Receiver<u64>,
    what: &str,
    done: impl Fn(Option<&reactor::devices::ResourceCapacity>) -> bool,
) {
    loop {
        changes.borrow_and_update();
        if done(m.snapshot().get(R)) {
            return;
        }
        tokio::time::timeout(Duration::from_secs(30), changes.changed())
            .await
            .unwrap_or_else(|_| panic!("no change announced for {what}"))
            .expect("manager alive");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_are_announced_and_the_grace_period_ends_without_a_capacity_call() {
    let node = Node::new();
    let m = DeviceManager::start(node.config(Duration::from_secs(2)))
        .await
        .expect("starts");
    let mut changes = m.subscribe();
    let mut plugin = Plugin::start(&node, 2, &[]);
    until(&m, &mut changes, "registration", |c| {
        c.is_some_and(|c| c.allocatable == 2)
    })
    .await;
    plugin.set_health("dev-1", false);
    until(&m, &mut changes, "a health flip", |c| {
        c.is_some_and(|c| c.allocatable == 1 && c.capacity == 2)
    })
    .await;
    plugin.kill();
    // All unhealthy (or, on a slow machine, already past the grace period).
    until(&m, &mut changes, "the plugin's end", |c| {
        c.is_none_or(|c| c.allocatable == 0 && c.capacity == 2)
    })
    .await;
    // Nobody asks for capacity: the manager drops the resource on its own after the grace
    // period, announces it, and still reports the deletion once to the next capacity call.
    until(&m, &mut changes, "the deletion", |c| c.is_none()).await;
    assert!(!m.devices().contains_key(R));
    assert_eq!(m.capacity().await.deleted, vec![R.to_string()]);
    assert!(m.capacity().await.deleted.is_empty(), "reported once");
    m.shutdown().await;
}
