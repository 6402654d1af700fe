//! The import graph of one crate, read from its source text.
//!
//! A crate's files are found as the compiler finds them: from its root file, following every
//! `mod name;` (and `#[path = "…"]`), so a file shared by several crates (`#[path]`, a
//! `mod common;` in several test crates) is checked in each of them, and a stray file no
//! crate declares is not a node.
//!
//! Every `use` tree and every path in code that starts with `crate::`, `super::`, `self::`
//! or the name of a submodule becomes an edge from the file it is written in to the file
//! that defines the module it names. A name reached through a `pub use` re-export is
//! followed to the file the re-export points at, so importing `crate::node::PodManager`
//! depends on `node/manager.rs`, not on `node/mod.rs`; so is a name a module's file only
//! imports (a private `use`) and its submodules reach as `super::name`. Comments and string literals are
//! skipped, so an intra-doc link is not an import. Paths into other crates are not edges:
//! a circle cannot cross crates, and the floors are a rule inside one.
//!
//! **Parent and child.** A module's own file declaring its submodules (`mod manager;`) and
//! re-exporting their names at its top (`pub use manager::PodManager;`) is containment, not
//! an edge: the parent is the door of its rooms, and the rooms may use what it defines.
//! Anything more is an edge from the parent to the child, so a circle through the parent is
//! seen: a private `use child::X`, a path `child::f()` in code, and a re-exported name the
//! parent's own code then uses (`pub use manager::PodManager;` and `fn f(m: &PodManager)`).
//! A glob re-export (`pub use child::*`) is containment only: which names the parent then
//! uses from it would take knowing what the child defines.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Component, Path, PathBuf};

use super::source::{code_only, tokens, Tok};

/// A module path inside one crate, from its root (empty for the root file itself).
pub(super) type ModPath = Vec<String>;

/// Per file: the files it uses, each with the first line and the path as written that makes
/// the edge.
pub(super) type Edges = Vec<BTreeMap<usize, (usize, String)>>;

/// One path written in a file.
#[derive(Debug)]
struct Reference {
    /// The module it is written in (inline modules included), for `self` and `super`.
    scope: ModPath,
    segments: Vec<String>,
    line: usize,
    /// The name it binds, when it is a `use` at the file's own scope (not in a function
    /// body or an inline module, whose imports no other file reaches).
    binds: Option<String>,
    /// Whether that `use` is `pub` (a re-export).
    public: bool,
}

/// A `mod name;` declaration: the inline modules it sits in, its name, its `#[path]`.
struct ModDecl {
    inline: Vec<String>,
    name: String,
    path: Option<String>,
}

/// One file of a crate.
pub(super) struct SourceFile {
    /// Relative to the workspace root.
    pub(super) rel: PathBuf,
    pub(super) module: ModPath,
    refs: Vec<Reference>,
    /// Identifiers in code outside `use` items and other than field names, each with the
    /// first line it is on: which re-exported names the file itself uses.
    idents: BTreeMap<String, usize>,
}

/// The files of one crate and what each re-exports.
pub(super) struct Crate {
    pub(super) files: Vec<SourceFile>,
    by_module: BTreeMap<ModPath, usize>,
    /// Per file: re-exported name → absolute path it points at.
    reexports: Vec<BTreeMap<String, ModPath>>,
    /// Per file: name a private `use` at its scope binds → absolute path. A submodule
    /// reaches it as `super::name`, and depends on where it points, not on this file.
    imports: Vec<BTreeMap<String, ModPath>>,
    /// Per file: absolute paths of its glob re-exports.
    globs: Vec<Vec<ModPath>>,
}

/// `a/b/../c.rs` as `a/c.rs`: a `#[path]` names files relative to the declaring one.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The `#[path = "…"]` among the attributes that end just before `toks[end]`, read from
/// the original line (the literal itself is blanked in the tokens).
fn path_attribute(toks: &[(Tok, usize)], mut end: usize, lines: &[&str]) -> Option<String> {
    // Over `pub` and `pub(…)` first.
    if end > 0 && toks[end - 1].0 == Tok::Punct(')') {
        let open = (0..end - 1).rev().find(|&j| toks[j].0 == Tok::Punct('('))?;
        end = open;
    }
    if end > 0 && toks[end - 1].0 == Tok::Ident("pub".into()) {
        end -= 1;
    }
    // Each attribute `# [ … ]`, last first.
    while end > 0 && toks[end - 1].0 == Tok::Punct(']') {
        let open = (0..end - 1).rev().find(|&j| toks[j].0 == Tok::Punct('['))?;
        if open == 0 || toks[open - 1].0 != Tok::Punct('#') {
            return None;
        }
        if let Some((Tok::Ident(name), line)) = toks.get(open + 1) {
            if name == "path" {
                let text = lines.get(line - 1)?;
                let after = &text[text.find("path")? + 4..];
                let start = after.find('"')? + 1;
                let len = after[start..].find('"')?;
                return Some(after[start..start + len].to_string());
            }
        }
        end = open - 1;
    }
    None
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

/// What one file says: its paths, its identifiers, its `mod` declarations.
struct Parsed {
    refs: Vec<Reference>,
    idents: BTreeMap<String, usize>,
    mods: Vec<ModDecl>,
}

/// Reads the paths, identifiers and `mod name;` declarations of the file of `module`.
fn parse(src: &str, module: &ModPath) -> Parsed {
    let toks = tokens(&code_only(src));
    let lines: Vec<&str> = src.lines().collect();
    let mut out = Parsed {
        refs: Vec::new(),
        idents: BTreeMap::new(),
        mods: Vec::new(),
    };
    // Inline modules (`mod tests { … }`): (name, brace depth inside it).
    let mut scopes: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let scope_of = |scopes: &[(String, usize)]| {
        let mut s = module.clone();
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
            Tok::Ident(kw) if kw == "mod" => match (toks.get(i + 1), toks.get(i + 2)) {
                (Some((Tok::Ident(name), _)), Some((Tok::Punct('{'), _))) => {
                    depth += 1;
                    scopes.push((name.clone(), depth));
                    i += 3;
                    continue;
                }
                (Some((Tok::Ident(name), _)), Some((Tok::Punct(';'), _))) => {
                    out.mods.push(ModDecl {
                        inline: scopes.iter().map(|(n, _)| n.clone()).collect(),
                        name: name.clone(),
                        path: path_attribute(&toks, i, &lines),
                    });
                    i += 3;
                    continue;
                }
                _ => {}
            },
            Tok::Ident(kw) if kw == "use" => {
                let public = match i.checked_sub(1).map(|j| &toks[j].0) {
                    Some(Tok::Ident(p)) => p == "pub",
                    // `pub(crate) use` and the like.
                    Some(Tok::Punct(')')) => (0..i)
                        .rev()
                        .take(6)
                        .any(|j| toks[j].0 == Tok::Ident("pub".into())),
                    _ => false,
                };
                let mut j = i + 1;
                let mut paths = Vec::new();
                use_tree(&toks, &mut j, &[], &mut paths);
                let scope = scope_of(&scopes);
                for (segments, name) in paths {
                    out.refs.push(Reference {
                        scope: scope.clone(),
                        segments,
                        line: *line,
                        binds: (depth == 0).then_some(name),
                        public,
                    });
                }
                i = j;
                continue;
            }
            Tok::Ident(first)
                if toks.get(i + 1).map(|t| &t.0) == Some(&Tok::PathSep)
                    && i.checked_sub(1).map(|j| &toks[j].0) != Some(&Tok::PathSep) =>
            {
                // Any path: `crate::`, `super::`, `self::`, or a submodule's name (which
                // `Crate::absolute` tells from a type's or another crate's).
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
                out.refs.push(Reference {
                    scope: scope_of(&scopes),
                    segments,
                    line: *line,
                    binds: None,
                    public: false,
                });
                i = j;
                continue;
            }
            // A name as code uses an item: not a field (`x.name`, `name: value`).
            Tok::Ident(id)
                if i.checked_sub(1).map(|j| &toks[j].0) != Some(&Tok::Punct('.'))
                    && toks.get(i + 1).map(|t| &t.0) != Some(&Tok::Punct(':')) =>
            {
                out.idents.entry(id.clone()).or_insert(*line);
            }
            _ => {}
        }
        i += 1;
    }
    out
}

impl Crate {
    /// The crate whose root file is `root_file` (relative to the workspace root `root`).
    pub(super) fn load(root: &Path, root_file: &Path) -> Crate {
        let mut files = Vec::new();
        let mut seen = BTreeSet::new();
        let mut queue = VecDeque::from([(root_file.to_path_buf(), ModPath::new())]);
        while let Some((rel, module)) = queue.pop_front() {
            if !seen.insert(rel.clone()) {
                continue;
            }
            // A module the compiler would not find either (generated, or cfg'd away): not
            // a node.
            let Ok(src) = std::fs::read_to_string(root.join(&rel)) else {
                continue;
            };
            let parsed = parse(&src, &module);
            // Where `mod x;` looks: beside a crate root or `mod.rs`, else in a folder named
            // after the file.
            let here = rel.parent().unwrap_or(Path::new("")).to_path_buf();
            let dir = if rel == root_file || rel.file_name().is_some_and(|n| n == "mod.rs") {
                here.clone()
            } else {
                here.join(rel.file_stem().unwrap_or_default())
            };
            for m in parsed.mods {
                let mut child = module.clone();
                child.extend(m.inline.iter().cloned());
                child.push(m.name.clone());
                let file = match m.path {
                    Some(p) => here.join(p),
                    None => {
                        let d = m.inline.iter().fold(dir.clone(), |d, s| d.join(s));
                        let flat = d.join(format!("{}.rs", m.name));
                        if root.join(&flat).is_file() {
                            flat
                        } else {
                            d.join(&m.name).join("mod.rs")
                        }
                    }
                };
                queue.push_back((normalize(&file), child));
            }
            files.push(SourceFile {
                rel,
                module,
                refs: parsed.refs,
                idents: parsed.idents,
            });
        }
        let by_module = files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.module.clone(), i))
            .collect();
        let mut krate = Crate {
            reexports: vec![BTreeMap::new(); files.len()],
            imports: vec![BTreeMap::new(); files.len()],
            globs: vec![Vec::new(); files.len()],
            files,
            by_module,
        };
        for i in 0..krate.files.len() {
            for r in &krate.files[i].refs {
                let Some(name) = &r.binds else { continue };
                let Some(abs) = krate.absolute(&r.scope, &r.segments) else {
                    continue;
                };
                if name == "*" {
                    if r.public {
                        krate.globs[i].push(abs);
                    }
                } else if r.public {
                    krate.reexports[i].insert(name.clone(), abs);
                } else {
                    krate.imports[i].insert(name.clone(), abs);
                }
            }
        }
        krate
    }

    /// The absolute path a written path names, or `None` for one outside the crate
    /// (`std::`, `tokio::`, a type's associated item, …).
    fn absolute(&self, scope: &[String], segs: &[String]) -> Option<ModPath> {
        let (first, rest) = segs.split_first()?;
        match first.as_str() {
            "crate" => Some(rest.to_vec()),
            "self" => {
                let mut p = scope.to_vec();
                p.extend_from_slice(rest);
                Some(p)
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
                Some(p)
            }
            // A path relative to the current module (`pub use manager::PodManager` in
            // `node/mod.rs`), if it names a submodule.
            _ => {
                let mut p = scope.to_vec();
                p.push(first.clone());
                self.by_module.contains_key(&p).then(|| {
                    p.extend_from_slice(rest);
                    p
                })
            }
        }
    }

    /// The file that defines what the absolute path names: the deepest module file on the
    /// path, following re-exports of the next name.
    fn defining_file(&self, segs: &[String], hops: usize) -> Option<usize> {
        let (n, file) = (0..=segs.len())
            .rev()
            .find_map(|n| Some((n, *self.by_module.get(&segs[..n])?)))?;
        if hops < 8 {
            if let Some(next) = segs.get(n) {
                let bound = self.reexports[file].get(next);
                if let Some(target) = bound.or_else(|| self.imports[file].get(next)) {
                    let mut p = target.clone();
                    p.extend_from_slice(&segs[n + 1..]);
                    return self.defining_file(&p, hops + 1).or(Some(file));
                }
                for glob in &self.globs[file] {
                    let mut p = glob.clone();
                    p.push(next.clone());
                    p.extend_from_slice(&segs[n + 1..]);
                    if let Some(f) = self.defining_file(&p, hops + 1) {
                        if f != file && self.files[f].module.len() > glob.len() {
                            return Some(f);
                        }
                    }
                }
            }
        }
        Some(file)
    }

    /// Whether file `to` is a submodule (at any depth) of file `from`.
    pub(super) fn contains(&self, from: usize, to: usize) -> bool {
        let (outer, inner) = (&self.files[from].module, &self.files[to].module);
        inner.len() > outer.len() && inner.starts_with(outer)
    }

    /// The file-level import graph (see the module doc for what is an edge).
    pub(super) fn graph(&self) -> Edges {
        let mut edges = vec![BTreeMap::new(); self.files.len()];
        for (i, f) in self.files.iter().enumerate() {
            for r in &f.refs {
                let Some(abs) = self.absolute(&r.scope, &r.segments) else {
                    continue;
                };
                let Some(to) = self.defining_file(&abs, 0) else {
                    continue;
                };
                let reexport = r.public && r.binds.is_some();
                if to == i || (reexport && self.contains(i, to)) {
                    continue;
                }
                edges[i]
                    .entry(to)
                    .or_insert_with(|| (r.line, r.segments.join("::")));
            }
            // A re-exported name the file's own code uses is an import as well.
            for (name, target) in &self.reexports[i] {
                let Some(&line) = f.idents.get(name) else {
                    continue;
                };
                match self.defining_file(target, 0) {
                    Some(to) if to != i => {
                        edges[i]
                            .entry(to)
                            .or_insert_with(|| (line, format!("{name} (re-exported, used here)")));
                    }
                    _ => {}
                }
            }
        }
        edges
    }

    /// A file's path, as the failures name it.
    pub(super) fn name(&self, i: usize) -> String {
        self.files[i].rel.display().to_string()
    }
}

/// Every circle in the graph, one per strongly connected component of more than one file:
/// a closed walk through it (`a -> b -> a`) and every file of the component.
pub(super) fn cycles(edges: &[BTreeMap<usize, (usize, String)>]) -> Vec<(Vec<usize>, Vec<usize>)> {
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
