//! Part 7b: what the agent costs real programs on a calm node. Three programs, each run to
//! its end with the release `reactor run` on (every source, started as the footprint part
//! starts it, on the API-load part's modelled 512 MiB node with no pods, so its watched
//! cgroups are far from their levels), with no agent running, and with the agent running
//! every source but eBPF, in rounds where each side takes each place in turn so the
//! machine's drift hits them alike. The third side tells the kernel programs' cost from an
//! agent process's: on this VM one program's runs differ by 20 % and more, in CPU time as
//! well as wall time, with the agent running or not, in either direction.
//!
//! - a compressor: `xz -6 -T1` of generated text, compressible but not trivially (words
//!   from a 512-word vocabulary and numbers, picked by a fixed pseudo-random sequence);
//! - a C compile: `gcc -O2 -c` of a generated file of 2,700 lines (300 small functions);
//! - an interpreter's allocation-heavy run: `python3` building a 2 M-entry dict and 100 k
//!   page-sized bytearrays (each filled, so every page is faulted in).
//!
//! Each run is its own memory cgroup (1 GiB limit) under the part's unique test cgroup,
//! removed after it; the figure is wall time from just before the spawn to the exit. A tool
//! that is not installed is said so in the table, never measured by something else.
//!
//! The compressor's input is 4 MiB, not 64: on the 2-core machine this was written on
//! `xz -6` ran at 0.7 MB/s (95 s of CPU for 64 MiB), too long for a part meant to take
//! minutes; 4 MiB takes about 2 s, like the other two.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use reactor_tests::agent::TestAgent;
use reactor_tests::TestMemcg;
use serde_json::json;

use crate::report::{Part, Table};
use crate::Opts;

const MI: u64 = 1 << 20;
/// Each run's memory limit: well above what any of the three needs (python3's run peaks near
/// 600 MiB), so the limit is there for safety, not as pressure.
const RUN_LIMIT: u64 = 1 << 30;
/// The compressor's input, MiB.
const XZ_INPUT_MI: u64 = 4;
/// The C file's functions (9 lines each).
const C_FUNCTIONS: usize = 300;
/// The sides of a round, by index: no agent, the agent with every source, the agent without
/// eBPF.
const SIDES: [&str; 3] = ["off", "on", "no-ebpf"];
const OFF: usize = 0;
const ON: usize = 1;
const NO_EBPF: usize = 2;
/// The agent's sources but eBPF: what an agent process costs a program (and how the machine
/// runs with one) without the kernel programs, the part of the cost issue 26 is about.
const SENSE_NO_EBPF: &str =
    "sense:\n  ebpf: false\n  psi: true\n  memcgThreshold: true\n  poll: true\n";
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
    let ebpf0 = reactor::sense::ebpf::loaded_program_totals();
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
    let ebpf1 = reactor::sense::ebpf::loaded_program_totals();
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

/// The first and third quartiles of `v` (linear between the nearest ranks); (0, 0) when
/// empty.
fn quartiles(v: &[f64]) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let at = |q: f64| {
        if s.is_empty() {
            return 0.0;
        }
        let pos = q * (s.len() - 1) as f64;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        s[lo] + (s[hi] - s[lo]) * (pos - lo as f64)
    };
    (at(0.25), at(0.75))
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Run part 7b.
pub fn run(opts: &Opts) -> Result<Part> {
    let rounds = if opts.quick { 2 } else { 8 };
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
    // runs[program][side], one per round.
    let mut runs: Vec<[Vec<Run>; 3]> = programs.iter().map(|_| Default::default()).collect();
    // Counted on every side alike; counting costs only where a program runs.
    let _stats_on = reactor::sense::ebpf::enable_stats().map_err(anyhow::Error::msg)?;
    for round in 0..rounds {
        // Each side takes each place in the round in turn.
        for k in 0..3 {
            let side = (round + k) % 3;
            let agent = (side != OFF).then(|| {
                TestAgent::start_sensing(
                    &format!("bench-realprogs-agent-{round}-{side}"),
                    if side == NO_EBPF {
                        SENSE_NO_EBPF
                    } else {
                        crate::footprint::SENSE_ALL
                    },
                    crate::api_load::NODE,
                )
            });
            // Both sides wait alike: the agent attaches its programs and takes its first
            // pass, and the machine settles after the agent's start or stop.
            std::thread::sleep(Duration::from_secs(2));
            for (i, p) in programs.iter().enumerate() {
                if !present[i] {
                    continue;
                }
                let tag = format!("r{round}-{}-{i}", SIDES[side]);
                let pid = agent.as_ref().map_or(0, TestAgent::pid);
                runs[i][side].push(run_one(&root, p, &tag, pid)?);
            }
            drop(agent);
        }
    }
    drop(root);
    drop(dir);

    const HEADER: [&str; 13] = [
        "program",
        "command",
        "off median",
        "on median",
        "on / off",
        "paired on / off",
        "CPU on / off",
        "no-eBPF median",
        "on / no-eBPF paired",
        "eBPF runs (on)",
        "agent's CPU (on)",
        "off min–max",
        "on min–max",
    ];
    let mut t = Table::new(
        "7b. Real programs with the agent on (calm node) against no agent",
        &HEADER,
    )
    .text_columns(2);
    let mut rows = Vec::new();
    let mut samples = 0;
    // Each program's paired on / off, middle half: what the rounds can resolve.
    let mut middles = Vec::new();
    for ((p, ok), sides) in programs.iter().zip(&present).zip(&runs) {
        let secs = |side: usize| sides[side].iter().map(|r| r.secs).collect::<Vec<f64>>();
        let cpu = |side: usize| sides[side].iter().map(|r| r.cpu).collect::<Vec<f64>>();
        // The agent's programs' runs and ns during one side's runs, all rounds together.
        let ran = |side: usize| {
            sides[side]
                .iter()
                .fold((0u64, 0u64), |(n, ns), r| (n + r.ebpf.0, ns + r.ebpf.1))
        };
        let (off, on, no_ebpf) = (secs(OFF), secs(ON), secs(NO_EBPF));
        let (cpu_off, cpu_on, cpu_no_ebpf) = (cpu(OFF), cpu(ON), cpu(NO_EBPF));
        let (ebpf_runs, ebpf_ns) = ran(ON);
        // What the agent did during the on runs, against what the runs used: its process's
        // CPU time and its programs' time in the kernel, over the runs' CPU time.
        let agent_ns: u64 = sides[ON].iter().map(|r| r.agent_ns).sum();
        let on_cpu_ns = sides[ON].iter().map(|r| r.cpu).sum::<f64>() * 1e9;
        let agent_share = (agent_ns + ebpf_ns) as f64 / on_cpu_ns.max(1.0);
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
        samples += off.len().min(on.len());
        let (m_off, m_on) = (median(&off), median(&on));
        let spread = |v: &[f64]| {
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(0.0, f64::max);
            (lo, hi)
        };
        let (off_lo, off_hi) = spread(off.as_slice());
        let (on_lo, on_hi) = spread(on.as_slice());
        // Each round's on / off, taken in the same round: drift slower than a round cancels.
        let paired: Vec<f64> = on.iter().zip(&off).map(|(a, b)| a / b).collect();
        let m_paired = median(&paired);
        let (q1, q3) = quartiles(&paired);
        middles.push(format!("{} {q1:.3}–{q3:.3}", p.name));
        let m_cpu = median(&cpu_on) / median(&cpu_off);
        let eb_paired: Vec<f64> = on.iter().zip(&no_ebpf).map(|(a, b)| a / b).collect();
        let m_eb_paired = median(&eb_paired);
        t.row(vec![
            p.name.to_string(),
            command,
            format!("{m_off:.3} s"),
            format!("{m_on:.3} s"),
            format!("{:.3}", m_on / m_off),
            format!("{m_paired:.3}"),
            format!("{m_cpu:.3}"),
            format!("{:.3} s", median(&no_ebpf)),
            format!("{m_eb_paired:.3}"),
            format!("{ebpf_runs} ({:.1} µs)", ebpf_ns as f64 / 1e3),
            format!(
                "{:.1} ms, {:.3} %",
                agent_ns as f64 / 1e6,
                agent_share * 100.0
            ),
            format!("{off_lo:.3}–{off_hi:.3} s"),
            format!("{on_lo:.3}–{on_hi:.3} s"),
        ]);
        rows.push(json!({
            "program": p.name, "tool": p.tool, "executable": p.exe, "args": p.args,
            "installed": true,
            "off_seconds": off, "on_seconds": on,
            "off_median_s": m_off, "on_median_s": m_on, "ratio_on_off": m_on / m_off,
            "off_min_s": off_lo, "off_max_s": off_hi, "on_min_s": on_lo, "on_max_s": on_hi,
            "paired_ratios": paired, "paired_ratio_median": m_paired,
            "paired_ratio_q1": q1, "paired_ratio_q3": q3,
            "off_cpu_seconds": cpu_off, "on_cpu_seconds": cpu_on, "cpu_ratio_on_off": m_cpu,
            "no_ebpf_seconds": no_ebpf, "no_ebpf_cpu_seconds": cpu_no_ebpf,
            "no_ebpf_median_s": median(&no_ebpf),
            "paired_ratios_on_no_ebpf": eb_paired, "paired_ratio_on_no_ebpf_median": m_eb_paired,
            "on_ebpf_runs": ebpf_runs, "on_ebpf_run_ns": ebpf_ns,
            "on_agent_cpu_ns": agent_ns, "on_agent_share_of_run_cpu": agent_share,
            "off_ebpf_runs": ran(OFF).0, "no_ebpf_side_ebpf_runs": ran(NO_EBPF).0,
        }));
    }
    t.note(format!(
        "{rounds} rounds, each side taking each place in a round in turn, one run of each \
         program per round and side; wall time from spawn to exit, each run in its \
         own 1 GiB-limited memory cgroup of the part's test cgroup"
    ));
    t.note(format!(
        "on: the release `reactor run`, every source on (eBPF, PSI, memcg notification, tick), \
         realtimePriority 10, a modelled 512 MiB node with no pods, so its watched cgroups are \
         far from their levels (calm); off: no agent running; no-eBPF: the same agent with \
         sense.ebpf false; every side waits 2 s before its runs; compressor: xz -6 -T1 of {XZ_INPUT_MI} MiB of generated text; C compile: \
         gcc -O2 -c of {} lines; interpreter: python3 (run by its own path, sys.executable), a \
         2 M-entry dict plus 100 k page-sized bytearrays",
        C_FUNCTIONS * 9
    ));
    t.note(
        "on / off: the medians' ratio; paired: the median of each round's on / off (the two \
         runs of the same round); CPU: the medians of user + system time (getrusage \
         of the waited-for run, its children included), where the agent's kernel programs, \
         run in the program's own context, show and other load on the machine does not; \
         on / no-eBPF: the median of each round's on / no-eBPF, the kernel programs' own share; \
         eBPF runs: how often any of the agent's programs ran during the on runs, all rounds \
         together, and their time (kernel statistics, on for every side); agent's CPU: the \
         agent process's own CPU time during the on runs (every thread, \
         /proc/<pid>/task/*/schedstat), all rounds together, and it with the eBPF time as a \
         share of the on runs' CPU time: the most the agent can have taken from them \
         directly (cache and memory-bandwidth sharing are not in it)",
    );
    if !middles.is_empty() {
        t.note(format!(
            "paired on / off, middle half of the rounds (first to third quartile): {}; a \
             difference inside that spread is not one these rounds resolve",
            middles.join(", ")
        ));
    }
    t.note("target (issue 26, reported, never judged): each program's on / off within 1.02");
    Ok(Part {
        key: "realprogs",
        tables: vec![t],
        json: json!({"rounds": rounds, "programs": rows}),
        samples,
    })
}
