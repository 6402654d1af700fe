//! Per-pod statistics for eviction ranking, read from the pod cgroups into the Summary API
//! shape that [`crate::decide::rank`] consumes.
//!
//! The caller names the pods (uid, QoS tier or explicit cgroup, container names), so this
//! layer does not depend on a pod manager. Each pod gets what the kubelet's summary gives it:
//! the pod cgroup's working set, each container's working set, the processes in the pod's
//! cgroup tree, and, where a directory holds a container's writable data, its disk use. A
//! pod whose cgroup is gone gets no entry (the kubelet ranks such a pod as "no statistics").
//! The output is filled in place so steady-state observations reuse its allocations.
//!
//! A ranking reads only what its signal ranks by ([`PodReads::ranking`]): memory goes by
//! the pod cgroups' working sets alone, pids by process counts, disk by the containers'
//! writable data. Every file costs tens of microseconds and the loop reads them for every
//! pod between the kernel's event and the victim's SIGKILL, so on a node with fifty pods the
//! reads nobody ranks by were most of the reaction; the victim's own details (the eviction
//! message's per-container usage) are read for that one pod afterwards
//! ([`PodReads::message`]).

use std::path::PathBuf;

use crate::decide::qos::QosClass;
use crate::decide::signal::Resource;
use crate::decide::summary::{
    ContainerStats, FsStats, MemoryStats, PodStats, ProcessStats, Summary,
};

use super::cgroupfs::CgroupFs;
use super::disk::dir_usage;
use super::ObserveError;

/// A pod whose statistics to read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodCgroup {
    /// The pod uid: the key ranking joins stats on.
    pub uid: String,
    /// The pod name (informational, copied into the summary).
    pub name: String,
    /// The pod namespace (informational).
    pub namespace: String,
    /// The pod cgroup's path in the hierarchy (`/kubepods/besteffort/pod<uid>`).
    pub cgroup: String,
    /// The pod's containers.
    pub containers: Vec<ContainerCgroup>,
}

impl PodCgroup {
    /// Each container cgroup's path in the hierarchy (`<pod cgroup>/<container cgroup>`).
    pub fn container_paths(&self) -> impl Iterator<Item = String> + '_ {
        self.containers
            .iter()
            .map(|c| format!("{}/{}", self.cgroup, c.cgroup))
    }
}

/// A container of a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerCgroup {
    /// The container name from the pod spec.
    pub name: String,
    /// The container cgroup's directory name under the pod cgroup (the name, for the process
    /// runtime; the runtime's container id for a CRI runtime).
    pub cgroup: String,
    /// Where the container's writable data lives (the process runtime's working directory, a
    /// writable layer's upper dir), walked for ephemeral-storage usage; `None` reports none.
    pub ephemeral_dir: Option<PathBuf>,
}

/// `<cgroupRoot>/kubepods`, the cgroupfs driver's pods cgroup.
pub fn kubepods_cgroup(cgroup_root: &str) -> String {
    format!("{}/kubepods", cgroup_root.trim_end_matches('/'))
}

/// The pod cgroup the cgroupfs driver creates for a pod of a QoS class: Guaranteed pods sit
/// directly under `kubepods`, the others under their tier.
pub(crate) fn pod_cgroup_path(cgroup_root: &str, qos: QosClass, uid: &str) -> String {
    let kubepods = kubepods_cgroup(cgroup_root);
    match qos {
        QosClass::Guaranteed => format!("{kubepods}/pod{uid}"),
        QosClass::Burstable => format!("{kubepods}/burstable/pod{uid}"),
        QosClass::BestEffort => format!("{kubepods}/besteffort/pod{uid}"),
    }
}

impl PodCgroup {
    /// A pod under `<cgroupRoot>/kubepods` by its QoS class, each container in a cgroup named
    /// after it, with no ephemeral-storage directories.
    pub fn under_kubepods(
        cgroup_root: &str,
        uid: &str,
        qos: QosClass,
        containers: &[&str],
    ) -> PodCgroup {
        PodCgroup {
            uid: uid.to_string(),
            name: String::new(),
            namespace: String::new(),
            cgroup: pod_cgroup_path(cgroup_root, qos, uid),
            containers: containers
                .iter()
                .map(|c| ContainerCgroup {
                    name: (*c).to_string(),
                    cgroup: (*c).to_string(),
                    ephemeral_dir: None,
                })
                .collect(),
        }
    }
}

/// Which statistics to read for each pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodReads {
    /// The pod cgroup's memory (working set).
    pub pod_memory: bool,
    /// Each container's memory.
    pub container_memory: bool,
    /// The processes in the pod's cgroup tree.
    pub processes: bool,
    /// Each container's writable data on disk (a directory walk).
    pub ephemeral: bool,
}

impl PodReads {
    /// Everything the kubelet's summary gives a pod.
    pub(crate) const ALL: PodReads = PodReads {
        pod_memory: true,
        container_memory: true,
        processes: true,
        ephemeral: true,
    };

    /// What ranking for a signal of `resource` compares ([`crate::decide::rank::rank`]).
    pub(crate) fn ranking(resource: Resource) -> PodReads {
        let none = PodReads {
            pod_memory: false,
            container_memory: false,
            processes: false,
            ephemeral: false,
        };
        match resource {
            Resource::Memory => PodReads {
                pod_memory: true,
                ..none
            },
            Resource::Pids => PodReads {
                processes: true,
                ..none
            },
            // A container is listed only with some statistics of its own, and the runtime's
            // writable-layer figures are added to the containers listed: so their memory too.
            Resource::EphemeralStorage | Resource::Inodes => PodReads {
                ephemeral: true,
                container_memory: true,
                ..none
            },
        }
    }

    /// What the eviction message says of the victim for `resource` beyond what its ranking
    /// read ([`crate::decide::eviction_message::eviction_message`]): for memory each container's usage
    /// (the caller has the pod's own), for the others the ranking's figures.
    pub fn message(resource: Resource) -> PodReads {
        match resource {
            Resource::Memory => PodReads {
                pod_memory: false,
                container_memory: true,
                processes: false,
                ephemeral: false,
            },
            _ => PodReads::ranking(resource),
        }
    }
}

/// Fills `out` with one entry per pod whose cgroup exists, reusing its allocations. A pod
/// whose files cannot be read or parsed is left out and its error pushed to `errors`.
pub(crate) fn fill_summary(
    fs: &mut CgroupFs,
    pods: &[PodCgroup],
    reads: PodReads,
    walk_cap: u64,
    scratch: &mut String,
    out: &mut Summary,
    errors: &mut Vec<ObserveError>,
) {
    let mut n = 0;
    for pod in pods {
        if out.pods.len() <= n {
            out.pods.push(PodStats::default());
        }
        match fill_pod(fs, pod, reads, walk_cap, scratch, &mut out.pods[n]) {
            Ok(true) => n += 1,
            Ok(false) => {}
            Err(e) => errors.push(e),
        }
    }
    out.pods.truncate(n);
}

fn fill_pod(
    fs: &mut CgroupFs,
    pod: &PodCgroup,
    reads: PodReads,
    walk_cap: u64,
    scratch: &mut String,
    s: &mut PodStats,
) -> Result<bool, ObserveError> {
    // The first file read also tells whether the pod cgroup still exists; with no pod or
    // container memory to read, the process list does.
    let memory = if reads.pod_memory {
        let Some(memory) = fs.pod_memory(&pod.cgroup)? else {
            return Ok(false);
        };
        Some(memory)
    } else {
        None
    };
    let check_exists = !reads.pod_memory && !reads.container_memory;
    let processes = if reads.processes || check_exists {
        let Some(n) = fs.process_count(&pod.cgroup)? else {
            return Ok(false);
        };
        Some(n).filter(|_| reads.processes)
    } else {
        None
    };
    s.pod_ref.uid.clone_from(&pod.uid);
    s.pod_ref.name.clone_from(&pod.name);
    s.pod_ref.namespace.clone_from(&pod.namespace);
    s.memory = memory.map(|m| MemoryStats {
        working_set_bytes: Some(m.working_set),
    });
    s.process_stats = processes.map(|n| ProcessStats {
        process_count: Some(n),
    });
    s.volume.clear();
    let mut ephemeral: Option<FsStats> = None;
    let mut m = 0;
    let containers = if reads.container_memory || reads.ephemeral {
        &pod.containers[..]
    } else {
        &[]
    };
    for c in containers {
        let container_memory = if reads.container_memory {
            scratch.clear();
            scratch.push_str(&pod.cgroup);
            scratch.push('/');
            scratch.push_str(&c.cgroup);
            fs.pod_memory(scratch)?
        } else {
            None
        };
        let rootfs = match c.ephemeral_dir.as_ref().filter(|_| reads.ephemeral) {
            None => None,
            Some(dir) => {
                let u = dir_usage(dir, walk_cap)?;
                if u.truncated {
                    tracing::debug!(dir = %dir.display(), cap = walk_cap, "ephemeral-storage walk capped; usage is a lower bound");
                }
                let fs_stats = FsStats {
                    used_bytes: Some(u.bytes),
                    inodes_used: Some(u.inodes),
                };
                let total = ephemeral.get_or_insert(FsStats {
                    used_bytes: Some(0),
                    inodes_used: Some(0),
                });
                total.used_bytes = Some(total.used_bytes.unwrap_or(0).saturating_add(u.bytes));
                total.inodes_used = Some(total.inodes_used.unwrap_or(0).saturating_add(u.inodes));
                Some(fs_stats)
            }
        };
        // A container without a cgroup has not started (or has exited): the summary lists
        // only containers it has statistics for.
        if container_memory.is_none() && rootfs.is_none() {
            continue;
        }
        if s.containers.len() <= m {
            s.containers.push(ContainerStats::default());
        }
        let cs = &mut s.containers[m];
        cs.name.clone_from(&c.name);
        cs.memory = container_memory.map(|mu| MemoryStats {
            working_set_bytes: Some(mu.working_set),
        });
        cs.rootfs = rootfs;
        cs.logs = None;
        m += 1;
    }
    s.containers.truncate(m);
    s.ephemeral_storage = ephemeral;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::super::cgroupfs::fixtures::*;
    use super::*;
    use std::path::Path;

    fn v1_tree(root: &Path) {
        let mem = root.join("memory");
        v1_memcg(&mem, "/", 8 << 30, 0);
        v1_memcg(&mem, "/node/kubepods", 3 << 30, 1 << 30);
        v1_memcg(&mem, "/node/kubepods/besteffort/poda", 300 << 20, 100 << 20);
        v1_memcg(
            &mem,
            "/node/kubepods/besteffort/poda/app",
            250 << 20,
            90 << 20,
        );
        set(
            &mem,
            "/node/kubepods/besteffort/poda/app",
            "cgroup.procs",
            "100\n101\n",
        );
        v1_memcg(&mem, "/node/kubepods/podg", 50 << 20, 0);
    }

    #[test]
    fn a_ranking_reads_only_what_it_compares() {
        use crate::decide::signal::Resource;
        let memory = PodReads::ranking(Resource::Memory);
        assert!(memory.pod_memory && !memory.container_memory && !memory.processes);
        assert!(!memory.ephemeral);
        let pids = PodReads::ranking(Resource::Pids);
        assert!(pids.processes && !pids.pod_memory && !pids.container_memory);
        let disk = PodReads::ranking(Resource::EphemeralStorage);
        assert!(disk.ephemeral && !disk.pod_memory && !disk.processes);
        // The memory victim's message adds its containers; the pod's own figure is the
        // search's.
        let message = PodReads::message(Resource::Memory);
        assert!(message.container_memory && !message.pod_memory);
        assert_eq!(PodReads::message(Resource::Pids), pids);
    }

    #[test]
    fn pods_get_working_sets_processes_and_disk() {
        let tmp = tempfile::tempdir().unwrap();
        v1_tree(tmp.path());
        let data = tmp.path().join("data-app");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("f"), vec![7u8; 8192]).unwrap();
        let mut a =
            PodCgroup::under_kubepods("/node", "a", QosClass::BestEffort, &["app", "sidecar"]);
        a.name = "web".into();
        a.namespace = "prod".into();
        a.containers[0].ephemeral_dir = Some(data);
        let g = PodCgroup::under_kubepods("/node/", "g", QosClass::Guaranteed, &[]);
        let gone = PodCgroup::under_kubepods("/node", "x", QosClass::Burstable, &["c"]);
        let mut fs = CgroupFs::detect(tmp.path()).unwrap();
        let mut out = Summary::default();
        let mut errors = Vec::new();
        let mut scratch = String::new();
        let pods = [a, gone, g];
        fill_summary(
            &mut fs,
            &pods,
            PodReads::ALL,
            1000,
            &mut scratch,
            &mut out,
            &mut errors,
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(out.pods.len(), 2);
        let pa = &out.pods[0];
        assert_eq!(
            (pa.pod_ref.uid.as_str(), pa.pod_ref.name.as_str()),
            ("a", "web")
        );
        assert_eq!(pa.working_set_bytes(), 200 << 20);
        assert_eq!(pa.process_count(), 2);
        // The sidecar has no cgroup and no data: no entry.
        assert_eq!(pa.containers.len(), 1);
        let app = &pa.containers[0];
        assert_eq!(app.memory.unwrap().working_set_bytes, Some(160 << 20));
        let rootfs = app.rootfs.unwrap();
        assert_eq!(rootfs.inodes_used, Some(2));
        assert!(rootfs.used_bytes.unwrap() >= 8192);
        assert_eq!(pa.ephemeral_storage, Some(rootfs));
        assert_eq!(out.pods[1].pod_ref.uid, "g");
        assert_eq!(out.pods[1].working_set_bytes(), 50 << 20);

        // A second pass with fewer pods shrinks the output, and a broken pod is reported.
        set(
            &tmp.path().join("memory"),
            "/node/kubepods/podg",
            "memory.stat",
            "nonsense 1\n",
        );
        fill_summary(
            &mut fs,
            &pods[2..],
            PodReads::ALL,
            1000,
            &mut scratch,
            &mut out,
            &mut errors,
        );
        assert!(out.pods.is_empty());
        assert_eq!(errors.len(), 1, "{errors:?}");
    }

    #[test]
    fn stats_feed_the_ranking_join() {
        let tmp = tempfile::tempdir().unwrap();
        v1_tree(tmp.path());
        let mut fs = CgroupFs::detect(tmp.path()).unwrap();
        let mut out = Summary::default();
        let pods = [
            PodCgroup::under_kubepods("/node", "g", QosClass::Guaranteed, &[]),
            PodCgroup::under_kubepods("/node", "a", QosClass::BestEffort, &["app"]),
        ];
        fill_summary(
            &mut fs,
            &pods,
            PodReads::ALL,
            10,
            &mut String::new(),
            &mut out,
            &mut Vec::new(),
        );
        let index = out.index();
        assert_eq!(
            index.get("a").map(|p| p.working_set_bytes()),
            Some(200 << 20)
        );
        assert_eq!(index.get("g").map(|p| p.process_count()), Some(0));
    }
}
