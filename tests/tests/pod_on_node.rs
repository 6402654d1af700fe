//! Issue 4 end to end below the API: kubectl-shaped pods → `decide`'s cgroup values and
//! `oom_score_adj` → the QoS tree on the real v1 hierarchies → the process runtime. What the
//! kernel shows afterwards must be exactly what `reactor plan cgroups` computes.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] fns: a failed setup should panic with its backtrace"
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use reactor::act::cgroups::{CgroupManager, CgroupPath, Resources};
use reactor::act::pod_spec::pod_spec;
use reactor::act::process::{ProcessRuntime, ProcessRuntimeConfig};
use reactor::act::runtime::{ContainerState, Runtime};
use reactor::decide::backoff::BackOffPolicy;
use reactor::decide::cgroups::{
    container_config, files, kubepods, pod_config, qos_tiers, CgroupVersion, FileValue,
    NodeSettings, DEFAULT_QUOTA_PERIOD_US,
};
use reactor::decide::oom_score::oom_score_adj;
use reactor::decide::pod::PodInfo;
use reactor::decide::quantity::Quantity;
use reactor_tests::cgroup_root::{TestCgroupRoot, MOUNT_ROOT};
use reactor_tests::{is_root, require};

const PODS: &str = r#"
- metadata: {name: db, namespace: prod, uid: g-0001}
  spec:
    containers:
    - name: db
      command: [sleep, "300"]
      resources:
        requests: {cpu: 500m, memory: 64Mi}
        limits: {cpu: 500m, memory: 64Mi}
- metadata: {name: web, namespace: prod, uid: b-0002}
  spec:
    containers:
    - name: front
      command: [sh, -c, 'echo serving $(POD); exec sleep 300']
      env:
      - {name: POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
      resources:
        requests: {cpu: 250m, memory: 32Mi}
        limits: {cpu: "1", memory: 128Mi}
    - name: sidecar
      command: [sleep, "301"]
      resources:
        requests: {cpu: 100m}
- metadata: {name: batch, namespace: default, uid: e-0003}
  spec:
    restartPolicy: Never
    containers:
    - name: job
      command: [sleep, "302"]
"#;

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

fn has_cap_sys_resource() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

/// Every file `decide` says to write for `config` holds that value in the real cgroup.
fn assert_files(
    m: &CgroupManager,
    cgroup: &CgroupPath,
    config: &reactor::decide::cgroups::ResourceConfig,
) {
    let wanted = files(config, CgroupVersion::V1);
    assert!(!wanted.is_empty(), "{cgroup}: nothing to check");
    for (file, value) in wanted {
        let text = match value {
            FileValue::Int(i) => i.to_string(),
            FileValue::Text(t) => t,
        };
        assert_eq!(m.read_file(cgroup, file).unwrap(), text, "{cgroup}/{file}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_get_the_kubelet_cgroups_and_run_in_them() {
    if !require(is_root(), "root, to create cgroups")
        || !require(
            Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists(),
            "cgroup v1 memory hierarchy",
        )
    {
        return;
    }
    let root = TestCgroupRoot::v1("pod-e2e").unwrap();
    let m = CgroupManager::v1(
        Path::new(MOUNT_ROOT),
        &CgroupPath::parse(&root.name).unwrap(),
    )
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let rt = ProcessRuntime::open(ProcessRuntimeConfig {
        cgroups: m.clone(),
        state_dir: state.path().to_path_buf(),
        backoff: BackOffPolicy::default(),
    })
    .await
    .unwrap();
    let node = node();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_str(PODS).unwrap();
    let infos: Vec<PodInfo> = docs
        .iter()
        .map(|d| PodInfo::from_json(d.clone()).unwrap())
        .collect();

    // The node level, then every pod as it is admitted: tiers first, then the pod cgroup.
    let top = kubepods(&node);
    m.ensure_pod_tree(&Resources::from(&top)).unwrap();
    assert_files(&m, &CgroupPath::kubepods(), &top);
    let can_lower_adj = has_cap_sys_resource();
    for (i, (doc, info)) in docs.iter().zip(&infos).enumerate() {
        let (burstable, besteffort) = qos_tiers(&node, &infos[..=i]);
        let clamped = m
            .update_qos_tiers(&Resources::from(&burstable), &Resources::from(&besteffort))
            .unwrap();
        assert!(clamped.is_empty(), "{clamped:?}");
        assert_files(
            &m,
            &CgroupPath::parse("kubepods/burstable").unwrap(),
            &burstable,
        );
        let pod_cg = CgroupPath::for_pod(info).unwrap();
        let config = pod_config(&node, info);
        m.create_pod_cgroup(&pod_cg, &Resources::from(&config))
            .unwrap();
        assert_files(&m, &pod_cg, &config);

        let k8s_pod = serde_json::from_value(doc.clone()).unwrap();
        let spec = pod_spec(&k8s_pod, info, &node, &BTreeMap::new()).unwrap();
        assert_eq!(spec.cgroup, pod_cg);
        rt.run_pod(spec.clone()).await.unwrap();
        let status = rt.pod_status(&info.uid).await.unwrap();
        for (c, ci) in spec.containers.iter().zip(&info.containers) {
            let adj = oom_score_adj(info, ci, node.memory_capacity).unwrap();
            let cg = pod_cg.join(&c.name).unwrap();
            assert_files(&m, &cg, &container_config(&node, info, ci));
            let container = status.containers.iter().find(|s| s.name == c.name).unwrap();
            let state = &container.state;
            if adj < 0 && !can_lower_adj {
                // This sandbox drops CAP_SYS_RESOURCE: the start fails and says why — seen as
                // the failed start itself or, once the restart policy has acted (the first
                // restart is immediate), as the last termination of the next attempt.
                let mut t = None;
                for _ in 0..250 {
                    let now = rt.pod_status(&info.uid).await.unwrap();
                    let cs = now.containers.iter().find(|s| s.name == c.name).unwrap();
                    t = match &cs.state {
                        ContainerState::Terminated(t) => Some(t.clone()),
                        _ => cs.last_termination.clone(),
                    };
                    if t.is_some() {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                let t = t.expect("the failed start is recorded");
                assert!(t.message.contains("CAP_SYS_RESOURCE"), "{t:?}");
                continue;
            }
            let ContainerState::Running { pid, .. } = state else {
                panic!("{}: {state:?}", c.name)
            };
            assert_eq!(m.procs(&cg).unwrap(), vec![*pid], "{cg}");
            let got = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap();
            assert_eq!(got.trim(), adj.to_string(), "{}", c.name);
        }
    }
    let log = rt.log_path(&rt_spec_of(&docs[1], &infos[1], &node), "front", 0);
    let start = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("serving web")
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no output in {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The best-effort tier leaves room for the requests above it (qosReserved 100%).
    assert_eq!(
        m.read_file(
            &CgroupPath::parse("kubepods/besteffort").unwrap(),
            "memory.limit_in_bytes"
        )
        .unwrap(),
        ((4i64 << 30) - (64 << 20) - (32 << 20)).to_string()
    );

    // Removal: stop, remove the pod cgroup, then give the tiers their memory back.
    for (i, info) in infos.iter().enumerate().rev() {
        rt.stop_pod(&info.uid, Duration::from_secs(1))
            .await
            .unwrap();
        m.remove_pod_cgroup(&CgroupPath::for_pod(info).unwrap(), Duration::from_secs(2))
            .unwrap();
        let (burstable, besteffort) = qos_tiers(&node, &infos[..i]);
        m.update_qos_tiers(&Resources::from(&burstable), &Resources::from(&besteffort))
            .unwrap();
        assert_files(
            &m,
            &CgroupPath::parse("kubepods/besteffort").unwrap(),
            &besteffort,
        );
    }
    assert!(rt.list_pods().await.unwrap().is_empty());
    drop(rt);
    m.remove(&CgroupPath::kubepods(), Duration::from_secs(2))
        .unwrap();
    assert!(root.leftovers().is_empty());
}

fn rt_spec_of(
    doc: &serde_json::Value,
    info: &PodInfo,
    node: &NodeSettings,
) -> reactor::act::runtime::PodSpec {
    let k8s_pod = serde_json::from_value(doc.clone()).unwrap();
    pod_spec(&k8s_pod, info, node, &BTreeMap::new()).unwrap()
}
