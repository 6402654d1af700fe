//! Arming the charge programs only near a level: on a calm node they are off their
//! tracepoint, which then costs nothing (a tracepoint with no program is a static branch).
//!
//! The charge programs' raw tracepoint (`mod_memcg_lruvec_state`) is entered 2–4 times per
//! page fault on every process of the node, watched or not (issue 26 measured 0.76 of the
//! no-eBPF fault rate with them on). They are needed only when a watched cgroup's **working
//! set** (`usage - inactive_file`, what eviction compares) can reach its level before the
//! loop looks again. Page cache alone never arms them: a node whose memory has filled with
//! cache, as every Linux node's does within hours, is a calm node. Each look places a watched
//! cgroup in one of three states ([`Arming`], decided by [`assess`]):
//!
//! - **Far**: usage itself is more than `reach` below the level. Usage is never below the
//!   working set, so nothing but a charge can bring the working set near, and a tripwire on
//!   usage at `level - reach` sees every charge: it cannot be jumped.
//! - **Cached**: usage is within reach, but only because of page cache; the working set is
//!   not. Three things can raise the working set from here, each seen without a per-fault
//!   cost: new charges that fit under the limit raise usage, so the tripwire moves to
//!   `level - reach + inactive_file`; charges at the limit reclaim the cache (usage stays,
//!   inactive falls), and the reclaim stall records the drain already reads wake a look
//!   (at most one per [`NearLevel::poll_interval`]); activation (inactive → active, usage
//!   unchanged) has no event, so a look every [`NearLevel::cache_look`] bounds it. A look
//!   reads `memory.stat` once per watched cgroup (tens of microseconds).
//! - **Near**: the working set is within reach: the programs attach, and stay on until it
//!   falls [`DISARM_HYSTERESIS_BYTES`] below the tripwire again. While on, a look reads the
//!   page cache the kernel follows in the slot (a root slot's from `memory.stat`).
//!
//! - **How far below.** `reach` is the working set's recent growth rate times
//!   [`NearLevel::lead`], at least [`NearLevel::reach_floor_bytes`]: attaching takes about
//!   0.35 ms here (the kernel repatches the tracepoint's branch) plus the wake-up, so the
//!   default floor of 64 MiB leaves 60 ms of margin at 1 GiB/s. The cache look bounds
//!   activation: a burst that activates more than `reach` of page cache within one
//!   `cache_look` while a hog is charging can cross with the programs off; the loop's memcg
//!   notification, PSI and housekeeping still see it, and the look after it attaches the
//!   programs with every slot armed, so the next charge writes the record.
//! - **How it wakes.** On cgroup v1 an eventfd on `memory.usage_in_bytes` at the tripwire
//!   (the kernel signals crossings both ways); where there is none (v2) usage is read every
//!   [`NearLevel::poll_interval`] and compared with the tripwire from the last `memory.stat`
//!   read, which is read again only when usage passes it. While armed, the look runs at that
//!   interval too, to detach. Registering a v1 tripwire waits for an RCU grace period in the
//!   kernel (`synchronize_rcu`, 10-30 ms under load), so it runs on a blocking thread, never
//!   on the runtime the drain and the reactor loop share; the old registration stays until
//!   the new one is in place, and the look that follows its landing reads usage again (a
//!   crossing of the new tripwire during the wait is not signalled). A registration that
//!   usage has passed (the page cache grew under it) is spent and placed again. It is placed
//!   only while off: on the way to a crossing the drain must hand the kernel's threshold
//!   record on at once (a first version re-placed it on every look while armed, on the
//!   drain's thread, and delayed eBPF-woken kills by 11-36 ms at 1 GiB/s).
//!
//! The programs do not follow the page cache while they are off, so a working-set slot is
//! written again (its `inactive_file` read anew) just before they attach, armed even where the
//! working set is past its level already (a crossing while off): the next charge writes the
//! record that wakes the loop.

use std::future::Future as _;
use std::os::fd::{AsFd as _, OwnedFd};
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;

use crate::sense::memcg::V1Registration;

/// Arming the charge programs only while a watched cgroup's working set is near its level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NearLevel {
    /// The least distance below a level at which the programs attach.
    pub reach_floor_bytes: u64,
    /// How far ahead of the working set's recent growth the programs attach.
    pub lead: Duration,
    /// How often usage is read where the kernel cannot notify (v2), and while armed; also
    /// the least time between two looks woken by reclaim.
    pub poll_interval: Duration,
    /// How often a cgroup within reach only by its page cache ([`Arming::Cached`]) is looked
    /// at again: the bound on activation, which no event reports.
    pub cache_look: Duration,
}

impl Default for NearLevel {
    fn default() -> Self {
        NearLevel {
            reach_floor_bytes: 64 << 20,
            lead: Duration::from_millis(100),
            poll_interval: Duration::from_millis(10),
            cache_look: Duration::from_millis(100),
        }
    }
}

/// Where one watched cgroup stands, as a look found it (see the module's doc); ordered from
/// far to near.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Arming {
    /// Usage alone is out of reach of the level.
    Far,
    /// Usage is within reach only by its page cache; the working set is not.
    Cached,
    /// The working set is within reach (or could not be read): the programs are wanted on.
    Near,
}

impl Arming {
    /// A word for `reactor status`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Arming::Far => "far",
            Arming::Cached => "cached",
            Arming::Near => "near",
        }
    }
}

/// Where a cgroup with `usage` and `inactive_file` bytes of inactive file pages stands
/// against `level` (a working-set level; a usage level leaves out no page cache: pass 0),
/// with the programs `on` or off now: usage decides [`Arming::Far`] by itself, the working
/// set decides [`Arming::Near`]. Both comparisons keep [`DISARM_HYSTERESIS_BYTES`] on the way
/// down while the programs are on.
pub(crate) fn assess(usage: u64, inactive_file: u64, level: u64, reach: u64, on: bool) -> Arming {
    let floor = level.saturating_sub(reach);
    if !is_near(usage, floor, on) {
        Arming::Far
    } else if is_near(usage.saturating_sub(inactive_file), floor, on) {
        Arming::Near
    } else {
        Arming::Cached
    }
}

/// The usage at which a cgroup in state `arming` must be looked at again: `level - reach`
/// while far (usage alone), `level - reach + inactive_file` while cached (the working set
/// reaching `level - reach` by a charge under the limit).
pub(crate) fn usage_tripwire(arming: Arming, level: u64, reach: u64, inactive_file: u64) -> u64 {
    let floor = level.saturating_sub(reach);
    match arming {
        Arming::Far => floor,
        Arming::Cached | Arming::Near => floor.saturating_add(inactive_file),
    }
}

/// How far below the tripwire usage must fall before the programs come off again, so usage
/// hovering at the tripwire does not attach and detach them over and over.
pub(crate) const DISARM_HYSTERESIS_BYTES: u64 = 4 << 20;

/// The least move worth a new v1 tripwire registration: each one waits for an RCU grace
/// period in the kernel (see `memcg::V1_MOVE_STEP_BYTES`).
const TRIPWIRE_STEP_BYTES: u64 = 8 << 20;

/// The shortest interval a growth rate is taken over ([`Tripwire::sample`]): the agent's
/// 10 ms poll.
pub(crate) const RATE_WINDOW: Duration = Duration::from_millis(10);

/// The distance below a level at which the programs attach, for a working set growing at
/// `rate_bytes_per_s`.
pub(crate) fn reach(rate_bytes_per_s: f64, near: &NearLevel) -> u64 {
    let ahead = rate_bytes_per_s.max(0.0) * near.lead.as_secs_f64();
    (ahead as u64).max(near.reach_floor_bytes)
}

/// Whether usage is near a level whose tripwire is at `tripwire`: at or above it, or, for
/// programs on already, not yet [`DISARM_HYSTERESIS_BYTES`] below it.
pub(crate) fn is_near(usage: u64, tripwire: u64, on: bool) -> bool {
    if on {
        usage.saturating_add(DISARM_HYSTERESIS_BYTES) >= tripwire
    } else {
        usage >= tripwire
    }
}

/// One watched cgroup's tripwire: its eventfd (v1), where it is registered, and the usage's
/// recent growth.
#[derive(Debug, Default)]
pub(crate) struct Tripwire {
    eventfd: Option<AsyncFd<OwnedFd>>,
    /// The file the eventfd is registered on; kept open for as long as the registration.
    _watched: Option<OwnedFd>,
    registered: Option<u64>,
    /// A registration under way on a blocking thread.
    placing: Option<V1Registration>,
    last: Option<(u64, Instant)>,
    /// Growth rate, bytes/s: the last sample's, or the earlier one decaying (half a second
    /// half-life), whichever is more.
    rate: f64,
    /// The cgroup's inactive file pages at the last read, bytes.
    pub(crate) inactive: u64,
    /// Where the last look found the cgroup.
    pub(crate) arming: Arming,
}

impl Default for Arming {
    /// Before the first look: nothing known, nothing waited on.
    fn default() -> Self {
        Arming::Far
    }
}

impl Tripwire {
    /// The growth rate at the last sample, bytes/s.
    pub(crate) fn rate(&self) -> f64 {
        self.rate
    }

    /// Takes a working-set sample and returns the growth rate. A sample less than
    /// [`RATE_WINDOW`] after the one the rate was last taken from leaves both as they are:
    /// over a few milliseconds the working set moves in bursts (a process dropping and
    /// faulting a region again, a reclaim batch), and a burst over a short interval reads as
    /// a growth rate of gigabytes a second, a reach of hundreds of MiB, and the programs on
    /// for nothing (seen in bench part 7's page-cache setup once looks came a millisecond
    /// apart).
    pub(crate) fn sample(&mut self, usage: u64, now: Instant) -> f64 {
        if let Some((was, at)) = self.last {
            let dt = now.saturating_duration_since(at);
            if dt < RATE_WINDOW {
                return self.rate;
            }
            let dt = dt.as_secs_f64();
            let inst = usage.saturating_sub(was) as f64 / dt;
            let decayed = self.rate * 0.5f64.powf(dt / 0.5);
            self.rate = inst.max(decayed);
        }
        self.last = Some((usage, now));
        self.rate
    }

    /// Starts registering (or moving) the v1 eventfd at `tripwire` on `dir`, with `usage`
    /// now, on a blocking thread ([`needs_placing`] says when); a no-op while another
    /// registration is under way (the look after it lands moves it again if need be), or
    /// where there is no v1 usage file (then the poll covers it). [`wake`] returns when it
    /// lands.
    pub(crate) fn place(&mut self, dir: &Path, tripwire: u64, usage: u64) {
        if self.placing.is_some() || !needs_placing(self.registered, tripwire, usage) {
            return;
        }
        if !dir.join("memory.usage_in_bytes").exists() {
            return;
        }
        self.placing = Some(V1Registration::start(dir, tripwire));
    }

    /// Takes the registration under way once it has landed (its eventfd replaces the old
    /// one; on failure usage is polled): `Ready` then, `Pending` while none has.
    fn poll_placed(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(placing) = &mut self.placing else {
            return Poll::Pending;
        };
        let Poll::Ready(landed) = Pin::new(&mut *placing).poll(cx) else {
            return Poll::Pending;
        };
        let tripwire = placing.bytes();
        let dir = placing.dir().display().to_string();
        self.placing = None;
        match landed {
            Ok((efd, watched)) => {
                self.eventfd = Some(efd);
                self._watched = Some(watched);
                self.registered = Some(tripwire);
            }
            Err(e) => {
                tracing::warn!(%dir, error = %e, "eBPF: tripwire not placed; usage is polled");
                self.eventfd = None;
                self._watched = None;
                self.registered = None;
            }
        }
        Poll::Ready(())
    }

    /// Whether this tripwire needs the poll: no eventfd, or one being moved (the old one
    /// stays registered at the old level meanwhile, and a crossing of the new level during
    /// the registration is not signalled).
    pub(crate) fn polled(&self) -> bool {
        self.eventfd.is_none() || self.placing.is_some()
    }
}

/// Whether a v1 tripwire registered at `registered` must be placed (again) at `tripwire`
/// with `usage` now: none is registered, it is a step or more away, or usage has passed it
/// (the page cache grew under it: the kernel signals only a crossing, and usage is past
/// that one already).
pub(crate) fn needs_placing(registered: Option<u64>, tripwire: u64, usage: u64) -> bool {
    match registered {
        None => true,
        Some(r) => r.abs_diff(tripwire) >= TRIPWIRE_STEP_BYTES || (usage >= r && r != tripwire),
    }
}

/// What woke a look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Woke {
    /// The poll: usage alone is read, `memory.stat` only where usage passed the tripwire.
    Poll,
    /// A tripwire's eventfd, a registration's landing or the cache look: every watched
    /// cgroup's page cache is read anew.
    Deep,
}

/// Waits for a tripwire's eventfd, a tripwire's registration to land, the cache look when
/// `cache` is given, or `tick` when `poll` is set; never returns when there is nothing to
/// wait for.
pub(crate) async fn wake(
    wires: &mut [Tripwire],
    tick: &mut tokio::time::Interval,
    poll: bool,
    cache: Option<&mut tokio::time::Interval>,
) -> Woke {
    let mut cache = cache;
    std::future::poll_fn(|cx| {
        for w in wires.iter_mut() {
            if w.poll_placed(cx).is_ready() {
                return Poll::Ready(Woke::Deep);
            }
            let Some(fd) = &w.eventfd else { continue };
            if let Poll::Ready(Ok(mut guard)) = fd.poll_read_ready(cx) {
                let mut buf = [0u8; 8];
                // Clears the eventfd's counter; a failure only means it was clear already.
                let _ = rustix::io::read(fd.get_ref().as_fd(), &mut buf);
                guard.clear_ready();
                return Poll::Ready(Woke::Deep);
            }
        }
        if let Some(c) = cache.as_deref_mut() {
            if c.poll_tick(cx).is_ready() {
                return Poll::Ready(Woke::Deep);
            }
        }
        if poll && tick.poll_tick(cx).is_ready() {
            return Poll::Ready(Woke::Poll);
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reach_follows_growth_with_a_floor() {
        let near = NearLevel::default();
        assert_eq!(reach(0.0, &near), 64 << 20);
        assert_eq!(reach(-5.0, &near), 64 << 20);
        // 1 GiB/s with a 100 ms lead: about 102 MiB.
        let r = reach((1u64 << 30) as f64, &near);
        assert!((100 << 20..=103 << 20).contains(&r), "{r}");
    }

    #[test]
    fn near_has_a_hysteresis_on_the_way_down() {
        let trip = 100 << 20;
        assert!(!is_near(99 << 20, trip, false));
        assert!(is_near(100 << 20, trip, false));
        assert!(is_near(97 << 20, trip, true), "on, within the hysteresis");
        assert!(!is_near(95 << 20, trip, true));
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn page_cache_alone_never_brings_a_cgroup_near() {
        let (level, reach) = (924 * MIB, 64 * MIB);
        // The node: kubepods at its limit, 994 of 1,022 MiB inactive file.
        assert_eq!(
            assess(1022 * MIB, 994 * MIB, level, reach, false),
            Arming::Cached
        );
        // The same usage, the cache reclaimed under a hog: the working set is within reach.
        assert_eq!(
            assess(1022 * MIB, 150 * MIB, level, reach, false),
            Arming::Near
        );
        // Usage out of reach: far, whatever the page cache.
        assert_eq!(assess(800 * MIB, 0, level, reach, false), Arming::Far);
        assert_eq!(
            assess(800 * MIB, 700 * MIB, level, reach, false),
            Arming::Far
        );
        // A usage level leaves out no page cache: within reach is near.
        assert_eq!(assess(900 * MIB, 0, level, reach, false), Arming::Near);
    }

    #[test]
    fn the_working_set_keeps_the_hysteresis_on_the_way_down() {
        let (level, reach) = (200 * MIB, 64 * MIB);
        // Working set 136 MiB = level - reach: near; 2 MiB under it: near only while on.
        assert_eq!(
            assess(300 * MIB, 164 * MIB, level, reach, false),
            Arming::Near
        );
        assert_eq!(
            assess(300 * MIB, 166 * MIB, level, reach, false),
            Arming::Cached
        );
        assert_eq!(
            assess(300 * MIB, 166 * MIB, level, reach, true),
            Arming::Near
        );
        assert_eq!(
            assess(300 * MIB, 169 * MIB, level, reach, true),
            Arming::Cached
        );
    }

    #[test]
    fn the_tripwire_counts_the_page_cache_only_once_usage_is_within_reach() {
        let (level, reach) = (200 * MIB, 64 * MIB);
        assert_eq!(
            usage_tripwire(Arming::Far, level, reach, 500 * MIB),
            136 * MIB
        );
        assert_eq!(
            usage_tripwire(Arming::Cached, level, reach, 500 * MIB),
            636 * MIB,
            "a charge under the limit that raises usage past it raises the working set \
             to level - reach"
        );
        assert_eq!(usage_tripwire(Arming::Far, 10 * MIB, reach, 0), 0);
    }

    #[test]
    fn a_registration_usage_has_passed_is_placed_again() {
        assert!(needs_placing(None, 100 * MIB, 0));
        assert!(
            !needs_placing(Some(100 * MIB), 104 * MIB, 90 * MIB),
            "within a step"
        );
        assert!(
            needs_placing(Some(100 * MIB), 108 * MIB, 90 * MIB),
            "a step away"
        );
        assert!(
            needs_placing(Some(100 * MIB), 104 * MIB, 101 * MIB),
            "usage passed the registered level: the kernel will not signal it again"
        );
        assert!(
            !needs_placing(Some(100 * MIB), 100 * MIB, 101 * MIB),
            "the same level"
        );
    }

    #[test]
    fn growth_is_sampled_and_decays() {
        let mut w = Tripwire::default();
        let t0 = Instant::now();
        assert_eq!(w.sample(0, t0), 0.0);
        let r = w.sample(100 << 20, t0 + Duration::from_millis(100));
        assert!((r - 1048576000.0).abs() < 1.0, "{r}");
        // Flat for half a second: half of it is left.
        let r = w.sample(100 << 20, t0 + Duration::from_millis(600));
        assert!((r - 524288000.0).abs() < 1e3, "{r}");
        // A 4 MiB burst a millisecond later is no growth rate of 4 GiB/s: the rate is taken
        // over the window from the last sample it used.
        let r = w.sample(104 << 20, t0 + Duration::from_millis(601));
        assert!((r - 524288000.0).abs() < 1e3, "{r}");
        let r = w.sample(104 << 20, t0 + Duration::from_millis(700));
        let decayed = 524288000.0 * 0.5f64.powf(0.2);
        let grown = f64::from(4u32 << 20) / 0.1;
        assert!((r - decayed.max(grown)).abs() < 1e3, "{r}");
    }
}
