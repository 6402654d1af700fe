//! Small summaries of a part's samples: median, quartiles, and a trimmed mean of paired ratios
//! with its interval, for parts whose samples are noisy in both directions.

/// The median of `v`; 0 when empty.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// The first and third quartiles of `v` (linear between the nearest ranks); (0, 0) when
/// empty.
pub fn quartiles(v: &[f64]) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let at = |q: f64| {
        if s.is_empty() {
            return 0.0;
        }
        let pos = q * (s.len() - 1) as f64;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        s[lo] + (s[hi] - s[lo]) * (pos - lo as f64)
    };
    (at(0.25), at(0.75))
}

/// The smallest and largest of `v`; (0, 0) when empty.
pub fn range(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(*x), hi.max(*x))
        })
}

/// Share cut from each end by [`trimmed_ratio`].
pub const TRIM: f64 = 0.2;

/// A ratio's central figure with its 95 % interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    /// The central figure.
    pub value: f64,
    /// The interval's lower end.
    pub low: f64,
    /// The interval's upper end.
    pub high: f64,
}

impl Estimate {
    /// The central figure and the interval as a table shows them ("-" for none).
    pub fn texts(e: Option<Estimate>) -> (String, String) {
        match e {
            Some(e) => (
                format!("{:.3}", e.value),
                format!("{:.3}–{:.3}", e.low, e.high),
            ),
            None => ("-".into(), "-".into()),
        }
    }
}

/// The 20 %-trimmed mean of paired ratios, taken on their logarithms (so 1.05 and 1/1.05
/// weigh alike), with its 95 % interval (Tukey and McLaughlin: the winsorized standard
/// deviation over (1 − 2·trim)·√n, Student's t with n − 2g − 1 degrees of freedom). A
/// trimmed mean, not a median, because at equal cost it resolves a smaller difference (the
/// median uses about two-thirds of what normal-ish samples carry), while the trim still
/// drops the rounds that a slow stretch of the machine hit on one side only. `None` with
/// fewer than 3 ratios or a ratio that is not positive.
pub fn trimmed_ratio(ratios: &[f64]) -> Option<Estimate> {
    let n = ratios.len();
    if n < 3 || ratios.iter().any(|r| !r.is_finite() || *r <= 0.0) {
        return None;
    }
    let mut logs: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
    logs.sort_by(f64::total_cmp);
    let g = (TRIM * n as f64).floor() as usize;
    let kept = &logs[g..n - g];
    let mean = kept.iter().sum::<f64>() / kept.len() as f64;
    // Winsorized: each trimmed sample replaced by the nearest kept one.
    let wins: Vec<f64> = logs
        .iter()
        .map(|x| x.clamp(kept[0], kept[kept.len() - 1]))
        .collect();
    let wmean = wins.iter().sum::<f64>() / n as f64;
    let wvar = wins.iter().map(|x| (x - wmean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let se = wvar.sqrt() / ((1.0 - 2.0 * g as f64 / n as f64) * (n as f64).sqrt());
    let half = t975(kept.len().saturating_sub(1).max(1)) * se;
    Some(Estimate {
        value: mean.exp(),
        low: (mean - half).exp(),
        high: (mean + half).exp(),
    })
}

/// Student's t at 0.975 for `df` degrees of freedom: the table up to 10, then the
/// Cornish-Fisher expansion around the normal's 1.96 to the 1/df² term, within 0.003 of the
/// table from 11 on.
fn t975(df: usize) -> f64 {
    const TABLE: [f64; 10] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    ];
    const Z: f64 = 1.959_964;
    match df {
        0 => f64::INFINITY,
        1..=10 => TABLE[df - 1],
        _ => {
            let d = df as f64;
            let (z3, z5) = (Z.powi(3), Z.powi(5));
            Z + (z3 + Z) / (4.0 * d) + (5.0 * z5 + 16.0 * z3 + 3.0 * Z) / (96.0 * d * d)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_quartiles() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        assert_eq!(quartiles(&[1.0, 2.0, 3.0, 4.0, 5.0]), (2.0, 4.0));
        assert_eq!(range(&[0.5, 2.0, -1.0]), (-1.0, 2.0));
        assert_eq!(range(&[]), (0.0, 0.0));
    }

    #[test]
    fn t975_follows_the_table_past_its_end() {
        // Student's t at 0.975 from the published table.
        for (df, t) in [
            (11, 2.201),
            (15, 2.131),
            (20, 2.086),
            (30, 2.042),
            (71, 1.994),
        ] {
            assert!(
                (t975(df) - t).abs() < 0.003,
                "df {df}: {} against {t}",
                t975(df)
            );
        }
        assert_eq!(t975(10), 2.228);
    }

    #[test]
    fn trimmed_ratio_drops_the_outliers_and_brackets_the_value() {
        // Ten rounds at 1.00 ± 0.01 and two that one side's slow stretch hit.
        let mut r = vec![0.99, 1.01, 1.0, 0.995, 1.005, 1.0, 0.99, 1.01, 1.0, 1.0];
        r.extend([1.6, 0.6]);
        let e = trimmed_ratio(&r).expect("enough ratios");
        assert!((e.value - 1.0).abs() < 0.005, "{e:?}");
        assert!(e.low < e.value && e.value < e.high, "{e:?}");
        assert!(e.high < 1.02 && e.low > 0.98, "{e:?}");
        // A real 5 % difference is seen as one.
        let slow: Vec<f64> = r.iter().map(|x| x * 1.05).collect();
        let s = trimmed_ratio(&slow).expect("enough ratios");
        assert!(s.low > 1.02, "{s:?}");
    }

    #[test]
    fn trimmed_ratio_refuses_too_few_or_bad_ratios() {
        assert_eq!(trimmed_ratio(&[1.0, 1.0]), None);
        assert_eq!(trimmed_ratio(&[1.0, 0.0, 1.0]), None);
        assert_eq!(trimmed_ratio(&[1.0, f64::NAN, 1.0]), None);
    }
}
