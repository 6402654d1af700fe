//! A private containerd for one test: its own root, state and socket in a temp dir, the CRI
//! plugin on the `native` snapshotter with a locally built pause image, cgroupfs (no
//! systemd), no CNI (tests run sandboxes in the node's network namespace). It is stopped by
//! its pid when the guard drops, and whatever it left behind (containers, shims, mounts) is
//! cleaned up by pids and paths read from its own state directory.
//!
//! containerd 1.6 quirks handled here:
//! - The runc shim keeps runc's state in `/run/containerd/runc` unless the runtime options
//!   name a `Root`; the config points it into the temp dir.
//! - Shims outlive containerd by design: after containerd exits, the containers' init pids
//!   recorded in the task bundles are killed, then the shims started with this containerd's
//!   (unique) socket as `-address` (1.6 writes no shim pid file), and their sockets removed.
//! - The CRI plugin refreshes snapshot usage (ImageFsInfo, writable layers) only every
//!   `stats_collect_period` seconds (default 10): set to 1 so tests see changes quickly.
//! - Images imported with `ctr` reach the CRI image cache through an event, a moment later:
//!   [`Containerd::import`] waits until CRI `ListImages` shows the image.
//! - CRI calls made before the plugin has initialized fail; start-up waits for `ListImages`.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use reactor::act::cri::{CriClient, CriError, ImageInfo, Timeouts};

use crate::oci::{BuiltImage, TestImage, BUSYBOX};

/// Binaries the harness needs and the Debian packages that ship them.
const TOOLS: &[(&str, &str)] = &[
    ("/usr/bin/containerd", "containerd"),
    ("/usr/bin/containerd-shim-runc-v2", "containerd"),
    ("/usr/bin/ctr", "containerd"),
    ("/usr/sbin/runc", "runc"),
    (BUSYBOX, "busybox-static"),
];

/// PATH for containerd and its shims (which look up `runc` and `containerd-shim-runc-v2`).
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Only one test at a time may run apt-get.
static INSTALL: Mutex<()> = Mutex::new(());

/// Installs containerd, runc and busybox-static from Debian when any of their binaries is
/// missing (needs root; `cargo xtask setup` does the same ahead of time).
pub fn ensure_installed() -> Result<(), String> {
    let _guard = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    // Debian's dynamic `busybox` package also installs /bin/busybox, useless inside an image
    // without a libc: only a static one counts.
    let mut missing: Vec<&str> = TOOLS
        .iter()
        .filter(|(bin, _)| !Path::new(bin).exists() || (*bin == BUSYBOX && !is_static_elf(bin)))
        .map(|(_, pkg)| *pkg)
        .collect();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    let run = |args: &[&str]| -> Result<(), String> {
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("apt-get: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("apt-get {args:?}: {status}"))
        }
    };
    run(&["update", "-qq"])?;
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend(missing.iter().copied());
    run(&args)
}

/// Whether an ELF executable has no program interpreter (is statically linked).
fn is_static_elf(path: &str) -> bool {
    let Ok(elf) = std::fs::read(path) else {
        return false;
    };
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    // 64-bit little-endian ELF only (what Debian ships on the machines the tests run on).
    if elf.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    const PT_INTERP: u32 = 3;
    (0..usize::from(phnum)).all(|i| {
        let at = usize::try_from(phoff).unwrap_or(usize::MAX) + i * usize::from(phentsize);
        elf.get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .is_some_and(|t| t != PT_INTERP)
    })
}

/// Whether the CRI tests can run here: root, and the tools installed (installing them if
/// needed). Use with `require(...)`.
pub fn containerd_available() -> bool {
    crate::is_root() && ensure_installed().is_ok()
}

/// Runs `work` on a fresh current-thread Tokio runtime in its own thread, so the harness's
/// blocking API works from sync tests and from inside async tests alike.
pub fn block_on_own_runtime<T: Send>(work: impl std::future::Future<Output = T> + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime for the containerd harness")
                .block_on(work)
        })
        .join()
        .expect("containerd harness thread")
    })
}

/// A running private containerd, stopped by pid and cleaned up on drop.
pub struct Containerd {
    dir: tempfile::TempDir,
    socket: PathBuf,
    root: PathBuf,
    state: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    pid: u32,
    /// The pause image the CRI plugin uses for sandboxes (already imported).
    pub sandbox_image: BuiltImage,
}

impl Containerd {
    /// Starts containerd in a temp dir named after `name`, builds and imports the pause
    /// image, and returns once the CRI plugin answers.
    pub fn start(name: &str) -> io::Result<Containerd> {
        Containerd::start_with_root(name, None)
    }

    /// Like [`start`](Self::start), with containerd's root (content store, snapshots,
    /// metadata: the image filesystem) on a tmpfs of `bytes` mounted in the temp dir, so a
    /// test can fill it with a few MiB of images. The tmpfs is unmounted on drop.
    pub fn start_on_tmpfs(name: &str, bytes: u64) -> io::Result<Containerd> {
        Containerd::start_with_root(name, Some(bytes))
    }

    fn start_with_root(name: &str, tmpfs_bytes: Option<u64>) -> io::Result<Containerd> {
        ensure_installed().map_err(io::Error::other)?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("reactor-ctd-{name}-"))
            .tempdir_in("/tmp")?;
        let base = dir.path().to_path_buf();
        let (socket, root, state, log) = (
            base.join("containerd.sock"),
            base.join("root"),
            base.join("state"),
            base.join("containerd.log"),
        );
        std::fs::create_dir_all(base.join("images"))?;
        let pause = TestImage::pause(&format!("localhost/reactor/pause-{name}:1"))
            .build(&base.join("images"))?;
        let config = base.join("config.toml");
        std::fs::write(&config, config_toml(&base, &pause.name))?;

        if let Some(bytes) = tmpfs_bytes {
            std::fs::create_dir_all(&root)?;
            let data = std::ffi::CString::new(format!("size={bytes},mode=0700"))
                .map_err(io::Error::other)?;
            rustix::mount::mount(
                "tmpfs",
                &root,
                "tmpfs",
                rustix::mount::MountFlags::empty(),
                data.as_c_str(),
            )?;
        }
        let child = match spawn_containerd(&config, &log) {
            Ok(child) => child,
            Err(e) => {
                if tmpfs_bytes.is_some() {
                    let _ = rustix::mount::unmount(&root, rustix::mount::UnmountFlags::DETACH);
                }
                return Err(e);
            }
        };
        let pid = child.id();
        let mut ctd = Containerd {
            dir,
            socket,
            root,
            state,
            log,
            child: Some(child),
            pid,
            sandbox_image: pause.clone(),
        };
        ctd.wait_for_socket(Duration::from_secs(20))?;
        ctd.import(&pause)?;
        Ok(ctd)
    }

    /// Stops containerd by pid and starts it again on the same root, state and socket, as a
    /// runtime restart looks to the agent (running containers stay); returns once CRI
    /// answers.
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop_daemon();
        self.start_daemon()
    }

    /// Starts containerd again after [`stop_daemon`](Self::stop_daemon), on the same root,
    /// state and socket; returns once CRI answers.
    pub fn start_daemon(&mut self) -> io::Result<()> {
        let child = spawn_containerd(&self.dir.path().join("config.toml"), &self.log)?;
        self.pid = child.id();
        self.child = Some(child);
        self.wait_for_socket(Duration::from_secs(20))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.cri_images() {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(io::Error::other(format!(
                        "CRI not answering after restart: {e}\n{}",
                        self.log_tail()
                    )))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn wait_for_socket(&mut self, limit: Duration) -> io::Result<()> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    self.child = None;
                    return Err(io::Error::other(format!(
                        "containerd exited at start ({status}):\n{}",
                        self.log_tail()
                    )));
                }
            }
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(io::Error::other(format!(
            "containerd socket {} not up after {limit:?}:\n{}",
            self.socket.display(),
            self.log_tail()
        )))
    }

    /// The CRI endpoint (`unix:///…/containerd.sock`).
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// Pids of the runc shims this containerd started (they outlive containerd itself).
    pub fn shim_pids(&self) -> Vec<u32> {
        shims_for(self.socket.as_os_str().as_encoded_bytes())
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// containerd's root (content, snapshots, metadata).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The temp dir holding everything of this containerd.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// containerd's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A CRI client for this containerd (call inside a Tokio runtime).
    pub async fn client(&self) -> CriClient {
        CriClient::connect(&self.endpoint(), Timeouts::default())
            .await
            .expect("the harness endpoint is a valid unix:// path")
    }

    /// The images CRI lists, asked from a private runtime (for sync code).
    pub fn cri_images(&self) -> Result<Vec<ImageInfo>, CriError> {
        let endpoint = self.endpoint();
        block_on_own_runtime(async move {
            let client = CriClient::connect(&endpoint, Timeouts::default()).await?;
            client.list_images().await
        })
    }

    /// Builds `image` in this containerd's temp dir and imports it.
    pub fn build_and_import(&self, image: &TestImage) -> io::Result<BuiltImage> {
        let built = image.build(&self.dir.path().join("images"))?;
        self.import(&built)?;
        Ok(built)
    }

    /// Imports an image archive into the CRI namespace (`k8s.io`), unpacked for the native
    /// snapshotter, and waits until CRI `ListImages` shows it.
    pub fn import(&self, image: &BuiltImage) -> io::Result<()> {
        let out = Command::new("/usr/bin/ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "k8s.io", "images", "import"])
            .args(["--snapshotter", "native"])
            .arg(&image.archive)
            .env("PATH", PATH)
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "ctr images import {}: {}\n{}",
                image.archive.display(),
                String::from_utf8_lossy(&out.stderr),
                self.log_tail()
            )));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut last = String::new();
        while Instant::now() < deadline {
            match self.cri_images() {
                Ok(images) if images.iter().any(|i| i.id == image.id) => return Ok(()),
                Ok(images) => last = format!("listed {} images", images.len()),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(io::Error::other(format!(
            "CRI never listed {} ({}): {last}\n{}",
            image.name,
            image.id,
            self.log_tail()
        )))
    }

    /// The last lines of containerd's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Stops containerd by its pid (SIGTERM, SIGKILL after 10 s), then kills what it left
    /// running (container inits from its state dir, then its shims). Idempotent.
    pub fn stop(&mut self) {
        self.stop_daemon();
        self.kill_leftovers();
    }

    /// Stops only the containerd process by pid (SIGTERM, SIGKILL after 10 s); shims and
    /// containers keep running, as in a real runtime outage. Idempotent.
    pub fn stop_daemon(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(self.pid, rustix::process::Signal::TERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Ok(None) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
    }

    /// Kills the container processes (pids from the task bundles) and the shims this
    /// containerd started, and removes the shims' sockets.
    fn kill_leftovers(&self) {
        let tasks = self.state.join("io.containerd.runtime.v2.task");
        let bundles: Vec<PathBuf> = std::fs::read_dir(&tasks)
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|ns| std::fs::read_dir(ns.path()).into_iter().flatten().flatten())
            .map(|b| b.path())
            .collect();
        for bundle in &bundles {
            if let Some(pid) = read_pid(&bundle.join("init.pid")) {
                signal(pid, rustix::process::Signal::KILL);
            }
        }
        // containerd 1.6 records no shim pid in the bundle: find the shims this containerd
        // started by their `-address <our socket>` argument (the socket path is unique to
        // this test) and kill them by pid.
        for pid in self.shim_pids() {
            signal(pid, rustix::process::Signal::KILL);
        }
        for bundle in &bundles {
            if let Ok(address) = std::fs::read_to_string(bundle.join("address")) {
                if let Some(path) = address.trim().strip_prefix("unix://") {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
    }

    /// Unmounts everything still mounted under the temp dir, deepest first.
    fn unmount_all(&self) {
        let base = self.dir.path().display().to_string();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<String> = mountinfo
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(unescape_mount_path)
            .filter(|p| p.starts_with(&base))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in points {
            let _ = rustix::mount::unmount(p.as_str(), rustix::mount::UnmountFlags::DETACH);
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop();
        self.unmount_all();
        // The TempDir field removes the directory itself after this.
    }
}

/// Starts containerd with `config`, appending its output to `log`.
fn spawn_containerd(config: &Path, log: &Path) -> io::Result<Child> {
    let out = File::options().create(true).append(true).open(log)?;
    Command::new("/usr/bin/containerd")
        .arg("--config")
        .arg(config)
        .env("PATH", PATH)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
}

/// Pids of containerd shims started with `-address <socket>`.
fn shims_for(socket: &[u8]) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.first()
                .is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"))
                && args
                    .windows(2)
                    .any(|w| w[0] == b"-address" && w[1] == socket)
        })
        .collect()
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount_path(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// containerd's config: everything under `base`, CRI on `native` with cgroupfs, and no
/// plugins that would touch the host's own containerd paths.
fn config_toml(base: &Path, sandbox_image: &str) -> String {
    let b = base.display();
    format!(
        r#"version = 2
root = "{b}/root"
state = "{b}/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.overlayfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{b}/containerd.sock"

[ttrpc]
  address = "{b}/containerd.sock.ttrpc"

[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = "{b}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  stats_collect_period = 1
  disable_apparmor = true
  # This machine grants no CAP_SYS_RESOURCE, so a pause oom_score_adj of -998 (the CRI
  # default) is refused by the kernel; restricting clamps it to containerd's own score.
  restrict_oom_score_adj = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{b}/cni/bin"
    conf_dir = "{b}/cni/net.d"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{b}/runc"
"#
    )
}

/// A cgroup tree unique to one test (`/reactor-test-<name>-<pid>`) across the v1
/// hierarchies, removed on drop with everything below it, including the cgroups the runtime
/// created for containers (their leftover processes are killed by pid first).
pub struct TestCgroupTree {
    /// The tree's root as a cgroup path (`/reactor-test-…`).
    pub root: String,
}

/// Where the cgroup hierarchies are mounted.
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

impl TestCgroupTree {
    /// Reserves `/reactor-test-<name>-<pid>` (removing a stale one of the same name).
    pub fn new(name: &str) -> TestCgroupTree {
        let tree = TestCgroupTree {
            root: format!("/reactor-test-{name}-{}", std::process::id()),
        };
        tree.remove_all();
        tree
    }

    /// `<root><rel>` as a cgroup path, e.g. `/reactor-test-x-1/kubepods/podu`.
    pub fn cgroup(&self, rel: &str) -> String {
        format!("{}{rel}", self.root)
    }

    /// The directory of cgroup `<root><rel>` in `controller`'s hierarchy.
    pub fn path(&self, controller: &str, rel: &str) -> PathBuf {
        Path::new(CGROUP_MOUNT)
            .join(controller)
            .join(self.cgroup(rel).trim_start_matches('/'))
    }

    /// Creates `<root><rel>` in each of `controllers`' hierarchies.
    pub fn create(&self, rel: &str, controllers: &[&str]) -> io::Result<()> {
        for c in controllers {
            std::fs::create_dir_all(self.path(c, rel))?;
        }
        Ok(())
    }

    fn remove_all(&self) {
        let hierarchies = std::fs::read_dir(CGROUP_MOUNT)
            .into_iter()
            .flatten()
            .flatten();
        for h in hierarchies {
            let top = h.path().join(self.root.trim_start_matches('/'));
            if top.is_dir() {
                remove_cgroup(&top);
            }
        }
    }
}

impl Drop for TestCgroupTree {
    fn drop(&mut self) {
        self.remove_all();
    }
}

/// Removes a cgroup directory depth-first, killing the processes left in it.
fn remove_cgroup(dir: &Path) {
    for child in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if child.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup(&child.path());
        }
    }
    for _ in 0..100 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            signal(pid, rustix::process::Signal::KILL);
        }
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("warning: could not remove test cgroup {}", dir.display());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_binaries_without_an_interpreter_count_as_static() {
        // The test binary itself is dynamically linked; a text file is no ELF at all.
        let me = std::env::current_exe().unwrap();
        assert!(!is_static_elf(me.to_str().unwrap()));
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("x");
        std::fs::write(&text, "#!/bin/sh\n").unwrap();
        assert!(!is_static_elf(text.to_str().unwrap()));
        assert!(!is_static_elf("/nonexistent/busybox"));
        if crate::require(Path::new(BUSYBOX).exists(), "busybox-static's /bin/busybox") {
            assert!(is_static_elf(BUSYBOX), "Debian's busybox-static");
        }
    }

    #[test]
    fn config_keeps_everything_under_the_temp_dir() {
        let toml = config_toml(Path::new("/tmp/reactor-ctd-x"), "localhost/p:1");
        for line in toml.lines().filter(|l| l.contains('/') && l.contains('"')) {
            let quoted = line.split('"').nth(1).unwrap_or_default();
            if quoted.starts_with('/') {
                assert!(quoted.starts_with("/tmp/reactor-ctd-x/"), "{line}");
            }
        }
        assert!(toml.contains(r#"snapshotter = "native""#));
        assert!(toml.contains("SystemdCgroup = false"));
    }
}
