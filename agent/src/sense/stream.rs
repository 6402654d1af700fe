//! The running sense layer: [`Sense::start`] attaches the sources ([`super::attach`]) and
//! says what attached; [`Sense::next`] hands out their events with the detection lag and
//! keeps the per-source lag histograms ([`super::lag`]).

use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::attach::{AttachReport, AttachedPart, Attaching, SenseOptions};
use super::clock::monotonic_ns;
#[cfg(doc)]
use super::ebpf;
use super::ebpf::charge_switch::ChargeSwitch;
use super::ebpf::kernel_watch::KernelWatch;
use super::ebpf::stage::VictimStage;
use super::event::{PressureEvent, Source};
use super::lag::LagRecorder;
use super::memcg::thresholds::MemcgThresholds;

/// The sense layer could not start.
#[derive(Debug, thiserror::Error)]
pub enum SenseError {
    /// Every source is off or failed to attach, the tick included.
    #[error("no sense source could start (and sense.poll is off): {0}")]
    NoSources(String),
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
    thresholds: MemcgThresholds,
    charge_switch: Option<ChargeSwitch>,
    kernel_watch: KernelWatch,
    victim_stage: Option<VictimStage>,
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
        let attaching = Attaching::start(opts, tx);
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
    pub(crate) fn kernel_record_waiting(&self) -> bool {
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
    pub fn charge_switch(&self) -> Option<ChargeSwitch> {
        self.charge_switch.clone()
    }

    /// Which watched cgroups the eBPF charge programs check at their working-set level right
    /// now ([`ebpf::kernel_watch`]); watches nothing without them.
    pub fn kernel_watch(&self) -> KernelWatch {
        self.kernel_watch.clone()
    }

    /// Where the loop stages the pod it would evict first, for the charge program to kill at
    /// a hard threshold's crossing ([`ebpf::stage`]); `None` without the charge programs.
    pub(crate) fn victim_stage(&self) -> Option<VictimStage> {
        self.victim_stage.clone()
    }

    /// The memcg usage thresholds armed, to move while running (see
    /// [`MemcgThresholds`]).
    pub fn memcg_thresholds(&self) -> MemcgThresholds {
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
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::sense::{Kind, MemcgTarget, MemoryHierarchy, SenseOptions};

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
}
