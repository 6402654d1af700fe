//! Starting the sources: each one the options switch on is attached, and what attaches is
//! kept as a task with a line saying what it watches; what does not is kept with the reason
//! (switched off, not root, file absent, v1/v2 mismatch, the kernel's errno), for the
//! [`AttachReport`] the agent prints rather than run blind.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;

use super::ebpf::charge_switch::ChargeSwitch;
use super::ebpf::kernel_watch::KernelWatch;
use super::ebpf::stage::VictimStage;
use super::event::{PressureEvent, Source};
use super::memcg::hierarchy::{HierarchyError, MemoryHierarchy};
use super::memcg::thresholds::{MemcgTarget, ThresholdsBuilder};
use super::{ebpf, memcg, poll, psi};

/// How long the agent keeps `count_memcg_events` attached after the last reclaim stall
/// ([`ebpf::charge_switch`]).
pub const MEMCG_EVENTS_HOLD: std::time::Duration = std::time::Duration::from_secs(10);

/// What the sense layer should listen to. Built from the config ([`SenseOptions::from_config`])
/// and adjusted by command-line flags.
#[derive(Clone, Debug)]
pub struct SenseOptions {
    /// Attach the eBPF programs.
    pub ebpf: bool,
    /// Arm PSI triggers.
    pub psi: bool,
    /// Register memcg notifications on [`SenseOptions::targets`].
    pub memcg: bool,
    /// Run the housekeeping tick.
    pub poll: bool,
    /// Stall per window that fires a PSI trigger.
    pub psi_threshold: Duration,
    /// The PSI trigger window.
    pub psi_window: Duration,
    /// The housekeeping tick's interval.
    pub poll_interval: Duration,
    /// Cgroups to watch (memcg notifications; on cgroup v2 also their `memory.pressure`).
    pub targets: Vec<MemcgTarget>,
    /// The memory hierarchy; `None` finds it from `/proc/self/mountinfo`.
    pub hierarchy: Option<MemoryHierarchy>,
    /// The node-wide pressure file (injectable for tests of the failure paths).
    pub proc_pressure: PathBuf,
    /// Events that may wait in the channel before sources block.
    pub channel_capacity: usize,
}

impl SenseOptions {
    /// The options a config file asks for, watching `targets`.
    pub fn from_config(config: &crate::config::Config, targets: Vec<MemcgTarget>) -> Self {
        SenseOptions {
            ebpf: config.sense.ebpf,
            psi: config.sense.psi,
            memcg: config.sense.memcg_threshold,
            poll: config.sense.poll,
            psi_threshold: config.sense.psi_threshold.0,
            psi_window: config.sense.psi_window.0,
            poll_interval: config.housekeeping_interval.0,
            targets,
            hierarchy: None,
            proc_pressure: PathBuf::from(psi::PROC_PRESSURE_MEMORY),
            channel_capacity: 1024,
        }
    }
}

/// One source (or one part of one: a trigger, an eventfd) that is listening.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AttachedPart {
    /// The source it feeds.
    pub source: Source,
    /// What it watches, for people.
    pub what: String,
}

/// A source, or part of one, that is not listening, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MissingPart {
    /// The source.
    pub source: Source,
    /// Why (switched off, not root, file absent, v1/v2 mismatch, the kernel's errno...).
    pub reason: String,
}

/// What attached at start and what did not: the agent says so rather than run blind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AttachReport {
    /// Parts that are listening.
    pub attached: Vec<AttachedPart>,
    /// Parts that are not, with the reason.
    pub missing: Vec<MissingPart>,
}

impl AttachReport {
    /// Whether any part of `source` is listening.
    pub fn has(&self, source: Source) -> bool {
        self.attached.iter().any(|a| a.source == source)
    }
}

type SourceTask = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A part that attached: what it is and the task that feeds the channel.
pub(crate) struct Attachment {
    pub(super) source: Source,
    pub(super) what: String,
    pub(super) task: SourceTask,
}

impl Attachment {
    /// Wraps a source's running future.
    pub fn new(
        source: Source,
        what: String,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        Attachment {
            source,
            what,
            task: Box::pin(task),
        }
    }
}

/// The parts attached so far and the reasons for the ones that are not, while starting.
pub(super) struct Attaching {
    pub(super) tx: mpsc::Sender<PressureEvent>,
    pub(super) parts: Vec<Attachment>,
    pub(super) missing: Vec<MissingPart>,
    pub(super) thresholds: ThresholdsBuilder,
    pub(super) charge_switch: Option<ChargeSwitch>,
    pub(super) kernel_watch: KernelWatch,
    pub(super) victim_stage: Option<VictimStage>,
    pub(super) ring_probe: Option<std::os::fd::OwnedFd>,
}

impl Attaching {
    /// Attaches every source `opts` switches on, each sending into `tx`; what did not attach
    /// is in `missing` with the reason. The caller holds no sender after: the channel closes
    /// when the last source stops.
    pub(super) fn start(opts: &SenseOptions, tx: mpsc::Sender<PressureEvent>) -> Attaching {
        let mut attaching = Attaching {
            tx,
            parts: Vec::new(),
            missing: Vec::new(),
            thresholds: ThresholdsBuilder::default(),
            charge_switch: None,
            kernel_watch: KernelWatch::default(),
            victim_stage: None,
            ring_probe: None,
        };
        let hierarchy = match &opts.hierarchy {
            Some(h) => Ok(h.clone()),
            None => MemoryHierarchy::detect(),
        };
        if opts.ebpf {
            attaching.ebpf(&opts.targets, &hierarchy);
        } else {
            attaching.missing(Source::Ebpf, "switched off (sense.ebpf: false)".into());
        }
        if opts.psi {
            attaching.psi(opts, &hierarchy);
        } else {
            attaching.missing(Source::Psi, "switched off (sense.psi: false)".into());
        }
        if !opts.memcg {
            let reason = "switched off (sense.memcgThreshold: false)";
            attaching.missing(Source::MemcgThreshold, reason.into());
        } else if opts.targets.is_empty() {
            let reason = "no cgroup to watch was given";
            attaching.missing(Source::MemcgThreshold, reason.into());
        } else {
            match &hierarchy {
                Err(reason) => attaching.missing(Source::MemcgThreshold, reason.to_string()),
                Ok(h) => attaching.memcg(h, &opts.targets),
            }
        }
        if opts.poll {
            let what = format!(
                "housekeeping tick every {}",
                crate::decide::duration::format_go_duration(opts.poll_interval)
            );
            let task = poll::run(opts.poll_interval, attaching.tx.clone());
            attaching
                .parts
                .push(Attachment::new(Source::Poll, what, task));
        } else {
            attaching.missing(Source::Poll, "switched off (sense.poll: false)".into());
        }
        attaching
    }

    fn missing(&mut self, source: Source, reason: String) {
        self.missing.push(MissingPart { source, reason });
    }

    /// The eBPF programs: whatever subset attaches runs as one task on the ring buffer; each
    /// program that did not attach is reported with the kernel's reason. Targets with a usage
    /// threshold are checked in the kernel on every charge (the charge programs), following
    /// the same levels as the memcg notification.
    fn ebpf(
        &mut self,
        targets: &[MemcgTarget],
        hierarchy: &Result<MemoryHierarchy, HierarchyError>,
    ) {
        let wanted: Vec<(&MemcgTarget, u64)> = targets
            .iter()
            .filter_map(|t| t.threshold_bytes.map(|b| (t, b)))
            .collect();
        let options = ebpf::EbpfOptions {
            usage_thresholds: !wanted.is_empty(),
            // The charge programs tax every page fault on the node: on only near a level.
            near_level: Some(ebpf::near::NearLevel::default()),
            // `count_memcg_events` is entered on every page fault too; its items mean
            // pressure only while memory is reclaimed: on only then.
            memcg_events_on_reclaim: Some(MEMCG_EVENTS_HOLD),
            ..Default::default()
        };
        match ebpf::EbpfSource::attach(options) {
            Ok(mut source) => {
                for (program, reason) in source.missing() {
                    self.missing(Source::Ebpf, format!("{program}: {reason}"));
                }
                let mut what = format!("eBPF ring buffer: {}", source.attached().join(", "));
                for (target, bytes) in wanted {
                    let dir = match hierarchy.as_ref().map(|h| h.dir(&target.cgroup)) {
                        Ok(Ok(dir)) => dir,
                        Ok(Err(reason)) => {
                            self.missing(Source::Ebpf, reason.to_string());
                            continue;
                        }
                        Err(reason) => {
                            self.missing(Source::Ebpf, reason.to_string());
                            continue;
                        }
                    };
                    let moves = self.thresholds.add(target, bytes);
                    let armed = source.watch_usage(ebpf::threshold::UsageWatch {
                        cgroup: target.cgroup.clone(),
                        dir,
                        level: moves,
                    });
                    match armed {
                        Ok(described) => {
                            what.push_str("; ");
                            what.push_str(&described);
                        }
                        Err(reason) => self.missing(Source::Ebpf, reason.to_string()),
                    }
                }
                self.charge_switch = source.charge_switch();
                self.kernel_watch = source.kernel_watch();
                self.victim_stage = source.victim_stage();
                self.ring_probe = source.ring_probe();
                let tx = self.tx.clone();
                let task = async move {
                    if let Err(e) = source.run(tx).await {
                        tracing::error!(error = %e, "eBPF source stopped");
                    }
                };
                self.parts.push(Attachment::new(Source::Ebpf, what, task));
            }
            Err(e) => self.missing(Source::Ebpf, e.to_string()),
        }
    }

    fn psi_watch(&mut self, armed: Result<psi::PsiWatch, psi::PsiError>) {
        match armed {
            Ok(watch) => {
                let what = watch.describe();
                let task = watch.run(self.tx.clone());
                self.parts.push(Attachment::new(Source::Psi, what, task));
            }
            Err(reason) => self.missing(Source::Psi, reason.to_string()),
        }
    }

    /// Node-wide `some` and `full` triggers, and on cgroup v2 a `some` trigger on each
    /// target's `memory.pressure`.
    fn psi(&mut self, opts: &SenseOptions, hierarchy: &Result<MemoryHierarchy, HierarchyError>) {
        for level in [psi::Level::Some, psi::Level::Full] {
            let armed = psi::arm(
                &opts.proc_pressure,
                None,
                level,
                opts.psi_threshold,
                opts.psi_window,
            );
            self.psi_watch(armed);
        }
        match hierarchy {
            Ok(h @ MemoryHierarchy::V2(_)) => {
                for target in &opts.targets {
                    let dir = match h.dir(&target.cgroup) {
                        Ok(dir) => dir,
                        Err(reason) => {
                            self.missing(Source::Psi, reason.to_string());
                            continue;
                        }
                    };
                    let armed = psi::arm(
                        &dir.join("memory.pressure"),
                        Some(target.cgroup.clone()),
                        psi::Level::Some,
                        opts.psi_threshold,
                        opts.psi_window,
                    );
                    self.psi_watch(armed);
                }
            }
            Ok(MemoryHierarchy::V1(_)) if !opts.targets.is_empty() => self.missing(
                Source::Psi,
                "per-cgroup memory.pressure: the memory controller is on cgroup v1, so PSI is \
                 node-wide only"
                    .into(),
            ),
            _ => {}
        }
    }

    /// v1: a threshold eventfd (when the target has a threshold) and the OOM eventfd per
    /// target; v2: inotify on each target's `memory.events`.
    fn memcg(&mut self, h: &MemoryHierarchy, targets: &[MemcgTarget]) {
        // One OOM notification per cgroup, however many thresholds it has.
        let mut oom_armed = std::collections::BTreeSet::new();
        for target in targets {
            let dir = match h.dir(&target.cgroup) {
                Ok(dir) => dir,
                Err(reason) => {
                    self.missing(Source::MemcgThreshold, reason.to_string());
                    continue;
                }
            };
            let cgroup = &target.cgroup;
            match h {
                MemoryHierarchy::V1(_) => {
                    if let Some(bytes) = target.threshold_bytes {
                        let moves = self.thresholds.add(target, bytes);
                        let armed = memcg::v1::arm_v1_threshold(&dir, cgroup, bytes, Some(moves));
                        self.eventfd_watch(armed);
                    }
                    if oom_armed.insert(cgroup.clone()) {
                        let armed = memcg::v1::arm_v1_oom(&dir, cgroup);
                        self.eventfd_watch(armed);
                    }
                }
                MemoryHierarchy::V2(_) => {
                    let moves = target
                        .threshold_bytes
                        .map(|bytes| self.thresholds.add(target, bytes));
                    match memcg::v2::arm_v2_events(&dir, cgroup, target.threshold_bytes, moves) {
                        Ok(watch) => {
                            let what = watch.describe();
                            let task = watch.run(self.tx.clone());
                            self.parts
                                .push(Attachment::new(Source::MemcgThreshold, what, task));
                        }
                        Err(reason) => self.missing(Source::MemcgThreshold, reason.to_string()),
                    }
                }
            }
        }
    }

    fn eventfd_watch(&mut self, armed: Result<memcg::v1::EventfdWatch, memcg::V1Error>) {
        match armed {
            Ok(watch) => {
                let what = watch.describe();
                let task = watch.run(self.tx.clone());
                self.parts
                    .push(Attachment::new(Source::MemcgThreshold, what, task));
            }
            Err(reason) => self.missing(Source::MemcgThreshold, reason.to_string()),
        }
    }
}
