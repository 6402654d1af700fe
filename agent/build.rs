//! Builds the eBPF programs in `agent-ebpf` for `bpfel-unknown-none` (nightly, bpf-linker) so
//! `src/sense/ebpf.rs` can embed the object with `include_bytes_aligned!`.
//!
//! `AYA_BUILD_SKIP=1` skips the eBPF build (doc or lint jobs without the toolchain); the agent
//! then embeds an empty object and the eBPF source reports that it was built without programs.
//!
//! Quiet by default: `aya_build` relays the whole sub-cargo's progress ("Compiling …",
//! "Finished …") as `cargo:warning=` lines, which on a fresh checkout reads as if something
//! were wrong. So the script runs itself again as a child (`REACTOR_EBPF_CHILD=1`) that does
//! the real build, and the parent passes the child's cargo directives on but keeps its
//! warnings back: they are replayed only when the sub-build fails, or always with
//! `REACTOR_EBPF_VERBOSE=1`. (aya_build writes straight to stdout, so a child process is the
//! only way to capture it without re-implementing it.)

use std::path::PathBuf;
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};

/// Set in the child that does the build.
const CHILD: &str = "REACTOR_EBPF_CHILD";
/// `1`/`true`: relay the sub-build's output even when it succeeds.
const VERBOSE: &str = "REACTOR_EBPF_VERBOSE";

fn main() -> Result<()> {
    if std::env::var_os(CHILD).is_some() {
        return build();
    }
    println!("cargo:rerun-if-env-changed={VERBOSE}");
    let verbose = std::env::var(VERBOSE).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    let me = std::env::current_exe().context("cannot find the build script's own path")?;
    let out = Command::new(&me)
        .env(CHILD, "1")
        // The child's error is one message; its backtrace would bury it.
        .env("RUST_BACKTRACE", "0")
        .output()
        .with_context(|| format!("cannot run {}", me.display()))?;
    let failed = !out.status.success();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        match line.strip_prefix("cargo:warning=") {
            // The skip notice is the one warning a user asked for by setting the variable.
            Some(w) if verbose || failed || w.contains("AYA_BUILD_SKIP") => {
                println!("cargo:warning={w}")
            }
            Some(_) => {}
            None => println!("{line}"),
        }
    }
    if failed {
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        bail!(
            "building the eBPF programs failed ({}); its output is above",
            out.status
        );
    }
    Ok(())
}

/// The real build, in the child.
fn build() -> Result<()> {
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
