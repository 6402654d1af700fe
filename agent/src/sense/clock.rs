//! The clocks events are stamped with: `CLOCK_MONOTONIC`, the one eBPF programs read, and a
//! thread's CPU clock, which tells a thread that ran from one that waited.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_moves_forward() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0 && b >= a);
    }
}
