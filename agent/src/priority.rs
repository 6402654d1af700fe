//! Real-time scheduling for the agent's own threads (`realtimePriority`).
//!
//! The agent reacts in the milliseconds between the kernel's pressure notification and the
//! OOM killer. On a node whose CPUs are busy — typically with the very pod that is
//! allocating — a normally scheduled thread can wait a whole scheduler slice (milliseconds)
//! before it runs; measured here, that wait is most of the reaction time's tail.
//! `SCHED_FIFO` lets the agent run as soon as it is woken. `SCHED_RESET_ON_FORK` keeps the
//! pods (and every other process the agent starts) on normal scheduling.
//!
//! Only the reactor loop's thread runs real-time (`reactor::thread`); each thread sets its
//! own policy as it starts, since with `SCHED_RESET_ON_FORK` a new thread does not inherit
//! its creator's. The agent's other threads run on normal scheduling, and so does the main
//! thread once the agent has started ([`set_normal`]), whatever the service manager started
//! it with.

/// Why the priority could not be set.
#[derive(Debug, thiserror::Error)]
#[error("cannot set SCHED_FIFO priority {priority}: {source} (needs CAP_SYS_NICE)")]
pub struct PriorityError {
    /// The priority asked for.
    pub priority: u8,
    /// The kernel's answer.
    pub source: std::io::Error,
}

/// Puts the calling thread on `SCHED_FIFO` at `priority`, with `SCHED_RESET_ON_FORK`.
pub fn set_realtime(priority: u8) -> Result<(), PriorityError> {
    let param = libc::sched_param {
        sched_priority: i32::from(priority),
    };
    // SAFETY: sched_setscheduler reads the sched_param we pass by reference for the duration
    // of the call only; pid 0 is the calling thread.
    let rc = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(PriorityError {
            priority,
            source: std::io::Error::last_os_error(),
        })
    }
}

/// Puts the calling thread back on normal scheduling (`SCHED_OTHER`): lowering one's own
/// policy needs no privilege. The main thread of an agent started real-time by its service
/// manager (the systemd unit's `CPUSchedulingPolicy=fifo`, for the start) calls it once the
/// loop's thread runs, so API work on it never competes with the loop or the kernel's
/// workers at real-time priority.
pub fn set_normal() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: as in `set_realtime`: the sched_param is read during the call only.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
