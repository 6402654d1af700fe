//! Part 2's modes and the modelled node's figures: which sources each mode's loop listens
//! to ([`MODES`], by short name [`MODE_KEYS`]), the variants ([`VARIANT_KEYS`]), the node's
//! and the hog's sizes, and how the modes are run: a mode's loop started
//! ([`start_mode_with`]), its hog started against the tick ([`tick_phase`]) and the modes'
//! order in a round ([`round_order`]).

use std::time::Duration;

use reactor::reactor::ReactorSettings;
use reactor_tests::node::Node;

pub(super) const CAPACITY_MI: u64 = 512;
/// The variants' short names for `--oom-variants`: the node as it is, and full of page cache.
pub(crate) const VARIANT_KEYS: [&str; 2] = ["plain", "cache-full"];
/// The modes the cache-full variant runs, by index into [`MODES`]: the full agent and eBPF
/// only, the two whose eBPF threshold and its tripwire the page cache concerns.
pub(super) const CACHE_FULL_MODES: [usize; 2] = [0, 1];
/// How much more than kubepods' limit the cache-full variant writes, so the cache fills it.
pub(super) const CACHE_EXTRA_MI: u64 = 128;
pub(super) const HARD_MI: u64 = 128;
/// What the BestEffort hog allocates, MiB (the node has 512).
pub(crate) const HOG_MI: u64 = 600;

/// Which sources the loop listens to.
pub(crate) struct Mode {
    pub(super) name: &'static str,
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
pub(super) fn round_order(modes: usize, rep: usize) -> Vec<usize> {
    let half = modes.div_ceil(2);
    let rotate = |lo: usize, hi: usize| {
        let n = hi - lo;
        (0..n).map(move |i| lo + (i + rep) % n)
    };
    rotate(0, half).chain(rotate(half, modes)).collect()
}

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
pub(super) fn tick_phase(mode: &Mode, rep: usize) -> Duration {
    let poll_only = !(mode.ebpf || mode.psi || mode.memcg);
    match mode.poll {
        Some(interval) if poll_only => {
            interval.mul_f64(((rep as f64 + 0.5) * 0.618_033_988_749_895).fract())
        }
        _ => Duration::ZERO,
    }
}
