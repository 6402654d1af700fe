//! Running the commands the tasks are made of. Apart from `main.rs`, which dispatches to
//! the tasks, so that a task using these does not use the file that calls it (a circle the
//! house check would report).

use std::process::Command;

use anyhow::{bail, Context, Result};

/// Runs a command, failing with its name when it fails, and says how long it took: the
/// steps of `cargo xtask test` on a fresh clone are where its time goes.
pub(crate) fn sh(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    eprintln!("xtask: {shown}");
    let start = std::time::Instant::now();
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {shown}"))?;
    eprintln!(
        "xtask: took {:.1} s: {}",
        start.elapsed().as_secs_f64(),
        shown.chars().take(120).collect::<String>()
    );
    if !status.success() {
        bail!("{shown} failed: {status}");
    }
    Ok(())
}

/// A check whose tool is missing: fails in CI (`CI=true`), where nothing may skip; elsewhere
/// says why it skips.
pub(crate) fn require_in_ci(what: &str) -> Result<()> {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        bail!("required in CI but missing: {what}");
    }
    eprintln!("xtask: skipping: {what}");
    Ok(())
}

pub(crate) fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}
