//! Kernel OOM kills mapped to the pod and container they hit.
//!
//! An OOM kill the agent did not prevent is a fact to record, not a decision: the kernel
//! already chose and killed. The event names the victim's memory cgroup (eBPF captures it in
//! the kernel; memcg notifications name the watched cgroup), and the pod cgroup layout
//! `…/kubepods[/<qos>]/pod<uid>/<container>` says whose it was.

use std::collections::BTreeSet;

use super::decision::{Action, Wake};
use super::pods::{ActivePod, PodControl};
use super::Reactor;
use crate::sense::{monotonic_ns, Received};

/// The pod uid and container name a cgroup path points into, if it is below a pod cgroup.
/// `container` is `None` for the pod cgroup itself.
pub(crate) fn pod_of_cgroup(cgroup: &str) -> Option<(&str, Option<&str>)> {
    let mut parts = cgroup.split('/').filter(|p| !p.is_empty());
    // The pod cgroup is the first `pod<uid>` component after `kubepods`.
    parts.by_ref().find(|p| *p == "kubepods")?;
    let uid = loop {
        let p = parts.next()?;
        if let Some(uid) = p.strip_prefix("pod") {
            if !uid.is_empty() {
                break uid;
            }
        }
        if p != "burstable" && p != "besteffort" {
            return None;
        }
    };
    Some((uid, parts.next()))
}

impl<P: PodControl + 'static> Reactor<P> {
    /// Reads each container's OOM kill counter as the starting point.
    pub(super) fn baseline_oom_counts(&mut self) {
        for p in self.pods.pods().iter() {
            for c in &p.containers {
                let key = (p.info.uid.clone(), c.name.clone());
                if self.oom_counts.contains_key(&key) {
                    continue;
                }
                let n = p
                    .cgroup
                    .join(&c.cgroup)
                    .ok()
                    .and_then(|cg| self.cgroups.oom_kills(&cg).ok())
                    .unwrap_or(0);
                self.oom_counts.insert(key, n);
            }
        }
    }

    /// Records a kernel OOM kill: mapped to a pod and container by the event's cgroup, or,
    /// when the event names only a parent cgroup (memcg notification), by the containers
    /// whose kill counters moved. Counted as pressure the agent did not prevent.
    pub(super) fn record_oom(&mut self, r: &Received, pid: Option<u32>, comm: Option<String>) {
        let pods = self.pods.pods();
        // Each kill: the pod as the loop knows it, its uid (from the cgroup path when the pod
        // is not listed), and the container's name.
        let mut hits: Vec<(Option<&ActivePod>, Option<String>, Option<String>)> = Vec::new();
        let mapped = r.event.cgroup.as_deref().and_then(pod_of_cgroup);
        if let Some((uid, container)) = mapped {
            let pod = pods.iter().find(|p| p.info.uid == uid);
            // The event names the container's cgroup; records name the container.
            let named = |p: &ActivePod, dir: &str| {
                p.containers
                    .iter()
                    .find(|c| c.cgroup == dir)
                    .map_or_else(|| dir.to_string(), |c| c.name.clone())
            };
            if let (Some(p), Some(c)) = (pod, container) {
                let key = (p.info.uid.clone(), named(p, c));
                let now = p
                    .cgroup
                    .join(c)
                    .ok()
                    .and_then(|cg| self.cgroups.oom_kills(&cg).ok())
                    .unwrap_or(0);
                let known = self.oom_counts.get(&key).copied().unwrap_or(0);
                self.oom_counts.insert(key, now.max(known + 1));
            }
            let name = match (pod, container) {
                (Some(p), Some(c)) => Some(named(p, c)),
                (None, c) => c.map(str::to_string),
                (Some(_), None) => None,
            };
            hits.push((pod, Some(uid.to_string()), name));
        } else {
            let mut seen = BTreeSet::new();
            for p in pods.iter() {
                for c in &p.containers {
                    let Some(now) = p
                        .cgroup
                        .join(&c.cgroup)
                        .ok()
                        .and_then(|cg| self.cgroups.oom_kills(&cg).ok())
                    else {
                        continue;
                    };
                    let key = (p.info.uid.clone(), c.name.clone());
                    let known = self.oom_counts.get(&key).copied().unwrap_or(0);
                    if now > known && seen.insert(key.clone()) {
                        self.oom_counts.insert(key, now);
                        hits.push((Some(p), Some(p.info.uid.clone()), Some(c.name.clone())));
                    }
                }
            }
        }
        // An OOM in a cgroup no pod owns (or already counted through another source) is
        // left to the log.
        if hits.is_empty() {
            tracing::debug!(cgroup = ?r.event.cgroup, "kernel OOM kill with no new pod container kill");
            return;
        }
        for (pod, uid, container) in hits {
            self.out.unprevented_ooms += 1;
            let restarting = pod.map(|p| p.restart_policy.restarts(137));
            let wake = Wake {
                event: Some(r.event.clone()),
                timer: false,
                detection_lag_ns: Some(r.lag_ns),
                coalesced: 1,
            };
            let action = Action::OomKilled {
                uid,
                pod: pod.map(|p| p.info.name.clone()),
                container,
                pid,
                comm: comm.clone(),
                restarting,
                reason: "OOMKilled".to_string(),
            };
            let d = self.out.record(wake, monotonic_ns(), action);
            self.emit(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_pod_and_container() {
        assert_eq!(
            pod_of_cgroup("/node/kubepods/besteffort/podabc/hog"),
            Some(("abc", Some("hog")))
        );
        assert_eq!(
            pod_of_cgroup("/kubepods/podg-1/app"),
            Some(("g-1", Some("app")))
        );
        assert_eq!(pod_of_cgroup("/kubepods/burstable/podx"), Some(("x", None)));
        assert_eq!(pod_of_cgroup("/kubepods"), None);
        assert_eq!(pod_of_cgroup("/system.slice/podman/x"), None);
        assert_eq!(pod_of_cgroup("/kubepods/other/podx/c"), None);
    }
}
