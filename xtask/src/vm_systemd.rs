//! `cargo xtask vm-test --systemd`: the deployment checks, in the v2 guest booted with
//! Debian's systemd as PID 1.
//!
//! The v2 suite's guest has a shell script as PID 1; a unit's claims (`KillMode=process`,
//! `Delegate=yes`, `OOMScoreAdjust`, the FIFO scheduling, the journal) only hold under
//! systemd itself. So this guest boots a Debian root instead:
//!
//! - **The root, built once per clean clone.** `debootstrap --variant=minbase` of Debian
//!   trixie (the release of the guest's kernel; its systemd is 257, new enough for the unit's
//!   `DelegateSubgroup=`) with `systemd`, `systemd-sysv`, `procps` and `jq`, from the
//!   machine's own Debian mirror, into `target/vm-systemd/root`, then trimmed (apt's lists
//!   and caches, docs, man pages, locales), given a fixed machine id (no first-boot prompt),
//!   and packed once into `root.cpio`. A root is reused when its `.complete` marker is there;
//!   delete `target/vm-systemd` to build it again.
//! - **What changes each boot** is a second cpio appended to it (the kernel unpacks both):
//!   the package (`cargo xtask deb`), the checks (`tests/guest/systemd-checks.sh`), the
//!   README's pod files, and `reactor-checks.service`, which multi-user.target pulls in.
//! - **The boot.** The same kernel and QEMU as the v2 suite (TCG, one CPU), the root in the
//!   initramfs, `rdinit=/sbin/init` (systemd); the checks write one JSON line each to the
//!   second serial port and power the guest off; the host reports as for the v2 suite.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::sh;
use crate::vm::{boot_qemu, debian_mirror, report_as, target_dir, Options};

/// The Debian release of the root (the guest kernel's own).
const SUITE: &str = "trixie";

/// Packages on top of minbase: systemd as init, `ps`/`pgrep`, and `jq` for the checks.
const INCLUDE: &str = "systemd,systemd-sysv,procps,jq";

/// Units a test guest has no use for, masked so the boot does not wait on them: the gettys
/// (without udev, the serial one waits 90 s for its device unit), the module loader (the
/// root has no modules: what the checks need is built into the kernel), timers.
const MASKED: &[&str] = &[
    "systemd-firstboot.service",
    "getty.target",
    "getty@tty1.service",
    "serial-getty@ttyS0.service",
    "systemd-modules-load.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "fstrim.timer",
    "systemd-pstore.service",
    "remote-fs.target",
];

/// The unit that runs the checks once the system is up.
const CHECKS_UNIT: &str = "[Unit]
Description=reactor deployment checks (test guest)
After=multi-user.target

[Service]
# simple, not oneshot: the boot is done once this starts, so the checks can wait for it.
Type=simple
ExecStart=/usr/local/sbin/reactor-systemd-checks
StandardOutput=journal

[Install]
WantedBy=multi-user.target
";

/// Builds (once) the root and (each time) the package, boots, and reports.
pub(crate) fn run(opts: &Options, vmlinux: &Path) -> Result<()> {
    let work = target_dir().join("vm-systemd");
    std::fs::create_dir_all(&work)?;
    let t = Instant::now();
    if opts.build {
        crate::deb::build_release()?;
    }
    let deb = crate::deb::build(1)?;
    eprintln!(
        "xtask: systemd guest: package ready in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let root_cpio = root(&work)?;
    eprintln!(
        "xtask: systemd guest: root ready in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let initrd = initramfs(&work, &root_cpio, &deb)?;
    let mut append = "console=ttyS0 panic=-1 quiet loglevel=1 rdinit=/sbin/init \
                      systemd.unit=multi-user.target systemd.show_status=0 systemd.journald.forward_to_console=0"
        .to_string();
    if let Some(only) = &opts.only {
        // systemd_is_pid1 and package_installs prepare what the others check.
        append.push_str(&format!(
            " systemdchecks.only=systemd_is_pid1,package_installs,{only}"
        ));
    }
    let started = Instant::now();
    let outcome = boot_qemu(
        &work,
        vmlinux,
        &initrd,
        &append,
        &[],
        opts.mem_mib,
        opts.timeout,
    )?;
    report_as("systemd guest", &outcome, started.elapsed())
}

/// The root's cpio, built on the first run.
fn root(work: &Path) -> Result<PathBuf> {
    let root = work.join("root");
    let cpio = work.join("root.cpio");
    if root.join(".complete").exists() && cpio.exists() {
        return Ok(cpio);
    }
    let tmp = work.join("root.tmp");
    for d in [&root, &tmp] {
        if d.exists() {
            std::fs::remove_dir_all(d).with_context(|| format!("removing {}", d.display()))?;
        }
    }
    sh(Command::new("debootstrap")
        .args(["--variant=minbase", &format!("--include={INCLUDE}"), SUITE])
        .arg(&tmp)
        .arg(debian_mirror()?))
    .context("debootstrap of the systemd guest's root")?;
    // Trimmed: what a test guest never reads costs memory in the initramfs.
    for d in [
        "var/cache/apt",
        "var/lib/apt/lists",
        "usr/share/doc",
        "usr/share/man",
        "usr/share/locale",
        "usr/share/info",
    ] {
        let p = tmp.join(d);
        if p.is_dir() {
            for e in std::fs::read_dir(&p)? {
                let e = e?.path();
                if e.is_dir() && !e.is_symlink() {
                    std::fs::remove_dir_all(&e)?;
                } else {
                    std::fs::remove_file(&e)?;
                }
            }
        }
    }
    std::fs::write(tmp.join("etc/hostname"), "reactor-guest\n")?;
    // A machine id: no first boot, so nothing asks on the console.
    std::fs::write(
        tmp.join("etc/machine-id"),
        "5e1ec7ed0000400080000000000000a1\n",
    )?;
    std::fs::write(tmp.join("etc/fstab"), "")?;
    let units = tmp.join("etc/systemd/system");
    for unit in MASKED {
        let link = units.join(unit);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/dev/null", &link)?;
        for wants in [
            "getty.target.wants",
            "timers.target.wants",
            "sysinit.target.wants",
            "multi-user.target.wants",
        ] {
            let _ = std::fs::remove_file(units.join(wants).join(unit));
        }
    }
    // The journal in memory (the root is, anyway).
    let journald = tmp.join("etc/systemd/journald.conf.d");
    std::fs::create_dir_all(&journald)?;
    std::fs::write(
        journald.join("volatile.conf"),
        "[Journal]\nStorage=volatile\n",
    )?;
    pack(&tmp, &cpio)?;
    std::fs::write(tmp.join(".complete"), "")?;
    std::fs::rename(&tmp, &root)?;
    Ok(cpio)
}

/// `cpio -o -H newc` of `dir` into `out` (owners and device nodes kept: run as root).
fn pack(dir: &Path, out: &Path) -> Result<()> {
    let file = std::fs::File::create(out)?;
    let status = Command::new("sh")
        .args(["-c", "find . ! -name .complete | cpio -o -H newc --quiet"])
        .current_dir(dir)
        .stdout(file)
        .status()
        .context("running cpio")?;
    if !status.success() {
        bail!("packing {} failed: {status}", dir.display());
    }
    Ok(())
}

/// The root's cpio with this run's files appended: the package, the checks and their unit.
fn initramfs(work: &Path, root_cpio: &Path, deb: &Path) -> Result<PathBuf> {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("workspace")?
        .to_path_buf();
    let extra = work.join("extra");
    if extra.exists() {
        std::fs::remove_dir_all(&extra)?;
    }
    use std::os::unix::fs::PermissionsExt as _;
    let put = |rel: &str, bytes: Vec<u8>, mode: u32| -> Result<()> {
        let p = extra.join(rel);
        std::fs::create_dir_all(p.parent().context("parent")?)?;
        std::fs::write(&p, bytes)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    put("root/reactor.deb", std::fs::read(deb)?, 0o644)?;
    for pod in ["sleeper.yaml", "hog.yaml"] {
        put(
            &format!("root/{pod}"),
            std::fs::read(ws.join("examples").join(pod))?,
            0o644,
        )?;
    }
    put(
        "usr/local/sbin/reactor-systemd-checks",
        std::fs::read(ws.join("tests/guest/systemd-checks.sh"))?,
        0o755,
    )?;
    put(
        "etc/systemd/system/reactor-checks.service",
        CHECKS_UNIT.as_bytes().to_vec(),
        0o644,
    )?;
    let wants = extra.join("etc/systemd/system/multi-user.target.wants");
    std::fs::create_dir_all(&wants)?;
    std::os::unix::fs::symlink(
        "/etc/systemd/system/reactor-checks.service",
        wants.join("reactor-checks.service"),
    )?;
    let extra_cpio = work.join("extra.cpio");
    pack(&extra, &extra_cpio)?;
    let initrd = work.join("initramfs.cpio");
    let mut out = std::fs::File::create(&initrd)?;
    for part in [root_cpio, &extra_cpio] {
        let mut f = std::fs::File::open(part)?;
        std::io::copy(&mut f, &mut out)?;
    }
    Ok(initrd)
}
