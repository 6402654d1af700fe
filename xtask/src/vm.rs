//! `cargo xtask vm-test`: the cgroup v2 suite in a small QEMU guest with a real v2 memory
//! controller.
//!
//! Why a guest: the development and CI machines run the memory controller on cgroup v1, and
//! production nodes run v2. The guest boots a Debian kernel (trixie-backports 7.3: it has the
//! `memcg:` tracepoints the eBPF thresholds need, and BTF) with an initramfs built here: a
//! static busybox, an `/init` that mounts cgroup2 at `/sys/fs/cgroup`, the host-built
//! `reactor`, `memhog` and `v2-suite` binaries with the shared libraries they link. One guest
//! boots for the whole batch; `/init` runs `v2-suite` as its child and powers off.
//!
//! - **Kernel, cached and idempotent.** The kernel package is fetched with `apt-get download`
//!   through a private apt configuration that reuses the machine's own Debian mirror (the
//!   system's sources are never changed), unpacked with `dpkg-deb -x` (nothing goes into
//!   `/boot`), and its uncompressed `vmlinux` extracted (PVH boot skips firmware and in-guest
//!   decompression). All of it lives in `$REACTOR_VM_CACHE` (default
//!   `$HOME/.cache/reactor/vm`), outside the repository, so a fresh clone reuses it; a file
//!   already there is not fetched again.
//! - **Reclaimable page cache.** The guest's own filesystems live in memory, where no page
//!   can be reclaimed without swap; a read-only 9p share (`/mnt/host`, the `9p` modules of the
//!   same kernel package set loaded by `/init`) holds a sparse file whose pages are clean
//!   cache, as a real node's file cache is. The eviction check needs it: reclaim of that
//!   cache at the `kubepods` limit is what raises `memory.events` `max` and PSI before the OOM
//!   killer would run.
//! - **A swap disk.** A blank sparse file of its own each boot is the guest's `/dev/vda`
//!   (virtio-blk); only the swap checks turn it on (`mkswap`, `swapon`) and off again, since
//!   the agent refuses a node with swap unless `failSwapOn: false`.
//! - **Results on their own serial port.** The console (`ttyS0`) carries the kernel's messages
//!   and the suite's progress; the suite writes one JSON line per test (`{"name", "pass",
//!   "output"}`, plus a `{"start": name}` line before each and `{"done": ...}` at the end) to
//!   `ttyS1`, which QEMU writes to a file of its own, so kernel messages (an OOM report) can
//!   never interleave with a result.
//! - **Timeouts allow for TCG.** KVM does not work on these hosts (they are PVM guests without
//!   vmx/svm), so the guest runs under software emulation, code ~17× slower than on the host:
//!   the whole guest gets `--timeout` (default 900 s), after which QEMU is killed by its own
//!   pid, and the test that was running is named. No figure from the guest is a performance
//!   figure.
//! - **Failing names the tests.** The step fails when any test failed or never reported, with
//!   each failing test's name and output.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::setup::{apt_install, quiet};
use crate::{cargo, sh};

/// The trixie-backports kernel the guest boots (override with `REACTOR_VM_KERNEL`).
const KERNEL: &str = "7.3.4+deb13-amd64";

/// Debian packages the harness needs on the host, with a file each one installs.
const PACKAGES: &[(&str, &str)] = &[
    ("qemu-system-x86", "/usr/bin/qemu-system-x86_64"),
    ("busybox-static", "/bin/busybox"),
    ("cpio", "/usr/bin/cpio"),
    ("zstd", "/usr/bin/zstd"),
    ("xz-utils", "/usr/bin/xz"),
    ("binutils", "/usr/bin/strip"),
    ("debootstrap", "/usr/sbin/debootstrap"),
];

/// The binaries built for the guest (`cargo build -p reactor -p reactor-tests --bins`).
const GUEST_BINS: &[&str] = &["reactor", "memhog", "v2-suite"];

const USAGE: &str = "usage: cargo xtask vm-test [--systemd] [--only NAME,NAME] [--timeout SECS] \
                     [--mem MIB] [--no-build]";

pub(crate) struct Options {
    pub(crate) only: Option<String>,
    pub(crate) timeout: Duration,
    pub(crate) mem_mib: u32,
    pub(crate) build: bool,
    /// The deployment checks with Debian's systemd as PID 1 (`vm_systemd`), instead of the
    /// v2 suite.
    pub(crate) systemd: bool,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        only: None,
        timeout: Duration::from_secs(900),
        mem_mib: 1024,
        build: true,
        systemd: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .with_context(|| format!("{name} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--only" => o.only = Some(value("--only")?),
            "--timeout" => {
                let v = value("--timeout")?;
                o.timeout = Duration::from_secs(
                    v.parse()
                        .with_context(|| format!("--timeout {v:?} is not whole seconds"))?,
                );
            }
            "--mem" => {
                let v = value("--mem")?;
                o.mem_mib = v
                    .parse()
                    .with_context(|| format!("--mem {v:?} is not a number of MiB"))?;
            }
            "--no-build" => o.build = false,
            "--systemd" => o.systemd = true,
            other => bail!("unknown vm-test argument {other:?}\n{USAGE}"),
        }
    }
    if let Some(only) = &o.only {
        if only.is_empty() || only.contains(char::is_whitespace) {
            bail!("--only {only:?}: give test names separated by commas");
        }
    }
    Ok(o)
}

/// The workspace's target directory.
pub(crate) fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => PathBuf::from(t),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
    }
}

/// Where the kernel is cached between runs and clones.
pub(crate) fn cache_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("REACTOR_VM_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME").context("neither REACTOR_VM_CACHE nor HOME is set")?;
    Ok(PathBuf::from(home).join(".cache/reactor/vm"))
}

/// The options of `cargo xtask vm-test` and the kernel both of its guests boot (fetched
/// once and cached), with the host's packages for QEMU in place.
pub(crate) fn prepare(args: &[String]) -> Result<(Options, Kernel)> {
    let opts = parse(args)?;
    host_packages()?;
    let kernel = std::env::var("REACTOR_VM_KERNEL").unwrap_or_else(|_| KERNEL.to_string());
    let kernel = fetch_kernel(&cache_dir()?, &kernel)?;
    Ok((opts, kernel))
}

/// Boots the guest with the v2 suite and fails naming every test that did not pass.
pub(crate) fn run(opts: &Options, kernel: &Kernel) -> Result<()> {
    if opts.build {
        sh(cargo().args(["build", "-p", "reactor", "-p", "reactor-tests", "--bins"]))?;
    }
    let work = target_dir().join("vm");
    let initrd = build_initramfs(&work, &kernel.modules)?;
    let share = page_cache_share(&work)?;
    let started = Instant::now();
    let outcome = boot(&work, &kernel.vmlinux, &initrd, &share, opts)?;
    let wall = started.elapsed();
    report(&outcome, wall)
}

/// Installs the Debian packages whose file is missing.
fn host_packages() -> Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(pkg, file)| {
            !Path::new(file).exists()
                || !quiet(Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]))
        })
        .map(|(pkg, _)| *pkg)
        .collect();
    apt_install(&missing).context("installing the guest harness's packages")
}

/// The machine's own Debian mirror, from its apt sources (one-line or deb822 format).
pub(crate) fn debian_mirror() -> Result<String> {
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
        more.sort();
        files.extend(more);
    }
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for word in text.split_whitespace() {
            let url = word.trim_end_matches('/');
            if (url.starts_with("http://") || url.starts_with("https://"))
                && url.ends_with("/debian")
            {
                return Ok(url.to_string());
            }
        }
    }
    bail!("no Debian mirror (an http(s) URL ending in /debian) in /etc/apt/sources.list{{,.d/*}}")
}

/// The kernel modules the guest loads, in load order: 9p over virtio (the share holding the
/// file whose page cache the eviction check needs; virtio itself is built in), and the
/// virtio block driver for the swap disk.
const MODULES: &[&str] = &["netfs", "9pnet", "9pnet_virtio", "9p", "virtio_blk"];

/// The size of the guest's swap disk (`/dev/vda`), in MiB: enough for the swap checks'
/// pods, small enough to be a sparse file of no cost on the host.
const SWAP_DISK_MIB: u64 = 256;

/// The kernel as fetched: the uncompressed `vmlinux` and the unpacked modules directory.
pub(crate) struct Kernel {
    pub(crate) vmlinux: PathBuf,
    modules: PathBuf,
}

/// Downloads one package of trixie-backports into the cache and unpacks it into `into`,
/// unless `marker` (a file the package installs) is there already.
fn fetch_package(cache: &Path, package: &str, into: &Path, marker: &Path) -> Result<()> {
    if marker.exists() {
        return Ok(());
    }
    let apt = cache.join("apt");
    for d in ["lists/partial", "cache/archives/partial", "debs"] {
        std::fs::create_dir_all(apt.join(d))?;
    }
    let sources = apt.join("sources.list");
    std::fs::write(
        &sources,
        format!(
            "deb [trusted=yes] {} trixie-backports main\n",
            debian_mirror()?
        ),
    )?;
    // A private apt state: the system's sources and lists are left as they are.
    let private = [
        format!("-oDir::Etc::SourceList={}", sources.display()),
        "-oDir::Etc::SourceParts=/dev/null".to_string(),
        "-oAPT::Sandbox::User=root".to_string(),
        format!("-oDir::State::Lists={}", apt.join("lists").display()),
        format!("-oDir::Cache={}", apt.join("cache").display()),
    ];
    let find_deb = || -> Result<Option<PathBuf>> {
        Ok(std::fs::read_dir(apt.join("debs"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{package}_")) && n.ends_with(".deb"))
            }))
    };
    let deb = match find_deb()? {
        Some(deb) => deb,
        None => {
            sh(Command::new("apt-get")
                .args(&private)
                .args(["update", "-qq"]))?;
            sh(Command::new("apt-get")
                .args(&private)
                .args(["download", package])
                .current_dir(apt.join("debs")))
            .with_context(|| format!("downloading {package} from trixie-backports"))?;
            find_deb()?.with_context(|| format!("{package} downloaded but no .deb found"))?
        }
    };
    sh(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(into))?;
    if !marker.exists() {
        bail!("{} has no {}", deb.display(), marker.display());
    }
    Ok(())
}

/// Fetches and unpacks the kernel and its modules once, and extracts the uncompressed
/// `vmlinux` once.
fn fetch_kernel(cache: &Path, version: &str) -> Result<Kernel> {
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    let unpacked = cache.join(format!("linux-{version}"));
    let moddir = unpacked.join(format!("usr/lib/modules/{version}"));
    let vmlinuz = moddir.join("vmlinuz");
    fetch_package(
        cache,
        &format!("linux-binary-{version}"),
        &unpacked,
        &vmlinuz,
    )?;
    fetch_package(
        cache,
        &format!("linux-modules-{version}"),
        &unpacked,
        &moddir.join("kernel/fs/9p/9p.ko.xz"),
    )?;
    let kernel = Kernel {
        vmlinux: cache.join(format!("vmlinux-{version}")),
        modules: moddir,
    };
    if kernel.vmlinux.exists() {
        return Ok(kernel);
    }
    // The bzImage carries the kernel zstd-compressed: decompress from the zstd frame magic.
    let image =
        std::fs::read(&vmlinuz).with_context(|| format!("reading {}", vmlinuz.display()))?;
    let magic = [0x28, 0xb5, 0x2f, 0xfd];
    let at = image
        .windows(4)
        .position(|w| w == magic)
        .with_context(|| format!("{}: no zstd frame in the image", vmlinuz.display()))?;
    let mut child = Command::new("zstd")
        .args(["-qdc"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting zstd")?;
    let mut stdin = child.stdin.take().context("zstd stdin")?;
    let payload = image[at..].to_vec();
    let writer = std::thread::spawn(move || {
        use std::io::Write as _;
        // zstd stops reading after the frame; trailing bytes may hit a closed pipe.
        let _ = stdin.write_all(&payload);
    });
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .context("zstd stdout")?
        .read_to_end(&mut out)?;
    let _ = child.wait();
    let _ = writer.join();
    if !out.starts_with(b"\x7fELF") {
        bail!(
            "{}: the decompressed kernel is not an ELF vmlinux",
            vmlinuz.display()
        );
    }
    let tmp = kernel.vmlinux.with_extension("tmp");
    std::fs::write(&tmp, &out)?;
    std::fs::rename(&tmp, &kernel.vmlinux)?;
    Ok(kernel)
}

/// The guest's PID 1: mounts, cgroup2 at /sys/fs/cgroup, the suite, power off.
const INIT: &str = r#"#!/bin/sh
export PATH=/bin:/sbin:/usr/bin:/usr/sbin CARGO_TARGET_DIR=/target HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /tmp /run /var/lib /root && mount -t tmpfs tmpfs /tmp && mount -t tmpfs tmpfs /run
# Only emergencies on the console: the suite's own progress is what the host shows.
echo 1 > /proc/sys/kernel/printk
mount -t cgroup2 -o nsdelegate,memory_recursiveprot cgroup2 /sys/fs/cgroup || mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tracefs tracefs /sys/kernel/tracing
mount -t bpf bpf /sys/fs/bpf
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up
for m in netfs 9pnet 9pnet_virtio 9p virtio_blk; do insmod /lib/modules/$m.ko || echo "@@ insmod $m failed"; done
mkdir -p /mnt/host
mount -t 9p -o trans=virtio,version=9p2000.L,cache=loose,ro,msize=524288 host0 /mnt/host || echo "@@ 9p share not mounted"
ONLY=""
for w in $(cat /proc/cmdline); do case $w in v2suite.only=*) ONLY="--only ${w#*=}";; esac; done
echo "@@ v2 guest: $(uname -r), $(nproc) cpu, $(grep MemTotal /proc/meminfo)"
/target/debug/v2-suite --results /dev/ttyS1 $ONLY
echo "@@ v2 suite exited $?"
sync
poweroff -f
"#;

/// Copies `src` to `dst`, stripping debug information from ELF files (the debug `reactor`
/// would otherwise fill the guest's memory).
fn copy_stripped(src: &Path, dst: &Path) -> Result<()> {
    if let Some(dir) = dst.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let status = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(dst)
        .arg(src)
        .stderr(Stdio::null())
        .status();
    if !status.is_ok_and(|s| s.success()) {
        std::fs::copy(src, dst)
            .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
    }
    Ok(())
}

/// The shared libraries (and the dynamic loader) a binary needs, from `ldd`.
fn shared_libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .with_context(|| format!("ldd {}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(PathBuf::from)
        .collect())
}

/// Builds `work/initramfs.cpio` from the host-built binaries; returns its path.
fn build_initramfs(work: &Path, moddir: &Path) -> Result<PathBuf> {
    let root = work.join("rootfs");
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    for d in [
        "bin",
        "sbin",
        "usr/bin",
        "usr/sbin",
        "proc",
        "sys",
        "dev",
        "tmp",
        "run",
        "etc",
        "target/debug",
    ] {
        std::fs::create_dir_all(root.join(d))?;
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).context("copying /bin/busybox")?;
    let applets = Command::new("/bin/busybox").arg("--list").output()?;
    for applet in String::from_utf8_lossy(&applets.stdout).split_whitespace() {
        let link = root.join("bin").join(applet);
        if !link.exists() {
            std::os::unix::fs::symlink("busybox", link)?;
        }
    }
    let debug = target_dir().join("debug");
    let mut libs = Vec::new();
    for b in GUEST_BINS {
        let src = debug.join(b);
        if !src.exists() {
            bail!(
                "{} is missing: build it with `cargo build -p reactor -p reactor-tests --bins`",
                src.display()
            );
        }
        copy_stripped(&src, &root.join("target/debug").join(b))?;
        libs.extend(shared_libraries(&src)?);
    }
    libs.sort();
    libs.dedup();
    for lib in libs {
        let dst = root.join(lib.strip_prefix("/").unwrap_or(&lib));
        if let Some(dir) = dst.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::copy(&lib, &dst).with_context(|| format!("copying {}", lib.display()))?;
    }
    std::fs::create_dir_all(root.join("lib/modules"))?;
    for m in MODULES {
        let name = format!("{m}.ko");
        let found = find_file(&moddir.join("kernel"), &|n| {
            n == name || n.starts_with(&format!("{name}."))
        })
        .with_context(|| format!("no module {m} under {}", moddir.display()))?;
        let dst = root.join("lib/modules").join(&name);
        let ext = found.extension().and_then(|e| e.to_str()).unwrap_or("");
        let tool = match ext {
            "xz" => Some("xz"),
            "zst" => Some("zstd"),
            _ => None,
        };
        match tool {
            Some(tool) => {
                let out = Command::new(tool).args(["-dc"]).arg(&found).output()?;
                if !out.status.success() {
                    bail!("{tool} -dc {} failed", found.display());
                }
                std::fs::write(&dst, out.stdout)?;
            }
            None => {
                std::fs::copy(&found, &dst)?;
            }
        }
    }
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n")?;
    std::fs::write(root.join("etc/group"), "root:x:0:\n")?;
    let init = root.join("init");
    std::fs::write(&init, INIT)?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755))?;
    let cpio = work.join("initramfs.cpio");
    let out = std::fs::File::create(&cpio)?;
    let status = Command::new("sh")
        .args(["-c", "find . | cpio -o -H newc --quiet"])
        .current_dir(&root)
        .stdout(out)
        .status()
        .context("running cpio")?;
    if !status.success() {
        bail!("building {} failed: {status}", cpio.display());
    }
    Ok(cpio)
}

/// The first file below `dir` whose name `matches`.
fn find_file(dir: &Path, matches: &dyn Fn(&str) -> bool) -> Option<PathBuf> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().and_then(|n| n.to_str()).is_some_and(matches) {
                return Some(p);
            }
        }
    }
    None
}

/// The files the guest reads over 9p, and their sizes: clean page cache the kernel can
/// reclaim, as a real node's file cache (the guest's own filesystems are all in memory, never
/// reclaimable). `cache.bin` is a reader's file; `cache-full.bin`, larger than the suite's
/// 256 MiB nodes, fills a kubepods with page cache up to its limit.
const CACHE_FILES_MIB: [(&str, u64); 2] = [("cache.bin", 96), ("cache-full.bin", 320)];

/// The host directory shared read-only with the guest (`/mnt/host` there), holding
/// [`CACHE_FILES_MIB`] (sparse: they cost the host no disk).
fn page_cache_share(work: &Path) -> Result<PathBuf> {
    let share = work.join("share");
    std::fs::create_dir_all(&share)?;
    for (name, mib) in CACHE_FILES_MIB {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(share.join(name))?;
        file.set_len(mib << 20)?;
    }
    Ok(share)
}

/// What one guest run brought back.
pub(crate) struct Outcome {
    /// One entry per JSON line on the results port.
    results: Vec<TestResult>,
    /// The test that started last without a result (a hang or a crash).
    unfinished: Option<String>,
    /// Whether the suite reported its end.
    done: bool,
    /// The guest's own measure of the suite's run time (emulated).
    guest_seconds: Option<f64>,
    /// Whether QEMU had to be killed at the timeout.
    timed_out: bool,
    /// The console, for a failure report.
    console: String,
}

struct TestResult {
    name: String,
    pass: bool,
    output: String,
}

fn boot(
    work: &Path,
    vmlinux: &Path,
    initrd: &Path,
    share: &Path,
    opts: &Options,
) -> Result<Outcome> {
    // A blank disk each boot: the swap checks `mkswap` and `swapon` it for their own run
    // only (the guest's filesystems are in memory, where a swap file cannot live).
    let swap_disk = work.join("swap.img");
    let _ = std::fs::remove_file(&swap_disk);
    std::fs::File::create(&swap_disk)
        .and_then(|f| f.set_len(SWAP_DISK_MIB << 20))
        .with_context(|| format!("creating {}", swap_disk.display()))?;
    let mut append = "console=ttyS0 panic=-1 quiet loglevel=1".to_string();
    if let Some(only) = &opts.only {
        append.push_str(&format!(" v2suite.only={only}"));
    }
    let extra: Vec<std::ffi::OsString> = vec![
        "-virtfs".into(),
        format!(
            "local,path={},mount_tag=host0,security_model=none,readonly=on,id=host0",
            share.display()
        )
        .into(),
        "-drive".into(),
        format!(
            "file={},if=virtio,format=raw,cache=unsafe",
            swap_disk.display()
        )
        .into(),
    ];
    boot_qemu(
        work,
        vmlinux,
        initrd,
        &append,
        &extra,
        opts.mem_mib,
        opts.timeout,
    )
}

/// Boots QEMU (TCG, one CPU) with `vmlinux`, `initrd` and the kernel command line `append`,
/// the console on `work/console.log` and the results port on `work/results.jsonl`; shows the
/// console's `@@` lines as they come, kills QEMU (by its pid) at `timeout`, and parses the
/// results.
pub(crate) fn boot_qemu(
    work: &Path,
    vmlinux: &Path,
    initrd: &Path,
    append: &str,
    extra: &[std::ffi::OsString],
    mem_mib: u32,
    timeout: Duration,
) -> Result<Outcome> {
    let console = work.join("console.log");
    let results = work.join("results.jsonl");
    for f in [&console, &results] {
        let _ = std::fs::remove_file(f);
    }
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-accel", "tcg", "-cpu", "max", "-smp", "1", "-m"])
        .arg(mem_mib.to_string())
        .args([
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
            "-nic",
            "none",
        ])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-serial")
        .arg(format!("file:{}", results.display()))
        .arg("-kernel")
        .arg(vmlinux)
        .arg("-initrd")
        .arg(initrd)
        .args(extra)
        .arg("-append")
        .arg(append)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    eprintln!("xtask: {cmd:?}");
    let mut qemu = cmd.spawn().context("starting qemu-system-x86_64")?;
    let deadline = Instant::now() + timeout;
    let mut shown = 0;
    let timed_out = loop {
        // Show the guest's progress as it comes.
        if let Ok(text) = std::fs::read_to_string(&console) {
            for line in text[shown.min(text.len())..].lines() {
                let line = line.trim_end_matches('\r');
                if line.starts_with("@@") {
                    eprintln!("guest: {line}");
                }
            }
            shown = text.rfind('\n').map_or(shown, |i| i + 1);
        }
        if let Some(status) = qemu.try_wait()? {
            if !status.success() {
                eprintln!("xtask: qemu exited {status}");
            }
            break false;
        }
        if Instant::now() >= deadline {
            // Only this QEMU, by its own pid.
            let _ = qemu.kill();
            let _ = qemu.wait();
            break true;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let console_text = std::fs::read_to_string(&console)
        .unwrap_or_default()
        .replace('\r', "");
    let results_text = std::fs::read_to_string(&results)
        .unwrap_or_default()
        .replace('\r', "");
    let mut outcome = Outcome {
        results: Vec::new(),
        unfinished: None,
        done: false,
        guest_seconds: None,
        timed_out,
        console: console_text,
    };
    for line in results_text.lines().filter(|l| l.starts_with('{')) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            outcome.results.push(TestResult {
                name: "(unparsable result line)".into(),
                pass: false,
                output: line.to_string(),
            });
            continue;
        };
        if let Some(name) = v["start"].as_str() {
            outcome.unfinished = Some(name.to_string());
        } else if v["done"].as_bool().is_some() {
            outcome.done = true;
            outcome.guest_seconds = v["seconds"].as_f64();
        } else if let (Some(name), Some(pass)) = (v["name"].as_str(), v["pass"].as_bool()) {
            if outcome.unfinished.as_deref() == Some(name) {
                outcome.unfinished = None;
            }
            outcome.results.push(TestResult {
                name: name.to_string(),
                pass,
                output: v["output"].as_str().unwrap_or_default().to_string(),
            });
        }
    }
    Ok(outcome)
}

fn report(o: &Outcome, wall: Duration) -> Result<()> {
    report_as("v2 guest", o, wall)
}

/// Prints each result under `label` and fails naming every check that did not pass.
pub(crate) fn report_as(label: &str, o: &Outcome, wall: Duration) -> Result<()> {
    let passed = o.results.iter().filter(|r| r.pass).count();
    let failed: Vec<&TestResult> = o.results.iter().filter(|r| !r.pass).collect();
    for r in &o.results {
        eprintln!(
            "{label}: {} {}",
            if r.pass { "PASS" } else { "FAIL" },
            r.name
        );
    }
    for r in &failed {
        eprintln!("\n--- FAIL {} ---\n{}", r.name, r.output.trim_end());
    }
    eprintln!(
        "{label}: {passed} passed, {} failed; guest boot to power-off {:.1} s wall on this \
         host, suite {} s inside the guest (TCG-emulated: not a performance figure)",
        failed.len(),
        wall.as_secs_f64(),
        o.guest_seconds
            .map_or_else(|| "?".to_string(), |s| format!("{s:.1}")),
    );
    let mut problems: Vec<String> = failed.iter().map(|r| r.name.clone()).collect();
    if let Some(name) = &o.unfinished {
        problems.push(format!("{name} (never finished)"));
    }
    if !o.done || o.timed_out {
        let tail: Vec<&str> = o.console.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        eprintln!(
            "\n--- the guest {} before the suite ended; console tail ---\n{}",
            if o.timed_out { "timed out" } else { "stopped" },
            tail.join("\n")
        );
        problems.push(if o.timed_out {
            "the guest timed out".into()
        } else {
            "the suite did not finish".into()
        });
    }
    if o.results.is_empty() && problems.is_empty() {
        problems.push("no test ran".into());
    }
    if !problems.is_empty() {
        bail!("{label} checks failed: {}", problems.join(", "));
    }
    Ok(())
}
