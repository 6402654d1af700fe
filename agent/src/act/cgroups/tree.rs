//! The kubelet's pod cgroup tree on top of the writer: `kubepods`, its two QoS tiers, and
//! pod cgroups, written in the kubelet's order.
//!
//! Order, as the kubelet does it: when a pod is admitted the QoS tiers are updated first
//! (with `qosReserved`, the tiers below the new pod's class lose the memory it reserves)
//! and the pod cgroup is created after; when a pod goes, its cgroup is removed first and the
//! tiers are updated after (they get the memory back).
//!
//! Lowering a tier's memory limit below what the tier already uses fails on cgroup v1
//! (`EBUSY`). The kubelet then sets that tier's limit to its current usage instead, which
//! stops it growing and lets reclaim and eviction do the rest; [`CgroupManager::update_qos_tiers`]
//! does the same and reports each tier it had to clamp, so the caller can log it.

use std::time::Duration;

use super::{CgroupError, CgroupManager, CgroupPath, Resources};

/// `kubepods/burstable`.
pub(crate) const BURSTABLE: &str = "burstable";
/// `kubepods/besteffort`.
pub(crate) const BESTEFFORT: &str = "besteffort";

/// A QoS tier whose memory limit was set to its usage because the wanted limit was below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clamped {
    /// The tier's cgroup.
    pub cgroup: CgroupPath,
    /// The limit `decide` asked for, in bytes.
    pub wanted: i64,
    /// The limit written instead (the usage at the time), in bytes.
    pub set: i64,
}

impl CgroupManager {
    /// Creates `kubepods`, `kubepods/burstable` and `kubepods/besteffort` (idempotent) and
    /// writes the `kubepods` values (node allocatable).
    pub fn ensure_pod_tree(&self, kubepods: &Resources) -> Result<(), CgroupError> {
        let top = CgroupPath::kubepods();
        self.create(&top)?;
        self.apply(&top, kubepods)?;
        for name in [BURSTABLE, BESTEFFORT] {
            self.create(&CgroupPath::qos_tier(name))?;
        }
        Ok(())
    }

    /// Writes the QoS tiers' values; where a memory limit is refused because usage is above
    /// it, sets that tier's limit to its usage and tries again, as the kubelet does.
    pub fn update_qos_tiers(
        &self,
        burstable: &Resources,
        besteffort: &Resources,
    ) -> Result<Vec<Clamped>, CgroupError> {
        let mut clamped = Vec::new();
        for (name, wanted_values) in [(BURSTABLE, burstable), (BESTEFFORT, besteffort)] {
            let cgroup = CgroupPath::qos_tier(name);
            let mut values = *wanted_values;
            let mut retries = 0;
            loop {
                match self.apply(&cgroup, &values) {
                    Ok(()) => break,
                    // Usage can still creep up between reading it and writing it: a few
                    // tries, each at the usage just read, then the error goes up.
                    Err(CgroupError::LimitBelowUsage { usage, .. }) if retries < 3 => {
                        retries += 1;
                        let set = i64::try_from(usage).unwrap_or(i64::MAX);
                        values.memory_limit_bytes = Some(set);
                        clamped.retain(|c: &Clamped| c.cgroup != cgroup);
                        clamped.push(Clamped {
                            cgroup: cgroup.clone(),
                            wanted: wanted_values.memory_limit_bytes.unwrap_or(-1),
                            set,
                        });
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(clamped)
    }

    /// Creates a pod's cgroup and writes its values (call after [`update_qos_tiers`]).
    ///
    /// [`update_qos_tiers`]: CgroupManager::update_qos_tiers
    pub fn create_pod_cgroup(
        &self,
        pod: &CgroupPath,
        values: &Resources,
    ) -> Result<(), CgroupError> {
        self.create(pod)?;
        self.apply(pod, values)
    }

    /// Removes a pod's cgroup and its container cgroups once their processes are gone
    /// (call before updating the tiers). Kills nothing.
    pub fn remove_pod_cgroup(&self, pod: &CgroupPath, wait: Duration) -> Result<(), CgroupError> {
        self.remove(pod, wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn set(tmp: &Path, cgroup: &str, file: &str, value: &str) {
        let dir = tmp.join("memory/agent").join(cgroup);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(file), value).unwrap();
    }

    #[test]
    fn tiers_are_written_and_unchanged_when_accepted() {
        let tmp = tempfile::tempdir().unwrap();
        for c in ["cpu", "cpuacct", "cpuset", "memory"] {
            std::fs::create_dir_all(tmp.path().join(c).join("agent")).unwrap();
        }
        for t in ["kubepods/burstable", "kubepods/besteffort"] {
            set(tmp.path(), t, "memory.limit_in_bytes", "0");
        }
        let m = CgroupManager::v1(tmp.path(), &CgroupPath::parse("agent").unwrap()).unwrap();
        let limit = |b| Resources {
            memory_limit_bytes: Some(b),
            ..Default::default()
        };
        let clamped = m
            .update_qos_tiers(&limit(7 << 30), &limit(5 << 30))
            .unwrap();
        assert!(clamped.is_empty());
        assert_eq!(
            m.read_file(&CgroupPath::qos_tier(BESTEFFORT), "memory.limit_in_bytes")
                .unwrap(),
            "5368709120"
        );
    }
}
