//! Builds the eBPF programs in `agent-ebpf` for `bpfel-unknown-none` (nightly, bpf-linker) so
//! `src/sense/ebpf.rs` can embed the object with `include_bytes_aligned!`.
//!
//! `AYA_BUILD_SKIP=1` skips the eBPF build (doc or lint jobs without the toolchain); the agent
//! then embeds an empty object and the eBPF source reports that it was built without programs.

use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};

fn main() -> Result<()> {
    let manifest_dir = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").ok_or_else(|| anyhow!("no CARGO_MANIFEST_DIR"))?,
    );
    let ebpf_dir = manifest_dir.join("../agent-ebpf");
    let ebpf_dir = ebpf_dir
        .canonicalize()
        .with_context(|| format!("cannot find {}", ebpf_dir.display()))?;
    let root_dir = ebpf_dir
        .to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path {}", ebpf_dir.display()))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "agent-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
    .context("building the eBPF programs (needs `cargo xtask setup`: nightly + rust-src, bpf-linker on PATH)")?;

    // With AYA_BUILD_SKIP nothing was built: leave an empty object to embed.
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or_else(|| anyhow!("no OUT_DIR"))?)
        .join("agent-ebpf");
    if !out.exists() {
        std::fs::write(&out, []).with_context(|| format!("cannot write {}", out.display()))?;
    }
    Ok(())
}
