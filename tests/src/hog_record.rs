//! `memhog`'s progress record (see [`layout`]) from the reader's side: the file made for it
//! before the hog starts, its entries read back after, and the workload's own clock for when
//! a cgroup's usage crossed a level, for the OOM bench.
//!
//! The clock is the hog's: the CLOCK_MONOTONIC times it took just before and just after
//! touching each 256 KiB piece ([`layout::PIECE_BYTES`], one memcg charge batch), with the
//! watched cgroup's usage after. A kernel notification as the
//! reference (a v1 memcg threshold eventfd) is checked only every 128 charged pages per CPU
//! and came after an eBPF-woken SIGKILL, so it cannot time modes that react faster than
//! that. The hog's record places the crossing inside one piece's touch burst, linearly by
//! the usage the piece added; its precision is that burst (a quarter of a 1 MiB chunk's
//! page faults), and the error is the burst's departure from linear.

use std::io::Write;
use std::path::Path;

pub mod layout;

/// One entry of the record as read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// Its sequence word is set: every field is there.
    Complete {
        /// Just before touching the piece, CLOCK_MONOTONIC ns.
        before_ns: u64,
        /// Just after touching it.
        after_ns: u64,
        /// The watched cgroup's usage after, bytes.
        usage: u64,
    },
    /// The hog stored the time it began the piece and died before finishing it.
    Started {
        /// Just before touching the piece.
        before_ns: u64,
    },
    /// Nothing stored.
    Unwritten,
}

/// Reads a record's bytes into entries (entry 0: the hog before its first chunk; entry
/// `i + 1`: piece `i`). A trailing partial entry is ignored.
pub fn parse(bytes: &[u8]) -> Vec<Slot> {
    bytes
        .chunks_exact(layout::WORDS * 8)
        .enumerate()
        .map(|(i, e)| {
            let word = |f: usize| {
                let mut w = [0u8; 8];
                w.copy_from_slice(&e[f * 8..f * 8 + 8]);
                u64::from_ne_bytes(w)
            };
            if word(layout::SEQ) == i as u64 + 1 {
                Slot::Complete {
                    before_ns: word(layout::BEFORE),
                    after_ns: word(layout::AFTER),
                    usage: word(layout::USAGE),
                }
            } else if word(layout::BEFORE) != 0 {
                Slot::Started {
                    before_ns: word(layout::BEFORE),
                }
            } else {
                Slot::Unwritten
            }
        })
        .collect()
}

/// Where the crossing was placed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Crossing {
    /// The crossing, CLOCK_MONOTONIC ns.
    pub at_ns: u64,
    /// The piece it fell in (0-based; entry `piece + 1`).
    pub piece: usize,
    /// The hog died inside that piece: the crossing is placed from the piece's start time,
    /// the earlier pieces' mean burst and an assumed whole piece of charge.
    pub incomplete: bool,
    /// How far into the piece's burst it was placed (0 at its start, 1 at its end).
    pub fraction: f64,
}

/// Why no crossing could be placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoCrossing {
    /// Entry 0 is not complete: the hog never started its record.
    NoRecord,
    /// The level was already met before the hog's first piece.
    PastAtStart,
    /// The record ends below the level (the hog died first, or another cgroup's charge
    /// met it).
    NotReached,
    /// The hog died inside its first piece, with no earlier burst to time it by.
    NoBurst,
}

impl NoCrossing {
    /// For the JSON.
    pub fn why(self) -> &'static str {
        match self {
            NoCrossing::NoRecord => "no record: the hog never completed its start entry",
            NoCrossing::PastAtStart => "the level was met before the hog's first piece",
            NoCrossing::NotReached => "the hog's record ends below the level",
            NoCrossing::NoBurst => "the hog died inside its first piece, no burst to time it",
        }
    }
}

/// When `base` + the recorded usage first reached `level`: in the first piece `i` whose usage
/// after does, at `before_i + f·(after_i − before_i)` with `f = (level − (base +
/// usage_{i−1})) / (usage_i − usage_{i−1})` clamped to [0, 1], the charge taken as linear in
/// time across the piece's touch burst. `base` is what the recorded usage leaves out of the
/// cgroup the level is on: 0 when the record reads that cgroup itself, as the OOM bench's
/// does (kubepods'), where adding a figure read before the hog started let charges handed
/// back in between place the crossing a chunk early.
///
/// If the hog died inside the piece that would cross (its start time stored, no complete
/// entry), the piece is assumed to add `piece_bytes` ([`layout::PIECE_BYTES`] for `memhog`'s
/// record) and to take the earlier pieces' mean burst.
pub fn crossing(
    slots: &[Slot],
    base: u64,
    level: u64,
    piece_bytes: u64,
) -> Result<Crossing, NoCrossing> {
    let Some(Slot::Complete { usage: start, .. }) = slots.first() else {
        return Err(NoCrossing::NoRecord);
    };
    let mut prev = *start;
    if base.saturating_add(prev) >= level {
        return Err(NoCrossing::PastAtStart);
    }
    // The bursts seen so far: their total and count, for a piece the hog died in.
    let (mut burst_sum, mut bursts) = (0u64, 0u64);
    let fraction = |prev: u64, added: u64| -> f64 {
        let needed = level - base - prev;
        (needed as f64 / added as f64).clamp(0.0, 1.0)
    };
    for (i, slot) in slots.iter().enumerate().skip(1) {
        match *slot {
            Slot::Complete {
                before_ns,
                after_ns,
                usage,
            } => {
                let burst = after_ns.saturating_sub(before_ns);
                if base.saturating_add(usage) >= level {
                    let f = fraction(prev, usage - prev);
                    return Ok(Crossing {
                        at_ns: before_ns + (f * burst as f64).round() as u64,
                        piece: i - 1,
                        incomplete: false,
                        fraction: f,
                    });
                }
                burst_sum += burst;
                bursts += 1;
                prev = usage;
            }
            Slot::Started { before_ns } => {
                if base.saturating_add(prev).saturating_add(piece_bytes) < level {
                    return Err(NoCrossing::NotReached);
                }
                if bursts == 0 {
                    return Err(NoCrossing::NoBurst);
                }
                let f = fraction(prev, piece_bytes);
                let mean = burst_sum as f64 / bursts as f64;
                return Ok(Crossing {
                    at_ns: before_ns + (f * mean).round() as u64,
                    piece: i - 1,
                    incomplete: true,
                    fraction: f,
                });
            }
            Slot::Unwritten => break,
        }
    }
    Err(NoCrossing::NotReached)
}

/// The mean touch burst (after − before) of the record's complete pieces, ns; `None`
/// without any. The clock's resolution: a crossing is placed inside one such burst.
pub fn mean_burst_ns(slots: &[Slot]) -> Option<u64> {
    let bursts: Vec<u64> = slots
        .iter()
        .skip(1)
        .filter_map(|s| match *s {
            Slot::Complete {
                before_ns,
                after_ns,
                ..
            } => Some(after_ns.saturating_sub(before_ns)),
            _ => None,
        })
        .collect();
    let n = u64::try_from(bursts.len()).ok().filter(|&n| n > 0)?;
    Some(bursts.iter().sum::<u64>() / n)
}

/// A record file for one hog run: made in `/dev/shm` (tmpfs: its pages cannot be dropped
/// and refaulted, which would charge them to whoever touched them next) or the temp dir,
/// its pages written here, so they are charged to the caller's cgroup and not to the hog's.
/// Removed on drop.
pub struct RecordFile {
    file: tempfile::NamedTempFile,
}

impl RecordFile {
    /// A zeroed record for a hog of `total_mib` chunks (`total_mib` × 4 pieces + 1 entries).
    pub fn create(total_mib: u64) -> std::io::Result<RecordFile> {
        let shm = Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let mut file = tempfile::Builder::new()
            .prefix("memhog-progress-")
            .tempfile_in(dir)?;
        let len = (total_mib as usize * layout::PIECES_PER_MIB + 1) * layout::WORDS * 8;
        // Written, not just sized: a sparse file's pages would be allocated, and charged, at
        // the hog's first store into each.
        file.write_all(&vec![0u8; len.next_multiple_of(4096)])?;
        file.flush()?;
        Ok(RecordFile { file })
    }

    /// Its path, for `memhog`'s [`layout::ENV`].
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Its entries as they are now.
    pub fn read(&self) -> std::io::Result<Vec<Slot>> {
        Ok(parse(&std::fs::read(self.file.path())?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::MI;

    const MS: u64 = 1_000_000;

    /// A hog started at 1 s with 10 MiB charged, then pieces every 3 ms, each touched in
    /// 400 µs and adding 1 MiB (the piece size these checks pass).
    fn record(chunks: usize) -> Vec<Slot> {
        let mut s = vec![Slot::Complete {
            before_ns: 1000 * MS,
            after_ns: 1000 * MS,
            usage: 10 * MI,
        }];
        for i in 0..chunks as u64 {
            let before_ns = 1000 * MS + 3 * MS * i;
            s.push(Slot::Complete {
                before_ns,
                after_ns: before_ns + 400_000,
                usage: (11 + i) * MI,
            });
        }
        s
    }

    #[test]
    fn mid_chunk() {
        // base 100 MiB: the hog's usage must reach 20.25 MiB, a quarter into chunk 10
        // (20 → 21 MiB, started at 1030 ms).
        let level = 100 * MI + 20 * MI + MI / 4;
        let c = crossing(&record(20), 100 * MI, level, MI).expect("crossed");
        assert_eq!(
            c,
            Crossing {
                at_ns: 1030 * MS + 100_000,
                piece: 10,
                incomplete: false,
                fraction: 0.25
            }
        );
    }

    #[test]
    fn on_a_chunk_boundary() {
        // Exactly chunk 9's usage after (20 MiB): met at its end, not in chunk 10.
        let c = crossing(&record(20), 100 * MI, 120 * MI, MI).expect("crossed");
        assert_eq!(c.piece, 9);
        assert_eq!(c.at_ns, 1027 * MS + 400_000);
        // One byte more: the very start of chunk 10 (f = 1/1 MiB, rounds to its start).
        let c = crossing(&record(20), 100 * MI, 120 * MI + 1, MI).expect("crossed");
        assert_eq!(c.piece, 10);
        assert_eq!(c.at_ns, 1030 * MS);
    }

    #[test]
    fn killed_inside_the_crossing_chunk() {
        // Chunks 0..=9 complete (usage 20 MiB), chunk 10 started at 1030 ms and not finished.
        let mut s = record(10);
        s.push(Slot::Started {
            before_ns: 1030 * MS,
        });
        s.push(Slot::Unwritten);
        let level = 100 * MI + 20 * MI + MI / 2;
        let c = crossing(&s, 100 * MI, level, MI).expect("crossed");
        assert_eq!(mean_burst_ns(&s), Some(400_000));
        // Half of 1 MiB, half the mean 400 µs burst.
        assert_eq!(
            c,
            Crossing {
                at_ns: 1030 * MS + 200_000,
                piece: 10,
                incomplete: true,
                fraction: 0.5
            }
        );
        // A level more than 1 MiB on is not reached by the unfinished chunk.
        assert_eq!(
            crossing(&s, 100 * MI, 100 * MI + 22 * MI, MI),
            Err(NoCrossing::NotReached)
        );
    }

    #[test]
    fn never_crossed() {
        let mut s = record(10);
        s.push(Slot::Unwritten);
        assert_eq!(
            crossing(&s, 100 * MI, 200 * MI, MI),
            Err(NoCrossing::NotReached)
        );
        assert_eq!(
            crossing(&record(10), 100 * MI, 200 * MI, MI),
            Err(NoCrossing::NotReached)
        );
        assert_eq!(
            crossing(&record(10), 100 * MI, 105 * MI, MI),
            Err(NoCrossing::PastAtStart)
        );
        assert_eq!(
            crossing(&[Slot::Unwritten], 0, MI, MI),
            Err(NoCrossing::NoRecord)
        );
        assert_eq!(
            crossing(
                &[record(0)[0], Slot::Started { before_ns: 5 }],
                0,
                10 * MI + 1,
                MI
            ),
            Err(NoCrossing::NoBurst)
        );
    }

    #[test]
    fn parse_tells_complete_from_torn() {
        let mut bytes = vec![0u8; 4 * layout::WORDS * 8];
        let put = |b: &mut [u8], entry: usize, field: usize, v: u64| {
            let at = (entry * layout::WORDS + field) * 8;
            b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        };
        for (f, v) in [(layout::BEFORE, 7), (layout::AFTER, 7), (layout::USAGE, 3)] {
            put(&mut bytes, 0, f, v);
        }
        put(&mut bytes, 0, layout::SEQ, 1);
        // Entry 1: every field but its sequence word (torn), entry 2: only its start.
        put(&mut bytes, 1, layout::BEFORE, 8);
        put(&mut bytes, 1, layout::AFTER, 9);
        put(&mut bytes, 2, layout::BEFORE, 10);
        // Entry 3: a sequence word of another entry is not this one's.
        put(&mut bytes, 3, layout::SEQ, 1);
        assert_eq!(
            parse(&bytes),
            vec![
                Slot::Complete {
                    before_ns: 7,
                    after_ns: 7,
                    usage: 3
                },
                Slot::Started { before_ns: 8 },
                Slot::Started { before_ns: 10 },
                Slot::Unwritten,
            ]
        );
    }
}
