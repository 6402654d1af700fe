//! The layout of `memhog`'s progress record, shared by the hog (which writes it) and the
//! bench (which creates and reads it). Kept to std and constants so `memhog` can include this
//! file alone (`#[path]`) and stay free of the test library's dependencies.
//!
//! The record is a file of native-endian `u64` words, [`WORDS`] per entry. Entry 0 is the hog
//! before its first chunk (both times the same instant, the usage it started with); entry
//! `i + 1` is piece `i`: the hog touches each 1 MiB chunk in [`PIECES_PER_MIB`] pieces of
//! [`PIECE_BYTES`], one memcg charge batch (64 pages) each, the finest step the usage
//! counter it reads moves by. Per entry the hog stores [`BEFORE`] just before touching the piece,
//! then [`AFTER`] and [`USAGE`], and [`SEQ`] last, set to the entry's index + 1: a reader
//! takes an entry as complete only when its `SEQ` word says so, and a `BEFORE` word that is
//! not 0 in an incomplete entry as a piece the hog was inside when it died (each word is one
//! aligned store, so SIGKILL cannot tear a word, only leave later words unwritten).

/// The environment variable naming the record file for `memhog` (absent: no record).
pub const ENV: &str = "MEMHOG_PROGRESS";
/// Bytes per piece: 64 pages of 4 KiB, one memcg charge batch.
pub const PIECE_BYTES: usize = 256 << 10;
/// Pieces per 1 MiB chunk.
pub const PIECES_PER_MIB: usize = (1 << 20) / PIECE_BYTES;
/// Words per entry.
pub const WORDS: usize = 4;
/// CLOCK_MONOTONIC ns just before the hog touched the piece's first page.
pub const BEFORE: usize = 0;
/// CLOCK_MONOTONIC ns just after it touched the piece's last page.
pub const AFTER: usize = 1;
/// The usage read after the touching, bytes, from the cgroup usage file [`USAGE_ENV`] names
/// (the OOM bench: kubepods', the counter the thresholds under test watch).
pub const USAGE: usize = 2;
/// The environment variable naming the usage file [`USAGE`] is read from (required with
/// [`ENV`]).
pub const USAGE_ENV: &str = "MEMHOG_PROGRESS_USAGE";
/// The entry's index + 1, stored last: the entry is complete.
pub const SEQ: usize = 3;
