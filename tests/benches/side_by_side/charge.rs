//! Part 7: what the in-kernel usage thresholds cost on the charge path. A child process writes
//! to fresh pages flat out in a child of a watched memory cgroup (every write fault allocates
//! and charges a page, and `madvise(DONTNEED)` gives them back) under these setups, each run
//! between two no-eBPF runs (the order rotated every round, each rate divided by the
//! geometric mean of its two neighbours' no-eBPF rates):
//!
//! - no eBPF program attached;
//! - the agent's programs without the charge programs and with `count_memcg_events` on
//!   throughout (what the agent attached before either was switched);
//! - calm: the programs as the agent runs them, the parent watched with its level far above
//!   usage, so the charge programs are off their tracepoint (they attach only near a level)
//!   and so is `count_memcg_events` (it attaches only on reclaim);
//! - page cache near the level: the same, in a second parent that also holds 200 MiB of
//!   file page cache (written to a file on disk from a cgroup of its own there, before the
//!   rounds) and is watched by a working-set level of 200 MiB: its working set is far from
//!   the level, but its usage, page cache counted, is within the tripwire's reach (the
//!   tripwire compares usage, [`reactor::sense::ebpf::near`]), so the charge programs stay
//!   on: what a calm node whose page cache fills its cgroups pays;
//! - a node full of page cache: as calm, with a second watched parent beside the plain one,
//!   as a node watches both its root and kubepods: a 512 MiB-limited parent at its limit with
//!   at least 80 % of its usage inactive file pages (a file larger than the limit written to
//!   disk from a cgroup of its own there, its cache dropped and read back once, before the
//!   rounds, [`crate::page_cache::fill`]; the share is read from
//!   `memory.stat` and the part fails below 80 %), watched by a working-set level of 300 MiB
//!   far above its working set. The faulting child stays in the plain parent: a child of the
//!   full parent would reclaim on every fault, and the figure would be the kernel's reclaim.
//!   What a node whose page cache fills its cgroups pays while nothing nears a level (the
//!   tripwire compares usage, so with today's agent the charge programs stay on);
//! - the kernel's dispatch alone: an empty program on the charge programs' tracepoint
//!   ([`DispatchFloor`]), the floor under "armed" that no program can go below;
//! - armed: the charge programs on throughout and the parent watched (the threshold far above
//!   usage, so every charge takes the full check: map lookup, ancestor, usage read), the cost
//!   while a watched cgroup is near its level and nothing is reclaimed;
//! - armed at the edge: the same with the level at 8 MiB, above the parent's usage (the
//!   child's region dropped and faulted again, 1.3-4.5 MiB), and the near zone widened to
//!   8 MiB so the whole run is in it: every CPU checks on every page it charges, the cost
//!   in the last stretch before a level (the agent's zone is 640 KiB per possible CPU, at
//!   least 2 MiB);
//! - armed and reclaiming: the same as armed with `count_memcg_events` on too, the cost while
//!   memory is being reclaimed near a level.
//!
//! The figure is page faults per second; the ratio to "no eBPF" is the cost. After the timed
//! rounds, one more run per setup with the kernel's per-program statistics on
//! (`BPF_ENABLE_STATS`, what `kernel.bpf_stats_enabled=1` does, off again when the part ends)
//! gives each attached program's runs per fault and ns per run under the same workload. It
//! runs apart from the timed rounds because counting itself costs two clock reads per run.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reactor::sense::ebpf::floor::DispatchFloor;
use reactor::sense::ebpf::stats::{ProgramStats, StatsReader};
use reactor::sense::ebpf::threshold::UsageWatch;
use reactor::sense::ebpf::{EbpfOptions, EbpfSource};
use reactor::sense::memcg::Level;
use reactor_tests::stats::{median, range, trimmed_ratio, Estimate, TRIM};
use reactor_tests::TestMemcg;
use serde_json::json;

use crate::opts::Opts;
use crate::page_cache::{self, CacheFile, MemStat};
use crate::report::{Part, Table};

/// The first argument that makes this binary the charging child.
pub const CHILD_FLAG: &str = "--charge-child";

const REGION: usize = 4 << 20;
const PAGE: usize = 4096;

/// The child: join the cgroup at `args[0]` (its `cgroup.procs`) and write one byte to each
/// page of a 4 MiB region, dropping and refaulting it, for `args[1]` milliseconds; print how
/// many faults.
pub fn child(args: &[String]) -> Result<()> {
    let (Some(procs), Some(millis)) = (args.first(), args.get(1)) else {
        bail!("usage: {CHILD_FLAG} <cgroup.procs> <milliseconds>");
    };
    let run_for = Duration::from_millis(millis.parse().context("milliseconds")?);
    let base = crate::ring::join_and_map(procs, REGION)?;
    pin_to_last_cpu();
    // Untimed first: a virtual CPU that was idle runs slower for its first hundreds of
    // milliseconds, which taxed whichever setup started after the quietest pause.
    let warm = fault_for(base, WARM_UP)?;
    let (cpu_before, start) = (cpu_nanos(), Instant::now());
    let faults = fault_for(base, run_for)?;
    let wall = start.elapsed().as_nanos();
    println!(
        "faults {faults} nanos {wall} cpu_nanos {} all_faults {}",
        cpu_nanos().saturating_sub(cpu_before),
        warm + faults
    );
    Ok(())
}

/// How long the child faults before it starts counting.
const WARM_UP: Duration = Duration::from_millis(300);

/// Writes to each page of the region at `base`, drops it and faults it again, for `run_for`;
/// returns how many faults.
fn fault_for(base: *mut std::ffi::c_void, run_for: Duration) -> Result<u64> {
    let start = Instant::now();
    let mut faults: u64 = 0;
    while start.elapsed() < run_for {
        for page in 0..REGION / PAGE {
            // SAFETY: inside the mapping, which stays mapped until the process exits; a
            // volatile write so the fault really happens.
            unsafe { std::ptr::write_volatile(base.cast::<u8>().add(page * PAGE), 1) };
        }
        faults += (REGION / PAGE) as u64;
        // SAFETY: the whole mapping; nothing holds references into it.
        unsafe { rustix::mm::madvise(base, REGION, rustix::mm::Advice::LinuxDontNeed) }
            .context("madvise(MADV_DONTNEED)")?;
    }
    Ok(faults)
}

/// Pins this process to the machine's last CPU. A faulting process that moves between CPUs
/// leaves the CPU it left in its mm's CPU mask, and each `madvise` then sends that CPU a
/// TLB-flush IPI, far dearer when it is an idle virtual CPU: it made the fault rate depend
/// on where the scheduler put the child, and on how idle the other CPU was.
fn pin_to_last_cpu() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and sched_setaffinity take valid pointers.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpus - 1, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// This process's user + system CPU time so far, ns (`getrusage`): what its faults cost it,
/// the programs included (they run in the faulting task), without the time it waited.
fn cpu_nanos() -> u128 {
    // SAFETY: an all-zero rusage is valid; getrusage fills it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0;
    }
    let ns = |t: libc::timeval| t.tv_sec as u128 * 1_000_000_000 + t.tv_usec as u128 * 1_000;
    ns(u.ru_utime) + ns(u.ru_stime)
}

/// One run of the child in `cg`; returns (faults, seconds of CPU time it spent on them,
/// faults with the warm-up's).
fn fault(cg: &TestMemcg, millis: u64) -> Result<(u64, f64, u64)> {
    let out = Command::new(std::env::current_exe()?)
        .arg(CHILD_FLAG)
        .arg(cg.path.join("cgroup.procs"))
        .arg(millis.to_string())
        .stdin(Stdio::null())
        .output()
        .context("running the charging child")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "charging child failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut words = text.split_whitespace();
    match (words.nth(1), words.nth(3), words.nth(1)) {
        (Some(f), Some(n), Some(all)) => Ok((
            f.parse().context("child's fault count")?,
            n.parse::<f64>().context("child's time")? / 1e9,
            all.parse()
                .context("child's fault count with the warm-up")?,
        )),
        _ => bail!("charging child said {text:?}"),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Setup {
    None,
    Programs,
    Calm,
    CacheNear,
    CacheFull,
    Floor,
    Thresholds,
    Edge,
    Reclaiming,
}

impl Setup {
    const ALL: [Setup; 9] = [
        Setup::None,
        Setup::Programs,
        Setup::Calm,
        Setup::CacheNear,
        Setup::CacheFull,
        Setup::Floor,
        Setup::Thresholds,
        Setup::Edge,
        Setup::Reclaiming,
    ];

    fn name(self) -> &'static str {
        match self {
            Setup::None => "no eBPF",
            Setup::Programs => "agent programs, memcg events throughout, no charge programs",
            Setup::Calm => "calm: as the agent runs them, parent watched far from its level",
            Setup::CacheNear => {
                "page cache near the level: as calm, the parent's working set far from its \
                 level, its usage (200 MiB of page cache) within reach"
            }
            Setup::CacheFull => {
                "node full of page cache: as calm, a second watched parent at its 512 MiB \
                 limit, mostly inactive file, its working set far from a 300 MiB level"
            }
            Setup::Floor => {
                "the kernel's dispatch alone: an empty program on the charge tracepoint"
            }
            Setup::Thresholds => "armed: charge programs on, parent watched",
            Setup::Edge => "armed at the edge: in the level's near zone, every page checked",
            Setup::Reclaiming => "armed and reclaiming: charge programs and memcg events on",
        }
    }
}

/// The near zone of the edge setup: 8 MiB, wider than the parent's usage ever is.
const EDGE_ZONE_PAGES: u64 = 2048;

/// What a setup attached: the agent's source (drained by a task until it is aborted) or
/// the empty program alone.
enum Attached {
    Source(tokio::task::JoinHandle<()>, StatsReader),
    Floor(DispatchFloor),
}

impl Attached {
    fn stats(&self) -> Vec<ProgramStats> {
        match self {
            Attached::Source(_, stats) => stats.read(),
            Attached::Floor(floor) => floor.stats(),
        }
    }

    fn detach(self, rt: &tokio::runtime::Runtime) {
        if let Attached::Source(task, _) = self {
            task.abort();
            let _ = rt.block_on(task);
        }
    }
}

/// Attaches what `setup` asks for, watching `watched` (each parent with its level).
fn attach(
    rt: &tokio::runtime::Runtime,
    setup: Setup,
    watched: &[(&TestMemcg, Level)],
) -> Result<Option<Attached>> {
    match setup {
        Setup::None => return Ok(None),
        Setup::Floor => {
            let floor = DispatchFloor::attach()
                .map_err(anyhow::Error::msg)
                .context("attaching the empty program")?;
            return Ok(Some(Attached::Floor(floor)));
        }
        _ => {}
    }
    let thresholds = matches!(
        setup,
        Setup::Thresholds
            | Setup::Edge
            | Setup::Calm
            | Setup::CacheNear
            | Setup::CacheFull
            | Setup::Reclaiming
    );
    // The memcg events program as the agent switches it (on only after a reclaim stall;
    // this workload never stalls), except in the rows that keep it on throughout.
    let memcg_events_on_reclaim = matches!(
        setup,
        Setup::Calm | Setup::CacheNear | Setup::CacheFull | Setup::Thresholds | Setup::Edge
    )
    .then_some(reactor::sense::MEMCG_EVENTS_HOLD);
    // Calm: the charge programs come off their tracepoint once the source sees the parent far
    // from its level (the agent's setting); armed: on throughout.
    let near_level = matches!(setup, Setup::Calm | Setup::CacheNear | Setup::CacheFull)
        .then(reactor::sense::ebpf::near::NearLevel::default);
    let mut source = rt
        .block_on(async {
            EbpfSource::attach(EbpfOptions {
                usage_thresholds: thresholds,
                near_level,
                memcg_events_on_reclaim,
                near_zone_pages: (setup == Setup::Edge).then_some(EDGE_ZONE_PAGES),
                ..EbpfOptions::default()
            })
        })
        .context("attaching the eBPF source")?;
    // The levels' senders, kept for as long as the source runs (a watch whose sender is
    // gone stops following).
    let mut _keep = Vec::new();
    if thresholds {
        for (memcg, level) in watched {
            // At the edge the parent's usage (the child's 4 MiB region, dropped and faulted
            // again, and the process: 1.3-4.5 MiB measured) stays below 8 MiB and within the
            // widened zone.
            let level = if setup == Setup::Edge {
                Level::usage(8 << 20)
            } else {
                *level
            };
            let (keep, bytes) = tokio::sync::watch::channel(level);
            _keep.push(keep);
            source
                .watch_usage(UsageWatch {
                    cgroup: memcg.cgroup.clone(),
                    dir: memcg.path.clone(),
                    level: bytes,
                })
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("arming the usage threshold on {}", memcg.cgroup))?;
        }
    }
    let stats = source.stats();
    let (tx, mut rx) = tokio::sync::mpsc::channel(1 << 14);
    let task = rt.spawn(async move {
        let _keep = _keep;
        let run = tokio::spawn(source.run(tx));
        while rx.recv().await.is_some() {}
        run.abort();
    });
    Ok(Some(Attached::Source(task, stats)))
}

/// One run of the child under `setup`: (faults, seconds, each program's runs and ns in the
/// whole run, the faults of the whole run — the warm-up's too, as the programs ran on them).
fn one_run(
    rt: &tokio::runtime::Runtime,
    setup: Setup,
    parents: &Parents,
    millis: u64,
) -> Result<(u64, f64, Vec<ProgramStats>, u64)> {
    let child = &parents.of(setup).child;
    let attached = attach(rt, setup, &parents.watched(setup))?;
    // Let the attach settle before timing.
    std::thread::sleep(Duration::from_millis(100));
    let before = attached.as_ref().map(Attached::stats).unwrap_or_default();
    let (faults, secs, all_faults) = fault(child, millis)?;
    let mut used = Vec::new();
    if let Some(attached) = attached {
        for after in attached.stats() {
            let was = before.iter().find(|b| b.program == after.program);
            used.push(ProgramStats {
                program: after.program,
                runs: after.runs - was.map_or(0, |b| b.runs),
                run_ns: after.run_ns - was.map_or(0, |b| b.run_ns),
            });
        }
        attached.detach(rt);
    }
    if faults == 0 || secs <= 0.0 {
        bail!("the faulting child made no faults under {}", setup.name());
    }
    Ok((faults, secs, used, all_faults))
}

/// The page-cache-near setup's working-set level, and how much page cache it writes.
const CACHE_LEVEL: u64 = 200 << 20;
const CACHE_BYTES: u64 = 200 << 20;

/// A watched parent with the faulting child in it (and, for the page-cache parent, the
/// cgroup holding the cache and the file behind it).
struct Parent {
    // Dropped in this order: the children before the parent.
    child: TestMemcg,
    /// Held for the part: the cache's cgroup and the file (its page cache goes with it).
    _cache: Option<(TestMemcg, CacheFile)>,
    /// The level it is watched by (the edge setup's own aside): far above usage, or for the
    /// page-cache parent a working-set level with its `total_inactive_file` once the cache
    /// is written.
    level: Level,
    memcg: TestMemcg,
}

/// The node-full-of-page-cache setup's parent: its limit, how much it writes (more than
/// the limit, so the cache fills it), its working-set level, and the least share of its
/// usage that must be inactive file pages for the setup to be what it says.
const FULL_LIMIT: u64 = 512 << 20;
const FULL_WRITE: u64 = 640 << 20;
const FULL_LEVEL: u64 = 300 << 20;
const FULL_MIN_SHARE: f64 = 0.8;

/// Part 7's parents: the plain one, the one with page cache near its level, and the one
/// full of page cache (watched beside the plain one, with no faulting child of its own).
struct Parents {
    plain: Parent,
    cached: Parent,
    full: FullParent,
}

/// A watched parent at its limit with page cache, no process in it.
struct FullParent {
    // Dropped before the parent: the cache's cgroup, then the file (its cache with it).
    _cache: (TestMemcg, CacheFile),
    level: Level,
    /// Its usage and file pages once written.
    stat: MemStat,
    memcg: TestMemcg,
}

impl FullParent {
    /// Fills a new 512 MiB-limited parent with page cache and checks that at least
    /// [`FULL_MIN_SHARE`] of its usage is inactive file pages: below that the setup would
    /// measure something else, so it fails saying what it found.
    fn new() -> Result<FullParent> {
        let memcg =
            TestMemcg::new("bench-charge-full", FULL_LIMIT).context("creating the test memcg")?;
        let cache = memcg
            .child("cache")
            .context("creating the full parent's cache memcg")?;
        let file = page_cache::fill(&cache.path, FULL_WRITE)?;
        // The parent's statistics hold the cache before its share is judged.
        let stat = page_cache::settled(&memcg.path, &cache.path)?;
        if stat.inactive_share() < FULL_MIN_SHARE {
            bail!(
                "the page-cache-full parent holds {} MiB of inactive file pages in {} MiB of \
                 usage ({:.1} %), under the {:.0} % the setup needs",
                stat.inactive_file >> 20,
                stat.usage >> 20,
                stat.inactive_share() * 100.0,
                FULL_MIN_SHARE * 100.0
            );
        }
        Ok(FullParent {
            _cache: (cache, file),
            level: Level::working_set(FULL_LEVEL, stat.inactive_file),
            stat,
            memcg,
        })
    }
}

impl Parents {
    fn new() -> Result<Parents> {
        let plain = TestMemcg::new("bench-charge", 1 << 30).context("creating the test memcg")?;
        let cached =
            TestMemcg::new("bench-charge-cache", 1 << 30).context("creating the test memcg")?;
        let cache = cached
            .child("cache")
            .context("creating the cache's memcg")?;
        let file = page_cache::write(&cache.path, CACHE_BYTES)?;
        let inactive = page_cache::stat(&cached.path)?.inactive_file;
        let full = FullParent::new()?;
        Ok(Parents {
            plain: Parent {
                child: plain.child("pod").context("creating the child memcg")?,
                _cache: None,
                level: Level::usage(900 << 20),
                memcg: plain,
            },
            cached: Parent {
                child: cached.child("pod").context("creating the child memcg")?,
                _cache: Some((cache, file)),
                level: Level::working_set(CACHE_LEVEL, inactive),
                memcg: cached,
            },
            full,
        })
    }

    /// The cgroups `setup`'s source watches, each with its level: the plain parent, and
    /// beside it the full one for the page-cache-full setup (a node watches its root and
    /// kubepods both); the page-cache-near parent alone for its setup.
    fn watched(&self, setup: Setup) -> Vec<(&TestMemcg, Level)> {
        match setup {
            Setup::CacheNear => vec![(&self.cached.memcg, self.cached.level)],
            Setup::CacheFull => vec![
                (&self.plain.memcg, self.plain.level),
                (&self.full.memcg, self.full.level),
            ],
            _ => vec![(&self.plain.memcg, self.plain.level)],
        }
    }

    fn of(&self, setup: Setup) -> &Parent {
        if setup == Setup::CacheNear {
            &self.cached
        } else {
            &self.plain
        }
    }
}

/// Rounds in a full run, and each run's length: every setup but no-eBPF runs once per round.
const ROUNDS: usize = 16;
const MILLIS: u64 = 500;

/// Run part 7.
pub fn run(opts: &Opts) -> Result<Part> {
    let (millis, rounds) = if opts.quick {
        (300, 1)
    } else {
        (MILLIS, ROUNDS)
    };
    let parents = Parents::new()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // One sequence: no eBPF, a setup, no eBPF, the next setup, ... no eBPF. Each setup's run
    // sits between two no-eBPF runs a second or so from it, and its cost is its rate over
    // the geometric mean of theirs: this VM's speed drifts by 10-20 % over seconds, so a
    // ratio to a run further away measures the drift. The setups' order is rotated every
    // round, so none always follows the same one. Each no-eBPF run between two others gets
    // the same ratio to its neighbours: the row that shows what the method resolves.
    let n = Setup::ALL.len();
    let rate = |setup: Setup| -> Result<f64> {
        let (faults, secs, _, _) = one_run(&rt, setup, &parents, millis)?;
        Ok(faults as f64 / secs)
    };
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut before = rate(Setup::None)?;
    rates[0].push(before);
    for round in 0..rounds {
        for k in 0..n - 1 {
            let i = 1 + (k + round) % (n - 1);
            let this = rate(Setup::ALL[i])?;
            let after = rate(Setup::None)?;
            rates[i].push(this);
            ratios[i].push(this / (before * after).sqrt());
            rates[0].push(after);
            before = after;
        }
    }
    ratios[0] = rates[0]
        .windows(3)
        .map(|w| w[1] / (w[0] * w[2]).sqrt())
        .collect();
    // The statistics run, apart (counting costs two clock reads per program run).
    let mut programs: Vec<(Setup, u64, Vec<ProgramStats>)> = Vec::new();
    {
        let _stats_on = reactor::sense::ebpf::stats::enable_stats().map_err(anyhow::Error::msg)?;
        for setup in Setup::ALL.into_iter().skip(1) {
            let (_, _, used, faults) = one_run(&rt, setup, &parents, millis)?;
            programs.push((setup, faults, used));
        }
    }
    let cached = parents.cached.level.inactive_file_bytes;
    let full = parents.full.stat;
    drop(parents);
    let medians: Vec<f64> = rates.iter().map(|r| median(r)).collect();
    let ratio_medians: Vec<f64> = ratios.iter().map(|r| median(r)).collect();
    let estimates: Vec<Option<Estimate>> = ratios.iter().map(|r| trimmed_ratio(r)).collect();
    let spread = |r: &[f64]| {
        let (lo, hi) = range(r);
        format!("{lo:.3}–{hi:.3}")
    };
    let mut t = Table::new(
        "7. Charge-path cost of the in-kernel usage thresholds",
        &[
            "setup",
            "page faults/s (median)",
            "× no eBPF",
            "95 % interval",
            "× no eBPF, median",
            "× no eBPF, range",
        ],
    )
    .text_columns(1);
    for (i, setup) in Setup::ALL.into_iter().enumerate() {
        let (value, interval) = Estimate::texts(estimates[i]);
        t.row(vec![
            setup.name().to_string(),
            format!("{:.0}k", medians[i] / 1e3),
            value,
            interval,
            format!("{:.3}", ratio_medians[i]),
            spread(&ratios[i]),
        ]);
    }
    t.note(format!(
        "one process writing to fresh pages flat out in a child of the watched cgroup (each \
         write fault charges a page; the 4 MiB region is dropped and faulted again); {rounds} \
         round(s) of {millis} ms per setup, each setup's run between two no-eBPF runs, the \
         setups' order rotated every round"
    ));
    t.note(format!(
        "× no eBPF: each run's rate over the geometric mean of the no-eBPF runs just before and \
         after it, summarised by the ratios' {:.0} %-trimmed mean (on the logarithms) with its \
         95 % interval (Tukey-McLaughlin); the no-eBPF row is each no-eBPF run against its own \
         two neighbours: what the method resolves",
        TRIM * 100.0
    ));
    let mut p = Table::new(
        "7. Each program's cost under the same workload (BPF_ENABLE_STATS)",
        &[
            "setup",
            "program",
            "runs per fault",
            "ns per run",
            "ns per fault",
        ],
    )
    .text_columns(2);
    for (setup, faults, used) in &programs {
        if *setup != Setup::None && used.iter().all(|u| u.runs == 0) {
            // The verdict of the calm and page-cache rows: no program ran on their faults.
            p.row(vec![
                setup.name().to_string(),
                "(none ran)".to_string(),
                "0.00".to_string(),
                "-".to_string(),
                "0.0".to_string(),
            ]);
        }
        for u in used.iter().filter(|u| u.runs > 0) {
            let f = (*faults).max(1) as f64;
            p.row(vec![
                setup.name().to_string(),
                u.program.to_string(),
                format!("{:.2}", u.runs as f64 / f),
                format!("{:.1}", u.run_ns as f64 / u.runs as f64),
                format!("{:.1}", u.run_ns as f64 / f),
            ]);
        }
    }
    // The armed cost against the floor no program can go below: the charge program's own time
    // per run over the empty program's, both measured under the same workload here.
    let ns_per_run = |setup: Setup, program: &str| {
        programs
            .iter()
            .filter(|(s, _, _)| *s == setup)
            .flat_map(|(_, _, used)| used.iter())
            .find(|u| u.program == program && u.runs > 0)
            .map(|u| u.run_ns as f64 / u.runs as f64)
    };
    let over_floor = ns_per_run(Setup::Thresholds, "charge_lruvec")
        .zip(ns_per_run(Setup::Floor, "lruvec_floor"));
    if let Some((armed, floor)) = over_floor {
        p.note(format!(
            "armed against the dispatch floor: charge_lruvec {armed:.1} ns per run, the empty \
             program {floor:.1}: {:.2}×",
            armed / floor
        ));
    }
    p.note(format!(
        "node full of page cache: the faulting child in the plain parent (as calm), the \
         source watching it and a second parent limited to {} MiB, filled by a {} MiB file \
         written from a cgroup of its own (dd, conv=fsync, on /var/tmp), its cache dropped \
         and the file read back once (no buffer heads): {} MiB of usage, \
         {} MiB of it inactive file ({:.1} %, total_inactive_file), watched by a working-set \
         level of {} MiB",
        FULL_LIMIT >> 20,
        FULL_WRITE >> 20,
        full.usage >> 20,
        full.inactive_file >> 20,
        full.inactive_share() * 100.0,
        FULL_LEVEL >> 20
    ));
    p.note(format!(
        "one run of {millis} ms per setup after the timed rounds, with the kernel's per-program \
         statistics on (off again after); programs that did not run are left out, and a setup \
         where none ran reads (none ran)"
    ));
    Ok(Part {
        key: "charge",
        tables: vec![t, p],
        json: json!({
            "millis_per_round": millis,
            "page_cache_parent_inactive_file_bytes": cached,
            "armed_ns_per_run_over_floor": over_floor.map(|(a, f)| a / f),
            "page_cache_full_parent": {
                "limit_bytes": FULL_LIMIT, "written_bytes": FULL_WRITE,
                "working_set_level_bytes": FULL_LEVEL, "after_writing": full.json(),
            },
            "rounds": rounds,
            "setups": Setup::ALL.into_iter().zip(&rates).zip(&medians).enumerate().map(|(i, ((s, r), m))| json!({
                "setup": s.name(), "faults_per_s": r, "median_faults_per_s": m,
                "ratios_to_no_ebpf": ratios[i],
                "ratio_to_no_ebpf": estimates[i].map(|e| e.value),
                "ratio_interval": estimates[i].map(|e| [e.low, e.high]),
                "ratio_median": ratio_medians[i],
            })).collect::<Vec<_>>(),
            "programs": programs.iter().map(|(s, faults, used)| json!({
                "setup": s.name(), "faults": faults,
                "programs": used.iter().map(|u| json!({
                    "program": u.program, "runs": u.runs, "run_ns": u.run_ns,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        }),
        samples: rates.iter().map(Vec::len).sum(),
    })
}
