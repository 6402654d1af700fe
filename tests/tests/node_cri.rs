//! Issue 4's CRI path through the agent itself: `reactor run` with `runtime.kind: cri` against
//! a private containerd runs an applied pod's containers in the pod cgroup the agent made, with
//! the limits `decide` gives, and `reactor pod rm` leaves no cgroup behind.

use std::path::{Path, PathBuf};

use reactor_tests::agent::TestAgent;
use reactor_tests::{containerd_available, require, Containerd, TestImage};
use serde_json::json;

const IMAGE: &str = "localhost/reactor/node-cri:1";

/// Every pid in the cgroups directly below `dir` (the sandbox's and the containers').
fn procs_below(dir: &Path) -> Vec<(PathBuf, u32)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .flat_map(|e| {
            let path = e.path();
            std::fs::read_to_string(path.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .map(|pid| (path.clone(), pid))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn node_pod_lifecycle_through_cri_in_the_agents_pod_cgroup() {
    if !require(
        containerd_available(),
        "root, containerd, runc and busybox-static for the CRI tests",
    ) || !require(
        Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists(),
        "cgroup v1 memory hierarchy",
    ) {
        return;
    }
    let ctd = Containerd::start("node-cri").expect("start containerd");
    ctd.build_and_import(&TestImage::busybox(IMAGE, 0))
        .expect("import the test image");
    let agent = TestAgent::start(
        "node-cri",
        &format!(
            "node: {{memoryCapacity: 1Gi, cpuCapacity: '2'}}\nruntime: {{kind: cri, endpoint: '{}'}}\n",
            ctd.endpoint()
        ),
    );
    let doc = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default", "uid": "cri-1"},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main", "image": IMAGE, "command": ["sleep", "600"],
                "resources": {"requests": {"cpu": "250m", "memory": "32Mi"},
                              "limits": {"cpu": "500m", "memory": "64Mi"}}
            }]
        }
    });
    let out = agent.apply("web.json", &doc.to_string());
    assert!(
        out.status.success(),
        "apply: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        agent.log()
    );

    // The container runs below the pod cgroup the agent made, with decide's memory limit.
    let pod_cg = "kubepods/burstable/podcri-1";
    let pod_dir = agent.cgroup_dir("memory", pod_cg);
    let limit = (64u64 << 20).to_string();
    let in_container = || {
        procs_below(&pod_dir).into_iter().find(|(dir, _)| {
            std::fs::read_to_string(dir.join("memory.limit_in_bytes"))
                .is_ok_and(|l| l.trim() == limit)
        })
    };
    agent.wait(
        "the container's process in a 64Mi cgroup below the pod's",
        || in_container().is_some(),
    );
    let (container_dir, pid) = in_container().expect("container process");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("sleep"),
        "{} runs {:?}",
        container_dir.display(),
        String::from_utf8_lossy(&cmdline)
    );
    assert_eq!(
        agent.read(
            "cpu",
            &format!(
                "{pod_cg}/{}",
                container_dir.file_name().unwrap().to_string_lossy()
            ),
            "cpu.shares"
        ),
        "256"
    );
    let pods = agent.pods();
    assert!(
        pods.iter()
            .any(|p| p.to_string().contains("web") && p.to_string().contains("Running")),
        "{pods:?}"
    );

    let rm = agent.cli(&["pod", "rm", "default/web", "--grace", "0"]);
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );
    agent.wait("the pod cgroup removed", || !pod_dir.exists());
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the container process is gone"
    );
}
