//! `cargo xtask`: the project's own tasks, so a fresh machine needs only `cargo` to start.
//!
//! Both user-facing commands (`cargo xtask run`, `cargo xtask test`) go through [`setup`],
//! which installs whatever the eBPF build and the kernel tests need and is quick when it is
//! all there already.

mod bench;
mod chaos;
mod cmd;
mod deb;
mod fuzz;
mod house;
mod setup;
mod vm;
mod vm_systemd;

use std::process::Command;

use anyhow::{bail, Result};

// The helpers every task uses, by the names the tasks know them by (`crate::sh`).
pub(crate) use cmd::{cargo, require_in_ci, sh};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  setup        install the eBPF toolchain (nightly + rust-src, LLVM 22, bpf-linker) and
               cargo-fuzz, mount tracefs/bpffs, install containerd/runc/busybox-static for
               the CRI tests and systemd-analyze/rsvg-convert for the offline checks;
               idempotent
  test         `house`, setup, then fmt check, clippy, every test (unit, integration, doc;
               the systemd unit verified offline), a 2-minute `chaos` run (seed 41), the
               cgroup v2 guest suite (`vm-test`), every fuzz target for a few seconds (the
               release and fuzz builds run at idle priority meanwhile), and `bench --quick` (fails only if the bench harness breaks; its SVG charts
               must exist and render), `deb --check`, and `vm-test --systemd`
  bench [--quick] [--only PART,...] [--concurrent-reps N] [--soak-minutes N] [...]
               the agent side by side with the kubelet's mechanisms (root; real kernel):
               detection lag by source, OOM avoidance, decision cost, ring buffer, footprint,
               API load, charge cost, concurrent pressure (soft then hard, two hogs, a
               frozen victim: agent against a kubelet-like loop); tables on stdout, figures
               in target/bench/bench.json and report.md. `--only soak` runs the soak (about
               10 minutes, 50 API clients and a hog every 30 s: RSS and reaction over time),
               which the default run leaves out; `--quick` runs 2 repetitions of concurrent
               and no soak
  chaos [--minutes N] [--seed S] [--containerd] [--keep-going] [--no-build]
               a seeded chaos run against the real agent (root, cgroup v1; default 2
               minutes, seed from the clock): pods of every QoS and priority the host runs,
               hogs, stubborn, frozen and multi-process pods, page-cache writers, fork
               storms, disk fillers on a run-owned tmpfs, the agent (and with `--containerd`
               a private containerd running the pods) SIGKILLed and restarted;
               the invariants of docs/reliability.md checked throughout. The same seed
               plays the same schedule; a failure prints the seed and the last actions
               before it (and stops the run, unless `--keep-going`).
  chaos --v2 [--no-build]
               the short chaos run in the cgroup v2 guest (seed 41, 1.5 minutes on a
               384 MiB node; about 7 minutes of emulation): `vm-test` with that check alone
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
  house [--root DIR]
               the house rules on the source tree of every crate, no build, no root: no
               file over 1,000 lines, no circle of imports between files (parent and child
               included), the agent library's floors, relative links in README and docs/;
               one line per fault. `--root` or REACTOR_HOUSE_ROOT: another checkout
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
        "chaos" => match chaos::v2_vm_args(&rest)? {
            Some(vm) => vm_test(&vm),
            None => chaos::run(&rest),
        },
        "vm-test" => vm_test(&rest),
        "deb" => deb::run(&rest),
        "house" => house::run(&rest),
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

fn test(extra: &[String]) -> Result<()> {
    // The house rules first: they need no toolchain but cargo and no build, and a fault in
    // them is cheaper to hear about before the minutes of setup and builds.
    house::run(&[])?;
    setup::run()?;
    sh(cargo().args(["fmt", "--all", "--check"]))?;
    // Integration tests run the `reactor` binary itself, so build it first.
    sh(cargo().args(["build", "--workspace", "--bins"]))?;
    // The release build the bench, the package and `cargo xtask run` use: minutes of CPU on
    // a fresh clone, taken while the tests below wait on the kernel, at idle priority so it
    // never competes with them (cargo locks each profile's build apart).
    let release = release_build_in_background()?;
    let fuzz_build = fuzz::build_in_background()?;
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
    // Two minutes of chaos on this host (the binaries were built above); a fixed seed, so
    // a failure in CI is repeated by the same command.
    chaos::run(&[
        "--minutes".to_string(),
        "2".to_string(),
        "--seed".to_string(),
        "41".to_string(),
        "--no-build".to_string(),
    ])?;
    // The cgroup v2 suite in its guest (the binaries were built above).
    vm_test(&["--no-build".to_string()])?;
    // Every fuzz target briefly, from the committed seeds: a parser that panics on an input
    // the fuzzer finds within seconds fails here (the long runs are `cargo xtask fuzz`).
    // Last among the tests, so that its build has had the idle CPU of all of them.
    fuzz_build.wait()?;
    fuzz::run(&["--seconds".to_string(), fuzz::CI_SECONDS.to_string()])?;
    release.wait()?;
    // The benchmark harness, briefly: it fails only when the harness breaks, never on slow
    // figures.
    bench::run(&["--quick".to_string()])?;
    bench::check_charts()?;
    // The Debian package, from the release binary the bench built, then installed and run
    // under systemd in the v2 guest.
    deb::run(&["--no-build".to_string(), "--check".to_string()])?;
    vm_test(&["--systemd".to_string(), "--no-build".to_string()])
}

/// Starts [`bench::build`] and the bench harness's build in the background
/// ([`cmd::Background`]), its output in `target/release-build.log`.
fn release_build_in_background() -> Result<cmd::Background> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let script = format!(
        "'{cargo}' {} && '{cargo}' {}",
        bench::BUILD.join(" "),
        bench::BUILD_HARNESS.join(" ")
    );
    let target = vm::target_dir();
    std::fs::create_dir_all(&target)?;
    cmd::Background::start(&script, &target.join("release-build.log"))
}

/// `cargo xtask vm-test`: the cgroup v2 suite in its guest, or with `--systemd` the
/// deployment checks, on the same kernel. Chosen here, above both: the systemd guest boots
/// through the suite's `vm::boot_qemu`, so `vm` calling into `vm_systemd` made a circle.
fn vm_test(args: &[String]) -> Result<()> {
    let (opts, kernel) = vm::prepare(args)?;
    if opts.systemd {
        vm_systemd::run(&opts, &kernel.vmlinux)
    } else {
        vm::run(&opts, &kernel)
    }
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
