//! Quantities for people: the one place that turns bytes, cpu, counts, thresholds and
//! durations into the text `reactor status`, `pod ls`, `events`, `watch` and the log messages
//! print.
//!
//! An operator reads `24Gi`, `496Ki` and `100m` — kubectl's forms — not byte counts, so the
//! forms follow kubectl and the kubelet:
//!
//! - **Bytes** use binary suffixes (`Ki`, `Mi`, `Gi`, …). A value that is an exact multiple
//!   prints exactly in its canonical form, as `resource.Quantity.String()` prints it (`24Gi`,
//!   `1536Ki`), as long as that form has at most four digits. Any other value is not an exact
//!   binary quantity at a readable size (`25171652608` is `24581692Ki`), so it prints in the
//!   largest unit it reaches with three significant digits, cut (never rounded up, as `kubectl
//!   top` cuts), and marked `~` (`~23.4Gi`): a rounded figure must never read as a different
//!   exact quantity. A value with no binary factor under 10000 prints as the plain, exact
//!   number of bytes (`1000`, `1025`; kubectl's canonical `1k` would read as a count).
//! - **CPU** prints as kubectl prints it: whole cores plain (`2`), anything else in millicores
//!   (`1500m`, `100m`), finer values in `u`/`n`.
//! - **Counts** (pods, inodes, pids, device-plugin devices) print as plain integers.
//! - **Thresholds** print as written when written as a percentage (`10%`, followed by what it
//!   resolves to), else as a byte or count quantity.
//! - **Durations** print as Go's `Duration.String()` does (`67.234µs`, `1m30s`), the form the
//!   kubelet logs and its config files use.
//!
//! The module sits at the bottom of the house, above only `decide`'s quantity and duration
//! types, so every layer can print with it without reaching up: the sense sources' log
//! lines as much as the CLI (it lived in `record` before, and `sense` reached up for it).
//!
//! `--json` output never comes through here: it keeps the exact integers and strings of the
//! API. Text that does not parse as a quantity is printed unchanged rather than refused: this
//! is output, and a value the agent cannot read is still worth showing.

use std::time::Duration;

use crate::decide::duration::format_go_duration;
use crate::decide::quantity::Quantity;
use crate::decide::signal::Signal;

const BINARY: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];

/// Bytes for people (`24Gi`, `496Ki`, `~23.4Gi`, `1000`); see the module docs.
pub fn bytes(value: i128) -> String {
    let sign = if value < 0 { "-" } else { "" };
    let v = value.unsigned_abs();
    if v < 1024 {
        return format!("{sign}{v}");
    }
    // Exact: the canonical form, if it stays short.
    let mut mantissa = v;
    let mut step = 0;
    while step < BINARY.len() - 1 && mantissa.is_multiple_of(1024) {
        mantissa /= 1024;
        step += 1;
    }
    if mantissa < 10_000 {
        return format!("{sign}{mantissa}{}", BINARY[step]);
    }
    // Approximate: the largest unit the value reaches, three significant digits, cut.
    let mut step = 0;
    while step < BINARY.len() - 1 && v >= 1u128 << (10 * (step + 1)) {
        step += 1;
    }
    let unit = 1u128 << (10 * step);
    let whole = v / unit;
    let text = if whole >= 100 {
        whole.to_string()
    } else if whole >= 10 {
        let tenths = v * 10 / unit;
        format!("{}.{}", tenths / 10, tenths % 10)
    } else {
        let hundredths = v * 100 / unit;
        format!("{}.{:02}", hundredths / 100, hundredths % 100)
    };
    format!("~{sign}{text}{}", BINARY[step])
}

/// CPU for people, from an exact quantity of cores (`2`, `1500m`, `100m`, `0`).
pub(crate) fn cpu(q: Quantity) -> String {
    let nanos = q.nanos();
    if nanos % 1_000_000_000 == 0 {
        format!("{}", nanos / 1_000_000_000)
    } else if nanos % 1_000_000 == 0 {
        format!("{}m", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!("{}u", nanos / 1_000)
    } else {
        format!("{nanos}n")
    }
}

/// A count (pods, inodes, pids, devices): the plain integer.
pub fn count(value: i128) -> String {
    value.to_string()
}

/// A duration in nanoseconds as Go prints it (`67.234µs`, `1.5s`, `0s`).
pub fn duration_ns(ns: u64) -> String {
    format_go_duration(Duration::from_nanos(ns))
}

/// A resource quantity from the API (`capacity`/`allocatable` maps) for people, by the
/// resource's unit: `cpu` in cores, `memory`, `ephemeral-storage`, `storage` and
/// `hugepages-*` in bytes, anything else (pods, device-plugin resources) as a count.
pub fn resource(name: &str, text: &str) -> String {
    let Ok(q) = Quantity::parse(text) else {
        return text.to_string();
    };
    if name == "cpu" {
        cpu(q)
    } else if is_byte_resource(name) {
        bytes(q.value())
    } else if q.nanos() % 1_000_000_000 == 0 {
        count(q.value())
    } else {
        // A fractional count is unusual; print it exactly, as cpu-like milli-units.
        cpu(q)
    }
}

fn is_byte_resource(name: &str) -> bool {
    matches!(name, "memory" | "ephemeral-storage" | "storage") || name.starts_with("hugepages-")
}

/// A signal's value from the API (`available`, `capacity`, a resolved threshold) for people:
/// bytes for the `*.available` byte signals, a count for inodes and pids.
pub fn signal_value(signal: &str, text: &str) -> String {
    let Ok(q) = Quantity::parse(text) else {
        return text.to_string();
    };
    match Signal::parse(signal) {
        Some(s) if !s.resource().is_bytes() => count(q.value()),
        _ => bytes(q.value()),
    }
}

/// A threshold as configured (`value`, as written) and resolved against capacity
/// (`resolved`), for people: `10% (~2.34Gi)` for a percentage, `100Mi` for a quantity.
pub fn threshold(signal: &str, value: &str, resolved: &str) -> String {
    if value.ends_with('%') {
        if resolved.is_empty() {
            value.to_string()
        } else {
            format!("{value} ({})", signal_value(signal, resolved))
        }
    } else {
        signal_value(signal, value)
    }
}

/// An error and its causes on one line (`what: why: why`), each cause said once.
///
/// Many errors both print their cause and hand it out as their `source()`: ours with
/// `#[error("read {path}: {source}")]`, and tonic's transport `ConnectError`, which prints
/// nothing but its inner error and returns that same error as its source. Walking the chain
/// naively (anyhow's `{:#}`) then says the cause twice (`No such file or directory (os error
/// 2): No such file or directory (os error 2)`). A cause whose text is already in the line is
/// skipped here, so every way the agent prints an error chain says each cause once.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let text = e.to_string();
        if !text.is_empty() && !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = e.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_table() {
        const KI: i128 = 1 << 10;
        const MI: i128 = 1 << 20;
        const GI: i128 = 1 << 30;
        for (value, text) in [
            (0, "0"),
            (1, "1"),
            (1000, "1000"),
            (1023, "1023"),
            (KI, "1Ki"),
            (KI + 1, "1025"),
            (496 * KI, "496Ki"),
            (507_904, "496Ki"),
            (1536 * KI, "1536Ki"),
            (MI - KI, "1023Ki"),
            (MI - 1, "~1023Ki"),
            (MI, "1Mi"),
            (100 * MI, "100Mi"),
            (GI - 1, "~1023Mi"),
            (GI, "1Gi"),
            (24 * GI, "24Gi"),
            (9999 * MI, "9999Mi"),
            (10_000 * MI, "~9.76Gi"),
            // `reactor status` on a 24 GiB VM: allocatable, capacity and 10% of capacity.
            (25_171_652_608, "~23.4Gi"),
            (25_276_510_208, "~23.5Gi"),
            (2_527_651_020, "~2.35Gi"),
            (GI + 1, "~1.00Gi"),
            (1 << 60, "1Ei"),
            (3 << 60, "3Ei"),
            (-(200 * MI), "-200Mi"),
            (-(GI + 1), "~-1.00Gi"),
            (-5, "-5"),
        ] {
            assert_eq!(bytes(value), text, "{value}");
        }
    }

    #[test]
    fn an_approximation_never_reads_as_an_exact_quantity() {
        for v in [10_001i128, 25_171_652_608, (1 << 30) + 1, 123_456_789] {
            let text = bytes(v);
            assert!(text.starts_with('~'), "{v} -> {text}");
            // And cut, not rounded up: the figure is at most the value.
            let q = Quantity::parse(text.trim_start_matches('~')).unwrap();
            assert!(q.value() <= v, "{v} -> {text}");
        }
    }

    #[test]
    fn cpu_table() {
        for (text, out) in [
            ("0", "0"),
            ("2", "2"),
            ("2000m", "2"),
            ("1.5", "1500m"),
            ("100m", "100m"),
            ("999m", "999m"),
            ("1001m", "1001m"),
            ("0.5m", "500u"),
            ("1n", "1n"),
        ] {
            assert_eq!(cpu(Quantity::parse(text).unwrap()), out, "{text}");
        }
    }

    /// Pure logic over a hand-made chain: the cause said in the message, or said by a
    /// wrapper that only forwards it, is not said again; a new cause is.
    #[test]
    fn error_chain_says_each_cause_once() {
        #[derive(Debug)]
        struct E(String, Option<Box<E>>);
        impl std::fmt::Display for E {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl std::error::Error for E {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.1.as_deref().map(|e| e as _)
            }
        }
        let io = || E("No such file or directory (os error 2)".into(), None);
        // tonic: "transport error" -> ConnectError (prints its inner) -> the io error.
        let tonic = E(
            "transport error".into(),
            Some(Box::new(E(io().0, Some(Box::new(io()))))),
        );
        assert_eq!(
            error_chain(&tonic),
            "transport error: No such file or directory (os error 2)"
        );
        // thiserror's `{path}: {source}` with the source handed out too.
        let read = E(format!("read /x: {}", io().0), Some(Box::new(io())));
        assert_eq!(
            error_chain(&read),
            "read /x: No such file or directory (os error 2)"
        );
        let context = E("cannot start".into(), Some(Box::new(read)));
        assert_eq!(
            error_chain(&context),
            "cannot start: read /x: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn resources_by_unit() {
        for (name, text, out) in [
            ("cpu", "2", "2"),
            ("cpu", "1900m", "1900m"),
            ("memory", "25171652608", "~23.4Gi"),
            ("memory", "24Gi", "24Gi"),
            ("memory", "0", "0"),
            ("ephemeral-storage", "10Gi", "10Gi"),
            ("hugepages-2Mi", "4Mi", "4Mi"),
            ("pods", "110", "110"),
            ("pods", "1k", "1000"),
            ("vendor.example/dev", "4", "4"),
            ("memory", "not a quantity", "not a quantity"),
        ] {
            assert_eq!(resource(name, text), out, "{name} {text}");
        }
    }

    #[test]
    fn signals_and_thresholds() {
        assert_eq!(signal_value("memory.available", "104857600"), "100Mi");
        assert_eq!(signal_value("nodefs.inodesFree", "5000"), "5000");
        assert_eq!(signal_value("pid.available", "4194304"), "4194304");
        assert_eq!(signal_value("memory.available", "-1Mi"), "-1Mi");
        assert_eq!(threshold("memory.available", "100Mi", "104857600"), "100Mi");
        assert_eq!(
            threshold("memory.available", "1.5Gi", "1610612736"),
            "1536Mi"
        );
        assert_eq!(
            threshold("memory.available", "10%", "2527651020"),
            "10% (~2.35Gi)"
        );
        assert_eq!(threshold("nodefs.inodesFree", "5%", "3276"), "5% (3276)");
        assert_eq!(threshold("memory.available", "10%", ""), "10%");
    }

    #[test]
    fn durations_as_go_prints_them() {
        for (ns, out) in [
            (0, "0s"),
            (999, "999ns"),
            (67_234, "67.234µs"),
            (1_000_000, "1ms"),
            (1_500_000_000, "1.5s"),
            (90_000_000_000, "1m30s"),
        ] {
            assert_eq!(duration_ns(ns), out, "{ns}");
        }
    }
}
