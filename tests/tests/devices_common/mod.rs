//! Helpers for the device-manager tests: a node in a temp dir, the sample plugin as a real
//! process (killed by pid on drop), and polling with a generous deadline (no timed asserts).

#![allow(dead_code, reason = "each test file uses a different subset")]

use std::future::Future;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use reactor::devices::{
    ContainerRequest, DeviceManager, DeviceManagerConfig, PodRequest, ResourceCapacity,
};

/// The resource the sample plugin advertises in these tests.
pub const R: &str = "vendor.example/dev";

/// A node's directories, unique to one test, removed on drop.
pub struct Node {
    pub root: tempfile::TempDir,
}

impl Node {
    pub fn new() -> Node {
        let root = tempfile::Builder::new()
            .prefix("rdev")
            .tempdir_in("/tmp")
            .expect("temp dir");
        std::fs::create_dir_all(root.path().join("plugins")).expect("plugin dir");
        Node { root }
    }

    pub fn plugin_dir(&self) -> PathBuf {
        self.root.path().join("plugins")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.root.path().join("state")
    }

    pub fn config(&self, grace: Duration) -> DeviceManagerConfig {
        DeviceManagerConfig {
            stop_grace_period: grace,
            ..DeviceManagerConfig::new(self.plugin_dir(), self.state_dir())
        }
    }

    pub async fn start(&self) -> DeviceManager {
        DeviceManager::start(self.config(Duration::from_secs(300)))
            .await
            .expect("device manager starts")
    }
}

/// The sample device plugin binary, built by `cargo build --workspace --bins`.
pub fn plugin_bin() -> PathBuf {
    let bin = reactor_tests::reactor_bin().with_file_name("sample-device-plugin");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --workspace --bins` first",
        bin.display()
    );
    bin
}

/// A running sample plugin process.
pub struct Plugin {
    child: Child,
    stdin: Option<ChildStdin>,
    pub journal: PathBuf,
}

impl Plugin {
    /// Starts the plugin with `count` devices of [`R`] and extra flags.
    pub fn start(node: &Node, count: u32, extra: &[&str]) -> Plugin {
        Self::start_as(node, R, count, extra)
    }

    pub fn start_as(node: &Node, resource: &str, count: u32, extra: &[&str]) -> Plugin {
        Self::start_in(&node.plugin_dir(), node.root.path(), resource, count, extra)
    }

    /// Starts the plugin against the `kubelet.sock` in `plugin_dir` (an agent's
    /// `devicePluginDir`), journaling into a file in `journal_dir`.
    pub fn start_in(
        plugin_dir: &Path,
        journal_dir: &Path,
        resource: &str,
        count: u32,
        extra: &[&str],
    ) -> Plugin {
        let journal = journal_dir.join(format!(
            "journal-{}-{}",
            resource.replace('/', "_"),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        let mut child = Command::new(plugin_bin())
            .arg("--dir")
            .arg(plugin_dir)
            .args(["--resource", resource, "--count", &count.to_string()])
            .arg("--journal")
            .arg(&journal)
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sample-device-plugin");
        let stdin = child.stdin.take();
        Plugin {
            child,
            stdin,
            journal,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Flips one device's health through the plugin's stdin control.
    pub fn set_health(&mut self, id: &str, healthy: bool) {
        let word = if healthy { "healthy" } else { "unhealthy" };
        let stdin = self.stdin.as_mut().expect("plugin stdin");
        writeln!(stdin, "{word} {id}").expect("write plugin control");
        stdin.flush().expect("flush plugin control");
    }

    /// Kills this plugin by its pid (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the plugin to exit by itself; returns its exit code and stderr.
    pub fn wait_exit(mut self, timeout: Duration) -> (Option<i32>, String) {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    let mut err = String::new();
                    if let Some(mut e) = self.child.stderr.take() {
                        use std::io::Read as _;
                        let _ = e.read_to_string(&mut err);
                    }
                    return (status.code(), err);
                }
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                other => panic!("plugin did not exit in time: {other:?}"),
            }
        }
    }

    pub fn journal(&self) -> String {
        std::fs::read_to_string(&self.journal).unwrap_or_default()
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` until it yields a value; panics naming `what` after 30 s.
pub async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until [`R`]'s counts satisfy `ok`.
pub async fn wait_counts(
    m: &DeviceManager,
    what: &str,
    ok: impl Fn(&ResourceCapacity) -> bool,
) -> ResourceCapacity {
    wait_for(what, || async {
        m.capacity().await.resources.get(R).copied().filter(&ok)
    })
    .await
}

/// Waits until the plugin's `count` devices are all healthy in the manager.
pub async fn wait_registered(m: &DeviceManager, count: u64) {
    wait_counts(m, "plugin registration", |c| {
        c.capacity == count && c.allocatable == count
    })
    .await;
}

/// A container asking for `n` devices of [`R`].
pub fn container(name: &str, n: u64) -> ContainerRequest {
    ContainerRequest {
        name: name.into(),
        devices: [(R.to_string(), n)].into(),
        restartable: false,
    }
}

/// A pod with the given init and app containers.
pub fn pod(uid: &str, init: Vec<ContainerRequest>, app: Vec<ContainerRequest>) -> PodRequest {
    PodRequest {
        uid: uid.into(),
        init_containers: init,
        containers: app,
    }
}

/// A set of pod UIDs.
pub fn uids(list: &[&str]) -> std::collections::BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}
