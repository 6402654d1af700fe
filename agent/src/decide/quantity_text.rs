//! Whole-unit amounts printed the way the kubelet prints a `resource.Quantity`.
//!
//! Eviction messages and plan output quote thresholds and usage ("Threshold quantity: 100Mi,
//! available: 50Mi"); operators grep for those strings and compare them with what the kubelet
//! wrote, so bytes use the binary form (`Ki`, `Mi`, … when the value divides exactly, otherwise
//! the plain number) and counts use the decimal form (`k`, `M`, …), as the kubelet's canonical
//! quantity formatting does.

/// Bytes, printed in the binary-SI canonical form (`100Mi`, `1536Ki`, `1000`).
///
/// Values strictly between -1024 and 1024 print in the decimal form instead (1000 bytes is
/// `1k`), exactly as the kubelet's quantities do.
pub(crate) fn binary_si(value: i128) -> String {
    if value > -1024 && value < 1024 {
        return decimal_si(value);
    }
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let negative = value < 0;
    let mut mantissa = value.unsigned_abs();
    let mut step = 0;
    while step < SUFFIXES.len() - 1 && mantissa >= 1024 && mantissa.is_multiple_of(1024) {
        mantissa /= 1024;
        step += 1;
    }
    let sign = if negative { "-" } else { "" };
    format!("{sign}{mantissa}{}", SUFFIXES[step])
}

/// A count (inodes, processes), printed in the decimal-SI canonical form (`5k`, `1500`, `2M`).
pub(crate) fn decimal_si(value: i128) -> String {
    const SUFFIXES: [&str; 7] = ["", "k", "M", "G", "T", "P", "E"];
    if value == 0 {
        return "0".to_string();
    }
    let negative = value < 0;
    let mut mantissa = value.unsigned_abs();
    let mut step = 0;
    while step < SUFFIXES.len() - 1 && mantissa.is_multiple_of(1000) {
        mantissa /= 1000;
        step += 1;
    }
    let sign = if negative { "-" } else { "" };
    format!("{sign}{mantissa}{}", SUFFIXES[step])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_use_binary_suffixes_only_when_exact() {
        assert_eq!(binary_si(100 << 20), "100Mi");
        assert_eq!(binary_si(50 << 20), "50Mi");
        assert_eq!(binary_si(1536 << 10), "1536Ki");
        assert_eq!(binary_si(1 << 30), "1Gi");
        assert_eq!(binary_si(1000), "1k");
        assert_eq!(binary_si(2000), "2000");
        assert_eq!(binary_si(1023), "1023");
        assert_eq!(binary_si(1024), "1Ki");
        assert_eq!(binary_si(1_073_741_840), "1073741840");
        assert_eq!(binary_si(0), "0");
        assert_eq!(binary_si(-(200 << 20)), "-200Mi");
    }

    #[test]
    fn counts_use_decimal_suffixes() {
        assert_eq!(decimal_si(5000), "5k");
        assert_eq!(decimal_si(1500), "1500");
        assert_eq!(decimal_si(2_000_000), "2M");
        assert_eq!(decimal_si(7), "7");
        assert_eq!(decimal_si(-3000), "-3k");
    }
}
