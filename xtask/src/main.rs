//! `cargo xtask`: the project's own tasks, so a fresh machine needs only `cargo` to start.
//!
//! Both user-facing commands (`cargo xtask run`, `cargo xtask test`) go through [`setup`],
//! which installs whatever the eBPF build and the kernel tests need and is quick when it is
//! all there already.

mod bench;
mod deb;
mod fuzz;
mod setup;
mod vm;
mod vm_systemd;

use std::process::Command;

use anyhow::{bail, Context, Result};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  setup        install the eBPF toolchain (nightly + rust-src, LLVM 22, bpf-linker) and
               cargo-fuzz, mount tracefs/bpffs, install containerd/runc/busybox-static for
               the CRI tests and systemd-analyze/rsvg-convert for the offline checks;
               idempotent
  test         setup, then fmt check, clippy, every test (unit, integration, doc; the
               systemd unit verified offline), every fuzz target for a few seconds, the
               cgroup v2 guest suite (`vm-test`), and `bench --quick` (fails only if the
               bench harness breaks; its SVG charts must exist and render), `deb --check`,
               and `vm-test --systemd`
  bench [--quick] [--only PART,...] [--concurrent-reps N] [--soak-minutes N] [...]
               the agent side by side with the kubelet's mechanisms (root; real kernel):
               detection lag by source, OOM avoidance, decision cost, ring buffer, footprint,
               API load, charge cost, concurrent pressure (soft then hard, two hogs, a
               frozen victim: agent against a kubelet-like loop); tables on stdout, figures
               in target/bench/bench.json and report.md. `--only soak` runs the soak (about
               10 minutes, 50 API clients and a hog every 30 s: RSS and reaction over time),
               which the default run leaves out; `--quick` runs 2 repetitions of concurrent
               and no soak
  vm-test [--systemd] [--only NAME,NAME] [--timeout SECS] [--mem MIB] [--no-build]
               the cgroup v2 suite in a QEMU guest (TCG) with a real v2 memory controller:
               fetches and caches a Debian kernel, builds an initramfs with the agent and
               the suite, boots once, fails naming the failing tests (root, network once).
               `--systemd`: the deployment checks instead, in the same kernel with a Debian
               trixie root (debootstrap, built once into target/vm-systemd) and Debian's
               systemd as PID 1: the package installed with dpkg, the unit started with
               systemctl (docs/operating.md)
  deb [--revision N] [--no-build] [--check]
               the Debian package target/deb/reactor_<version>-<N>_amd64.deb (release
               binary, systemd unit, /etc/reactor/config.yaml as a conffile, docs);
               `--check` reads it back, runs lintian, and installs, upgrades, removes and
               purges it in a scratch root (never the host's)
  fuzz [--seconds N] [--only TARGET,...] [--seeds]
               the cargo-fuzz targets in fuzz/, one per parser the agent reads from disk
               and sockets (config, pod documents, the four checkpoints, the kill journal,
               plan inputs, API messages), built with nightly and run one after another for
               N seconds each (default 60); a crash fails it, naming the input kept.
               `--seeds` collects fuzz/seeds/ from the tests' inputs instead
  run [ARGS]   setup, build the agent in release mode and run `reactor ARGS`
               (default: `run`, the agent on this node)";

fn main() -> Result<()> {
    cargo_bin_on_path();
    let mut args = std::env::args().skip(1);
    let Some(cmd) = args.next() else {
        println!("{USAGE}");
        return Ok(());
    };
    let rest: Vec<String> = args.collect();
    match cmd.as_str() {
        "setup" => setup::run(),
        "test" => test(&rest),
        "run" => run(&rest),
        "bench" => bench::run(&rest),
        "vm-test" => vm::run(&rest),
        "deb" => deb::run(&rest),
        "fuzz" => {
            setup::run()?;
            fuzz::run(&rest)
        }
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown xtask command {other:?}\n{USAGE}"),
    }
}

/// Puts `$HOME/.cargo/bin` on PATH for every command xtask starts: the agent's build script
/// runs `bpf-linker` from there (`cargo install` puts it there), and a shell that reached
/// `cargo` through rustup's proxy may not have it on PATH.
fn cargo_bin_on_path() {
    let Some(home) = std::env::var_os("HOME") else {
        return;
    };
    let bin = std::path::Path::new(&home).join(".cargo/bin");
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|p| p == bin) {
        return;
    }
    let joined = std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(&path)));
    if let Ok(joined) = joined {
        // Single-threaded here: nothing else reads the environment concurrently.
        std::env::set_var("PATH", joined);
    }
}

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

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn test(extra: &[String]) -> Result<()> {
    setup::run()?;
    sh(cargo().args(["fmt", "--all", "--check"]))?;
    // Integration tests run the `reactor` binary itself, so build it first.
    sh(cargo().args(["build", "--workspace", "--bins"]))?;
    sh(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    if setup::have_nextest() {
        sh(cargo()
            .args([
                "nextest",
                "run",
                "--workspace",
                "--no-fail-fast",
                "--profile",
                "ci",
            ])
            .args(extra))?;
    } else {
        sh(cargo()
            .args(["test", "--workspace", "--no-fail-fast"])
            .args(extra))?;
    }
    sh(cargo().args(["test", "--workspace", "--doc"]))?;
    // Every fuzz target briefly, from the committed seeds: a parser that panics on an input
    // the fuzzer finds within seconds fails here (the long runs are `cargo xtask fuzz`).
    fuzz::run(&["--seconds".to_string(), fuzz::CI_SECONDS.to_string()])?;
    // The cgroup v2 suite in its guest (the binaries were built above).
    vm::run(&["--no-build".to_string()])?;
    // The benchmark harness, briefly: it fails only when the harness breaks, never on slow
    // figures.
    bench::run(&["--quick".to_string()])?;
    bench::check_charts()?;
    // The Debian package, from the release binary the bench built, then installed and run
    // under systemd in the v2 guest.
    deb::run(&["--no-build".to_string(), "--check".to_string()])?;
    vm::run(&[
        "--systemd".to_string(),
        "--no-build".to_string(),
        "--only".to_string(),
        vm_systemd::CI_CHECKS.join(","),
    ])
}

fn run(extra: &[String]) -> Result<()> {
    setup::run()?;
    // The same build as the bench's (`bench::build`): built alone, `reactor` would get other
    // features of its dependencies than beside the test helpers, and be rebuilt for minutes
    // straight after `cargo xtask test`.
    bench::build()?;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin = root.join("target/release/reactor");
    sh(Command::new(bin).args(reactor_args(extra)))
}

/// What `cargo xtask run ARGS` passes to `reactor`: `run` when there is nothing, else the
/// arguments without a leading `--` (the README's `cargo xtask run -- ARGS`: cargo hands the
/// separator on to xtask, and `reactor` would take it as an argument).
fn reactor_args(extra: &[String]) -> Vec<String> {
    let extra = match extra.split_first() {
        Some((first, rest)) if first == "--" => rest,
        _ => extra,
    };
    if extra.is_empty() {
        vec!["run".into()]
    } else {
        extra.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::reactor_args;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_separator_before_reactor_s_arguments_is_not_passed_on() {
        assert_eq!(reactor_args(&[]), args(&["run"]));
        assert_eq!(reactor_args(&args(&["--"])), args(&["run"]));
        assert_eq!(
            reactor_args(&args(&["--", "--version"])),
            args(&["--version"])
        );
        assert_eq!(
            reactor_args(&args(&["status", "--json"])),
            args(&["status", "--json"])
        );
        assert_eq!(
            reactor_args(&args(&["--", "plan", "--", "x"])),
            args(&["plan", "--", "x"]),
            "only the first separator is cargo's"
        );
    }
}
