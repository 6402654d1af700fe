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
use super::{program_stats, ProgramStats};

/// The program and its tracepoint (`agent-ebpf`'s `lruvec_floor`).
const PROGRAM: &str = "lruvec_floor";
const TRACEPOINT: &str = "mod_memcg_lruvec_state";

/// The empty program on the charge tracepoint, attached for as long as this lives.
pub struct DispatchFloor {
    ebpf: Ebpf,
}

impl DispatchFloor {
    /// Loads the object and attaches only the empty program; `Err` says why not.
    pub fn attach() -> Result<DispatchFloor, String> {
        if OBJECT.is_empty() {
            return Err("the eBPF programs were not built into this binary".into());
        }
        let mut ebpf = EbpfLoader::new()
            .load(OBJECT)
            .map_err(|e| format!("cannot load the eBPF object: {e}"))?;
        let program: &mut RawTracePoint = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| format!("{PROGRAM} is missing from the eBPF object"))?
            .try_into()
            .map_err(|e| format!("{PROGRAM}: {e}"))?;
        program
            .load()
            .map_err(|e| format!("{PROGRAM}: verifier refused it: {e:?}"))?;
        program
            .attach(TRACEPOINT)
            .map_err(|e| format!("{PROGRAM}: cannot attach to {TRACEPOINT}: {e}"))?;
        Ok(DispatchFloor { ebpf })
    }

    /// The program's runs and run time so far (counted while `BPF_ENABLE_STATS` is on).
    pub fn stats(&self) -> Vec<ProgramStats> {
        program_stats(&self.ebpf, PROGRAM).into_iter().collect()
    }
}
