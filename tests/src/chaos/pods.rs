//! The pod documents a schedule's [`PodPlan`]s become: every container command is a real
//! program (memhog, `sleep`, `dd`, `/bin/sh`) run by the agent's runtime.

use std::path::Path;

use serde_json::{json, Value};

use super::schedule::{PodPlan, Qos, Work};

/// Where a run's pods write: page cache on the real disk, files on the run's nodefs.
pub struct Places<'a> {
    /// The memhog binary.
    pub memhog: &'a Path,
    /// A directory on the real disk for page-cache writers (removed with the run).
    pub cache_dir: &'a Path,
    /// A file whose pages are clean, reclaimable cache, for a node with no disk to write
    /// on (the v2 guest, whose own filesystems are in memory): a page-cache pod reads it
    /// instead of writing, and what it leaves charged to it is the same clean cache.
    pub cache_source: Option<&'a Path>,
    /// The run's nodefs filesystem (a small tmpfs).
    pub nodefs: &'a Path,
    /// Under containerd, the image every container runs (busybox and memhog at
    /// `/bin/memhog`): disk fillers write into their own writable layer then.
    pub image: Option<&'a str>,
}

/// MiB a pod's processes may hold at most (allocation and a margin for the processes
/// themselves): a Guaranteed pod's limit is set above it, so a container limit never
/// OOM-kills a pod (that would be the pod's own limit, not node pressure).
pub fn peak_mib(plan: &PodPlan) -> u64 {
    32 + match plan.work {
        Work::Sleeper => 0,
        Work::Hog { mib, .. } => mib,
        Work::MultiHog { procs, mib, .. } => procs * (mib + 4),
        // Page cache is reclaimable, but dirty pages count until written back.
        Work::CacheWriter { mib } => mib,
        Work::ForkStorm { procs } => procs / 4,
        Work::DiskFiller { mib } => mib,
    }
}

/// The shell words that make a process ignore SIGTERM (the ignored disposition survives
/// `exec` and is inherited by children).
fn term(plan: &PodPlan) -> &'static str {
    if plan.stubborn {
        "trap '' TERM; "
    } else {
        ""
    }
}

/// The pod document for `plan`.
pub fn document(plan: &PodPlan, at: &Places<'_>) -> Value {
    let hog = match at.image {
        Some(_) => "/bin/memhog".to_string(),
        None => at.memhog.display().to_string(),
    };
    let nodefs = match at.image {
        Some(_) => Path::new("/chaos"),
        None => at.nodefs,
    };
    let name = plan.name();
    let mut env = Vec::new();
    let command: Vec<String> = match &plan.work {
        Work::Sleeper => {
            if plan.stubborn {
                sh(format!("{}exec sleep 3600", term(plan)))
            } else {
                vec!["sleep".into(), "3600".into()]
            }
        }
        Work::Hog { mib, rate, shared } => {
            if *shared {
                env.push(json!({"name": "MEMHOG_SHARED", "value": "1"}));
            }
            if plan.stubborn {
                env.push(json!({"name": "MEMHOG_BLOCK_TERM", "value": "1"}));
            }
            vec![hog, mib.to_string(), rate.to_string(), "3600".into()]
        }
        Work::MultiHog { procs, mib, rate } => {
            let one = format!("{hog} {mib} {rate} 3600 & ");
            sh(format!("{}{}wait", term(plan), one.repeat(*procs as usize)))
        }
        Work::CacheWriter { mib } => match at.cache_source {
            Some(source) => sh(format!(
                "{}dd if={} of=/dev/null bs=1M count={mib} 2>/dev/null; exec sleep 3600",
                term(plan),
                source.display()
            )),
            None => sh(format!(
                "{}dd if=/dev/zero of={}/{name} bs=1M count={mib} 2>/dev/null; exec sleep 3600",
                term(plan),
                at.cache_dir.display()
            )),
        },
        Work::ForkStorm { procs } => sh(format!(
            "{}i=0; while [ $i -lt {procs} ]; do sleep 3600 & i=$((i+1)); done; wait",
            term(plan)
        )),
        Work::DiskFiller { mib } => sh(format!(
            "{}mkdir -p {d}/{name} && dd if=/dev/zero of={d}/{name}/fill bs=1M count={mib} \
             2>/dev/null; exec sleep 3600",
            term(plan),
            d = nodefs.display()
        )),
    };
    let resources = match plan.qos {
        Qos::BestEffort => json!({}),
        Qos::Burstable => json!({"requests": {"memory": format!("{}Mi", peak_mib(plan) / 4)}}),
        Qos::Guaranteed => {
            let m = format!("{}Mi", peak_mib(plan) + 32);
            json!({"requests": {"memory": m, "cpu": "100m"}, "limits": {"memory": m, "cpu": "100m"}})
        }
    };
    // Sleepers restart when they end (Always), the rest run once: an evicted pod of either
    // kind must stay down.
    let restart = if plan.work == Work::Sleeper {
        "Always"
    } else {
        "Never"
    };
    let mut doc = json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "chaos"},
           "spec": {"terminationGracePeriodSeconds": plan.grace,
                    "restartPolicy": restart,
                    "priority": plan.priority,
                    "containers": [{"name": "app", "command": command, "env": env,
                                    "resources": resources}]}});
    if let Some(image) = at.image {
        doc["spec"]["containers"][0]["image"] = json!(image);
    }
    doc
}

fn sh(script: String) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), script]
}
