//! The seeded schedule: every action of a chaos run and when it happens, drawn up front from
//! the seed alone, so the same seed gives the same schedule whatever the node does. Actions
//! that name a pod name it by its number in the schedule; at run time an action on a pod
//! that has already ended does nothing (and is counted as skipped).

use std::fmt;

/// splitmix64: tiny, seedable, and the same on every machine; statistical quality is not
/// the point, reproducibility is.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `pct` percent.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.next_u64() % 100 < pct
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        let i = (self.next_u64() % items.len() as u64) as usize;
        &items[i]
    }
}

/// The pod's QoS class as the spec makes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Qos {
    /// No requests or limits.
    BestEffort,
    /// A memory request below its limit (or no limit).
    Burstable,
    /// Requests equal to limits for cpu and memory.
    Guaranteed,
}

/// What a pod's container does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    /// `sleep`: holds nothing, stops on SIGTERM.
    Sleeper,
    /// memhog: `mib` at `rate` MiB/s (0: as fast as it can), then holds it.
    Hog {
        /// MiB it allocates.
        mib: u64,
        /// MiB/s (0: as fast as it can).
        rate: u64,
        /// Shared anonymous memory (`MEMHOG_SHARED`), which a killed process that cannot
        /// exit does not give back.
        shared: bool,
    },
    /// `procs` memhogs under one shell, `mib` each.
    MultiHog {
        /// How many memhogs.
        procs: u64,
        /// MiB each allocates.
        mib: u64,
        /// MiB/s each.
        rate: u64,
    },
    /// Writes `mib` of page cache to a file on the real disk (in the run's directory), then
    /// sleeps.
    CacheWriter {
        /// MiB written.
        mib: u64,
    },
    /// Starts `procs` sleeping processes: pid pressure.
    ForkStorm {
        /// How many processes.
        procs: u64,
    },
    /// Writes `mib` to the run's small nodefs filesystem, then sleeps.
    DiskFiller {
        /// MiB written.
        mib: u64,
    },
}

/// One pod the schedule starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodPlan {
    /// Its number in the schedule (its name is `c<n>-<kind>`).
    pub n: usize,
    /// Its QoS class.
    pub qos: Qos,
    /// `spec.priority` (2000000000 and above: critical).
    pub priority: i32,
    /// Ignores SIGTERM (dies only by SIGKILL).
    pub stubborn: bool,
    /// `terminationGracePeriodSeconds`.
    pub grace: u64,
    /// What it runs.
    pub work: Work,
}

impl PodPlan {
    /// Its pod name.
    pub fn name(&self) -> String {
        let kind = match self.work {
            Work::Sleeper => "sleeper",
            Work::Hog { .. } => "hog",
            Work::MultiHog { .. } => "multihog",
            Work::CacheWriter { .. } => "cache",
            Work::ForkStorm { .. } => "forks",
            Work::DiskFiller { .. } => "disk",
        };
        format!("c{}-{kind}", self.n)
    }

    /// Whether the kubelet's rules (and the agent's) never evict it.
    pub fn critical(&self) -> bool {
        self.priority >= 2_000_000_000
    }
}

/// One step of the schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Apply a pod.
    Start(PodPlan),
    /// `pod rm` pod number `n` with `grace` seconds.
    Remove {
        /// The pod's number in the schedule.
        n: usize,
        /// `--grace`, seconds.
        grace: u64,
    },
    /// Freeze pod `n`'s processes (v1 freezer) for `ms`, then thaw them.
    Freeze {
        /// The pod's number in the schedule.
        n: usize,
        /// How long it stays frozen.
        ms: u64,
    },
    /// SIGKILL the agent and start it again after `down_ms`.
    KillAgent {
        /// How long it stays down.
        down_ms: u64,
    },
    /// SIGKILL containerd and start it again after `down_ms` (containerd mode only).
    KillContainerd {
        /// How long it stays down.
        down_ms: u64,
    },
}

impl Action {
    /// The action's kind, for the counts.
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Start(p) => match (&p.work, p.stubborn, p.critical()) {
                (_, _, true) => "start-critical",
                (Work::Sleeper, true, _) => "start-stubborn-sleeper",
                (Work::Sleeper, false, _) => "start-sleeper",
                (Work::Hog { shared: true, .. }, _, _) => "start-shared-hog",
                (Work::Hog { .. }, true, _) => "start-stubborn-hog",
                (Work::Hog { .. }, false, _) => "start-hog",
                (Work::MultiHog { .. }, _, _) => "start-multi-process-hog",
                (Work::CacheWriter { .. }, _, _) => "start-page-cache-writer",
                (Work::ForkStorm { .. }, _, _) => "start-fork-storm",
                (Work::DiskFiller { .. }, _, _) => "start-disk-filler",
            },
            Action::Remove { .. } => "remove",
            Action::Freeze { .. } => "freeze",
            Action::KillAgent { .. } => "kill-agent",
            Action::KillContainerd { .. } => "kill-containerd",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Start(p) => write!(
                f,
                "start {} ({:?}, priority {}, grace {}s{}, {:?})",
                p.name(),
                p.qos,
                p.priority,
                p.grace,
                if p.stubborn { ", ignores SIGTERM" } else { "" },
                p.work
            ),
            Action::Remove { n, grace } => write!(f, "remove pod #{n} (grace {grace}s)"),
            Action::Freeze { n, ms } => write!(f, "freeze pod #{n} for {ms} ms"),
            Action::KillAgent { down_ms } => write!(f, "SIGKILL the agent, down {down_ms} ms"),
            Action::KillContainerd { down_ms } => {
                write!(f, "SIGKILL containerd, down {down_ms} ms")
            }
        }
    }
}

/// What the schedule may use: whether Guaranteed pods can run here, whether containerd is
/// there to kill, and how big the node is.
#[derive(Clone, Copy, Debug)]
pub struct Mix {
    /// Guaranteed pods in the mix (the host can run them).
    pub guaranteed: bool,
    /// containerd restarts in the mix.
    pub containerd: bool,
    /// Memory sizes (hogs, page cache) in percent of the host run's 768 MiB node: the same
    /// seed draws the same schedule, its sizes scaled.
    pub size_pct: u64,
}

/// The schedule of a run of `millis`: `(at ms from the start, action)`, in time order. The
/// first action starts a critical pod, so every run has one.
pub fn schedule(seed: u64, millis: u64, mix: Mix) -> Vec<(u64, Action)> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let mut at = 500;
    let mut started = 0usize;
    let mut live: Vec<usize> = Vec::new();
    out.push((
        at,
        Action::Start(PodPlan {
            n: 0,
            qos: Qos::Burstable,
            priority: 2_000_000_000,
            stubborn: false,
            grace: 2,
            work: Work::Sleeper,
        }),
    ));
    started += 1;
    // The pods the schedule started and has not removed; the first (critical) pod stays.
    while at < millis {
        at += rng.range(300, 2500);
        if at >= millis {
            break;
        }
        let roll = rng.range(0, 99);
        let action = if live.len() >= 9 {
            // Keep the node's pod count bounded: remove the oldest the schedule started.
            let n = live.remove(0);
            Action::Remove {
                n,
                grace: rng.range(0, 3),
            }
        } else if roll < 58 || (roll >= 90 && !mix.containerd) {
            let plan = pod(&mut rng, started, mix);
            live.push(started);
            started += 1;
            Action::Start(plan)
        } else if roll < 70 && !live.is_empty() {
            let i = (rng.next_u64() % live.len() as u64) as usize;
            let n = live.remove(i);
            Action::Remove {
                n,
                grace: rng.range(0, 3),
            }
        } else if roll < 78 && !live.is_empty() {
            let n = *rng.pick(&live);
            Action::Freeze {
                n,
                ms: rng.range(500, 4000),
            }
        } else if roll < 90 {
            Action::KillAgent {
                down_ms: rng.range(0, 2000),
            }
        } else {
            Action::KillContainerd {
                down_ms: rng.range(0, 2000),
            }
        };
        out.push((at, action));
    }
    out
}

fn pod(rng: &mut Rng, n: usize, mix: Mix) -> PodPlan {
    // Drawn as for the host, then scaled: the same draws whatever the node's size.
    let size = |mib: u64| (mib * mix.size_pct / 100).max(1);
    let work = match rng.range(0, 99) {
        0..=19 => Work::Sleeper,
        20..=49 => Work::Hog {
            mib: size(rng.range(40, 420)),
            rate: *rng.pick(&[0, 20, 50, 100, 200]),
            shared: rng.chance(20),
        },
        50..=61 => Work::MultiHog {
            procs: rng.range(2, 4),
            mib: size(rng.range(20, 120)),
            rate: *rng.pick(&[20, 50, 100]),
        },
        // Under containerd the run's writable layers are on a tmpfs (its imagefs), where
        // written pages are shmem, not page cache: a sleeper instead.
        62..=75 if mix.containerd => {
            let _ = rng.range(50, 400);
            Work::Sleeper
        }
        62..=75 => Work::CacheWriter {
            mib: size(rng.range(50, 400)),
        },
        76..=87 => Work::ForkStorm {
            procs: rng.range(300, 900),
        },
        _ => Work::DiskFiller {
            mib: rng.range(8, 30),
        },
    };
    let qos = match rng.range(0, 9) {
        0..=4 => Qos::BestEffort,
        5..=7 => Qos::Burstable,
        _ if mix.guaranteed => Qos::Guaranteed,
        _ => Qos::Burstable,
    };
    // Critical pods only sleep: one that held memory, pids or disk could never be evicted,
    // and the node would evict everything else around it, by the kubelet's rules.
    let priority = match rng.range(0, 19) {
        0 if work == Work::Sleeper => 2_000_000_000,
        0 => 0,
        1..=4 => 1000,
        5..=7 => -10,
        _ => 0,
    };
    PodPlan {
        n,
        qos,
        priority,
        stubborn: rng.chance(25),
        grace: rng.range(0, 5),
        work,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIX: Mix = Mix {
        guaranteed: false,
        containerd: false,
        size_pct: 100,
    };

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
        let a = schedule(7, 120_000, MIX);
        assert_eq!(a, schedule(7, 120_000, MIX));
        assert_ne!(a, schedule(8, 120_000, MIX));
        assert!(a.len() > 40, "{}", a.len());
        assert!(a.windows(2).all(|w| w[0].0 < w[1].0), "in time order");
    }

    #[test]
    fn a_long_schedule_has_every_kind_of_action_and_a_critical_pod_first() {
        let s = schedule(1, 30 * 60_000, MIX);
        let kinds: std::collections::BTreeSet<&str> = s.iter().map(|(_, a)| a.kind()).collect();
        for k in [
            "start-critical",
            "start-sleeper",
            "start-stubborn-sleeper",
            "start-hog",
            "start-stubborn-hog",
            "start-shared-hog",
            "start-multi-process-hog",
            "start-page-cache-writer",
            "start-fork-storm",
            "start-disk-filler",
            "remove",
            "freeze",
            "kill-agent",
        ] {
            assert!(kinds.contains(k), "{k} missing from {kinds:?}");
        }
        assert!(!kinds.contains("kill-containerd"), "not in process mode");
        assert_eq!(s[0].1.kind(), "start-critical");
        // No Guaranteed pods unless the host can run them.
        assert!(s
            .iter()
            .all(|(_, a)| !matches!(a, Action::Start(p) if p.qos == Qos::Guaranteed)));
    }

    #[test]
    fn containerd_mode_kills_containerd_too_and_writes_no_page_cache() {
        let mix = Mix {
            guaranteed: false,
            containerd: true,
            size_pct: 100,
        };
        let s = schedule(3, 30 * 60_000, mix);
        let kinds: std::collections::BTreeSet<&str> = s.iter().map(|(_, a)| a.kind()).collect();
        assert!(kinds.contains("kill-containerd"), "{kinds:?}");
        assert!(kinds.contains("kill-agent"), "{kinds:?}");
        assert!(!kinds.contains("start-page-cache-writer"), "{kinds:?}");
    }

    #[test]
    fn a_smaller_node_scales_the_sizes_and_keeps_the_schedule() {
        let half = Mix {
            size_pct: 50,
            ..MIX
        };
        let (a, b) = (schedule(9, 600_000, MIX), schedule(9, 600_000, half));
        assert_eq!(a.len(), b.len());
        let mib = |w: &Work| match *w {
            Work::Hog { mib, .. } | Work::CacheWriter { mib } => Some(mib),
            Work::MultiHog { mib, .. } => Some(mib),
            _ => None,
        };
        let mut scaled = 0;
        for ((at_a, x), (at_b, y)) in a.iter().zip(&b) {
            assert_eq!(at_a, at_b);
            assert_eq!(x.kind(), y.kind());
            if let (Action::Start(p), Action::Start(q)) = (x, y) {
                if let (Some(m), Some(n)) = (mib(&p.work), mib(&q.work)) {
                    assert_eq!(n, (m / 2).max(1), "{x} / {y}");
                    scaled += 1;
                }
            }
        }
        assert!(scaled > 5, "{scaled} sized pods");
    }

    #[test]
    fn splitmix_matches_its_reference_output() {
        // The first output of splitmix64 seeded with 0 (Vigna's reference implementation).
        assert_eq!(Rng::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    }
}
