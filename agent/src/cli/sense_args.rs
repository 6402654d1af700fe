//! Flags shared by `reactor watch` and `reactor run` that adjust what the sense layer listens
//! to on top of the config file.

use clap::Args;
use reactor::config::Config;
use reactor::decide::duration::parse_go_duration;
use reactor::decide::quantity::Quantity;
use reactor::sense::{memcg, MemcgTarget, SenseOptions};

use super::Failure;

/// Which sources run and which cgroups they watch.
#[derive(Args, Debug, Default)]
pub(crate) struct SenseArgs {
    /// A cgroup to watch, as a path inside the memory hierarchy (`/kubepods`); repeat for
    /// more. Replaces the default target: `cgroupRoot` with a threshold of memory capacity
    /// minus the `memory.available` hard eviction threshold.
    #[arg(long = "cgroup", value_name = "PATH")]
    cgroups: Vec<String>,
    /// A usage threshold (quantity, `48Mi`) for the `--cgroup` at the same position; a cgroup
    /// without one is watched for OOMs (v1) or `memory.events` (v2) only.
    #[arg(long = "threshold", value_name = "Q")]
    thresholds: Vec<String>,
    /// Do not attach the eBPF programs (overrides `sense.ebpf`).
    #[arg(long)]
    no_ebpf: bool,
    /// Do not arm PSI triggers (overrides `sense.psi`).
    #[arg(long)]
    no_psi: bool,
    /// Do not register memcg notifications (overrides `sense.memcgThreshold`).
    #[arg(long)]
    no_memcg: bool,
    /// Do not run the housekeeping tick (overrides `sense.poll`).
    #[arg(long)]
    no_poll: bool,
    /// The housekeeping tick's interval, a Go duration (overrides `housekeepingInterval`).
    #[arg(long, value_name = "DURATION")]
    interval: Option<String>,
}

impl SenseArgs {
    /// The sense options: the config's, adjusted by these flags. Bad flags are input errors.
    pub(crate) fn options(&self, config: &Config) -> Result<SenseOptions, Failure> {
        let targets = self.targets(config)?;
        let mut opts = SenseOptions::from_config(config, targets);
        opts.ebpf &= !self.no_ebpf;
        opts.psi &= !self.no_psi;
        opts.memcg &= !self.no_memcg;
        opts.poll &= !self.no_poll;
        if let Some(text) = &self.interval {
            let interval =
                parse_go_duration(text).map_err(|e| Failure::Input(format!("--interval: {e}")))?;
            if interval.is_zero() {
                return Err(Failure::Input(
                    "--interval: must be greater than zero".into(),
                ));
            }
            opts.poll_interval = interval;
        }
        Ok(opts)
    }

    /// Whether `--cgroup` named the cgroups to watch; otherwise the caller may choose its
    /// own (`reactor run` watches the cgroups its memory thresholds are measured on).
    pub(crate) fn explicit_targets(&self) -> bool {
        !self.cgroups.is_empty()
    }

    fn targets(&self, config: &Config) -> Result<Vec<MemcgTarget>, Failure> {
        if self.thresholds.len() > self.cgroups.len() {
            return Err(Failure::Input(format!(
                "--threshold given {} times but --cgroup only {} times: each threshold belongs to the --cgroup at its position",
                self.thresholds.len(),
                self.cgroups.len()
            )));
        }
        if self.cgroups.is_empty() {
            // The capacity is observe's to read, and sense's to turn into a target.
            let capacity = reactor::observe::memory_capacity(config)
                .map_err(|e| Failure::Input(e.to_string()))?;
            let target =
                memcg::node_target(config, capacity).map_err(|e| Failure::Input(e.to_string()))?;
            return Ok(vec![target]);
        }
        self.cgroups
            .iter()
            .enumerate()
            .map(|(i, cgroup)| {
                if !cgroup.starts_with('/') {
                    return Err(Failure::Input(format!(
                        "--cgroup {cgroup:?}: must be an absolute path inside the memory hierarchy"
                    )));
                }
                if cgroup.split('/').any(|part| part == "..") {
                    return Err(Failure::Input(format!(
                        "--cgroup {cgroup:?}: must not contain \"..\""
                    )));
                }
                let threshold_bytes = self
                    .thresholds
                    .get(i)
                    .map(|text| threshold_bytes(text))
                    .transpose()?;
                Ok(MemcgTarget {
                    cgroup: cgroup.clone(),
                    threshold_bytes,
                })
            })
            .collect()
    }
}

fn threshold_bytes(text: &str) -> Result<u64, Failure> {
    let q = Quantity::parse(text).map_err(|e| Failure::Input(format!("--threshold: {e}")))?;
    if q.is_negative() {
        return Err(Failure::Input(format!(
            "--threshold {text:?}: must not be negative"
        )));
    }
    u64::try_from(q.value())
        .map_err(|_| Failure::Input(format!("--threshold {text:?}: out of range")))
}
