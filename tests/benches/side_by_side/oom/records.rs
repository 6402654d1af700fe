//! What part 2 keeps of each repetition ([`Rep`], per mode and rate in a [`Row`]) and the
//! crossing clock it is timed by: the hog's progress record read against the level the
//! threshold is met at ([`Clock`], comparing what [`Basis`] says), and what a repetition
//! keeps of it ([`ClockRep`]).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use reactor::act::cgroups::CgroupPath;
use reactor::sense::memcg::working_set_level;
use reactor::sense::Source;
use reactor_tests::hog_record::{self, layout, RecordFile};
use reactor_tests::node::{Node, MI};

use super::modes::HOG_MI;
use crate::page_cache::MemStat;

/// What one repetition came to.
#[derive(Default)]
pub(crate) struct Rep {
    pub(super) oom_first: bool,
    pub(super) evicted: Option<String>,
    pub(super) right: bool,
    pub(super) reaction_ns: Option<u64>,
    /// The reaction's second part: the pass's observation, from its start, → the SIGKILL
    /// (the decision's `decide_to_kill_ns`); the first part, event → observed, is the rest.
    pub(super) observe_to_kill_ns: Option<u64>,
    /// The loop thread's CPU time over the same span (`decide_to_kill_cpu_ns`): near it when
    /// the thread ran throughout, well below it when it waited.
    pub(super) observe_to_kill_cpu_ns: Option<u64>,
    pub(crate) crossing_to_released_ns: Option<u64>,
    /// The two halves of it: crossing → the agent's SIGKILL, and SIGKILL → the victim's
    /// cgroup empty (its memory reaped by `process_mrelease` in between, where the kernel
    /// has it).
    pub(crate) crossing_to_kill_ns: Option<u64>,
    pub(super) kill_to_released_ns: Option<u64>,
    /// SIGKILL → the victim's pod cgroup empty by the bench's own 100 µs watch (begun when
    /// the eviction's record arrives), timed as the reference row times the victim's exit;
    /// `released` above is the agent's own record, which also waits for the usage to stop
    /// falling and looks every `close_poll`.
    pub(crate) kill_to_empty_ns: Option<u64>,
    /// The watch's first look already found the cgroup empty (its figure is an upper bound).
    pub(super) empty_at_first_look: bool,
    /// SIGKILL − crossing, signed: below 0 the agent killed before the clock's crossing
    /// (the figures above read 0 then).
    pub(super) kill_after_crossing_ns: Option<i64>,
    /// For a decision a kernel event woke: the event's time − the crossing, signed, and the
    /// usage it saw where it carries one (the eBPF record's page counter, the v1 watch's read
    /// at wake-up). A check on the clock: an eBPF event is stamped at the charge that met its
    /// level, at most 16 pages per CPU after the crossing.
    pub(super) event_after_crossing_ns: Option<i64>,
    pub(super) event_usage: Option<u64>,
    /// The waking eBPF record's usage level (a working-set slot's level plus the inactive
    /// file pages it had followed to the crossing).
    pub(super) event_threshold: Option<u64>,
    /// The cache-full variant: kubepods read folded once the victim's memory was back, the
    /// hog dead and the cache no longer reclaimed: its inactive file pages against those
    /// the program followed to the crossing (`event_threshold` − the level).
    pub(super) after_kill: Option<MemStat>,
    /// A kill at the crossing: when, usage then and the usage level the program compared it
    /// with (the decision's `crossing_kill`).
    pub(super) crossing_kill: Option<reactor::reactor::CrossingKillFigures>,
    pub(super) woken_by: Option<String>,
    /// The waking event as the record prints it (kind, level, usage, a kill at the
    /// crossing): which record a decision the kernel did not complete answered.
    pub(super) wake_event: Option<String>,
    /// The kill was the kernel's, at the crossing (`killAtCrossing`: the staged victim was
    /// charging the crossing page).
    pub(super) at_crossing: bool,
    /// The crossing as the hog's record placed it (see [`Clock`]).
    pub(super) clock: ClockRep,
    /// The cache-full variant: kubepods just after its cache was written, and how long the
    /// writing took.
    pub(super) filled: Option<(MemStat, Duration)>,
}

/// The most a single charge moves a memory cgroup's page counter: the kernel charges
/// `MEMCG_CHARGE_BATCH` (64) pages at once and hands them out from a per-CPU stock, so usage
/// steps by up to 256 KiB at the charge that crosses a level.
pub(super) const CHARGE_BATCH_BYTES: i64 = 64 * 4096;

impl Rep {
    /// A kill at the crossing on a node full of page cache: how far kubepods' working set was
    /// past its level when the program sent SIGKILL, by the kernel's own figures: usage at
    /// that charge (the page counter, exact) less kubepods' inactive file pages read folded
    /// once the hog was dead and the cache no longer reclaimed. Independent of the program's
    /// own page-cache count and of the hog-record clock, whose error is the rest of
    /// kubepods' working set moving by up to about 1 MiB.
    pub(super) fn past_level_bytes(&self) -> Option<i64> {
        let at = self.crossing_kill?;
        let after = self.after_kill?;
        let ws = i128::from(at.usage_bytes) - i128::from(after.inactive_file);
        i64::try_from(ws - i128::from(self.clock.level)).ok()
    }

    /// The two parts of [`Rep::past_level_bytes`]: usage past the program's own usage level
    /// at the charge it killed at (0 to one charge's step when it killed at the charge that
    /// crossed), and the page cache the program had followed less the kernel's folded count
    /// (the program's level is the working-set level plus what it followed).
    pub(super) fn kill_parts(&self) -> Option<(i64, i64)> {
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
    pub(super) basis: Basis,
    /// The usage the threshold is met at: [`working_set_level`]`(384 MiB, inactive_file)`;
    /// for [`Basis::WorkingSet`], the working set it is met at (384 MiB here, 412 MiB in
    /// part 8).
    pub(super) level: u64,
    /// [`Basis::WorkingSet`]: kubepods' working set without the hog, added to its usage.
    pub(super) offset: u64,
    /// kubepods' inactive file pages just before the hog started, added to the 384 MiB.
    pub(super) inactive_file: u64,
    /// kubepods' usage then (the Guaranteed and Burstable pods and the rest), U0.
    pub(super) base: u64,
    /// The piece the crossing fell in, and whether the hog died inside it (placed from its
    /// start time and the mean burst, not its own).
    pub(super) piece: Option<usize>,
    pub(super) incomplete: bool,
    /// How far into that piece's burst.
    pub(super) fraction: Option<f64>,
    /// Why there is no crossing, if there is none.
    pub(crate) none: Option<&'static str>,
    /// The mean of this hog's complete pieces' touch bursts: the clock's resolution.
    pub(super) mean_burst_ns: Option<u64>,
    /// [`Basis::WorkingSet`]: kubepods' working set as a plain `memory.stat` read gave it
    /// just before the folded read the clock is set from ([`crate::page_cache::folded_stat`]):
    /// what the clock would have been off by without the fold.
    pub(super) unfolded_working_set: Option<u64>,
}

/// One mode at one rate.
pub(crate) struct Row {
    pub(crate) rate: u64,
    pub(crate) mode: &'static str,
    pub(super) attached: Vec<Source>,
    pub(crate) reps: Vec<Rep>,
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
    pub(super) fn key(self) -> &'static str {
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
