//! Detection lag, per source: how long an event waited between the kernel (or the source's
//! wake-up) and the consumer taking it.
//!
//! The lag is the figure this agent exists to make small, so every event is measured. The
//! histogram uses fixed, explicit bucket boundaries ([`BUCKET_BOUNDS_NS`]) so the same counts
//! can later be exposed as a Prometheus histogram without re-bucketing, and a snapshot gives
//! the count, p50, p99 and max that `reactor watch` prints. Quantiles are estimated the way
//! Prometheus' `histogram_quantile` does (linear inside the bucket), clamped to the exact
//! minimum and maximum seen, so a single sample reports its own value.

use std::collections::BTreeMap;

use serde::Serialize;

use super::event::Source;

/// Upper bounds (inclusive, nanoseconds) of the lag buckets: a 1-2-5 series from 1 µs to 50 s.
/// Anything above the last bound lands in the overflow (`+Inf`) bucket.
pub(crate) const BUCKET_BOUNDS_NS: [u64; 24] = [
    1_000,
    2_000,
    5_000,
    10_000,
    20_000,
    50_000,
    100_000,
    200_000,
    500_000,
    1_000_000,
    2_000_000,
    5_000_000,
    10_000_000,
    20_000_000,
    50_000_000,
    100_000_000,
    200_000_000,
    500_000_000,
    1_000_000_000,
    2_000_000_000,
    5_000_000_000,
    10_000_000_000,
    20_000_000_000,
    50_000_000_000,
];

/// One source's lag histogram: fixed buckets plus the exact count, sum, min and max.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LagHistogram {
    /// Per-bucket (not cumulative) counts; the last entry is the overflow bucket.
    counts: [u64; BUCKET_BOUNDS_NS.len() + 1],
    count: u64,
    sum_ns: u128,
    min_ns: u64,
    max_ns: u64,
}

impl LagHistogram {
    /// Adds one lag sample.
    pub(crate) fn record(&mut self, lag_ns: u64) {
        let bucket = BUCKET_BOUNDS_NS.partition_point(|&bound| bound < lag_ns);
        self.counts[bucket] += 1;
        if self.count == 0 || lag_ns < self.min_ns {
            self.min_ns = lag_ns;
        }
        self.max_ns = self.max_ns.max(lag_ns);
        self.count += 1;
        self.sum_ns += u128::from(lag_ns);
    }

    /// How many samples were recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The estimated `q`-quantile (0.0..=1.0) in nanoseconds, or `None` with no samples.
    pub(crate) fn quantile(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let q = q.clamp(0.0, 1.0);
        let rank = q * self.count as f64;
        let mut below = 0u64;
        for (i, &n) in self.counts.iter().enumerate() {
            if n == 0 {
                continue;
            }
            if (below + n) as f64 >= rank {
                let Some(&upper) = BUCKET_BOUNDS_NS.get(i) else {
                    // The overflow bucket has no upper bound: its best estimate is the max.
                    return Some(self.max_ns);
                };
                let lower = if i == 0 { 0 } else { BUCKET_BOUNDS_NS[i - 1] };
                let fraction = ((rank - below as f64) / n as f64).clamp(0.0, 1.0);
                let estimate = lower as f64 + (upper - lower) as f64 * fraction;
                return Some((estimate.round() as u64).clamp(self.min_ns, self.max_ns));
            }
            below += n;
        }
        Some(self.max_ns)
    }

    /// Cumulative counts per bucket as `(upper bound ns, count ≤ bound)`, the last one with
    /// `None` for `+Inf`: the Prometheus histogram form. Only the tests read the buckets this
    /// way (the metrics keep their own histogram), to check where a sample lands.
    #[cfg(test)]
    fn cumulative(&self) -> Vec<(Option<u64>, u64)> {
        let mut total = 0;
        self.counts
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                total += n;
                (BUCKET_BOUNDS_NS.get(i).copied(), total)
            })
            .collect()
    }

    /// Count, p50, p99, max and sum in one value.
    pub fn snapshot(&self, source: Source) -> LagSnapshot {
        LagSnapshot {
            source,
            count: self.count,
            p50_ns: self.quantile(0.50).unwrap_or(0),
            p99_ns: self.quantile(0.99).unwrap_or(0),
            max_ns: self.max_ns,
            sum_ns: u64::try_from(self.sum_ns).unwrap_or(u64::MAX),
        }
    }
}

/// A source's lag figures at one moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LagSnapshot {
    /// The source measured.
    pub source: Source,
    /// Events taken from it.
    pub count: u64,
    /// Median lag (bucket estimate), nanoseconds.
    pub p50_ns: u64,
    /// 99th percentile lag (bucket estimate), nanoseconds.
    pub p99_ns: u64,
    /// Largest lag seen (exact), nanoseconds.
    pub max_ns: u64,
    /// Sum of all lags (exact, saturating), nanoseconds.
    pub sum_ns: u64,
}

impl std::fmt::Display for LagSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<16} count={:<6} p50={:<9} p99={:<9} max={}",
            self.source.name(),
            self.count,
            crate::human::duration_ns(self.p50_ns),
            crate::human::duration_ns(self.p99_ns),
            crate::human::duration_ns(self.max_ns)
        )
    }
}

/// Lag histograms for every source that delivered an event.
#[derive(Clone, Debug, Default)]
pub struct LagRecorder {
    by_source: BTreeMap<Source, LagHistogram>,
}

impl LagRecorder {
    /// Records one event's lag against its source.
    pub(crate) fn record(&mut self, source: Source, lag_ns: u64) {
        self.by_source.entry(source).or_default().record(lag_ns);
    }

    /// The histogram of one source, if it delivered anything.
    pub fn histogram(&self, source: Source) -> Option<&LagHistogram> {
        self.by_source.get(&source)
    }

    /// Snapshots of every source that delivered at least one event, in [`Source`] order.
    pub fn snapshot(&self) -> Vec<LagSnapshot> {
        self.by_source
            .iter()
            .map(|(&source, h)| h.snapshot(source))
            .collect()
    }
}

/// Nanoseconds in the unit a person reads fastest (`850ns`, `12.3µs`, `4.56ms`, `1.20s`).
pub fn format_ns(ns: u64) -> String {
    match ns {
        0..=999 => format!("{ns}ns"),
        1_000..=999_999 => format!("{:.1}µs", ns as f64 / 1e3),
        1_000_000..=999_999_999 => format!("{:.2}ms", ns as f64 / 1e6),
        _ => format!("{:.2}s", ns as f64 / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_strictly_increasing() {
        assert!(BUCKET_BOUNDS_NS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn sample_on_a_bound_is_in_that_bucket() {
        let mut h = LagHistogram::default();
        h.record(2_000);
        let cum = h.cumulative();
        assert_eq!(cum[0], (Some(1_000), 0));
        assert_eq!(cum[1], (Some(2_000), 1));
        assert_eq!(cum.last(), Some(&(None, 1)));
    }

    #[test]
    fn single_sample_reports_itself() {
        let mut h = LagHistogram::default();
        h.record(12_345);
        let s = h.snapshot(Source::Psi);
        assert_eq!(
            (s.count, s.p50_ns, s.p99_ns, s.max_ns),
            (1, 12_345, 12_345, 12_345)
        );
    }

    #[test]
    fn quantiles_interpolate_inside_buckets() {
        let mut h = LagHistogram::default();
        // 100 samples spread evenly over the 10µs..20µs bucket.
        for i in 0..100 {
            h.record(10_001 + i * 100);
        }
        let p50 = h.quantile(0.5).unwrap();
        assert!((14_000..=16_000).contains(&p50), "{p50}");
        let p99 = h.quantile(0.99).unwrap();
        assert!(p99 <= h.snapshot(Source::Poll).max_ns);
        assert!(p99 > p50);
    }

    #[test]
    fn quantiles_pick_the_right_bucket() {
        let mut h = LagHistogram::default();
        for _ in 0..98 {
            h.record(1_500); // 1µs..2µs
        }
        h.record(3_000_000); // 2ms..5ms
        h.record(40_000_000); // 20ms..50ms
        let s = h.snapshot(Source::MemcgThreshold);
        assert!((1_000..=2_000).contains(&s.p50_ns), "{s:?}");
        assert!((2_000_000..=5_000_000).contains(&s.p99_ns), "{s:?}");
        assert_eq!(s.max_ns, 40_000_000);
        assert_eq!(s.sum_ns, 98 * 1_500 + 3_000_000 + 40_000_000);
    }

    #[test]
    fn overflow_bucket_reports_max() {
        let mut h = LagHistogram::default();
        h.record(100_000_000_000);
        h.record(200_000_000_000);
        assert_eq!(h.quantile(0.99), Some(200_000_000_000));
        assert_eq!(h.cumulative().last(), Some(&(None, 2)));
    }

    #[test]
    fn empty_histogram_has_no_quantile() {
        assert_eq!(LagHistogram::default().quantile(0.5), None);
        assert!(LagRecorder::default().snapshot().is_empty());
    }

    #[test]
    fn recorder_keeps_sources_apart() {
        let mut r = LagRecorder::default();
        r.record(Source::Psi, 5_000);
        r.record(Source::Poll, 7_000);
        r.record(Source::Poll, 9_000);
        let snaps = r.snapshot();
        assert_eq!(snaps.len(), 2);
        assert_eq!(snaps[0].source, Source::Psi);
        assert_eq!(snaps[1].count, 2);
        assert_eq!(r.histogram(Source::Ebpf), None);
    }

    #[test]
    fn formats_units() {
        assert_eq!(format_ns(850), "850ns");
        assert_eq!(format_ns(12_340), "12.3µs");
        assert_eq!(format_ns(4_560_000), "4.56ms");
        assert_eq!(format_ns(1_200_000_000), "1.20s");
    }
}
