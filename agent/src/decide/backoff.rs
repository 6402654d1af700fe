//! The kubelet's crash-loop back-off for restarting containers, as a pure function.
//!
//! Why exactly this: operators read `CrashLoopBackOff` delays off `kubectl describe` and
//! expect the same rhythm from any node agent. The kubelet (its `flowcontrol.Backoff`, keyed
//! per container) restarts a container the first time it dies at once, then waits 10 s, and
//! doubles the wait on every further death up to 5 minutes. The back-off forgets a container
//! whose death comes more than twice the maximum (10 minutes) after its last restart, i.e. a
//! container that ran for 10 minutes starts again from no back-off.
//!
//! Times are monotonic instants given as [`Duration`]s since any fixed origin; nothing here
//! reads a clock.

use std::time::Duration;

/// The back-off's two settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackOffPolicy {
    /// The first wait (the kubelet's 10 s).
    pub initial: Duration,
    /// The cap (the kubelet's `MaxContainerBackOff`, 300 s); twice this resets the back-off.
    pub max: Duration,
}

impl Default for BackOffPolicy {
    fn default() -> Self {
        BackOffPolicy {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(300),
        }
    }
}

/// What the back-off remembers about one container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BackOffEntry {
    /// The wait the next death will cost.
    pub backoff: Duration,
    /// When the container was last restarted.
    pub last_update: Duration,
}

impl BackOffPolicy {
    /// A container died at `finished`: returns how long after `finished` to restart it, and
    /// updates `entry` for a restart at that moment.
    pub(crate) fn on_exit(&self, entry: &mut Option<BackOffEntry>, finished: Duration) -> Duration {
        match entry {
            Some(e) if finished.saturating_sub(e.last_update) <= self.max * 2 => {
                let delay = e.backoff;
                e.backoff = (e.backoff * 2).min(self.max);
                e.last_update = finished + delay;
                delay
            }
            _ => {
                *entry = Some(BackOffEntry {
                    backoff: self.initial.min(self.max),
                    last_update: finished,
                });
                Duration::ZERO
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_then_doubling_from_ten_seconds_to_five_minutes() {
        let p = BackOffPolicy::default();
        let mut entry = None;
        let mut now = Duration::from_secs(1000);
        let mut delays = Vec::new();
        for _ in 0..9 {
            let d = p.on_exit(&mut entry, now);
            delays.push(d.as_secs());
            now += d + Duration::from_secs(1); // restarted, then dies a second later
        }
        assert_eq!(delays, [0, 10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn ten_minutes_of_running_resets_it() {
        let p = BackOffPolicy::default();
        let mut entry = None;
        let t = Duration::from_secs(50);
        assert_eq!(p.on_exit(&mut entry, t), Duration::ZERO);
        assert_eq!(
            p.on_exit(&mut entry, t + Duration::from_secs(5)),
            Duration::from_secs(10)
        );
        // Restarted at t+15s; runs exactly 10 minutes: still remembered.
        let died = t + Duration::from_secs(15 + 600);
        assert_eq!(p.on_exit(&mut entry, died), Duration::from_secs(20));
        // Restarted at died+20s; runs a little longer than 10 minutes: forgotten.
        let died = died + Duration::from_secs(20 + 601);
        assert_eq!(p.on_exit(&mut entry, died), Duration::ZERO);
        assert_eq!(entry.map(|e| e.backoff), Some(Duration::from_secs(10)));
    }
}
