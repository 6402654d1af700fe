//! Part 7b: what the agent costs real programs on a calm node. Three programs, each run to
//! its end with the release `reactor run` on (every source, started as the footprint part
//! starts it, on the API-load part's modelled 512 MiB node with no pods, so its watched
//! cgroups are far from their levels) and with no agent running, in many short rounds of the
//! two sides:
//!
//! - a compressor: `xz -6 -T1` of generated text, compressible but not trivially (words
//!   from a 512-word vocabulary and numbers, picked by a fixed pseudo-random sequence);
//! - a C compile: `gcc -O2 -c` of a generated file of 540 lines (60 small functions);
//! - an interpreter's allocation-heavy run: `python3` building a 2 M-entry dict and 100 k
//!   page-sized bytearrays (each filled, so every page is faulted in).
//!
//! Each run is its own memory cgroup (1 GiB limit) under the part's unique test cgroup,
//! removed after it; the figure is wall time from just before the spawn to the exit. A tool
//! that is not installed is said so in the table, never measured by something else.
//!
//! Why many short rounds: on this VM a program's speed drifts by 10-20 % over seconds, in
//! CPU time as well as wall time and with no hypervisor steal to show for it (the vCPU
//! itself runs slower; runs a second apart are slow together far more often than runs ten
//! seconds apart). Rounds of long runs on three sides put the two runs of a pair half a
//! minute apart, and eight such rounds put the paired on / off medians at 0.95-1.26 in two
//! full runs. Here each program takes about half a second (1 MiB for xz, 540 lines for
//! gcc), a side waits 0.5 s, a round takes about 5 s, and 120 rounds give 120 ratios per
//! program. Their trimmed mean with its 95 % interval
//! ([`reactor_tests::stats::trimmed_ratio`]) is the figure: the interval says how small a
//! difference the run could tell, and it widens when the machine is noisy. The kernel
//! programs' own share is not timed on a third side: their runs and time during the on runs
//! are counted exactly (kernel statistics), and so is the agent process's CPU time.
//!
//! A node full of page cache (issue 42): every round also runs the two sides against a
//! second modelled node, the same config in a cgroup root of its own that lasts the whole
//! part, whose kubepods is filled with page cache up to its limit before the rounds (a
//! cgroup of the bench's own in kubepods writes a file 128 MiB larger than the limit to
//! `/var/tmp`, flushed, drops its cache and reads it back once, [`crate::page_cache::fill`],
//! and idles; the part fails if under 80 % of kubepods' usage is then
//! inactive file). Its agent is the same `reactor run`, started again for each on side in
//! that root (so the cache outlives it) and stopped (SIGTERM) after; its off side runs with
//! the cache in place and no agent. Its watched cgroups' working set is far from their
//! levels, their usage at them: the agent's tripwire then decides whether the charge
//! programs run on every page the programs fault. The programs themselves run where the
//! calm node's do, outside both nodes. The two nodes' pairs take turns within each round
//! (calm first in even rounds), and each is summarised as above in a table of its own.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use reactor_tests::agent::TestAgent;
use reactor_tests::stats::{median, quartiles, range, trimmed_ratio, Estimate, TRIM};
use reactor_tests::TestMemcg;
use serde_json::{json, Value};

use crate::opts::Opts;
use crate::page_cache::{CacheCgroup, MemStat};
use crate::report::{Part, Table};

const MI: u64 = 1 << 20;
/// Each run's memory limit: well above what any of the three needs (python3's run peaks near
/// 600 MiB), so the limit is there for safety, not as pressure.
const RUN_LIMIT: u64 = 1 << 30;
/// The compressor's input, MiB.
const XZ_INPUT_MI: u64 = 1;
/// The C file's functions (9 lines each).
const C_FUNCTIONS: usize = 60;
/// The sides of a round, by index: no agent, the agent with every source.
const SIDES: [&str; 2] = ["off", "on"];
const ON: usize = 1;
/// Rounds in a full run: each gives one on / off ratio per program.
const ROUNDS: usize = 120;
/// What each side waits before its runs: the agent's start (attaching its programs, its
/// first pass) or stop is over, and on the off side the same time passes.
const SETTLE: Duration = Duration::from_millis(500);
/// The two nodes' pairs of a round: the calm node, and the node full of page cache.
const NODES: [&str; 2] = ["calm", "page cache full"];
const CACHE_NODE: usize = 1;
/// How much more than kubepods' limit the page-cache node's writer writes.
const CACHE_EXTRA: u64 = 128 * MI;
/// The least share of kubepods' usage on the inactive file list for that node to be one.
const CACHE_MIN_SHARE: f64 = 0.8;
const PYTHON: &str = "d = {i: i for i in range(2_000_000)}\n\
                      b = [bytearray(b'\\x01') * 4096 for _ in range(100_000)]\n";

/// One real program.
struct Program {
    name: &'static str,
    tool: &'static str,
    /// What runs: the tool's own executable once found (see [`executable`]).
    exe: PathBuf,
    args: Vec<String>,
}

/// A small deterministic sequence (xorshift64), so every run compresses the same bytes.
struct Sequence(u64);

impl Sequence {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Writes the compressor's input: lines of 12 words from a 512-word vocabulary and a number.
fn text_file(dir: &Path) -> Result<PathBuf> {
    let mut seq = Sequence(0x9e37_79b9_7f4a_7c15);
    let words: Vec<String> = (0..512)
        .map(|_| {
            let len = 2 + seq.next() % 8;
            (0..len)
                .map(|_| char::from(b'a' + (seq.next() % 26) as u8))
                .collect()
        })
        .collect();
    let mut text = String::with_capacity((XZ_INPUT_MI * MI) as usize + 128);
    while (text.len() as u64) < XZ_INPUT_MI * MI {
        for _ in 0..12 {
            text.push_str(&words[(seq.next() % 512) as usize]);
            text.push(' ');
        }
        text.push_str(&(seq.next() % 10_000).to_string());
        text.push('\n');
    }
    let path = dir.join("input.txt");
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Writes the C file: small functions with loops and branches for the optimiser.
fn c_file(dir: &Path) -> Result<PathBuf> {
    let mut c = String::new();
    for i in 0..C_FUNCTIONS {
        c.push_str(&format!(
            "int f{i}(int *a, int n) {{\n    int s = {i};\n    for (int j = 0; j < n; j++) {{\n\
             \x20       if (a[j] % {m} == 0) s += a[j] * {k};\n\
             \x20       else s ^= a[j] << ({i} % 7);\n    }}\n\
             \x20   for (int j = n - 1; j > 0; j--) a[j] = a[j - 1] + s;\n    return s;\n}}\n",
            m = i + 3,
            k = i + 1,
        ));
    }
    let path = dir.join("unit.c");
    std::fs::write(&path, c).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The executable that runs for `tool`, or nothing when it is not installed (`--version`
/// fails). `python3` is asked for its own path (`sys.executable`): on a machine with a
/// version manager, `python3` on PATH is a shell script that starts the interpreter, whose
/// start-up would be timed with the program.
fn executable(tool: &str) -> Option<PathBuf> {
    let quiet = |c: &mut Command| c.stdin(Stdio::null()).stderr(Stdio::null()).output();
    let version = quiet(Command::new(tool).arg("--version")).ok()?;
    if !version.status.success() {
        return None;
    }
    if tool != "python3" {
        return Some(PathBuf::from(tool));
    }
    let out = quiet(Command::new(tool).args(["-c", "import sys; print(sys.executable)"])).ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    Some(if path.is_absolute() {
        path
    } else {
        PathBuf::from(tool)
    })
}

/// User + system CPU time of the children this process has waited for, seconds.
fn children_cpu() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// What one run came to.
struct Run {
    /// Wall time, s.
    secs: f64,
    /// User + system time, s.
    cpu: f64,
    /// Runs of the agent's eBPF programs during it (anyone's, on the whole machine) and
    /// their time, ns: 0 unless an agent's programs are on a tracepoint the run enters.
    ebpf: (u64, u64),
    /// The agent's own CPU time during it (every thread of its process), ns; 0 with no
    /// agent.
    agent_ns: u64,
}

/// The agent's CPU time so far ([`crate::footprint::cpu_ns`]); 0 with no agent (pid 0).
fn agent_cpu_ns(pid: u32) -> u64 {
    if pid == 0 {
        return 0;
    }
    crate::footprint::cpu_ns(pid)
}

/// One run of `p` in a fresh child cgroup of `root`: its wall time and its CPU time (user +
/// system, its own children's included: gcc's cc1), seconds. The CPU time holds what the
/// agent's kernel programs cost the program (they run in its context, as system time)
/// without the waits that other work on the machine adds to the wall time.
fn run_one(root: &TestMemcg, p: &Program, tag: &str, agent_pid: u32) -> Result<Run> {
    let mut cg = root
        .child(tag)
        .with_context(|| format!("the cgroup for {}", p.name))?;
    std::fs::write(cg.path.join("memory.limit_in_bytes"), RUN_LIMIT.to_string())
        .with_context(|| format!("limiting the cgroup for {}", p.name))?;
    let cpu0 = children_cpu();
    let agent0 = agent_cpu_ns(agent_pid);
    let ebpf0 = reactor::sense::ebpf::stats::loaded_program_totals();
    let (status, took) = cg
        .run(
            Command::new(&p.exe)
                .args(&p.args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .with_context(|| format!("running {}", p.tool))?;
    let cpu = children_cpu() - cpu0;
    let agent_ns = agent_cpu_ns(agent_pid).saturating_sub(agent0);
    let ebpf1 = reactor::sense::ebpf::stats::loaded_program_totals();
    let ebpf = (
        ebpf1.runs.saturating_sub(ebpf0.runs),
        ebpf1.run_ns.saturating_sub(ebpf0.run_ns),
    );
    drop(cg);
    if !status.success() {
        bail!("{} ({}) exited {status}", p.name, p.tool);
    }
    Ok(Run {
        secs: took.as_secs_f64(),
        cpu,
        ebpf,
        agent_ns,
    })
}

/// What two sides' runs of one program came to.
struct Summary {
    /// Each round's on / off wall time.
    paired: Vec<f64>,
    /// Each round's on / off CPU time.
    paired_cpu: Vec<f64>,
    wall: Option<Estimate>,
    cpu: Option<Estimate>,
}

fn summarise(off: &[Run], on: &[Run]) -> Summary {
    let paired: Vec<f64> = on.iter().zip(off).map(|(a, b)| a.secs / b.secs).collect();
    let paired_cpu: Vec<f64> = on.iter().zip(off).map(|(a, b)| a.cpu / b.cpu).collect();
    Summary {
        wall: trimmed_ratio(&paired),
        cpu: trimmed_ratio(&paired_cpu),
        paired,
        paired_cpu,
    }
}

/// The modelled node full of page cache: its agent (stopped between on sides, its cgroup
/// root kept) and the cgroup in its kubepods holding the cache.
struct CacheNode {
    // Dropped first: the file (its cache with it) and its cgroup, then the agent's root.
    _cache: CacheCgroup,
    agent: TestAgent,
    /// kubepods' memory limit, and its usage and file pages once filled.
    limit: u64,
    filled: MemStat,
}

impl CacheNode {
    /// Starts the agent once so it makes its kubepods with the node's limit, stops it, and
    /// fills kubepods with page cache; fails if kubepods has no limit the cache can fill or
    /// the cache is under [`CACHE_MIN_SHARE`] of its usage.
    fn new() -> Result<CacheNode> {
        let mut agent = TestAgent::start_sensing(
            "bench-realprogs-cache",
            crate::footprint::SENSE_ALL,
            crate::api_load::NODE,
        );
        let kubepods = agent.cgroup_dir("memory", "kubepods");
        // Stopped while the cache is written: it comes back for each on side.
        let stopped = agent.stop_within(rustix::process::Signal::TERM, Duration::from_secs(10));
        if stopped.is_none() {
            eprintln!("bench: realprogs: the page-cache node's agent needed SIGKILL to stop");
        }
        if !kubepods.exists() {
            bail!("the agent made no kubepods at {}", kubepods.display());
        }
        let limit = crate::page_cache::limit(&kubepods)?;
        if limit > 8 << 30 {
            bail!(
                "kubepods' memory limit is {limit} bytes: no limit the page cache can fill \
                 (the modelled node has 512 MiB)"
            );
        }
        let mut cache = CacheCgroup::new(&kubepods, "bench-cache-writer")?;
        cache.fill((limit / MI) * MI + CACHE_EXTRA)?;
        // kubepods' statistics hold the cache before its share is judged.
        let filled = crate::page_cache::settled(&kubepods, &cache.dir)?;
        if filled.inactive_share() < CACHE_MIN_SHARE {
            bail!(
                "the page-cache node's kubepods holds {} MiB of inactive file pages in {} MiB \
                 of usage ({:.1} %), under the {:.0} % it needs",
                filled.inactive_file / MI,
                filled.usage / MI,
                filled.inactive_share() * 100.0,
                CACHE_MIN_SHARE * 100.0
            );
        }
        Ok(CacheNode {
            _cache: cache,
            agent,
            limit,
            filled,
        })
    }
}

/// One node's table and JSON rows from its runs (`runs[program][side]`), and its samples.
fn node_table(
    title: &str,
    programs: &[Program],
    present: &[bool],
    runs: &[[Vec<Run>; 2]],
) -> (Table, Vec<Value>, usize) {
    const HEADER: [&str; 11] = [
        "program",
        "command",
        "off median",
        "on median",
        "paired on / off",
        "95 % interval",
        "paired median",
        "CPU on / off",
        "eBPF runs (on)",
        "agent's CPU (on)",
        "off min–max",
    ];
    let mut t = Table::new(title, &HEADER).text_columns(2);
    let mut rows = Vec::new();
    let mut samples = 0;
    for ((p, ok), sides) in programs.iter().zip(present).zip(runs) {
        let command = format!("{} {}", p.tool, p.args.first().map_or("", String::as_str));
        if !ok {
            let mut row = vec![
                p.name.to_string(),
                format!("{} NOT INSTALLED: not measured", p.tool),
            ];
            row.resize(HEADER.len(), "-".into());
            t.row(row);
            rows.push(json!({"program": p.name, "tool": p.tool, "installed": false}));
            continue;
        }
        let [off_runs, on_runs] = sides;
        let secs = |v: &[Run]| v.iter().map(|r| r.secs).collect::<Vec<f64>>();
        let cpu = |v: &[Run]| v.iter().map(|r| r.cpu).collect::<Vec<f64>>();
        let (off, on) = (secs(off_runs), secs(on_runs));
        // The agent's programs' runs and ns during the on runs, all rounds together.
        let (ebpf_runs, ebpf_ns) = on_runs
            .iter()
            .fold((0u64, 0u64), |(n, ns), r| (n + r.ebpf.0, ns + r.ebpf.1));
        // What the agent did during the on runs, against what the runs used: its process's
        // CPU time and its programs' time in the kernel, over the runs' CPU time.
        let agent_ns: u64 = on_runs.iter().map(|r| r.agent_ns).sum();
        let on_cpu_ns = on_runs.iter().map(|r| r.cpu).sum::<f64>() * 1e9;
        let agent_share = (agent_ns + ebpf_ns) as f64 / on_cpu_ns.max(1.0);
        samples += off.len().min(on.len());
        let s = summarise(off_runs, on_runs);
        let (off_lo, off_hi) = range(&off);
        let (value, interval) = Estimate::texts(s.wall);
        t.row(vec![
            p.name.to_string(),
            command,
            format!("{:.3} s", median(&off)),
            format!("{:.3} s", median(&on)),
            value,
            interval,
            format!("{:.3}", median(&s.paired)),
            Estimate::texts(s.cpu).0,
            format!("{ebpf_runs} ({:.1} µs)", ebpf_ns as f64 / 1e3),
            format!(
                "{:.1} ms, {:.3} %",
                agent_ns as f64 / 1e6,
                agent_share * 100.0
            ),
            format!("{off_lo:.3}–{off_hi:.3} s"),
        ]);
        let (q1, q3) = quartiles(&s.paired);
        let est = |e: Option<Estimate>| {
            e.map(|e| json!({"value": e.value, "low95": e.low, "high95": e.high}))
        };
        rows.push(json!({
            "program": p.name, "tool": p.tool, "executable": p.exe, "args": p.args,
            "installed": true,
            "off_seconds": off, "on_seconds": on,
            "off_median_s": median(&off), "on_median_s": median(&on),
            "off_min_s": off_lo, "off_max_s": off_hi,
            "paired_ratios": s.paired, "paired_ratio": est(s.wall),
            "paired_ratio_median": median(&s.paired),
            "paired_ratio_q1": q1, "paired_ratio_q3": q3,
            "off_cpu_seconds": cpu(off_runs), "on_cpu_seconds": cpu(on_runs),
            "paired_cpu_ratios": s.paired_cpu, "paired_cpu_ratio": est(s.cpu),
            "on_ebpf_runs": ebpf_runs, "on_ebpf_run_ns": ebpf_ns,
            "on_agent_cpu_ns": agent_ns, "on_agent_share_of_run_cpu": agent_share,
            "off_ebpf_runs": off_runs.iter().map(|r| r.ebpf.0).sum::<u64>(),
        }));
    }
    (t, rows, samples)
}

/// Run part 7b.
pub fn run(opts: &Opts) -> Result<Part> {
    let rounds = if opts.quick { 1 } else { ROUNDS };
    let dir = tempfile::tempdir_in("/var/tmp").context("temp dir on disk")?;
    let input = text_file(dir.path())?;
    let unit = c_file(dir.path())?;
    let text = |p: &Path| p.display().to_string();
    let programs = [
        Program {
            name: "compressor",
            tool: "xz",
            exe: executable("xz").unwrap_or_default(),
            args: vec![
                "-6".into(),
                "-T1".into(),
                "-c".into(),
                "-k".into(),
                text(&input),
            ],
        },
        Program {
            name: "C compile",
            tool: "gcc",
            exe: executable("gcc").unwrap_or_default(),
            args: vec![
                "-O2".into(),
                "-c".into(),
                text(&unit),
                "-o".into(),
                "/dev/null".into(),
            ],
        },
        Program {
            name: "interpreter",
            tool: "python3",
            exe: executable("python3").unwrap_or_default(),
            args: vec!["-c".into(), PYTHON.into()],
        },
    ];
    let present: Vec<bool> = programs
        .iter()
        .map(|p| !p.exe.as_os_str().is_empty())
        .collect();
    // Read the input once so every run finds it in the page cache.
    std::fs::read(&input).context("reading the compressor's input")?;
    let root = TestMemcg::new("bench-realprogs", 4 << 30).context("the part's test memcg")?;
    let mut cache_node = CacheNode::new()?;
    // runs[node][program][side], one per round.
    let mut runs: [Vec<[Vec<Run>; 2]>; 2] =
        [0, 1].map(|_| programs.iter().map(|_| Default::default()).collect());
    // Counted on both sides alike; counting costs only where a program runs.
    let _stats_on = reactor::sense::ebpf::stats::enable_stats().map_err(anyhow::Error::msg)?;
    for round in 0..rounds {
        // The calm node's pair first in even rounds, the page-cache node's in odd ones.
        for n in 0..NODES.len() {
            let node = (round + n) % NODES.len();
            // Off first in even rounds, on first in odd ones: neither side always follows
            // the agent's start or its stop.
            for k in 0..2 {
                let side = (round + k) % 2;
                let calm_agent = (side == ON && node != CACHE_NODE).then(|| {
                    TestAgent::start_sensing(
                        &format!("bench-realprogs-agent-{round}"),
                        crate::footprint::SENSE_ALL,
                        crate::api_load::NODE,
                    )
                });
                let pid = match (side, node) {
                    (ON, CACHE_NODE) => {
                        cache_node.agent.restart();
                        cache_node.agent.pid()
                    }
                    _ => calm_agent.as_ref().map_or(0, TestAgent::pid),
                };
                // Both sides wait alike: the agent attaches its programs and takes its first
                // pass, and the machine settles after the agent's start or stop.
                std::thread::sleep(SETTLE);
                for (i, p) in programs.iter().enumerate() {
                    if !present[i] {
                        continue;
                    }
                    let tag = format!("r{round}-{node}-{}-{i}", SIDES[side]);
                    runs[node][i][side].push(run_one(&root, p, &tag, pid)?);
                }
                drop(calm_agent);
                if side == ON && node == CACHE_NODE {
                    cache_node
                        .agent
                        .stop_within(rustix::process::Signal::TERM, Duration::from_secs(10));
                }
            }
        }
    }
    let (cache_limit, cache_filled) = (cache_node.limit, cache_node.filled);
    drop(cache_node);
    drop(root);
    drop(dir);

    let (mut t, rows, mut samples) = node_table(
        "7b. Real programs with the agent on (calm node) against no agent",
        &programs,
        &present,
        &runs[0],
    );
    let (mut c, cache_rows, cache_samples) = node_table(
        "7b. Real programs with the agent on a node full of page cache against no agent",
        &programs,
        &present,
        &runs[CACHE_NODE],
    );
    samples += cache_samples;
    c.note(format!(
        "the same rounds, this node's pair beside the calm node's (calm first in even rounds): \
         the same config in a cgroup root kept for the part, its kubepods (limit {} MiB) filled \
         before the rounds by a {} MiB file written from a cgroup of the bench's own in it \
         (dd, conv=fsync, /var/tmp), its cache dropped and read back once: {} MiB of usage, {} MiB of it inactive file ({:.1} %); its \
         agent started again in that root for each on side and stopped (SIGTERM) after, its \
         off side with the cache in place and no agent; the programs run outside both nodes, \
         as for the calm node; columns as in the table above",
        cache_limit / MI,
        (cache_limit / MI) + CACHE_EXTRA / MI,
        cache_filled.usage / MI,
        cache_filled.inactive_file / MI,
        cache_filled.inactive_share() * 100.0
    ));
    t.note(format!(
        "{rounds} rounds of two sides, off first in even rounds and on first in odd ones, one \
         run of each program per side; wall time from spawn to exit, each run in its own \
         1 GiB-limited memory cgroup of the part's test cgroup"
    ));
    t.note(format!(
        "on: the release `reactor run`, every source on (eBPF, PSI, memcg notification, tick), \
         realtimePriority 10, a modelled 512 MiB node with no pods, so its watched cgroups are \
         far from their levels (calm), started afresh for each on side; off: no agent running; \
         each side waits {} s before its runs; compressor: xz -6 -T1 of {XZ_INPUT_MI} MiB of \
         generated text; C compile: gcc -O2 -c of {} lines; interpreter: python3 (run by its \
         own path, sys.executable), a 2 M-entry dict plus 100 k page-sized bytearrays",
        SETTLE.as_secs_f64(),
        C_FUNCTIONS * 9
    ));
    t.note(format!(
        "paired on / off: each round's on run over its off run, the two a few seconds apart, \
         summarised by their {:.0} %-trimmed mean (on the logarithms) with its 95 % interval \
         (Tukey-McLaughlin); paired median: the same ratios' median; CPU: the same for user + \
         system time (getrusage of the waited-for run, its children included), where the \
         agent's kernel programs, run in the program's own context, show and waits for the \
         CPU do not; eBPF runs: how often any of the agent's programs ran during the on runs, \
         all rounds together, and their time (kernel statistics, on for both sides); agent's \
         CPU: the agent process's own CPU time during the on runs (every thread, \
         /proc/<pid>/task/*/schedstat), all rounds together, and it with the eBPF time as a \
         share of the on runs' CPU time: the most the agent can have taken from them \
         directly (cache and memory-bandwidth sharing are not in it)",
        TRIM * 100.0
    ));
    t.note("target (issue 26, reported, never judged): each program's paired on / off within 1.02");
    Ok(Part {
        key: "realprogs",
        tables: vec![t, c],
        json: json!({
            "rounds": rounds, "settle_s": SETTLE.as_secs_f64(), "trim": TRIM, "programs": rows,
            "page_cache_full": {
                "kubepods_limit_bytes": cache_limit,
                "written_bytes": (cache_limit / MI) * MI + CACHE_EXTRA,
                "kubepods_after_filling": cache_filled.json(),
                "programs": cache_rows,
            },
        }),
        samples,
    })
}
