//! The device bookkeeping and the allocation rules, as pure data and functions: no I/O, no
//! clock, no locks. The manager holds a [`Book`] behind its lock and calls these between its
//! RPCs to the plugins.
//!
//! Rules (the kubelet's, as seed 002 walks through them):
//! - a container that already holds devices of a resource (a restart) gets the same ones
//!   back, and must ask for the same count;
//! - init containers run one after another, so the devices of earlier init containers are
//!   reusable by the next init container and then by the app containers; an app container
//!   takes reusable devices first, and what it takes is no longer reusable by the next one;
//! - otherwise devices come from healthy minus allocated;
//! - devices of pods that are no longer active are freed before a new allocation.
//!
//! Reusable devices beyond what the app containers take stay held by the pod until it ends,
//! as in the kubelet. We keep that on purpose: the scheduler counts a pod's device request as
//! max(largest init request, sum of app requests), so freeing them would let this node admit
//! pods the scheduler never meant for it; and init containers run again when the pod sandbox
//! is recreated, and must then find their devices still theirs.

use std::collections::{BTreeMap, BTreeSet};

use super::types::{
    ContainerAllocation, DeviceSet, Insufficient, PluginResponse, PodRequest, ResourceCapacity,
};

/// NUMA node key for devices the plugin reported without topology (the kubelet's `-1`).
pub(crate) const NO_TOPOLOGY: i64 = -1;

/// One container's devices of one resource and the plugin's answer for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Assignment {
    /// NUMA node → device IDs, as the checkpoint stores them.
    pub by_numa: BTreeMap<i64, Vec<String>>,
    /// What the plugin answered to `Allocate`.
    pub response: PluginResponse,
}

impl Assignment {
    /// All device IDs of this assignment.
    pub fn devices(&self) -> DeviceSet {
        self.by_numa.values().flatten().cloned().collect()
    }
}

/// pod UID → container → resource → assignment.
pub(crate) type PodDevices = BTreeMap<String, BTreeMap<String, BTreeMap<String, Assignment>>>;

/// Everything the device manager knows, minus the plugin connections.
#[derive(Debug, Clone, Default)]
pub(crate) struct Book {
    /// Resource → healthy device IDs (the last `ListAndWatch` answer).
    pub healthy: BTreeMap<String, DeviceSet>,
    /// Resource → unhealthy device IDs.
    pub unhealthy: BTreeMap<String, DeviceSet>,
    /// Resource → device → NUMA nodes it reported.
    pub topology: BTreeMap<String, BTreeMap<String, Vec<i64>>>,
    /// Assignments of admitted pods.
    pub pods: PodDevices,
    /// Devices taken for an `Allocate` call in flight, not yet in `pods`.
    pub reserved: BTreeMap<String, DeviceSet>,
}

/// What a container still needs of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Need {
    /// It already holds the right devices (a restart): nothing to do.
    Held,
    /// It needs devices: `reused` from earlier init containers, plus `more` new ones chosen
    /// from `available`.
    Devices {
        /// Devices handed on from init containers.
        reused: DeviceSet,
        /// How many new devices to take.
        more: usize,
        /// Healthy devices nobody holds now.
        available: DeviceSet,
    },
}

/// Why a container's devices cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// No plugin ever registered this resource.
    #[error("can't allocate unregistered device {0}")]
    Unregistered(String),
    /// The container's request changed since its devices were assigned.
    #[error("pod {pod:?} container {container:?} changed request for resource {resource:?} from {held} to {requested}")]
    ChangedRequest {
        /// Pod UID.
        pod: String,
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// Devices it holds.
        held: usize,
        /// Devices it asks for now.
        requested: u64,
    },
    /// Not enough devices.
    #[error(transparent)]
    Insufficient(#[from] Insufficient),
}

impl Book {
    /// Devices held by pods (all, or only those in `active`) plus in-flight reservations.
    pub(crate) fn allocated(&self, resource: &str, active: Option<&BTreeSet<String>>) -> DeviceSet {
        let mut out: DeviceSet = self.reserved.get(resource).cloned().unwrap_or_default();
        for (uid, containers) in &self.pods {
            if active.is_some_and(|a| !a.contains(uid)) {
                continue;
            }
            for resources in containers.values() {
                if let Some(a) = resources.get(resource) {
                    out.extend(a.devices());
                }
            }
        }
        out
    }

    /// Healthy devices nobody holds.
    pub fn available(&self, resource: &str, active: Option<&BTreeSet<String>>) -> DeviceSet {
        let allocated = self.allocated(resource, active);
        self.healthy
            .get(resource)
            .map(|h| h.difference(&allocated).cloned().collect())
            .unwrap_or_default()
    }

    /// Counts for one resource.
    pub(crate) fn counts(&self, resource: &str) -> ResourceCapacity {
        let healthy = self.healthy.get(resource).map_or(0, |s| s.len()) as u64;
        let unhealthy = self.unhealthy.get(resource).map_or(0, |s| s.len()) as u64;
        ResourceCapacity {
            capacity: healthy + unhealthy,
            allocatable: healthy,
            allocated: self.allocated(resource, None).len() as u64,
            free: self.available(resource, None).len() as u64,
        }
    }

    /// Replaces a resource's device sets with a plugin's latest list (`ListAndWatch`).
    pub fn update_devices(&mut self, resource: &str, devices: &[(String, bool, Vec<i64>)]) {
        let healthy = self.healthy.entry(resource.to_string()).or_default();
        healthy.clear();
        let unhealthy = self.unhealthy.entry(resource.to_string()).or_default();
        unhealthy.clear();
        let topology = self.topology.entry(resource.to_string()).or_default();
        topology.clear();
        for (id, is_healthy, numa) in devices {
            if *is_healthy {
                healthy.insert(id.clone());
            } else {
                unhealthy.insert(id.clone());
            }
            topology.insert(id.clone(), numa.clone());
        }
    }

    /// Marks every device of a resource unhealthy (its plugin went away).
    pub(crate) fn mark_unhealthy(&mut self, resource: &str) {
        let healthy = std::mem::take(self.healthy.entry(resource.to_string()).or_default());
        self.unhealthy
            .entry(resource.to_string())
            .or_default()
            .extend(healthy);
    }

    /// Forgets a resource whose plugin stayed away past the grace period. Assignments of
    /// running pods stay, so they keep their devices if the plugin comes back.
    pub(crate) fn drop_resource(&mut self, resource: &str) {
        self.healthy.remove(resource);
        self.unhealthy.remove(resource);
        self.topology.remove(resource);
    }

    /// Frees the devices of pods not in `active`; returns whether anything was freed.
    pub(crate) fn remove_inactive(&mut self, active: &BTreeSet<String>) -> bool {
        let before = self.pods.len();
        self.pods.retain(|uid, _| active.contains(uid));
        before != self.pods.len()
    }

    /// The devices a container holds of a resource, if any.
    pub(crate) fn container_devices(
        &self,
        pod: &str,
        container: &str,
        resource: &str,
    ) -> Option<DeviceSet> {
        self.pods
            .get(pod)?
            .get(container)?
            .get(resource)
            .map(Assignment::devices)
    }

    /// Decides what a container needs of one resource (the kubelet's `devicesToAllocate`,
    /// minus the choice among available devices, which may ask the plugin first).
    pub fn plan(
        &self,
        pod: &str,
        container: &str,
        resource: &str,
        required: u64,
        reusable: Option<&DeviceSet>,
    ) -> Result<Need, PlanError> {
        if let Some(held) = self.container_devices(pod, container, resource) {
            if held.len() as u64 != required {
                return Err(PlanError::ChangedRequest {
                    pod: pod.to_string(),
                    container: container.to_string(),
                    resource: resource.to_string(),
                    held: held.len(),
                    requested: required,
                });
            }
            return Ok(Need::Held);
        }
        if required == 0 {
            return Ok(Need::Held);
        }
        if !self.healthy.contains_key(resource) {
            return Err(PlanError::Unregistered(resource.to_string()));
        }
        let reused: DeviceSet = reusable
            .into_iter()
            .flatten()
            .take(required as usize)
            .cloned()
            .collect();
        let more = required as usize - reused.len();
        let available = self.available(resource, None);
        if available.len() < more {
            return Err(Insufficient {
                resource: resource.to_string(),
                requested: more as u64,
                available: available.len() as u64,
            }
            .into());
        }
        Ok(Need::Devices {
            reused,
            more,
            available,
        })
    }

    /// Takes devices out of the free pool while an `Allocate` call is in flight.
    pub(crate) fn reserve(&mut self, resource: &str, devices: &DeviceSet) {
        self.reserved
            .entry(resource.to_string())
            .or_default()
            .extend(devices.iter().cloned());
    }

    /// Returns reserved devices (the call ended, one way or the other).
    pub(crate) fn unreserve(&mut self, resource: &str, devices: &DeviceSet) {
        if let Some(r) = self.reserved.get_mut(resource) {
            for d in devices {
                r.remove(d);
            }
            if r.is_empty() {
                self.reserved.remove(resource);
            }
        }
    }

    /// Records a container's devices and the plugin's answer, grouped by NUMA node.
    pub(crate) fn insert(
        &mut self,
        pod: &str,
        container: &str,
        resource: &str,
        devices: &DeviceSet,
        response: PluginResponse,
    ) {
        let mut by_numa: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        let topo = self.topology.get(resource);
        for d in devices {
            match topo.and_then(|t| t.get(d)).filter(|n| !n.is_empty()) {
                Some(nodes) => {
                    for n in nodes {
                        by_numa.entry(*n).or_default().push(d.clone());
                    }
                }
                None => by_numa.entry(NO_TOPOLOGY).or_default().push(d.clone()),
            }
        }
        self.pods
            .entry(pod.to_string())
            .or_default()
            .entry(container.to_string())
            .or_default()
            .insert(resource.to_string(), Assignment { by_numa, response });
    }

    /// Removes one container's assignment of one resource (rolling back a failed admission).
    pub(crate) fn remove(&mut self, pod: &str, container: &str, resource: &str) {
        if let Some(containers) = self.pods.get_mut(pod) {
            if let Some(resources) = containers.get_mut(container) {
                resources.remove(resource);
                if resources.is_empty() {
                    containers.remove(container);
                }
            }
            if containers.is_empty() {
                self.pods.remove(pod);
            }
        }
    }

    /// Adds a container's devices to the reusable pool (after an init container).
    pub(crate) fn add_reusable(
        &self,
        pod: &str,
        container: &str,
        reusable: &mut BTreeMap<String, DeviceSet>,
    ) {
        if let Some(resources) = self.pods.get(pod).and_then(|c| c.get(container)) {
            for (resource, a) in resources {
                reusable
                    .entry(resource.clone())
                    .or_default()
                    .extend(a.devices());
            }
        }
    }

    /// Takes a container's devices out of the reusable pool (after an app container or a
    /// sidecar, which keep theirs).
    pub(crate) fn remove_reusable(
        &self,
        pod: &str,
        container: &str,
        reusable: &mut BTreeMap<String, DeviceSet>,
    ) {
        if let Some(resources) = self.pods.get(pod).and_then(|c| c.get(container)) {
            for (resource, a) in resources {
                if let Some(pool) = reusable.get_mut(resource) {
                    for d in a.devices() {
                        pool.remove(&d);
                    }
                }
            }
        }
    }

    /// The runtime options of one container: its devices and the plugins' answers merged.
    pub fn container_allocation(&self, pod: &str, container: &str) -> Option<ContainerAllocation> {
        let resources = self.pods.get(pod)?.get(container)?;
        let mut out = ContainerAllocation::default();
        for (resource, a) in resources {
            out.merge(resource, &a.devices(), &a.response);
        }
        Some(out)
    }

    /// Whether the pod's device requests fit, with the devices of pods outside `active` counted
    /// as free: the same walk as the allocation, in counts (init containers hand their devices
    /// on; what a container already holds is kept).
    pub(crate) fn check_admit(
        &self,
        pod: &PodRequest,
        active: &BTreeSet<String>,
    ) -> Result<(), Insufficient> {
        let mut active = active.clone();
        active.insert(pod.uid.clone());
        let resources: BTreeSet<&String> = pod
            .init_containers
            .iter()
            .chain(&pod.containers)
            .flat_map(|c| c.devices.iter().filter(|(_, n)| **n > 0).map(|(r, _)| r))
            .collect();
        for resource in resources {
            let mut reusable: u64 = 0;
            let mut new: u64 = 0;
            let mut walk = |c: &super::types::ContainerRequest, init: bool| {
                let required = c.devices.get(resource).copied().unwrap_or(0);
                let held = self
                    .container_devices(&pod.uid, &c.name, resource)
                    .map(|d| d.len() as u64);
                let (from_pool, fresh) = match held {
                    Some(h) => (h.min(reusable), 0),
                    None => {
                        let from_pool = required.min(reusable);
                        (from_pool, required - from_pool)
                    }
                };
                new += fresh;
                if init && !c.restartable {
                    reusable += fresh;
                } else {
                    reusable -= from_pool;
                }
            };
            for c in &pod.init_containers {
                walk(c, true);
            }
            for c in &pod.containers {
                walk(c, false);
            }
            let available = self.available(resource, Some(&active)).len() as u64;
            if new > available {
                return Err(Insufficient {
                    resource: resource.clone(),
                    requested: new,
                    available,
                });
            }
        }
        Ok(())
    }
}

/// Picks `more` devices from `available`: the plugin's preferred ones first (those still
/// available), then the rest in ID order.
pub(crate) fn choose(available: &DeviceSet, more: usize, preferred: &[String]) -> DeviceSet {
    let mut out = DeviceSet::new();
    for d in preferred {
        if out.len() == more {
            break;
        }
        if available.contains(d) {
            out.insert(d.clone());
        }
    }
    for d in available {
        if out.len() == more {
            break;
        }
        out.insert(d.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::types::ContainerRequest;

    fn set(ids: &[&str]) -> DeviceSet {
        ids.iter().map(|s| s.to_string()).collect()
    }

    fn book_with(resource: &str, healthy: &[&str]) -> Book {
        let mut b = Book::default();
        let devs: Vec<(String, bool, Vec<i64>)> = healthy
            .iter()
            .map(|d| (d.to_string(), true, vec![]))
            .collect();
        b.update_devices(resource, &devs);
        b
    }

    fn container(name: &str, resource: &str, n: u64) -> ContainerRequest {
        ContainerRequest {
            name: name.into(),
            devices: [(resource.to_string(), n)].into(),
            restartable: false,
        }
    }

    /// Runs the allocation walk the manager runs, without plugins: new devices in ID order.
    fn allocate(book: &mut Book, pod: &PodRequest) -> Result<(), PlanError> {
        let mut reusable = BTreeMap::new();
        let step = |book: &mut Book,
                    c: &ContainerRequest,
                    reusable: &BTreeMap<String, DeviceSet>|
         -> Result<(), PlanError> {
            for (r, n) in &c.devices {
                match book.plan(&pod.uid, &c.name, r, *n, reusable.get(r))? {
                    Need::Held => {}
                    Need::Devices {
                        reused,
                        more,
                        available,
                    } => {
                        let mut all = choose(&available, more, &[]);
                        all.extend(reused);
                        book.insert(&pod.uid, &c.name, r, &all, PluginResponse::default());
                    }
                }
            }
            Ok(())
        };
        for c in &pod.init_containers {
            step(book, c, &reusable)?;
            if c.restartable {
                book.remove_reusable(&pod.uid, &c.name, &mut reusable);
            } else {
                book.add_reusable(&pod.uid, &c.name, &mut reusable);
            }
        }
        for c in &pod.containers {
            step(book, c, &reusable)?;
            book.remove_reusable(&pod.uid, &c.name, &mut reusable);
        }
        Ok(())
    }

    const R: &str = "vendor.example/dev";

    #[test]
    fn distinct_devices_for_two_pods_and_refusal_when_short() {
        let mut b = book_with(R, &["d0", "d1", "d2", "d3"]);
        let p1 = PodRequest {
            uid: "p1".into(),
            init_containers: vec![],
            containers: vec![container("a", R, 2)],
        };
        let p2 = PodRequest {
            uid: "p2".into(),
            ..p1.clone()
        };
        allocate(&mut b, &p1).unwrap();
        allocate(&mut b, &p2).unwrap();
        let a1 = b.container_devices("p1", "a", R).unwrap();
        let a2 = b.container_devices("p2", "a", R).unwrap();
        assert_eq!(a1, set(&["d0", "d1"]));
        assert_eq!(a2, set(&["d2", "d3"]));
        let p3 = PodRequest {
            uid: "p3".into(),
            init_containers: vec![],
            containers: vec![container("a", R, 1)],
        };
        let all: BTreeSet<String> = ["p1", "p2"].iter().map(|s| s.to_string()).collect();
        let err = b.check_admit(&p3, &all).unwrap_err();
        assert_eq!(err.requested, 1);
        assert_eq!(err.available, 0);
        assert!(matches!(
            allocate(&mut b, &p3),
            Err(PlanError::Insufficient(_))
        ));
        // p1 ended: its devices count as free for admission, and are freed before allocation.
        let only_p2: BTreeSet<String> = ["p2".to_string()].into();
        b.check_admit(&p3, &only_p2).unwrap();
        assert!(b.remove_inactive(&only_p2.iter().cloned().chain(["p3".into()]).collect()));
        allocate(&mut b, &p3).unwrap();
        assert_eq!(b.container_devices("p3", "a", R).unwrap(), set(&["d0"]));
    }

    #[test]
    fn init_devices_are_reused_by_the_next_init_and_the_app() {
        let mut b = book_with(R, &["d0", "d1", "d2", "d3"]);
        let pod = PodRequest {
            uid: "p".into(),
            init_containers: vec![container("i1", R, 1), container("i2", R, 2)],
            containers: vec![container("app", R, 2)],
        };
        b.check_admit(&pod, &BTreeSet::new()).unwrap();
        allocate(&mut b, &pod).unwrap();
        assert_eq!(b.container_devices("p", "i1", R).unwrap(), set(&["d0"]));
        assert_eq!(
            b.container_devices("p", "i2", R).unwrap(),
            set(&["d0", "d1"])
        );
        assert_eq!(
            b.container_devices("p", "app", R).unwrap(),
            set(&["d0", "d1"])
        );
        assert_eq!(b.counts(R).allocated, 2);
        assert_eq!(b.counts(R).free, 2);
    }

    #[test]
    fn app_containers_do_not_share_reused_devices() {
        let mut b = book_with(R, &["d0", "d1", "d2", "d3"]);
        let pod = PodRequest {
            uid: "p".into(),
            init_containers: vec![container("init", R, 2)],
            containers: vec![container("a", R, 1), container("b", R, 2)],
        };
        b.check_admit(&pod, &BTreeSet::new()).unwrap();
        allocate(&mut b, &pod).unwrap();
        let a = b.container_devices("p", "a", R).unwrap();
        let bb = b.container_devices("p", "b", R).unwrap();
        assert!(a.is_disjoint(&bb), "{a:?} {bb:?}");
        assert_eq!(b.counts(R).allocated, 3);
    }

    #[test]
    fn surplus_init_devices_stay_held_until_the_pod_ends() {
        let mut b = book_with(R, &["d0", "d1", "d2", "d3"]);
        let pod = PodRequest {
            uid: "p".into(),
            init_containers: vec![container("init", R, 3)],
            containers: vec![container("app", R, 1)],
        };
        allocate(&mut b, &pod).unwrap();
        assert_eq!(b.container_devices("p", "app", R).unwrap(), set(&["d0"]));
        assert_eq!(b.counts(R).allocated, 3);
        let other = PodRequest {
            uid: "q".into(),
            init_containers: vec![],
            containers: vec![container("a", R, 2)],
        };
        let active: BTreeSet<String> = ["p".to_string()].into();
        assert_eq!(b.check_admit(&other, &active).unwrap_err().available, 1);
        b.check_admit(&other, &BTreeSet::new()).unwrap();
    }

    #[test]
    fn sidecar_devices_are_not_handed_on() {
        let mut b = book_with(R, &["d0", "d1", "d2", "d3"]);
        let mut sidecar = container("side", R, 1);
        sidecar.restartable = true;
        let pod = PodRequest {
            uid: "p".into(),
            init_containers: vec![sidecar],
            containers: vec![container("app", R, 1)],
        };
        b.check_admit(&pod, &BTreeSet::new()).unwrap();
        allocate(&mut b, &pod).unwrap();
        assert_eq!(b.container_devices("p", "side", R).unwrap(), set(&["d0"]));
        assert_eq!(b.container_devices("p", "app", R).unwrap(), set(&["d1"]));
    }

    #[test]
    fn a_restarted_container_keeps_its_devices() {
        let mut b = book_with(R, &["d0", "d1", "d2"]);
        let pod = PodRequest {
            uid: "p".into(),
            init_containers: vec![],
            containers: vec![container("a", R, 2)],
        };
        allocate(&mut b, &pod).unwrap();
        assert_eq!(b.plan("p", "a", R, 2, None).unwrap(), Need::Held);
        b.check_admit(&pod, &BTreeSet::new()).unwrap();
        assert!(matches!(
            b.plan("p", "a", R, 3, None),
            Err(PlanError::ChangedRequest { held: 2, .. })
        ));
    }

    #[test]
    fn unhealthy_and_reserved_devices_are_not_available() {
        let mut b = Book::default();
        b.update_devices(
            R,
            &[
                ("d0".into(), true, vec![0]),
                ("d1".into(), false, vec![0]),
                ("d2".into(), true, vec![]),
            ],
        );
        assert_eq!(b.counts(R).capacity, 3);
        assert_eq!(b.counts(R).allocatable, 2);
        b.reserve(R, &set(&["d0"]));
        assert_eq!(b.available(R, None), set(&["d2"]));
        b.unreserve(R, &set(&["d0"]));
        assert_eq!(b.available(R, None), set(&["d0", "d2"]));
        b.insert("p", "c", R, &set(&["d0", "d2"]), PluginResponse::default());
        let a = &b.pods["p"]["c"][R];
        assert_eq!(a.by_numa[&0], vec!["d0".to_string()]);
        assert_eq!(a.by_numa[&NO_TOPOLOGY], vec!["d2".to_string()]);
        b.mark_unhealthy(R);
        assert_eq!(b.counts(R).allocatable, 0);
        assert_eq!(b.counts(R).capacity, 3);
    }

    #[test]
    fn unregistered_resources_are_refused() {
        let b = Book::default();
        assert_eq!(
            b.plan("p", "c", R, 1, None),
            Err(PlanError::Unregistered(R.into()))
        );
        let pod = PodRequest {
            uid: "p".into(),
            init_containers: vec![],
            containers: vec![container("c", R, 1)],
        };
        assert_eq!(
            b.check_admit(&pod, &BTreeSet::new()).unwrap_err().available,
            0
        );
    }

    #[test]
    fn choose_prefers_the_plugin_then_id_order() {
        let avail = set(&["d0", "d1", "d2", "d3"]);
        assert_eq!(
            choose(&avail, 2, &["d3".into(), "dx".into()]),
            set(&["d0", "d3"])
        );
        assert_eq!(choose(&avail, 2, &[]), set(&["d0", "d1"]));
    }
}
