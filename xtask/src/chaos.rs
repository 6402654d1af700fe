//! `cargo xtask chaos [--minutes N] [--seed S] [--containerd] [--keep-going] [--no-build]`:
//! a seeded chaos run against the real agent on this host (root, cgroup v1), with the
//! process runtime or (`--containerd`) a private containerd that is killed and restarted
//! too: the `chaos` binary of `reactor-tests` (`tests/src/chaos/`, invariants in
//! docs/reliability.md). The same seed plays the same schedule; a failure prints the seed
//! and the last actions before it, and fails the task (at once, or with `--keep-going` at
//! the end, every violation told as it is found). `cargo xtask chaos --v2 [--no-build]`
//! boots the cgroup v2 guest for its short run instead ([`V2_CHECK`]).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Result};

use crate::{cargo, sh};

/// The v2 guest's chaos check (`tests/src/v2/chaos.rs`), which `--v2` boots the guest for.
pub(crate) const V2_CHECK: &str = "chaos_short_run_keeps_every_invariant";

/// With `--v2`, the `vm-test` arguments that run the short chaos run in the cgroup v2 guest
/// (its seed and length are the check's own); `None` without it.
pub(crate) fn v2_vm_args(args: &[String]) -> Result<Option<Vec<String>>> {
    if !args.iter().any(|a| a == "--v2") {
        return Ok(None);
    }
    let mut out = vec!["--only".to_string(), V2_CHECK.to_string()];
    for a in args.iter().filter(|a| *a != "--v2") {
        match a.as_str() {
            "--no-build" => out.push(a.clone()),
            other => bail!(
                "chaos --v2: {other:?} does not apply (the guest's run has its seed and \
                 length in tests/src/v2/chaos.rs; only --no-build goes with --v2)"
            ),
        }
    }
    Ok(Some(out))
}

/// What the task was asked for.
#[derive(Debug, PartialEq)]
struct Args {
    minutes: String,
    seed: Option<String>,
    build: bool,
    containerd: bool,
    keep_going: bool,
}

fn parse(args: &[String]) -> Result<Args> {
    let mut out = Args {
        minutes: "2".into(),
        seed: None,
        build: true,
        containerd: false,
        keep_going: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--minutes" | "--seed" => {
                let Some(v) = it.next() else {
                    bail!("{a} needs a value");
                };
                if v.parse::<f64>().is_err() || (a == "--seed" && v.parse::<u64>().is_err()) {
                    bail!("{a} {v}: not a number");
                }
                if a == "--minutes" {
                    out.minutes = v.clone();
                } else {
                    out.seed = Some(v.clone());
                }
            }
            "--no-build" => out.build = false,
            "--containerd" => out.containerd = true,
            "--keep-going" => out.keep_going = true,
            other => bail!("chaos: unknown argument {other:?}"),
        }
    }
    Ok(out)
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => PathBuf::from(t),
        None => {
            let xtask = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
            xtask.parent().unwrap_or(xtask).join("target")
        }
    }
}

/// Builds the agent and the test helpers (debug, as the integration tests run them) unless
/// told not to, then runs the chaos binary.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let a = parse(args)?;
    if a.build {
        sh(cargo().args(["build", "-p", "reactor", "-p", "reactor-tests", "--bins"]))?;
    }
    let mut cmd = Command::new(target_dir().join("debug/chaos"));
    cmd.args(["--minutes", &a.minutes]);
    if let Some(seed) = &a.seed {
        cmd.args(["--seed", seed]);
    }
    if a.containerd {
        cmd.arg("--containerd");
    }
    if a.keep_going {
        cmd.arg("--keep-going");
    }
    sh(&mut cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(a: &[&str]) -> Vec<String> {
        a.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn arguments_are_read_and_bad_ones_refused() {
        assert_eq!(
            parse(&s(&["--minutes", "30", "--seed", "7", "--no-build"])).unwrap(),
            Args {
                minutes: "30".into(),
                seed: Some("7".into()),
                build: false,
                containerd: false,
                keep_going: false,
            }
        );
        assert_eq!(parse(&[]).unwrap().minutes, "2");
        assert!(parse(&s(&["--containerd"])).unwrap().containerd);
        assert!(parse(&s(&["--keep-going"])).unwrap().keep_going);
        assert!(parse(&s(&["--seed", "x"])).is_err());
        assert!(parse(&s(&["--seed", "1.5"])).is_err());
        assert!(parse(&s(&["--minutes"])).is_err());
        assert!(parse(&s(&["--containerd-please"])).is_err());
    }

    #[test]
    fn v2_boots_the_guest_for_its_check_alone() {
        assert_eq!(v2_vm_args(&s(&["--seed", "3"])).unwrap(), None);
        assert_eq!(
            v2_vm_args(&s(&["--v2", "--no-build"])).unwrap(),
            Some(s(&["--only", V2_CHECK, "--no-build"]))
        );
        let err = v2_vm_args(&s(&["--v2", "--seed", "3"])).unwrap_err();
        assert!(
            err.to_string().contains("\"--seed\" does not apply"),
            "{err}"
        );
    }
}
