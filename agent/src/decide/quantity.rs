//! Kubernetes resource quantities, parsed exactly.
//!
//! The kubelet compares requests, limits and usage as `resource.Quantity` values, which are
//! arbitrary-precision decimals. Rounding `"1.5Gi"` or `"100m"` through a float would let the
//! agent disagree with the kubelet by a byte or a millicore at a threshold, so a quantity is
//! held here as an integer count of nano-units (10⁻⁹), which covers every suffix Kubernetes
//! accepts. Precision finer than a nano-unit is rounded up, as Kubernetes does.

use std::fmt;

/// Nano-units per unit: a [`Quantity`] counts nano-units, so whole units compare with it
/// scaled by this.
pub(crate) const NANO: i128 = 1_000_000_000;

/// A parsed Kubernetes quantity: an exact number of nano-units.
///
/// Ordering and arithmetic are exact, so sums of requests and comparisons against
/// thresholds give the same answer as the kubelet's `Quantity.Cmp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Quantity {
    nanos: i128,
}

/// Why a quantity string was refused; the message quotes the text so the caller can name
/// the field it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The text does not follow the Kubernetes quantity grammar.
    #[error("invalid quantity {0:?}: expected a number with an optional suffix (m, k, M, G, Ki, Mi, Gi, e3, ...)")]
    Syntax(String),
    /// The value is too large to hold exactly.
    #[error("quantity {0:?} is out of range")]
    Range(String),
}

impl Quantity {
    /// Zero, the value of an absent request.
    pub(crate) const ZERO: Quantity = Quantity { nanos: 0 };

    /// A quantity of whole units (bytes for memory, cores for cpu, a count for pods).
    pub const fn from_units(units: i64) -> Self {
        Quantity {
            nanos: units as i128 * NANO,
        }
    }

    /// A quantity of milli-units (millicores for cpu).
    #[cfg(test)]
    pub(crate) const fn from_millis(millis: i64) -> Self {
        Quantity {
            nanos: millis as i128 * 1_000_000,
        }
    }

    /// The value in whole units, rounded up as `Quantity.Value()` does.
    pub fn value(&self) -> i128 {
        div_ceil(self.nanos, NANO)
    }

    /// The value in milli-units, rounded up as `Quantity.MilliValue()` does.
    pub(crate) fn milli_value(&self) -> i128 {
        div_ceil(self.nanos, 1_000_000)
    }

    /// The exact value in nano-units.
    pub(crate) const fn nanos(&self) -> i128 {
        self.nanos
    }

    /// Whether the quantity is below zero (never valid for requests or capacities).
    pub const fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    /// Sum, saturating instead of overflowing on absurd inputs.
    pub(crate) fn saturating_add(self, other: Quantity) -> Quantity {
        Quantity {
            nanos: self.nanos.saturating_add(other.nanos),
        }
    }

    /// Difference, saturating instead of overflowing on absurd inputs.
    pub(crate) fn saturating_sub(self, other: Quantity) -> Quantity {
        Quantity {
            nanos: self.nanos.saturating_sub(other.nanos),
        }
    }

    /// Parses a quantity string as the Kubernetes API does
    /// (`<sign><digits>[.<digits>]<suffix>`, suffix one of the binary SI, decimal SI or
    /// `e<exponent>` forms).
    pub fn parse(text: &str) -> Result<Quantity, QuantityError> {
        parse(text)
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s)
    }
}

impl fmt::Display for Quantity {
    /// Prints the value in the plainest exact form: whole units when it is an integer,
    /// otherwise milli-units with an `m`, otherwise nano-units with an `n`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos % NANO == 0 {
            write!(f, "{}", self.nanos / NANO)
        } else if self.nanos % 1_000_000 == 0 {
            write!(f, "{}m", self.nanos / 1_000_000)
        } else {
            write!(f, "{}n", self.nanos)
        }
    }
}

fn div_ceil(n: i128, d: i128) -> i128 {
    let q = n / d;
    if n % d != 0 && (n > 0) == (d > 0) {
        q + 1
    } else {
        q
    }
}

fn pow10(exp: u32) -> Option<i128> {
    10i128.checked_pow(exp)
}

fn parse(text: &str) -> Result<Quantity, QuantityError> {
    let syntax = || QuantityError::Syntax(text.to_string());
    let range = || QuantityError::Range(text.to_string());
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut negative = false;
    if let Some(&c) = bytes.first() {
        if c == b'+' || c == b'-' {
            negative = c == b'-';
            i = 1;
        }
    }
    // Mantissa: digits, optional '.', digits; at least one digit overall.
    let mut mantissa: i128 = 0;
    let mut frac_digits: u32 = 0;
    let mut any_digit = false;
    let mut seen_dot = false;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_digit() {
            any_digit = true;
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(i128::from(c - b'0')))
                .ok_or_else(range)?;
            if seen_dot {
                frac_digits += 1;
            }
        } else if c == b'.' && !seen_dot {
            seen_dot = true;
        } else {
            break;
        }
        i += 1;
    }
    if !any_digit {
        return Err(syntax());
    }
    let suffix = &text[i..];
    // (power of ten, power of two) the suffix multiplies by.
    let (exp10, exp2): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        s if s.starts_with(['e', 'E']) => {
            let exp = &s[1..];
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(syntax());
            }
            let e: i32 = exp.parse().map_err(|_| range())?;
            (e, 0)
        }
        _ => return Err(syntax()),
    };
    let mut value = mantissa.checked_mul(1i128 << exp2).ok_or_else(range)?;
    // nanos = value * 10^(9 + exp10 - frac_digits), rounding up when the power is negative.
    let scale = 9i64 + i64::from(exp10) - i64::from(frac_digits);
    if scale >= 0 {
        let factor = u32::try_from(scale)
            .ok()
            .and_then(pow10)
            .ok_or_else(range)?;
        value = value.checked_mul(factor).ok_or_else(range)?;
    } else {
        match u32::try_from(-scale).ok().and_then(pow10) {
            Some(divisor) => value = div_ceil(value, divisor),
            // Smaller than anything representable: rounds up to one nano-unit unless zero.
            None => value = i128::from(value != 0),
        }
    }
    if negative {
        value = -value;
    }
    Ok(Quantity { nanos: value })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).expect(s)
    }

    #[test]
    fn binary_and_decimal_suffixes_are_exact() {
        assert_eq!(q("1.5Gi").value(), 1_610_612_736);
        assert_eq!(q("128Mi").value(), 134_217_728);
        assert_eq!(q("1G").value(), 1_000_000_000);
        assert_eq!(q("1k").value(), 1000);
        assert_eq!(q("1Ki").value(), 1024);
        assert_eq!(q("2e3").value(), 2000);
        assert_eq!(q("2E3").value(), 2000);
        assert_eq!(q("1E").value(), 1_000_000_000_000_000_000);
        assert_eq!(q("1Ei").value(), 1 << 60);
    }

    #[test]
    fn cpu_forms() {
        assert_eq!(q("100m").milli_value(), 100);
        assert_eq!(q("1").milli_value(), 1000);
        assert_eq!(q("1.5").milli_value(), 1500);
        assert_eq!(q("0.1").milli_value(), 100);
        assert_eq!(q(".5").milli_value(), 500);
        assert_eq!(q("5.").milli_value(), 5000);
    }

    #[test]
    fn sub_unit_precision_rounds_up() {
        assert_eq!(q("1m").value(), 1);
        assert_eq!(q("0.0001").milli_value(), 1);
        assert_eq!(q("1n").milli_value(), 1);
        assert_eq!(q("1e-12").nanos(), 1);
        assert_eq!(q("0e-40").nanos(), 0);
        assert_eq!(q("0").value(), 0);
    }

    #[test]
    fn signs() {
        assert_eq!(q("-1Mi").value(), -1_048_576);
        assert!(q("-1").is_negative());
        assert_eq!(q("+2").value(), 2);
    }

    #[test]
    fn garbage_is_refused_with_the_text() {
        for bad in [
            "", "12Qi", "Mi", "1.2.3", "1 Mi", "e3", "1e", "1e+", "abc", "-", "1.5Gib",
        ] {
            let err = Quantity::parse(bad).expect_err(bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        assert!(matches!(
            Quantity::parse("1e40"),
            Err(QuantityError::Range(_))
        ));
        assert!(matches!(
            Quantity::parse("99999999999999999999999999999999999999999"),
            Err(QuantityError::Range(_))
        ));
    }

    #[test]
    fn ordering_is_exact() {
        assert!(q("1Gi") > q("1G"));
        assert_eq!(q("1000m"), q("1"));
        assert_eq!(q("1024"), q("1Ki"));
        assert_eq!(q("1.5Gi").saturating_sub(q("512Mi")), q("1Gi"));
    }

    #[test]
    fn display_round_trips() {
        for s in ["0", "100m", "1536", "5n"] {
            assert_eq!(q(s).to_string(), s);
            assert_eq!(q(&q(s).to_string()), q(s));
        }
    }
}
