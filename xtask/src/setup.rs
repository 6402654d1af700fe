//! Installs what the build and the kernel tests need, idempotently.
//!
//! Each step first checks whether its tool is already there, so on a prepared machine the
//! whole setup is a handful of version probes.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result};

use crate::sh;

/// Debian packages bpf-linker is built against.
const LLVM_PACKAGES: &[&str] = &["llvm-22-dev", "libpolly-22-dev"];

/// Everything the project needs, in order.
pub(crate) fn run() -> Result<()> {
    nightly_with_rust_src()?;
    cargo_fuzz()?;
    bpf_linker()?;
    kernel_filesystems()?;
    container_runtime()?;
    check_tools()?;
    Ok(())
}

/// Whether `cmd` ran and succeeded, its output discarded.
pub(crate) fn quiet(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn output(cmd: &mut Command) -> String {
    cmd.stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Refreshes apt's lists and installs `packages` without their recommends,
/// non-interactively; nothing when `packages` is empty.
pub(crate) fn apt_install(packages: &[&str]) -> Result<()> {
    if packages.is_empty() {
        return Ok(());
    }
    sh(Command::new("apt-get").arg("update").arg("-qq"))?;
    sh(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

pub(crate) fn is_root() -> bool {
    output(Command::new("id").arg("-u")).trim() == "0"
}

/// The eBPF programs build with nightly's `-Z build-std=core`, which needs `rust-src`.
fn nightly_with_rust_src() -> Result<()> {
    if !quiet(Command::new("rustup").args(["run", "nightly", "rustc", "--version"])) {
        sh(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))?;
    }
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]));
    if !installed.lines().any(|l| l.starts_with("rust-src")) {
        sh(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }
    Ok(())
}

/// cargo-fuzz builds and runs the fuzz targets (`cargo xtask fuzz`); installed from
/// crates.io with the nightly above, which its builds need.
fn cargo_fuzz() -> Result<()> {
    if quiet(Command::new("cargo").args(["+nightly", "fuzz", "--version"])) {
        return Ok(());
    }
    sh(Command::new("cargo").args(["+nightly", "install", "cargo-fuzz", "--locked"]))
        .context("installing cargo-fuzz")
}

/// bpf-linker links the eBPF object; it is built from crates.io against Debian's LLVM 22.
fn bpf_linker() -> Result<()> {
    if quiet(Command::new("bpf-linker").arg("--version")) {
        return Ok(());
    }
    let missing: Vec<&str> = LLVM_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            !output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .contains("install ok installed")
        })
        .collect();
    if !missing.is_empty() {
        sh(Command::new("apt-get").arg("update").arg("-qq"))?;
        sh(Command::new("apt-get")
            .args(["install", "-y", "-qq"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    // bpf-linker's build finds LLVM through the `llvm-config` on PATH, which on Debian may
    // belong to an older LLVM; point it at LLVM 22 explicitly.
    sh(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .env("LLVM_PREFIX", "/usr/lib/llvm-22")
            .args([
                "install",
                "bpf-linker",
                "--no-default-features",
                "--features",
                "llvm-22",
            ]),
    )
    .context("installing bpf-linker")
}

/// tracefs (tracepoint ids) and bpffs (pinned maps) must be mounted for the kernel tests.
fn kernel_filesystems() -> Result<()> {
    if !is_root() {
        eprintln!("xtask: not root: not mounting tracefs/bpffs (kernel tests will skip)");
        return Ok(());
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let mounted = |fstype: &str, at: &str| {
        mounts.lines().any(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, ty) = (f.next(), f.next(), f.next());
            dir == Some(at) && ty == Some(fstype)
        })
    };
    if !mounted("tracefs", "/sys/kernel/tracing") && Path::new("/sys/kernel/tracing").is_dir() {
        sh(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]))?;
    }
    if !mounted("bpf", "/sys/fs/bpf") && Path::new("/sys/fs/bpf").is_dir() {
        sh(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))?;
    }
    Ok(())
}

/// Debian packages the CRI tests run against: a real containerd with runc, and a static
/// busybox the tests put into the images they build.
const RUNTIME_PACKAGES: &[(&str, &str)] = &[
    ("containerd", "/usr/bin/containerd"),
    ("runc", "/usr/sbin/runc"),
    ("busybox-static", "/bin/busybox"),
];

/// containerd, runc and busybox for the CRI integration tests; only as root (the tests need
/// root anyway), and only the packages whose binary is missing.
fn container_runtime() -> Result<()> {
    if !is_root() {
        eprintln!("xtask: not root: not installing containerd/runc (CRI tests will skip)");
        return Ok(());
    }
    // Checked by package, not only by file: Debian's dynamic `busybox` also installs
    // /bin/busybox, which would not run inside the tests' images.
    let missing: Vec<&str> = RUNTIME_PACKAGES
        .iter()
        .filter(|(pkg, bin)| {
            !Path::new(bin).exists()
                || !output(Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]))
                    .contains("install ok installed")
        })
        .map(|(pkg, _)| *pkg)
        .collect();
    apt_install(&missing).context("installing containerd, runc and busybox-static")
}

/// Whether `cargo nextest` is available (it is on these machines; plain `cargo test` otherwise).
pub(crate) fn have_nextest() -> bool {
    quiet(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["nextest", "--version"]),
    )
}

/// Debian packages the test command's offline checks use: `systemd-analyze verify` for the
/// systemd unit, `rsvg-convert` to render the bench's SVG charts, `dpkg-shlibdeps` and
/// lintian for the Debian package.
const CHECK_TOOLS: &[(&str, &str)] = &[
    ("systemd", "/usr/bin/systemd-analyze"),
    ("librsvg2-bin", "/usr/bin/rsvg-convert"),
    ("dpkg-dev", "/usr/bin/dpkg-shlibdeps"),
    ("lintian", "/usr/bin/lintian"),
];

/// The check tools whose binary is missing; only as root.
fn check_tools() -> Result<()> {
    let missing: Vec<&str> = CHECK_TOOLS
        .iter()
        .filter(|(_, bin)| !Path::new(bin).exists())
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        eprintln!("xtask: not root: not installing {}", missing.join(", "));
        return Ok(());
    }
    apt_install(&missing).with_context(|| format!("installing {}", missing.join(", ")))
}
