//! The kill: how a pod's processes are killed and their memory reaped, and how a runtime's
//! stop and the eviction's SIGKILL are begun and finished. Every kill of a pod goes through
//! here, whoever decides it: the reactor loop (through its `PodControl` port, at grace 0 and
//! when a graceful eviction is escalated), the node's pod manager (its stops and its
//! recovery), and the runtime-only adapter. One place, so a change to how a pod dies (the
//! order of the signals, the reap, the kill time) is made once.
//!
//! [`reap`] holds the process level: SIGKILL through pidfds and `process_mrelease(2)`. This
//! file holds the pod level: a cgroup's processes, and a stop split around its kill.

mod reap;

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use serde::Serialize;

pub use reap::{kill_all, set_reaping, Killed};
pub use reap::{kill_and_reap, kill_known};
pub use reap::{KnownProcess, Signalled};

use crate::act::cgroups::{CgroupManager, CgroupPath};
use crate::act::runtime::{PodStatus, Runtime, RuntimeError};
use crate::sense::{monotonic_ns, ThreadCpu};

/// What an eviction's kill did, for the decision record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Evicted {
    /// `CLOCK_MONOTONIC` ns when SIGKILL went to the pod's processes (at once for grace 0,
    /// after the grace period otherwise); `None` when nothing was left to kill.
    pub killed_at_ns: Option<u64>,
    /// The killing thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`) at `killed_at_ns`, when the
    /// kill was made on the caller's thread ([`kill_cgroup_now`]: the loop's, for the
    /// decision's `decide_to_kill_cpu_ns`).
    #[serde(skip)]
    pub killed_cpu: Option<ThreadCpu>,
    /// How many processes were sent SIGKILL by the eviction itself.
    pub killed: usize,
    /// Of those, how many were handed to `process_mrelease` right after the SIGKILL, on a
    /// reaper thread (0 where the kernel lacks it, before 5.15).
    pub reaped: usize,
}

/// Sends SIGKILL to every process in `cgroup` and below, then reaps their memory with
/// `process_mrelease` where the kernel has it ([`reap`]), in this thread. For a caller with
/// no loop to keep going (recovery after a restart).
pub fn kill_cgroup(cgroups: &CgroupManager, cgroup: &CgroupPath) -> Killed {
    let pids = cgroups.procs_recursive(cgroup).unwrap_or_default();
    kill_and_reap(&pids)
}

/// SIGKILL to every process in `cgroup` and below, then their memory reaped ([`reap`]). The
/// eviction's kill for grace 0. The processes the runtime named (`known`, its containers'
/// own processes, through their pidfds) are signalled first and that is the kill time: a
/// container's main process then dies without waiting for the walk of the pod's cgroups, a
/// cgroupfs walk that contends with every pod cgroup being created or removed. The walk
/// follows at once and signals whatever else runs there (forks); with nothing known, the
/// kill time is the walk's signal. Either way it is taken before the reap, which frees the
/// memory on a blocking thread while the caller goes on ([`Signalled::reap_aside`]).
pub fn kill_cgroup_now(
    cgroups: &CgroupManager,
    cgroup: &CgroupPath,
    known: Vec<KnownProcess>,
) -> Evicted {
    let mut signalled = kill_known(known);
    let stamp = || (monotonic_ns(), ThreadCpu::now());
    let first = (signalled.killed() > 0).then(stamp);
    let pids = cgroups.memory_procs_recursive(cgroup).unwrap_or_default();
    signalled.kill_rest(&pids);
    let (killed_at_ns, killed_cpu) = first.unwrap_or_else(stamp);
    let k = signalled.reap_aside();
    Evicted {
        killed_at_ns: Some(killed_at_ns),
        killed_cpu: Some(killed_cpu),
        killed: k.killed,
        reaped: k.reaped,
    }
}

/// Stops a pod through the runtime, the eviction's way. With grace 0 the runtime is first
/// told to stop (its first poll, so no supervisor restarts what dies next), then every
/// process in `cgroup` gets SIGKILL from here at once — not whenever the runtime's own tasks
/// are scheduled — and that moment is the kill time; with a grace period (or no cgroup) it
/// is when the runtime reports the stop.
pub(crate) async fn stop_and_kill<R: Runtime>(
    rt: &R,
    uid: &str,
    grace: Duration,
    cgroup: Option<&CgroupPath>,
    cgroups: &CgroupManager,
) -> (Result<PodStatus, RuntimeError>, Evicted) {
    let stop = rt.stop_pod(uid, grace);
    let (first, out) = begin_kill(stop, grace, cgroup, cgroups, || rt.known_processes(uid));
    finish_kill(first, out).await
}

/// A stop begun by [`begin_kill`]: the runtime's answer if it came at the first poll, else
/// the rest of its stop to await.
pub(crate) type Begun<F> = (Result<Result<PodStatus, RuntimeError>, F>, Evicted);

/// The first half of [`stop_and_kill`], without awaiting: polls `stop` (the runtime's
/// `stop_pod`) once, so the runtime is told before anything dies, then with grace 0 sends
/// SIGKILL to every process in `cgroup` at once, the runtime's own processes (`known`, asked
/// only when there is a kill, before the runtime is told) first. For a caller that must
/// record something right after the kill and before the stop's end (the pod manager's
/// write-ahead record), without delaying the kill by it. Finish with [`finish_kill`].
pub(crate) fn begin_kill<F>(
    stop: F,
    grace: Duration,
    cgroup: Option<&CgroupPath>,
    cgroups: &CgroupManager,
    known: impl FnOnce() -> Vec<KnownProcess>,
) -> Begun<Pin<Box<F>>>
where
    F: Future<Output = Result<PodStatus, RuntimeError>>,
{
    let kill = cgroup.filter(|_| grace.is_zero()).map(|cg| (cg, known()));
    let mut stop = Box::pin(stop);
    // A no-op waker is enough for this first poll: the caller polls again (with its task's
    // waker) in `finish_kill` when the stop is not done.
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let first = match stop.as_mut().poll(&mut cx) {
        Poll::Ready(r) => Ok(r),
        Poll::Pending => Err(stop),
    };
    let out = kill.map_or_else(Evicted::default, |(cg, known)| {
        kill_cgroup_now(cgroups, cg, known)
    });
    (first, out)
}

/// The second half of [`stop_and_kill`]: awaits the runtime's stop; with a grace period the
/// kill time is when it reports the pod stopped.
pub(crate) async fn finish_kill<F>(
    first: Result<Result<PodStatus, RuntimeError>, Pin<Box<F>>>,
    mut out: Evicted,
) -> (Result<PodStatus, RuntimeError>, Evicted)
where
    F: Future<Output = Result<PodStatus, RuntimeError>>,
{
    let result = match first {
        Ok(r) => r,
        Err(stop) => stop.await,
    };
    if out.killed_at_ns.is_none() {
        out.killed_at_ns = Some(monotonic_ns());
    }
    (result, out)
}
