//! The reactor loop's own thread.
//!
//! The loop shares nothing with the API on the CPU. On one async runtime with the gRPC
//! server and the pod manager, a kernel event that wakes the loop waits for a worker thread
//! — behind whatever 50 API clients have queued (an apply that spawns containers and
//! writes checkpoints, a list that reads every pod's memory) — and on a 2-core node that
//! wait was most of the reaction time under load. So the loop runs on a runtime of its own
//! with one worker thread, `reactor-loop`, and the sense layer's sources are attached to
//! that runtime too (their fds are registered with its I/O driver, their tasks run on its
//! worker), so an event goes from the kernel to the loop without touching the agent's
//! other threads. With `realtimePriority` set, that thread alone runs `SCHED_FIFO` at the
//! priority configured, so neither the pods nor API work hold the loop off a CPU; the
//! agent's other threads keep normal scheduling (`cli::run` says why).
//!
//! What the loop asks of the rest of the agent (the pod manager's eviction bookkeeping,
//! the runtime's writable layers) goes over channels that work across runtimes; the kill
//! itself needs none of it ([`crate::node::PodManager::kill_now`]).

use tokio::sync::watch;

use super::pods::PodControl;
use super::{Reactor, ReactorHandle};
use crate::sense::{Sense, SenseError, SenseOptions};

/// The loop's runtime: one worker thread named `reactor-loop` (and a blocking pool for the
/// sense layer's rare slow work, on the same priority). Dropping it stops its thread
/// without waiting.
pub struct LoopThread {
    rt: Option<tokio::runtime::Runtime>,
}

impl LoopThread {
    /// Starts the thread; `priority` > 0 puts it (and its blocking pool) on `SCHED_FIFO` at
    /// that priority, a refusal logged and the thread run on normal scheduling.
    pub fn start(priority: u8) -> std::io::Result<LoopThread> {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(1)
            .thread_name("reactor-loop")
            .max_blocking_threads(4)
            .enable_all();
        if priority > 0 {
            b.on_thread_start(move || {
                if let Err(e) = crate::priority::set_realtime(priority) {
                    tracing::warn!(error = %e, "reactor loop thread keeps normal scheduling");
                }
            });
        }
        Ok(LoopThread {
            rt: Some(b.build()?),
        })
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        // Taken only in `drop`.
        self.rt.as_ref().expect("loop runtime present until drop")
    }

    /// Attaches the sense layer's sources on the loop's thread ([`Sense::start`]).
    pub fn start_sense(&self, opts: &SenseOptions) -> Result<Sense, SenseError> {
        let _entered = self.rt().enter();
        Sense::start(opts)
    }

    /// Runs the loop on the thread; the handle's task gives the sense layer back when the
    /// loop ends, and can be awaited from any runtime.
    pub fn spawn<P: PodControl + 'static>(
        &self,
        reactor: Reactor<P>,
        sense: Sense,
        shutdown: watch::Receiver<bool>,
    ) -> (ReactorHandle, tokio::task::JoinHandle<Sense>) {
        let handle = reactor.handle();
        let task = self.rt().spawn(reactor.run(sense, shutdown));
        (handle, task)
    }
}

impl Drop for LoopThread {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which is refused inside another runtime's task.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}
