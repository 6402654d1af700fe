//! The house rules, checked on the source tree (no build, no kernel):
//!
//! - no `.rs` file in `agent/src` is over 1,000 lines;
//! - no circle of imports between files of `agent/src`;
//! - no lower floor reaches up (the floors are [`FLOORS`]);
//! - every relative link in `README.md` and `docs/**/*.md` resolves, anchors included.
//!
//! The import graph is built from the source text: every `use` tree and every path in code
//! that starts with `crate::`, `super::` or `self::` (and `reactor::` in the binary's files)
//! becomes an edge from the file it is written in to the file that defines the module it
//! names. A name reached through a `pub use` re-export is followed to the file the
//! re-export points at, so importing `crate::node::PodManager` depends on
//! `node/manager.rs`, not on `node/mod.rs`. A module's own file referring to its submodules
//! (`node/mod.rs` re-exporting `node/manager.rs`) is containment, not an edge: the rooms of a
//! module may use what their parent defines. Comments and string literals are skipped, so an
//! intra-doc link is not an import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a source file may be.
const MAX_LINES: usize = 1000;

/// The floors of the agent library, bottom first. A module may use modules on floors below
/// its own, never on its own floor (rooms side by side do not know each other) or above.
///
/// The reactor loop runs sense → observe → decide → act → record; the floors say who may
/// *use* whom, so the stages the loop joins sit below the loop, each below what calls it:
///
/// 0. `decide`: the kubelet's rules, pure, used by everything.
/// 1. `human` (quantities and durations for people), `config`, `priority` (the process's
///    scheduling): foundations that only know decide.
/// 2. `sense`: the kernel sources and their clock.
/// 3. `observe` (signals read now; stamps with sense's clock) and `record` (metrics per sense
///    source, state files): both consume what sense produces; neither knows the other.
/// 4. `act` (the only place that changes the node; its state persists through record) and
///    `plan` (decide over JSON snapshots).
/// 5. `devices` and `images`: the node's rooms built on act and record.
/// 6. `reactor`: the loop itself, joining sense, observe, decide, act, record, images.
/// 7. `node`: the pod manager, which the loop drives through its `PodControl` trait and
///    which uses the loop's pod types.
/// 8. `api`: the gRPC front over all of it.
///
/// The binary's front end (`main.rs`, `cli/`) is above the library and not in this list.
const FLOORS: &[&[&str]] = &[
    &["decide"],
    &["human", "config", "priority"],
    &["sense"],
    &["observe", "record"],
    &["act", "plan"],
    &["devices", "images"],
    &["reactor"],
    &["node"],
    &["api"],
];

/// The tree checked: this repository, or the one `REACTOR_HOUSE_ROOT` names (to run the
/// checks on another checkout, e.g. an older commit, with the same test binary).
fn repo() -> PathBuf {
    if let Some(root) = std::env::var_os("REACTOR_HOUSE_ROOT") {
        return PathBuf::from(root);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn agent_src() -> PathBuf {
    repo().join("agent/src")
}

/// Every file under `dir` with the extension `ext`, sorted, relative to `dir`.
fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, ext, out);
            } else if path.extension().is_some_and(|e| e == ext) {
                out.push(path.strip_prefix(root).expect("under root").to_path_buf());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, ext, &mut out);
    out.sort();
    out
}

// ---------------------------------------------------------------------------------------
// Source text: comments and literals blanked, then tokens.
// ---------------------------------------------------------------------------------------

/// The source with comments, string and char literals replaced by spaces (newlines kept, so
/// line numbers still hold).
fn code_only(src: &str) -> String {
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
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

/// Tokens with their line numbers.
fn tokens(code: &str) -> Vec<(Tok, usize)> {
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

// ---------------------------------------------------------------------------------------
// Modules and references.
// ---------------------------------------------------------------------------------------

/// Which crate a file belongs to: the library (`lib.rs`) or the binary (`main.rs`, `cli/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Crate {
    Lib,
    Bin,
}

/// A module path in a crate.
type ModPath = (Crate, Vec<String>);

/// One path written in a file: where it is written (the module scope, for `super`/`self`)
/// and its segments as written.
#[derive(Debug)]
struct Reference {
    scope: Vec<String>,
    segments: Vec<String>,
    line: usize,
    /// Whether it is a `pub use` at the file's own scope (a re-export).
    reexport: Option<String>,
}

struct SourceFile {
    rel: PathBuf,
    module: ModPath,
    refs: Vec<Reference>,
}

/// The module path of a file under `agent/src`, or `None` for a file outside both crates
/// (`bin/*.rs` are crates of their own).
fn module_of(rel: &Path) -> Option<ModPath> {
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts[0] == "bin" {
        return None;
    }
    let krate = if parts[0] == "main.rs" || parts[0] == "cli" {
        Crate::Bin
    } else {
        Crate::Lib
    };
    let mut segs: Vec<String> = parts[..parts.len() - 1].to_vec();
    let last = parts.last().expect("non-empty").trim_end_matches(".rs");
    if !matches!(last, "mod" | "lib" | "main") {
        segs.push(last.to_string());
    }
    Some((krate, segs))
}

/// Parses a `use` tree starting at `toks[*i]`, pushing each full path (with the name it
/// binds) onto `out`.
fn use_tree(
    toks: &[(Tok, usize)],
    i: &mut usize,
    prefix: &[String],
    out: &mut Vec<(Vec<String>, String)>,
) {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(*i).map(|t| &t.0) {
            Some(Tok::PathSep) => *i += 1,
            Some(Tok::Ident(id)) => {
                path.push(id.clone());
                *i += 1;
                if toks.get(*i).map(|t| &t.0) == Some(&Tok::PathSep) {
                    continue;
                }
                let mut name = id.clone();
                if toks.get(*i).map(|t| &t.0) == Some(&Tok::Ident("as".into())) {
                    if let Some((Tok::Ident(alias), _)) = toks.get(*i + 1) {
                        name = alias.clone();
                    }
                    *i += 2;
                }
                if name == "self" {
                    path.pop();
                    name = path.last().cloned().unwrap_or_default();
                }
                out.push((path, name));
                return;
            }
            Some(Tok::Punct('{')) => {
                *i += 1;
                loop {
                    match toks.get(*i).map(|t| &t.0) {
                        Some(Tok::Punct('}')) => {
                            *i += 1;
                            return;
                        }
                        Some(Tok::Punct(',')) => *i += 1,
                        None => return,
                        _ => use_tree(toks, i, &path, out),
                    }
                }
            }
            Some(Tok::Punct('*')) => {
                *i += 1;
                out.push((path, "*".into()));
                return;
            }
            _ => return,
        }
    }
}

fn read_source(rel: &Path) -> Option<SourceFile> {
    let module = module_of(rel)?;
    let src = std::fs::read_to_string(agent_src().join(rel)).expect("read source");
    let toks = tokens(&code_only(&src));
    let mut refs = Vec::new();
    // Inline modules (`mod tests { … }`): (name, brace depth inside it).
    let mut scopes: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let scope_of = |scopes: &[(String, usize)]| {
        let mut s = module.1.clone();
        s.extend(scopes.iter().map(|(n, _)| n.clone()));
        s
    };
    let mut i = 0;
    while i < toks.len() {
        let (tok, line) = &toks[i];
        match tok {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                if scopes.last().is_some_and(|(_, d)| *d == depth) {
                    scopes.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let (Some((Tok::Ident(name), _)), Some((Tok::Punct('{'), _))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    depth += 1;
                    scopes.push((name.clone(), depth));
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(kw) if kw == "use" => {
                let public = match i.checked_sub(1).map(|j| &toks[j].0) {
                    Some(Tok::Ident(p)) => p == "pub",
                    Some(Tok::Punct(')')) => {
                        // `pub(crate) use` and the like.
                        (0..i)
                            .rev()
                            .take(6)
                            .any(|j| toks[j].0 == Tok::Ident("pub".into()))
                    }
                    _ => false,
                };
                let mut j = i + 1;
                let mut paths = Vec::new();
                use_tree(&toks, &mut j, &[], &mut paths);
                let scope = scope_of(&scopes);
                for (segments, name) in paths {
                    refs.push(Reference {
                        scope: scope.clone(),
                        segments,
                        line: *line,
                        reexport: (public && scopes.is_empty()).then_some(name),
                    });
                }
                i = j;
                continue;
            }
            Tok::Ident(first)
                if (matches!(first.as_str(), "crate" | "super" | "self")
                    || (first == "reactor" && module.0 == Crate::Bin))
                    && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::PathSep)
                    && i.checked_sub(1).map(|j| &toks[j].0) != Some(&Tok::PathSep) =>
            {
                let mut segments = vec![first.clone()];
                let mut j = i + 1;
                while toks.get(j).map(|t| &t.0) == Some(&Tok::PathSep) {
                    match toks.get(j + 1) {
                        Some((Tok::Ident(id), _)) => {
                            segments.push(id.clone());
                            j += 2;
                        }
                        _ => break,
                    }
                }
                refs.push(Reference {
                    scope: scope_of(&scopes),
                    segments,
                    line: *line,
                    reexport: None,
                });
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Some(SourceFile {
        rel: rel.to_path_buf(),
        module,
        refs,
    })
}

/// The crate's files and what each re-exports.
struct Tree {
    files: Vec<SourceFile>,
    by_module: BTreeMap<ModPath, usize>,
    /// Per file: re-exported name → absolute path it points at.
    reexports: Vec<BTreeMap<String, ModPath>>,
    /// Per file: absolute paths of its glob re-exports.
    globs: Vec<Vec<ModPath>>,
}

impl Tree {
    fn load() -> Tree {
        let files: Vec<SourceFile> = files(&agent_src(), "rs")
            .iter()
            .filter_map(|rel| read_source(rel))
            .collect();
        let by_module = files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.module.clone(), i))
            .collect();
        let mut tree = Tree {
            reexports: vec![BTreeMap::new(); files.len()],
            globs: vec![Vec::new(); files.len()],
            files,
            by_module,
        };
        for i in 0..tree.files.len() {
            let krate = tree.files[i].module.0;
            for r in &tree.files[i].refs {
                let Some(name) = &r.reexport else { continue };
                let Some(abs) = tree.absolute(krate, &r.scope, &r.segments) else {
                    continue;
                };
                if name == "*" {
                    tree.globs[i].push(abs);
                } else {
                    tree.reexports[i].insert(name.clone(), abs);
                }
            }
        }
        tree
    }

    /// The absolute path a written path names, or `None` for one outside both crates
    /// (`std::`, `tokio::`, …).
    fn absolute(&self, krate: Crate, scope: &[String], segs: &[String]) -> Option<ModPath> {
        let (first, rest) = segs.split_first()?;
        match first.as_str() {
            "crate" => Some((krate, rest.to_vec())),
            "reactor" if krate == Crate::Bin => Some((Crate::Lib, rest.to_vec())),
            "self" => {
                let mut p = scope.to_vec();
                p.extend_from_slice(rest);
                Some((krate, p))
            }
            "super" => {
                let mut p = scope.to_vec();
                p.pop()?;
                let mut rest = rest;
                while rest.first().is_some_and(|s| s == "super") {
                    p.pop()?;
                    rest = &rest[1..];
                }
                p.extend_from_slice(rest);
                Some((krate, p))
            }
            // A path relative to the current module (`pub use manager::PodManager` in
            // `node/mod.rs`), if it names a submodule.
            _ => {
                let mut p = scope.to_vec();
                p.push(first.clone());
                self.by_module.contains_key(&(krate, p.clone())).then(|| {
                    p.extend_from_slice(rest);
                    (krate, p)
                })
            }
        }
    }

    /// The file that defines what the absolute path names: the deepest module file on the
    /// path, following re-exports of the next name.
    fn defining_file(&self, path: &ModPath, hops: usize) -> Option<usize> {
        let (krate, segs) = path;
        let (n, file) = (0..=segs.len())
            .rev()
            .find_map(|n| Some((n, *self.by_module.get(&(*krate, segs[..n].to_vec()))?)))?;
        if hops < 8 {
            if let Some(next) = segs.get(n) {
                if let Some(target) = self.reexports[file].get(next) {
                    let mut p = target.1.clone();
                    p.extend_from_slice(&segs[n + 1..]);
                    return self.defining_file(&(target.0, p), hops + 1).or(Some(file));
                }
                for glob in &self.globs[file] {
                    let mut p = glob.1.clone();
                    p.push(next.clone());
                    p.extend_from_slice(&segs[n + 1..]);
                    if let Some(f) = self.defining_file(&(glob.0, p), hops + 1) {
                        if f != file && self.files[f].module.1.len() > glob.1.len() {
                            return Some(f);
                        }
                    }
                }
            }
        }
        Some(file)
    }

    /// The file-level import graph: for each file, the files it uses, with the first line
    /// and path that makes each edge.
    fn graph(&self) -> Vec<BTreeMap<usize, (usize, String)>> {
        let mut edges = vec![BTreeMap::new(); self.files.len()];
        for (i, f) in self.files.iter().enumerate() {
            for r in &f.refs {
                let Some(abs) = self.absolute(f.module.0, &r.scope, &r.segments) else {
                    continue;
                };
                let Some(to) = self.defining_file(&abs, 0) else {
                    continue;
                };
                let target = &self.files[to].module;
                let contained =
                    target.0 == f.module.0 && target.1.starts_with(&f.module.1) && to != i;
                if to == i || contained {
                    continue;
                }
                edges[i]
                    .entry(to)
                    .or_insert_with(|| (r.line, r.segments.join("::")));
            }
        }
        edges
    }

    fn name(&self, i: usize) -> String {
        self.files[i].rel.display().to_string()
    }
}

/// Every circle in the graph, one per strongly connected component of more than one file:
/// a closed walk through it (`a -> b -> a`) and every file of the component.
fn cycles(edges: &[BTreeMap<usize, (usize, String)>]) -> Vec<(Vec<usize>, Vec<usize>)> {
    // Tarjan's algorithm, iteratively small enough to recurse on a few hundred files.
    struct State<'a> {
        edges: &'a [BTreeMap<usize, (usize, String)>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        comps: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        let outs: Vec<usize> = s.edges[v].keys().copied().collect();
        for w in outs {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                _ => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                s.comps.push(comp);
            }
        }
    }
    let n = edges.len();
    let mut s = State {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        comps: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    // One concrete circle per component: the shortest way from its first file back to it.
    s.comps
        .into_iter()
        .map(|comp| {
            let set: BTreeSet<usize> = comp.iter().copied().collect();
            let start = *set.iter().next().expect("non-empty");
            let mut prev: BTreeMap<usize, usize> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([start]);
            'bfs: while let Some(v) = queue.pop_front() {
                for &w in edges[v].keys() {
                    if !set.contains(&w) || prev.contains_key(&w) {
                        continue;
                    }
                    prev.insert(w, v);
                    if w == start {
                        break 'bfs;
                    }
                    queue.push_back(w);
                }
            }
            let mut walk = vec![start];
            let mut at = prev[&start];
            while at != start {
                walk.push(at);
                at = prev[&at];
            }
            walk.push(start);
            walk.reverse();
            (walk, set.into_iter().collect())
        })
        .collect()
}

#[test]
fn no_source_file_is_over_1000_lines() {
    let long: Vec<String> = files(&agent_src(), "rs")
        .into_iter()
        .filter_map(|rel| {
            let n = std::fs::read_to_string(agent_src().join(&rel))
                .expect("read")
                .lines()
                .count();
            (n > MAX_LINES).then(|| format!("agent/src/{} has {n} lines", rel.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines (split by responsibility):\n  {}",
        long.join("\n  ")
    );
}

#[test]
fn no_circle_of_imports() {
    let tree = Tree::load();
    let edges = tree.graph();
    let found: Vec<String> = cycles(&edges)
        .iter()
        .map(|(walk, component)| {
            let steps: Vec<String> = walk
                .windows(2)
                .map(|w| {
                    let (line, path) = &edges[w[0]][&w[1]];
                    format!(
                        "agent/src/{} -> agent/src/{} (line {line}: {path})",
                        tree.name(w[0]),
                        tree.name(w[1])
                    )
                })
                .collect();
            let members: Vec<String> = component.iter().map(|&f| tree.name(f)).collect();
            format!(
                "{}\n    (all files tangled with these: {})",
                steps.join("\n    "),
                members.join(", ")
            )
        })
        .collect();
    assert!(
        found.is_empty(),
        "circles of imports between files:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn the_graph_sees_known_edges() {
    // The checker itself: edges it must see, so a parser that saw nothing cannot pass.
    let tree = Tree::load();
    let edges = tree.graph();
    let find = |rel: &str| {
        tree.files
            .iter()
            .position(|f| f.rel == Path::new(rel))
            .unwrap_or_else(|| panic!("{rel} is a source file"))
    };
    let has = |from: &str, to: &str| edges[find(from)].contains_key(&find(to));
    assert!(has("reactor/mod.rs", "sense/mod.rs"));
    assert!(has("node/manager.rs", "node/mod.rs"), "super::NodeError");
    assert!(
        has("api/server.rs", "node/manager.rs"),
        "re-export followed"
    );
    assert!(!has("node/mod.rs", "node/manager.rs"), "containment");
    assert!(
        cycles(&[
            BTreeMap::from([(1, (1, "a".into()))]),
            BTreeMap::from([(0, (1, "b".into()))])
        ]) == vec![(vec![0, 1, 0], vec![0, 1])]
    );
}

/// The top-level module a library file belongs to.
fn room(module: &ModPath) -> Option<&str> {
    (module.0 == Crate::Lib)
        .then(|| module.1.first().map(String::as_str))
        .flatten()
}

fn floor_of(room: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&room))
}

#[test]
fn no_floor_reaches_up() {
    let tree = Tree::load();
    let edges = tree.graph();
    let mut unplaced = BTreeSet::new();
    let mut up = Vec::new();
    for (i, outs) in edges.iter().enumerate() {
        let Some(from) = room(&tree.files[i].module) else {
            continue;
        };
        for (&to, (line, path)) in outs {
            let Some(to_room) = room(&tree.files[to].module) else {
                continue;
            };
            if from == to_room {
                continue;
            }
            let (Some(a), Some(b)) = (floor_of(from), floor_of(to_room)) else {
                unplaced.insert(if floor_of(from).is_none() {
                    from
                } else {
                    to_room
                });
                continue;
            };
            let what = format!(
                "agent/src/{} ({from}, floor {a}) uses agent/src/{} ({to_room}, floor {b}) at line {line}: {path}",
                tree.name(i),
                tree.name(to)
            );
            if a <= b {
                up.push(what);
            }
        }
    }
    assert!(
        unplaced.is_empty(),
        "modules on no floor (add them to FLOORS): {unplaced:?}"
    );
    assert!(
        up.is_empty(),
        "floors reaching up or sideways:\n  {}",
        up.join("\n  ")
    );
}

// ---------------------------------------------------------------------------------------
// Links in the documentation.
// ---------------------------------------------------------------------------------------

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
fn broken_links(root: &Path, docs: &[PathBuf]) -> Vec<String> {
    let mut broken = Vec::new();
    for doc in docs {
        let text = std::fs::read_to_string(root.join(doc)).expect("read markdown");
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
                root.join(doc).parent().expect("in a directory").join(file)
            };
            let at = format!("{}:{line}: ({target})", doc.display());
            if !path.exists() {
                broken.push(format!("{at} no such file {}", path.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                if path.extension().is_some_and(|e| e == "md") {
                    let text = std::fs::read_to_string(&path).expect("read markdown");
                    if !anchors(&text).contains(anchor) {
                        broken.push(format!("{at} no heading with the anchor #{anchor}"));
                    }
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_resolves() {
    let root = repo();
    let mut docs = vec![PathBuf::from("README.md")];
    docs.extend(
        files(&root.join("docs"), "md")
            .into_iter()
            .map(|p| Path::new("docs").join(p)),
    );
    let broken = broken_links(&root, &docs);
    assert!(
        broken.is_empty(),
        "broken links:\n  {}",
        broken.join("\n  ")
    );
}

#[test]
fn the_link_checker_catches_a_broken_link() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("docs")).unwrap();
    std::fs::write(
        dir.path().join("README.md"),
        "# Top\n## The `status` command: what it says\n\
         [ok](docs/a.md) [ok](#the-status-command-what-it-says) [ok](docs/a.md#run-it-1)\n\
         [gone](docs/b.md) [bad anchor](docs/a.md#nope) `[code](nowhere.md)`\n\
         [web](https://example.com/x.md)\n```\n[fenced](nowhere.md)\n```\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("docs/a.md"), "# Run it\n# Run it\n").unwrap();
    let broken = broken_links(dir.path(), &[PathBuf::from("README.md")]);
    assert_eq!(broken.len(), 2, "{broken:#?}");
    assert!(
        broken[0].contains("(docs/b.md) no such file"),
        "{broken:#?}"
    );
    assert!(
        broken[1].contains("no heading with the anchor #nope"),
        "{broken:#?}"
    );
}
