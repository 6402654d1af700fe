//! The links of the documentation: every relative link in `README.md` and `docs/**/*.md`
//! resolves to a file, and an anchor to a heading of it (as GitHub renders the page).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The anchor GitHub gives a heading: lower case, punctuation other than `-` and `_`
/// dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    let text = strip_markup(heading);
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| {
            if c == ' ' {
                Some('-')
            } else if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c)
            } else {
                None
            }
        })
        .collect()
}

/// A heading's text as rendered: links to their text, code spans and emphasis unmarked.
fn strip_markup(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '[' => {}
            ']' if chars.peek() == Some(&'(') => {
                for n in chars.by_ref() {
                    if n == ')' {
                        break;
                    }
                }
            }
            ']' | '`' | '*' => {}
            _ => out.push(c),
        }
    }
    out
}

/// The anchors a markdown file has: its headings' slugs (numbered as GitHub numbers
/// repeats) and explicit `id="…"`/`name="…"` anchors.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut fenced = false;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if let Some(h) = t.strip_prefix('#') {
            let h = h.trim_start_matches('#');
            if h.starts_with(' ') || h.is_empty() {
                let base = slug(h.trim().trim_end_matches('#'));
                let n = seen.entry(base.clone()).or_insert(0);
                out.insert(if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                });
                *n += 1;
            }
        }
        for key in ["id=\"", "name=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(key) {
                rest = &rest[at + key.len()..];
                if let Some(end) = rest.find('"') {
                    out.insert(rest[..end].to_string());
                }
            }
        }
    }
    out
}

/// Every link target in a markdown file outside code, with its line: inline
/// `[text](target)`, images and reference definitions `[ref]: target`.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans are not links.
        let mut plain = String::new();
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                plain.push(c);
            } else {
                plain.push(' ');
            }
        }
        if let Some(rest) = plain.trim_start().strip_prefix('[') {
            if let Some(at) = rest.find("]:") {
                let target = rest[at + 2..].split_whitespace().next().unwrap_or("");
                out.push((n + 1, target.to_string()));
            }
        }
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            out.push((
                n + 1,
                target.trim_matches(|c| c == '<' || c == '>').to_string(),
            ));
            rest = &rest[end..];
        }
    }
    out
}

/// What is wrong with every relative link of the markdown files `docs` (relative to the
/// repository root `root`).
pub(super) fn broken_links(root: &Path, docs: &[PathBuf]) -> Vec<String> {
    let mut broken = Vec::new();
    for doc in docs {
        let Ok(text) = std::fs::read_to_string(root.join(doc)) else {
            broken.push(format!("{}: cannot be read", doc.display()));
            continue;
        };
        for (line, target) in links(&text) {
            if target.is_empty()
                || target.contains("://")
                || target.starts_with("mailto:")
                || target.starts_with("//")
            {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                root.join(doc)
            } else if let Some(abs) = file.strip_prefix('/') {
                root.join(abs)
            } else {
                root.join(doc).parent().unwrap_or(root).join(file)
            };
            let at = format!("{}:{line}: ({target})", doc.display());
            if !path.exists() {
                let shown = path.strip_prefix(root).unwrap_or(&path);
                broken.push(format!("{at} no such file {}", shown.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                let found =
                    std::fs::read_to_string(&path).is_ok_and(|t| anchors(&t).contains(anchor));
                if path.extension().is_some_and(|e| e == "md") && !found {
                    broken.push(format!("{at} no heading with the anchor #{anchor}"));
                }
            }
        }
    }
    broken
}
