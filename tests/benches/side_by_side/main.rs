//! `cargo xtask bench`: the agent measured side by side with the kubelet's mechanisms on the
//! same pressure, on the real kernel (root), in one run on one machine.
//!
//! 1. `lag` — detection lag by source on one storm (eBPF ring buffer, memcg threshold
//!    eventfd, PSI trigger, polling at 1 s and at 10 s, the kubelet's housekeeping).
//!    `console` — the eBPF tail with the console log level as found and lowered to 1
//!    (`dmesg -n 1`, restored afterwards), and what one error-level kernel line costs.
//! 2. `oom` — OOM avoidance: a BestEffort hog beside a Guaranteed and a Burstable pod on a
//!    modelled 512 MiB node, the reactor loop with every source and with each one alone,
//!    and a reference with no agent: the bench's own SIGKILL at the crossing → exit; and a
//!    cache-full variant (kubepods filled with page cache up to its limit before each hog,
//!    which grows by reclaiming it) for the full agent and eBPF only (`--oom-variants`).
//! 3. `cost` — ranking, preemption and image-GC planning at 100 … 100,000 pods/images.
//! 4. `ring` — the eBPF ring buffer: the highest event rate with no drops, and drop
//!    accounting when it overflows.
//! 5. `footprint` — the release `reactor run`: RSS and CPU idle and during a storm.
//! 6. `api-load` — the same eviction with the API idle and under 50 gRPC clients' load:
//!    the eviction records' reaction time, p50/p99 and the ratio.
//! 7. `charge` — what the in-kernel usage thresholds cost a page-faulting process, on a
//!    calm node, near a level, and beside a watched cgroup full of page cache.
//!    `realprogs` (7b) — real programs (`xz`, `gcc`, `python3`) with the release agent on a
//!    calm node and on a node whose kubepods is full of page cache, each against no agent,
//!    in rounds of the sides (120, 1 with `--quick`).
//! 8. `concurrent` — concurrent pressure: soft then hard, two hogs 100 ms apart, a frozen
//!    victim plus a hog, 200 MiB of a pod's page cache activated while a hog grows, for the
//!    agent's loop and a kubelet-like one that waits for each eviction
//!    (`--concurrent-reps`, 10 by default, 1 with `--quick`).
//! 9. `soak` — the release agent for `--soak-minutes` (10 by default) under 50 API clients
//!    with a hog every 30 s: its RSS over time and each eviction's reaction. **Not in the
//!    default run** (it takes about 10 minutes): only with `--only soak`.
//!
//! With `--markdown`, the parts with a picture (`charts`: lag CDF, crossing → released, cost,
//! ring buffer) are also drawn as SVG next to the markdown, which embeds them.
//!
//! ```text
//! cargo xtask bench [--quick]
//! cargo bench -p reactor-tests --bench side_by_side -- [--quick] [--json PATH]
//!     [--markdown PATH]
//!     [--only lag,console,oom,cost,ring,footprint,api-load,charge,realprogs,concurrent,soak]
//!     [--oom-rates 350,150] [--oom-reps 20] [--oom-modes full,ebpf,memcg,psi,poll1,poll10]
//!     [--oom-variants plain,cache-full]
//!     [--no-mrelease] [--memory-reclaim]
//!     [--close-watch-always]
//!     [--concurrent-reps 10]
//!     [--soak-minutes 10]
//! ```
//!
//! Prints one table per part and writes every figure as JSON (and the tables as markdown
//! with a line describing the machine). The figures are reported, never judged: the run
//! fails only when the harness breaks (a part errors out or measures nothing). Every memory
//! storm runs inside a memory cgroup with a limit created for the run and removed after it.

mod api_load;
mod charge;
mod charts;
mod concurrent;
mod console;
mod cost;
mod footprint;
mod lag;
mod oom;
mod opts;
mod page_cache;
mod read_floor;
mod realprogs;
mod report;
mod ring;
mod soak;

use std::time::Instant;

use anyhow::{bail, Context, Result};
use opts::Opts;
use report::Part;
use serde_json::{json, Value};

const PARTS: [&str; 11] = [
    "lag",
    "console",
    "oom",
    "cost",
    "ring",
    "footprint",
    "api-load",
    "charge",
    "realprogs",
    "concurrent",
    "soak",
];

/// The parts a run without `--only` leaves out: the soak takes about 10 minutes.
const ONLY_ASKED: [&str; 1] = ["soak"];

const USAGE: &str = "usage: side_by_side [--quick] [--json PATH] [--markdown PATH]
    [--only lag,console,oom,cost,ring,footprint,api-load,charge,realprogs,concurrent,soak]
    [--oom-rates 350,150] [--oom-reps 20] [--oom-modes full,ebpf,memcg,psi,poll1,poll10]
    [--oom-variants plain,cache-full]
    [--no-mrelease] [--memory-reclaim]
    [--close-watch-always]
    [--concurrent-reps 10]
    [--soak-minutes 10]
Every part but soak runs by default; soak (about 10 minutes) only with --only soak.";

fn parse_args() -> Result<Opts> {
    let mut opts = Opts {
        quick: false,
        json: None,
        markdown: None,
        only: None,
        oom_rates: None,
        oom_reps: None,
        oom_modes: None,
        oom_variants: None,
        no_mrelease: false,
        memory_reclaim: false,
        close_watch_always: false,
        concurrent_reps: None,
        soak_minutes: None,
    };
    let mut args = std::env::args().skip(1);
    let list = |v: Option<String>, what: &str| -> Result<String> {
        v.with_context(|| format!("{what} needs a value"))
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            // What `cargo bench` passes to every bench target.
            "--bench" => {}
            "--quick" => opts.quick = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--no-mrelease" => opts.no_mrelease = true,
            "--memory-reclaim" => opts.memory_reclaim = true,
            "--close-watch-always" => opts.close_watch_always = true,
            "--json" => opts.json = Some(list(args.next(), "--json")?.into()),
            "--markdown" => opts.markdown = Some(list(args.next(), "--markdown")?.into()),
            "--only" => {
                let v = list(args.next(), "--only")?;
                let parts: Vec<String> = v.split(',').map(str::to_string).collect();
                if let Some(bad) = parts.iter().find(|p| !PARTS.contains(&p.as_str())) {
                    bail!("--only: unknown part {bad:?} (parts: {})", PARTS.join(","));
                }
                opts.only = Some(parts);
            }
            "--oom-rates" => {
                let v = list(args.next(), "--oom-rates")?;
                let rates = v
                    .split(',')
                    .map(|r| match r.parse::<u64>() {
                        Ok(n) if n > 0 => Ok(n),
                        _ => bail!("--oom-rates: {r:?} is not a positive whole number of MiB/s"),
                    })
                    .collect::<Result<Vec<u64>>>()?;
                opts.oom_rates = Some(rates);
            }
            "--oom-reps" => {
                let v = list(args.next(), "--oom-reps")?;
                match v.parse::<usize>() {
                    Ok(n) if n > 0 => opts.oom_reps = Some(n),
                    _ => bail!("--oom-reps: {v:?} is not a positive whole number"),
                }
            }
            "--oom-modes" => {
                let v = list(args.next(), "--oom-modes")?;
                let modes: Vec<String> = v.split(',').map(str::to_string).collect();
                if let Some(bad) = modes.iter().find(|m| !oom::MODE_KEYS.contains(&m.as_str())) {
                    bail!(
                        "--oom-modes: unknown mode {bad:?} (modes: {})",
                        oom::MODE_KEYS.join(",")
                    );
                }
                opts.oom_modes = Some(modes);
            }
            "--oom-variants" => {
                let v = list(args.next(), "--oom-variants")?;
                let variants: Vec<String> = v.split(',').map(str::to_string).collect();
                if let Some(bad) = variants
                    .iter()
                    .find(|m| !oom::VARIANT_KEYS.contains(&m.as_str()))
                {
                    bail!(
                        "--oom-variants: unknown variant {bad:?} (variants: {})",
                        oom::VARIANT_KEYS.join(",")
                    );
                }
                opts.oom_variants = Some(variants);
            }
            "--concurrent-reps" => {
                let v = list(args.next(), "--concurrent-reps")?;
                match v.parse::<usize>() {
                    Ok(n) if n > 0 => opts.concurrent_reps = Some(n),
                    _ => bail!("--concurrent-reps: {v:?} is not a positive whole number"),
                }
            }
            "--soak-minutes" => {
                let v = list(args.next(), "--soak-minutes")?;
                match v.parse::<f64>() {
                    Ok(m) if m.is_finite() && (0.5..=1440.0).contains(&m) => {
                        opts.soak_minutes = Some(m)
                    }
                    _ => bail!("--soak-minutes: {v:?} is not a number of minutes from 0.5 to 1440"),
                }
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    Ok(opts)
}

/// The machine, as one line for the report: the figures mean little without it.
fn machine() -> (String, Value) {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or_else(|| "?".to_string(), |m| m.trim().to_string());
    let mem_kib: u64 = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
    let load = read("/proc/loadavg");
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let line = format!(
        "{cores} cores ({model}), {:.1} GiB memory, Linux {kernel}, load average at start {}",
        mem_kib as f64 / (1 << 20) as f64,
        load.join(" ")
    );
    let value = json!({
        "cores": cores, "cpu_model": model, "memory_bytes": mem_kib * 1024,
        "kernel": kernel, "loadavg_at_start": load,
    });
    (line, value)
}

/// The machine's CPU time so far, summed over its CPUs, from the first line of `/proc/stat`:
/// (stolen by the hypervisor, all ticks), in clock ticks (`USER_HZ`).
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest and guest_nice are in user).
    let steal = *v.get(7)?;
    Some((steal, v.iter().take(8).sum()))
}

/// What the hypervisor took from the machine during a part: its steal time as a share of
/// the CPU time that passed (both CPUs), for the report's note and JSON.
fn steal_share(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> Option<(f64, f64)> {
    let ((s0, t0), (s1, t1)) = (before?, after?);
    let total = t1.checked_sub(t0).filter(|t| *t > 0)?;
    let steal = s1.saturating_sub(s0);
    // SAFETY: sysconf only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some((steal as f64 / hz, steal as f64 / total as f64))
}

fn preflight() -> Result<()> {
    if !reactor_tests::is_root() {
        bail!("the benchmark needs root (cgroups, eBPF, PSI triggers)");
    }
    if !std::path::Path::new(reactor_tests::MEMCG_V1_ROOT)
        .join("cgroup.event_control")
        .exists()
    {
        bail!("the cgroup v1 memory controller is not mounted at /sys/fs/cgroup/memory");
    }
    for bin in [reactor_tests::memhog_bin(), reactor_tests::reactor_bin()] {
        if !bin.exists() {
            bail!(
                "{} missing: cargo build --release -p reactor -p reactor-tests --bins",
                bin.display()
            );
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    // The ring-buffer part re-runs this binary as its page-faulting child.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(ring::CHILD_FLAG) {
        return ring::child(&args[2..]);
    }
    if args.get(1).map(String::as_str) == Some(charge::CHILD_FLAG) {
        return charge::child(&args[2..]);
    }
    let opts = parse_args()?;
    preflight()?;
    if opts.no_mrelease {
        reactor::act::kill::set_reaping(false);
        println!("reactor bench: process_mrelease off (--no-mrelease)");
    }
    let (machine_line, machine_json) = machine();
    let command = if opts.quick {
        "cargo xtask bench --quick"
    } else {
        "cargo xtask bench"
    };
    println!("reactor bench: {machine_line}");
    let started = Instant::now();
    let wanted = |p: &str| match &opts.only {
        Some(o) => o.iter().any(|x| x == p),
        None => !ONLY_ASKED.contains(&p),
    };
    let mut parts: Vec<Part> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let mut timings = serde_json::Map::new();
    let mut stolen = serde_json::Map::new();
    for key in PARTS.into_iter().filter(|p| wanted(p)) {
        let t = Instant::now();
        let ticks = cpu_ticks();
        eprintln!("bench: part {key} ...");
        let result = match key {
            "lag" => lag::run(&opts),
            "console" => console::run(&opts),
            "oom" => oom::run(&opts),
            "cost" => cost::run(&opts),
            "ring" => ring::run(&opts),
            "api-load" => api_load::run(&opts),
            "charge" => charge::run(&opts),
            "realprogs" => realprogs::run(&opts),
            "concurrent" => concurrent::run(&opts),
            "soak" => soak::run(&opts),
            _ => footprint::run(&opts),
        };
        let secs = t.elapsed().as_secs_f64();
        timings.insert(key.to_string(), json!(secs));
        let steal = steal_share(ticks, cpu_ticks());
        if let Some((s, share)) = steal {
            stolen.insert(key.to_string(), json!({"seconds": s, "share": share}));
        }
        match result {
            Ok(mut part) => {
                // A slow figure is first a question about the machine: say what the
                // hypervisor took while it was measured.
                if let (Some((s, share)), Some(t)) = (steal, part.tables.last_mut()) {
                    t.note(format!(
                        "machine during this part: {s:.1} s of CPU time stolen by the \
                         hypervisor ({:.2} % of both CPUs' time, /proc/stat steal)",
                        share * 100.0
                    ));
                }
                for table in &part.tables {
                    println!("\n{}", table.text());
                }
                println!("  ({key}: {secs:.1} s)");
                if part.samples == 0 {
                    failures.push(format!("{key}: no samples"));
                }
                parts.push(part);
            }
            Err(e) => {
                eprintln!("bench: part {key} failed: {e:#}");
                failures.push(format!("{key}: {e:#}"));
            }
        }
    }
    let total = started.elapsed().as_secs_f64();
    println!("\nreactor bench: {} parts in {total:.1} s", parts.len());

    // The charts go next to the markdown that embeds them; one that cannot be drawn is a
    // broken harness.
    let mut charts: Vec<(&str, String, String)> = Vec::new();
    if let Some(md) = &opts.markdown {
        let dir = md
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        for p in &parts {
            match charts::draw(p.key, &p.json, dir) {
                Ok(Some((file, title))) => {
                    println!("chart: {}", dir.join(&file).display());
                    charts.push((p.key, file, title));
                }
                Ok(None) => {}
                Err(e) => failures.push(format!("{} chart: {e:#}", p.key)),
            }
        }
    }

    let mut doc = serde_json::Map::new();
    doc.insert("command".into(), json!(command));
    doc.insert("quick".into(), json!(opts.quick));
    doc.insert("machine".into(), machine_json);
    doc.insert("seconds".into(), json!({"total": total, "parts": timings}));
    doc.insert("steal".into(), Value::Object(stolen));
    doc.insert("failures".into(), json!(failures));
    for p in &parts {
        doc.insert(p.key.to_string(), p.json.clone());
    }
    if let Some(path) = &opts.json {
        write(path, &serde_json::to_string_pretty(&Value::Object(doc))?)?;
        println!("figures: {}", path.display());
    }
    if let Some(path) = &opts.markdown {
        let mut md =
            format!("Measured with `{command}` on {machine_line} (run took {total:.0} s).\n\n");
        for p in &parts {
            for t in &p.tables {
                md.push_str(&t.markdown());
                md.push('\n');
            }
            for (_, file, title) in charts.iter().filter(|c| c.0 == p.key) {
                md.push_str(&format!("![{title}]({file})\n\n"));
            }
        }
        write(path, &md)?;
        println!("tables: {}", path.display());
    }
    if !failures.is_empty() {
        bail!("the harness broke: {}", failures.join("; "));
    }
    Ok(())
}

fn write(path: &std::path::Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
