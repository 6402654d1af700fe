//! Part 1b: the eBPF tail and the console log level.
//!
//! The kernel prints every OOM kill ("Memory cgroup out of memory: Killed process …") at
//! error level, and a legacy console prints synchronously, in the context of the task that
//! logs: on a serial console a line costs milliseconds, with the port's lock held and
//! interrupts off on that CPU. A ring-buffer record committed just before the line (the OOM
//! record itself: `oom:mark_victim` fires just before the line is printed) cannot wake its
//! reader until the line is out, since the ring buffer's wake-up is an irq_work on the same
//! CPU. Whether that is the eBPF tail is measured here: the same storm (the `lag` part's,
//! with a fixed number of hog rounds per episode and no pollers) with the console log level
//! as found and with it lowered to 1 (`dmesg -n 1`: emergencies only), and at each level the
//! cost of one 149-byte error-level and info-level line written to `/dev/kmsg`.
//!
//! The level is restored from what `/proc/sys/kernel/printk` said before, by a guard, also
//! when the part fails or panics (not if the bench is killed by a signal).

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use reactor::sense::{Sense, Source};
use reactor_tests::TestMemcg;
use serde_json::json;

use crate::lag::{self, Until};
use crate::opts::Opts;
use crate::report::{Dist, Part, Table};

const PRINTK: &str = "/proc/sys/kernel/printk";

/// Puts the console log level back as found when dropped.
struct ConsoleLevel {
    found: u32,
}

impl ConsoleLevel {
    fn save() -> Result<ConsoleLevel> {
        let found = lag::console_level().with_context(|| format!("reading {PRINTK}"))?;
        Ok(ConsoleLevel { found })
    }

    /// Sets the console log level (the first field; the others stay).
    fn set(&self, level: u32) -> Result<()> {
        std::fs::write(PRINTK, level.to_string()).with_context(|| format!("writing {PRINTK}"))
    }
}

impl Drop for ConsoleLevel {
    fn drop(&mut self) {
        if let Err(e) = self.set(self.found) {
            eprintln!(
                "bench: could not restore the console log level {}: {e:#}",
                self.found
            );
        }
    }
}

/// Median time to write one 149-byte line at `level` to `/dev/kmsg`, over `n` lines (kept
/// under the kernel's per-open burst of 10 lines so none is rate-limited away).
fn kmsg_line(level: u8, n: usize) -> Result<u64> {
    let mut kmsg = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")
        .context("opening /dev/kmsg")?;
    let mut times = Vec::new();
    for i in 0..n {
        let head = format!("<{level}>reactor bench: console cost probe, level {level}, line {i} ");
        let line = format!("{head:.<148}\n");
        let t = Instant::now();
        kmsg.write_all(line.as_bytes())
            .context("writing /dev/kmsg")?;
        times.push(t.elapsed().as_nanos() as u64);
        std::thread::sleep(Duration::from_millis(20));
    }
    times.sort_unstable();
    Ok(times[times.len() / 2])
}

/// What one storm at one console level came to.
struct Run {
    level: u32,
    err_line_ns: u64,
    info_line_ns: u64,
    ooms: usize,
    kernel_to_taken: Dist,
    kernel_to_wake: Dist,
    wake_to_taken: Dist,
    memcg_wake_to_taken: Dist,
}

fn storm_at(rt: &tokio::runtime::Runtime, opts: &Opts, level: u32) -> Result<Run> {
    let err_line_ns = kmsg_line(3, 4)?;
    let info_line_ns = kmsg_line(6, 4)?;
    let mut cg = TestMemcg::new("bench-console", lag::LIMIT).context("creating the test memcg")?;
    let dir = tempfile::tempdir_in("/var/tmp").context("temp dir on disk")?;
    let file = lag::working_set_file(dir.path())?;
    let cgroup = cg.cgroup.clone();
    let (episodes, rounds) = if opts.quick { (1, 10) } else { (2, 40) };
    let events = rt.block_on(async {
        let mut o = lag::storm_sense_options(&cgroup);
        o.psi = false;
        let sense = Sense::start(&o).context("starting the sense layer")?;
        for s in [Source::Ebpf, Source::MemcgThreshold] {
            anyhow::ensure!(sense.report().has(s), "source {s} did not attach");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let collector = lag::collect(sense, stop.clone());
        let path = file.clone();
        let workload = tokio::task::spawn_blocking(move || {
            let r = lag::storm(
                &mut cg,
                &path,
                episodes,
                Duration::from_secs(30),
                Until::Rounds(rounds),
            );
            drop(cg);
            r
        });
        let storm = workload.await.context("the storm thread")?;
        stop.store(true, Ordering::SeqCst);
        let events = collector.await.context("the event collector")?;
        storm?;
        Ok::<_, anyhow::Error>(events)
    })?;
    let ebpf = || lag::ebpf_of(&events, &cgroup);
    let ooms = ebpf()
        .filter(|r| matches!(r.event.kind, reactor::sense::Kind::OomKill { .. }))
        .count();
    let memcg = events.iter().filter(|r| {
        r.event.source == Source::MemcgThreshold && r.event.cgroup.as_deref() == Some(&cgroup)
    });
    Ok(Run {
        level,
        err_line_ns,
        info_line_ns,
        ooms,
        kernel_to_taken: Dist::of(&ebpf().map(|r| r.lag_ns).collect::<Vec<_>>()),
        kernel_to_wake: Dist::of(&lag::kernel_to_wake(ebpf())),
        wake_to_taken: Dist::of(&lag::wake_to_taken(ebpf())),
        memcg_wake_to_taken: Dist::of(&lag::wake_to_taken(memcg)),
    })
}

/// Run part 1b.
pub fn run(opts: &Opts) -> Result<Part> {
    let guard = ConsoleLevel::save()?;
    let mut levels = vec![guard.found];
    if guard.found != 1 {
        levels.push(1);
    }
    let (rt, realtime) = lag::deployed_runtime()?;
    let mut runs = Vec::new();
    for &level in &levels {
        guard.set(level)?;
        runs.push(storm_at(&rt, opts, level)?);
    }
    drop(guard);
    let restored = lag::console_level();

    let mut t = Table::new(
        "1b. The eBPF tail and the console log level, same storm",
        &[
            "console level",
            "error line → /dev/kmsg",
            "info line",
            "OOM kills",
            "eBPF n",
            "kernel→taken p50",
            "kernel→taken p99",
            "kernel→wake p99",
            "kernel→wake max",
            "wake→taken p50",
            "wake→taken p99",
            "memcg wake→taken p99",
        ],
    );
    let fmt = reactor::sense::lag::format_ns;
    let mut out = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        t.row(vec![
            format!(
                "{}{}",
                r.level,
                if i == 0 {
                    " (as found)"
                } else {
                    " (dmesg -n 1)"
                }
            ),
            fmt(r.err_line_ns),
            fmt(r.info_line_ns),
            r.ooms.to_string(),
            r.kernel_to_taken.n.to_string(),
            r.kernel_to_taken.p50_text(),
            r.kernel_to_taken.p99_text(),
            r.kernel_to_wake.p99_text(),
            r.kernel_to_wake.max_text(),
            r.wake_to_taken.p50_text(),
            r.wake_to_taken.p99_text(),
            r.memcg_wake_to_taken.p99_text(),
        ]);
        out.push(json!({
            "console_loglevel": r.level, "as_found": i == 0,
            "kmsg_error_line_ns": r.err_line_ns, "kmsg_info_line_ns": r.info_line_ns,
            "ebpf_oom_kills": r.ooms,
            "ebpf_kernel_to_taken": r.kernel_to_taken.json(),
            "ebpf_kernel_to_wake": r.kernel_to_wake.json(),
            "ebpf_wake_to_taken": r.wake_to_taken.json(),
            "memcg_wake_to_taken": r.memcg_wake_to_taken.json(),
        }));
    }
    let (episodes, rounds) = if opts.quick { (1, 10) } else { (2, 40) };
    t.note(format!(
        "the lag part's storm (96 MiB v1 memcg, holder, page-cache reader, hogs OOM-killed one \
         after another), {episodes} episode(s) of {rounds} hog rounds per level; eBPF and the \
         memcg eventfd only; sense threads {}",
        if realtime {
            format!("SCHED_FIFO {}", lag::REALTIME_PRIORITY)
        } else {
            "on normal scheduling (SCHED_FIFO refused)".to_string()
        }
    ));
    t.note(
        "a line to /dev/kmsg: median of 4 writes of 149 bytes at error (3) and info (6) level; \
         at a console level above 3 the error line is printed on the console before the write \
         returns, as the kernel's own OOM-kill line is"
            .to_string(),
    );
    t.note(format!(
        "the console level was restored to {} afterwards (now {})",
        levels[0],
        restored.map_or_else(|| "unknown".to_string(), |l| l.to_string())
    ));
    let samples = runs.iter().map(|r| r.kernel_to_taken.n).sum();
    Ok(Part {
        key: "console",
        tables: vec![t],
        json: json!({
            "console_loglevel_found": levels[0], "restored": restored,
            "episodes_per_level": episodes, "hog_rounds_per_episode": rounds,
            "sense_realtime": realtime, "runs": out,
        }),
        samples,
    })
}
