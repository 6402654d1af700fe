//! Part 2's floor under the pass: the agent's own reads, timed from a thread of their own
//! beside the reference's hog, with no agent running.
//!
//! A pass is mostly cgroupfs, statvfs and procfs reads (the node's and kubepods' memory,
//! the filesystems, the task count, each pod's usage, a working set). On this machine the
//! same reads take several times longer now and then, every one of them alike and with CPU
//! time equal to wall time: the virtual CPU itself runs slower for a while. Those stretches
//! are the part 2 repetitions whose pass took milliseconds. This probe puts a figure on them
//! in every run, from the agent's code but not the agent: one [`Observer`] as the loop's,
//! on a thread at the loop's realtime priority that sleeps between reads as the loop sleeps
//! between passes, while the reference's hog fills kubepods at the repetition's rate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use reactor::decide::signal::Resource;
use reactor::decide::summary::Summary;
use reactor::observe::{Observer, PodCgroup, PodReads};
use reactor::reactor::pods::ActivePods;
use reactor::sense::{monotonic_ns, ThreadCpu};
use serde_json::{json, Value};

use crate::lag::REALTIME_PRIORITY;
use crate::report::{Dist, Table};

/// One timed set of reads, ns: wall time, and the thread's CPU time over it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Read {
    wall_ns: u64,
    cpu_ns: u64,
}

/// The sleep between two sets of reads: half the loop's timer while a threshold the kernel
/// watches is close (`kernel_watched_poll`, 100 ms), so the reads come after an idle as a
/// pass woken by the kernel does.
const EVERY: Duration = Duration::from_millis(50);

/// A probe running beside one reference repetition.
pub(crate) struct Probe {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Read>>>,
}

impl Probe {
    /// Starts reading what a memory pass reads up to its SIGKILL: everything
    /// [`Observer::observe`] reads, the usage of each of `pods`, the working set of the one
    /// whose uid is `victim`, and its containers' figures for the eviction message. The
    /// files the loop keeps open as the pods change are opened first, as it opens them.
    pub(crate) fn start(mut observer: Observer, pods: &ActivePods, victim: &str) -> Probe {
        let root = observer
            .settings()
            .node_cgroup
            .trim_end_matches('/')
            .to_string();
        let cgroups: Vec<PodCgroup> = pods.iter().map(|p| p.cgroups(&root)).collect();
        let paths: Vec<String> = cgroups.iter().map(|c| c.cgroup.clone()).collect();
        let containers: Vec<String> = cgroups
            .iter()
            .flat_map(PodCgroup::container_paths)
            .collect();
        let victim = cgroups.into_iter().find(|c| c.uid == victim);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let _ = reactor::priority::set_realtime(REALTIME_PRIORITY);
            let mut summary = Summary::default();
            let mut reads = Vec::new();
            observer.keep_pod_usage_open(paths.iter());
            observer.keep_container_files_open(containers.iter());
            let mut one = |observer: &mut Observer| {
                std::hint::black_box(observer.observe());
                std::hint::black_box(observer.pod_memory_usages(paths.iter()));
                if let Some(v) = &victim {
                    std::hint::black_box(observer.pod_working_set(&v.cgroup));
                    let reads = PodReads::message(Resource::Memory);
                    observer.observe_pods_for(std::slice::from_ref(v), reads, &mut summary);
                }
            };
            // A first set of reads, not timed.
            one(&mut observer);
            loop {
                std::thread::sleep(EVERY);
                if stopped.load(Ordering::Relaxed) {
                    return reads;
                }
                let (t0, c0) = (monotonic_ns(), ThreadCpu::now());
                one(&mut observer);
                let (c1, t1) = (ThreadCpu::now(), monotonic_ns());
                reads.push(Read {
                    wall_ns: t1.saturating_sub(t0),
                    cpu_ns: c1.since(c0).unwrap_or(0),
                });
            }
        });
        Probe {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the probe (within one sleep) and hands back its reads.
    pub(crate) fn stop(mut self) -> Vec<Read> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What one rate's reads came to: the table row and the JSON.
pub(crate) fn summary(rate: u64, reads: &[Read]) -> (Vec<String>, Value) {
    let wall = Dist::of(&reads.iter().map(|r| r.wall_ns).collect::<Vec<_>>());
    let cpu = Dist::of(&reads.iter().map(|r| r.cpu_ns).collect::<Vec<_>>());
    let over_1ms = reads.iter().filter(|r| r.wall_ns > 1_000_000).count();
    let slow = reads
        .iter()
        .filter(|r| r.wall_ns > 3 * wall.p50)
        .collect::<Vec<_>>();
    // How much of a slow read's wall time the thread was on the CPU: near 1 means the
    // virtual CPU ran slowly, not that the thread waited.
    let slow_cpu_share = (!slow.is_empty()).then(|| {
        slow.iter().map(|r| r.cpu_ns as f64).sum::<f64>()
            / slow.iter().map(|r| r.wall_ns as f64).sum::<f64>().max(1.0)
    });
    let row = vec![
        format!("{rate} MiB/s"),
        reads.len().to_string(),
        wall.p50_text(),
        wall.p99_text(),
        wall.max_text(),
        cpu.p99_text(),
        format!("{} ({})", slow.len(), share(slow.len(), reads.len())),
        format!("{over_1ms} ({})", share(over_1ms, reads.len())),
        slow_cpu_share.map_or("-".into(), |s| format!("{s:.2}")),
    ];
    let json = json!({
        "rate_mib_s": rate, "reads": reads.len(), "wall": wall.json(), "cpu": cpu.json(),
        "over_3x_median": slow.len(), "over_1ms": over_1ms,
        "over_3x_median_cpu_share_of_wall": slow_cpu_share,
    });
    (row, json)
}

fn share(k: usize, n: usize) -> String {
    if n == 0 {
        "-".into()
    } else {
        format!("{:.1} %", 100.0 * k as f64 / n as f64)
    }
}

/// The table the rates' rows go in.
pub(crate) fn table() -> Table {
    let mut t = Table::new(
        "2. The machine under the pass: the pass's reads alone, no agent running",
        &[
            "rate",
            "reads",
            "wall p50",
            "wall p99",
            "wall max",
            "CPU p99",
            "over 3× p50",
            "over 1 ms",
            "CPU / wall, over 3× p50",
        ],
    );
    t.note(format!(
        "what a memory pass reads up to its SIGKILL (the node's and kubepods' memory, the \
         filesystems, the task count, each pod's usage, the hog's working set and its \
         containers' figures for the message), through the files the loop keeps open, \
         by the agent's own observer on a thread at the loop's priority, every {} ms during \
         the reference repetitions (the hog filling kubepods, no agent); CPU / wall near 1: \
         the thread was on the CPU and the virtual CPU itself ran slowly",
        EVERY.as_millis()
    ));
    t
}
