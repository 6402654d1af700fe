//! Rust source as the house check reads it: comments and literals blanked, then a flat list
//! of tokens with their lines. No parser crate: the check needs only paths, `use` trees and
//! `mod` declarations, and a tokenizer this small keeps `cargo xtask house` free of a build
//! of anything but xtask.

/// The source with comments, string and char literals replaced by spaces (newlines kept, so
/// line numbers still hold).
pub(super) fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if (c == b'r' || c == b'b')
            && !b
                .get(i.wrapping_sub(1))
                .is_some_and(|p| p.is_ascii_alphanumeric() || *p == b'_')
            && raw_string_at(b, i).is_some()
        {
            let end = raw_string_at(b, i).expect("checked");
            while i < end {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == b'"' {
            blank(&mut out, c);
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                if i < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            if i < b.len() {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == b'\'' {
            // A char literal ('a', '\n', '\u{1F600}', 'é') or a lifetime ('a): a literal
            // closes within a few bytes, a lifetime does not.
            let close = if b.get(i + 1) == Some(&b'\\') {
                (i + 3..b.len().min(i + 12)).find(|&j| b[j] == b'\'')
            } else {
                (i + 2..b.len().min(i + 6))
                    .find(|&j| b[j] == b'\'')
                    .filter(|&j| {
                        std::str::from_utf8(&b[i + 1..j]).is_ok_and(|s| s.chars().count() == 1)
                    })
            };
            match close {
                Some(j) => {
                    while i <= j {
                        blank(&mut out, b[i]);
                        i += 1;
                    }
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// If a raw string (`r"…"`, `r#"…"#`, `br"…"`) starts at `i`, the index past its end.
fn raw_string_at(b: &[u8], mut i: usize) -> Option<usize> {
    if b[i] == b'b' {
        i += 1;
    }
    if b.get(i) != Some(&b'r') {
        return None;
    }
    i += 1;
    let mut hashes = 0;
    while b.get(i) == Some(&b'#') {
        hashes += 1;
        i += 1;
    }
    if b.get(i) != Some(&b'"') {
        return None;
    }
    i += 1;
    while i < b.len() {
        if b[i] == b'"' && (0..hashes).all(|h| b.get(i + 1 + h) == Some(&b'#')) {
            return Some(i + 1 + hashes);
        }
        i += 1;
    }
    Some(b.len())
}

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

/// Tokens with their line numbers.
pub(super) fn tokens(code: &str) -> Vec<(Tok, usize)> {
    let mut out = Vec::new();
    let mut line = 1;
    let mut chars = code.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        if c == '\n' {
            line += 1;
        } else if c.is_alphabetic() || c == '_' {
            let mut ident = String::from(c);
            while let Some(&(_, n)) = chars.peek() {
                if n.is_alphanumeric() || n == '_' {
                    ident.push(n);
                    chars.next();
                } else {
                    break;
                }
            }
            out.push((Tok::Ident(ident), line));
        } else if c.is_ascii_digit() {
            while chars
                .peek()
                .is_some_and(|&(_, n)| n.is_alphanumeric() || n == '_')
            {
                chars.next();
            }
        } else if c == ':' && chars.peek().is_some_and(|&(_, n)| n == ':') {
            chars.next();
            out.push((Tok::PathSep, line));
        } else if !c.is_whitespace() {
            out.push((Tok::Punct(c), line));
        }
    }
    out
}
