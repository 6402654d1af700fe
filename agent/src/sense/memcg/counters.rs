//! Flat `key value` counter files, which both versions read: v1's `memory.oom_control` (its
//! `oom_kill` count tells an OOM kill from an OOM) and v2's `memory.events`.

use std::collections::BTreeMap;

/// The counters of a v2 `memory.events` file (or any flat `key value` file).
pub(crate) type EventCounters = BTreeMap<String, u64>;

/// A line of a counter file that is not `key count`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CountersError {
    /// The line does not have exactly two words.
    #[error("line {0:?} is not \"key value\"")]
    NotKeyValue(String),
    /// The value is not a count.
    #[error("{key} value {value:?} is not a count")]
    NotCount {
        /// The counter's key.
        key: String,
        /// What stood where the count should be.
        value: String,
    },
}

/// Parses a flat keyed file of counters (`memory.events`, `memory.oom_control`).
pub(crate) fn parse_counters(text: &str) -> Result<EventCounters, CountersError> {
    let mut counters = EventCounters::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut words = line.split_whitespace();
        let (Some(key), Some(value), None) = (words.next(), words.next(), words.next()) else {
            return Err(CountersError::NotKeyValue(line.to_string()));
        };
        let value = value.parse().map_err(|_| CountersError::NotCount {
            key: key.to_string(),
            value: value.to_string(),
        })?;
        counters.insert(key.to_string(), value);
    }
    Ok(counters)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_memory_events() {
        let c =
            parse_counters("low 0\nhigh 12\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n").unwrap();
        assert_eq!(c["high"], 12);
        assert_eq!(c["oom_kill"], 1);
        assert!(parse_counters("high twelve\n").is_err());
        assert!(parse_counters("high 1 2\n").is_err());
    }

    #[test]
    fn parses_v1_oom_control() {
        let c = parse_counters("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n").unwrap();
        assert_eq!(c["oom_kill"], 4);
    }

    #[test]
    fn errors_name_the_line_or_the_key() {
        assert_eq!(
            parse_counters("high 1 2\n").unwrap_err().to_string(),
            "line \"high 1 2\" is not \"key value\""
        );
        assert_eq!(
            parse_counters("high twelve\n").unwrap_err().to_string(),
            "high value \"twelve\" is not a count"
        );
    }
}
