//! Which pod to evict first, ranked as the kubelet's eviction manager ranks for each signal
//! and filesystem layout.
//!
//! Users predict evictions from the documented rules: for memory, pods using more than they
//! request go first, then lower priority, then the larger excess over the request; disk and
//! inodes use the same three steps with the usage the layout charges to a pod; pids go by
//! priority, then process count. A pod the statistics do not cover goes before any pod they
//! do (the kubelet cannot vouch for it). Every comparison is reduced to a key computed once
//! per pod, so ranking ten thousand pods is one pass to build keys and one sort of a vector.

use crate::decide::pod::PodInfo;
use crate::decide::quantity::{Quantity, NANO};
use crate::decide::resources::{EPHEMERAL_STORAGE, MEMORY};
use crate::decide::signal::{FsLayout, Resource, Signal};
use crate::decide::summary::{FsStats, PodStats, StatsIndex};

/// Which parts of a pod's disk use count against a filesystem (the kubelet's `fsStatsType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Charged {
    /// Container writable layers (`rootfs`).
    pub rootfs: bool,
    /// Container logs.
    pub logs: bool,
    /// Local volumes (emptyDir on disk, hostPath, configMap, gitRepo).
    pub local_volumes: bool,
}

/// What a disk or inode signal charges to a pod under a layout, or `None` for memory and pids.
///
/// One shared filesystem charges everything; a separate image filesystem charges writable
/// layers to `imagefs`/`containerfs` and logs plus volumes to `nodefs`; a split image
/// filesystem charges everything but images to `nodefs`/`containerfs` and only image storage,
/// which the Summary API does not attribute to pods, to `imagefs`.
pub(crate) fn charged(signal: Signal, layout: FsLayout) -> Option<Charged> {
    const ALL: Charged = Charged {
        rootfs: true,
        logs: true,
        local_volumes: true,
    };
    const NOTHING: Charged = Charged {
        rootfs: false,
        logs: false,
        local_volumes: false,
    };
    let on_nodefs = matches!(signal, Signal::NodeFsAvailable | Signal::NodeFsInodesFree);
    let on_imagefs = matches!(signal, Signal::ImageFsAvailable | Signal::ImageFsInodesFree);
    let on_containerfs = matches!(
        signal,
        Signal::ContainerFsAvailable | Signal::ContainerFsInodesFree
    );
    if !(on_nodefs || on_imagefs || on_containerfs) {
        return None;
    }
    Some(match layout {
        FsLayout::Shared => ALL,
        FsLayout::ImageFs if on_nodefs => Charged {
            rootfs: false,
            ..ALL
        },
        FsLayout::ImageFs => Charged {
            rootfs: true,
            ..NOTHING
        },
        FsLayout::ImageFsContainerFs if on_imagefs => NOTHING,
        FsLayout::ImageFsContainerFs => ALL,
    })
}

fn used(fs: Option<&FsStats>, inodes: bool) -> i128 {
    fs.and_then(|f| if inodes { f.inodes_used } else { f.used_bytes })
        .map_or(0, i128::from)
}

/// A pod's disk (or inode) usage as the kubelet's `podDiskUsage` adds it up, in whole units.
pub(crate) fn pod_disk_usage(
    pod: &PodInfo,
    stats: &PodStats,
    charged: Charged,
    inodes: bool,
) -> i128 {
    let mut total: i128 = 0;
    for c in &stats.containers {
        if charged.rootfs {
            total += used(c.rootfs.as_ref(), inodes);
        }
        if charged.logs {
            total += used(c.logs.as_ref(), inodes);
        }
    }
    if charged.local_volumes {
        for name in &pod.local_volumes {
            if let Some(v) = stats.volume.iter().find(|v| &v.name == name) {
                let amount = if inodes { v.inodes_used } else { v.used_bytes };
                total += amount.map_or(0, i128::from);
            }
        }
    }
    total
}

/// Usage-minus-request is kept exact in nanounits up to ±2^93 (about ±9.9 EB), far past any
/// node, so it packs into a sort key beside the class and priority.
const DIFF_BITS: u32 = 94;
const DIFF_MAX: i128 = (1 << (DIFF_BITS - 1)) - 1;
const DIFF_MIN: i128 = -(1 << (DIFF_BITS - 1));

/// Priority as an unsigned number that sorts like the signed one.
fn priority_bits(priority: i32) -> u128 {
    u128::from((priority as u32) ^ 0x8000_0000)
}

/// Packs the usage-based comparators (memory, disk, inodes) into one integer, smaller first:
/// pods without statistics (class 0), then pods over their request (1), then the rest (2);
/// within a class lower priority first; then the larger usage above the request first.
fn usage_key(priority: i32, usage: Option<(i128, Quantity, Quantity)>) -> u128 {
    // usage: (usage in units, request compared for "exceeds", request subtracted).
    let (class, diff): (u128, i128) = match usage {
        None => (0, 0),
        Some((units, exceed_req, sub_req)) => {
            let usage_nanos = units.saturating_mul(NANO);
            let class = if usage_nanos > exceed_req.nanos() {
                1
            } else {
                2
            };
            (class, usage_nanos.saturating_sub(sub_req.nanos()))
        }
    };
    let reversed = (DIFF_MAX - diff.clamp(DIFF_MIN, DIFF_MAX)) as u128;
    (class << 126) | (priority_bits(priority) << DIFF_BITS) | reversed
}

/// Packs the pid comparators: lower priority first, then pods without statistics, then more
/// processes first.
fn pid_key(priority: i32, processes: Option<u64>) -> u128 {
    let (class, reversed) = match processes {
        None => (0u128, 0u128),
        Some(n) => (1, u128::from(u64::MAX - n)),
    };
    (priority_bits(priority) << 65) | (class << 64) | reversed
}

/// Ranks `pods` for eviction under `signal`, first to evict first, returning indices into
/// `pods`. `stats` maps a pod uid to its Summary entry ([`crate::decide::summary::Summary::index`]).
///
/// Each pod's comparators are computed once into a packed key; the sort then compares plain
/// integers. Pods the kubelet's comparators leave tied keep their input order.
pub fn rank(
    signal: Signal,
    layout: FsLayout,
    pods: &[PodInfo],
    stats: &StatsIndex<'_>,
) -> Vec<usize> {
    let lookup = |p: &PodInfo| stats.get(p.uid.as_str()).copied();
    let key: Box<dyn Fn(&PodInfo) -> u128 + '_> = match signal.resource() {
        Resource::Pids => Box::new(move |p: &PodInfo| {
            pid_key(p.priority_or_zero(), lookup(p).map(PodStats::process_count))
        }),
        Resource::Memory => Box::new(move |p: &PodInfo| {
            let usage = lookup(p).map(|s| {
                let request = p.ranking_request(MEMORY);
                (i128::from(s.working_set_bytes()), request, request)
            });
            usage_key(p.priority_or_zero(), usage)
        }),
        Resource::EphemeralStorage | Resource::Inodes => {
            let inodes = signal.resource() == Resource::Inodes;
            let charge = charged(signal, layout).unwrap_or(Charged {
                rootfs: true,
                logs: true,
                local_volumes: true,
            });
            Box::new(move |p: &PodInfo| {
                let usage = lookup(p).map(|s| {
                    let used = pod_disk_usage(p, s, charge, inodes);
                    // The kubelet compares against the request for the resource it measures
                    // (nobody requests inodes) but always subtracts the ephemeral-storage
                    // request, inodes or not.
                    let exceed_req = if inodes {
                        p.ranking_request(Resource::Inodes.name())
                    } else {
                        p.ranking_request(EPHEMERAL_STORAGE)
                    };
                    (used, exceed_req, p.ranking_request(EPHEMERAL_STORAGE))
                });
                usage_key(p.priority_or_zero(), usage)
            })
        }
    };
    let mut keyed: Vec<(u128, u32)> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| (key(p), i as u32))
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, i)| i as usize).collect()
}

/// A pod's memory ranking key ([`rank`] for a memory signal): smaller goes first.
pub(crate) fn memory_key(pod: &PodInfo, working_set: Option<u64>) -> u128 {
    let request = pod.ranking_request(MEMORY);
    usage_key(
        pod.priority_or_zero(),
        working_set.map(|w| (i128::from(w), request, request)),
    )
}

/// The first non-critical pod [`rank`] would order for memory, found without every pod's
/// working set: `usage` holds each pod's memory usage (`None`: no statistics), which is never
/// below its working set, so its key is never after the pod's real one. The pods are tried
/// in the order of those bound keys (`info` gives each one's [`PodInfo`], so the caller's
/// pods need not be copied) and `working_set(i)` asked only for a pod that could
/// still come first; the search stops when the next bound is past the best real key found.
/// Ties keep the input order, as in [`rank`]. Returns the victim (`None`: every pod is
/// critical) and the working sets asked for, by pod.
///
/// On a node of fifty pods with one pod growing, that is fifty cheap usage reads and one or
/// two `memory.stat` reads, where [`rank`] over a full summary needs fifty of each — the
/// reaction time no longer grows with the number of pods.
pub(crate) fn first_for_memory<T>(
    pods: &[T],
    info: impl Fn(&T) -> &PodInfo,
    usage: &[Option<u64>],
    mut working_set: impl FnMut(usize) -> Option<u64>,
) -> (Option<usize>, Vec<Option<Option<u64>>>) {
    let mut asked: Vec<Option<Option<u64>>> = vec![None; pods.len()];
    let mut bounds: Vec<(u128, usize)> = pods
        .iter()
        .map(&info)
        .enumerate()
        .filter(|(_, p)| !p.is_critical())
        .map(|(i, p)| (memory_key(p, usage.get(i).copied().flatten()), i))
        .collect();
    bounds.sort_unstable();
    let mut best: Option<(u128, usize)> = None;
    for (bound, i) in bounds {
        if best.is_some_and(|b| (bound, i) > b) {
            break;
        }
        // Without a usage the pod has no statistics: its bound is its key.
        let key = match usage.get(i).copied().flatten() {
            None => bound,
            Some(_) => {
                let ws = working_set(i);
                asked[i] = Some(ws);
                memory_key(info(&pods[i]), ws)
            }
        };
        if best.is_none_or(|b| (key, i) < b) {
            best = Some((key, i));
        }
    }
    (best.map(|(_, i)| i), asked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::summary::Summary;
    use serde_json::{json, Value};

    fn pod(name: &str, priority: Option<i32>, mem_req: Option<&str>) -> Value {
        let mut requests = serde_json::Map::new();
        if let Some(r) = mem_req {
            requests.insert("memory".into(), json!(r));
        }
        let mut spec = json!({"containers": [{"name": "c", "resources": {"requests": requests}}]});
        if let Some(p) = priority {
            spec["priority"] = json!(p);
        }
        json!({"metadata": {"name": name, "uid": name}, "spec": spec})
    }

    fn pods(values: Vec<Value>) -> Vec<PodInfo> {
        values
            .into_iter()
            .map(|v| PodInfo::from_json(v).unwrap())
            .collect()
    }

    fn summary(entries: Value) -> Summary {
        Summary::from_value(entries, "summary").unwrap()
    }

    fn order(signal: Signal, layout: FsLayout, pods: &[PodInfo], s: &Summary) -> Vec<String> {
        rank(signal, layout, pods, &s.index())
            .into_iter()
            .map(|i| pods[i].name.trim_start_matches("default/").to_string())
            .collect()
    }

    fn mem(uid: &str, ws: u64) -> Value {
        json!({"podRef": {"uid": uid}, "memory": {"workingSetBytes": ws}})
    }

    #[test]
    fn memory_exceeds_then_priority_then_excess() {
        let ps = pods(vec![
            pod("under-low", Some(0), Some("100")),
            pod("over-high", Some(100), Some("100")),
            pod("over-low-small", Some(0), Some("100")),
            pod("over-low-big", Some(0), Some("100")),
            pod("under-lower", Some(-5), Some("1000")),
        ]);
        let s = summary(json!({"pods": [
            mem("under-low", 50), mem("over-high", 500), mem("over-low-small", 150),
            mem("over-low-big", 900), mem("under-lower", 10)
        ]}));
        assert_eq!(
            order(Signal::MemoryAvailable, FsLayout::Shared, &ps, &s),
            [
                "over-low-big",
                "over-low-small",
                "over-high",
                "under-lower",
                "under-low"
            ]
        );
        assert_eq!(
            order(
                Signal::AllocatableMemoryAvailable,
                FsLayout::Shared,
                &ps,
                &s
            ),
            order(Signal::MemoryAvailable, FsLayout::Shared, &ps, &s)
        );
    }

    #[test]
    fn the_bounded_memory_search_reads_one_working_set_when_one_pod_stands_out() {
        let mut values = vec![pod("hog", None, None)];
        values.extend((0..49).map(|i| pod(&format!("idle-{i}"), None, Some("64Mi"))));
        let ps = pods(values);
        // The hog uses 400 MiB; the others 10 MiB of their 64 MiB requests.
        let usage: Vec<Option<u64>> = (0..ps.len())
            .map(|i| Some(if i == 0 { 400 << 20 } else { 10 << 20 }))
            .collect();
        let mut reads = 0;
        let (victim, asked) = first_for_memory(
            &ps,
            |p| p,
            &usage,
            |i| {
                reads += 1;
                usage[i].map(|u| u - (1 << 20))
            },
        );
        assert_eq!(victim, Some(0));
        assert_eq!(reads, 1);
        assert_eq!(asked.iter().filter(|a| a.is_some()).count(), 1);
        // A pod without statistics goes first, unread; critical pods are never chosen.
        let mut usage = usage;
        usage[7] = None;
        let (victim, _) = first_for_memory(&ps, |p| p, &usage, |i| usage[i]);
        assert_eq!(victim, Some(7));
        let critical = pods(vec![pod("node-critical", Some(2_000_001_000), None)]);
        assert_eq!(
            first_for_memory(&critical, |p| p, &[Some(1 << 30)], |_| Some(1 << 30)).0,
            None
        );
    }

    #[test]
    fn memory_equal_to_request_does_not_exceed_and_best_effort_exceeds_with_any_use() {
        let ps = pods(vec![
            pod("exact", Some(0), Some("100")),
            pod("besteffort-idle", Some(0), None),
            pod("besteffort", Some(0), None),
        ]);
        let s = summary(json!({"pods": [mem("exact", 100), mem("besteffort", 1),
                                        {"podRef": {"uid": "besteffort-idle"}}]}));
        assert_eq!(
            order(Signal::MemoryAvailable, FsLayout::Shared, &ps, &s),
            ["besteffort", "exact", "besteffort-idle"]
        );
    }

    #[test]
    fn pods_without_stats_go_first_by_priority() {
        let ps = pods(vec![
            pod("has-stats-over", Some(0), None),
            pod("no-stats-high", Some(10), None),
            pod("no-stats-low", Some(1), None),
        ]);
        let s = summary(json!({"pods": [mem("has-stats-over", 1 << 30)]}));
        assert_eq!(
            order(Signal::MemoryAvailable, FsLayout::Shared, &ps, &s),
            ["no-stats-low", "no-stats-high", "has-stats-over"]
        );
        // For pids, priority comes before the missing-stats rule.
        assert_eq!(
            order(Signal::PidAvailable, FsLayout::Shared, &ps, &s),
            ["has-stats-over", "no-stats-low", "no-stats-high"]
        );
    }

    #[test]
    fn ties_keep_input_order_in_every_ranking() {
        let ps = pods(vec![
            pod("a", Some(0), Some("10")),
            pod("b", Some(0), Some("10")),
            pod("c", Some(0), Some("10")),
        ]);
        let s = summary(json!({"pods": [mem("a", 50), mem("b", 50), mem("c", 50)]}));
        for signal in Signal::ALL {
            for layout in [
                FsLayout::Shared,
                FsLayout::ImageFs,
                FsLayout::ImageFsContainerFs,
            ] {
                assert_eq!(order(signal, layout, &ps, &s), ["a", "b", "c"], "{signal}");
            }
        }
        // Missing priority ranks as 0.
        let ps = pods(vec![pod("x", None, None), pod("y", Some(0), None)]);
        let s = summary(json!({"pods": []}));
        assert_eq!(
            order(Signal::MemoryAvailable, FsLayout::Shared, &ps, &s),
            ["x", "y"]
        );
    }

    #[test]
    fn pids_priority_then_process_count() {
        let ps = pods(vec![
            pod("few", Some(0), None),
            pod("many", Some(0), None),
            pod("many-high", Some(5), None),
            pod("none-block", Some(0), None),
        ]);
        let s = summary(json!({"pods": [
            {"podRef": {"uid": "few"}, "process_stats": {"process_count": 2}},
            {"podRef": {"uid": "many"}, "process_stats": {"process_count": 200}},
            {"podRef": {"uid": "many-high"}, "process_stats": {"process_count": 900}},
            {"podRef": {"uid": "none-block"}}
        ]}));
        assert_eq!(
            order(Signal::PidAvailable, FsLayout::Shared, &ps, &s),
            ["many", "few", "none-block", "many-high"]
        );
    }

    fn disk_pod(name: &str, eph_req: Option<&str>) -> Value {
        let mut requests = serde_json::Map::new();
        if let Some(r) = eph_req {
            requests.insert("ephemeral-storage".into(), json!(r));
        }
        json!({"metadata": {"name": name, "uid": name}, "spec": {
            "containers": [{"name": "c", "resources": {"requests": requests}}],
            "volumes": [{"name": "scratch", "emptyDir": {}},
                        {"name": "ram", "emptyDir": {"medium": "Memory"}},
                        {"name": "secret", "secret": {"secretName": "s"}}]}})
    }

    fn disk_stats(uid: &str, root: u64, logs: u64, scratch: u64, ram: u64) -> Value {
        json!({"podRef": {"uid": uid},
               "containers": [{"name": "c", "rootfs": {"usedBytes": root, "inodesUsed": root},
                               "logs": {"usedBytes": logs, "inodesUsed": logs}}],
               "volume": [{"name": "scratch", "usedBytes": scratch, "inodesUsed": scratch},
                          {"name": "ram", "usedBytes": ram, "inodesUsed": ram},
                          {"name": "secret", "usedBytes": ram, "inodesUsed": ram}]})
    }

    #[test]
    fn disk_usage_charged_by_layout() {
        let ps = pods(vec![
            disk_pod("rootfs-heavy", None),
            disk_pod("logs-heavy", None),
            disk_pod("volume-heavy", None),
            disk_pod("memory-volume-heavy", None),
        ]);
        let s = summary(json!({"pods": [
            disk_stats("rootfs-heavy", 1000, 1, 1, 0),
            disk_stats("logs-heavy", 1, 700, 1, 0),
            disk_stats("volume-heavy", 1, 1, 400, 0),
            disk_stats("memory-volume-heavy", 1, 1, 1, 5000)
        ]}));
        // Shared: rootfs + logs + disk-backed local volumes (not memory emptyDir, not secret).
        let shared = [
            "rootfs-heavy",
            "logs-heavy",
            "volume-heavy",
            "memory-volume-heavy",
        ];
        for signal in [
            Signal::NodeFsAvailable,
            Signal::ImageFsAvailable,
            Signal::ContainerFsAvailable,
            Signal::NodeFsInodesFree,
        ] {
            assert_eq!(order(signal, FsLayout::Shared, &ps, &s), shared, "{signal}");
        }
        // Separate imagefs: nodefs charges logs + volumes, imagefs/containerfs charge rootfs.
        assert_eq!(
            order(Signal::NodeFsAvailable, FsLayout::ImageFs, &ps, &s),
            [
                "logs-heavy",
                "volume-heavy",
                "rootfs-heavy",
                "memory-volume-heavy"
            ]
        );
        for signal in [Signal::ImageFsAvailable, Signal::ContainerFsInodesFree] {
            assert_eq!(
                order(signal, FsLayout::ImageFs, &ps, &s)[0],
                "rootfs-heavy",
                "{signal}"
            );
        }
        // Split image filesystem: nodefs/containerfs charge everything but images; imagefs
        // charges nothing the Summary attributes to pods, so all tie.
        assert_eq!(
            order(
                Signal::ContainerFsAvailable,
                FsLayout::ImageFsContainerFs,
                &ps,
                &s
            ),
            shared
        );
        assert_eq!(
            order(
                Signal::ImageFsAvailable,
                FsLayout::ImageFsContainerFs,
                &ps,
                &s
            ),
            shared
        );
    }

    #[test]
    fn disk_exceeds_request_then_priority_then_excess() {
        let ps = pods(vec![
            disk_pod("under", Some("10k")),
            disk_pod("over-small", Some("100")),
            disk_pod("over-big", None),
        ]);
        let s = summary(json!({"pods": [
            disk_stats("under", 5000, 0, 0, 0),
            disk_stats("over-small", 200, 0, 0, 0),
            disk_stats("over-big", 300, 0, 0, 0)
        ]}));
        assert_eq!(
            order(Signal::NodeFsAvailable, FsLayout::Shared, &ps, &s),
            ["over-big", "over-small", "under"]
        );
        // Inodes: nobody requests inodes, so every pod with usage exceeds; the kubelet still
        // subtracts the ephemeral-storage request from the inode count.
        assert_eq!(
            order(Signal::NodeFsInodesFree, FsLayout::Shared, &ps, &s),
            ["over-big", "over-small", "under"]
        );
        // Split imagefs: usage is zero for all; the smaller ephemeral request ranks first.
        assert_eq!(
            order(
                Signal::ImageFsInodesFree,
                FsLayout::ImageFsContainerFs,
                &ps,
                &s
            ),
            ["over-big", "over-small", "under"]
        );
    }

    #[test]
    fn packed_keys_order_extremes_like_the_comparators() {
        // Priority across the whole i32 range, classes, and huge or negative excess.
        let k = |class_usage: Option<(i128, i64, i64)>, prio: i32| {
            usage_key(
                prio,
                class_usage.map(|(u, e, s)| (u, Quantity::from_units(e), Quantity::from_units(s))),
            )
        };
        assert!(k(None, i32::MAX) < k(Some((1, 0, 0)), i32::MIN));
        assert!(k(Some((1, 0, 0)), i32::MAX) < k(Some((0, 0, 0)), i32::MIN));
        assert!(k(Some((5, 0, 0)), i32::MIN) < k(Some((5, 0, 0)), -1));
        assert!(k(Some((5, 0, 0)), -1) < k(Some((5, 0, 0)), 0));
        assert!(k(Some((i128::from(u64::MAX), 0, 0)), 0) < k(Some((1 << 40, 0, 0)), 0));
        assert!(k(Some((0, 0, i64::MAX)), 0) > k(Some((0, 0, 1)), 0));
        assert!(pid_key(i32::MIN, Some(0)) < pid_key(-1, None));
        assert!(pid_key(0, None) < pid_key(0, Some(u64::MAX)));
        assert!(pid_key(0, Some(u64::MAX)) < pid_key(0, Some(0)));
        assert!(pid_key(0, Some(0)) < pid_key(i32::MAX, None));
    }

    mod against_the_comparators {
        //! The packed keys must order pods exactly as the kubelet's comparator chains do:
        //! every adjacent pair in the output compares as "not after" under the chain, for
        //! random pods, usage, requests and missing statistics.

        use super::*;
        use proptest::prelude::*;
        use std::cmp::Ordering;

        #[derive(Debug, Clone)]
        struct Spec {
            priority: Option<i32>,
            mem_req: Option<u64>,
            eph_req: Option<u64>,
            stats: Option<(u64, u64, u64, u64, u64)>, // ws, rootfs, logs, volume, procs
        }

        fn spec() -> impl Strategy<Value = Spec> {
            (
                prop::option::of(prop_oneof![Just(0), Just(-10), Just(1000), any::<i32>()]),
                prop::option::of(0u64..4000),
                prop::option::of(0u64..4000),
                prop::option::of((0u64..5000, 0u64..3000, 0u64..3000, 0u64..3000, 0u64..50)),
            )
                .prop_map(|(priority, mem_req, eph_req, stats)| Spec {
                    priority,
                    mem_req,
                    eph_req,
                    stats,
                })
        }

        fn build(specs: &[Spec]) -> (Vec<PodInfo>, Summary) {
            let mut pods = Vec::new();
            let mut stats = Vec::new();
            for (i, s) in specs.iter().enumerate() {
                let uid = format!("u{i}");
                let mut requests = serde_json::Map::new();
                if let Some(m) = s.mem_req {
                    requests.insert("memory".into(), json!(m.to_string()));
                }
                if let Some(e) = s.eph_req {
                    requests.insert("ephemeral-storage".into(), json!(e.to_string()));
                }
                let mut spec = json!({"containers": [{"name": "c", "resources": {"requests": requests}}],
                                      "volumes": [{"name": "v", "emptyDir": {}}]});
                if let Some(p) = s.priority {
                    spec["priority"] = json!(p);
                }
                pods.push(
                    PodInfo::from_json(
                        json!({"metadata": {"name": format!("p{i}"), "uid": uid}, "spec": spec}),
                    )
                    .expect("pod"),
                );
                if let Some((ws, root, logs, vol, procs)) = s.stats {
                    stats.push(json!({"podRef": {"uid": uid},
                        "memory": {"workingSetBytes": ws},
                        "containers": [{"name": "c", "rootfs": {"usedBytes": root, "inodesUsed": root / 7},
                                        "logs": {"usedBytes": logs, "inodesUsed": logs / 7}}],
                        "volume": [{"name": "v", "usedBytes": vol, "inodesUsed": vol / 7}],
                        "process_stats": {"process_count": procs}}));
                }
            }
            let summary = Summary::from_value(json!({"pods": stats}), "summary").expect("summary");
            (pods, summary)
        }

        /// cmpBool: true before false.
        fn cmp_bool(a: bool, b: bool) -> Ordering {
            match (a, b) {
                (true, false) => Ordering::Less,
                (false, true) => Ordering::Greater,
                _ => Ordering::Equal,
            }
        }

        /// The kubelet's chain for `signal`, written out comparator by comparator.
        fn chain(
            signal: Signal,
            layout: FsLayout,
            a: &PodInfo,
            b: &PodInfo,
            index: &StatsIndex<'_>,
        ) -> Ordering {
            let sa = index.get(a.uid.as_str()).copied();
            let sb = index.get(b.uid.as_str()).copied();
            let missing = cmp_bool(sa.is_none(), sb.is_none());
            let priority = a.priority_or_zero().cmp(&b.priority_or_zero());
            let nanos = |units: i128| units * NANO;
            match signal.resource() {
                Resource::Pids => priority.then_with(|| match (sa, sb) {
                    (Some(x), Some(y)) => y.process_count().cmp(&x.process_count()),
                    _ => missing,
                }),
                Resource::Memory => {
                    let usage = |s: &PodStats| nanos(i128::from(s.working_set_bytes()));
                    let req = |p: &PodInfo| p.ranking_request(MEMORY).nanos();
                    let exceeds = match (sa, sb) {
                        (Some(x), Some(y)) => cmp_bool(usage(x) > req(a), usage(y) > req(b)),
                        _ => missing,
                    };
                    exceeds.then(priority).then_with(|| match (sa, sb) {
                        (Some(x), Some(y)) => (usage(y) - req(b)).cmp(&(usage(x) - req(a))),
                        _ => missing,
                    })
                }
                Resource::EphemeralStorage | Resource::Inodes => {
                    let inodes = signal.resource() == Resource::Inodes;
                    let charge = charged(signal, layout).expect("disk signal");
                    let usage =
                        |p: &PodInfo, s: &PodStats| nanos(pod_disk_usage(p, s, charge, inodes));
                    let exceed_req = |p: &PodInfo| {
                        p.ranking_request(if inodes { "inodes" } else { EPHEMERAL_STORAGE })
                            .nanos()
                    };
                    let eph = |p: &PodInfo| p.ranking_request(EPHEMERAL_STORAGE).nanos();
                    let exceeds = match (sa, sb) {
                        (Some(x), Some(y)) => {
                            cmp_bool(usage(a, x) > exceed_req(a), usage(b, y) > exceed_req(b))
                        }
                        _ => missing,
                    };
                    exceeds.then(priority).then_with(|| match (sa, sb) {
                        (Some(x), Some(y)) => (usage(b, y) - eph(b)).cmp(&(usage(a, x) - eph(a))),
                        _ => missing,
                    })
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(96))]

            #[test]
            fn ranking_never_puts_a_pod_after_one_the_chain_ranks_later(
                specs in prop::collection::vec(spec(), 0..24),
                which in 0usize..9,
                layout in prop_oneof![Just(FsLayout::Shared), Just(FsLayout::ImageFs), Just(FsLayout::ImageFsContainerFs)],
            ) {
                let signal = Signal::ALL[which];
                let (pods, summary) = build(&specs);
                let index = summary.index();
                let order = rank(signal, layout, &pods, &index);
                prop_assert_eq!(order.len(), pods.len());
                for pair in order.windows(2) {
                    let (a, b) = (&pods[pair[0]], &pods[pair[1]]);
                    prop_assert_ne!(
                        chain(signal, layout, a, b, &index),
                        Ordering::Greater,
                        "{} ranked before {} for {}", a.name, b.name, signal
                    );
                }
                let mut seen = order.clone();
                seen.sort_unstable();
                prop_assert_eq!(seen, (0..pods.len()).collect::<Vec<_>>());
            }

            #[test]
            fn the_bounded_memory_search_picks_the_pod_the_full_ranking_evicts(
                specs in prop::collection::vec(spec(), 0..24),
                extra in prop::collection::vec(0u64..3000, 24),
            ) {
                let (pods, summary) = build(&specs);
                let index = summary.index();
                let ws = |i: usize| index.get(pods[i].uid.as_str()).map(|s| s.working_set_bytes());
                // Usage is the working set plus inactive file pages: never below it.
                let usage: Vec<Option<u64>> =
                    (0..pods.len()).map(|i| ws(i).map(|w| w + extra[i])).collect();
                let full = rank(Signal::MemoryAvailable, FsLayout::Shared, &pods, &index)
                    .into_iter()
                    .find(|&i| !pods[i].is_critical());
                let (found, asked) = first_for_memory(&pods, |p| p, &usage, ws);
                prop_assert_eq!(found, full);
                for (i, a) in asked.iter().enumerate() {
                    // Only pods with a usage are asked, and the answer is what was read.
                    if let Some(got) = a {
                        prop_assert!(usage[i].is_some());
                        prop_assert_eq!(*got, ws(i));
                    }
                }
            }
        }
    }
}
