//! Real-time scheduling for the agent's own threads (`realtimePriority`).
//!
//! The agent reacts in the milliseconds between the kernel's pressure notification and the
//! OOM killer. On a node whose CPUs are busy — typically with the very pod that is
//! allocating — a normally scheduled thread can wait a whole scheduler slice (milliseconds)
//! before it runs; measured here, that wait is most of the reaction time's tail.
//! `SCHED_FIFO` lets the agent run as soon as it is woken. `SCHED_RESET_ON_FORK` keeps the
//! pods (and every other process the agent starts) on normal scheduling.
//!
//! It must be set before the async runtime starts its threads: a thread inherits its
//! creator's policy, so setting it on the main thread first covers every worker.

/// Why the priority could not be set.
#[derive(Debug, thiserror::Error)]
#[error("cannot set SCHED_FIFO priority {priority}: {source} (needs CAP_SYS_NICE)")]
pub struct PriorityError {
    /// The priority asked for.
    pub priority: u8,
    /// The kernel's answer.
    pub source: std::io::Error,
}

/// Puts the calling thread (and the threads it creates from now on) on `SCHED_FIFO` at
/// `priority`, with `SCHED_RESET_ON_FORK`.
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
