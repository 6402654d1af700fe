//! `sense`: every way the kernel tells us about memory pressure, turned into one stream of
//! [`PressureEvent`]s.
//!
//! Each source runs as its own tokio task and sends into one channel, so the reactor loop
//! has a single place to wake from whatever the node offers (eBPF, PSI, memcg notification,
//! or the polling fallback). The event carries the kernel's own timestamp where the kernel
//! gives one, so the detection lag (`now - at_ns` when the reactor takes the event) is a
//! measured figure rather than an estimate.
//!
//! [`Sense::start`] attaches whatever the options switch on, says what attached and why
//! anything did not, and runs on what is left; [`Sense::next`] hands out events with their lag
//! and keeps the per-source lag histograms ([`lag`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), reactor::sense::SenseError> {
//! use reactor::config::Config;
//! use reactor::sense::{MemcgTarget, Sense, SenseOptions};
//!
//! let target = MemcgTarget { cgroup: "/kubepods".into(), threshold_bytes: Some(30 << 30) };
//! let mut sense = Sense::start(&SenseOptions::from_config(&Config::default(), vec![target]))?;
//! while let Some(r) = sense.next().await {
//!     println!("{} {} {} lag {}ns", r.event.source, r.event.kind, r.event.at_ns, r.lag_ns);
//! }
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

pub mod lag;
pub mod memcg;
pub mod poll;
pub mod psi;

pub use lag::{LagRecorder, LagSnapshot};
pub use memcg::{MemcgTarget, MemoryHierarchy};

pub mod ebpf;

/// How long the agent keeps `count_memcg_events` attached after the last reclaim stall
/// ([`ebpf::charge_switch`]).
pub const MEMCG_EVENTS_HOLD: std::time::Duration = std::time::Duration::from_secs(10);

/// Where an event came from. One variant per sense source; the config switches each one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// eBPF programs on kernel tracepoints, delivered through the BPF ring buffer.
    Ebpf,
    /// A PSI trigger on `/proc/pressure/memory` or a cgroup's `memory.pressure`.
    Psi,
    /// A memcg notification: v1 `cgroup.event_control` threshold eventfd, v2 `memory.events`.
    MemcgThreshold,
    /// The housekeeping tick: a fallback that reads the signals at a fixed interval.
    Poll,
}

impl Source {
    /// Every source, in the order the agent attaches them.
    pub const ALL: [Source; 4] = [
        Source::Ebpf,
        Source::Psi,
        Source::MemcgThreshold,
        Source::Poll,
    ];

    /// The name used in config keys, logs, metrics labels and `reactor watch`.
    pub fn name(self) -> &'static str {
        match self {
            Source::Ebpf => "ebpf",
            Source::Psi => "psi",
            Source::MemcgThreshold => "memcg-threshold",
            Source::Poll => "poll",
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One thing the kernel said about pressure, with the kernel's timestamp.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PressureEvent {
    /// `CLOCK_MONOTONIC` nanoseconds at which the kernel saw the event (its own
    /// `bpf_ktime_get_ns()` for eBPF; the wake-up time for sources that carry no timestamp).
    pub at_ns: u64,
    /// `CLOCK_MONOTONIC` nanoseconds at which the source's task woke to read it, where the
    /// source knows: for eBPF, when the ring-buffer reader began the pass that took the record
    /// (or the record's own `at_ns` if it was written during that pass); for memcg and PSI
    /// the same stamp as `at_ns`. With it the lag splits into kernel → wake (the time the event
    /// waited for the reader to run) and wake → taken (the agent's own path), which compare
    /// alike across sources. `None` for the tick and `Dropped` reports.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub woke_ns: Option<u64>,
    /// Which sense source delivered it.
    pub source: Source,
    /// The cgroup the event belongs to, as a path inside the memory hierarchy
    /// (`/kubepods/burstable/pod…`), or `None` for node-wide events.
    pub cgroup: Option<String>,
    /// What happened.
    pub kind: Kind,
}

/// A process the eBPF charge program sent SIGKILL at a hard threshold's crossing, because it
/// was charging inside the staged victim pod ([`ebpf::stage`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct KilledAtCrossing {
    /// The killed process (thread-group id).
    pub pid: u32,
    /// The staged victim pod cgroup's id (kernfs inode) the kill was for.
    pub cgroup_id: u64,
}

/// What a pressure event reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Kind {
    /// The kernel OOM killer chose a victim (`oom:mark_victim`, or an OOM counted in
    /// `memory.oom_control` / `memory.events`).
    OomKill {
        /// The victim's pid, where the source knows it.
        pid: Option<u32>,
        /// The victim's command name, where the source knows it.
        comm: Option<String>,
        /// The victim's resident memory (anon + file + shmem) in bytes, where the source
        /// knows it (`oom:mark_victim` does).
        #[serde(skip_serializing_if = "Option::is_none")]
        rss_bytes: Option<u64>,
        /// The victim's `oom_score_adj`, where the source knows it.
        #[serde(skip_serializing_if = "Option::is_none")]
        oom_score_adj: Option<i32>,
    },
    /// A task stalled in reclaim; the duration is measured in the kernel.
    ReclaimStall {
        /// The stalled task.
        pid: u32,
        /// How long it stalled, in nanoseconds.
        duration_ns: u64,
        /// Whether it was memcg (limit) reclaim rather than global direct reclaim.
        memcg: bool,
        /// Earlier stalls in the same cgroup folded into this event by the kernel-side rate
        /// limit (so a reclaim storm cannot flood the ring buffer); 0 when none.
        folded: u64,
        /// Their total stall time, in nanoseconds.
        folded_ns: u64,
    },
    /// A memcg event counter moved (`memcg:count_memcg_events`: high, max, oom...).
    MemcgEvent {
        /// The event item, by its kernel name.
        item: String,
        /// How many were counted since the last report for this cgroup.
        count: u64,
    },
    /// A PSI trigger fired: stall time crossed the threshold within the window.
    PsiTrigger {
        /// `"some"` or `"full"`.
        level: String,
        /// The level's cumulative stall (`total=`, µs) read just after the wake-up, where it
        /// could be read: two events' difference is the stall between them.
        total_us: Option<u64>,
    },
    /// Usage crossed a memcg threshold (v1 eventfd) or `memory.events` changed (v2).
    ThresholdCrossed {
        /// The threshold in bytes, where there is one.
        threshold_bytes: Option<u64>,
        /// Usage read at wake-up, where it could be read. The v1 eventfd fires on crossings in
        /// both directions; this says which one it was.
        usage_bytes: Option<u64>,
        /// The process the eBPF charge program killed at this crossing, the staged victim's
        /// ([`ebpf::stage`]); `None` for every other crossing and source.
        #[serde(skip_serializing_if = "Option::is_none")]
        killed: Option<KilledAtCrossing>,
    },
    /// The housekeeping tick: nothing from the kernel, just time to look again.
    Tick,
    /// Events were lost before the agent could read them (the eBPF ring buffer was full);
    /// `count` is how many since the previous report. Pressure may have been missed, so the
    /// consumer should look at the signals now.
    Dropped {
        /// Records lost since the last `Dropped` report.
        count: u64,
    },
}

impl std::fmt::Display for Kind {
    /// One short line for logs, `reactor watch`'s table and `reactor events`: sizes and times
    /// as kubectl and Go print them (`rss=496Ki`, `12.5ms`; `crate::human`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::human;
        fn opt<T>(v: &Option<T>, show: impl Fn(&T) -> String) -> String {
            v.as_ref().map_or_else(|| "?".to_string(), show)
        }
        let bytes = |b: &u64| human::bytes(i128::from(*b));
        match self {
            Kind::OomKill {
                pid,
                comm,
                rss_bytes,
                oom_score_adj,
            } => write!(
                f,
                "oom-kill pid={} comm={} rss={} oom_score_adj={}",
                opt(pid, ToString::to_string),
                opt(comm, ToString::to_string),
                opt(rss_bytes, bytes),
                opt(oom_score_adj, ToString::to_string)
            ),
            Kind::ReclaimStall {
                pid,
                duration_ns,
                memcg,
                folded,
                folded_ns,
            } => write!(
                f,
                "reclaim-stall pid={pid} {} memcg={memcg} folded={folded} ({})",
                human::duration_ns(*duration_ns),
                human::duration_ns(*folded_ns)
            ),
            Kind::MemcgEvent { item, count } => write!(f, "memcg-event {item} +{count}"),
            Kind::PsiTrigger { level, total_us } => {
                write!(
                    f,
                    "psi-trigger {level} total={}",
                    opt(total_us, |us| human::duration_ns(us.saturating_mul(1000)))
                )
            }
            Kind::ThresholdCrossed {
                threshold_bytes,
                usage_bytes,
                killed,
            } => {
                write!(
                    f,
                    "threshold-crossed threshold={} usage={}",
                    opt(threshold_bytes, bytes),
                    opt(usage_bytes, bytes)
                )?;
                match killed {
                    Some(k) => write!(f, " killed-at-crossing pid={}", k.pid),
                    None => Ok(()),
                }
            }
            Kind::Tick => f.write_str("tick"),
            Kind::Dropped { count } => write!(f, "ring-buffer-drops +{count}"),
        }
    }
}

/// A thread's CPU clock reading (`CLOCK_THREAD_CPUTIME_ID`) and the thread it was read on:
/// beside a span of [`monotonic_ns`] it tells a thread that ran throughout from one that
/// waited. Readings on two threads do not compare (an async task can move between a
/// runtime's workers at an `.await`), so [`ThreadCpu::since`] says nothing then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadCpu {
    thread: std::thread::ThreadId,
    ns: u64,
}

impl ThreadCpu {
    /// The calling thread's CPU time so far.
    pub fn now() -> ThreadCpu {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        ThreadCpu {
            thread: std::thread::current().id(),
            ns: (ts.tv_sec as u64)
                .saturating_mul(1_000_000_000)
                .saturating_add(ts.tv_nsec as u64),
        }
    }

    /// CPU time from `earlier` to this reading, ns; `None` when they were read on
    /// different threads.
    pub fn since(&self, earlier: ThreadCpu) -> Option<u64> {
        (self.thread == earlier.thread).then(|| self.ns.saturating_sub(earlier.ns))
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock `bpf_ktime_get_ns()` reads, so eBPF
/// timestamps and ours compare directly.
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Registers an fd we own with tokio's reactor for the given readiness.
pub(crate) fn register_fd(
    fd: std::os::fd::OwnedFd,
    interest: tokio::io::Interest,
) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: an `OwnedFd` owns its descriptor until it is dropped, and the `AsyncFd` owns the
    // `OwnedFd`, so the raw fd stays open and the same for the `AsyncFd`'s whole life.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, interest) }
        .map_err(|e| std::io::Error::other(e.to_string()))
}

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

/// The sense layer could not start.
#[derive(Debug, thiserror::Error)]
pub enum SenseError {
    /// Every source is off or failed to attach, the tick included.
    #[error("no sense source could start (and sense.poll is off): {0}")]
    NoSources(String),
}

type SourceTask = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A part that attached: what it is and the task that feeds the channel.
pub(crate) struct Attachment {
    source: Source,
    what: String,
    task: SourceTask,
}

impl Attachment {
    /// Wraps a source's running future.
    pub(crate) fn new(
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

/// One event as the consumer took it, with its detection lag.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Received {
    /// The event.
    #[serde(flatten)]
    pub event: PressureEvent,
    /// `CLOCK_MONOTONIC` at take-up minus the event's `at_ns`.
    pub lag_ns: u64,
    /// `CLOCK_MONOTONIC` at take-up minus the event's `woke_ns` (wake → taken), where the
    /// source stamps its wake-up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wake_lag_ns: Option<u64>,
}

/// The running sense layer: every attached source as a task feeding one channel, and the
/// lag histograms of what the consumer has taken.
pub struct Sense {
    rx: mpsc::Receiver<PressureEvent>,
    tasks: JoinSet<()>,
    report: AttachReport,
    lag: LagRecorder,
    thresholds: memcg::MemcgThresholds,
    charge_switch: Option<ebpf::charge_switch::ChargeSwitch>,
    kernel_watch: ebpf::kernel_watch::KernelWatch,
    victim_stage: Option<ebpf::stage::VictimStage>,
    /// A duplicate of the eBPF ring buffer's fd, which says without being read that a
    /// record is waiting.
    ring_probe: Option<std::os::fd::OwnedFd>,
}

impl Sense {
    /// Attaches every source the options switch on, logs what attached and why anything is
    /// missing, and runs on whatever is left. Fails only when nothing at all could start.
    ///
    /// Must be called inside a tokio runtime.
    pub fn start(opts: &SenseOptions) -> Result<Sense, SenseError> {
        let (tx, rx) = mpsc::channel(opts.channel_capacity.max(1));
        let mut attaching = Attaching {
            tx,
            parts: Vec::new(),
            missing: Vec::new(),
            thresholds: memcg::ThresholdsBuilder::default(),
            charge_switch: None,
            kernel_watch: ebpf::kernel_watch::KernelWatch::default(),
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
                Err(reason) => attaching.missing(Source::MemcgThreshold, reason.clone()),
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

        let Attaching {
            tx,
            parts,
            missing,
            thresholds,
            charge_switch,
            kernel_watch,
            victim_stage,
            ring_probe,
        } = attaching;
        // Only the tasks hold senders now: the channel closes when the last source stops.
        drop(tx);
        let mut report = AttachReport {
            attached: Vec::new(),
            missing,
        };
        if parts.is_empty() {
            let reasons: Vec<String> = report
                .missing
                .iter()
                .map(|m| format!("{}: {}", m.source, m.reason))
                .collect();
            return Err(SenseError::NoSources(reasons.join("; ")));
        }
        let mut tasks = JoinSet::new();
        for part in parts {
            report.attached.push(AttachedPart {
                source: part.source,
                what: part.what,
            });
            tasks.spawn(part.task);
        }
        log_report(&report);
        Ok(Sense {
            rx,
            tasks,
            report,
            lag: LagRecorder::default(),
            thresholds: thresholds.build(),
            charge_switch,
            kernel_watch,
            victim_stage,
            ring_probe,
        })
    }

    /// Whether a kernel record is waiting in the eBPF ring buffer that its drain task has not
    /// handed on yet: one `poll` with no wait. A pass the loop's timer starts asks first. When
    /// the loop's thread was held off the CPU past the timer's period (a starved or stopped
    /// thread), the record and the timer are both due as it comes back, and the drain task,
    /// though ready, may run after the loop's (an interrupted `epoll_wait` even leaves it
    /// unwoken until the runtime's next turn); the loop then waits for the record, briefly,
    /// so the pass is the kernel's, with its timestamp, rather than the timer's.
    pub fn kernel_record_waiting(&self) -> bool {
        use rustix::event::{PollFd, PollFlags};
        let Some(ring) = &self.ring_probe else {
            return false;
        };
        let mut fds = [PollFd::new(ring, PollFlags::IN)];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
    }

    /// The switch that takes the eBPF charge programs off their tracepoint while a victim
    /// is torn down ([`ebpf::charge_switch`]); `None` when they are not attached.
    pub fn charge_switch(&self) -> Option<ebpf::charge_switch::ChargeSwitch> {
        self.charge_switch.clone()
    }

    /// Which watched cgroups the eBPF charge programs check at their working-set level right
    /// now ([`ebpf::kernel_watch`]); watches nothing without them.
    pub fn kernel_watch(&self) -> ebpf::kernel_watch::KernelWatch {
        self.kernel_watch.clone()
    }

    /// Where the loop stages the pod it would evict first, for the charge program to kill at
    /// a hard threshold's crossing ([`ebpf::stage`]); `None` without the charge programs.
    pub fn victim_stage(&self) -> Option<ebpf::stage::VictimStage> {
        self.victim_stage.clone()
    }

    /// The memcg usage thresholds armed, to move while running (see
    /// [`memcg::MemcgThresholds`]).
    pub fn memcg_thresholds(&self) -> memcg::MemcgThresholds {
        self.thresholds.clone()
    }

    /// What attached and what is missing.
    pub fn report(&self) -> &AttachReport {
        &self.report
    }

    /// Waits for the next event, measures its lag and records it. `None` once every source
    /// has stopped.
    pub async fn next(&mut self) -> Option<Received> {
        let event = self.rx.recv().await?;
        let now = monotonic_ns();
        let lag_ns = now.saturating_sub(event.at_ns);
        let wake_lag_ns = event.woke_ns.map(|w| now.saturating_sub(w));
        self.lag.record(event.source, lag_ns);
        Some(Received {
            event,
            lag_ns,
            wake_lag_ns,
        })
    }

    /// The lag histograms so far.
    pub fn lag(&self) -> &LagRecorder {
        &self.lag
    }

    /// Stops every source task (closing its fds, which unregisters triggers and eventfds)
    /// and returns the lag histograms.
    pub async fn shutdown(mut self) -> LagRecorder {
        self.rx.close();
        self.tasks.shutdown().await;
        self.lag
    }
}

/// The parts attached so far and the reasons for the ones that are not, while starting.
struct Attaching {
    tx: mpsc::Sender<PressureEvent>,
    parts: Vec<Attachment>,
    missing: Vec<MissingPart>,
    thresholds: memcg::ThresholdsBuilder,
    charge_switch: Option<ebpf::charge_switch::ChargeSwitch>,
    kernel_watch: ebpf::kernel_watch::KernelWatch,
    victim_stage: Option<ebpf::stage::VictimStage>,
    ring_probe: Option<std::os::fd::OwnedFd>,
}

impl Attaching {
    fn missing(&mut self, source: Source, reason: String) {
        self.missing.push(MissingPart { source, reason });
    }

    /// The eBPF programs: whatever subset attaches runs as one task on the ring buffer; each
    /// program that did not attach is reported with the kernel's reason. Targets with a usage
    /// threshold are checked in the kernel on every charge (the charge programs), following
    /// the same levels as the memcg notification.
    fn ebpf(&mut self, targets: &[MemcgTarget], hierarchy: &Result<MemoryHierarchy, String>) {
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
                    let dir = hierarchy
                        .as_ref()
                        .map_err(Clone::clone)
                        .and_then(|h| h.dir(&target.cgroup));
                    let armed = dir.and_then(|dir| {
                        let moves = self.thresholds.add(target, bytes);
                        source.watch_usage(ebpf::threshold::UsageWatch {
                            cgroup: target.cgroup.clone(),
                            dir,
                            level: moves,
                        })
                    });
                    match armed {
                        Ok(described) => {
                            what.push_str("; ");
                            what.push_str(&described);
                        }
                        Err(reason) => self.missing(Source::Ebpf, reason),
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

    fn psi_watch(&mut self, armed: Result<psi::PsiWatch, String>) {
        match armed {
            Ok(watch) => {
                let what = watch.describe();
                let task = watch.run(self.tx.clone());
                self.parts.push(Attachment::new(Source::Psi, what, task));
            }
            Err(reason) => self.missing(Source::Psi, reason),
        }
    }

    /// Node-wide `some` and `full` triggers, and on cgroup v2 a `some` trigger on each
    /// target's `memory.pressure`.
    fn psi(&mut self, opts: &SenseOptions, hierarchy: &Result<MemoryHierarchy, String>) {
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
                    let armed = h.dir(&target.cgroup).and_then(|dir| {
                        psi::arm(
                            &dir.join("memory.pressure"),
                            Some(target.cgroup.clone()),
                            psi::Level::Some,
                            opts.psi_threshold,
                            opts.psi_window,
                        )
                    });
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
                    self.missing(Source::MemcgThreshold, reason);
                    continue;
                }
            };
            let cgroup = &target.cgroup;
            match h {
                MemoryHierarchy::V1(_) => {
                    if let Some(bytes) = target.threshold_bytes {
                        let moves = self.thresholds.add(target, bytes);
                        let armed = memcg::arm_v1_threshold(&dir, cgroup, bytes, Some(moves));
                        self.eventfd_watch(armed);
                    }
                    if oom_armed.insert(cgroup.clone()) {
                        let armed = memcg::arm_v1_oom(&dir, cgroup);
                        self.eventfd_watch(armed);
                    }
                }
                MemoryHierarchy::V2(_) => {
                    let moves = target
                        .threshold_bytes
                        .map(|bytes| self.thresholds.add(target, bytes));
                    match memcg::arm_v2_events(&dir, cgroup, target.threshold_bytes, moves) {
                        Ok(watch) => {
                            let what = watch.describe();
                            let task = watch.run(self.tx.clone());
                            self.parts
                                .push(Attachment::new(Source::MemcgThreshold, what, task));
                        }
                        Err(reason) => self.missing(Source::MemcgThreshold, reason),
                    }
                }
            }
        }
    }

    fn eventfd_watch(&mut self, armed: Result<memcg::EventfdWatch, String>) {
        match armed {
            Ok(watch) => {
                let what = watch.describe();
                let task = watch.run(self.tx.clone());
                self.parts
                    .push(Attachment::new(Source::MemcgThreshold, what, task));
            }
            Err(reason) => self.missing(Source::MemcgThreshold, reason),
        }
    }
}

fn log_report(report: &AttachReport) {
    for part in &report.attached {
        tracing::info!(source = %part.source, what = %part.what, "sense source attached");
    }
    for part in &report.missing {
        tracing::warn!(source = %part.source, reason = %part.reason, "sense source missing");
    }
    let kernel = [Source::Ebpf, Source::Psi, Source::MemcgThreshold]
        .into_iter()
        .filter(|&s| report.has(s))
        .map(Source::name)
        .collect::<Vec<_>>();
    if kernel.is_empty() {
        tracing::warn!("no kernel notification attached: running on the housekeeping tick only");
    } else {
        tracing::info!(sources = %kernel.join(","), "sense running");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_off() -> SenseOptions {
        let mut opts = SenseOptions::from_config(&crate::config::Config::default(), Vec::new());
        opts.ebpf = false;
        opts.psi = false;
        opts.memcg = false;
        opts.poll = false;
        opts
    }

    #[tokio::test]
    async fn nothing_switched_on_is_a_clear_error() {
        let Err(err) = Sense::start(&all_off()) else {
            panic!("started with no sources");
        };
        let text = err.to_string();
        assert!(text.contains("sense.poll is off"), "{text}");
        assert!(text.contains("ebpf: switched off"), "{text}");
        assert!(!text.contains('\n'));
    }

    #[tokio::test]
    async fn runs_on_the_tick_when_kernel_sources_are_missing() {
        let mut opts = all_off();
        opts.psi = true;
        opts.proc_pressure = PathBuf::from("/nonexistent/pressure/memory");
        opts.memcg = true; // with no targets
        opts.poll = true;
        opts.poll_interval = Duration::from_millis(10);
        let mut sense = Sense::start(&opts).expect("tick alone is enough");
        let report = sense.report().clone();
        assert!(report.has(Source::Poll));
        assert!(!report.has(Source::Psi));
        let reasons: Vec<&str> = report.missing.iter().map(|m| m.reason.as_str()).collect();
        assert!(
            reasons
                .iter()
                .any(|r| r.contains("/nonexistent/pressure/memory absent")),
            "{reasons:?}"
        );
        assert!(
            reasons.iter().any(|r| r.contains("no cgroup to watch")),
            "{reasons:?}"
        );
        for _ in 0..3 {
            let r = sense.next().await.expect("tick");
            assert_eq!(r.event.kind, Kind::Tick);
            assert_eq!(r.event.source, Source::Poll);
        }
        let lag = sense.shutdown().await;
        assert_eq!(lag.histogram(Source::Poll).map(|h| h.count()), Some(3));
    }

    #[tokio::test]
    async fn v2_memory_events_change_becomes_events() {
        // A directory shaped like a v2 cgroup: inotify and the parsing are real, the files
        // are plain files we change.
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("memory.events");
        std::fs::write(&events, "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n").unwrap();
        std::fs::write(dir.path().join("memory.current"), "900\n").unwrap();
        let mut opts = all_off();
        opts.memcg = true;
        opts.hierarchy = Some(MemoryHierarchy::V2(dir.path().to_path_buf()));
        opts.targets = vec![MemcgTarget {
            cgroup: "/".into(),
            threshold_bytes: Some(500),
        }];
        let mut sense = Sense::start(&opts).unwrap();
        assert!(sense.report().has(Source::MemcgThreshold));
        std::fs::write(&events, "low 0\nhigh 4\nmax 0\noom 1\noom_kill 1\n").unwrap();
        let mut kinds = Vec::new();
        while kinds.len() < 4 {
            let r = tokio::time::timeout(Duration::from_secs(5), sense.next())
                .await
                .expect("memory.events change seen")
                .unwrap();
            assert_eq!(r.event.cgroup.as_deref(), Some("/"));
            kinds.push(r.event.kind);
        }
        assert!(kinds.contains(&Kind::OomKill {
            pid: None,
            comm: None,
            rss_bytes: None,
            oom_score_adj: None,
        }));
        assert!(kinds.contains(&Kind::MemcgEvent {
            item: "high".into(),
            count: 4
        }));
        assert!(kinds.contains(&Kind::ThresholdCrossed {
            threshold_bytes: Some(500),
            usage_bytes: Some(900),
            killed: None,
        }));
        sense.shutdown().await;
    }

    #[test]
    fn kinds_print_on_one_line() {
        let k = Kind::ThresholdCrossed {
            threshold_bytes: Some(10),
            usage_bytes: None,
            killed: None,
        };
        assert_eq!(k.to_string(), "threshold-crossed threshold=10 usage=?");
        let k = Kind::ThresholdCrossed {
            threshold_bytes: Some(384 << 20),
            usage_bytes: Some(402_661_377),
            killed: None,
        };
        assert_eq!(
            k.to_string(),
            "threshold-crossed threshold=384Mi usage=~384Mi"
        );
        let k = Kind::PsiTrigger {
            level: "some".into(),
            total_us: Some(2_500),
        };
        assert_eq!(k.to_string(), "psi-trigger some total=2.5ms");
        assert_eq!(Kind::Tick.to_string(), "tick");
    }

    #[test]
    fn monotonic_clock_moves_forward() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0 && b >= a);
    }
}
