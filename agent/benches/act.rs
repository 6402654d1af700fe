//! How fast `act` changes the node, on the real cgroup v1 hierarchies (needs root; prints
//! why and does nothing otherwise):
//! - `cgroup_pod_tree`: create a pod and a container cgroup in every hierarchy, write the
//!   kubelet's values, remove both — the cgroup work of admitting and removing a pod.
//! - `run_pod`: the process runtime from `run_pod` to a running, supervised process.
//! - `stop_pod_grace_0`: from `stop_pod` with no grace to an empty, removed container
//!   cgroup — the part of an eviction after the decision, until the victim's memory is free.
//!
//! Everything lives under a bench-only cgroup root, removed at the end.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{criterion_main, Criterion};
use reactor::act::cgroups::{CgroupManager, CgroupPath, Resources};
use reactor::act::process::{ProcessRuntime, ProcessRuntimeConfig};
use reactor::act::runtime::{ContainerSpec, PodSpec, RestartPolicy, Runtime};
use reactor::decide::backoff::BackOffPolicy;

const MOUNT: &str = "/sys/fs/cgroup";
const CONTROLLERS: [&str; 6] = ["cpu", "cpuacct", "cpuset", "memory", "pids", "hugetlb"];

/// The bench's cgroup root in every mounted hierarchy; removed on drop.
struct BenchRoot {
    name: String,
    dirs: Vec<PathBuf>,
}

impl BenchRoot {
    fn new() -> std::io::Result<BenchRoot> {
        let name = format!("reactor-bench-act-{}", std::process::id());
        let mut dirs = Vec::new();
        for c in CONTROLLERS {
            let mount = Path::new(MOUNT).join(c);
            if !mount.join("cgroup.procs").exists() {
                continue;
            }
            let dir = mount.join(&name);
            std::fs::create_dir(&dir)?;
            if c == "cpuset" {
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    std::fs::write(dir.join(f), std::fs::read_to_string(mount.join(f))?)?;
                }
            }
            dirs.push(dir);
        }
        Ok(BenchRoot { name, dirs })
    }
}

impl Drop for BenchRoot {
    fn drop(&mut self) {
        for d in &self.dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

fn ready() -> bool {
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .is_some_and(|l| l.split_whitespace().nth(2) == Some("0"))
    });
    if !root || !Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
        eprintln!("skipping act benches: they need root and cgroup v1 memory/cpu hierarchies");
        return false;
    }
    true
}

fn sleeper_pod(cgroup: &CgroupPath, i: usize) -> PodSpec {
    PodSpec {
        uid: format!("bench-{i}"),
        namespace: "bench".into(),
        name: format!("pod-{i}"),
        cgroup: cgroup.clone(),
        restart_policy: RestartPolicy::Never,
        containers: vec![ContainerSpec {
            name: "c".into(),
            image: String::new(),
            command: vec!["sleep".into(), "300".into()],
            args: vec![],
            env: vec![],
            resources: Resources {
                memory_limit_bytes: Some(64 << 20),
                ..Default::default()
            },
            oom_score_adj: 1000,
            ..Default::default()
        }],
        document: None,
    }
}

fn bench(c: &mut Criterion) {
    if !ready() {
        return;
    }
    let root = BenchRoot::new().expect("bench cgroup root");
    let m = CgroupManager::v1(
        Path::new(MOUNT),
        &CgroupPath::parse(&root.name).expect("name"),
    )
    .expect("v1 manager");
    let values = Resources {
        cpu_shares: Some(512),
        cpu_quota_us: Some(50_000),
        cpu_period_us: Some(100_000),
        memory_limit_bytes: Some(256 << 20),
        pids_max: Some(1024),
        memory_oom_group: None,
        ..Default::default()
    };
    let pod = CgroupPath::pod(Some("burstable"), "bench").expect("pod path");
    let container = pod.join("c").expect("container path");
    let mut group = c.benchmark_group("act");
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(5));
    group.bench_function("cgroup_pod_tree", |b| {
        b.iter(|| {
            m.create(&container).expect("create");
            m.apply(&pod, &values).expect("apply pod");
            m.apply(&container, &values).expect("apply container");
            m.remove(&pod, Duration::from_secs(1)).expect("remove");
        })
    });

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let state = tempfile::tempdir().expect("state dir");
    let runtime = rt
        .block_on(ProcessRuntime::open(ProcessRuntimeConfig {
            cgroups: m.clone(),
            state_dir: state.path().to_path_buf(),
            backoff: BackOffPolicy::default(),
        }))
        .expect("runtime");
    m.create(&pod).expect("pod cgroup");
    let mut n = 0usize;
    group.bench_function("run_pod", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                n += 1;
                let spec = sleeper_pod(&pod, n);
                let t = Instant::now();
                rt.block_on(runtime.run_pod(spec)).expect("run");
                total += t.elapsed();
                rt.block_on(runtime.stop_pod(&format!("bench-{n}"), Duration::ZERO))
                    .expect("stop");
            }
            total
        })
    });
    group.bench_function("stop_pod_grace_0", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                n += 1;
                rt.block_on(runtime.run_pod(sleeper_pod(&pod, n)))
                    .expect("run");
                let t = Instant::now();
                rt.block_on(runtime.stop_pod(&format!("bench-{n}"), Duration::ZERO))
                    .expect("stop");
                total += t.elapsed();
            }
            total
        })
    });
    group.finish();
    drop(runtime);
    m.remove(&CgroupPath::kubepods(), Duration::from_secs(2))
        .expect("remove bench tree");
}

/// Criterion's generated entry point lives in a private module: it needs no public docs.
mod entry {
    criterion::criterion_group!(benches, super::bench);
}
criterion_main!(entry::benches);
