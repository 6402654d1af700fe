//! `cargo xtask fuzz`: the cargo-fuzz targets in `fuzz/`, one parser each, built once and run
//! one after another for a fixed time each.
//!
//! Why one at a time: the machines have two cores shared with other work, and a fuzzer uses
//! a core flat out. Each run starts from the committed seeds (`fuzz/seeds/<target>`, read
//! only) and the corpus earlier runs grew (`fuzz/corpus/<target>`, not committed), and keeps
//! libFuzzer's output in `target/fuzz/logs/<target>.log`; an input that crashes is kept in
//! `fuzz/artifacts/<target>/` and named at the end. The figures of each run (executions,
//! speed, corpus, coverage) are printed as a table and written to
//! `target/fuzz/summary.json`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::cmd::Background;
use crate::{cargo, sh};

/// Every fuzz target, in the order they run; each is a `[[bin]]` of `fuzz/Cargo.toml`.
pub(crate) const TARGETS: &[&str] = &[
    "config",
    "pod",
    "checkpoint_pods",
    "checkpoint_process",
    "checkpoint_images",
    "checkpoint_devices",
    "kill_journal",
    "plan",
    "api",
];

/// Seconds per target in `cargo xtask test`'s brief run.
pub(crate) const CI_SECONDS: u64 = 5;

/// How long one input may run before libFuzzer calls it a hang: far above any parse.
const INPUT_TIMEOUT_SECS: u64 = 10;

fn root() -> PathBuf {
    let xtask = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask.parent().unwrap_or(xtask).to_path_buf()
}

fn target_dir() -> PathBuf {
    root().join("target/fuzz")
}

/// `cargo +nightly fuzz <sub>` with the build options every run shares: optimized with
/// debug assertions and overflow checks on (an overflow is a panic, as in the test builds),
/// no sanitizer (the parsers are safe Rust, and the address sanitizer would halve the speed
/// for nothing to find), the eBPF build skipped (the targets never load a program), and a
/// target directory of its own under `target/`.
fn cargo_fuzz(sub: &str) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root())
        .env("AYA_BUILD_SKIP", "1")
        .args(["+nightly", "fuzz", sub, "--fuzz-dir", "fuzz"])
        .args(BUILD_OPTIONS)
        .arg("--target-dir")
        .arg(target_dir());
    cmd
}

/// The build options of [`cargo_fuzz`], shared with [`build_in_background`].
const BUILD_OPTIONS: &[&str] = &["-O", "-a", "--sanitizer", "none"];

/// [`cargo_fuzz`]`("build")` in the background at idle priority ([`Background`]), its output
/// in `target/fuzz/build.log`. A fresh clone's nightly build of the targets takes minutes
/// of CPU (the agent's whole dependency tree again, optimized); `cargo xtask test` starts it
/// beside the release build, so it uses the CPU the tests leave idle while they wait on the
/// kernel, and the brief fuzz run later finds the targets built.
pub(crate) fn build_in_background() -> Result<Background> {
    let target = target_dir();
    std::fs::create_dir_all(&target)?;
    let script = format!(
        "cd '{}' && AYA_BUILD_SKIP=1 cargo +nightly fuzz build --fuzz-dir fuzz {} --target-dir '{}'",
        root().display(),
        BUILD_OPTIONS.join(" "),
        target.display()
    );
    Background::start(&script, &target.join("build.log"))
}

struct Options {
    seconds: u64,
    only: Vec<String>,
    seeds: bool,
}

fn options(args: &[String]) -> Result<Options> {
    let mut o = Options {
        seconds: 60,
        only: Vec::new(),
        seeds: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => {
                let v = it.next().context("--seconds needs a number")?;
                o.seconds = v
                    .parse()
                    .with_context(|| format!("--seconds {v:?} is not a number"))?;
            }
            "--only" => {
                let v = it.next().context("--only needs target names")?;
                o.only = v.split(',').map(str::to_string).collect();
            }
            "--seeds" => o.seeds = true,
            other => bail!("unknown fuzz option {other:?}"),
        }
    }
    if let Some(bad) = o.only.iter().find(|t| !TARGETS.contains(&t.as_str())) {
        bail!(
            "no fuzz target {bad:?}; the targets: {}",
            TARGETS.join(", ")
        );
    }
    Ok(o)
}

/// `cargo xtask fuzz [--seconds N] [--only a,b] [--seeds]`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let o = options(args)?;
    if o.seeds {
        return seeds();
    }
    let targets: Vec<&str> = TARGETS
        .iter()
        .copied()
        .filter(|t| o.only.is_empty() || o.only.iter().any(|x| x == t))
        .collect();
    sh(&mut cargo_fuzz("build"))?;
    let logs = target_dir().join("logs");
    std::fs::create_dir_all(&logs)?;
    let mut results = Vec::new();
    for t in &targets {
        results.push(fuzz_one(t, o.seconds, &logs)?);
    }
    eprintln!("xtask: fuzz, {} s per target:", o.seconds);
    eprintln!(
        "  {:<20} {:>12} {:>9} {:>7} {:>7} {:>8}  result",
        "target", "execs", "execs/s", "corpus", "cov", "ft"
    );
    for r in &results {
        eprintln!(
            "  {:<20} {:>12} {:>9} {:>7} {:>7} {:>8}  {}",
            r.target, r.execs, r.execs_per_sec, r.corpus, r.cov, r.ft, r.result
        );
    }
    let json = serde_json::Value::Array(results.iter().map(Outcome::json).collect());
    std::fs::write(
        target_dir().join("summary.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    let failed: Vec<String> = results
        .iter()
        .filter(|r| r.result != "ok")
        .map(|r| format!("{}: {}", r.target, r.result))
        .collect();
    if !failed.is_empty() {
        bail!("fuzz targets failed:\n  {}", failed.join("\n  "));
    }
    Ok(())
}

/// What one target's run gave.
struct Outcome {
    target: String,
    execs: u64,
    execs_per_sec: u64,
    corpus: u64,
    cov: u64,
    ft: u64,
    /// `ok`, or what went wrong and where the input is.
    result: String,
}

impl Outcome {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "target": self.target, "execs": self.execs, "execsPerSec": self.execs_per_sec,
            "corpus": self.corpus, "cov": self.cov, "ft": self.ft, "result": self.result,
        })
    }
}

fn fuzz_one(target: &str, seconds: u64, logs: &Path) -> Result<Outcome> {
    let corpus = root().join("fuzz/corpus").join(target);
    let seeds = root().join("fuzz/seeds").join(target);
    std::fs::create_dir_all(&corpus)?;
    let log = logs.join(format!("{target}.log"));
    let mut cmd = cargo_fuzz("run");
    cmd.arg(target)
        .arg(&corpus)
        .args(seeds.is_dir().then_some(&seeds))
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_SECS}"))
        .arg("-print_final_stats=1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?);
    eprintln!(
        "xtask: fuzz {target} for {seconds} s (log: {})",
        log.display()
    );
    let start = Instant::now();
    let status = cmd
        .status()
        .with_context(|| format!("cannot start the fuzz run of {target}"))?;
    eprintln!(
        "xtask: took {:.1} s: fuzz {target}",
        start.elapsed().as_secs_f64()
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let mut o = figures(target, &text);
    if !status.success() {
        let artifact = text
            .lines()
            .find_map(|l| l.split_once("Test unit written to ").map(|(_, p)| p.trim()))
            .unwrap_or("no input kept; see the log");
        // A panic's message is the line after "panicked at"; else libFuzzer's own verdict
        // (a timeout, running out of memory, a deadly signal).
        let lines: Vec<&str> = text.lines().collect();
        let what = match lines.iter().position(|l| l.contains("panicked at")) {
            Some(i) => lines.get(i + 1).copied().unwrap_or(lines[i]),
            None => lines
                .iter()
                .copied()
                .find(|l| l.contains("ERROR: libFuzzer:"))
                .unwrap_or("the run failed"),
        };
        let what: String = what.trim().chars().take(300).collect();
        o.result = format!("{what} ({artifact}; log {})", log.display());
    }
    Ok(o)
}

/// The figures in a libFuzzer log: the final stats, and coverage from the last status line.
fn figures(target: &str, log: &str) -> Outcome {
    let stat = |name: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix(&format!("stat::{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let last = log
        .lines()
        .rev()
        .find(|l| l.starts_with('#') && l.contains(" cov: "))
        .unwrap_or("");
    let after = |key: &str| -> u64 {
        let mut words = last.split_whitespace();
        words
            .by_ref()
            .find(|w| *w == key)
            .and(words.next())
            .and_then(|v| v.split('/').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Outcome {
        target: target.to_string(),
        execs: stat("number_of_executed_units"),
        execs_per_sec: stat("average_exec_per_sec"),
        corpus: after("corp:"),
        cov: after("cov:"),
        ft: after("ft:"),
        result: "ok".into(),
    }
}

/// Collects the seed corpus into `fuzz/seeds/` from the tests that make parser inputs: the
/// seeds test (example pods and configs, the device checkpoint fixture, state files from the
/// agent's encoders, API requests) and the plan tests (every document they give `reactor
/// plan`). The plan tests run the `reactor` binary, so it is built first.
fn seeds() -> Result<()> {
    let dir = root().join("fuzz/seeds");
    sh(cargo().args(["build", "-p", "reactor", "--bin", "reactor"]))?;
    let mut cmd = cargo();
    cmd.args(["test", "-p", "reactor-tests"]);
    for t in [
        "fuzz_seeds",
        "plan_evict",
        "plan_preempt",
        "plan_image_gc",
        "plan_cgroups",
        "plan_pressure",
    ] {
        cmd.args(["--test", t]);
    }
    sh(cmd.env("REACTOR_FUZZ_SEEDS", &dir))?;
    for t in TARGETS {
        let n = std::fs::read_dir(dir.join(t)).map_or(0, |d| d.count());
        eprintln!("xtask: {n} seeds for {t}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_is_a_bin_of_the_fuzz_crate_and_back() {
        let manifest = std::fs::read_to_string(root().join("fuzz/Cargo.toml")).unwrap();
        let bins: Vec<&str> = manifest
            .lines()
            .filter_map(|l| l.strip_prefix("name = \""))
            .filter_map(|l| l.strip_suffix('"'))
            .filter(|n| *n != "reactor-fuzz")
            .collect();
        assert_eq!(bins, TARGETS);
    }

    #[test]
    fn figures_come_from_the_final_stats_and_the_last_status_line() {
        let log = "#2\tINITED cov: 10 ft: 12 corp: 1/1b exec/s: 0 rss: 30Mb\n\
                   #5000\tDONE   cov: 812 ft: 2301 corp: 140/9876b lim: 4096 exec/s: 2500 rss: 60Mb\n\
                   stat::number_of_executed_units: 5000\n\
                   stat::average_exec_per_sec:     2500\n";
        let o = figures("t", log);
        assert_eq!(
            (o.execs, o.execs_per_sec, o.corpus, o.cov, o.ft),
            (5000, 2500, 140, 812, 2301)
        );
    }

    #[test]
    fn unknown_targets_and_options_are_refused() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(options(&args(&["--only", "config,nope"])).is_err());
        assert!(options(&args(&["--minutes", "3"])).is_err());
        let o = options(&args(&["--seconds", "7", "--only", "plan,api"])).unwrap();
        assert_eq!((o.seconds, o.only.len()), (7, 2));
    }
}
