//! `cargo xtask deb`: the Debian package, `target/deb/reactor_<version>_amd64.deb`.
//!
//! Built with `dpkg-deb` from a staged tree, not with cargo-deb: the package is one binary,
//! one unit, one conffile and the docs, which a staged tree states directly, while the
//! maintainer scripts (the part that needs care) are ours either way; `dpkg-deb` and
//! `dpkg-shlibdeps` are on every Debian machine, and nothing more is installed from
//! crates.io.
//!
//! - **Contents.** `/usr/bin/reactor` (the release binary, debug information stripped),
//!   `/lib/systemd/system/reactor.service` (`deploy/systemd/reactor.service`),
//!   `/etc/reactor/config.yaml` (`deploy/debian/config.yaml`, a conffile), and
//!   `/usr/share/doc/reactor/` (the README, `docs/*.md`, `copyright`, `changelog.Debian.gz`),
//!   and a manual page (`deploy/debian/reactor.1`).
//! - **Depends** is what `dpkg-shlibdeps` finds for the binary's shared libraries.
//! - **Maintainer scripts** (`deploy/debian/`): the unit is neither enabled nor started by
//!   the install (an operator edits the config, then `systemctl enable --now reactor`); an
//!   upgrade restarts a running agent (its pods stay: `KillMode=process`); `remove` stops it;
//!   `purge` forgets the unit's enablement and removes `/var/lib/reactor`.
//! - **`--check`** builds the package, reads it back with `dpkg-deb --info/--contents`,
//!   runs lintian when it is installed (errors fail), and takes it through install, upgrade
//!   with an edited conffile, remove and purge in a scratch root (`dpkg --root`, maintainer
//!   scripts run without chroot and see `DPKG_ROOT`), never the host's own.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, ensure, Context, Result};

use crate::{cargo, sh};

const USAGE: &str = "usage: cargo xtask deb [--revision N] [--no-build] [--check]";

/// The package's maintainer, as the control file and the changelog name it.
const MAINTAINER: &str = "reactor developers <reactor@example.invalid>";

struct Options {
    revision: u32,
    build: bool,
    check: bool,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        revision: 1,
        build: true,
        check: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--revision" => {
                let v = it
                    .next()
                    .with_context(|| format!("--revision needs a value\n{USAGE}"))?;
                o.revision = v
                    .parse()
                    .with_context(|| format!("--revision {v:?} is not a whole number"))?;
            }
            "--no-build" => o.build = false,
            "--check" => o.check = true,
            other => bail!("unknown deb argument {other:?}\n{USAGE}"),
        }
    }
    Ok(o)
}

fn workspace() -> PathBuf {
    let xtask = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask.parent().unwrap_or(xtask).to_path_buf()
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => PathBuf::from(t),
        None => workspace().join("target"),
    }
}

/// `cargo xtask deb`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let opts = parse(args)?;
    if opts.build {
        build_release()?;
    }
    let deb = build(opts.revision)?;
    println!("{}", deb.display());
    if opts.check {
        check(&deb, opts.revision)?;
    }
    Ok(())
}

/// The release binaries, built as `cargo xtask bench` builds them (the same features, so
/// one build serves both).
pub(crate) fn build_release() -> Result<()> {
    sh(cargo().args([
        "build",
        "--release",
        "-p",
        "reactor",
        "-p",
        "reactor-tests",
        "--bins",
    ]))
}

/// The workspace version (`[workspace.package] version`).
fn upstream_version() -> Result<String> {
    let manifest = std::fs::read_to_string(workspace().join("Cargo.toml"))?;
    let mut in_package = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[workspace.package]";
        } else if in_package {
            if let Some(v) = line.strip_prefix("version") {
                let v = v
                    .trim_start()
                    .trim_start_matches('=')
                    .trim()
                    .trim_matches('"');
                return Ok(v.to_string());
            }
        }
    }
    bail!("no version in Cargo.toml's [workspace.package]")
}

/// The Debian version: the workspace version and the package revision.
fn debian_version(revision: u32) -> Result<String> {
    Ok(format!("{}-{revision}", upstream_version()?))
}

/// Where `cargo xtask deb --revision N` writes its package.
pub(crate) fn deb_path(revision: u32) -> Result<PathBuf> {
    Ok(target_dir()
        .join("deb")
        .join(format!("reactor_{}_amd64.deb", debian_version(revision)?)))
}

fn write(path: &Path, text: impl AsRef<[u8]>, mode: u32) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Every directory below `root` 0755 (a checkout's umask must not leak into the package).
fn normalise_dirs(root: &Path) -> Result<()> {
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755))?;
    for e in std::fs::read_dir(root)? {
        let p = e?.path();
        if p.is_dir() && !p.is_symlink() {
            normalise_dirs(&p)?;
        }
    }
    Ok(())
}

/// The date of the last commit (RFC 2822), so the same tree gives the same changelog.
fn commit_date() -> String {
    last_commit("%cD", "Thu, 01 Jan 1970 00:00:00 +0000")
}

/// A field of the last commit (`git log -1 --format=FORMAT`), or `fallback` outside a git
/// checkout: the package's dates come from the tree, not the clock.
fn last_commit(format: &str, fallback: &str) -> String {
    Command::new("git")
        .args(["log", "-1", &format!("--format={format}")])
        .current_dir(workspace())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| fallback.to_string())
}

/// `Depends` from `dpkg-shlibdeps` (it wants a `debian/control` beside it).
fn shlib_depends(bin: &Path, scratch: &Path) -> Result<String> {
    write(
        &scratch.join("debian/control"),
        "Source: reactor\n\nPackage: reactor\nArchitecture: amd64\n",
        0o644,
    )?;
    let out = Command::new("dpkg-shlibdeps")
        .arg("-O")
        .arg(bin)
        .current_dir(scratch)
        .output()
        .context("running dpkg-shlibdeps (Debian's dpkg-dev)")?;
    ensure!(
        out.status.success(),
        "dpkg-shlibdeps {}: {}",
        bin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("shlibs:Depends="))
        .map(str::to_string)
        .with_context(|| format!("dpkg-shlibdeps printed no shlibs:Depends: {text}"))
}

/// Stages the tree and builds the package; returns its path.
pub(crate) fn build(revision: u32) -> Result<PathBuf> {
    let ws = workspace();
    let version = debian_version(revision)?;
    let bin = target_dir().join("release/reactor");
    ensure!(
        bin.exists(),
        "{} is missing: run `cargo xtask deb` without --no-build",
        bin.display()
    );
    let out_dir = target_dir().join("deb");
    let stage = out_dir.join(format!("reactor_{version}_amd64"));
    if stage.exists() {
        std::fs::remove_dir_all(&stage)?;
    }
    std::fs::create_dir_all(&stage)?;

    // The binary, stripped as Debian's tooling strips it.
    let installed_bin = stage.join("usr/bin/reactor");
    std::fs::create_dir_all(installed_bin.parent().context("usr/bin")?)?;
    sh(Command::new("strip")
        .args([
            "--strip-unneeded",
            "--remove-section=.comment",
            "--remove-section=.note",
            "-o",
        ])
        .arg(&installed_bin)
        .arg(&bin))?;
    std::fs::set_permissions(&installed_bin, std::fs::Permissions::from_mode(0o755))?;

    let read =
        |p: &str| std::fs::read_to_string(ws.join(p)).with_context(|| format!("reading {p}"));
    write(
        &stage.join("lib/systemd/system/reactor.service"),
        read("deploy/systemd/reactor.service")?,
        0o644,
    )?;
    write(
        &stage.join("etc/reactor/config.yaml"),
        read("deploy/debian/config.yaml")?,
        0o644,
    )?;

    // The docs, as the repository lays them out (the README's links keep working).
    let doc = stage.join("usr/share/doc/reactor");
    write(&doc.join("README.md"), read("README.md")?, 0o644)?;
    let mut pages: Vec<PathBuf> = std::fs::read_dir(ws.join("docs"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    for p in pages {
        let name = p.file_name().context("doc name")?;
        write(&doc.join("docs").join(name), std::fs::read(&p)?, 0o644)?;
    }
    write(&doc.join("copyright"), copyright(), 0o644)?;
    gzip_into(
        read("deploy/debian/reactor.1")?.as_bytes(),
        &stage.join("usr/share/man/man1/reactor.1.gz"),
    )?;
    let changelog = format!(
        "reactor ({version}) unstable; urgency=medium\n\n  * Built from the reactor \
         workspace with `cargo xtask deb`.\n\n -- {MAINTAINER}  {}\n",
        commit_date()
    );
    gzip_into(changelog.as_bytes(), &doc.join("changelog.Debian.gz"))?;

    // Control area.
    let control = stage.join("DEBIAN");
    std::fs::create_dir_all(&control)?;
    for script in ["postinst", "prerm", "postrm"] {
        write(
            &control.join(script),
            read(&format!("deploy/debian/{script}"))?,
            0o755,
        )?;
    }
    write(
        &control.join("conffiles"),
        "/etc/reactor/config.yaml\n",
        0o644,
    )?;
    let depends = shlib_depends(&bin, &out_dir.join("shlibdeps"))?;
    normalise_dirs(&stage)?;
    let installed_kib = disk_usage_kib(&stage, &control)?;
    let description = "node-pressure agent that evicts pods by the kubelet's rules";
    write(
        &control.join("control"),
        format!(
            "Package: reactor\n\
             Version: {version}\n\
             Architecture: amd64\n\
             Maintainer: {MAINTAINER}\n\
             Installed-Size: {installed_kib}\n\
             Depends: {depends}\n\
             Section: admin\n\
             Priority: optional\n\
             Homepage: https://example.invalid/reactor\n\
             Description: {description}\n \
             reactor does what the kubelet does when a node runs short of memory, disk\n \
             or pids: it ranks pods and evicts them, reclaims images first, lets\n \
             critical pods preempt, and gives every pod the QoS cgroup hierarchy. It\n \
             hears the kernel directly, through eBPF programs on kernel tracepoints,\n \
             PSI triggers and memcg notifications, so it acts within the kernel's own\n \
             reaction time instead of polling.\n \
             .\n \
             It is for standalone and edge nodes that run pods without a cluster; it\n \
             runs as the systemd service reactor.service.\n"
        ),
        0o644,
    )?;

    let deb = deb_path(revision)?;
    sh(Command::new("dpkg-deb")
        .args(["--build", "--root-owner-group", "-Zxz"])
        .arg(&stage)
        .arg(&deb)
        .env("SOURCE_DATE_EPOCH", commit_epoch()))?;
    Ok(deb)
}

/// `gzip -9n` of `bytes` into `dst` (no name or time in the header: reproducible), 0644.
fn gzip_into(bytes: &[u8], dst: &Path) -> Result<()> {
    if let Some(dir) = dst.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut gzip = Command::new("gzip")
        .args(["-9n", "-c"])
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(dst)?)
        .spawn()
        .context("starting gzip")?;
    {
        use std::io::Write as _;
        gzip.stdin.take().context("gzip stdin")?.write_all(bytes)?;
    }
    ensure!(gzip.wait()?.success(), "gzip into {} failed", dst.display());
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(0o644))?;
    Ok(())
}

/// The last commit's time, Unix seconds (`SOURCE_DATE_EPOCH`).
fn commit_epoch() -> String {
    last_commit("%ct", "0")
}

/// The installed size in KiB, as dpkg-gencontrol counts it: each file rounded up to a KiB,
/// each directory one; the control area left out.
fn disk_usage_kib(dir: &Path, skip: &Path) -> Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p == skip {
            continue;
        }
        let meta = std::fs::symlink_metadata(&p)?;
        if meta.is_dir() {
            total += 1 + disk_usage_kib(&p, skip)?;
        } else {
            total += meta.len().div_ceil(1024).max(1);
        }
    }
    Ok(total)
}

/// The machine-readable copyright file.
fn copyright() -> String {
    "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
     Upstream-Name: reactor\n\
     Source: https://example.invalid/reactor\n\
     \n\
     Files: *\n\
     Copyright: 2026 the reactor developers\n\
     License: Apache-2.0\n\
     \n\
     License: Apache-2.0\n \
     Licensed under the Apache License, Version 2.0 (the \"License\"); you may not\n \
     use this file except in compliance with the License. You may obtain a copy of\n \
     the License at http://www.apache.org/licenses/LICENSE-2.0\n \
     .\n \
     Unless required by applicable law or agreed to in writing, software\n \
     distributed under the License is distributed on an \"AS IS\" BASIS, WITHOUT\n \
     WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the\n \
     License for the specific language governing permissions and limitations under\n \
     the License.\n \
     .\n \
     On Debian systems, the full text of the Apache License 2.0 is in\n \
     /usr/share/common-licenses/Apache-2.0.\n"
        .to_string()
}

/// What a command printed on stdout; fails with its stderr when it fails.
fn capture(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot start {shown}"))?;
    ensure!(
        out.status.success(),
        "{shown} failed: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A scratch root of its own, removed when dropped.
struct ScratchRoot(PathBuf);

impl ScratchRoot {
    fn new() -> Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("reactor-deb-check-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let admin = dir.join("var/lib/dpkg");
        for d in ["info", "updates", "triggers"] {
            std::fs::create_dir_all(admin.join(d))?;
        }
        std::fs::write(admin.join("status"), "")?;
        std::fs::write(admin.join("available"), "")?;
        Ok(Self(dir))
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel.trim_start_matches('/'))
    }

    /// `dpkg --root` with the scripts run outside a chroot (they see `DPKG_ROOT`), and the
    /// package's dependencies not looked for (the scratch root has no libc6 recorded).
    fn dpkg(&self, args: &[&str], deb: Option<&Path>) -> Result<String> {
        let mut cmd = Command::new("dpkg");
        cmd.arg(format!("--root={}", self.0.display()))
            .args([
                "--force-script-chrootless",
                "--force-depends",
                "--log=/dev/null",
            ])
            .args(args);
        if let Some(deb) = deb {
            cmd.arg(deb);
        }
        capture(&mut cmd)
    }

    fn status(&self) -> Option<String> {
        let out = Command::new("dpkg-query")
            .arg(format!(
                "--admindir={}",
                self.path("var/lib/dpkg").display()
            ))
            .args(["-W", "-f=${Status} ${Version}", "reactor"])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for ScratchRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The files every install must have, with their modes.
const INSTALLED: &[(&str, u32)] = &[
    ("/usr/bin/reactor", 0o755),
    ("/lib/systemd/system/reactor.service", 0o644),
    ("/etc/reactor/config.yaml", 0o644),
    ("/usr/share/doc/reactor/README.md", 0o644),
    ("/usr/share/doc/reactor/docs/operating.md", 0o644),
    ("/usr/share/doc/reactor/docs/cgroup-v2.md", 0o644),
    ("/usr/share/doc/reactor/copyright", 0o644),
    ("/usr/share/doc/reactor/changelog.Debian.gz", 0o644),
    ("/usr/share/man/man1/reactor.1.gz", 0o644),
];

/// `cargo xtask deb --check`: reads the package back, lints it, and takes it through
/// install, upgrade, remove and purge in a scratch root.
pub(crate) fn check(deb: &Path, revision: u32) -> Result<()> {
    let version = debian_version(revision)?;
    // The control fields.
    let info = capture(Command::new("dpkg-deb").arg("--info").arg(deb))?;
    for field in [
        "Package: reactor".to_string(),
        format!("Version: {version}"),
        "Architecture: amd64".into(),
        "Maintainer: ".into(),
        "Depends: libc6 (>= ".into(),
        "Section: admin".into(),
        "Priority: optional".into(),
        "Description: ".into(),
    ] {
        ensure!(
            info.lines().any(|l| l.trim_start().starts_with(&field)),
            "dpkg-deb --info {}: no {field:?}\n{info}",
            deb.display()
        );
    }
    for script in ["postinst", "prerm", "postrm", "conffiles"] {
        ensure!(
            info.contains(script),
            "no {script} in the control area\n{info}"
        );
    }
    let conffiles = capture(Command::new("dpkg-deb").arg("-I").arg(deb).arg("conffiles"))?;
    ensure!(
        conffiles.trim() == "/etc/reactor/config.yaml",
        "conffiles: {conffiles:?}"
    );
    // The contents, owned by root, with their modes.
    let contents = capture(Command::new("dpkg-deb").arg("--contents").arg(deb))?;
    for (file, mode) in INSTALLED {
        let line = contents
            .lines()
            .find(|l| l.ends_with(&format!(".{file}")))
            .with_context(|| format!("{file} is not in the package\n{contents}"))?;
        let want = if *mode == 0o755 {
            "-rwxr-xr-x"
        } else {
            "-rw-r--r--"
        };
        ensure!(
            line.starts_with(want) && line.contains("root/root"),
            "{file}: {line} (want {want} root/root)"
        );
    }
    lint(deb)?;
    if crate::setup::is_root() {
        cycle(deb, revision)?;
    } else {
        crate::require_in_ci("root, for the install cycle in a scratch root (dpkg --root)")?;
    }
    eprintln!("xtask: deb: {} checked", deb.display());
    Ok(())
}

/// lintian, when installed (`cargo xtask setup` installs it): errors fail the check.
fn lint(deb: &Path) -> Result<()> {
    if !Path::new("/usr/bin/lintian").exists() {
        crate::require_in_ci("lintian (Debian's; `cargo xtask setup` installs it)")?;
        return Ok(());
    }
    let out = Command::new("lintian")
        .args(["--fail-on", "error,warning", "--suppress-tags"])
        .arg(LINTIAN_ACCEPTED.join(","))
        .arg(deb)
        .output()
        .context("running lintian")?;
    let said = String::from_utf8_lossy(&out.stdout);
    eprint!("{said}");
    ensure!(out.status.success(), "lintian {}: {said}", deb.display());
    Ok(())
}

/// lintian tags this package accepts, each for a reason: the package is built from the
/// workspace for the project's own nodes, not uploaded to Debian, so there is no ITP bug
/// for its first changelog entry to close.
const LINTIAN_ACCEPTED: &[&str] = &["initial-upload-closes-no-bugs"];

/// Install, an edited conffile kept across an upgrade, remove, purge; in a scratch root.
fn cycle(deb: &Path, revision: u32) -> Result<()> {
    let next = revision + 1;
    let upgrade = build(next)?;
    let root = ScratchRoot::new()?;
    let version = debian_version(revision)?;

    root.dpkg(&["--install"], Some(deb))?;
    ensure!(
        root.status().as_deref() == Some(&format!("install ok installed {version}")),
        "after dpkg -i: {:?}",
        root.status()
    );
    for (file, mode) in INSTALLED {
        let p = root.path(file);
        let meta = std::fs::metadata(&p).with_context(|| format!("{file} not installed"))?;
        ensure!(
            meta.permissions().mode() & 0o7777 == *mode,
            "{file}: mode {:o}",
            meta.permissions().mode()
        );
    }
    // The installed binary accepts the installed config.
    let config = root.path("/etc/reactor/config.yaml");
    capture(
        Command::new(root.path("/usr/bin/reactor"))
            .args(["config", "check"])
            .arg(&config),
    )
    .context("the installed config fails the installed binary's check")?;

    // An operator's edit survives an upgrade whose package ships the same conffile.
    let edited = format!(
        "{}\n# edited by the operator\n",
        std::fs::read_to_string(&config)?
    );
    std::fs::write(&config, &edited)?;
    root.dpkg(&["--install"], Some(&upgrade))?;
    ensure!(
        root.status().as_deref()
            == Some(&format!("install ok installed {}", debian_version(next)?)),
        "after the upgrade: {:?}",
        root.status()
    );
    ensure!(
        std::fs::read_to_string(&config)? == edited,
        "the upgrade replaced the edited conffile"
    );
    ensure!(
        !root.path("/etc/reactor/config.yaml.dpkg-new").exists()
            && !root.path("/etc/reactor/config.yaml.dpkg-dist").exists(),
        "the upgrade left a .dpkg-new/.dpkg-dist beside an unchanged conffile"
    );

    // Remove: everything but the conffile goes.
    std::fs::create_dir_all(root.path("/var/lib/reactor"))?;
    std::fs::write(root.path("/var/lib/reactor/pods.json"), "{}")?;
    root.dpkg(&["--remove", "reactor"], None)?;
    ensure!(
        root.status()
            .as_deref()
            .is_some_and(|s| s.starts_with("deinstall ok config-files")),
        "after dpkg -r: {:?}",
        root.status()
    );
    for (file, _) in INSTALLED.iter().filter(|(f, _)| !f.starts_with("/etc/")) {
        ensure!(
            !root.path(file).exists(),
            "{file} is still there after dpkg -r"
        );
    }
    ensure!(
        std::fs::read_to_string(&config)? == edited,
        "dpkg -r did not keep the conffile as edited"
    );
    ensure!(
        root.path("/var/lib/reactor/pods.json").exists(),
        "dpkg -r removed the agent's state (only purge may)"
    );

    // Purge: the conffile, its directory and the agent's state go too.
    root.dpkg(&["--purge", "reactor"], None)?;
    ensure!(
        root.status()
            .is_none_or(|s| s.starts_with("unknown ok not-installed")),
        "after dpkg -P: {:?}",
        root.status()
    );
    for gone in [
        "/etc/reactor/config.yaml",
        "/etc/reactor",
        "/var/lib/reactor",
    ] {
        ensure!(
            !root.path(gone).exists(),
            "{gone} is still there after dpkg -P"
        );
    }
    eprintln!(
        "xtask: deb: install, upgrade to {} (edited conffile kept), remove (conffile kept), \
         purge (all gone) in {}",
        debian_version(next)?,
        root.0.display()
    );
    Ok(())
}
