//! The values the writer puts in a cgroup ([`Resources`], in the kubelet's v1 units), which
//! file gets which value on each version ([`files_for`], from `decide`'s one mapping), and the
//! memory use read back ([`MemoryUsage`]).

use crate::decide::cgroups::{files, CgroupVersion, FileValue, ResourceConfig};

/// The values the kubelet writes for one cgroup, in cgroup v1 units (its `ResourceConfig`).
/// `None` leaves the file as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// `cpu.shares` (2..=262144); v2 writes the converted `cpu.weight`.
    pub cpu_shares: Option<u64>,
    /// CFS quota in µs per period; `-1` is unlimited (`max` on v2).
    pub cpu_quota_us: Option<i64>,
    /// CFS period in µs (the kubelet's `cpuCFSQuotaPeriod`, 100000 by default).
    pub cpu_period_us: Option<u64>,
    /// Memory limit in bytes; `-1` is unlimited (`max` on v2).
    pub memory_limit_bytes: Option<i64>,
    /// Maximum number of tasks; `-1` is unlimited (`max`).
    pub pids_max: Option<i64>,
    /// v2 `memory.oom.group`: the OOM killer takes the whole cgroup (the kubelet's
    /// `singleProcessOOMKill: false`); ignored on v1, which has no such file.
    #[serde(default)]
    pub memory_oom_group: Option<bool>,
    /// v2 `memory.min` (Memory QoS); ignored on v1.
    #[serde(default)]
    pub memory_min: Option<i64>,
    /// v2 `memory.low`; ignored on v1.
    #[serde(default)]
    pub memory_low: Option<i64>,
    /// v2 `memory.high` (Memory QoS); ignored on v1.
    #[serde(default)]
    pub memory_high: Option<i64>,
    /// v2 `memory.swap.max` (0: no swap); ignored on v1. A kernel without swap accounting
    /// has no such file, and the writer then leaves it out, as the kubelet does.
    #[serde(default)]
    pub memory_swap_max: Option<i64>,
}

/// A cgroup's memory use, as the eviction signals need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryUsage {
    /// v1 `memory.usage_in_bytes`, v2 `memory.current`.
    pub usage_bytes: u64,
    /// v1 `total_inactive_file`, v2 `inactive_file` from `memory.stat`.
    pub inactive_file_bytes: u64,
    /// `usage - inactive_file` (never below zero): the kubelet's working set.
    pub working_set_bytes: u64,
}

impl MemoryUsage {
    pub(super) fn new(usage_bytes: u64, inactive_file_bytes: u64) -> MemoryUsage {
        MemoryUsage {
            usage_bytes,
            inactive_file_bytes,
            working_set_bytes: usage_bytes.saturating_sub(inactive_file_bytes),
        }
    }
}

impl Resources {
    /// The cpu and memory part as `decide`'s [`ResourceConfig`], whose
    /// [`files`](crate::decide::cgroups::files()) says which file gets which value on each
    /// cgroup version: the writer and `reactor plan cgroups` share one mapping.
    pub fn config(&self) -> ResourceConfig {
        ResourceConfig {
            cpu_shares: self.cpu_shares,
            cpu_quota: self.cpu_quota_us,
            cpu_period: self.cpu_period_us,
            memory: self.memory_limit_bytes,
            memory_oom_group: self.memory_oom_group,
            memory_min: self.memory_min,
            memory_low: self.memory_low,
            memory_high: self.memory_high,
            memory_swap_max: self.memory_swap_max,
        }
    }
}

impl From<&ResourceConfig> for Resources {
    /// `decide`'s values for a cgroup; zero there means "not set" and stays unset here.
    fn from(c: &ResourceConfig) -> Resources {
        Resources {
            cpu_shares: c.cpu_shares.filter(|v| *v != 0),
            cpu_quota_us: c.cpu_quota.filter(|v| *v != 0),
            cpu_period_us: c.cpu_period.filter(|v| *v != 0),
            memory_limit_bytes: c.memory.filter(|v| *v != 0),
            pids_max: None,
            memory_oom_group: c.memory_oom_group,
            // Zero is a value here (`memory.swap.max` 0 is NoSwap; a tier's `memory.min` 0
            // clears an old protection), so these pass through as decided.
            memory_min: c.memory_min,
            memory_low: c.memory_low,
            memory_high: c.memory_high,
            memory_swap_max: c.memory_swap_max,
        }
    }
}

/// The cgroup files and values to write for `r` on `version`, in write order (a CFS period
/// before its quota), from `decide`'s mapping plus `pids.max`.
pub(crate) fn files_for(r: &Resources, version: CgroupVersion) -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, String)> = files(&r.config(), version)
        .into_iter()
        .map(|(name, value)| {
            let text = match value {
                FileValue::Int(i) => i.to_string(),
                FileValue::Text(t) => t,
            };
            (name, text)
        })
        .collect();
    if let Some(pids) = r.pids_max {
        out.push((
            "pids.max",
            if pids < 0 {
                "max".into()
            } else {
                pids.to_string()
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decide_values_map_to_files() {
        let r = Resources::from(&ResourceConfig {
            cpu_shares: Some(1024),
            cpu_quota: Some(0),
            cpu_period: Some(100_000),
            memory: Some(-1),
            memory_oom_group: None,
            ..Default::default()
        });
        assert_eq!(r.cpu_quota_us, None);
        assert_eq!(
            files_for(&r, CgroupVersion::V2),
            [
                ("cpu.weight", "39".to_string()),
                ("cpu.max", "max 100000".into()),
                ("memory.max", "max".into())
            ]
        );
        let v1 = files_for(
            &Resources {
                pids_max: Some(10),
                ..r
            },
            CgroupVersion::V1,
        );
        assert_eq!(v1.first().map(|f| f.0), Some("cpu.shares"));
        assert_eq!(v1.last(), Some(&("pids.max", "10".to_string())));
    }
}
