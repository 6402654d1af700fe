//! Resource-name rules and error texts the kubelet applies to device-plugin registrations.
//!
//! A plugin written for the kubelet sees the same refusal from reactor, word for word, so its
//! logs and its operators' runbooks stay valid.

/// The device-plugin API versions this agent speaks, as the kubelet's `SupportedVersions`.
pub(crate) const SUPPORTED_VERSIONS: &[&str] = &["v1beta1"];

/// Whether `name` names an extended resource, by the kubelet's `IsExtendedResourceName`: it
/// has a domain prefix (`vendor.example/dev`), is not in the `kubernetes.io/` namespace, does
/// not start with `requests.`, and `requests.<name>` is a valid qualified name (so it can be
/// used in a resource quota).
pub(crate) fn is_extended_resource_name(name: &str) -> bool {
    if is_native_resource(name) || name.starts_with("requests.") {
        return false;
    }
    is_qualified_name(&format!("requests.{name}"))
}

/// Native resources (cpu, memory, `*kubernetes.io/*`) are never served by device plugins.
fn is_native_resource(name: &str) -> bool {
    !name.contains('/') || name.contains("kubernetes.io/")
}

/// The apimachinery qualified-name rule: an optional DNS-1123 subdomain prefix and `/`, then a
/// name of at most 63 characters, alphanumeric at both ends with `-`, `_`, `.` inside.
pub(crate) fn is_qualified_name(value: &str) -> bool {
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() || !is_dns1123_subdomain(prefix) {
                return false;
            }
            *name
        }
        _ => return false,
    };
    if name.is_empty() || name.len() > 63 {
        return false;
    }
    let bytes = name.as_bytes();
    let edge_ok = |b: u8| b.is_ascii_alphanumeric();
    let inner_ok = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.';
    edge_ok(bytes[0]) && edge_ok(bytes[bytes.len() - 1]) && bytes.iter().all(|&b| inner_ok(b))
}

/// A DNS-1123 subdomain: at most 253 characters, dot-separated labels of lower-case
/// alphanumerics and `-`, alphanumeric at both ends.
pub(crate) fn is_dns1123_subdomain(value: &str) -> bool {
    value.len() <= 253 && !value.is_empty() && value.split('.').all(is_dns1123_label_body)
}

fn is_dns1123_label_body(label: &str) -> bool {
    let bytes = label.as_bytes();
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            ok(first) && ok(last) && bytes.iter().all(|&b| ok(b) || b == b'-')
        }
        _ => false,
    }
}

/// Quotes a string as Go's `%q` does, so refusal messages match the kubelet's byte for byte.
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{07}' => out.push_str("\\a"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{0b}' => out.push_str("\\v"),
            c if (c as u32) < 0x80 && c.is_control() => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => {
                if (c as u32) < 0x10000 {
                    out.push_str(&format!("\\u{:04x}", c as u32));
                } else {
                    out.push_str(&format!("\\U{:08x}", c as u32));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The kubelet's refusal for a plugin built against an API version it does not speak.
pub(crate) fn unsupported_version_message(version: &str) -> String {
    let supported: Vec<String> = SUPPORTED_VERSIONS.iter().map(|v| go_quote(v)).collect();
    format!(
        "requested API version {} is not supported by kubelet. Supported version is [{}]",
        go_quote(version),
        supported.join(" ")
    )
}

/// The kubelet's refusal for a resource name that is not an extended resource name.
pub(crate) fn invalid_resource_name_message(name: &str) -> String {
    format!("the ResourceName {} is invalid", go_quote(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_names_follow_the_kubelet() {
        for good in [
            "vendor.example/dev",
            "nvidia.com/gpu",
            "example.com/a_b.c-d",
            "a/b",
        ] {
            assert!(is_extended_resource_name(good), "{good} should be extended");
        }
        for bad in [
            "cpu",
            "memory",
            "bad_name",
            "kubernetes.io/foo",
            "sub.kubernetes.io/foo",
            "requests.vendor.example/dev",
            "Vendor.Example/dev",
            "vendor.example/",
            "/dev",
            "vendor.example/dev/extra",
            "vendor.example/-dev",
            "vendor.example/dev-",
            "vendor..example/dev",
            "vendor.example/has space",
        ] {
            assert!(!is_extended_resource_name(bad), "{bad} should be refused");
        }
        let long = format!("vendor.example/{}", "a".repeat(64));
        assert!(!is_extended_resource_name(&long));
        let ok = format!("vendor.example/{}", "a".repeat(63));
        assert!(is_extended_resource_name(&ok));
    }

    #[test]
    fn refusal_texts_match_the_kubelet() {
        assert_eq!(
            unsupported_version_message("v1alpha"),
            "requested API version \"v1alpha\" is not supported by kubelet. Supported version is [\"v1beta1\"]"
        );
        assert_eq!(
            invalid_resource_name_message("bad_name"),
            "the ResourceName \"bad_name\" is invalid"
        );
    }

    #[test]
    fn go_quote_escapes_like_go() {
        assert_eq!(go_quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(go_quote("\u{0}\n\u{1b}"), "\"\\x00\\n\\x1b\"");
        assert_eq!(go_quote("héllo"), "\"héllo\"");
        assert_eq!(go_quote("\u{85}"), "\"\\u0085\"");
    }
}
