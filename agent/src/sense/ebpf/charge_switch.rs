//! Taking the charge programs off their tracepoint while a victim the agent killed is torn
//! down, and putting them back before the loop looks again.
//!
//! The charge program's raw tracepoint (`mod_memcg_lruvec_state`) fires on every per-node
//! memcg stat update, decreases included, and a victim's teardown gives each page back with
//! two of them: measured here, 154,284 hits for one 300 MiB process (2.0 per 4 KiB page),
//! 47 ns of program per hit by `kernel.bpf_stats_enabled` (7.3 ms per teardown). The program
//! returns at once on a decrease, but the kernel's dispatch to it runs on every hit all the
//! same: SIGKILL → exit of the 300 MiB process took 28.2 ms with the program attached
//! against 22.4 ms with the agent's other programs alone (p50 of 10 each, taken in turns).
//! A tracepoint with no program costs nothing (a static branch), so the reactor takes the
//! program off from its kill until the victim's cgroup is empty.
//!
//! Detaching is a syscall in which the kernel repatches the tracepoint's branch (0.6–0.7 ms
//! here from the ask to the program off, the thread's wake-up included), so it runs on a
//! thread of its own, asked just before the kill ([`ChargeSwitch::pause`] only queues it):
//! the kill and the reap in the loop's thread never wait for it. Putting the program back
//! waits ([`ChargeSwitch::resume`], about 0.35 ms here): the loop re-observes at once after
//! the release, and the program must be there by then. The release the loop records is
//! taken before it.
//!
//! What sees a crossing while the program is off: nothing would act on one, since the loop
//! waits for the victim's cgroup to empty before its next pass; that pass reads the signals
//! themselves, so a threshold met by then is acted on, and one met later is seen by the
//! program, back in place (a slot armed when it went off fires at the first charge batch at
//! or above its level; a slot that had fired re-arms at the first one below its re-arm
//! level). The OOM programs, the memcg notification and PSI stay on throughout.
//!
//! The same switch takes the programs off while no watched cgroup is near its level
//! ([`super::near`]): they are on their tracepoint when a watched cgroup is near *and* no
//! pause is asked, so the reactor's pause and resume keep their meaning (resume puts them
//! back only if they are wanted near a level).
//!
//! **The memcg events program.** `count_memcg_events` is entered on every page fault (the
//! kernel counts `PGFAULT` per memcg through it), about 2 runs per fault, only to find each
//! time that the item is not watched: bench part 7 puts the node at 0.98 of the no-eBPF
//! fault rate with it on and nothing else. The items it reports (scanning, stealing, swap-out, major faults) mean
//! pressure only while memory is being reclaimed, so with
//! [`EbpfOptions::memcg_events_on_reclaim`](super::EbpfOptions::memcg_events_on_reclaim)
//! the same thread attaches it when the drain sees a reclaim stall record
//! ([`ChargeSwitch::reclaim_seen`]) and takes it off again once no stall has come for the
//! hold time. What that misses: the first stall's own scans (the program comes a stall record
//! and one attach later) and kswapd's scanning while no task stalls; the stall records
//! themselves, from the reclaim tracepoints, are never gated.

use std::sync::{mpsc, Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use aya::programs::raw_trace_point::RawTracePointLinkId;
use aya::programs::RawTracePoint;
use aya::Ebpf;

use super::kernel_watch::KernelWatch;

/// How long [`ChargeSwitch::resume`] waits for the programs to be back.
const RESUME_WAIT: Duration = Duration::from_secs(2);

/// The loaded programs, and each charge program's tracepoint and link while it is attached.
pub struct Programs {
    pub(crate) ebpf: Ebpf,
    pub(crate) charge: Vec<ChargeLink>,
    /// `count_memcg_events`, when it attaches only on reclaim (empty when it stays attached).
    pub(crate) events: Vec<ChargeLink>,
    /// A pause is asked (the reactor is tearing a victim down).
    pub(crate) paused: bool,
    /// A watched cgroup is near its level (always, without arming near a level).
    pub(crate) near: bool,
    /// Told whether the charge programs are on (for the loop's close watch).
    pub(crate) kernel_watch: KernelWatch,
}

/// Why the programs were not switched; each names the program at fault.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    /// The object has no such program (agent/object mismatch).
    #[error("{0}: not in the object")]
    NotInObject(&'static str),
    /// The program is not a raw tracepoint program.
    #[error("{program}: {source}")]
    Program {
        /// The program.
        program: &'static str,
        /// aya's reason.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// The kernel refused to attach it.
    #[error("{program}: attach failed: {source}")]
    Attach {
        /// The program.
        program: &'static str,
        /// aya's reason.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// The kernel refused to detach it.
    #[error("{program}: detach failed: {source}")]
    Detach {
        /// The program.
        program: &'static str,
        /// aya's reason.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// The switch's thread has stopped.
    #[error("the charge switch's thread is gone")]
    ThreadGone,
    /// The eBPF source (and its programs) is gone.
    #[error("the eBPF source is gone")]
    SourceGone,
    /// The programs were not back on their tracepoint in time.
    #[error("charge programs not back within {0:?}")]
    NotBack(Duration),
}

/// One charge program: its name in the object, its raw tracepoint, its link when attached.
pub(crate) struct ChargeLink {
    pub(crate) program: &'static str,
    pub(crate) tracepoint: &'static str,
    pub(crate) link: Option<RawTracePointLinkId>,
}

impl Programs {
    /// Attaches (`on`) or detaches every charge program that is not so already.
    /// The kernel watch hears "off" before a detach and "on" only after an attach.
    fn set(&mut self, on: bool) -> Result<(), SwitchError> {
        if !on {
            self.kernel_watch.set_attached(false);
        }
        let Programs { ebpf, charge, .. } = self;
        let result = set_links(ebpf, charge, on);
        self.tell_watch();
        result
    }

    /// Tells the kernel watch whether the charge programs are on their tracepoint now.
    pub(crate) fn tell_watch(&self) {
        self.kernel_watch
            .set_attached(!self.charge.is_empty() && self.attached());
    }

    /// Attaches (`on`) or detaches the memcg events program when it is switched.
    fn set_events(&mut self, on: bool) -> Result<(), SwitchError> {
        let Programs { ebpf, events, .. } = self;
        set_links(ebpf, events, on)
    }

    /// Does what `ask` asks: the memcg events program on for a reclaim stall; otherwise the
    /// charge programs on when wanted near a level and no pause holds them off.
    fn apply(&mut self, ask: &Ask) -> Result<(), SwitchError> {
        match ask {
            Ask::Reclaim => return self.set_events(true),
            Ask::Off => self.paused = true,
            Ask::On(_) => self.paused = false,
            Ask::Near(near) => self.near = *near,
        }
        self.set(self.near && !self.paused)
    }

    fn attached(&self) -> bool {
        self.charge.iter().all(|c| c.link.is_some())
    }
}

/// Attaches (`on`) or detaches every program of `links` that is not so already.
fn set_links(ebpf: &mut Ebpf, links: &mut [ChargeLink], on: bool) -> Result<(), SwitchError> {
    for c in links {
        let program: &mut RawTracePoint = ebpf
            .program_mut(c.program)
            .ok_or(SwitchError::NotInObject(c.program))?
            .try_into()
            .map_err(|source| SwitchError::Program {
                program: c.program,
                source,
            })?;
        match (on, c.link.take()) {
            (true, None) => {
                c.link =
                    Some(
                        program
                            .attach(c.tracepoint)
                            .map_err(|source| SwitchError::Attach {
                                program: c.program,
                                source,
                            })?,
                    );
            }
            (false, Some(link)) => program.detach(link).map_err(|source| SwitchError::Detach {
                program: c.program,
                source,
            })?,
            (_, link) => c.link = link,
        }
    }
    Ok(())
}

enum Ask {
    Off,
    On(mpsc::SyncSender<Result<(), SwitchError>>),
    Near(bool),
    Reclaim,
}

/// Takes the charge programs off their tracepoint and puts them back (see the module doc).
/// Cheap to clone; it does not keep the programs loaded: once the eBPF source is gone it
/// does nothing.
#[derive(Clone, Debug)]
pub struct ChargeSwitch {
    tx: mpsc::Sender<Ask>,
    programs: Weak<Mutex<Programs>>,
}

impl ChargeSwitch {
    /// A switch over `programs`, with the thread that detaches them. `None` when the
    /// thread cannot be started (the programs then simply stay attached).
    /// `events_hold`: how long the memcg events program stays after the last reclaim stall.
    pub fn new(programs: &Arc<Mutex<Programs>>, events_hold: Duration) -> Option<ChargeSwitch> {
        let (tx, rx) = mpsc::channel();
        let weak = Arc::downgrade(programs);
        let served = weak.clone();
        let spawned = std::thread::Builder::new()
            .name("ebpf-charge-switch".into())
            .spawn(move || serve(&served, &rx, events_hold));
        match spawned {
            Ok(_) => Some(ChargeSwitch { tx, programs: weak }),
            Err(e) => {
                tracing::warn!(error = %e, "eBPF: charge programs cannot be paused (no thread)");
                None
            }
        }
    }

    /// Asks for the charge programs to come off their tracepoint; returns at once (the
    /// switch's thread detaches them).
    pub fn pause(&self) {
        let _ = self.tx.send(Ask::Off);
    }

    /// Puts the charge programs back (when they are wanted near a level) and waits until
    /// they are (at most 2 s). `Err` says why they are not.
    pub fn resume(&self) -> Result<(), SwitchError> {
        let (ack, done) = mpsc::sync_channel(1);
        self.tx
            .send(Ask::On(ack))
            .map_err(|_| SwitchError::ThreadGone)?;
        done.recv_timeout(RESUME_WAIT)
            .map_err(|_| SwitchError::NotBack(RESUME_WAIT))?
    }

    /// Says whether a watched cgroup is near its level; returns at once (the switch's thread
    /// attaches or detaches the programs, unless a pause holds them off).
    pub fn near(&self, near: bool) {
        let _ = self.tx.send(Ask::Near(near));
    }

    /// Says that a reclaim stall was seen; returns at once (the switch's thread attaches the
    /// memcg events program, when it is switched, and keeps it for the hold time).
    pub(crate) fn reclaim_seen(&self) {
        let _ = self.tx.send(Ask::Reclaim);
    }

    /// Whether the memcg events program is on its tracepoint now: `None` when it is not
    /// switched (attached throughout, or not at all) or the eBPF source is gone.
    pub fn memcg_events_attached(&self) -> Option<bool> {
        let programs = self.programs.upgrade()?;
        let programs = programs.lock().unwrap_or_else(PoisonError::into_inner);
        (!programs.events.is_empty()).then(|| programs.events.iter().all(|c| c.link.is_some()))
    }

    /// Whether every charge program is on its tracepoint now; `None` once the eBPF source
    /// is gone.
    pub fn attached(&self) -> Option<bool> {
        let programs = self.programs.upgrade()?;
        let programs = programs.lock().unwrap_or_else(PoisonError::into_inner);
        Some(programs.attached())
    }
}

/// The switch's thread: does what is asked, in order, until every switch is dropped; takes
/// the memcg events program off when `hold` has passed since the last reclaim stall.
fn serve(programs: &Weak<Mutex<Programs>>, rx: &mpsc::Receiver<Ask>, hold: Duration) {
    // The memcg events program starts off (it attached at load only to prove it can).
    let mut events_until: Option<Instant> = None;
    let set_events = |on: bool| {
        let Some(p) = programs.upgrade() else {
            return;
        };
        let mut p = p.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = p.set_events(on) {
            tracing::warn!(error = %e, on, "eBPF: memcg events program not switched");
        }
    };
    set_events(false);
    loop {
        let ask = match events_until {
            Some(until) => match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(ask) => ask,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    events_until = None;
                    set_events(false);
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            },
            None => match rx.recv() {
                Ok(ask) => ask,
                Err(_) => break,
            },
        };
        let result = match programs.upgrade() {
            Some(p) => {
                if let Ask::Reclaim = ask {
                    events_until = Some(Instant::now() + hold);
                }
                p.lock().unwrap_or_else(PoisonError::into_inner).apply(&ask)
            }
            None => {
                events_until = None;
                Err(SwitchError::SourceGone)
            }
        };
        match ask {
            Ask::On(ack) => {
                let _ = ack.send(result);
            }
            Ask::Off => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "eBPF: charge programs not paused");
                }
            }
            Ask::Near(near) => {
                if let Err(e) = result {
                    tracing::warn!(error = %e, near, "eBPF: charge programs not switched");
                }
            }
            Ask::Reclaim => {
                if let Err(e) = result {
                    tracing::warn!(error = %e, "eBPF: memcg events program not attached on reclaim");
                }
            }
        }
    }
}
