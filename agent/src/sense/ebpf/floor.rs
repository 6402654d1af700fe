//! What the kernel charges for running any program at all on the charge tracepoint: a
//! measuring instrument for bench part 7, never attached by the agent.
//!
//! `mod_memcg_lruvec_state` is entered about four times per page fault (a page's mapped and
//! LRU counts go up at the fault and down when it is freed). Each entry with a program
//! attached costs the kernel's dispatch (the tracepoint's call, the recursion guard, the RCU
//! read section) before the program's first instruction, and nothing the program does can
//! take that back. [`DispatchFloor`] attaches `lruvec_floor`, a program that returns at once,
//! so the part can show how much of the armed charge programs' cost is that floor and how
//! much is theirs.

use aya::programs::RawTracePoint;
use aya::{Ebpf, EbpfLoader};

use super::load::OBJECT;
use super::stats::{program_stats, ProgramStats};

/// The program and its tracepoint (`agent-ebpf`'s `lruvec_floor`).
const PROGRAM: &str = "lruvec_floor";
const TRACEPOINT: &str = "mod_memcg_lruvec_state";

/// Why the empty program is not attached; each line names the program.
#[derive(Debug, thiserror::Error)]
pub enum FloorError {
    /// The binary carries no eBPF object.
    #[error("the eBPF programs were not built into this binary")]
    NotBuilt,
    /// The object could not be loaded.
    #[error("cannot load the eBPF object: {0}")]
    Load(#[source] aya::EbpfError),
    /// The object has no empty program.
    #[error("{PROGRAM} is missing from the eBPF object")]
    NotInObject,
    /// The program is not a raw tracepoint program.
    #[error("{PROGRAM}: {0}")]
    Program(#[source] aya::programs::ProgramError),
    /// The verifier refused it.
    #[error("{PROGRAM}: verifier refused it: {0:?}")]
    Verifier(#[source] aya::programs::ProgramError),
    /// The kernel refused to attach it.
    #[error("{PROGRAM}: cannot attach to {TRACEPOINT}: {0}")]
    Attach(#[source] aya::programs::ProgramError),
}

/// The empty program on the charge tracepoint, attached for as long as this lives.
pub struct DispatchFloor {
    ebpf: Ebpf,
}

impl DispatchFloor {
    /// Loads the object and attaches only the empty program; `Err` says why not.
    pub fn attach() -> Result<DispatchFloor, FloorError> {
        if OBJECT.is_empty() {
            return Err(FloorError::NotBuilt);
        }
        let mut ebpf = EbpfLoader::new().load(OBJECT).map_err(FloorError::Load)?;
        let program: &mut RawTracePoint = ebpf
            .program_mut(PROGRAM)
            .ok_or(FloorError::NotInObject)?
            .try_into()
            .map_err(FloorError::Program)?;
        program.load().map_err(FloorError::Verifier)?;
        program.attach(TRACEPOINT).map_err(FloorError::Attach)?;
        Ok(DispatchFloor { ebpf })
    }

    /// The program's runs and run time so far (counted while `BPF_ENABLE_STATS` is on).
    pub fn stats(&self) -> Vec<ProgramStats> {
        program_stats(&self.ebpf, PROGRAM).into_iter().collect()
    }
}
