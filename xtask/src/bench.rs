//! `cargo xtask bench [--quick]`: the agent measured side by side with the kubelet's
//! mechanisms on the same pressure (the `side_by_side` bench of `reactor-tests`, see its
//! module doc). Prints one table per part and writes `target/bench/bench.json` (every
//! figure) and `target/bench/report.md` (the tables and the machine, for the README), with
//! the SVG charts it embeds beside it ([`CHARTS`]).
//!
//! The figures are never judged here: the run fails only when the harness itself breaks (a
//! part errors out or measures nothing), so `cargo xtask test` can run `--quick` in CI.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::{cargo, sh};

/// Where the results go: `target/bench/` of the workspace (or of `CARGO_TARGET_DIR`).
fn out_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => PathBuf::from(t).join("bench"),
        None => {
            let xtask = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
            xtask.parent().unwrap_or(xtask).join("target/bench")
        }
    }
}

/// Builds the release agent and helpers, then runs every part; `extra` goes to the bench
/// (`--quick`, `--only lag,oom`, `--oom-rates 350,150`, `--oom-reps 20`,
/// `--concurrent-reps 10`, `--only soak --soak-minutes 10`: the soak only when asked).
pub(crate) fn run(extra: &[String]) -> Result<()> {
    build()?;
    let out = out_dir();
    sh(cargo()
        .args([
            "bench",
            "-p",
            "reactor-tests",
            "--bench",
            "side_by_side",
            "--",
            "--json",
        ])
        .arg(out.join("bench.json"))
        .arg("--markdown")
        .arg(out.join("report.md"))
        .args(extra))
}

/// Builds the release `reactor` and the helpers the bench starts beside it (`memhog`, ...).
/// `cargo xtask run` builds the same set, so it finds the bench's binary built.
pub(crate) fn build() -> Result<()> {
    sh(cargo().args(BUILD))
}

/// The cargo arguments of [`build`]: `cargo xtask test` makes the same build in the
/// background while the tests run.
pub(crate) const BUILD: [&str; 7] = [
    "build",
    "--release",
    "-p",
    "reactor",
    "-p",
    "reactor-tests",
    "--bins",
];

/// The cargo arguments that build the bench harness itself without running it.
pub(crate) const BUILD_HARNESS: [&str; 6] = [
    "bench",
    "--no-run",
    "-p",
    "reactor-tests",
    "--bench",
    "side_by_side",
];

/// The charts a full run draws next to `report.md`.
pub(crate) const CHARTS: [&str; 4] = ["lag-cdf.svg", "oom-release.svg", "cost.svg", "ring.svg"];

/// Checks that every chart exists, is SVG, and renders: `rsvg-convert` (librsvg, Debian's
/// `librsvg2-bin`) must turn it into a PNG. An unparsable or empty drawing fails here.
pub(crate) fn check_charts() -> Result<()> {
    let out = out_dir();
    for name in CHARTS {
        let path = out.join(name);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("chart {} missing", path.display()))?;
        if !text.contains("<svg") {
            bail!("{}: not an SVG document", path.display());
        }
        let png = std::process::Command::new("rsvg-convert")
            .arg(&path)
            .output()
            .with_context(|| format!("cannot run rsvg-convert on {}", path.display()))?;
        if !png.status.success() || !png.stdout.starts_with(b"\x89PNG") {
            bail!(
                "{}: rsvg-convert cannot render it: {}",
                path.display(),
                String::from_utf8_lossy(&png.stderr).trim()
            );
        }
        eprintln!(
            "xtask: chart {} renders ({} bytes of PNG)",
            path.display(),
            png.stdout.len()
        );
    }
    Ok(())
}
