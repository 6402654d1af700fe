//! The kernel's per-program statistics of the agent's eBPF programs: how many times each ran
//! and the time spent in it (`BPF_ENABLE_STATS`).
//!
//! This is for measuring, not for a running agent: the kernel counts only while statistics
//! are on, which costs two clock reads per program run. Bench part 7 and the eBPF tests read
//! it around what they time, from the agent's own source ([`EbpfSource::stats`]) or from
//! outside it ([`loaded_program_totals`]).

use std::sync::{Arc, Mutex};

use super::charge_switch::Programs;
use super::{EbpfSource, TRACEPOINTS};

/// One program's kernel statistics: how many times it ran and the time spent in it.
///
/// The kernel counts only while statistics are on ([`enable_stats`]); the figures are
/// totals since the program was loaded, so a cost is the difference of two readings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProgramStats {
    /// The program's name (its function in `agent-ebpf`).
    pub program: &'static str,
    /// Runs counted.
    pub runs: u64,
    /// Nanoseconds spent in it, summed over the runs.
    pub run_ns: u64,
}

/// Reads the source's programs' statistics ([`EbpfSource::stats`]); does not keep the
/// programs loaded: once the source is gone it reads nothing.
#[derive(Clone, Debug)]
pub struct StatsReader {
    programs: std::sync::Weak<Mutex<Programs>>,
    names: Vec<&'static str>,
}

impl StatsReader {
    /// Each attached program's totals now; empty once the source is gone.
    pub fn read(&self) -> Vec<ProgramStats> {
        let Some(programs) = self.programs.upgrade() else {
            return Vec::new();
        };
        let programs = programs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.names
            .iter()
            .filter_map(|&name| program_stats(&programs.ebpf, name))
            .collect()
    }
}

/// The kernel's run count and run time of `name` in `ebpf`, when it is loaded.
pub(crate) fn program_stats(ebpf: &aya::Ebpf, name: &'static str) -> Option<ProgramStats> {
    let info = ebpf.program(name)?.info().ok()?;
    Some(ProgramStats {
        program: name,
        runs: info.run_count(),
        run_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
    })
}

/// The runs and run time, summed, of every program of the agent's object loaded on this
/// machine now, by any process: a measure from outside the agent (bench part 7b reads it
/// around each program it times). Matched by the kernel's copy of the name, which keeps 15
/// bytes. Counted only while statistics are on ([`enable_stats`]); a program whose
/// information cannot be read (gone since it was listed) is left out.
pub fn loaded_program_totals() -> ProgramStats {
    let ours: Vec<&[u8]> = TRACEPOINTS
        .iter()
        .map(|t| &t.program.as_bytes()[..t.program.len().min(15)])
        .collect();
    let mut total = ProgramStats {
        program: "every agent program",
        ..ProgramStats::default()
    };
    for info in aya::programs::loaded_programs() {
        let Ok(info) = info else { continue };
        if ours.contains(&info.name()) {
            total.runs = total.runs.saturating_add(info.run_count());
            total.run_ns = total
                .run_ns
                .saturating_add(u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX));
        }
    }
    total
}

/// Turns the kernel's per-program statistics on (`BPF_ENABLE_STATS`) for as long as the
/// returned descriptor is open: the same switch as `kernel.bpf_stats_enabled`, counted, so
/// closing it restores whatever the sysctl said. Costs two clock reads per program run while
/// on, so it is for measuring, not for a running agent.
pub fn enable_stats() -> Result<std::os::fd::OwnedFd, StatsError> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(StatsError)
}

/// The kernel's per-program statistics could not be turned on.
#[derive(Debug, thiserror::Error)]
#[error("cannot turn eBPF statistics on (BPF_ENABLE_STATS): {0}")]
pub struct StatsError(#[source] aya::sys::SyscallError);

impl EbpfSource {
    /// A reader of the attached programs' run counts and run times, usable while the source
    /// runs (see [`StatsReader`]).
    pub fn stats(&self) -> StatsReader {
        StatsReader {
            programs: Arc::downgrade(&self._programs),
            names: self.attached.clone(),
        }
    }
}
