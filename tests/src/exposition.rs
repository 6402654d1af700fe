//! Reading the agent's `/metrics` text in tests: one sample's value, whether a family is
//! exposed.

/// The value of the sample line `series value` (`series` with its labels as exposed:
/// `reactor_evictions_total{signal="memory.available",qos="BestEffort"}`).
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Whether `family` is exposed, with its `# HELP` and `# TYPE` lines.
pub fn has_family(text: &str, family: &str) -> bool {
    text.lines()
        .any(|l| l.starts_with(&format!("# HELP {family} ")))
        && text
            .lines()
            .any(|l| l.starts_with(&format!("# TYPE {family} ")))
}
