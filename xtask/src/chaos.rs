//! `cargo xtask chaos [--minutes N] [--seed S] [--containerd] [--keep-going] [--no-build]`:
//! a seeded chaos run against the real agent on this host (root, cgroup v1), with the
//! process runtime or (`--containerd`) a private containerd that is killed and restarted
//! too: the `chaos` binary of `reactor-tests` (`tests/src/chaos/`, invariants in
//! docs/reliability.md). The same seed plays the same schedule; a failure prints the seed
//! and the last actions before it, and fails the task (at once, or with `--keep-going` at
//! the end, every violation told as it is found).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Result};

use crate::{cargo, sh};

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
}
