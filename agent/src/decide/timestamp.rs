//! RFC 3339 timestamps (`2026-11-22T10:00:00Z`, `…T10:00:00.5+02:00`) as Unix nanoseconds.
//!
//! Plans take times as RFC 3339 text, the way Kubernetes objects carry them. Decisions
//! compare times and subtract them, so a plain signed count of nanoseconds is all `decide`
//! needs; parsing it here keeps the rules free of any calendar library.

/// Unix time in nanoseconds (negative before 1970).
pub(crate) type UnixNanos = i128;

/// Why a timestamp was refused; the message quotes the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid time {0:?}: expected RFC 3339, such as \"2026-01-02T15:04:05Z\"")]
pub(crate) struct TimestampError(pub String);

fn digits(text: &[u8], at: usize, len: usize) -> Option<i64> {
    let part = text.get(at..at + len)?;
    if !part.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        part.iter()
            .fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0')),
    )
}

/// Days from 1970-01-01 to the given civil date (proleptic Gregorian).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        _ => 28,
    }
}

/// Parses an RFC 3339 date-time (`T` or `t` or a space between date and time; `Z`, `z` or a
/// `±hh:mm` offset; any number of fractional-second digits, truncated to nanoseconds).
pub(crate) fn parse_rfc3339(text: &str) -> Result<UnixNanos, TimestampError> {
    parse(text.as_bytes()).ok_or_else(|| TimestampError(text.to_string()))
}

fn parse(b: &[u8]) -> Option<UnixNanos> {
    let year = digits(b, 0, 4)?;
    let month = digits(b, 5, 2)?;
    let day = digits(b, 8, 2)?;
    let hour = digits(b, 11, 2)?;
    let minute = digits(b, 14, 2)?;
    let second = digits(b, 17, 2)?;
    if b.get(4) != Some(&b'-')
        || b.get(7) != Some(&b'-')
        || !matches!(b.get(10), Some(b'T' | b't' | b' '))
        || b.get(13) != Some(&b':')
        || b.get(16) != Some(&b':')
    {
        return None;
    }
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut nanos: i128 = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        let frac = &b[start..i];
        if frac.is_empty() {
            return None;
        }
        for k in 0..9 {
            let d = frac.get(k).map_or(0, |d| i128::from(d - b'0'));
            nanos = nanos * 10 + d;
        }
    }
    let offset_secs: i64 = match b.get(i) {
        Some(b'Z' | b'z') if b.len() == i + 1 => 0,
        Some(sign @ (b'+' | b'-')) if b.len() == i + 6 && b.get(i + 3) == Some(&b':') => {
            let oh = digits(b, i + 1, 2)?;
            let om = digits(b, i + 4, 2)?;
            if oh > 23 || om > 59 {
                return None;
            }
            let off = oh * 3600 + om * 60;
            if *sign == b'-' {
                -off
            } else {
                off
            }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_secs;
    Some(i128::from(secs) * 1_000_000_000 + nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i128 = 1_000_000_000;

    #[test]
    fn parses_utc_offsets_and_fractions() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z").unwrap(), 0);
        assert_eq!(
            parse_rfc3339("2026-11-22T10:00:00Z").unwrap(),
            1_795_341_600 * S
        );
        assert_eq!(
            parse_rfc3339("2026-11-22T12:00:00+02:00").unwrap(),
            parse_rfc3339("2026-11-22T10:00:00Z").unwrap()
        );
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00.5Z").unwrap(), S / 2);
        assert_eq!(
            parse_rfc3339("1970-01-01T00:00:00.123456789123Z").unwrap(),
            123_456_789
        );
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59Z").unwrap(), -S);
        assert_eq!(
            parse_rfc3339("2024-02-29T00:00:00Z").unwrap()
                - parse_rfc3339("2024-02-28T00:00:00Z").unwrap(),
            86_400 * S
        );
    }

    #[test]
    fn refuses_malformed() {
        for bad in [
            "",
            "2026-11-22",
            "2026-11-22T10:00:00",
            "2026-13-01T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-11-22T24:00:00Z",
            "2026-11-22T10:00:00.Z",
            "2026-11-22T10:00:00+0200",
            "2026-11-22T10:00:00Zjunk",
            "yesterday",
            "2026-11-22T10:00:00é",
        ] {
            let err = parse_rfc3339(bad).unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")));
        }
    }
}
