//! Part 2: OOM avoidance. The storm of the eviction tests (`reactor_tests::node`): a
//! modelled 512 MiB node (kubepods limited to it) with a Guaranteed and a Burstable pod
//! holding 48 MiB each, and a BestEffort pod allocating 600 MiB at a set rate, under the hard
//! threshold `allocatableMemory.available<128Mi`. The reactor loop runs with every source and
//! with each source alone; per repetition the bench records whether the kernel OOM killer
//! fired before the agent's SIGKILL (the pods' memcg `oom_kill` counters, read every 2 ms), which pod
//! the agent evicted, the decision's reaction lag (waking kernel event → SIGKILL) and the
//! time from the threshold crossing to the victim's memory being released.
//!
//! The modes take turns: per rate, each round runs one repetition of every mode (in an
//! order that rotates from round to round, [`round_order`]), with a loop started for that
//! repetition alone. Run one mode's repetitions after another's, the machine's drift over
//! the minutes between them showed as a difference between the modes. A poll-only mode's
//! hog starts at a different phase of the loop's tick in each repetition ([`tick_phase`]),
//! as it would against a tick that had been running all along.
//!
//! The crossing is timed by the workload itself, so every mode is timed alike and by none of
//! the kernel notifications under test: the hog keeps a progress record
//! ([`reactor_tests::hog_record`]) of the CLOCK_MONOTONIC times just before and just after it
//! touches each 256 KiB piece of its 1 MiB chunks and kubepods' usage after (the page
//! counter every threshold under test watches, read by the hog itself). The threshold is met when kubepods' *working
//! set* (usage − inactive_file) passes 384 MiB, i.e. at usage
//! [`working_set_level`]`(384 MiB, inactive_file)`, with inactive_file read just before the
//! hog starts; the crossing is inside the first piece after which kubepods' usage has
//! reached that level, interpolated linearly over the piece's touch burst by the usage it
//! added (a piece the hog was killed inside is taken as 256 KiB over the earlier pieces' mean
//! burst). Its precision is one piece's touch burst. (A first version added the hog's own
//! usage to kubepods' usage U0 read before it started; charges handed back elsewhere in kubepods in
//! between, per-CPU charge batches and freed pages of earlier hogs, made it place the
//! crossing a whole chunk early in most repetitions: the eBPF records, stamped at the charge
//! that met the level, came about one chunk's pause, 2.3 ms at 350 MiB/s, after it.)
//! Within the burst the page
//! counter moves in charge batches of 64 pages (one piece) rather than page by page, so the
//! linear placement can be off by up to a piece's burst either way. Per repetition the
//! JSON keeps the waking kernel event's own time and usage against the crossing
//! (`event_after_crossing_ns`, `event_usage_past_level_bytes`): an eBPF record is stamped
//! at the charge that met its level, so it checks the clock.
//!
//! The reference before it was a v1 memcg threshold eventfd on kubepods at that level, but
//! the kernel checks v1 thresholds only every 128 charged pages per CPU (about 1.4 ms at
//! 350 MiB/s): an eBPF-woken SIGKILL (its threshold checked every 16 pages) often came
//! first, and crossing → SIGKILL read 0 or the reference fired only on the way down.
//!
//! The cache-full variant (issue 42; `--oom-variants cache-full`, in the default run, both
//! rates even with `--quick`): before each repetition a cgroup of the bench's own inside
//! kubepods (no pod) writes a file 128 MiB larger than kubepods' limit to `/var/tmp`, drops
//! its cache and reads it back once ([`crate::page_cache::fill`]: no buffer heads, whose
//! kernel memory would leave the working set as the cache is reclaimed) and idles, so
//! kubepods sits at its limit with mostly inactive file pages and the hog grows by
//! reclaiming them; the file is removed after the repetition and written afresh for the
//! next. The full agent and eBPF only take turns as the modes do above. kubepods' usage
//! stays at the limit there, so the crossing is clocked on its working set instead
//! ([`Basis::WorkingSet`]): the hog's record holds its own pod cgroup's usage, and the
//! crossing is where that plus kubepods' working set without the hog just before it reaches
//! 384 MiB. Its own table gives, per mode and rate, the OOM killer first, crossing →
//! SIGKILL p50/p99 and the kills at the crossing.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reactor::act::cgroups::CgroupPath;
use reactor::act::runtime::{RestartPolicy, Runtime};
use reactor::reactor::{Action, Decision, PodControl, ReactorSettings};
use reactor::sense::memcg::working_set_level;
use reactor::sense::{monotonic_ns, Kind, Source};
use reactor_tests::hog_record::{self, layout, RecordFile};
use reactor_tests::node::{burstable, guaranteed, Node, NodeSpec, MI};
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use crate::opts::Opts;
use crate::page_cache::{CacheCgroup, MemStat};
use crate::report::{Dist, Part, Table};

const CAPACITY_MI: u64 = 512;
/// The variants' short names for `--oom-variants`: the node as it is, and full of page cache.
pub(crate) const VARIANT_KEYS: [&str; 2] = ["plain", "cache-full"];
/// The modes the cache-full variant runs, by index into [`MODES`]: the full agent and eBPF
/// only, the two whose eBPF threshold and its tripwire the page cache concerns.
const CACHE_FULL_MODES: [usize; 2] = [0, 1];
/// How much more than kubepods' limit the cache-full variant writes, so the cache fills it.
const CACHE_EXTRA_MI: u64 = 128;
const HARD_MI: u64 = 128;
/// What the BestEffort hog allocates, MiB (the node has 512).
pub(crate) const HOG_MI: u64 = 600;

/// Which sources the loop listens to.
pub(crate) struct Mode {
    name: &'static str,
    ebpf: bool,
    psi: bool,
    memcg: bool,
    /// The housekeeping tick as a source, at this interval.
    poll: Option<Duration>,
    /// The loop's own re-check interval (`housekeepingInterval`).
    housekeeping: Duration,
    /// The loop's 1 ms re-reads while a signal is close to a threshold; off for the
    /// poll-only modes, which model the kubelet (signals read on the tick only).
    close_watch: bool,
}

const TEN: Duration = Duration::from_secs(10);

/// The modes' short names for `--oom-modes`, in [`MODES`]' order.
pub(crate) const MODE_KEYS: [&str; 6] = ["full", "ebpf", "memcg", "psi", "poll1", "poll10"];

pub(crate) const MODES: [Mode; 6] = [
    Mode {
        name: "full agent",
        ebpf: true,
        psi: true,
        memcg: true,
        poll: Some(TEN),
        housekeeping: TEN,
        close_watch: true,
    },
    Mode {
        name: "eBPF only",
        ebpf: true,
        psi: false,
        memcg: false,
        poll: None,
        housekeeping: TEN,
        close_watch: true,
    },
    Mode {
        name: "memcg threshold only",
        ebpf: false,
        psi: false,
        memcg: true,
        poll: None,
        housekeeping: TEN,
        close_watch: true,
    },
    Mode {
        name: "PSI only",
        ebpf: false,
        psi: true,
        memcg: false,
        poll: None,
        housekeeping: TEN,
        close_watch: true,
    },
    Mode {
        name: "poll 1 s",
        ebpf: false,
        psi: false,
        memcg: false,
        poll: Some(Duration::from_secs(1)),
        housekeeping: Duration::from_secs(1),
        close_watch: false,
    },
    Mode {
        name: "poll 10 s (kubelet)",
        ebpf: false,
        psi: false,
        memcg: false,
        poll: Some(TEN),
        housekeeping: TEN,
        close_watch: false,
    },
];

/// What one repetition came to.
#[derive(Default)]
pub(crate) struct Rep {
    oom_first: bool,
    evicted: Option<String>,
    right: bool,
    reaction_ns: Option<u64>,
    /// The reaction's second part: the pass's observation, from its start, → the SIGKILL
    /// (the decision's `decide_to_kill_ns`); the first part, event → observed, is the rest.
    observe_to_kill_ns: Option<u64>,
    /// The loop thread's CPU time over the same span (`decide_to_kill_cpu_ns`): near it when
    /// the thread ran throughout, well below it when it waited.
    observe_to_kill_cpu_ns: Option<u64>,
    pub(crate) crossing_to_released_ns: Option<u64>,
    /// The two halves of it: crossing → the agent's SIGKILL, and SIGKILL → the victim's
    /// cgroup empty (its memory reaped by `process_mrelease` in between, where the kernel
    /// has it).
    pub(crate) crossing_to_kill_ns: Option<u64>,
    kill_to_released_ns: Option<u64>,
    /// SIGKILL → the victim's pod cgroup empty by the bench's own 100 µs watch (begun when
    /// the eviction's record arrives), timed as the reference row times the victim's exit;
    /// `released` above is the agent's own record, which also waits for the usage to stop
    /// falling and looks every `close_poll`.
    pub(crate) kill_to_empty_ns: Option<u64>,
    /// The watch's first look already found the cgroup empty (its figure is an upper bound).
    empty_at_first_look: bool,
    /// SIGKILL − crossing, signed: below 0 the agent killed before the clock's crossing
    /// (the figures above read 0 then).
    kill_after_crossing_ns: Option<i64>,
    /// For a decision a kernel event woke: the event's time − the crossing, signed, and the
    /// usage it saw where it carries one (the eBPF record's page counter, the v1 watch's read
    /// at wake-up). A check on the clock: an eBPF event is stamped at the charge that met its
    /// level, at most 16 pages per CPU after the crossing.
    event_after_crossing_ns: Option<i64>,
    event_usage: Option<u64>,
    /// The waking eBPF record's usage level (a working-set slot's level plus the inactive
    /// file pages it had followed to the crossing).
    event_threshold: Option<u64>,
    /// The cache-full variant: kubepods read folded once the victim's memory was back, the
    /// hog dead and the cache no longer reclaimed: its inactive file pages against those
    /// the program followed to the crossing (`event_threshold` − the level).
    after_kill: Option<MemStat>,
    /// A kill at the crossing: when, usage then and the usage level the program compared it
    /// with (the decision's `crossing_kill`).
    crossing_kill: Option<reactor::reactor::CrossingKillFigures>,
    woken_by: Option<String>,
    /// The waking event as the record prints it (kind, level, usage, a kill at the
    /// crossing): which record a decision the kernel did not complete answered.
    wake_event: Option<String>,
    /// The kill was the kernel's, at the crossing (`killAtCrossing`: the staged victim was
    /// charging the crossing page).
    at_crossing: bool,
    /// The crossing as the hog's record placed it (see [`Clock`]).
    clock: ClockRep,
    /// The cache-full variant: kubepods just after its cache was written, and how long the
    /// writing took.
    filled: Option<(MemStat, Duration)>,
}

/// The most a single charge moves a memory cgroup's page counter: the kernel charges
/// `MEMCG_CHARGE_BATCH` (64) pages at once and hands them out from a per-CPU stock, so usage
/// steps by up to 256 KiB at the charge that crosses a level.
const CHARGE_BATCH_BYTES: i64 = 64 * 4096;

impl Rep {
    /// A kill at the crossing on a node full of page cache: how far kubepods' working set was
    /// past its level when the program sent SIGKILL, by the kernel's own figures: usage at
    /// that charge (the page counter, exact) less kubepods' inactive file pages read folded
    /// once the hog was dead and the cache no longer reclaimed. Independent of the program's
    /// own page-cache count and of the hog-record clock, whose error is the rest of
    /// kubepods' working set moving by up to about 1 MiB.
    fn past_level_bytes(&self) -> Option<i64> {
        let at = self.crossing_kill?;
        let after = self.after_kill?;
        let ws = i128::from(at.usage_bytes) - i128::from(after.inactive_file);
        i64::try_from(ws - i128::from(self.clock.level)).ok()
    }

    /// The two parts of [`Rep::past_level_bytes`]: usage past the program's own usage level
    /// at the charge it killed at (0 to one charge's step when it killed at the charge that
    /// crossed), and the page cache the program had followed less the kernel's folded count
    /// (the program's level is the working-set level plus what it followed).
    fn kill_parts(&self) -> Option<(i64, i64)> {
        let at = self.crossing_kill?;
        let after = self.after_kill?;
        let over = i128::from(at.usage_bytes) - i128::from(at.level_bytes);
        let followed = i128::from(at.level_bytes) - i128::from(self.clock.level);
        let drift = followed - i128::from(after.inactive_file);
        Some((i64::try_from(over).ok()?, i64::try_from(drift).ok()?))
    }
}

/// One repetition's crossing clock: what it was set from and what the hog's record gave.
#[derive(Default)]
pub(crate) struct ClockRep {
    /// What the clock compared.
    basis: Basis,
    /// The usage the threshold is met at: [`working_set_level`]`(384 MiB, inactive_file)`;
    /// for [`Basis::WorkingSet`], the working set it is met at (384 MiB here, 412 MiB in
    /// part 8).
    level: u64,
    /// [`Basis::WorkingSet`]: kubepods' working set without the hog, added to its usage.
    offset: u64,
    /// kubepods' inactive file pages just before the hog started, added to the 384 MiB.
    inactive_file: u64,
    /// kubepods' usage then (the Guaranteed and Burstable pods and the rest), U0.
    base: u64,
    /// The piece the crossing fell in, and whether the hog died inside it (placed from its
    /// start time and the mean burst, not its own).
    piece: Option<usize>,
    incomplete: bool,
    /// How far into that piece's burst.
    fraction: Option<f64>,
    /// Why there is no crossing, if there is none.
    pub(crate) none: Option<&'static str>,
    /// The mean of this hog's complete pieces' touch bursts: the clock's resolution.
    mean_burst_ns: Option<u64>,
    /// [`Basis::WorkingSet`]: kubepods' working set as a plain `memory.stat` read gave it
    /// just before the folded read the clock is set from ([`crate::page_cache::folded_stat`]):
    /// what the clock would have been off by without the fold.
    unfolded_working_set: Option<u64>,
}

/// One mode at one rate.
pub(crate) struct Row {
    pub(crate) rate: u64,
    pub(crate) mode: &'static str,
    attached: Vec<Source>,
    pub(crate) reps: Vec<Rep>,
}

/// Makes sure the Guaranteed and Burstable pods run (an eviction or OOM kill of either is
/// recorded as a wrong victim, then they are brought back for the next repetition).
pub(crate) async fn ensure_base_pods(node: &Node) {
    for (uid, qos, resources) in [
        ("g", None, guaranteed()),
        ("b", Some("burstable"), burstable("64Mi")),
    ] {
        if node.is_running(uid).await {
            continue;
        }
        let _ = node.runtime.stop_pod(uid, Duration::ZERO).await;
        node.pods.remove(uid);
        if let Ok(cg) = CgroupPath::pod(qos, uid) {
            let _ = node.cgroups.remove(&cg, Duration::from_secs(2));
        }
        node.run(uid, qos, resources, &["48", "0"], RestartPolicy::Always)
            .await;
        node.wait_usage(uid, qos, 48 * MI).await;
    }
}

/// What a crossing clock compares, and so which usage file the hog reads after each piece.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Basis {
    /// kubepods' own usage against the usage the working-set threshold is met at, given
    /// kubepods' inactive file pages just before the hog: right while the page cache stays
    /// put during the hog (a few MiB of it here).
    #[default]
    Usage,
    /// kubepods' working set as the hog's own pod cgroup usage plus kubepods' working set
    /// without it just before the hog (and whatever the caller adds to it after, with
    /// [`Clock::add_working_set`]), against the working-set level itself. For a node full
    /// of page cache: the hog's growth reclaims the cache, usage stays at the limit, and a
    /// usage level set from the cache before the hog would never be met. Its error is what
    /// the rest of kubepods' working set moves during the hog: kernel memory that leaves with
    /// the reclaimed cache (ext4's buffer heads moved it by 8 MiB until the cache was filled
    /// by reading, [`crate::page_cache::fill`]; about 1 MiB is left), active file pages
    /// reclaim moves to the inactive list (the JSON keeps kubepods' file pages before).
    WorkingSet,
}

impl Basis {
    fn key(self) -> &'static str {
        match self {
            Basis::Usage => "kubepods_usage",
            Basis::WorkingSet => "hog_usage_plus_working_set_before",
        }
    }
}

/// The bench's clock for one repetition's crossing, set just before its hog starts: the
/// level the threshold is met at given kubepods' inactive file pages now, and kubepods'
/// usage file the hog reads after each piece ([`Basis::Usage`]), or the working-set level
/// and the hog's own usage file ([`Basis::WorkingSet`]). Read from the hog's progress record
/// afterwards ([`hog_record::crossing`]), it gives when the hog charged the crossing page, a
/// clock no sensing mode under test has a part in.
pub(crate) struct Clock {
    record: RecordFile,
    level: u64,
    inactive_file: u64,
    /// kubepods' usage just before the hog started, kept for the JSON.
    base: u64,
    /// What the record's usage leaves out of the figure the level is on: 0 for
    /// [`Basis::Usage`]; kubepods' working set without the hog for [`Basis::WorkingSet`].
    offset: u64,
    basis: Basis,
    /// The usage file the hog reads after each piece.
    usage_file: std::path::PathBuf,
    /// See [`ClockRep::unfolded_working_set`].
    unfolded: Option<u64>,
}

impl Clock {
    /// Makes the hog's record (its pages charged to the bench, not to kubepods) and the
    /// hog's pod and container cgroups, then reads kubepods' usage and inactive file pages.
    /// Call it on a settled node, right before the hog starts. The threshold is met when
    /// kubepods' working set passes `working_set_mi`.
    ///
    /// The cgroups come first because making a memory cgroup charges its own kernel
    /// structures to its parent (a 64-page charge batch each here: kubepods' counter rose
    /// by 256 KiB per mkdir); made after the settled check, they could push kubepods past
    /// the level unseen. (The runtime keeps cgroups that exist.)
    pub(crate) fn arm(node: &Node, uid: &str, working_set_mi: u64) -> Result<Clock> {
        Clock::arm_on(node, uid, working_set_mi, Basis::Usage)
    }

    /// [`Clock::arm`] comparing `basis` (see [`Basis`]).
    pub(crate) fn arm_on(
        node: &Node,
        uid: &str,
        working_set_mi: u64,
        basis: Basis,
    ) -> Result<Clock> {
        let record = RecordFile::create(HOG_MI).context("the hog's progress record")?;
        let container = CgroupPath::pod(Some("besteffort"), uid)
            .and_then(|p| p.join("app"))
            .context("the hog's container cgroup")?;
        node.cgroups
            .create(&container)
            .context("the hog's container cgroup")?;
        let now = node
            .cgroups
            .memory_usage(&CgroupPath::kubepods())
            .context("kubepods' usage and inactive file pages")?;
        let mut inactive_file = now.inactive_file_bytes;
        let mut base = now.usage_bytes;
        let mut unfolded = None;
        // The node is a v1 one (`Node::start`): the counters in the memory hierarchy.
        let memory = std::path::Path::new(reactor_tests::MEMCG_V1_ROOT).join(&node.root.name);
        let (usage_file, level, offset) = match basis {
            Basis::Usage => {
                let level = working_set_level(working_set_mi * MI, inactive_file);
                if now.usage_bytes >= level {
                    bail!(
                        "kubepods at {} bytes, already past the crossing at {level}: the node \
                         did not settle",
                        now.usage_bytes
                    );
                }
                (memory.join("kubepods/memory.usage_in_bytes"), level, 0)
            }
            Basis::WorkingSet => {
                let level = working_set_mi * MI;
                if now.working_set_bytes >= level {
                    bail!(
                        "kubepods' working set at {} bytes, already past the crossing at \
                         {level}: the node did not settle",
                        now.working_set_bytes
                    );
                }
                let pod = CgroupPath::pod(Some("besteffort"), uid)
                    .context("the hog's pod cgroup")?
                    .under(&memory);
                // A plain read can miss a few hundred pages of updates the kernel has not
                // folded into kubepods yet: the clock is set from a folded one.
                unfolded = Some(now.working_set_bytes);
                let folded = crate::page_cache::folded_stat(&memory.join("kubepods"), &pod)
                    .context("kubepods' statistics, folded, before the hog")?;
                inactive_file = folded.inactive_file;
                base = folded.usage;
                let hog =
                    crate::page_cache::stat(&pod).context("the hog's pod cgroup before the hog")?;
                let offset = folded.working_set().saturating_sub(hog.working_set());
                (pod.join("memory.usage_in_bytes"), level, offset)
            }
        };
        if !usage_file.exists() {
            bail!(
                "no usage file for the hog to read at {}",
                usage_file.display()
            );
        }
        Ok(Clock {
            record,
            level,
            inactive_file,
            base,
            offset,
            basis,
            usage_file,
            unfolded,
        })
    }

    /// Adds `bytes` to the working set the record's usage leaves out ([`Basis::WorkingSet`]):
    /// page cache another pod activated during the hog (moved from the inactive list to the
    /// active one, so into the working set, with no charge the record could see).
    pub(crate) fn add_working_set(&mut self, bytes: u64) {
        self.offset = self.offset.saturating_add(bytes);
    }

    /// What the record's usage leaves out of the figure the level is on (see `offset`), and
    /// kubepods' usage and inactive file pages when the clock was armed, bytes.
    pub(crate) fn armed_at(&self) -> (u64, u64, u64) {
        (self.offset, self.base, self.inactive_file)
    }

    /// The hog's environment for this record: where it is and kubepods' usage file.
    pub(crate) fn hog_env(&self) -> Result<[(&'static str, String); 2]> {
        let text = |p: &std::path::Path, what: &str| {
            p.to_str()
                .map(str::to_string)
                .with_context(|| format!("{what} path is not UTF-8"))
        };
        Ok([
            (layout::ENV, text(self.record.path(), "the hog's record")?),
            (
                layout::USAGE_ENV,
                text(&self.usage_file, "kubepods' usage file")?,
            ),
        ])
    }

    /// The crossing from the record as the hog left it, CLOCK_MONOTONIC ns, with what the
    /// repetition keeps of it.
    pub(crate) fn read(&self) -> (Option<u64>, ClockRep) {
        let mut rep = ClockRep {
            basis: self.basis,
            level: self.level,
            offset: self.offset,
            inactive_file: self.inactive_file,
            base: self.base,
            unfolded_working_set: self.unfolded,
            ..ClockRep::default()
        };
        let slots = match self.record.read() {
            Ok(s) => s,
            Err(_) => {
                rep.none = Some("the hog's record could not be read");
                return (None, rep);
            }
        };
        rep.mean_burst_ns = hog_record::mean_burst_ns(&slots);
        // For the usage basis the record holds kubepods' own usage: nothing to add to it.
        let piece = layout::PIECE_BYTES as u64;
        match hog_record::crossing(&slots, self.offset, self.level, piece) {
            Ok(c) => {
                rep.piece = Some(c.piece);
                rep.incomplete = c.incomplete;
                rep.fraction = Some(c.fraction);
                (Some(c.at_ns), rep)
            }
            Err(why) => {
                rep.none = Some(why.why());
                (None, rep)
            }
        }
    }
}

/// When the agent's SIGKILL went out: a kill at the crossing's own time (the program's, at
/// the charge that crossed: the pass that completed it may have been woken by another, later
/// record), else the waking event plus the reaction lag, else the moment the signals were
/// read just before it.
fn kill_at(d: &Decision) -> u64 {
    if let Some(k) = d.crossing_kill {
        return k.at_ns;
    }
    match (&d.wake.event, d.reaction_lag_ns) {
        (Some(e), Some(l)) => e.at_ns + l,
        _ => d.observed_at_ns + d.decide_to_kill_ns.unwrap_or(0),
    }
}

/// Starts one repetition's hog (600 MiB at `rate` MiB/s, BestEffort, its clock armed on
/// `basis` just before) and returns the clock and a reader of the pods' OOM kills so far.
pub(crate) async fn start_hog(
    node: &mut Node,
    uid: &str,
    rate: u64,
    basis: Basis,
) -> Result<(Clock, impl Fn() -> u64 + Send + Sync)> {
    let clock = Clock::arm_on(node, uid, CAPACITY_MI - HARD_MI, basis)?;
    let env = clock.hog_env()?;
    node.run_env(
        uid,
        Some("besteffort"),
        json!({}),
        &[&HOG_MI.to_string(), &rate.to_string()],
        &env.each_ref().map(|(k, v)| (*k, v.as_str())),
        RestartPolicy::Never,
    )
    .await;
    let cgroups = node.cgroups.clone();
    // On cgroup v1 an OOM kill is counted in the victim's own memcg only (no propagation to
    // kubepods), so watch every pod's container.
    let containers: Vec<CgroupPath> = [
        (Some("besteffort"), uid),
        (None, "g"),
        (Some("burstable"), "b"),
    ]
    .into_iter()
    .filter_map(|(qos, u)| CgroupPath::pod(qos, u).and_then(|p| p.join("app")).ok())
    .collect();
    let ooms = move || -> u64 {
        containers
            .iter()
            .map(|c| cgroups.oom_kills(c).unwrap_or(0))
            .sum()
    };
    Ok((clock, ooms))
}

/// One repetition; with `cache` (the cache-full variant) the crossing is clocked on
/// kubepods' working set ([`Basis::WorkingSet`]) and the cache is freed before the node is
/// settled again.
async fn repetition(
    node: &mut Node,
    uid: &str,
    rate: u64,
    cache: Option<&mut CacheCgroup>,
) -> Result<Rep> {
    let basis = match cache {
        Some(_) => Basis::WorkingSet,
        None => Basis::Usage,
    };
    let (clock, ooms) = start_hog(node, uid, rate, basis).await?;
    let mut rep = Rep::default();
    let mut oom_at: Option<u64> = None;
    let mut evicted: Option<Decision> = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let oom0 = ooms();
    loop {
        let lp = node.lp();
        tokio::select! {
            d = lp.decisions.recv() => match d {
                Ok(d) if matches!(d.action, Action::Evicted { .. }) => {
                    evicted = Some(d);
                    break;
                }
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => break,
            },
            () = tokio::time::sleep(Duration::from_millis(2)) => {
                if oom_at.is_none() && ooms() > oom0 {
                    oom_at = Some(monotonic_ns());
                }
                // After a kernel kill, give the agent a moment to show what it did.
                if oom_at.is_some_and(|t| monotonic_ns() - t > 300_000_000) {
                    break;
                }
            },
            () = tokio::time::sleep_until(deadline) => break,
        }
    }
    // The victim's exit by the bench's own watch, as the reference times it: begun now, a
    // fraction of a millisecond after the kill (the record comes at the end of the pass that
    // completed it), against an exit of 10 ms or more.
    let empty_at = match evicted.as_ref().map(|d| &d.action) {
        Some(Action::Evicted { uid: victim, .. }) if victim == uid => {
            Some(crate::oom_ref::watch_empty(node, uid)?)
        }
        _ => None,
    };
    // Entries are final once complete, so the record may be read with the hog still running
    // (no eviction, or a kernel kill of another pod).
    let (crossing, clock_rep) = clock.read();
    rep.clock = clock_rep;
    // The eviction's second record says when the victim's memory was back.
    let mut release_ns = None;
    if let Some(Action::Evicted { uid: victim, .. }) = evicted.as_ref().map(|d| &d.action) {
        let until = tokio::time::Instant::now() + Duration::from_secs(12);
        loop {
            match tokio::time::timeout_at(until, node.lp().decisions.recv()).await {
                Ok(Ok(d)) => {
                    if let Action::Released {
                        uid: u, released, ..
                    } = &d.action
                    {
                        if u == victim {
                            release_ns = d.release_ns.filter(|_| *released);
                            break;
                        }
                    }
                }
                Ok(Err(RecvError::Lagged(_))) => {}
                Ok(Err(RecvError::Closed)) | Err(_) => break,
            }
        }
    }
    if let Some(d) = &evicted {
        let k = kill_at(d);
        rep.oom_first = oom_at.is_some_and(|o| o <= k);
        if let Action::Evicted { uid: victim, .. } = &d.action {
            rep.right = victim == uid;
            rep.evicted = Some(victim.clone());
            {
                if let (Some(c), Some(r)) = (crossing, release_ns) {
                    rep.crossing_to_released_ns = Some((k + r).saturating_sub(c));
                    rep.crossing_to_kill_ns = Some(k.saturating_sub(c));
                    rep.kill_to_released_ns = Some(r);
                    // Two CLOCK_MONOTONIC times: their difference fits an i64.
                    rep.kill_after_crossing_ns = Some(k.wrapping_sub(c) as i64);
                }
                if let Some((at, first)) = empty_at {
                    rep.kill_to_empty_ns = Some(at.saturating_sub(k));
                    rep.empty_at_first_look = first;
                }
            }
        }
        rep.reaction_ns = d.reaction_lag_ns;
        rep.at_crossing = d.killed_at_crossing.is_some();
        rep.crossing_kill = d.crossing_kill;
        rep.observe_to_kill_ns = d.decide_to_kill_ns;
        rep.observe_to_kill_cpu_ns = d.decide_to_kill_cpu_ns;
        if let (Some(e), false, Some(c)) = (&d.wake.event, d.wake.timer, crossing) {
            rep.event_after_crossing_ns = Some(e.at_ns.wrapping_sub(c) as i64);
            if let Kind::ThresholdCrossed {
                usage_bytes,
                threshold_bytes,
                ..
            } = e.kind
            {
                rep.event_usage = usage_bytes;
                rep.event_threshold = threshold_bytes;
            }
        }
        rep.wake_event = d.wake.event.as_ref().map(|e| e.kind.to_string());
        rep.woken_by = Some(if d.wake.timer {
            "timer".to_string()
        } else {
            d.wake
                .event
                .as_ref()
                .map_or("timer".to_string(), |e| e.source.name().to_string())
        });
    } else {
        rep.oom_first = oom_at.is_some() || ooms() > oom0;
    }
    // The cache goes first: kubepods full of it would keep the settle below waiting.
    if let Some(cache) = cache {
        if evicted.is_some() {
            let kubepods = std::path::Path::new(reactor_tests::MEMCG_V1_ROOT)
                .join(&node.root.name)
                .join("kubepods");
            rep.after_kill = crate::page_cache::folded_stat(&kubepods, &cache.dir).ok();
        }
        cache.empty();
    }
    clean_up(node, uid).await;
    while node.lp().decisions.try_recv().is_ok() {}
    Ok(rep)
}

/// After a repetition: the hog (evicted, OOM-killed or still running) stopped, its cgroup
/// removed, the node back to its two base pods and settled.
pub(crate) async fn clean_up(node: &mut Node, uid: &str) {
    let _ = node.runtime.stop_pod(uid, Duration::ZERO).await;
    node.pods.remove(uid);
    if let Ok(cg) = CgroupPath::pod(Some("besteffort"), uid) {
        let _ = node.cgroups.remove(&cg, Duration::from_secs(2));
    }
    ensure_base_pods(node).await;
    let t = Instant::now();
    while node.usage(&CgroupPath::kubepods()) > 160 * MI && t.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// The order of the modes in round `rep` of a rate: the first half of [`MODES`] (the
/// modes with eBPF or the memcg threshold), then the second (PSI and the polls), each half
/// rotated by one mode per round.
///
/// Every round runs one repetition of each mode, so drift of the machine over the run
/// (SIGKILL → cgroup empty moved by 10 ms and more between runs) reaches every mode alike
/// instead of showing as a difference between modes run one block after another; the
/// rotation spreads a trend *within* rounds over the modes too. The halves are rotated
/// apart because a repetition leaves the node to the next one: the second half's modes
/// mostly end in a kernel OOM kill, and the repetition after one met kubepods with no
/// inactive file pages, against about 3 MiB otherwise. (Reversing every other round
/// instead had memcg only follow PSI only in every other round, and in exactly those its
/// crossing → SIGKILL read 8–27 ms against 0.2–2 ms: the page cache came back during the
/// hog, after the clock had read it.) Rotated apart, each mode of the first half follows
/// the second half's last mode in an equal share of the rounds.
fn round_order(modes: usize, rep: usize) -> Vec<usize> {
    let half = modes.div_ceil(2);
    let rotate = |lo: usize, hi: usize| {
        let n = hi - lo;
        (0..n).map(move |i| lo + (i + rep) % n)
    };
    rotate(0, half).chain(rotate(half, modes)).collect()
}

/// `memoryReclaim.timeout`'s default, for `--memory-reclaim`.
const MEMORY_RECLAIM_TIMEOUT: Duration = Duration::from_millis(100);

/// Starts the reactor loop with `mode`'s sources and timing, then its settings adjusted by
/// `adjust`. Each repetition has a loop of its own, started for it and stopped after it,
/// because modes take turns repetition by repetition ([`round_order`]).
pub(crate) fn start_mode_with(
    node: &mut Node,
    mode: &Mode,
    adjust: impl FnOnce(&mut ReactorSettings),
) {
    node.start_loop_with(|o, s| {
        o.ebpf = mode.ebpf;
        o.psi = mode.psi;
        o.memcg = mode.memcg;
        o.poll = mode.poll.is_some();
        if let Some(p) = mode.poll {
            o.poll_interval = p;
        }
        s.housekeeping = mode.housekeeping;
        if !mode.close_watch {
            s.close_poll = mode.housekeeping;
            s.kernel_watched_poll = mode.housekeeping;
        }
        adjust(s);
    });
}

/// How long a poll-only mode's repetition waits, after its loop started, before the hog
/// starts: a fraction of the tick interval that differs from repetition to repetition.
///
/// A loop started for each repetition ticks at the same times after its start, and the hog
/// always crosses the threshold at about the same time after that, so without this every
/// repetition of a poll mode would meet its tick at the same phase (at 350 MiB/s always
/// just before the crossing, and the kernel's OOM killer first every time): a figure of the
/// harness, not of polling. A kubelet's tick runs on its own clock, at any phase of a
/// workload's growth; the fractions spread over the interval (the golden-ratio sequence, so
/// neighbouring repetitions are far apart) stand for that. Modes with a kernel source are
/// woken by the kernel, not by the tick, and start at once.
fn tick_phase(mode: &Mode, rep: usize) -> Duration {
    let poll_only = !(mode.ebpf || mode.psi || mode.memcg);
    match mode.poll {
        Some(interval) if poll_only => {
            interval.mul_f64(((rep as f64 + 0.5) * 0.618_033_988_749_895).fract())
        }
        _ => Duration::ZERO,
    }
}

/// Run part 2.
pub fn run(opts: &Opts) -> Result<Part> {
    let rates = opts.oom_rates.clone().unwrap_or_else(|| {
        if opts.quick {
            vec![350]
        } else {
            vec![350, 150]
        }
    });
    let reps = opts.oom_reps.unwrap_or(if opts.quick { 1 } else { 20 });
    let variant = |k: &str| {
        opts.oom_variants
            .as_ref()
            .is_none_or(|v| v.iter().any(|x| x == k))
    };
    let (plain, cache_full) = (variant(VARIANT_KEYS[0]), variant(VARIANT_KEYS[1]));
    // The cache-full variant runs the same rates, even when the plain one is left out.
    let cache_rates = rates.clone();
    let rates = if plain { rates } else { Vec::new() };
    // As `reactor run` runs the agent: the loop on its own `SCHED_FIFO` thread, the rest at
    // normal scheduling (see `node_runtime`).
    let (rt, realtime) = crate::lag::node_runtime()?;
    let rows = rt.block_on(async {
        let mut node = Node::start(NodeSpec {
            name: "bench-oom",
            capacity_mi: CAPACITY_MI,
            hard: &[("allocatableMemory.available", "128Mi")],
            soft: &[],
            min_reclaim: &[],
            transition: Duration::from_secs(2),
            ebpf: true,
            deferred: true,
        })
        .await;
        node.loop_thread = crate::lag::node_loop_thread(realtime);
        ensure_base_pods(&node).await;
        let mut rows = Vec::new();
        let mut references: BTreeMap<u64, Vec<crate::oom_ref::RefRep>> = BTreeMap::new();
        for &rate in &rates {
            let mut rate_rows: Vec<Row> = MODES
                .iter()
                .map(|mode| Row {
                    rate,
                    mode: mode.name,
                    attached: Vec::new(),
                    reps: Vec::new(),
                })
                .collect();
            for rep in 0..reps {
                for mi in round_order(MODES.len(), rep) {
                    let asked = opts.oom_modes.as_ref();
                    if asked.is_some_and(|m| !m.iter().any(|k| k == MODE_KEYS[mi])) {
                        continue;
                    }
                    let mode = &MODES[mi];
                    start_mode_with(&mut node, mode, |s| {
                        if opts.memory_reclaim {
                            s.memory_reclaim = Some(MEMORY_RECLAIM_TIMEOUT);
                        }
                        if opts.close_watch_always {
                            s.kernel_watched_poll = s.close_poll;
                        }
                    });
                    let row = &mut rate_rows[mi];
                    if rep == 0 {
                        row.attached = node.attached.clone();
                    } else if row.attached != node.attached {
                        eprintln!(
                            "bench: oom {rate} MiB/s {} repetition {rep}: sources {:?}, the \
                             first repetition had {:?}",
                            mode.name, node.attached, row.attached
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(500) + tick_phase(mode, rep)).await;
                    let uid = format!("be-{rate}-{mi}-{rep}");
                    let result = repetition(&mut node, &uid, rate, None).await;
                    node.stop_loop().await;
                    row.reps.push(result?);
                }
                // The reference takes its turn after the round's modes, with no loop.
                let uid = format!("be-{rate}-ref-{rep}");
                let r = crate::oom_ref::repetition(&mut node, &uid, rate).await?;
                references.entry(rate).or_default().push(r);
            }
            for row in rate_rows.iter().filter(|r| !r.reps.is_empty()) {
                eprintln!(
                    "bench: oom {rate} MiB/s {}: {} of {reps} evicted before any OOM kill",
                    row.mode,
                    row.reps.iter().filter(|r| r.right && !r.oom_first).count()
                );
            }
            rows.extend(rate_rows.into_iter().filter(|r| !r.reps.is_empty()));
        }
        let cache_rows = if cache_full {
            cache_full_rounds(&mut node, opts, &cache_rates, reps).await?
        } else {
            Vec::new()
        };
        for p in node.pods.pods().iter() {
            let _ = node.runtime.stop_pod(&p.info.uid, Duration::ZERO).await;
        }
        node.finish().await;
        Ok::<_, anyhow::Error>((rows, references, cache_rows))
    })?;
    let (rows, references, cache_rows) = rows;
    let mut part = if plain {
        let mut part = summarise(
            &rows,
            reps,
            realtime,
            !opts.no_mrelease,
            opts.memory_reclaim,
            opts.close_watch_always,
        );
        crate::oom_ref::add_to(
            &mut part,
            &crate::oom_ref::full_agent_times(&rows),
            &references,
        );
        part
    } else {
        Part {
            key: "oom",
            tables: Vec::new(),
            json: json!({"capacity_mib": CAPACITY_MI, "repetitions": reps, "rows": []}),
            samples: 0,
        }
    };
    if cache_full {
        let (table, json, samples) = summarise_cache_full(&cache_rows, reps, realtime);
        part.tables.push(table);
        part.samples += samples;
        if let Some(obj) = part.json.as_object_mut() {
            obj.insert("cache_full".into(), json);
        }
    }
    Ok(part)
}

/// The cache-full variant: before each repetition kubepods of the modelled node is filled
/// with page cache up to its limit (a cgroup of the bench's own in kubepods fills a file
/// [`CACHE_EXTRA_MI`] larger than the limit on `/var/tmp`, [`crate::page_cache::fill`], then
/// idles), so the hog grows by
/// reclaiming it; its crossing is clocked on kubepods' working set ([`Basis::WorkingSet`]).
/// The modes of [`CACHE_FULL_MODES`] (those `--oom-modes` leaves) take turns as in the plain
/// variant; the cache is written afresh for each repetition (a file read again would be
/// activated, and a hog leaves part of it reclaimed).
async fn cache_full_rounds(
    node: &mut Node,
    opts: &Opts,
    rates: &[u64],
    reps: usize,
) -> Result<Vec<Row>> {
    let kubepods = std::path::Path::new(reactor_tests::MEMCG_V1_ROOT)
        .join(&node.root.name)
        .join("kubepods");
    let limit = crate::page_cache::limit(&kubepods)?;
    if limit > (CAPACITY_MI + 64) * MI {
        bail!(
            "kubepods' memory limit is {limit} bytes, not the modelled node's {CAPACITY_MI} \
             MiB: page cache could not fill it"
        );
    }
    let bytes = (limit / MI + CACHE_EXTRA_MI) * MI;
    let modes: Vec<usize> = CACHE_FULL_MODES
        .into_iter()
        .filter(|&mi| {
            opts.oom_modes
                .as_ref()
                .is_none_or(|m| m.iter().any(|k| k == MODE_KEYS[mi]))
        })
        .collect();
    if modes.is_empty() {
        bail!(
            "--oom-variants cache-full runs the modes {}; --oom-modes left none of them",
            CACHE_FULL_MODES.map(|mi| MODE_KEYS[mi]).join(",")
        );
    }
    let mut cache = CacheCgroup::new(&kubepods, "bench-cache-writer")?;
    let mut rows = Vec::new();
    for &rate in rates {
        let mut rate_rows: Vec<Row> = modes
            .iter()
            .map(|&mi| Row {
                rate,
                mode: MODES[mi].name,
                attached: Vec::new(),
                reps: Vec::new(),
            })
            .collect();
        for rep in 0..reps {
            for k in 0..modes.len() {
                let j = (k + rep) % modes.len();
                let mode = &MODES[modes[j]];
                let took = cache.fill(bytes)?.took;
                // kubepods' statistics hold the cache before the clock reads them.
                let filled = crate::page_cache::settled(&kubepods, &cache.dir)?;
                start_mode_with(node, mode, |s| {
                    if opts.memory_reclaim {
                        s.memory_reclaim = Some(MEMORY_RECLAIM_TIMEOUT);
                    }
                    if opts.close_watch_always {
                        s.kernel_watched_poll = s.close_poll;
                    }
                });
                let row = &mut rate_rows[j];
                if rep == 0 {
                    row.attached = node.attached.clone();
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                let uid = format!("bc-{rate}-{}-{rep}", modes[j]);
                let result = repetition(node, &uid, rate, Some(&mut cache)).await;
                node.stop_loop().await;
                let mut r = result.with_context(|| {
                    format!("cache-full {rate} MiB/s {} repetition {rep}", mode.name)
                })?;
                r.filled = Some((filled, took));
                row.reps.push(r);
            }
        }
        for row in &rate_rows {
            eprintln!(
                "bench: oom cache-full {rate} MiB/s {}: {} of {reps} evicted before any OOM kill",
                row.mode,
                row.reps.iter().filter(|r| r.right && !r.oom_first).count()
            );
        }
        rows.extend(rate_rows);
    }
    Ok(rows)
}

/// The cache-full variant's table and JSON, and its sample count.
fn summarise_cache_full(rows: &[Row], reps: usize, realtime: bool) -> (Table, Value, usize) {
    let mut t = Table::new(
        "2b. OOM avoidance on a node full of page cache: the hog grows by reclaiming it",
        &[
            "rate",
            "mode",
            "OOM killer first",
            "right pod evicted",
            "crossing→SIGKILL p50",
            "crossing→SIGKILL p99",
            "kill at the crossing: at the charge that crossed; page cache followed − the kernel's",
            "killed at the crossing",
            "woken by",
            "kubepods before the hog: usage / inactive file (median)",
        ],
    )
    .text_columns(2);
    let mib = |b: u64| b as f64 / MI as f64;
    let median_of = |v: Vec<u64>| {
        let mut v = v;
        v.sort_unstable();
        v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
    };
    let mut out = Vec::new();
    let mut samples = 0;
    for r in rows {
        let n = r.reps.len();
        samples += n;
        let oom = r.reps.iter().filter(|x| x.oom_first).count();
        let right = r.reps.iter().filter(|x| x.right && !x.oom_first).count();
        let at_crossing = r.reps.iter().filter(|x| x.at_crossing).count();
        let to_kill = Dist::of(
            &r.reps
                .iter()
                .filter_map(|x| x.crossing_to_kill_ns)
                .collect::<Vec<_>>(),
        );
        // Each kill at the crossing: made at the charge that crossed the program's level
        // (usage past it by less than one charge's step), and the program's page cache count
        // against the kernel's folded one.
        let past: Vec<i64> = r.reps.iter().filter_map(Rep::past_level_bytes).collect();
        let parts: Vec<(i64, i64)> = r.reps.iter().filter_map(Rep::kill_parts).collect();
        let within = parts
            .iter()
            .filter(|(over, _)| (0..CHARGE_BATCH_BYTES).contains(over))
            .count();
        let drift_kib = |pick: fn(&mut dyn Iterator<Item = i64>) -> Option<i64>| {
            pick(&mut parts.iter().map(|p| p.1))
                .map_or("-".to_string(), |b| format!("{:+}", b / 1024))
        };
        let mut woken: BTreeMap<&str, usize> = BTreeMap::new();
        for w in r.reps.iter().filter_map(|x| x.woken_by.as_deref()) {
            *woken.entry(w).or_default() += 1;
        }
        let woken_text = woken
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        let usage = median_of(r.reps.iter().map(|x| x.clock.base).collect());
        let inactive = median_of(r.reps.iter().map(|x| x.clock.inactive_file).collect());
        t.row(vec![
            format!("{} MiB/s", r.rate),
            r.mode.to_string(),
            format!("{oom}/{n}"),
            format!("{right}/{n}"),
            to_kill.p50_text(),
            to_kill.p99_text(),
            if parts.is_empty() {
                "-".into()
            } else {
                format!(
                    "{within} of {}; {} to {} KiB",
                    parts.len(),
                    drift_kib(|i| i.min()),
                    drift_kib(|i| i.max()),
                )
            },
            format!("{at_crossing}/{n}"),
            if woken_text.is_empty() {
                "-".into()
            } else {
                woken_text
            },
            format!("{:.0} / {:.0} MiB", mib(usage), mib(inactive)),
        ]);
        out.push(json!({
            "rate_mib_s": r.rate, "mode": r.mode,
            "attached": r.attached.iter().map(|s| s.name()).collect::<Vec<_>>(),
            "repetitions": n, "oom_killer_first": oom, "right_pod_evicted_first": right,
            "crossing_to_kill": to_kill.json(),
            "kill_at_crossing_past_level_bytes": past,
            "kill_at_crossing_at_the_crossing_charge": within,
            "kill_at_crossing_followed_less_kernel_bytes": parts.iter().map(|p| p.1).collect::<Vec<_>>(),
            "killed_at_crossing": at_crossing,
            "woken_by": woken,
            "crossings": r.reps.iter().map(|x| json!({
                "past_level_bytes": x.past_level_bytes(),
                "crossing_kill": x.crossing_kill,
                "clock_basis": x.clock.basis.key(),
                "working_set_level_bytes": x.clock.level,
                "working_set_without_hog_bytes": x.clock.offset,
                "kubepods_before_hog_bytes": x.clock.base,
                "inactive_file_bytes": x.clock.inactive_file,
                "kubepods_after_filling": x.filled.map(|(m, _)| m.json()),
                "filling_seconds": x.filled.map(|(_, d)| d.as_secs_f64()),
                "oom_killer_first": x.oom_first,
                "evicted": x.evicted,
                "killed_at_crossing": x.at_crossing,
                "piece": x.clock.piece,
                "killed_inside_piece": x.clock.incomplete,
                "no_crossing": x.clock.none,
                "kill_after_crossing_ns": x.kill_after_crossing_ns,
                "reaction_ns": x.reaction_ns,
                "event_after_crossing_ns": x.event_after_crossing_ns,
                "event_usage_bytes": x.event_usage,
                "event_threshold_bytes": x.event_threshold,
                "unfolded_working_set_bytes": x.clock.unfolded_working_set,
                "kubepods_after_kill_folded": x.after_kill.map(|m| m.json()),
                "woken_by": x.woken_by,
                "wake_event": x.wake_event,
            })).collect::<Vec<_>>(),
        }));
    }
    let all = || rows.iter().flat_map(|r| &r.reps);
    let uncrossed = all().filter(|x| x.clock.none.is_some()).count();
    let early = all()
        .filter(|x| x.kill_after_crossing_ns.is_some_and(|d| d < 0))
        .count();
    let shares: Vec<f64> = all()
        .filter_map(|x| x.filled.map(|(m, _)| m.inactive_share()))
        .collect();
    let share_text = match (
        shares.iter().copied().reduce(f64::min),
        shares.iter().copied().reduce(f64::max),
    ) {
        (Some(lo), Some(hi)) => format!("{:.0}–{:.0} %", lo * 100.0, hi * 100.0),
        _ => "-".into(),
    };
    t.note(format!(
        "{reps} repetitions per mode and rate, the modes taking turns; the node of the table \
         above (Guaranteed and Burstable pods at 48 MiB each, the BestEffort hog allocating \
         {HOG_MI} MiB); before each repetition a cgroup of the bench's own in kubepods (no \
         pod) writes a file {CACHE_EXTRA_MI} MiB larger than kubepods' limit to /var/tmp (dd, \
         conv=fsync: clean cache), drops its cache and reads it back once (no buffer heads, \
         whose kernel memory would leave the working set with the cache) and idles, so \
         kubepods is at its limit with mostly inactive \
         file pages ({share_text} of its usage after writing), and the hog grows by reclaiming \
         them; the file is removed after the repetition"
    ));
    t.note(format!(
        "crossing→SIGKILL: kubepods' working set passing {} MiB, clocked as the hog's own pod \
         cgroup usage (read by the hog after each 256 KiB piece) plus kubepods' working set \
         without it just before the hog, its statistics folded first (usage stays at the \
         limit while the cache is reclaimed, so kubepods' usage cannot clock it) → the \
         agent's SIGKILL; its error is \
         what the rest of kubepods' working set moves meanwhile (kernel memory leaving with \
         the reclaimed cache, per-CPU charge batches: about 1 MiB in the runs seen, a few ms \
         at 350 MiB/s, so a SIGKILL at the crossing itself can read a few ms, and a hog killed \
         there just short of the clock's level leaves no crossing in its record); {uncrossed} repetitions had no crossing in the record, \
         {early} SIGKILLs came before the clock's crossing and read 0; OOM killer first, \
         right pod evicted and killed at the crossing as in the table above",
        CAPACITY_MI - HARD_MI
    ));
    t.note(
        "kill at the crossing, by the kernel's figures, independent of the hog-record clock: \
         \"at the charge that crossed\" counts kills whose usage (the page counter, from the \
         program's record) was past the program's usage level by less than one charge's step \
         (the counter moves 64 pages, 256 KiB, at a charge); \"page cache followed − the \
         kernel's\" is the program's inactive file count then (its level less the working-set \
         level) less kubepods' inactive file pages read folded once the hog was dead: how far \
         the program's working set was off the kernel's, so how late (+) or early it killed; \
         at 150 MiB/s, 150 KiB is 1 ms",
    );
    t.note(crate::lag::node_scheduling_note(realtime));
    let json = json!({
        "modes": CACHE_FULL_MODES.map(|mi| MODES[mi].name),
        "extra_written_mib": CACHE_EXTRA_MI,
        "repetitions": reps,
        "rows": out,
    });
    (t, json, samples)
}

/// The slowest crossing → SIGKILL of a row taken apart, for its note: where the time went
/// (the kernel's event after the crossing, the event's wait for the loop's pass, the pass to
/// the kill) and whether the loop's thread ran through its pass (its CPU time beside it).
fn slowest_kill(reps: &[Rep]) -> String {
    let Some((i, x)) = reps
        .iter()
        .enumerate()
        .filter(|(_, x)| x.crossing_to_kill_ns.is_some())
        .max_by_key(|(_, x)| x.crossing_to_kill_ns)
    else {
        return String::new();
    };
    let ms = |ns: f64| format!("{:.2} ms", ns / 1e6);
    let mut parts = Vec::new();
    if let Some(e) = x.event_after_crossing_ns {
        parts.push(format!("event {} after the crossing", ms(e as f64)));
    }
    if let (Some(r), Some(o)) = (x.reaction_ns, x.observe_to_kill_ns) {
        parts.push(format!("event → pass {}", ms(r.saturating_sub(o) as f64)));
    }
    if let Some(o) = x.observe_to_kill_ns {
        let cpu = x.observe_to_kill_cpu_ns.map_or(String::new(), |c| {
            format!(" (loop thread on CPU {})", ms(c as f64))
        });
        parts.push(format!("pass → SIGKILL {}{cpu}", ms(o as f64)));
    }
    format!(
        "; the slowest, repetition {i}: {} = {}, woken by {}",
        ms(x.crossing_to_kill_ns.unwrap_or(0) as f64),
        parts.join(" + "),
        x.woken_by.as_deref().unwrap_or("-")
    )
}

fn summarise(
    rows: &[Row],
    reps: usize,
    realtime: bool,
    reaping: bool,
    reclaim: bool,
    close_watch_always: bool,
) -> Part {
    let mut t = Table::new(
        "2. OOM avoidance: BestEffort hog on a 512 MiB node, allocatableMemory.available<128Mi",
        &[
            "rate",
            "mode",
            "OOM killer first",
            "right pod evicted",
            "reaction p50",
            "reaction p99",
            "crossing→released p50",
            "crossing→released p99",
            "SIGKILL→empty p50",
            "SIGKILL→empty p99",
            "killed at the crossing",
            "woken by",
        ],
    )
    .text_columns(2);
    let mut out = Vec::new();
    let mut samples = 0;
    let mut halves_notes: Vec<String> = Vec::new();
    for r in rows {
        let oom = r.reps.iter().filter(|x| x.oom_first).count();
        let right = r.reps.iter().filter(|x| x.right && !x.oom_first).count();
        let wrong: Vec<&str> = r
            .reps
            .iter()
            .filter(|x| !x.right)
            .filter_map(|x| x.evicted.as_deref())
            .collect();
        let reaction = Dist::of(
            &r.reps
                .iter()
                .filter_map(|x| x.reaction_ns)
                .collect::<Vec<_>>(),
        );
        let release = Dist::of(
            &r.reps
                .iter()
                .filter_map(|x| x.crossing_to_released_ns)
                .collect::<Vec<_>>(),
        );
        let halves =
            |f: fn(&Rep) -> Option<u64>| Dist::of(&r.reps.iter().filter_map(f).collect::<Vec<_>>());
        let to_kill = halves(|x| x.crossing_to_kill_ns);
        let to_released = halves(|x| x.kill_to_released_ns);
        let to_empty = halves(|x| x.kill_to_empty_ns);
        let empty_first = r.reps.iter().filter(|x| x.empty_at_first_look).count();
        if r.mode == "full agent" && to_kill.n > 0 {
            halves_notes.push(format!(
                "{} MiB/s full agent: crossing → SIGKILL p50 {} p99 {}, SIGKILL → released (the \
                 agent's record) p50 {} p99 {}{}",
                r.rate,
                to_kill.p50_text(),
                to_kill.p99_text(),
                to_released.p50_text(),
                to_released.p99_text(),
                slowest_kill(&r.reps)
            ));
        }
        let mut woken: BTreeMap<&str, usize> = BTreeMap::new();
        for w in r.reps.iter().filter_map(|x| x.woken_by.as_deref()) {
            *woken.entry(w).or_default() += 1;
        }
        samples += r.reps.len();
        let woken_text = woken
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        let n = r.reps.len();
        let at_crossing = r.reps.iter().filter(|x| x.at_crossing).count();
        t.row(vec![
            format!("{} MiB/s", r.rate),
            r.mode.to_string(),
            format!("{oom}/{n}"),
            format!("{right}/{n}"),
            reaction.p50_text(),
            reaction.p99_text(),
            release.p50_text(),
            release.p99_text(),
            to_empty.p50_text(),
            to_empty.p99_text(),
            format!("{at_crossing}/{n}"),
            if woken_text.is_empty() {
                "-".into()
            } else {
                woken_text
            },
        ]);
        out.push(json!({
            "rate_mib_s": r.rate, "mode": r.mode,
            "attached": r.attached.iter().map(|s| s.name()).collect::<Vec<_>>(),
            "repetitions": n, "oom_killer_first": oom, "right_pod_evicted_first": right,
            "wrong_pods_evicted": wrong,
            "reaction_lag": reaction.json(), "crossing_to_released": release.json(),
            "crossing_to_kill": to_kill.json(), "kill_to_released": to_released.json(),
            "kill_to_empty_watched": to_empty.json(), "empty_at_first_look": empty_first,
            "woken_by": woken,
            "killed_at_crossing": at_crossing,
            "crossings": r.reps.iter().map(|x| json!({
                "killed_at_crossing": x.at_crossing,
                "level_bytes": x.clock.level,
                "inactive_file_bytes": x.clock.inactive_file,
                "kubepods_before_hog_bytes": x.clock.base,
                "piece": x.clock.piece,
                "killed_inside_piece": x.clock.incomplete,
                "no_crossing": x.clock.none,
                "mean_burst_ns": x.clock.mean_burst_ns,
                "fraction": x.clock.fraction,
                "kill_after_crossing_ns": x.kill_after_crossing_ns,
                "kill_to_empty_watched_ns": x.kill_to_empty_ns,
                "kill_to_released_ns": x.kill_to_released_ns,
                "reaction_ns": x.reaction_ns,
                "observe_to_kill_ns": x.observe_to_kill_ns,
                "observe_to_kill_cpu_ns": x.observe_to_kill_cpu_ns,
                "event_after_crossing_ns": x.event_after_crossing_ns,
                "event_usage_past_level_bytes":
                    x.event_usage.map(|u| u.wrapping_sub(x.clock.level) as i64),
            })).collect::<Vec<_>>(),
        }));
    }
    t.note(format!(
        "{reps} repetitions per mode and rate, the modes taking turns (one repetition of \
         each per round, in an order rotated every round); Guaranteed and Burstable pods hold 48 MiB each, \
         the BestEffort pod allocates 600 MiB (the node has 512 MiB) with restartPolicy Never; \
         all pods at oom_score_adj 0 (the Guaranteed -997 needs CAP_SYS_RESOURCE)"
    ));
    t.note(
        "OOM killer first: a pod's memcg oom_kill counter moved before the agent's SIGKILL (or with \
         no eviction); right pod evicted: the BestEffort hog evicted with no OOM kill before it"
            .to_string(),
    );
    t.note(
        "killed at the crossing: the eBPF charge program sent the SIGKILL itself, the hog being \
         the staged victim and the task charging the crossing page (killAtCrossing); its \
         reaction is 0 from its own record and its time is the record's, and the pass → SIGKILL \
         figures count the loop's kills only"
            .to_string(),
    );
    let added = rows
        .iter()
        .flat_map(|r| &r.reps)
        .map(|x| x.clock.inactive_file);
    let mib = |b: u64| format!("{:.1}", b as f64 / MI as f64);
    let added = match (added.clone().min(), added.max()) {
        (Some(lo), Some(hi)) => format!("{}–{} MiB", mib(lo), mib(hi)),
        _ => "-".to_string(),
    };
    let all = || rows.iter().flat_map(|r| &r.reps);
    let bursts = all().filter_map(|x| x.clock.mean_burst_ns);
    let us = |ns: u64| format!("{:.0}", ns as f64 / 1e3);
    let bursts = match (bursts.clone().min(), bursts.max()) {
        (Some(lo), Some(hi)) => format!("{}–{} µs", us(lo), us(hi)),
        _ => "-".to_string(),
    };
    let killed_inside = all().filter(|x| x.clock.incomplete).count();
    let uncrossed = all().filter(|x| x.clock.none.is_some()).count();
    let first_look = all().filter(|x| x.empty_at_first_look).count();
    let early = all()
        .filter(|x| x.kill_after_crossing_ns.is_some_and(|d| d < 0))
        .count();
    t.note(format!(
        "reaction: the decision's waking kernel event → SIGKILL (decisions the loop's own close \
         watch woke have no kernel event and are left out); crossing→released: the working-set \
         crossing, where the threshold is met, by the hog's own clock → the agent's release \
         record (the victim's pod cgroup empty and its usage no longer falling, as the loop \
         looks every close_poll); SIGKILL→empty: the agent's SIGKILL → the victim's pod cgroup \
         empty by the bench's own 100 µs watch, begun when the eviction's record arrives, as \
         the reference row times it ({first_look} found it empty at the first look, an upper \
         bound). The hog records CLOCK_MONOTONIC before and after touching each 256 KiB piece and \
         kubepods' usage after; the crossing is where kubepods' usage reaches 384 MiB + \
         kubepods' inactive_file just before the hog started ({added} \
         added over the repetitions), placed linearly inside the crossing piece's touch burst \
         by the usage it added, so its precision is one burst (a hog's mean burst {bursts}). \
         {killed_inside} crossings fell in a piece the hog was killed inside (taken as 256 KiB \
         over the hog's mean burst); {uncrossed} repetitions had no crossing in the record and \
         have no figure; {early} SIGKILLs came before the clock's crossing and read 0"
    ));
    for n in halves_notes {
        t.note(if reaping {
            format!(
                "{n} (the agent reaps the victim's memory with process_mrelease right after \
                 the SIGKILL; the cgroup empties when the victim has also exited)"
            )
        } else {
            format!("{n} (--no-mrelease: the memory comes back through the victim's exit)")
        });
    }
    t.note(crate::lag::node_scheduling_note(realtime));
    t.note(
        "single-source modes: that source alone plus the loop's own 10 s re-check; poll modes: \
         the tick alone with the loop re-reading only on it, as the kubelet does (no 1 ms close \
         watch), the hog started at a different phase of the tick each repetition, as against \
         a tick running all along"
            .to_string(),
    );
    if close_watch_always {
        t.note(
            "--close-watch-always: the loops re-read every 1 ms near the threshold even while \
             an armed eBPF slot watches it (kernel_watched_poll = close_poll)"
                .to_string(),
        );
    }
    if reclaim {
        t.note(
            "--memory-reclaim: every loop started with memoryReclaim.enabled (timeout 100ms); \
             on cgroup v1 the agent warns and turns it off at start, as it would for a user"
                .to_string(),
        );
    }
    Part {
        key: "oom",
        tables: vec![t],
        json: json!({
            "capacity_mib": CAPACITY_MI, "hard_threshold": "allocatableMemory.available<128Mi",
            "process_mrelease": reaping, "memory_reclaim": reclaim,
            "close_watch_always": close_watch_always,
            "repetitions": reps, "rows": out,
        }),
        samples,
    }
}
