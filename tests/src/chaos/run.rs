//! One chaos run: the node set up, the schedule played, the invariants checked every
//! round, everything removed afterwards.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use serde_json::Value;

use super::check::{self, Excuses, Tally, Tracked};
use super::node::{self, config, pid_threshold, Model, OomWatch, Thawer, Tmpfs};
use super::pods::{self, Places};
use super::schedule::{self, Action, Mix, Qos, Work};
use crate::agent::TestAgent;
use crate::freezer::{Freezer, FREEZER};
use crate::{ChildGuard, Containerd, TestImage};

/// The image every container runs under containerd: busybox, and memhog at `/bin/memhog`.
const IMAGE: &str = "localhost/reactor/chaos:1";

/// What `cargo xtask chaos` asks for.
#[derive(Clone, Debug)]
pub struct Options {
    /// The seed of the schedule.
    pub seed: u64,
    /// How long the schedule runs.
    pub minutes: f64,
    /// Pods through a private containerd over CRI (killed and restarted too) instead of the
    /// process runtime.
    pub containerd: bool,
    /// Goes on after a violation (each is printed as it is found, with the last actions),
    /// failing at the end: a long run tells all it finds.
    pub keep_going: bool,
    /// A cgroup v2 node: the unified hierarchy's mount (the v2 guest's `/sys/fs/cgroup`),
    /// with a file of clean page cache for the page-cache pods to read (its own disks are
    /// in memory). The node is then the guest's smaller [`node::GUEST`]; `None`: this
    /// host's v1 hierarchies and [`node::HOST`].
    pub v2: Option<(PathBuf, PathBuf)>,
}

/// What a run did and found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Whether Guaranteed pods could run on this host (the probe at the start).
    pub guaranteed: Option<String>,
    /// Actions by kind: scheduled, and done (an action on a pod that had ended is skipped).
    pub actions: BTreeMap<&'static str, (u64, u64)>,
    /// Invariant checks, exceptions and violations.
    pub tally: Tally,
    /// What the agent did, from its events: evictions by signal, OOM kills it saw.
    pub agent: BTreeMap<String, u64>,
    /// Highest RSS of the agent, KiB.
    pub peak_rss_kib: u64,
    /// The last actions before the end (or the failure), with their times.
    pub last: Vec<String>,
    /// Where the agent's log was kept, after a failure.
    pub agent_log: Option<PathBuf>,
}

/// The RSS the agent must stay under (a debug build with every source attached, 50 pods'
/// worth of state and the API serving the run: about 40 MiB here).
const RSS_BOUND_KIB: u64 = 256 * 1024;

struct Run {
    agent: TestAgent,
    /// After the agent: dropped after it, with what it left running.
    ctd: Option<Containerd>,
    started: Instant,
    seed: u64,
    pods: Vec<Tracked>,
    tally: Tally,
    excuses: Excuses,
    events: Option<(ChildGuard, mpsc::Receiver<Value>)>,
    seen_events: BTreeSet<(String, i64, String)>,
    /// uids whose eviction was announced (they do not rank before anyone any more).
    evicting: BTreeSet<String>,
    /// The last `pod ls`.
    snapshot: Vec<Value>,
    /// The last few listings with the time each had answered, newest last: an eviction is
    /// judged from the newest taken before it (in the v2 guest a `pod ls` takes seconds,
    /// and the eviction often came while the newest was being taken).
    listings: VecDeque<(std::time::SystemTime, Vec<Value>)>,
    freezers: Vec<Freezer>,
    /// v2 cgroups the run froze (`cgroup.freeze`), thawed at the end whatever their time.
    frozen_v2: Vec<PathBuf>,
    thawer: Thawer,
    oom: OomWatch,
    out: Outcome,
    recent: VecDeque<String>,
    cache_dir: PathBuf,
    /// See [`Places::cache_source`].
    cache_source: Option<PathBuf>,
    nodefs: PathBuf,
    memhog: PathBuf,
    model: Model,
}

/// Plays the schedule for `opts.seed` on this host; `Err` carries the outcome of a run that
/// broke an invariant (it stopped at the first).
pub fn run(opts: &Options) -> Result<Outcome, Box<Outcome>> {
    // On the real disk, for the page-cache writers; the v2 guest has none (its pods read a
    // file instead), and its `/tmp` holds the run's directory.
    let base = match opts.v2 {
        Some(_) => std::env::temp_dir(),
        None => PathBuf::from("/var/tmp"),
    };
    let run_dir = tempfile::Builder::new()
        .prefix("reactor-chaos-")
        .tempdir_in(base)
        .expect("the run's directory");
    let cache_dir = run_dir.path().join("cache");
    std::fs::create_dir(&cache_dir).expect("cache dir");
    let nodefs = Tmpfs::mount(run_dir.path().join("nodefs"), 64).expect("mount the nodefs tmpfs");
    let ctd = opts.containerd.then(|| {
        let ctd = Containerd::start_on_tmpfs(&format!("chaos-{}", opts.seed), 192 << 20)
            .expect("start a private containerd");
        let image = TestImage::busybox(IMAGE, 0)
            .with_host_binary(&crate::memhog_bin())
            .expect("memhog and its libraries");
        ctd.build_and_import(&image)
            .expect("build and import the chaos image");
        ctd
    });
    let model = if opts.v2.is_some() {
        node::GUEST
    } else {
        node::HOST
    };
    let name = format!("chaos-{}", opts.seed);
    let config = config(
        &model,
        &nodefs.0,
        pid_threshold(),
        ctd.as_ref().map(Containerd::endpoint).as_deref(),
    );
    let agent = match &opts.v2 {
        Some((mount, _)) => TestAgent::start_v2(mount, &name, &config),
        None => TestAgent::start_sensing(&name, "", &config),
    };
    // A second fence: the run's whole memory cgroup is limited too, 256 MiB above the node.
    let fence = ((model.memory_mib + 256) << 20).to_string();
    let _ = match opts.v2 {
        Some(_) => std::fs::write(agent.memory_dir("").join("memory.max"), fence),
        None => std::fs::write(agent.memory_dir("").join("memory.limit_in_bytes"), fence),
    };
    let kubepods = agent.memory_dir("kubepods");
    let mut r = Run {
        agent,
        ctd,
        started: Instant::now(),
        seed: opts.seed,
        pods: Vec::new(),
        tally: Tally::default(),
        excuses: Excuses::default(),
        events: None,
        seen_events: BTreeSet::new(),
        evicting: BTreeSet::new(),
        snapshot: Vec::new(),
        listings: VecDeque::new(),
        freezers: Vec::new(),
        frozen_v2: Vec::new(),
        thawer: Thawer::start(),
        oom: OomWatch::start(kubepods, opts.v2.is_some()),
        out: Outcome::default(),
        recent: VecDeque::new(),
        cache_dir,
        cache_source: opts.v2.as_ref().map(|(_, cache)| cache.clone()),
        nodefs: nodefs.0.clone(),
        memhog: crate::memhog_bin(),
        model,
    };
    r.follow();
    let guaranteed = r.probe_guaranteed();
    let mix = Mix {
        guaranteed: guaranteed.is_ok(),
        containerd: opts.containerd,
        size_pct: model.size_pct,
    };
    r.out.guaranteed = Some(match &guaranteed {
        Ok(()) => "Guaranteed pods run here: in the mix".into(),
        Err(why) => format!("Guaranteed pods cannot run here ({why}): left out of the mix"),
    });
    let millis = (opts.minutes * 60_000.0) as u64;
    let plan = schedule::schedule(opts.seed, millis, mix);
    for (_, a) in &plan {
        r.out.actions.entry(a.kind()).or_default().0 += 1;
    }
    r.started = Instant::now();
    let mut reported = 0;
    // Prints the violations not yet told, with the seed and the last actions; whether the
    // run stops here.
    let mut stop = |r: &mut Run| -> bool {
        let v = &r.tally.violations;
        if v.len() == reported {
            return false;
        }
        println!(
            "chaos: VIOLATION, seed {}; the last actions before it:",
            r.seed
        );
        for l in &r.recent {
            println!("  {l}");
        }
        for line in &v[reported..] {
            println!("  violation: {line}");
        }
        reported = v.len();
        !opts.keep_going
    };
    let mut failed = false;
    'plan: for (at, action) in plan {
        // At least one round between two actions, also when the run is behind its schedule
        // (the agent slow to answer): no action goes unchecked.
        loop {
            r.round();
            if stop(&mut r) {
                failed = true;
                break 'plan;
            }
            let left = Duration::from_millis(at).saturating_sub(r.started.elapsed());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(300)));
        }
        r.act(&action);
    }
    // Let the last evictions and stops finish, checking on.
    let settle = Instant::now();
    while !failed && settle.elapsed() < Duration::from_secs(12) {
        r.round();
        failed = stop(&mut r);
        std::thread::sleep(Duration::from_millis(300));
    }
    if !failed {
        r.final_checks();
        stop(&mut r);
    }
    let failed = !r.tally.violations.is_empty();
    for f in &r.freezers {
        let _ = f.set("THAWED");
    }
    for d in &r.frozen_v2 {
        node::thaw(d);
    }
    r.out.last = r.recent.iter().cloned().collect();
    if failed {
        // The agent's log is the one thing kept from a failed run (its temp dir goes).
        let keep = std::env::temp_dir().join(format!("reactor-chaos-{}-agent.log", opts.seed));
        if std::fs::write(&keep, r.agent.log()).is_ok() {
            r.out.agent_log = Some(keep);
        }
    }
    let mut out = std::mem::take(&mut r.out);
    out.tally = std::mem::take(&mut r.tally);
    drop(r);
    drop(nodefs);
    if out.tally.violations.is_empty() {
        Ok(out)
    } else {
        Err(Box::new(out))
    }
}

impl Run {
    fn note(&mut self, what: String) {
        let line = format!("{:>8.1} s  {what}", self.started.elapsed().as_secs_f64());
        println!("chaos: {line}");
        self.recent.push_back(line);
        if self.recent.len() > 25 {
            self.recent.pop_front();
        }
    }

    fn follow(&mut self) {
        self.events = Some(self.agent.follow_events(None));
    }

    /// Applies a Guaranteed sleeper and waits for its container to run: on a host where
    /// the agent lacks CAP_SYS_RESOURCE the kubelet's -997 `oom_score_adj` is refused.
    fn probe_guaranteed(&mut self) -> Result<(), String> {
        let doc = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "probe-guaranteed", "namespace": "chaos-probe"},
            "spec": {"terminationGracePeriodSeconds": 0, "restartPolicy": "Never",
                     "containers": [{"name": "app", "command": ["sleep", "3600"],
                        "resources": {"requests": {"memory": "32Mi", "cpu": "100m"},
                                      "limits": {"memory": "32Mi", "cpu": "100m"}}}]}});
        let mut doc = doc;
        if self.ctd.is_some() {
            doc["spec"]["containers"][0]["image"] = serde_json::json!(IMAGE);
        }
        self.agent.apply_ok(&doc);
        let deadline = Instant::now() + Duration::from_secs(10);
        let result = loop {
            let p = self.agent.pod("chaos-probe/probe-guaranteed");
            let c = p.as_ref().map(|p| p["containers"][0].clone());
            if let Some(c) = c {
                if c["state"] == "running" {
                    break Ok(());
                }
                if c["restartCount"].as_u64().unwrap_or(0) > 0 || c["state"] == "terminated" {
                    let why = self
                        .agent
                        .log()
                        .lines()
                        .rev()
                        .find(|l| l.contains("probe-guaranteed") && l.contains("WARN"))
                        .map(|l| l.split_once("WARN").map_or(l, |x| x.1).trim().to_string())
                        .unwrap_or_else(|| format!("container {c}"));
                    break Err(why);
                }
            }
            if Instant::now() > deadline {
                break Err("its container did not start within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let _ = self
            .agent
            .cli(&["pod", "rm", "chaos-probe/probe-guaranteed", "--grace", "0"]);
        result
    }

    fn act(&mut self, action: &Action) {
        let done = match action {
            Action::Start(plan) => {
                let at = Places {
                    memhog: &self.memhog,
                    cache_dir: &self.cache_dir,
                    cache_source: self.cache_source.as_deref(),
                    nodefs: &self.nodefs,
                    image: self.ctd.as_ref().map(|_| IMAGE),
                };
                let doc = pods::document(plan, &at);
                let out = self
                    .agent
                    .apply(&format!("{}.json", plan.name()), &doc.to_string());
                let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
                let admitted = answer["admitted"] == true;
                self.note(format!(
                    "{action}: {}",
                    if admitted {
                        "admitted".to_string()
                    } else {
                        format!(
                            "not admitted: {} {}{}",
                            answer["reason"],
                            answer["message"],
                            String::from_utf8_lossy(&out.stderr).trim()
                        )
                    }
                ));
                self.pods.push(Tracked {
                    plan: plan.clone(),
                    uid: answer["uid"].as_str().map(str::to_string),
                    // A refused pod has no cgroup of its own (the answer names none).
                    cgroup: answer["cgroup"]
                        .as_str()
                        .filter(|c| admitted && c.contains("/pod"))
                        .map(str::to_string),
                    applied: Instant::now(),
                    ended: (!admitted).then(Instant::now),
                    removed: false,
                    evictions: 0,
                    eviction_grace: None,
                    restarts_at_eviction: None,
                    frozen_until: None,
                });
                // A listing with the new pod in it, so an eviction that comes before the
                // next round is judged too.
                if admitted {
                    let rows = self.agent.pods();
                    self.set_snapshot(rows);
                }
                true
            }
            Action::Remove { n, grace } => {
                let Some(i) = self.live(*n) else {
                    self.note(format!("{action}: skipped, it has ended"));
                    return;
                };
                let full = self.pods[i].full();
                let out = self
                    .agent
                    .cli(&["pod", "rm", &full, "--grace", &grace.to_string()]);
                self.note(format!(
                    "{action} ({full}): {}",
                    if out.status.success() {
                        "ok".into()
                    } else {
                        String::from_utf8_lossy(&out.stderr).trim().to_string()
                    }
                ));
                let p = &mut self.pods[i];
                p.removed = true;
                p.plan.grace = p.plan.grace.max(*grace);
                p.ended.get_or_insert_with(Instant::now);
                true
            }
            Action::Freeze { n, ms } => {
                let Some(i) = self.live(*n) else {
                    self.note(format!("{action}: skipped, it has ended"));
                    return;
                };
                let done = self.freeze(i, Duration::from_millis(*ms));
                self.note(format!("{action} ({}): {done}", self.pods[i].full()));
                true
            }
            Action::KillAgent { down_ms } => {
                self.note(format!("{action}"));
                self.excuses.agent_down.push((Instant::now(), None));
                // What the agent said before it dies is read first: a new follower starts
                // from the next agent's events.
                self.drain_events();
                self.events = None;
                self.agent.kill(Signal::KILL);
                let until = Instant::now() + Duration::from_millis(*down_ms);
                while Instant::now() < until {
                    self.drain_ooms();
                    std::thread::sleep(Duration::from_millis(50));
                }
                self.agent.restart();
                if let Some(w) = self.excuses.agent_down.last_mut() {
                    w.1 = Some(Instant::now());
                }
                self.follow();
                self.after_restart();
                true
            }
            Action::KillContainerd { down_ms } => {
                let Some(pid) = self.ctd.as_ref().map(Containerd::pid) else {
                    self.note(format!("{action}: skipped, no containerd in this mode"));
                    return;
                };
                self.note(format!("{action}"));
                if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                    let _ = rustix::process::kill_process(p, Signal::KILL);
                }
                if let Some(c) = self.ctd.as_mut() {
                    // Reaps the dead daemon; its shims and containers keep running.
                    c.stop_daemon();
                }
                let until = Instant::now() + Duration::from_millis(*down_ms);
                while Instant::now() < until {
                    self.drain_ooms();
                    std::thread::sleep(Duration::from_millis(50));
                }
                if let Some(c) = self.ctd.as_mut() {
                    c.start_daemon().expect("containerd back");
                }
                true
            }
        };
        if done {
            self.out.actions.entry(action.kind()).or_default().1 += 1;
        }
    }

    /// The index of schedule pod `n` if it was admitted and has not ended.
    fn live(&self, n: usize) -> Option<usize> {
        self.pods
            .iter()
            .position(|p| p.plan.n == n)
            .filter(|&i| self.pods[i].ended.is_none() && self.pods[i].uid.is_some())
    }

    /// Freezes pod `i`'s processes: on v1 moved into a freezer cgroup below the run's root,
    /// on v2 in their own pod cgroup (`cgroup.freeze`); the [`Thawer`] thaws them after
    /// `dur`.
    fn freeze(&mut self, i: usize, dur: Duration) -> String {
        let Some(cg) = self.pods[i].cgroup.clone() else {
            return "no cgroup".into();
        };
        let dir = self.agent.memory_dir(&cg);
        let pids = check::pids_below(&dir);
        if pids.is_empty() {
            return "no processes".into();
        }
        if self.agent.root.is_v2() {
            let frozen = node::freeze_v2(&dir, Duration::from_secs(10)).unwrap_or(false);
            self.pods[i].frozen_until = Some(Instant::now() + dur);
            self.thawer.thaw_at(dir.clone(), Instant::now() + dur);
            self.frozen_v2.push(dir);
            return format!("{} processes, frozen: {frozen}", pids.len());
        }
        let name = format!("{}/frozen-{}", self.agent.root.name, self.pods[i].plan.n);
        if !Path::new(FREEZER).join(&self.agent.root.name).exists() {
            let _ = std::fs::create_dir(Path::new(FREEZER).join(&self.agent.root.name));
        }
        let f = match Freezer::new(&name) {
            Ok(f) => f,
            Err(e) => return format!("freezer: {e}"),
        };
        let moved = pids.iter().filter(|p| f.add(**p).is_ok()).count();
        let frozen = f.freeze(Duration::from_secs(2)).unwrap_or(false);
        self.pods[i].frozen_until = Some(Instant::now() + dur);
        self.thawer.thaw_at(f.0.clone(), Instant::now() + dur);
        self.freezers.push(f);
        format!("{moved} processes, frozen: {frozen}")
    }

    fn drain_ooms(&mut self) {
        for (at, dir, n) in self.oom.take() {
            let cause = self
                .excuses
                .cause(at, &self.pods, self.model.ramp_limit_mib_s);
            let what = format!("{n} kernel OOM kill(s) in {}", dir.display());
            match cause {
                Some(c) => {
                    *self.tally.exceptions.entry(c.clone()).or_default() += n;
                    self.note(format!("{what}: excused ({c})"));
                }
                None => {
                    self.note(what.clone());
                    self.tally.check("no-oom-kill", false, || {
                        format!("{what} with the agent up and the pressure within reach")
                    });
                }
            }
        }
    }

    /// The files an ended pod wrote go once its processes have: a disk filler's directory
    /// on nodefs (as the kubelet removes a pod's emptyDir and writable layer), a page-cache
    /// writer's file on the real disk.
    fn clean_up_files(&mut self) {
        for p in &self.pods {
            let (Some(_), Some(cg)) = (p.ended, p.cgroup.as_ref()) else {
                continue;
            };
            let path = match p.plan.work {
                Work::DiskFiller { .. } => self.nodefs.join(p.plan.name()),
                Work::CacheWriter { .. } => self.cache_dir.join(p.plan.name()),
                _ => continue,
            };
            if path.exists() && check::pids_below(&self.agent.memory_dir(cg)).is_empty() {
                let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
            }
        }
    }

    /// One round of every continuous check.
    fn round(&mut self) {
        self.clean_up_files();
        self.drain_ooms();
        self.drain_events();
        let pods = self.agent.pods();
        self.observe(&pods);
        self.set_snapshot(pods);
        self.check_cgroups();
        self.check_rss();
        self.check_agreement();
        // OOM kills counted in the period: none beyond the excused ones.
        *self.tally.checks.entry("no-oom-kill").or_default() += 1;
    }

    fn drain_events(&mut self) {
        let mut got = Vec::new();
        if let Some((_, rx)) = &self.events {
            while let Ok(e) = rx.try_recv() {
                got.push(e);
            }
        }
        for e in got {
            let kind = e["kind"].as_str().unwrap_or("").to_string();
            let key = (
                kind.clone(),
                e["atUnixNanos"].as_i64().unwrap_or(0),
                e["event"]["uid"].as_str().unwrap_or("").to_string(),
            );
            if !self.seen_events.insert(key) {
                continue;
            }
            match kind.as_str() {
                "eviction" => {
                    let at = std::time::UNIX_EPOCH
                        + Duration::from_nanos(e["atUnixNanos"].as_u64().unwrap_or(0));
                    self.on_eviction(&e["event"], at)
                }
                "oom_kill" => *self.out.agent.entry("oom-kill events".into()).or_default() += 1,
                "preemption" => *self.out.agent.entry("preemptions".into()).or_default() += 1,
                _ => {}
            }
        }
    }

    fn on_eviction(&mut self, ev: &Value, ev_at: std::time::SystemTime) {
        let signal = ev["signal"].as_str().unwrap_or("?").to_string();
        *self
            .out
            .agent
            .entry(format!("evictions ({signal})"))
            .or_default() += 1;
        let uid = ev["uid"].as_str().unwrap_or("").to_string();
        let Some(i) = self
            .pods
            .iter()
            .position(|p| p.uid.as_deref() == Some(&uid))
        else {
            self.note(format!("eviction of a pod the run did not start: {ev}"));
            return;
        };
        let full = self.pods[i].full();
        self.note(format!(
            "evicted {full} ({signal}, grace {})",
            ev["gracePeriodSeconds"]
        ));
        // The order is judged from a listing taken before the decision only.
        let listing: Option<Vec<Value>> = self
            .listings
            .iter()
            .rev()
            .find(|(t, _)| *t < ev_at)
            .map(|(_, rows)| rows.clone());
        let row = listing
            .as_ref()
            .and_then(|rows| rows.iter().find(|p| p["uid"] == uid.as_str()))
            .cloned();
        let grace = ev["gracePeriodSeconds"].as_i64().unwrap_or(0);
        let p = &mut self.pods[i];
        // A graceful eviction that a hard threshold cuts short is reported again, marked
        // `escalated`: the same eviction, once it had begun with a grace.
        if ev["escalated"] == true {
            let ok = p.evictions == 1 && p.eviction_grace.is_some_and(|g| g > 0) && grace == 0;
            p.eviction_grace = Some(0);
            *self
                .out
                .agent
                .entry("escalations (graceful eviction cut short)".into())
                .or_default() += 1;
            self.tally
                .check("escalation-of-a-graceful-eviction", ok, || {
                    format!("{full} escalated without a graceful eviction under way: {ev}")
                });
            return;
        }
        p.evictions += 1;
        p.eviction_grace = Some(grace);
        if p.restarts_at_eviction.is_none() {
            p.restarts_at_eviction = row
                .as_ref()
                .and_then(|r| r["containers"][0]["restartCount"].as_u64());
        }
        p.ended.get_or_insert_with(Instant::now);
        let (n, critical, guaranteed) = (
            p.evictions,
            p.plan.critical(),
            p.plan.qos == Qos::Guaranteed,
        );
        self.tally.check("evicted-at-most-once", n <= 1, || {
            format!("{full} evicted {n} times")
        });
        self.tally.check("critical-never-evicted", !critical, || {
            format!("{full} is critical and was evicted: {ev}")
        });
        match row.zip(listing) {
            Some((row, listing)) => {
                // A pod the run removed is being stopped: it ranks before nobody either.
                let mut stopping = self.evicting.clone();
                stopping.extend(
                    self.pods
                        .iter()
                        .filter(|p| p.removed)
                        .filter_map(|p| p.uid.clone()),
                );
                let before = check::ranks_before(&row, &signal, &listing, &stopping);
                let names: Vec<String> = before
                    .iter()
                    .map(|q| format!("{} ({} priority {})", q["name"], q["qos"], q["priority"]))
                    .collect();
                let name = if guaranteed {
                    "eviction-order-guaranteed"
                } else {
                    "eviction-order"
                };
                self.tally.check(name, names.is_empty(), || {
                    format!("{full} evicted for {signal} while {names:?} ranked before it")
                });
            }
            None => {
                *self
                    .out
                    .agent
                    .entry("evictions not order-checked (no listing before)".into())
                    .or_default() += 1
            }
        }
        self.evicting.insert(uid);
    }

    /// Per pod: ended when `pod ls` says so, never running again after its eviction, never
    /// restarted after it; every pod the run started and did not remove is listed; no
    /// orphan.
    fn observe(&mut self, rows: &[Value]) {
        let now = Instant::now();
        for p in &mut self.pods {
            let Some(uid) = p.uid.clone() else { continue };
            let row = rows.iter().find(|r| r["uid"] == uid.as_str());
            let full = p.full();
            if let Some(row) = row {
                if check::ended(row) {
                    p.ended.get_or_insert(now);
                }
                if p.evictions > 0 {
                    let restarts = row["containers"][0]["restartCount"].as_u64();
                    let (was, running) = (
                        p.restarts_at_eviction,
                        row["containers"][0]["state"] == "running",
                    );
                    let ok = restarts <= was || was.is_none();
                    let ok2 = !(check::ended(row) && running);
                    self.tally
                        .check("not-restarted-after-eviction", ok && ok2, || {
                            format!("{full} restarted after its eviction: {row}")
                        });
                }
            } else if !p.removed {
                self.tally.check("every-pod-listed", false, || {
                    format!("{full} (uid {uid}) is not listed by pod ls")
                });
            }
        }
        *self.tally.checks.entry("every-pod-listed").or_default() += 1;
        let orphans: Vec<&Value> = rows.iter().filter(|r| r["reason"] == "Orphaned").collect();
        self.tally.check("no-orphan", orphans.is_empty(), || {
            format!("orphans listed: {orphans:?}")
        });
    }

    /// No process in an ended pod's cgroup past its grace; no process in a pod cgroup that
    /// `pod ls` does not show.
    fn check_cgroups(&mut self) {
        let now = Instant::now();
        for p in &self.pods {
            let (Some(ended), Some(cg)) = (p.ended, p.cgroup.as_ref()) else {
                continue;
            };
            let slack = self.model.slack;
            let mut due = ended + Duration::from_secs(p.plan.grace) + slack;
            if let Some(u) = p.frozen_until {
                due = due.max(u + slack);
            }
            if now < due {
                continue;
            }
            let pids = check::pids_below(&self.agent.memory_dir(cg));
            let full = p.full();
            self.tally
                .check("ended-pod-cgroup-empty", pids.is_empty(), || {
                    format!(
                        "{full} ended {:.1} s ago (grace {} s) and still has processes {pids:?}",
                        ended.elapsed().as_secs_f64(),
                        p.plan.grace
                    )
                });
        }
        self.unseen("no-process-unseen");
    }

    /// Every busy pod cgroup belongs to a pod `pod ls` shows, or to one the run removed
    /// (whose processes are on their way out).
    fn unseen(&mut self, name: &'static str) {
        let busy = check::busy_pods(&self.agent.memory_dir("kubepods"));
        let listed: BTreeSet<&str> = self
            .snapshot
            .iter()
            .filter_map(|p| p["uid"].as_str())
            .collect();
        let removed: BTreeSet<&str> = self
            .pods
            .iter()
            .filter(|p| p.removed)
            .filter_map(|p| p.uid.as_deref())
            .collect();
        let hidden: Vec<(&String, &Vec<u32>)> = busy
            .iter()
            .filter(|(uid, _)| !listed.contains(uid.as_str()) && !removed.contains(uid.as_str()))
            .collect();
        self.tally.check(name, hidden.is_empty(), || {
            format!("processes in pod cgroups that pod ls does not show: {hidden:?}")
        });
    }

    fn check_rss(&mut self) {
        let Some(kib) = check::rss_kib(self.agent.pid()) else {
            return;
        };
        self.out.peak_rss_kib = self.out.peak_rss_kib.max(kib);
        self.tally
            .check("agent-rss-bounded", kib <= RSS_BOUND_KIB, || {
                format!("agent RSS {kib} KiB over {RSS_BOUND_KIB} KiB")
            });
    }

    /// `pod ls`, `pods.json` and the kill journal agree: the same pods in the same phases
    /// (when two `pod ls` around the read agree, so nothing changed meanwhile), and every
    /// note in the journal names a pod being evicted or evicted.
    fn check_agreement(&mut self) {
        let state = self.agent.dir.path().join("state");
        for _ in 0..3 {
            let a = check::listed_phases(&self.snapshot);
            let file = check::checkpoint_pods(&state);
            let now = self.agent.pods();
            let b = check::listed_phases(&now);
            self.set_snapshot(now);
            if a != b {
                continue;
            }
            let ok = file.as_ref() == Some(&b);
            if !ok {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            *self.tally.checks.entry("checkpoint-agrees").or_default() += 1;
            break;
        }
        // Three tries with the listing steady and still apart: the checkpoint lags or lies.
        let a = check::listed_phases(&self.snapshot);
        let file = check::checkpoint_pods(&state);
        if file.as_ref() != Some(&a) && a == check::listed_phases(&self.agent.pods()) {
            self.tally.check("checkpoint-agrees", false, || {
                format!("pods.json {file:?} but pod ls {a:?}")
            });
        }
        // A note is written right after the kill, before its event and `pod ls` show the
        // eviction: an unknown note is looked at again after the events have caught up.
        for attempt in 0..4 {
            let unknown: Vec<_> = reactor::node::journal::KillJournal::read(&state)
                .into_iter()
                .filter(|n| !self.evicted(&n.uid))
                .collect();
            if unknown.is_empty() {
                break;
            }
            if attempt < 3 {
                std::thread::sleep(Duration::from_millis(300));
                self.drain_events();
                self.set_snapshot(self.agent.pods());
                continue;
            }
            for n in unknown {
                let name = self
                    .pods
                    .iter()
                    .find(|p| p.uid.as_deref() == Some(n.uid.as_str()))
                    .map(Tracked::full);
                let row = self
                    .snapshot
                    .iter()
                    .find(|p| p["uid"] == n.uid.as_str())
                    .cloned();
                self.tally.check("journal-agrees", false, || {
                    format!(
                        "the kill journal notes {} ({name:?}, {}: {}), which no eviction \
                         names; pod ls: {row:?}",
                        n.uid, n.reason, n.message
                    )
                });
            }
        }
        *self.tally.checks.entry("journal-agrees").or_default() += 1;
    }

    fn set_snapshot(&mut self, rows: Vec<Value>) {
        let now = std::time::SystemTime::now();
        self.listings.push_back((now, rows.clone()));
        if self.listings.len() > 4 {
            self.listings.pop_front();
        }
        self.snapshot = rows;
    }

    /// Whether an eviction of `uid` was announced or `pod ls` shows it evicted.
    fn evicted(&self, uid: &str) -> bool {
        self.evicting.contains(uid)
            || self
                .snapshot
                .iter()
                .any(|p| p["uid"] == uid && p["reason"] == "Evicted")
    }

    /// After a restart: every pod is running and known, or ended and recorded.
    fn after_restart(&mut self) {
        self.set_snapshot(self.agent.pods());
        self.unseen("restart-none-unseen");
        let rows = self.snapshot.clone();
        for p in &self.pods {
            let Some(uid) = p.uid.as_deref() else {
                continue;
            };
            let row = rows.iter().find(|r| r["uid"] == uid);
            let full = p.full();
            let ok = match row {
                Some(r) => r["phase"] == "Running" || r["phase"] == "Pending" || check::ended(r),
                None => p.removed,
            };
            self.tally.check("restart-each-pod-known", ok, || {
                format!("{full} after the restart: {row:?}")
            });
        }
    }

    fn final_checks(&mut self) {
        self.round();
        self.after_restart();
        self.note(format!("end of the schedule (seed {})", self.seed));
    }
}
