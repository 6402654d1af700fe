//! Go-style durations (`"90s"`, `"1m30s"`, `"300ms"`), parsed as `time.ParseDuration` does.
//!
//! KubeletConfiguration writes every period as a Go duration string; accepting exactly that
//! grammar lets an operator paste their kubelet's values unchanged.

use std::time::Duration;

/// Why a duration string was refused; the message quotes the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not a Go duration.
    #[error(
        "invalid duration {0:?}: expected a Go duration such as \"90s\", \"1m30s\" or \"300ms\""
    )]
    Syntax(String),
    /// Larger than Go's `time.Duration` (about 292 years) can hold.
    #[error("duration {0:?} is out of range")]
    Range(String),
    /// A negative duration where only zero or more makes sense.
    #[error("duration {0:?} is negative")]
    Negative(String),
}

/// Parses a Go duration into signed nanoseconds, exactly as `time.ParseDuration`
/// (units ns, us, µs, ms, s, m, h; fractions allowed; `"0"` alone needs no unit).
pub(crate) fn parse_go_duration_nanos(text: &str) -> Result<i64, DurationError> {
    let syntax = || DurationError::Syntax(text.to_string());
    let range = || DurationError::Range(text.to_string());
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(syntax());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let int_part = &rest[..int_len];
        rest = &rest[int_len..];
        let mut frac_part = "";
        if let Some(after) = rest.strip_prefix('.') {
            let frac_len = after.bytes().take_while(u8::is_ascii_digit).count();
            frac_part = &after[..frac_len];
            rest = &after[frac_len..];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(syntax());
        }
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map_or(rest.len(), |(i, _)| i);
        let unit: u128 = match &rest[..unit_len] {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(syntax()),
        };
        rest = &rest[unit_len..];
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| range())?
        };
        let mut value = whole.checked_mul(unit).ok_or_else(range)?;
        // The fraction contributes frac * unit / 10^len, truncated as Go truncates.
        let mut scale: u128 = 1;
        let mut frac: u128 = 0;
        for d in frac_part.bytes() {
            // Go stops taking precision once the fraction would pass 2^63 (`leadingFraction`),
            // which also keeps `frac * unit` within u128: thirty digits of a minute overflowed
            // it (found by the `plan` fuzz target).
            let next = frac * 10 + u128::from(d - b'0');
            if frac > u128::from(i64::MAX.unsigned_abs()) / 10 || next > 1 << 63 {
                break;
            }
            frac = next;
            scale *= 10;
        }
        value = value.checked_add(frac * unit / scale).ok_or_else(range)?;
        total = total.checked_add(value).ok_or_else(range)?;
    }
    let limit = if negative {
        1u128 << 63
    } else {
        (1u128 << 63) - 1
    };
    if total > limit {
        return Err(range());
    }
    let signed = total as i128;
    Ok((if negative { -signed } else { signed }) as i64)
}

/// Parses a Go duration that must not be negative.
pub fn parse_go_duration(text: &str) -> Result<Duration, DurationError> {
    let nanos = parse_go_duration_nanos(text)?;
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| DurationError::Negative(text.to_string()))
}

/// Formats a duration the way Go's `Duration.String` does (`"1m30s"`, `"300ms"`, `"0s"`),
/// so that printed defaults read like a KubeletConfiguration.
pub fn format_go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", trim_fraction(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", trim_fraction(nanos, 1_000_000));
    }
    let total_secs = nanos / 1_000_000_000;
    let sub = nanos % 1_000_000_000;
    let hours = total_secs / 3600;
    let minutes = (total_secs % 3600) / 60;
    let secs = total_secs % 60;
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&trim_fraction(
        u128::from(secs as u64) * 1_000_000_000 + sub,
        1_000_000_000,
    ));
    out.push('s');
    out
}

fn trim_fraction(value: u128, unit: u128) -> String {
    let whole = value / unit;
    let frac = value % unit;
    if frac == 0 {
        return whole.to_string();
    }
    let width = unit.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_fraction_keeps_go_s_precision_and_does_not_overflow() {
        // Found by the `plan` fuzz target (a soft grace period in `plan pressure`): the
        // fraction's thirty digits times a minute overflowed, a panic in a debug build.
        let long = "7777777777777.777777771111111111111111177777777777777777777777777777777m30s";
        assert!(matches!(
            parse_go_duration_nanos(long),
            Err(DurationError::Range(_))
        ));
        // As Go: the first 19 digits count, the rest are dropped.
        assert_eq!(
            parse_go_duration_nanos("0.111111111111111111111111111111m"),
            Ok(6_666_666_666)
        );
    }

    #[test]
    fn go_forms() {
        assert_eq!(parse_go_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_go_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(
            parse_go_duration("300ms").unwrap(),
            Duration::from_millis(300)
        );
        assert_eq!(
            parse_go_duration("1.5h").unwrap(),
            Duration::from_secs(5400)
        );
        assert_eq!(parse_go_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_go_duration("0s").unwrap(), Duration::ZERO);
        assert_eq!(
            parse_go_duration("2h45m").unwrap(),
            Duration::from_secs(9900)
        );
        assert_eq!(parse_go_duration("1µs").unwrap(), Duration::from_micros(1));
        assert_eq!(
            parse_go_duration(".5s").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(parse_go_duration_nanos("-1s").unwrap(), -1_000_000_000);
    }

    #[test]
    fn refused() {
        for bad in ["", "5", "1x", "s", "1.s.", "--1s", "1 s", "."] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
        assert!(matches!(
            parse_go_duration("-5s"),
            Err(DurationError::Negative(_))
        ));
        assert!(matches!(
            parse_go_duration("9999999h"),
            Err(DurationError::Range(_))
        ));
    }

    #[test]
    fn formats_like_go() {
        for (d, s) in [
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(300), "5m0s"),
            (Duration::from_millis(100), "100ms"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::ZERO, "0s"),
            (Duration::from_secs(3600), "1h0m0s"),
        ] {
            assert_eq!(format_go_duration(d), s);
            assert_eq!(parse_go_duration(s).unwrap(), d);
        }
    }
}
