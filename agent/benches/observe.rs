//! One full observation (every node signal) and the stats of 100 pod cgroups, on a temp-dir
//! cgroupfs fixture and on the real v1 memory hierarchy (root only; a tree unique to this run,
//! removed afterwards).
//!
//! `cargo bench -p reactor --bench observe`
#![expect(
    missing_docs,
    reason = "criterion_group! generates an undocumented function"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{criterion_group, criterion_main, Criterion};
use reactor::config::Config;
use reactor::decide::qos::QosClass;
use reactor::decide::summary::Summary;
use reactor::observe::{ObserveSettings, Observer, PodCgroup};

const PODS: usize = 100;

/// Counts heap allocations, to report how many one observation makes once warm.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed through.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed through.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations per call of `f`, averaged over 10 calls after a warm-up call.
fn allocations_per_call(mut f: impl FnMut()) -> f64 {
    f();
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..10 {
        f();
    }
    (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / 10.0
}

fn v1_stat(inactive_file: u64) -> String {
    let mut s = String::new();
    for (k, v) in [
        ("cache", 4096u64),
        ("rss", 8192),
        ("rss_huge", 0),
        ("shmem", 0),
        ("mapped_file", 0),
        ("dirty", 0),
        ("writeback", 0),
        ("pgpgin", 100),
        ("pgpgout", 90),
        ("pgfault", 1000),
        ("pgmajfault", 0),
        ("inactive_anon", 0),
        ("active_anon", 8192),
        ("inactive_file", inactive_file),
        ("active_file", 0),
        ("unevictable", 0),
        ("hierarchical_memory_limit", 9223372036854771712),
        ("total_cache", 4096),
        ("total_rss", 8192),
        ("total_rss_huge", 0),
        ("total_shmem", 0),
        ("total_mapped_file", 0),
        ("total_dirty", 0),
        ("total_writeback", 0),
        ("total_pgpgin", 100),
        ("total_pgpgout", 90),
        ("total_pgfault", 1000),
        ("total_pgmajfault", 0),
        ("total_inactive_anon", 0),
        ("total_active_anon", 8192),
        ("total_inactive_file", inactive_file),
        ("total_active_file", 0),
        ("total_unevictable", 0),
    ] {
        s.push_str(&format!("{k} {v}\n"));
    }
    s
}

fn memcg(root: &Path, cgroup: &str, usage: u64, procs: &str) {
    let dir = root.join(cgroup.trim_start_matches('/'));
    std::fs::create_dir_all(&dir).expect("bench setup");
    std::fs::write(dir.join("memory.usage_in_bytes"), format!("{usage}\n")).expect("bench setup");
    std::fs::write(dir.join("memory.stat"), v1_stat(usage / 4)).expect("bench setup");
    std::fs::write(dir.join("cgroup.procs"), procs).expect("bench setup");
}

fn pods(cgroup_root: &str) -> Vec<PodCgroup> {
    (0..PODS)
        .map(|i| {
            PodCgroup::under_kubepods(
                cgroup_root,
                &format!("uid-{i:04}"),
                QosClass::BestEffort,
                &["app"],
            )
        })
        .collect()
}

fn settings(cgroup_root: &str, mount: PathBuf, disk: &Path) -> ObserveSettings {
    let mut config = Config {
        cgroup_root: cgroup_root.to_string(),
        ..Default::default()
    };
    config.node.memory_capacity = "4Gi".into();
    config.node.nodefs_path = disk.to_path_buf();
    let mut s = ObserveSettings::from_config(&config, None, None).expect("bench setup");
    s.cgroup_mount = mount;
    s
}

fn bench_pair(c: &mut Criterion, name: &str, observer: &mut Observer, pods: &[PodCgroup]) {
    let mut summary = Summary::default();
    assert!(
        observer.observe().errors.is_empty(),
        "{name}: {:?}",
        observer.observe().errors
    );
    assert!(observer.observe_pods(pods, &mut summary).is_empty());
    assert_eq!(
        summary.pods.len(),
        pods.len(),
        "{name}: every pod cgroup found"
    );
    let signals_allocs = allocations_per_call(|| {
        std::hint::black_box(observer.observe());
    });
    let pods_allocs = allocations_per_call(|| {
        std::hint::black_box(observer.observe_pods(pods, &mut summary));
    });
    println!(
        "observe/{name}: {signals_allocs} allocations per observe(), {pods_allocs} per observe_pods({PODS} pods)"
    );
    c.bench_function(&format!("observe/signals/{name}"), |b| {
        b.iter(|| std::hint::black_box(observer.observe()))
    });
    c.bench_function(&format!("observe/pods{PODS}/{name}"), |b| {
        b.iter(|| {
            let errors = observer.observe_pods(pods, &mut summary);
            std::hint::black_box(summary.pods.len());
            std::hint::black_box(errors)
        })
    });
}

fn fixture(c: &mut Criterion) {
    let tmp = tempfile::tempdir().expect("bench setup");
    let mem = tmp.path().join("cgroup/memory");
    memcg(&mem, "/", 8 << 30, "1\n");
    memcg(&mem, "/node", 3 << 30, "");
    memcg(&mem, "/node/kubepods", 2 << 30, "");
    memcg(&mem, "/node/kubepods/besteffort", 2 << 30, "");
    for p in pods("/node") {
        memcg(&mem, &p.cgroup, 20 << 20, "");
        memcg(&mem, &format!("{}/app", p.cgroup), 19 << 20, "100\n101\n");
    }
    let mut observer = Observer::new(settings("/node", tmp.path().join("cgroup"), tmp.path()))
        .expect("bench setup");
    bench_pair(c, "fixture", &mut observer, &pods("/node"));
}

/// A v1 memory tree unique to this run, removed on drop (it holds no processes).
struct RealTree {
    top: PathBuf,
}

impl Drop for RealTree {
    fn drop(&mut self) {
        fn remove(dir: &Path) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    remove(&e.path());
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
        remove(&self.top);
    }
}

fn real(c: &mut Criterion) {
    let v1 = Path::new("/sys/fs/cgroup/memory");
    if !v1.join("memory.usage_in_bytes").exists()
        || std::fs::create_dir_all(v1.join("reactor-bench-probe")).is_err()
    {
        eprintln!("skipping the real-cgroupfs benches: needs root and a v1 memory hierarchy");
        return;
    }
    let _ = std::fs::remove_dir(v1.join("reactor-bench-probe"));
    let root = format!("/reactor-bench-observe-{}", std::process::id());
    let tree = RealTree {
        top: v1.join(&root[1..]),
    };
    let pods = pods(&root);
    for p in &pods {
        std::fs::create_dir_all(v1.join(p.cgroup.trim_start_matches('/')).join("app"))
            .expect("bench setup");
    }
    let disk = std::env::temp_dir();
    let mut observer = Observer::new(settings(&root, PathBuf::from("/sys/fs/cgroup"), &disk))
        .expect("bench setup");
    bench_pair(c, "real", &mut observer, &pods);
    // The real node: its root cgroup's memory.stat, machine MemTotal.
    let mut config = Config::default();
    config.node.nodefs_path = disk.clone();
    let mut node =
        Observer::new(ObserveSettings::from_config(&config, None, None).expect("bench setup"))
            .expect("bench setup");
    c.bench_function("observe/signals/real-root", |b| {
        b.iter(|| std::hint::black_box(node.observe()))
    });
    drop(tree);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .measurement_time(std::time::Duration::from_secs(3))
        .warm_up_time(std::time::Duration::from_secs(1));
    targets = fixture, real
}
criterion_main!(benches);
