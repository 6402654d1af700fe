//! Reading and parsing a plan's input, and printing its answer.
//!
//! A malformed snapshot must fail with one line naming the field (`pods[2].spec.containers[0]
//! .resources.requests.memory: invalid quantity "12Qi" ...`), never a panic and never a
//! multi-line dump, so scripts and people can both act on it.

use std::io::Read;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::decide::pod::RELATIVE_PATH_MARK;
use crate::decide::quantity::Quantity;

/// The largest input accepted: far above any real node snapshot, low enough that a wrong file
/// (a disk image, /dev/zero) fails fast instead of exhausting memory.
pub(crate) const MAX_INPUT_BYTES: u64 = 64 * 1024 * 1024;

/// Why an input could not be used. Every variant prints as one line.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The file (or stdin) could not be read.
    #[error("cannot read {what}: {source}")]
    Read {
        /// The file name, or "stdin".
        what: String,
        /// The I/O failure.
        source: std::io::Error,
    },
    /// The input is larger than [`MAX_INPUT_BYTES`].
    #[error("{what} is larger than the {MAX_INPUT_BYTES}-byte limit")]
    TooLarge {
        /// The file name, or "stdin".
        what: String,
    },
    /// The document is not valid JSON, or a field is wrong; the text names the field.
    #[error("{0}")]
    Invalid(String),
}

/// Reads the whole input from `path`, or from stdin when `path` is `-`, up to the size cap.
pub fn read_input(path: &Path) -> Result<Vec<u8>, InputError> {
    let (what, reader): (String, Box<dyn Read>) = if path.as_os_str() == "-" {
        ("stdin".to_string(), Box::new(std::io::stdin().lock()))
    } else {
        let what = path.display().to_string();
        match std::fs::File::open(path) {
            Ok(f) => (what, Box::new(f)),
            Err(source) => return Err(InputError::Read { what, source }),
        }
    };
    read_capped(reader, &what)
}

fn read_capped(reader: impl Read, what: &str) -> Result<Vec<u8>, InputError> {
    let mut buf = Vec::new();
    reader
        .take(MAX_INPUT_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|source| InputError::Read {
            what: what.to_string(),
            source,
        })?;
    if buf.len() as u64 > MAX_INPUT_BYTES {
        return Err(InputError::TooLarge {
            what: what.to_string(),
        });
    }
    Ok(buf)
}

/// Parses a plan document into `T`, naming the field on error (`pods[2].spec.priority: ...`).
///
/// Pods inside the document report their own field paths relative to the pod; those are
/// joined to the document path here, so the message names the full path.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, InputError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T =
        serde_path_to_error::deserialize(&mut de).map_err(|e| InputError::Invalid(describe(&e)))?;
    // Trailing text after the document is an error too.
    de.end()
        .map_err(|e| InputError::Invalid(one_line(&e.to_string())))?;
    Ok(value)
}

/// A refusal naming the field at `path`: the one place plan inputs' errors are made outside
/// serde, so every one stays on one line, whatever the input's keys and values hold (a
/// signal key with a line break in it was found by the `plan` fuzz target).
pub(crate) fn invalid(path: impl std::fmt::Display, message: impl std::fmt::Display) -> InputError {
    InputError::Invalid(crate::decide::printable(&format!("{path}: {message}")))
}

fn describe(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    // The path holds the document's own keys, which may hold line breaks (found by the
    // `plan` fuzz target): escaped, so the error stays on one line.
    let outer = crate::decide::printable(&e.path().to_string());
    let inner = one_line(&e.inner().to_string());
    let (path, message) = match inner.strip_prefix(RELATIVE_PATH_MARK) {
        Some(rest) => match rest.split_once(": ") {
            Some((rel, msg)) => (join_path(&outer, rel), msg.to_string()),
            None => (outer, rest.to_string()),
        },
        None => (outer, inner),
    };
    if path == "." || path.is_empty() {
        message
    } else {
        format!("{path}: {message}")
    }
}

fn join_path(outer: &str, rel: &str) -> String {
    if outer == "." || outer.is_empty() {
        rel.to_string()
    } else if rel.starts_with('[') {
        format!("{outer}{rel}")
    } else {
        format!("{outer}.{rel}")
    }
}

/// Collapses any line breaks so an error is always one line on stderr.
pub(crate) fn one_line(text: &str) -> String {
    text.split(['\n', '\r'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Renders an answer as JSON text: indented for people, compact for pipes.
pub fn render<T: Serialize>(answer: &T, pretty: bool) -> String {
    let text = if pretty {
        serde_json::to_string_pretty(answer)
    } else {
        serde_json::to_string(answer)
    };
    // Serializing plain data into a string cannot fail (no maps with non-string keys, no
    // I/O); should it ever, say so as JSON rather than panic.
    text.unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()))
}

/// A Kubernetes quantity in a plan document: a quantity string (`"128Mi"`, `"100m"`) or a
/// plain JSON number, parsed exactly (never through a float when written as a string).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JsonQuantity(pub Quantity);

impl<'de> serde::Deserialize<'de> for JsonQuantity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = JsonQuantity;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a quantity (\"128Mi\", \"100m\", or a number)")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Quantity::parse(v).map(JsonQuantity).map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(JsonQuantity(Quantity::from_units(v)))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                match i64::try_from(v) {
                    Ok(v) => Ok(JsonQuantity(Quantity::from_units(v))),
                    Err(_) => Err(E::custom(format!("quantity {v} is out of range"))),
                }
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
                // serde_json prints the shortest text that reads back as this float, which
                // is the decimal the author wrote in all but absurd cases.
                self.visit_str(&v.to_string())
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::pod::PodInfo;

    #[derive(serde::Deserialize, Debug)]
    struct Doc {
        #[expect(dead_code, reason = "only parsed")]
        pods: Vec<PodInfo>,
    }

    #[test]
    fn bad_quantity_in_a_pod_names_the_full_path() {
        let text = br#"{"pods": [{"metadata": {"name": "a"}},
            {"metadata": {"name": "b"}, "spec": {"containers": [{"name": "c",
             "resources": {"requests": {"memory": "12Qi"}}}]}}]}"#;
        let e = parse::<Doc>(text).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "pods[1].spec.containers[0].resources.requests.memory: invalid quantity \"12Qi\""
            ),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }

    #[test]
    fn type_errors_inside_a_pod_name_the_full_path() {
        let text = br#"{"pods": [{"metadata": {"name": "a"}, "spec": {"priority": "x"}}]}"#;
        let e = parse::<Doc>(text).unwrap_err().to_string();
        assert!(e.starts_with("pods[0].spec.priority: "), "{e}");
    }

    #[test]
    fn a_key_with_a_line_break_is_named_on_one_line() {
        // Found by the `plan` fuzz target (and the `api` one, through `Plan`): a syntax error
        // under a key holding a carriage return quoted the key raw in its path.
        let e = parse::<Doc>(b"{\"a\\rb\": [1, \"\x01\"]}")
            .unwrap_err()
            .to_string();
        assert!(!e.contains(['\n', '\r']), "{e:?}");
        assert!(e.starts_with("a\\rb"), "{e}");
    }

    #[test]
    fn syntax_errors_are_one_line() {
        let e = parse::<Doc>(b"{\"pods\": [").unwrap_err().to_string();
        assert!(!e.contains('\n') && e.contains("EOF"), "{e}");
        let e = parse::<Doc>(b"{}").unwrap_err().to_string();
        assert!(e.contains("missing field `pods`"), "{e}");
    }

    #[test]
    fn quantities_as_strings_or_numbers() {
        let q: Vec<JsonQuantity> = parse(br#"["1.5Gi", 3, 0.5, "100m"]"#).unwrap();
        assert_eq!(q[0].0, Quantity::parse("1536Mi").unwrap());
        assert_eq!(q[1].0, Quantity::from_units(3));
        assert_eq!(q[2].0, Quantity::from_millis(500));
        assert_eq!(q[3].0, Quantity::from_millis(100));
        let e = parse::<Vec<JsonQuantity>>(br#"["1", "12Qi"]"#)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("[1]: invalid quantity \"12Qi\""), "{e}");
    }

    #[test]
    fn trailing_text_is_refused() {
        assert!(parse::<Vec<JsonQuantity>>(b"[] x").is_err());
    }

    #[test]
    fn oversized_input_is_refused() {
        let big = std::io::repeat(b' ').take(MAX_INPUT_BYTES + 10);
        let e = read_capped(big, "x").unwrap_err();
        assert!(matches!(e, InputError::TooLarge { .. }));
    }
}
