//! Arming the charge programs only near a level: on a calm node they are off their
//! tracepoint, which then costs nothing (a tracepoint with no program is a static branch).
//!
//! The charge programs' raw tracepoint (`mod_memcg_lruvec_state`) is entered 2–4 times per
//! page fault on every process of the node, watched or not (issue 26 measured 0.76 of the
//! no-eBPF fault rate with them on). They are needed only when a watched cgroup's working set
//! can reach its level before the loop looks again, so a tripwire below the level attaches
//! them:
//!
//! - **Where.** Usage is never below the working set (`usage - inactive_file`), so usage
//!   reaching `level - reach` is necessary before the working set can reach the level: the
//!   tripwire compares usage alone, without the page cache added, and cannot be passed by a
//!   crossing. (With much page cache, usage sits above the tripwire and the programs stay on:
//!   the safe side.)
//! - **How far below.** `reach` is the usage's recent growth rate times
//!   [`NearLevel::lead`], at least [`NearLevel::reach_floor_bytes`]: attaching takes about
//!   0.35 ms here (the kernel repatches the tracepoint's branch) plus the wake-up, so the
//!   default floor of 64 MiB leaves 60 ms of margin at 1 GiB/s.
//! - **How it wakes.** On cgroup v1 an eventfd on `memory.usage_in_bytes` at the tripwire
//!   (the kernel signals crossings both ways); where there is none (v2) usage is read every
//!   [`NearLevel::poll_interval`]. While armed, usage is also read at that interval, to
//!   detach once it falls [`DISARM_HYSTERESIS_BYTES`] below the tripwire. Registering a v1
//!   tripwire waits for an RCU grace period in the kernel (`synchronize_rcu`, 10-30 ms under
//!   load), so it runs on a blocking thread, never on the runtime the drain and the reactor
//!   loop share; the old registration stays until the new one is in place, and the look that
//!   follows its landing reads usage again (a crossing of the new tripwire during the wait is
//!   not signalled). It is placed only while calm: on the way to a crossing the drain must
//!   hand the kernel's threshold record on at once (a first version re-placed it on every look
//!   while armed, on the drain's thread, and delayed eBPF-woken kills by 11-36 ms at
//!   1 GiB/s).
//!
//! The programs do not follow the page cache while they are off, so a working-set slot is
//! written again (its `inactive_file` read anew) just before they attach.

use std::future::Future as _;
use std::os::fd::{AsFd as _, OwnedFd};
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;

use crate::sense::memcg::V1Registration;

/// Arming the charge programs only while a watched cgroup is near its level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NearLevel {
    /// The least distance below a level at which the programs attach.
    pub reach_floor_bytes: u64,
    /// How far ahead of the usage's recent growth the programs attach.
    pub lead: Duration,
    /// How often usage is read where the kernel cannot notify (v2), and while armed.
    pub poll_interval: Duration,
}

impl Default for NearLevel {
    fn default() -> Self {
        NearLevel {
            reach_floor_bytes: 64 << 20,
            lead: Duration::from_millis(100),
            poll_interval: Duration::from_millis(10),
        }
    }
}

/// How far below the tripwire usage must fall before the programs come off again, so usage
/// hovering at the tripwire does not attach and detach them over and over.
pub const DISARM_HYSTERESIS_BYTES: u64 = 4 << 20;

/// The least move worth a new v1 tripwire registration: each one waits for an RCU grace
/// period in the kernel (see `memcg::V1_MOVE_STEP_BYTES`).
const TRIPWIRE_STEP_BYTES: u64 = 8 << 20;

/// The distance below a level at which the programs attach, for usage growing at
/// `rate_bytes_per_s`.
pub fn reach(rate_bytes_per_s: f64, near: &NearLevel) -> u64 {
    let ahead = rate_bytes_per_s.max(0.0) * near.lead.as_secs_f64();
    (ahead as u64).max(near.reach_floor_bytes)
}

/// Whether usage is near a level whose tripwire is at `tripwire`: at or above it, or, for
/// programs on already, not yet [`DISARM_HYSTERESIS_BYTES`] below it.
pub fn is_near(usage: u64, tripwire: u64, on: bool) -> bool {
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
}

impl Tripwire {
    /// Takes a usage sample and returns the growth rate.
    pub(crate) fn sample(&mut self, usage: u64, now: Instant) -> f64 {
        if let Some((was, at)) = self.last {
            let dt = now.saturating_duration_since(at).as_secs_f64();
            if dt > 0.0 {
                let inst = usage.saturating_sub(was) as f64 / dt;
                let decayed = self.rate * 0.5f64.powf(dt / 0.5);
                self.rate = inst.max(decayed);
            }
        }
        self.last = Some((usage, now));
        self.rate
    }

    /// Starts registering (or moving) the v1 eventfd at `tripwire` on `dir`, on a blocking
    /// thread; a no-op within a step of where it is, while another registration is under way
    /// (the look after it lands moves it again if need be), or where there is no v1 usage
    /// file (then the poll covers it). [`wake`] returns when it lands.
    pub(crate) fn place(&mut self, dir: &Path, tripwire: u64) {
        if self.placing.is_some() || !dir.join("memory.usage_in_bytes").exists() {
            return;
        }
        if self
            .registered
            .is_some_and(|r| r.abs_diff(tripwire) < TRIPWIRE_STEP_BYTES)
        {
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

    /// `computed`, or the registered tripwire where that is lower: the level whose crossing
    /// the kernel signals.
    pub(crate) fn lowest(&self, computed: u64) -> u64 {
        match (&self.eventfd, self.registered) {
            (Some(_), Some(r)) => r.min(computed),
            _ => computed,
        }
    }

    /// Whether this tripwire needs the poll: no eventfd, or one being moved (the old one
    /// stays registered at the old level meanwhile, and a crossing of the new level during
    /// the registration is not signalled).
    pub(crate) fn polled(&self) -> bool {
        self.eventfd.is_none() || self.placing.is_some()
    }
}

/// Waits for a tripwire's eventfd, a tripwire's registration to land, or `tick` when `poll`
/// is set; never returns when there is nothing to wait for.
pub(crate) async fn wake(wires: &mut [Tripwire], tick: &mut tokio::time::Interval, poll: bool) {
    std::future::poll_fn(|cx| {
        for w in wires.iter_mut() {
            if w.poll_placed(cx).is_ready() {
                return Poll::Ready(());
            }
            let Some(fd) = &w.eventfd else { continue };
            if let Poll::Ready(Ok(mut guard)) = fd.poll_read_ready(cx) {
                let mut buf = [0u8; 8];
                // Clears the eventfd's counter; a failure only means it was clear already.
                let _ = rustix::io::read(fd.get_ref().as_fd(), &mut buf);
                guard.clear_ready();
                return Poll::Ready(());
            }
        }
        if poll && tick.poll_tick(cx).is_ready() {
            return Poll::Ready(());
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

    #[test]
    fn the_lowest_tripwire_is_the_registered_one_only_with_an_eventfd() {
        let mut w = Tripwire {
            registered: Some(100),
            ..Tripwire::default()
        };
        assert_eq!(
            w.lowest(101),
            101,
            "no eventfd: nothing signals at the registered level"
        );
        let (a, _b) = std::os::unix::net::UnixStream::pair()
            .expect("a socket pair stands in for the eventfd");
        a.set_nonblocking(true).expect("non-blocking");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .expect("runtime");
        let _entered = rt.enter();
        w.eventfd = Some(
            crate::sense::register_fd(OwnedFd::from(a), tokio::io::Interest::READABLE)
                .expect("registered with the runtime"),
        );
        assert_eq!(
            w.lowest(101),
            100,
            "the kernel signals at the registered level"
        );
        assert_eq!(w.lowest(90), 90, "the computed one is lower");
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
    }
}
