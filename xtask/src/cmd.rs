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

/// A command running in the background at the scheduler's idle priority (`SCHED_IDLE`, with
/// `chrt`; `nice -n 19` where there is none), its output in a log file: work that only takes
/// the CPU time the foreground leaves over, so the foreground's timing does not change.
pub(crate) struct Background {
    child: std::process::Child,
    shown: String,
    log: std::path::PathBuf,
    start: std::time::Instant,
}

impl Background {
    /// Starts `script` under `sh -c` at idle priority, its output going to `log`.
    pub(crate) fn start(script: &str, log: &std::path::Path) -> Result<Background> {
        let idle = Command::new("chrt")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        let mut cmd = if idle {
            let mut c = Command::new("chrt");
            c.args(["--idle", "0"]);
            c
        } else {
            let mut c = Command::new("nice");
            c.args(["-n", "19"]);
            c
        };
        cmd.args(["sh", "-c", script]);
        // A group of its own, so that ending it ends the cargo and rustc it started.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let out = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let err = out.try_clone()?;
        let shown = format!(
            "{script} (in the background at idle priority, log {})",
            log.display()
        );
        eprintln!("xtask: {shown}");
        let child = cmd
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("cannot start {shown}"))?;
        Ok(Background {
            child,
            shown,
            log: log.to_path_buf(),
            start: std::time::Instant::now(),
        })
    }

    /// Waits for it to end; fails with the end of its log when it failed.
    pub(crate) fn wait(mut self) -> Result<()> {
        let waited = std::time::Instant::now();
        let status = self
            .child
            .wait()
            .context("waiting for a background command")?;
        eprintln!(
            "xtask: took {:.1} s (waited {:.1} s for it): {}",
            self.start.elapsed().as_secs_f64(),
            waited.elapsed().as_secs_f64(),
            self.shown.chars().take(120).collect::<String>()
        );
        if !status.success() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
            bail!("{} failed: {status}", self.shown);
        }
        Ok(())
    }
}

impl Drop for Background {
    /// A background command whose result nobody waits for (the foreground failed first)
    /// is not left running: its process group (everything it started) is ended, and it is
    /// reaped.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let group = format!("-{}", self.child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = self.child.wait();
        }
    }
}
