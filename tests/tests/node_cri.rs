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

/// Image GC in the running agent: with the CRI runtime, `reactor run` starts the image GC
/// manager against the runtime's image service; a periodic round over a small image
/// filesystem deletes the unused images, and the round reaches the event stream and the
/// metrics.
#[test]
fn the_agents_image_gc_rounds_reach_the_event_stream_and_metrics() {
    if !require(
        containerd_available(),
        "root, containerd, runc and busybox-static for the CRI tests",
    ) {
        return;
    }
    const MIB: u64 = 1 << 20;
    let ctd = Containerd::start_on_tmpfs("node-gc", 96 * MIB).expect("start containerd");
    let unused = ["localhost/reactor/gc-a:1", "localhost/reactor/gc-b:1"];
    for (i, name) in unused.iter().enumerate() {
        ctd.build_and_import(&TestImage::busybox(name, (8 + 4 * i as u64) * MIB))
            .expect("import an image");
    }
    assert!(ctd.cri_images().unwrap().len() >= unused.len());
    // Sized before the agent starts: its first round may delete them at once.
    let sizes: u64 = ctd
        .cri_images()
        .unwrap()
        .iter()
        .filter(|i| i.repo_tags.iter().any(|t| unused.contains(&t.as_str())))
        .map(|i| i.size_bytes)
        .sum();
    assert!(sizes > 0);
    let agent = TestAgent::start(
        "node-gc",
        &format!(
            "runtime: {{kind: cri, endpoint: '{}'}}\n\
             imageGCHighThresholdPercent: 1\nimageGCLowThresholdPercent: 0\n\
             imageMinimumGCAge: 0s\nimageGC: {{period: 1s, listRefresh: 1s}}\n",
            ctd.endpoint()
        ),
    );
    let mut events = std::process::Command::new(reactor_tests::reactor_bin())
        .args(["events", "--json", "--kind", "image_gc", "--socket"])
        .arg(&agent.socket)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("reactor events");
    let stdout = events.stdout.take().expect("stdout");
    let guard = reactor_tests::ChildGuard(events);
    let (tx, rx) = std::sync::mpsc::channel::<serde_json::Value>();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(v) = serde_json::from_str(&line.unwrap_or_default()) else {
                break;
            };
            if tx.send(v).is_err() {
                break;
            }
        }
    });
    // The unused images go (the round that deleted them may have run before we listened);
    // rounds go on every second, each one an event.
    agent.wait("the unused images to be deleted", || {
        !ctd.cri_images()
            .unwrap()
            .iter()
            .any(|i| i.repo_tags.iter().any(|t| unused.contains(&t.as_str())))
    });
    let e = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("no image_gc event: {}", agent.log()));
    assert_eq!(e["kind"], "image_gc", "{e}");
    assert_eq!(e["event"]["trigger"], "periodic", "{e}");
    assert!(e["event"]["removed"].is_array(), "{e}");
    drop(guard);
    // The metrics count the rounds and every byte they freed.
    let value = |text: &str, series: &str| -> f64 {
        reactor_tests::exposition::sample(text, series)
            .unwrap_or_else(|| panic!("{series} in\n{text}"))
    };
    agent.wait("the freed bytes on /metrics", || {
        let text = agent.scrape();
        value(&text, "reactor_image_gc_runs_total") >= 1.0
            && value(&text, "reactor_image_gc_freed_bytes_total") >= sizes as f64
    });
}
