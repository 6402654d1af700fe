//! What a chaos run tells at its end: the counts of every action and invariant check, the
//! excused OOM kills by cause, and what the agent did.

use std::fmt::Write as _;

use super::Outcome;

impl Outcome {
    /// The run's report, one `chaos: ` heading per part, as the `chaos` binary prints it and
    /// the v2 guest's check returns it.
    pub fn report(&self, seed: u64) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "chaos: seed {seed}");
        if let Some(g) = &self.guaranteed {
            let _ = writeln!(s, "chaos: {g}");
        }
        let _ = writeln!(s, "chaos: actions (kind: scheduled / done):");
        for (k, (sched, done)) in &self.actions {
            let _ = writeln!(s, "  {k:<26} {sched:>5} / {done}");
        }
        let _ = writeln!(s, "chaos: invariant checks:");
        for (k, n) in &self.tally.checks {
            let _ = writeln!(s, "  {k:<30} {n:>7}");
        }
        let _ = writeln!(s, "chaos: kernel OOM kills excused, by cause:");
        if self.tally.exceptions.is_empty() {
            let _ = writeln!(s, "  none");
        }
        for (k, n) in &self.tally.exceptions {
            let _ = writeln!(s, "  {n:>4}  {k}");
        }
        let _ = writeln!(s, "chaos: what the agent did:");
        for (k, n) in &self.agent {
            let _ = writeln!(s, "  {k:<30} {n:>5}");
        }
        let _ = writeln!(
            s,
            "chaos: agent peak RSS {:.1} MiB",
            self.peak_rss_kib as f64 / 1024.0
        );
        s
    }
}
