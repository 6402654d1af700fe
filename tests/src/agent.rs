//! A real `reactor run` for a test: its own temp dir (stateDir, apiSocket, devicePluginDir,
//! staticPodPath), its own cgroup root under the real v1 hierarchies, a small modelled node,
//! and the CLI pointed at its socket. Killed (by pid) on drop if the test did not stop it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::cgroup_root::{TestCgroupRoot, MOUNT_ROOT};
use crate::reactor_bin;

/// A running agent and everything it was given.
pub struct TestAgent {
    /// The temp dir holding its state, socket, plugin dir and manifests.
    pub dir: tempfile::TempDir,
    /// Its config file.
    pub config: PathBuf,
    /// Its API socket.
    pub socket: PathBuf,
    /// Its static pod directory.
    pub static_dir: PathBuf,
    /// Its cgroup root (dropped after the agent and every pod process are gone).
    pub root: TestCgroupRoot,
    /// Arguments given to `reactor run` after `--config FILE` (`--dry-run`).
    pub run_args: Vec<String>,
    child: Option<Child>,
}

impl TestAgent {
    /// Writes a config (`extra` YAML appended) and starts `reactor run`; returns once the API
    /// socket answers. `stateDir` is `<temp dir>/state` unless `extra` sets its own. Unless
    /// `extra` has its own `sense:` block, only the housekeeping tick
    /// runs; unless it has its own `evictionHard`, the only threshold is
    /// `memory.available<100Mi`, and unless it sets `imageGCHighThresholdPercent`, periodic
    /// image GC is off (100): the kubelet's default disk thresholds must never evict a test's
    /// pods or delete its images because the machine's disk happens to be full.
    pub fn start(name: &str, extra: &str) -> TestAgent {
        let sense = if has_key(extra, "sense") {
            ""
        } else {
            "sense:\n  ebpf: false\n  psi: false\n  memcgThreshold: false\n"
        };
        TestAgent::start_sensing(name, sense, extra)
    }

    /// Like [`TestAgent::start`] with `sense` as the config's `sense:` block (the benchmark
    /// runs the agent with every source on).
    pub fn start_sensing(name: &str, sense: &str, extra: &str) -> TestAgent {
        let root = TestCgroupRoot::v1(name).expect("test cgroup root");
        TestAgent::start_in(root, sense, extra)
    }

    /// Like [`TestAgent::start`] on a cgroup v2 node whose unified hierarchy is mounted at
    /// `mount` (the v2 guest's `/sys/fs/cgroup`): the cgroup root is created there.
    pub fn start_v2(mount: &Path, name: &str, extra: &str) -> TestAgent {
        let root = TestCgroupRoot::v2_at(mount, name).expect("test cgroup root");
        let sense = if has_key(extra, "sense") {
            ""
        } else {
            "sense:\n  ebpf: false\n  psi: false\n  memcgThreshold: false\n"
        };
        TestAgent::start_in(root, sense, extra)
    }

    fn start_in(root: TestCgroupRoot, sense: &str, extra: &str) -> TestAgent {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let static_dir = d.join("manifests");
        std::fs::create_dir(&static_dir).expect("manifest dir");
        // The directories are open to everyone, so only the socket's own mode (0600, root)
        // keeps other users out: that is what the non-root test checks.
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::create_dir(d.join("run")).expect("socket dir");
        std::fs::set_permissions(d.join("run"), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let socket = d.join("run/reactor.sock");
        let config = d.join("reactor.yaml");
        std::fs::write(
            &config,
            format!(
                "cgroupRoot: /{root}\n{state}apiSocket: {sock}\n\
                 devicePluginDir: {d}/device-plugins\nstaticPodPath: {st}\n\
                 metricsAddress: '127.0.0.1:0'\n{sense}{hard}{gc}{log}{extra}",
                root = root.name,
                d = d.display(),
                state = if has_key(extra, "stateDir") {
                    String::new()
                } else {
                    format!("stateDir: {}/state\n", d.display())
                },
                sock = socket.display(),
                st = static_dir.display(),
                hard = if has_key(extra, "evictionHard") {
                    ""
                } else {
                    "evictionHard: {memory.available: 100Mi}\n"
                },
                log = if has_key(extra, "log") {
                    ""
                } else {
                    "log:\n  level: info\n"
                },
                gc = if has_key(extra, "imageGCHighThresholdPercent") {
                    ""
                } else {
                    "imageGCHighThresholdPercent: 100\n"
                },
            ),
        )
        .expect("write config");
        let mut agent = TestAgent {
            dir,
            config,
            socket,
            static_dir,
            root,
            run_args: Vec::new(),
            child: None,
        };
        agent.restart();
        agent
    }

    /// Like [`TestAgent::start`], with `args` after `reactor run --config FILE`.
    pub fn start_with_args(name: &str, extra: &str, args: &[&str]) -> TestAgent {
        let mut agent = TestAgent::start(name, extra);
        agent.kill(rustix::process::Signal::TERM);
        agent.run_args = args.iter().map(|a| a.to_string()).collect();
        agent.restart();
        agent
    }

    /// Starts `reactor run` (again) with the same config and waits for its socket.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "agent still running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("agent.log"))
            .expect("agent log");
        let child = Command::new(reactor_bin())
            .args(["run", "--config"])
            .arg(&self.config)
            .args(&self.run_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start reactor run");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("reactor run exited {status}: {}", self.log());
                }
            }
            assert!(Instant::now() < deadline, "no API socket: {}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The agent's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Kills the agent with `signal` (by pid) and waits for it.
    pub fn kill(&mut self, signal: rustix::process::Signal) {
        if let Some(mut c) = self.child.take() {
            let pid = rustix::process::Pid::from_child(&c);
            let _ = rustix::process::kill_process(pid, signal);
            let _ = c.wait();
        }
    }

    /// Sends `signal` to the agent (by pid) and waits up to `limit` for it to exit: how long
    /// it took, or `None` when it was still running then (it is SIGKILLed and reaped).
    pub fn stop_within(
        &mut self,
        signal: rustix::process::Signal,
        limit: Duration,
    ) -> Option<Duration> {
        let mut c = self.child.take()?;
        let pid = rustix::process::Pid::from_child(&c);
        let started = Instant::now();
        let _ = rustix::process::kill_process(pid, signal);
        loop {
            if let Ok(Some(_)) = c.try_wait() {
                return Some(started.elapsed());
            }
            if started.elapsed() > limit {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                let _ = c.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `reactor events --json` (only `kind` when given) beside the test, each line parsed on
    /// the receiver; the child is killed (by pid) when the guard drops.
    pub fn follow_events(
        &self,
        kind: Option<&str>,
    ) -> (
        crate::ChildGuard,
        std::sync::mpsc::Receiver<serde_json::Value>,
    ) {
        use std::io::BufRead as _;
        let mut cmd = Command::new(reactor_bin());
        cmd.args(["events", "--json"]);
        if let Some(kind) = kind {
            cmd.args(["--kind", kind]);
        }
        let mut child = crate::ChildGuard(
            cmd.arg("--socket")
                .arg(&self.socket)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("reactor events"),
        );
        let stdout = child.0.stdout.take().expect("events stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    break;
                };
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        (child, rx)
    }

    /// What the agent logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    /// Runs `reactor <args> --socket <socket>`.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(reactor_bin())
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .stdin(Stdio::null())
            .output()
            .expect("run reactor CLI")
    }

    /// `reactor pod ls --json`.
    pub fn pods(&self) -> Vec<serde_json::Value> {
        let out = self.cli(&["pod", "ls", "--json"]);
        assert!(
            out.status.success(),
            "pod ls: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .expect("pod ls JSON")
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// One pod from `pod ls --json` by `namespace/name`.
    pub fn pod(&self, full: &str) -> Option<serde_json::Value> {
        self.pods().into_iter().find(|p| {
            format!(
                "{}/{}",
                p["namespace"].as_str().unwrap_or(""),
                p["name"].as_str().unwrap_or("")
            ) == full
        })
    }

    /// `reactor status --json`'s `chargeProgram` entry for the watched cgroup whose path ends
    /// with `/{name}` (`kubepods`): whether the eBPF charge program is on for it, and why.
    pub fn charge_watch(&self, name: &str) -> Option<serde_json::Value> {
        let out = self.cli(&["status", "--json"]);
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let suffix = format!("/{name}");
        status["chargeProgram"]
            .as_array()?
            .iter()
            .find(|w| w["cgroup"].as_str().is_some_and(|c| c.ends_with(&suffix)))
            .cloned()
    }

    /// Writes `doc` to a file in the temp dir and runs `reactor pod apply -f` on it.
    pub fn apply(&self, file: &str, doc: &str) -> Output {
        let path = self.dir.path().join(file);
        std::fs::write(&path, doc).expect("write pod");
        self.cli(&[
            "pod",
            "apply",
            "--json",
            "-f",
            path.to_str().expect("utf-8 path"),
        ])
    }

    /// Applies a pod document (`metadata.name` names its file) and returns the API's answer;
    /// panics with the CLI's output when the apply fails.
    pub fn apply_ok(&self, doc: &serde_json::Value) -> serde_json::Value {
        let name = doc["metadata"]["name"].as_str().expect("metadata.name");
        let out = self.apply(&format!("{name}.json"), &doc.to_string());
        assert!(
            out.status.success(),
            "apply {name}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("apply JSON")
    }

    /// A v1 hierarchy's directory for a cgroup path below the root.
    pub fn cgroup_dir(&self, controller: &str, cgroup: &str) -> PathBuf {
        Path::new(MOUNT_ROOT)
            .join(controller)
            .join(&self.root.name)
            .join(cgroup.trim_start_matches('/'))
    }

    /// Reads a cgroup file.
    pub fn read(&self, controller: &str, cgroup: &str, file: &str) -> String {
        std::fs::read_to_string(self.cgroup_dir(controller, cgroup).join(file))
            .unwrap_or_else(|e| panic!("{controller}/{cgroup}/{file}: {e}"))
            .trim()
            .to_string()
    }

    /// The directory of a cgroup below the agent's root on a v2 node.
    pub fn v2_dir(&self, cgroup: &str) -> PathBuf {
        self.root.dirs[0].join(cgroup.trim_start_matches('/'))
    }

    /// The directory of a cgroup below the agent's root where its memory is accounted: in
    /// the v1 memory hierarchy, or on a v2 node in the unified one.
    pub fn memory_dir(&self, cgroup: &str) -> PathBuf {
        if self.root.is_v2() {
            self.v2_dir(cgroup)
        } else {
            self.cgroup_dir("memory", cgroup)
        }
    }

    /// Pids in a container cgroup.
    pub fn procs(&self, cgroup: &str) -> Vec<u32> {
        std::fs::read_to_string(self.memory_dir(cgroup).join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// The metrics endpoint's address, from the agent's `metrics endpoint listening` log line
    /// (the last one: after a restart the port is a new one).
    pub fn metrics_address(&self) -> std::net::SocketAddr {
        let log = self.log();
        log.lines()
            .rev()
            .filter(|l| l.contains("metrics endpoint listening"))
            .find_map(|l| {
                // `log.format: json` puts it in the line's fields.
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(l) {
                    return v["fields"]["address"].as_str()?.parse().ok();
                }
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix("address="))
                    .and_then(|a| a.trim_matches('"').parse().ok())
            })
            .unwrap_or_else(|| panic!("no metrics address in the log: {log}"))
    }

    /// `GET /metrics`: the exposition text.
    pub fn scrape(&self) -> String {
        use std::io::{Read as _, Write as _};
        let addr = self.metrics_address();
        let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .expect("connect to the metrics endpoint");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        write!(
            stream,
            "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .expect("send GET");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read response");
        let (head, body) = response
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("not HTTP: {response}"));
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        body.to_string()
    }

    /// Waits until `cond` holds (polling every 50 ms) or panics with `what` after 20 s.
    pub fn wait(&self, what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cond() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        self.kill(rustix::process::Signal::KILL);
        // The cgroup root's drop kills what is left in it (only this test's pods) by pid.
    }
}

/// Whether a YAML fragment sets `key` at the top level.
fn has_key(yaml: &str, key: &str) -> bool {
    yaml.lines().any(|l| {
        l.strip_prefix(key)
            .is_some_and(|rest| rest.starts_with(':'))
    })
}
