//! The agent's config file (see `shared/spec/config.md`).
//!
//! Settings the kubelet also has use the KubeletConfiguration's key names, value formats and
//! defaults, so an operator can paste their kubelet's values. Everything is parsed and
//! validated before the agent binds a socket or attaches a program, and a bad file is refused
//! with the key path and the reason in one line. A kubelet's own config file
//! (`kind: KubeletConfiguration`) is accepted unchanged: see [`kubelet`] for what happens to
//! the fields the agent does not use.
//!
//! Keys of the agent's own (the kubelet hard-codes these): `imageGC.period` and
//! `imageGC.listRefresh` (image GC timing), `devicePluginDir` (where device plugins register,
//! not the kubelet's directory) and `devicePluginGracePeriod` (Go duration, default `5m0s`,
//! greater than zero: how long a resource whose plugin went away stays in capacity with
//! every device unhealthy before it is deleted), `orphanGracePeriod` (Go duration, default
//! `5m0s`: how long a pod found running with no spec to re-admit it from stays as an orphan
//! before it is removed; `0s` removes it at the first tick), `memoryReclaim.enabled` and
//! `memoryReclaim.timeout` (page-cache reclaim before a memory eviction, cgroup v2; off by
//! default), `killAtCrossing` (the eBPF charge program kills the staged victim at a hard
//! memory threshold's crossing; on by default), `dryRun` (observe and decide, record every
//! eviction, preemption and image deletion the agent would make, and make none; off by
//! default), next to `stateDir`, `apiSocket`,
//! `metricsAddress`, `sense`, `runtime`, `node` and `log`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::decide::duration::{format_go_duration, parse_go_duration};
use crate::decide::quantity::Quantity;

mod error;
pub(crate) mod kubelet;
pub mod memory;
pub(crate) mod psi;

pub use error::ConfigError;

/// A non-negative Go duration (`"10s"`, `"1m30s"`) that prints back in Go's form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoDuration(pub Duration);

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_go_duration(&text)
            .map(GoDuration)
            .map_err(serde::de::Error::custom)
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_go_duration(self.0))
    }
}

/// A Kubernetes quantity in the config: a string (`"1Gi"`, `"500m"`) or a plain integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConfigQuantity(pub Quantity);

impl<'de> Deserialize<'de> for ConfigQuantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Text(String),
        }
        let q = match Raw::deserialize(d)? {
            Raw::Int(n) => Quantity::from_units(n),
            Raw::Text(t) => Quantity::parse(&t).map_err(serde::de::Error::custom)?,
        };
        if q.is_negative() {
            return Err(serde::de::Error::custom(format!(
                "quantity {q} is negative"
            )));
        }
        Ok(ConfigQuantity(q))
    }
}

impl Serialize for ConfigQuantity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.to_string())
    }
}

/// The whole config file. Every key is optional; [`Config::default`] is what
/// `reactor config defaults` prints.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Config {
    /// Hard eviction thresholds by signal (`memory.available: "100Mi"`), KubeletConfiguration form.
    pub eviction_hard: BTreeMap<String, String>,
    /// Soft eviction thresholds by signal.
    pub eviction_soft: BTreeMap<String, String>,
    /// How long each soft threshold must hold before it acts.
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    /// Minimum reclaim per signal, beyond the threshold.
    pub eviction_minimum_reclaim: BTreeMap<String, String>,
    /// How long a node condition stays after its threshold was last met.
    pub eviction_pressure_transition_period: GoDuration,
    /// The longest grace period a soft eviction grants a pod, in seconds.
    pub eviction_max_pod_grace_period: i64,
    /// Whether unset hard thresholds keep the kubelet's defaults.
    pub merge_default_eviction_settings: bool,
    /// Image-filesystem usage (percent) that starts a GC round.
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: i32,
    /// Image-filesystem usage (percent) a GC round frees down to.
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: i32,
    /// An image younger than this is never garbage collected for space.
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: GoDuration,
    /// An image unused for longer than this is removed whatever the usage (0s: off).
    #[serde(rename = "imageMaximumGCAge")]
    pub image_maximum_gc_age: GoDuration,
    /// The agent's own image GC timing (the kubelet hard-codes both).
    #[serde(rename = "imageGC")]
    pub image_gc: ImageGcConfig,
    /// Resources held back for the OS.
    pub system_reserved: BTreeMap<String, ConfigQuantity>,
    /// Resources held back for node agents.
    pub kube_reserved: BTreeMap<String, ConfigQuantity>,
    /// Which cgroups get node-allocatable limits enforced (`pods`).
    pub enforce_node_allocatable: Vec<String>,
    /// Per-resource percentage of higher-QoS requests reserved from lower QoS classes.
    pub qos_reserved: BTreeMap<String, String>,
    /// The kubelet's `singleProcessOOMKill`: `true` lets the kernel's OOM killer take one
    /// process of a container, `false` sets `memory.oom.group` so it takes the whole
    /// container. Unset means the kubelet's default: `false` on cgroup v2 (whole container),
    /// `true` on v1 (which has no group kill).
    #[serde(rename = "singleProcessOOMKill")]
    pub single_process_oom_kill: Option<bool>,
    /// The kubelet's `featureGates`. `MemoryQoS: true` writes `memory.min` and `memory.high`
    /// on cgroup v2 as the kubelet does (off by default, as it is alpha in v1.34); `NodeSwap`
    /// is GA and cannot be turned off; `PSINodeCondition: true` reports KEP-5394's four PSI
    /// node conditions (off by default, alpha in v1.36); other gates change nothing here and
    /// are ignored.
    pub feature_gates: BTreeMap<String, bool>,
    /// Where a container's `memory.high` sits between its memory request and limit, in
    /// (0, 1] (the kubelet's default 0.9). Used with `MemoryQoS` only.
    pub memory_throttling_factor: f64,
    /// The kubelet's `memorySwap`: `swapBehavior` `NoSwap` (the default, also `""`) or
    /// `LimitedSwap`, which gives Burstable containers swap in proportion to their memory
    /// request on cgroup v2.
    pub memory_swap: MemorySwapConfig,
    /// Refuse to start when the node has swap (the kubelet's default `true`); a node that
    /// runs with swap sets `false`.
    pub fail_swap_on: bool,
    /// KEP-5394's threshold for `SystemMemoryContentionPressure`: `/proc/pressure/memory`
    /// `full` averages, in percent (default 0.9; 0 turns the condition off). Used with
    /// `featureGates.PSINodeCondition` only.
    pub system_memory_contention_threshold: f64,
    /// The same for `SystemDiskContentionPressure` (`/proc/pressure/io`).
    pub system_disk_contention_threshold: f64,
    /// The same for `KubepodsMemoryContentionPressure` (kubepods' `memory.pressure`, v2).
    pub kubepods_memory_contention_threshold: f64,
    /// The same for `KubepodsDiskContentionPressure` (kubepods' `io.pressure`, v2).
    pub kubepods_disk_contention_threshold: f64,
    /// The cgroup the agent builds `kubepods/…` under.
    pub cgroup_root: String,
    /// How cgroup names are formed; only `cgroupfs` is supported.
    pub cgroup_driver: String,
    /// A directory of static pod manifests; empty means none.
    pub static_pod_path: String,
    /// Whether CPU limits become CFS quotas (the kubelet's `enforceCPULimits`).
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: bool,
    /// The CFS period quotas are computed in.
    #[serde(rename = "cpuCFSQuotaPeriod")]
    pub cpu_cfs_quota_period: GoDuration,
    /// The fallback tick: how often signals are read when no kernel event arrives.
    pub housekeeping_interval: GoDuration,
    /// `SCHED_FIFO` priority for the agent's threads (1–99), 0 for normal scheduling. On a
    /// busy node the scheduler can hold a normal thread back for a few milliseconds, which is
    /// most of the time between the kernel's notification and the eviction; a real-time
    /// agent is not held back by the very pods it is about to evict. The reactor loop's own
    /// thread (`reactor-loop`, with the sense sources) runs at this priority; every other
    /// agent thread keeps normal scheduling, so API work under load neither holds the loop
    /// off a CPU nor starves the kernel's own workers the loop's cgroup reads wait on. Pods
    /// and other child processes never inherit it (`SCHED_RESET_ON_FORK`).
    /// Needs `CAP_SYS_NICE`.
    pub realtime_priority: u8,
    /// Reclaim page cache before a memory eviction (the agent's own; off by default, which
    /// is the kubelet's behaviour). cgroup v2 only.
    pub memory_reclaim: MemoryReclaimConfig,
    /// Kill at the crossing (the agent's own; on by default): while a hard memory threshold
    /// that the eBPF charge program watches is near, the loop ranks the pods ahead and stages
    /// the one it would evict first; at the crossing the program sends SIGKILL to the process
    /// charging the crossing page if it belongs to that pod, and the loop completes the
    /// eviction. `false`: every kill is the loop's, after its pass. Off while
    /// `memoryReclaim.enabled` (reclaim first is the loop's call at the crossing).
    pub kill_at_crossing: bool,
    /// Dry run (the agent's own; off by default): the agent observes and decides as always,
    /// and records every eviction, preemption and image deletion it would make (events,
    /// metrics, `reactor status`, marked as a dry run), but kills, stops and deletes
    /// nothing (an orphan past `orphanGracePeriod` is kept), and never stages a victim for
    /// the eBPF charge program. Cgroup settings for
    /// the pods it runs are still written (they destroy nothing). `reactor run --dry-run`
    /// sets it too.
    pub dry_run: bool,
    /// The node this agent models.
    pub node: NodeConfig,
    /// Which kernel sources the agent listens to.
    pub sense: SenseConfig,
    /// The container runtime.
    pub runtime: RuntimeConfig,
    /// Where checkpoints live (pods, devices, image records).
    pub state_dir: PathBuf,
    /// The agent's API socket.
    pub api_socket: PathBuf,
    /// Where device plugins register.
    pub device_plugin_dir: PathBuf,
    /// How long a device plugin's resource stays in capacity (all devices unhealthy) after
    /// its `ListAndWatch` stream ends, before it is deleted: the kubelet hard-codes 5 minutes
    /// (`endpointStopGracePeriod`); a test or a node whose plugins restart slowly sets its own.
    pub device_plugin_grace_period: GoDuration,
    /// How long a pod found running on the node with no spec to re-admit it from (its
    /// checkpoint and the runtime's copy both lost) stays listed, ranked and evictable as
    /// an orphan before the agent removes it, unless a pod with its uid or name is applied
    /// (Go duration, default `5m0s`; see `node::recover`).
    pub orphan_grace_period: GoDuration,
    /// Prometheus endpoint address; empty turns it off.
    pub metrics_address: String,
    /// Logging.
    pub log: LogConfig,
}

/// The node's size and filesystems.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NodeConfig {
    /// Memory capacity; empty reads it from the machine, a value models a smaller node.
    pub memory_capacity: String,
    /// CPU capacity; empty reads it from the machine.
    pub cpu_capacity: String,
    /// The filesystem the `nodefs` signals are read from.
    pub nodefs_path: PathBuf,
    /// The filesystem the `imagefs` signals are read from; empty asks the runtime.
    pub imagefs_path: String,
}

/// Image GC timing, which the kubelet hard-codes (5 minutes, 30 seconds) and the agent lets a
/// test or a small node shorten.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ImageGcConfig {
    /// How often a GC round runs (and images are detected when GC is off).
    pub period: GoDuration,
    /// How often the cached image list is refreshed from the runtime.
    pub list_refresh: GoDuration,
}

impl Default for ImageGcConfig {
    fn default() -> Self {
        ImageGcConfig {
            period: GoDuration(Duration::from_secs(300)),
            list_refresh: GoDuration(Duration::from_secs(30)),
        }
    }
}

/// Reclaim first, for memory too (the agent's own; the kubelet goes straight to eviction).
///
/// With `enabled`, a memory threshold met first asks the kernel to drop page cache from
/// `kubepods` through cgroup v2's `memory.reclaim`, for the shortfall plus the minimum
/// reclaim, when the active file pages can cover it; then re-observes and evicts only if the
/// threshold is still met. Reclaim never holds the loop past `timeout`. On cgroup v1 (no
/// `memory.reclaim`) it does nothing, and the agent says so once at start.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MemoryReclaimConfig {
    /// Try reclaim before a memory eviction (default `false`: kubelet-exact).
    pub enabled: bool,
    /// The longest one reclaim may take before the loop evicts anyway (Go duration,
    /// default `100ms`, greater than zero, at most `10s`).
    pub timeout: GoDuration,
}

impl Default for MemoryReclaimConfig {
    fn default() -> Self {
        MemoryReclaimConfig {
            enabled: false,
            timeout: GoDuration(Duration::from_millis(100)),
        }
    }
}

/// Which sense sources run, and how the PSI trigger is set.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SenseConfig {
    /// eBPF programs on the oom, vmscan and memcg tracepoints.
    pub ebpf: bool,
    /// PSI triggers.
    pub psi: bool,
    /// Stall time per window that fires the PSI trigger.
    pub psi_threshold: GoDuration,
    /// The PSI trigger's window.
    pub psi_window: GoDuration,
    /// memcg threshold notification (v1 eventfd, v2 memory.events).
    pub memcg_threshold: bool,
    /// The housekeeping tick.
    pub poll: bool,
}

/// Which runtime runs the pods' containers.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// `process` or `cri`.
    pub kind: String,
    /// The CRI endpoint (`unix:///…`).
    pub endpoint: String,
    /// The pause image for CRI sandboxes; empty uses the runtime's own.
    pub sandbox_image: String,
}

/// Log output.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LogConfig {
    /// `plain` or `json`.
    pub format: String,
    /// A tracing level or filter (`info`, `reactor=debug`).
    pub level: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            eviction_hard: BTreeMap::from([
                ("memory.available".to_string(), "100Mi".to_string()),
                ("nodefs.available".to_string(), "10%".to_string()),
                ("nodefs.inodesFree".to_string(), "5%".to_string()),
                ("imagefs.available".to_string(), "15%".to_string()),
                ("imagefs.inodesFree".to_string(), "5%".to_string()),
            ]),
            eviction_soft: BTreeMap::new(),
            eviction_soft_grace_period: BTreeMap::new(),
            eviction_minimum_reclaim: BTreeMap::new(),
            eviction_pressure_transition_period: GoDuration(Duration::from_secs(300)),
            eviction_max_pod_grace_period: 0,
            merge_default_eviction_settings: false,
            image_gc_high_threshold_percent: 85,
            image_gc_low_threshold_percent: 80,
            image_minimum_gc_age: GoDuration(Duration::from_secs(120)),
            image_maximum_gc_age: GoDuration(Duration::ZERO),
            image_gc: ImageGcConfig::default(),
            system_reserved: BTreeMap::new(),
            kube_reserved: BTreeMap::new(),
            enforce_node_allocatable: vec!["pods".to_string()],
            qos_reserved: BTreeMap::new(),
            single_process_oom_kill: None,
            feature_gates: BTreeMap::new(),
            memory_throttling_factor: crate::decide::memory_qos::DEFAULT_THROTTLING_FACTOR,
            memory_swap: MemorySwapConfig::default(),
            fail_swap_on: true,
            system_memory_contention_threshold: crate::decide::psi_conditions::DEFAULT_THRESHOLD,
            system_disk_contention_threshold: crate::decide::psi_conditions::DEFAULT_THRESHOLD,
            kubepods_memory_contention_threshold: crate::decide::psi_conditions::DEFAULT_THRESHOLD,
            kubepods_disk_contention_threshold: crate::decide::psi_conditions::DEFAULT_THRESHOLD,
            cgroup_root: "/".to_string(),
            cgroup_driver: "cgroupfs".to_string(),
            static_pod_path: String::new(),
            cpu_cfs_quota: true,
            cpu_cfs_quota_period: GoDuration(Duration::from_millis(100)),
            housekeeping_interval: GoDuration(Duration::from_secs(10)),
            realtime_priority: 0,
            memory_reclaim: MemoryReclaimConfig::default(),
            kill_at_crossing: true,
            dry_run: false,
            node: NodeConfig {
                nodefs_path: PathBuf::from("/var/lib/reactor"),
                ..NodeConfig::default()
            },
            sense: SenseConfig::default(),
            runtime: RuntimeConfig::default(),
            state_dir: PathBuf::from("/var/lib/reactor"),
            api_socket: PathBuf::from("/run/reactor/reactor.sock"),
            device_plugin_dir: PathBuf::from("/var/lib/reactor/device-plugins"),
            device_plugin_grace_period: GoDuration(Duration::from_secs(300)),
            orphan_grace_period: GoDuration(Duration::from_secs(300)),
            metrics_address: "127.0.0.1:9464".to_string(),
            log: LogConfig::default(),
        }
    }
}

impl Default for SenseConfig {
    fn default() -> Self {
        SenseConfig {
            ebpf: true,
            psi: true,
            psi_threshold: GoDuration(Duration::from_millis(5)),
            psi_window: GoDuration(Duration::from_secs(2)),
            memcg_threshold: true,
            poll: true,
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            kind: "process".to_string(),
            endpoint: "unix:///run/containerd/containerd.sock".to_string(),
            sandbox_image: String::new(),
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: "plain".to_string(),
            level: "info".to_string(),
        }
    }
}

/// `memorySwap` ([`memory`] checks it).
#[derive(Clone, Debug, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MemorySwapConfig {
    /// `NoSwap` (or empty, the default) or `LimitedSwap`.
    pub swap_behavior: String,
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_reporting(path).map(|(c, _)| c)
    }

    /// Reads and validates a config file; also returns the KubeletConfiguration fields it
    /// set aside as not used by the agent, for the caller to report.
    pub fn load_reporting(path: &Path) -> Result<(Config, Vec<String>), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_yaml_reporting(&text)
    }

    /// Parses and validates a config document (YAML, or JSON, which is YAML too).
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        Config::from_yaml_reporting(text).map(|(c, _)| c)
    }

    /// [`Config::from_yaml`], also returning the KubeletConfiguration fields set aside.
    pub fn from_yaml_reporting(text: &str) -> Result<(Config, Vec<String>), ConfigError> {
        // An empty document is the all-defaults config.
        if text.trim().is_empty() {
            return Ok((Config::default(), Vec::new()));
        }
        let mut value: serde_json::Value = serde_saphyr::from_str(text)
            .map_err(|e| ConfigError::Syntax(one_line(&e.to_string())))?;
        if value.is_null() {
            return Ok((Config::default(), Vec::new()));
        }
        let own: Vec<String> = match serde_json::to_value(Config::default()) {
            Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
            _ => Vec::new(),
        };
        let ignored = kubelet::set_aside(&mut value, &own)?;
        let config: Config = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            ConfigError::invalid(
                if path == "." {
                    "<document>".into()
                } else {
                    path
                },
                one_line(&e.into_inner().to_string()),
            )
        })?;
        config.validate()?;
        Ok((config, ignored))
    }

    /// Checks value ranges and combinations that the types alone do not capture.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let high = self.image_gc_high_threshold_percent;
        let low = self.image_gc_low_threshold_percent;
        if !(0..=100).contains(&high) {
            return Err(ConfigError::invalid(
                "imageGCHighThresholdPercent",
                format!("{high} is not a percentage in 0..=100"),
            ));
        }
        if !(0..=100).contains(&low) {
            return Err(ConfigError::invalid(
                "imageGCLowThresholdPercent",
                format!("{low} is not a percentage in 0..=100"),
            ));
        }
        if low > high {
            return Err(ConfigError::invalid(
                "imageGCLowThresholdPercent",
                format!("{low} is above imageGCHighThresholdPercent {high}"),
            ));
        }
        for (key, value) in [
            ("imageGC.period", self.image_gc.period),
            ("imageGC.listRefresh", self.image_gc.list_refresh),
            ("devicePluginGracePeriod", self.device_plugin_grace_period),
        ] {
            if value.0.is_zero() {
                return Err(ConfigError::invalid(key, "must be greater than zero"));
            }
        }
        self.validate_eviction()?;
        if self.eviction_max_pod_grace_period < 0 {
            return Err(ConfigError::invalid(
                "evictionMaxPodGracePeriod",
                "must not be negative",
            ));
        }
        if self.cgroup_driver != "cgroupfs" {
            return Err(ConfigError::invalid(
                "cgroupDriver",
                format!(
                    "{:?} is not supported (only \"cgroupfs\")",
                    self.cgroup_driver
                ),
            ));
        }
        if !self.cgroup_root.starts_with('/') {
            return Err(ConfigError::invalid(
                "cgroupRoot",
                "must be an absolute cgroup path",
            ));
        }
        if self.realtime_priority > 99 {
            return Err(ConfigError::invalid(
                "realtimePriority",
                format!(
                    "{} is not a SCHED_FIFO priority (1..=99, or 0 for normal scheduling)",
                    self.realtime_priority
                ),
            ));
        }
        let timeout = self.memory_reclaim.timeout.0;
        if timeout.is_zero() || timeout > Duration::from_secs(10) {
            return Err(ConfigError::invalid(
                "memoryReclaim.timeout",
                "must be greater than zero and at most 10s (the reactor loop waits for it)",
            ));
        }
        if self.housekeeping_interval.0.is_zero() {
            return Err(ConfigError::invalid(
                "housekeepingInterval",
                "must be greater than zero",
            ));
        }
        let period = self.cpu_cfs_quota_period.0;
        if period < Duration::from_millis(1) || period > Duration::from_secs(1) {
            return Err(ConfigError::invalid(
                "cpuCFSQuotaPeriod",
                "must be between 1ms and 1s",
            ));
        }
        for value in ["memoryCapacity", "cpuCapacity"] {
            let text = if value == "memoryCapacity" {
                &self.node.memory_capacity
            } else {
                &self.node.cpu_capacity
            };
            if !text.is_empty() {
                match Quantity::parse(text) {
                    Ok(q) if !q.is_negative() => {}
                    Ok(_) => {
                        return Err(ConfigError::invalid(
                            format!("node.{value}"),
                            "must not be negative",
                        ))
                    }
                    Err(e) => {
                        return Err(ConfigError::invalid(format!("node.{value}"), e.to_string()))
                    }
                }
            }
        }
        self.validate_sense()?;
        self.validate_memory_qos()?;
        self.validate_psi_conditions()?;
        match self.runtime.kind.as_str() {
            "process" | "cri" => {}
            other => {
                return Err(ConfigError::invalid(
                    "runtime.kind",
                    format!("{other:?} is not a runtime (process | cri)"),
                ))
            }
        }
        match self.log.format.as_str() {
            "plain" | "json" => {}
            other => {
                return Err(ConfigError::invalid(
                    "log.format",
                    format!("{other:?} is not a format (plain | json)"),
                ))
            }
        }
        for (i, entry) in self.enforce_node_allocatable.iter().enumerate() {
            if !matches!(
                entry.as_str(),
                "pods" | "system-reserved" | "kube-reserved" | "none"
            ) {
                return Err(ConfigError::invalid(
                    format!("enforceNodeAllocatable[{i}]"),
                    format!("{entry:?} is not one of pods, system-reserved, kube-reserved, none"),
                ));
            }
        }
        Ok(())
    }

    /// Refuses eviction thresholds the kubelet would refuse at start, naming the key
    /// (`evictionHard.memory.available`).
    fn validate_eviction(&self) -> Result<(), ConfigError> {
        let settings = crate::decide::thresholds::EvictionSettings {
            hard: self.eviction_hard.clone(),
            // The config's own default holds the kubelet's defaults (an absent key); an
            // empty map there was written so.
            hard_given: true,
            soft: self.eviction_soft.clone(),
            soft_grace_period: self.eviction_soft_grace_period.clone(),
            minimum_reclaim: self.eviction_minimum_reclaim.clone(),
            merge_defaults: self.merge_default_eviction_settings,
            enforce_allocatable_pods: self.enforce_node_allocatable.iter().any(|e| e == "pods"),
        };
        crate::decide::thresholds::validate(&settings)
            .map_err(|e| ConfigError::invalid(e.key, e.reason))
    }

    fn validate_sense(&self) -> Result<(), ConfigError> {
        let window = self.sense.psi_window.0;
        let threshold = self.sense.psi_threshold.0;
        // The kernel accepts PSI windows of 500ms..10s, and the stall threshold must fit in it.
        if window < Duration::from_millis(500) || window > Duration::from_secs(10) {
            return Err(ConfigError::invalid(
                "sense.psiWindow",
                "must be between 500ms and 10s (the kernel's limits)",
            ));
        }
        if threshold.is_zero() || threshold > window {
            return Err(ConfigError::invalid(
                "sense.psiThreshold",
                "must be greater than zero and at most sense.psiWindow",
            ));
        }
        Ok(())
    }

    /// The config as the YAML document `reactor config defaults` prints.
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(self).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_round_trip() {
        let text = Config::default().to_yaml();
        let back = Config::from_yaml(&text).expect(&text);
        assert_eq!(back, Config::default());
    }

    #[test]
    fn unknown_key_names_its_path() {
        let err = Config::from_yaml("sense:\n  ebpf: true\n  bogus: 1\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("sense"), "{err}");
        assert!(err.contains("bogus"), "{err}");
        assert!(!err.contains('\n'));
    }

    #[test]
    fn a_key_with_line_breaks_is_named_on_one_line() {
        // Found by the `config` fuzz target: a quoted YAML key holding carriage returns
        // came back verbatim in the error, which then spanned two lines.
        let err = Config::from_yaml("?\n#\n \"{{\r\r\"")
            .unwrap_err()
            .to_string();
        assert!(!err.contains(['\n', '\r']), "{err:?}");
        assert!(err.starts_with("config key {{"), "{err}");
        let err = Config::from_yaml("\"a\\nb\": 1\n").unwrap_err().to_string();
        assert!(err.starts_with("config key a\\nb: unknown field"), "{err}");
    }

    #[test]
    fn negative_interval_names_its_key() {
        let err = Config::from_yaml("housekeepingInterval: -5s\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("config key housekeepingInterval:"), "{err}");
        let err = Config::from_yaml("sense:\n  psiWindow: 20s\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("sense.psiWindow"), "{err}");
    }

    #[test]
    fn kubelet_values_are_accepted() {
        let c = Config::from_yaml(
            "evictionHard:\n  memory.available: 500Mi\nimageGCHighThresholdPercent: 90\nimageMinimumGCAge: 1m30s\nsystemReserved:\n  cpu: 500m\n  memory: 1Gi\n",
        )
        .unwrap();
        assert_eq!(c.image_minimum_gc_age.0, Duration::from_secs(90));
        assert_eq!(c.system_reserved["memory"].0, Quantity::from_units(1 << 30));
    }

    #[test]
    fn bad_eviction_thresholds_name_their_key() {
        for (text, key) in [
            (
                "evictionHard:\n  memory.available: 12Qi\n",
                "config key evictionHard.memory.available:",
            ),
            (
                "evictionHard:\n  nodefs.available: 101%\n",
                "config key evictionHard.nodefs.available:",
            ),
            (
                "evictionSoft:\n  memory.available: 1Gi\n",
                "config key evictionSoftGracePeriod.memory.available:",
            ),
            (
                "evictionMinimumReclaim:\n  disk.available: 1Gi\n",
                "config key evictionMinimumReclaim.disk.available:",
            ),
        ] {
            let err = Config::from_yaml(text).unwrap_err().to_string();
            assert!(err.starts_with(key), "{err}");
        }
        assert!(Config::from_yaml(
            "evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 1m\n"
        )
        .is_ok());
    }

    #[test]
    fn image_gc_timing_section() {
        let c = Config::from_yaml("imageGC:\n  period: 1m\n  listRefresh: 10s\n").unwrap();
        assert_eq!(c.image_gc.period.0, Duration::from_secs(60));
        assert_eq!(c.image_gc.list_refresh.0, Duration::from_secs(10));
        assert_eq!(
            Config::default().image_gc.period.0,
            Duration::from_secs(300)
        );
        let err = Config::from_yaml("imageGC:\n  period: 0s\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("config key imageGC.period:"), "{err}");
        let err = Config::from_yaml("imageGC:\n  every: 1m\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("imageGC") && err.contains("every"), "{err}");
    }

    #[test]
    fn device_plugin_grace_period_is_a_positive_go_duration() {
        assert_eq!(
            Config::default().device_plugin_grace_period.0,
            Duration::from_secs(300),
            "the kubelet's endpointStopGracePeriod"
        );
        let c = Config::from_yaml("devicePluginGracePeriod: 1m30s\n").unwrap();
        assert_eq!(c.device_plugin_grace_period.0, Duration::from_secs(90));
        for bad in ["0s", "-1s", "soon", "5"] {
            let err = Config::from_yaml(&format!("devicePluginGracePeriod: {bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("config key devicePluginGracePeriod:"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn memory_reclaim_is_off_by_default_and_bounded() {
        let d = Config::default();
        assert!(!d.memory_reclaim.enabled, "kubelet-exact by default");
        assert_eq!(d.memory_reclaim.timeout.0, Duration::from_millis(100));
        assert!(d.to_yaml().contains("memoryReclaim:"), "{}", d.to_yaml());
        let c = Config::from_yaml("memoryReclaim:\n  enabled: true\n  timeout: 250ms\n").unwrap();
        assert!(c.memory_reclaim.enabled);
        assert_eq!(c.memory_reclaim.timeout.0, Duration::from_millis(250));
        for bad in ["0s", "11s", "-1s", "soon"] {
            let err = Config::from_yaml(&format!("memoryReclaim:\n  timeout: {bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("memoryReclaim"), "{bad}: {err}");
        }
        let err = Config::from_yaml("memoryReclaim:\n  enable: true\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("enable"), "{err}");
    }

    #[test]
    fn dry_run_is_off_by_default_and_a_boolean() {
        assert!(!Config::default().dry_run);
        assert!(Config::default().to_yaml().contains("dryRun: false"));
        assert!(Config::from_yaml("dryRun: true\n").unwrap().dry_run);
        // A quoted word is a string, not a boolean (bare `yes` is YAML's own true).
        for bad in ["\"yes\"", "\"true\"", "1", "[true]", "on-ish"] {
            let err = Config::from_yaml(&format!("dryRun: {bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("config key dryRun:"), "{bad}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn percent_ranges() {
        let err = Config::from_yaml("imageGCLowThresholdPercent: 90\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("imageGCLowThresholdPercent"), "{err}");
    }
}
