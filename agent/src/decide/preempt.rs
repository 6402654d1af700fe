//! Critical-pod admission preemption, as the kubelet's `CriticalPodAdmissionHandler` does it.
//!
//! When a pod fails admission on a node, the kubelet lets it in anyway only if it is critical
//! and every failure is a shortage of some resource; it then evicts running pods whose
//! requests cover the shortage. Victims come from the lowest QoS tier that can help: the
//! guaranteed pods needed even after every burstable and best-effort pod were gone, then the
//! burstable ones needed after every best-effort pod and those guaranteed ones, then the
//! best-effort ones still needed. Inside a tier a greedy loop takes, each round, the pod whose
//! requests leave the smallest "distance" to the remaining shortage (sum over resources of the
//! squared fraction still missing), ties going to the smaller memory then cpu request.
//!
//! Operators expect exactly the kubelet's victims, so the arithmetic is the kubelet's too:
//! integer requests (millicores for cpu, whole units elsewhere, 1 per pod for `pods`),
//! distances in `f64` computed in the same order, and the same tie rule and candidate order
//! (the chosen pod's slot is refilled from the end of the list).

use super::pod::{preemptable, PodInfo};
use super::qos::QosClass;
use super::resources::{CPU, MEMORY, PODS};

/// One reason a pod failed admission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdmitFailure {
    /// Not enough of a resource (`InsufficientResourceError`), in the kubelet's integer units:
    /// millicores for cpu, whole units otherwise.
    InsufficientResource {
        /// The resource name (`cpu`, `memory`, `pods`, `nvidia.com/gpu`, ...).
        resource: String,
        /// What the pod asks for.
        requested: i64,
        /// What running pods already hold.
        used: i64,
        /// What the node offers.
        capacity: i64,
    },
    /// Any other reason (node selector, taints, ...): preemption cannot fix it.
    Other {
        /// The reason text, reported as given.
        reason: String,
    },
}

impl AdmitFailure {
    /// The kubelet's reason string: `"Insufficient cpu"`, or the given text.
    pub fn reason(&self) -> String {
        match self {
            AdmitFailure::InsufficientResource { resource, .. } => {
                format!("Insufficient {resource}")
            }
            AdmitFailure::Other { reason } => reason.clone(),
        }
    }

    /// How much is missing (`GetInsufficientAmount`: requested - (capacity - used)).
    fn insufficient_amount(requested: i64, used: i64, capacity: i64) -> i64 {
        requested.saturating_sub(capacity.saturating_sub(used))
    }
}

/// What the kubelet decides for a pod that failed admission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the pod is admitted.
    pub admit: bool,
    /// Indices into the running pods to evict, in eviction order.
    pub preempt: Vec<usize>,
    /// The failure reasons that still stand (empty when admitted or on `error`).
    pub reasons: Vec<String>,
    /// Why preemption could not free enough, when it could not.
    pub error: Option<String>,
}

/// A shortage still to cover: which resource (index into the original list) and how much.
#[derive(Clone, Copy, Debug)]
struct Requirement {
    resource: usize,
    quantity: i64,
}

/// A preemptable running pod with its requests pre-read in the kubelet's integer units.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    /// Index into the running pods.
    index: usize,
    /// Offset of this pod's requests (one per resource) in the request table.
    row: usize,
    memory: i64,
    cpu: i64,
}

struct Table<'a> {
    names: Vec<&'a str>,
    requests: Vec<i64>,
}

impl Table<'_> {
    fn request(&self, c: &Candidate, resource: usize) -> i64 {
        self.requests[c.row + resource]
    }

    fn subtract<'c>(
        &self,
        reqs: &[Requirement],
        pods: impl Iterator<Item = &'c Candidate> + Clone,
    ) -> Vec<Requirement> {
        let mut out = Vec::with_capacity(reqs.len());
        for r in reqs {
            let mut left = r.quantity;
            for p in pods.clone() {
                left = left.saturating_sub(self.request(p, r.resource));
                if left <= 0 {
                    break;
                }
            }
            if left > 0 {
                out.push(Requirement {
                    resource: r.resource,
                    quantity: left,
                });
            }
        }
        out
    }

    fn distance(&self, reqs: &[Requirement], c: &Candidate) -> f64 {
        let mut dist = 0.0;
        for r in reqs {
            let remaining = r.quantity.wrapping_sub(self.request(c, r.resource)) as f64;
            if remaining > 0.0 {
                let fraction = remaining / r.quantity as f64;
                dist += fraction * fraction;
            }
        }
        dist
    }

    fn describe(&self, reqs: &[Requirement]) -> String {
        let mut s = String::from("[");
        for r in reqs {
            s.push_str(&format!(
                "(res: {}, q: {}), ",
                self.names[r.resource], r.quantity
            ));
        }
        s.push(']');
        s
    }
}

/// `smallerResourceRequest`: memory first, then cpu; a full tie counts as smaller.
fn smaller(a: &Candidate, b: &Candidate) -> bool {
    for (x, y) in [(a.memory, b.memory), (a.cpu, b.cpu)] {
        if x < y {
            return true;
        }
        if x > y {
            return false;
        }
    }
    true
}

/// No set of running pods frees what the admitted pod needs: the kubelet's message, with the
/// resources still short.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no set of running pods found to reclaim resources: {0}")]
struct NoVictims(String);

/// The greedy loop over one tier (`getPodsToPreemptByDistance`).
fn by_distance(
    table: &Table<'_>,
    mut pods: Vec<Candidate>,
    mut reqs: Vec<Requirement>,
) -> Result<Vec<Candidate>, NoVictims> {
    let mut chosen = Vec::new();
    while !reqs.is_empty() {
        if pods.is_empty() {
            return Err(NoVictims(table.describe(&reqs)));
        }
        let mut best_distance = (reqs.len() + 1) as f64;
        let mut best = 0;
        for (i, pod) in pods.iter().enumerate() {
            let d = table.distance(&reqs, pod);
            if d < best_distance || (d == best_distance && smaller(pod, &pods[best])) {
                best_distance = d;
                best = i;
            }
        }
        let victim = pods.swap_remove(best);
        reqs = table.subtract(&reqs, std::iter::once(&victim));
        chosen.push(victim);
    }
    Ok(chosen)
}

/// `HandleAdmissionFailure`: decides whether `admit` gets in despite `failures`, and which of
/// `running` are evicted to make room.
pub fn handle_admission_failure(
    admit: &PodInfo,
    running: &[PodInfo],
    failures: &[AdmitFailure],
) -> Decision {
    if !admit.is_critical() {
        return Decision {
            admit: false,
            preempt: Vec::new(),
            reasons: failures.iter().map(AdmitFailure::reason).collect(),
            error: None,
        };
    }
    let others: Vec<String> = failures
        .iter()
        .filter(|f| matches!(f, AdmitFailure::Other { .. }))
        .map(AdmitFailure::reason)
        .collect();
    if !others.is_empty() {
        return Decision {
            admit: false,
            preempt: Vec::new(),
            reasons: others,
            error: None,
        };
    }
    let mut names: Vec<&str> = Vec::new();
    let mut reqs = Vec::new();
    for f in failures {
        if let AdmitFailure::InsufficientResource {
            resource,
            requested,
            used,
            capacity,
        } = f
        {
            reqs.push(Requirement {
                resource: names.len(),
                quantity: AdmitFailure::insufficient_amount(*requested, *used, *capacity),
            });
            names.push(resource.as_str());
        }
    }
    match pods_to_preempt(admit, running, names, &reqs) {
        Ok(preempt) => Decision {
            admit: true,
            preempt,
            reasons: Vec::new(),
            error: None,
        },
        Err(e) => Decision {
            admit: false,
            preempt: Vec::new(),
            reasons: Vec::new(),
            error: Some(format!(
                "preemption: error finding a set of pods to preempt: {e}"
            )),
        },
    }
}

/// `getPodsToPreempt`: the tiers, then the three distance loops, guaranteed first.
fn pods_to_preempt(
    admit: &PodInfo,
    running: &[PodInfo],
    names: Vec<&str>,
    reqs: &[Requirement],
) -> Result<Vec<usize>, NoVictims> {
    let width = names.len();
    let mut table = Table {
        names,
        requests: Vec::new(),
    };
    let mut best_effort = Vec::new();
    let mut burstable = Vec::new();
    let mut guaranteed = Vec::new();
    for (index, pod) in running.iter().enumerate() {
        if !preemptable(admit, pod) {
            continue;
        }
        let row = table.requests.len();
        for name in &table.names {
            let units = pod_units(pod, name);
            table.requests.push(units);
        }
        debug_assert_eq!(table.requests.len(), row + width);
        let c = Candidate {
            index,
            row,
            memory: pod.request_units(MEMORY),
            cpu: pod.request_units(CPU),
        };
        match pod.qos {
            QosClass::BestEffort => best_effort.push(c),
            QosClass::Burstable => burstable.push(c),
            QosClass::Guaranteed => guaranteed.push(c),
        }
    }

    let unable = table.subtract(
        reqs,
        best_effort.iter().chain(&burstable).chain(&guaranteed),
    );
    if !unable.is_empty() {
        return Err(NoVictims(table.describe(&unable)));
    }
    let g_reqs = table.subtract(reqs, best_effort.iter().chain(&burstable));
    let g = by_distance(&table, guaranteed, g_reqs)?;
    let b_reqs = table.subtract(reqs, best_effort.iter().chain(&g));
    let b = by_distance(&table, burstable, b_reqs)?;
    let e_reqs = table.subtract(reqs, b.iter().chain(&g));
    let e = by_distance(&table, best_effort, e_reqs)?;
    Ok(e.iter().chain(&b).chain(&g).map(|c| c.index).collect())
}

fn pod_units(pod: &PodInfo, resource: &str) -> i64 {
    if resource == PODS {
        1
    } else {
        pod.request_units(resource)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn pod(name: &str, priority: Option<i32>, req: Value, lim: Value) -> PodInfo {
        let mut spec =
            json!({"containers": [{"name": "c", "resources": {"requests": req, "limits": lim}}]});
        if let Some(p) = priority {
            spec["priority"] = json!(p);
        }
        PodInfo::from_json(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
    }

    fn be(name: &str) -> PodInfo {
        pod(name, None, json!({}), json!({}))
    }

    fn bu(name: &str, cpu: &str, mem: &str) -> PodInfo {
        pod(name, None, json!({"cpu": cpu, "memory": mem}), json!({}))
    }

    fn gu(name: &str, cpu: &str, mem: &str) -> PodInfo {
        let r = json!({"cpu": cpu, "memory": mem});
        pod(name, None, r.clone(), r)
    }

    fn critical() -> PodInfo {
        pod("critical", Some(2_000_000_000), json!({}), json!({}))
    }

    fn mem(amount: i64) -> AdmitFailure {
        AdmitFailure::InsufficientResource {
            resource: "memory".into(),
            requested: amount,
            used: 0,
            capacity: 0,
        }
    }

    fn cpu(millis: i64) -> AdmitFailure {
        AdmitFailure::InsufficientResource {
            resource: "cpu".into(),
            requested: millis,
            used: 0,
            capacity: 0,
        }
    }

    fn names(running: &[PodInfo], d: &Decision) -> Vec<String> {
        d.preempt.iter().map(|&i| running[i].name.clone()).collect()
    }

    const MI: i64 = 1 << 20;

    #[test]
    fn non_critical_keeps_every_reason() {
        let running = vec![be("a")];
        let d = handle_admission_failure(
            &be("x"),
            &running,
            &[
                cpu(100),
                AdmitFailure::Other {
                    reason: "node(s) didn't match Pod's node affinity".into(),
                },
            ],
        );
        assert!(!d.admit);
        assert!(d.preempt.is_empty());
        assert_eq!(
            d.reasons,
            vec![
                "Insufficient cpu",
                "node(s) didn't match Pod's node affinity"
            ]
        );
        assert_eq!(d.error, None);
    }

    #[test]
    fn other_failures_block_even_critical_pods() {
        let running = vec![be("a")];
        let d = handle_admission_failure(
            &critical(),
            &running,
            &[
                mem(10),
                AdmitFailure::Other {
                    reason: "Taint".into(),
                },
            ],
        );
        assert!(!d.admit);
        assert_eq!(d.reasons, vec!["Taint"]);
        assert!(d.preempt.is_empty());
    }

    #[test]
    fn insufficient_amount_is_requested_minus_free() {
        // requested 300Mi, capacity 1000Mi, used 800Mi: 100Mi missing; a 100Mi pod covers it.
        let running = vec![bu("small", "100m", "100Mi"), bu("big", "100m", "500Mi")];
        let d = handle_admission_failure(
            &critical(),
            &running,
            &[AdmitFailure::InsufficientResource {
                resource: "memory".into(),
                requested: 300 * MI,
                used: 800 * MI,
                capacity: 1000 * MI,
            }],
        );
        assert!(d.admit);
        assert_eq!(names(&running, &d), vec!["default/small"]);
    }

    #[test]
    fn best_effort_pods_cannot_free_requests() {
        // Best-effort pods request nothing, so they never cover a shortage.
        let running = vec![be("a"), be("b"), bu("c", "100m", "200Mi")];
        let d = handle_admission_failure(&critical(), &running, &[mem(150 * MI)]);
        assert!(d.admit);
        assert_eq!(names(&running, &d), vec!["default/c"]);
    }

    #[test]
    fn lower_tier_preferred_over_guaranteed() {
        let running = vec![gu("g", "1", "1Gi"), bu("b", "1", "1Gi")];
        let d = handle_admission_failure(&critical(), &running, &[mem(512 * MI)]);
        assert_eq!(names(&running, &d), vec!["default/b"]);
    }

    #[test]
    fn guaranteed_taken_only_when_lower_tiers_do_not_suffice_and_order_is_tiered() {
        let running = vec![
            gu("g1", "1", "1Gi"),
            gu("g2", "1", "2Gi"),
            bu("b1", "1", "1Gi"),
            bu("b2", "1", "256Mi"),
        ];
        // 2Gi missing: all burstable free 1.25Gi, so 0.75Gi must come from guaranteed: the
        // 1Gi one is closest. Then with g1 gone, burstable needs 1Gi: b1 exactly.
        let d = handle_admission_failure(&critical(), &running, &[mem(2048 * MI)]);
        assert!(d.admit);
        assert_eq!(names(&running, &d), vec!["default/b1", "default/g1"]);
    }

    #[test]
    fn distance_picks_the_pod_closest_to_the_requirement() {
        let running = vec![
            bu("huge", "4", "8Gi"),
            bu("exact", "1", "1Gi"),
            bu("half", "500m", "512Mi"),
        ];
        let d = handle_admission_failure(&critical(), &running, &[mem(1024 * MI)]);
        // Both huge and exact leave distance 0; the smaller request wins.
        assert_eq!(names(&running, &d), vec!["default/exact"]);
    }

    #[test]
    fn ties_go_to_the_smaller_memory_then_cpu_request() {
        let running = vec![
            bu("a", "2", "1Gi"),
            bu("b", "1", "1Gi"),
            bu("c", "1", "2Gi"),
        ];
        let d = handle_admission_failure(&critical(), &running, &[mem(100 * MI)]);
        assert_eq!(names(&running, &d), vec!["default/b"]);
    }

    #[test]
    fn exact_ties_go_to_the_later_pod_as_in_the_kubelet() {
        let running = vec![bu("first", "1", "1Gi"), bu("second", "1", "1Gi")];
        let d = handle_admission_failure(&critical(), &running, &[mem(100 * MI)]);
        assert_eq!(names(&running, &d), vec!["default/second"]);
    }

    #[test]
    fn several_resources_weigh_equally() {
        // Needs 1 cpu and 1Gi. "cpu" covers cpu fully (distance 1 from memory), "mem" covers
        // memory fully (distance 1 from cpu), "both" covers half of each (0.25 + 0.25).
        let running = vec![
            bu("cpu", "1", "0"),
            bu("mem", "0", "1Gi"),
            bu("both", "500m", "512Mi"),
        ];
        let d = handle_admission_failure(&critical(), &running, &[cpu(1000), mem(1024 * MI)]);
        assert!(d.admit);
        // Round 1: "both" (0.5). Then 500m and 512Mi remain; "cpu" and "mem" each leave one
        // requirement wholly missing (distance 1), a tie that goes to the smaller memory
        // request ("cpu"); memory is still short, so "mem" follows.
        assert_eq!(
            names(&running, &d),
            vec!["default/both", "default/cpu", "default/mem"]
        );
    }

    #[test]
    fn no_set_of_pods_is_an_error() {
        let running = vec![bu("a", "100m", "100Mi")];
        let d = handle_admission_failure(&critical(), &running, &[mem(1024 * MI)]);
        assert!(!d.admit);
        assert!(d.preempt.is_empty());
        assert_eq!(
            d.error.as_deref(),
            Some(
                "preemption: error finding a set of pods to preempt: no set of running pods \
                 found to reclaim resources: [(res: memory, q: 968884224), ]"
            )
        );
    }

    #[test]
    fn critical_pods_are_not_victims_of_equal_priority() {
        let running = vec![
            pod(
                "sys",
                Some(2_000_000_000),
                json!({"memory": "1Gi"}),
                json!({}),
            ),
            bu("user", "100m", "100Mi"),
        ];
        let d = handle_admission_failure(&critical(), &running, &[mem(500 * MI)]);
        assert!(!d.admit);
        assert!(d.error.is_some());
        // A higher-priority critical pod may preempt a lower-priority critical one.
        let node_critical = pod("node", Some(2_000_001_000), json!({}), json!({}));
        let d = handle_admission_failure(&node_critical, &running, &[mem(500 * MI)]);
        assert!(d.admit);
        assert_eq!(names(&running, &d), vec!["default/sys"]);
    }

    #[test]
    fn static_pods_without_priority_are_never_victims() {
        let stat = PodInfo::from_json(
            json!({"metadata": {"name": "etcd", "namespace": "kube-system",
            "annotations": {"kubernetes.io/config.source": "file"}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "1Gi"}}}]}}),
        )
        .unwrap();
        let running = vec![stat];
        let node_critical = pod("node", Some(2_000_001_000), json!({}), json!({}));
        let d = handle_admission_failure(&node_critical, &running, &[mem(500 * MI)]);
        assert!(!d.admit);
    }

    #[test]
    fn pods_resource_counts_one_per_pod() {
        let running = vec![be("a"), be("b"), be("c")];
        let d = handle_admission_failure(
            &critical(),
            &running,
            &[AdmitFailure::InsufficientResource {
                resource: "pods".into(),
                requested: 1,
                used: 110,
                capacity: 110,
            }],
        );
        assert!(d.admit);
        assert_eq!(d.preempt.len(), 1);
        // All tie; the kubelet's loop ends on the last one.
        assert_eq!(names(&running, &d), vec!["default/c"]);
    }

    #[test]
    fn no_shortage_admits_without_victims() {
        let running = vec![be("a")];
        let d = handle_admission_failure(&critical(), &running, &[]);
        assert!(d.admit && d.preempt.is_empty() && d.error.is_none());
        // A failure whose amount is not positive needs no victim either.
        let d = handle_admission_failure(
            &critical(),
            &running,
            &[AdmitFailure::InsufficientResource {
                resource: "cpu".into(),
                requested: 100,
                used: 0,
                capacity: 1000,
            }],
        );
        assert!(d.admit && d.preempt.is_empty());
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn arb_pod(i: usize) -> impl Strategy<Value = PodInfo> {
            (0u8..3, 0i64..4000, 0i64..4096, prop::option::of(-5i32..5), any::<bool>()).prop_map(
                move |(tier, cpu, mem, priority, critical)| {
                    let (req, lim) = match tier {
                        0 => (json!({}), json!({})),
                        1 => (json!({"cpu": format!("{cpu}m"), "memory": format!("{mem}Mi")}), json!({})),
                        _ => {
                            let r = json!({"cpu": format!("{}m", cpu + 1), "memory": format!("{}Mi", mem + 1)});
                            (r.clone(), r)
                        }
                    };
                    let priority = if critical { Some(2_000_000_000) } else { priority };
                    pod(&format!("p{i}"), priority, req, lim)
                },
            )
        }

        fn arb_pods() -> impl Strategy<Value = Vec<PodInfo>> {
            (0usize..12).prop_flat_map(|n| (0..n).map(arb_pod).collect::<Vec<_>>())
        }

        proptest! {
            /// Admitted means the victims' requests cover every shortage; refused with an
            /// error means even every candidate together could not; victims come best-effort
            /// first, then burstable, then guaranteed, and each may be preempted.
            #[test]
            fn victims_cover_the_shortage_in_tier_order(
                running in arb_pods(),
                mem_short in -100i64..8000,
                cpu_short in prop::option::of(-100i64..9000),
            ) {
                let admit = critical();
                let mut failures = vec![mem(mem_short * MI)];
                if let Some(c) = cpu_short {
                    failures.push(cpu(c));
                }
                let d = handle_admission_failure(&admit, &running, &failures);
                let covers = |set: &mut dyn Iterator<Item = &PodInfo>| {
                    let (m, c) = set.fold((0i64, 0i64), |(m, c), p| {
                        (m + p.request_units(MEMORY), c + p.request_units(CPU))
                    });
                    m >= mem_short * MI && cpu_short.is_none_or(|s| c >= s)
                };
                if d.admit {
                    prop_assert!(d.error.is_none());
                    prop_assert!(covers(&mut d.preempt.iter().map(|&i| &running[i])));
                    let tiers: Vec<u8> = d.preempt.iter().map(|&i| match running[i].qos {
                        QosClass::BestEffort => 0,
                        QosClass::Burstable => 1,
                        QosClass::Guaranteed => 2,
                    }).collect();
                    prop_assert!(tiers.windows(2).all(|w| w[0] <= w[1]), "{tiers:?}");
                    for &i in &d.preempt {
                        prop_assert!(preemptable(&admit, &running[i]));
                    }
                    let mut seen = d.preempt.clone();
                    seen.sort_unstable();
                    seen.dedup();
                    prop_assert_eq!(seen.len(), d.preempt.len());
                } else {
                    prop_assert!(d.preempt.is_empty());
                    prop_assert!(d.error.is_some());
                    prop_assert!(!covers(&mut running.iter().filter(|p| preemptable(&admit, p))));
                }
            }
        }
    }
}
