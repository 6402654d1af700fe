//! The house check's own rules, each run on a small tree planted with the fault it must
//! find: a check that passes the real tree proves nothing unless it is seen to fail.

use std::path::{Path, PathBuf};

use super::graph::Crate;
use super::{check, discover, links, CrateRoot, Floors, Known, Workspace};

/// No allowlist.
const NONE: Known = Known {
    circles: &[],
    long: &[],
};

/// A workspace of one crate rooted at `src/lib.rs`, from (path, text) pairs, with a README
/// so the link check has its file.
fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README.md"), "# A tree for one test\n").unwrap();
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

fn workspace(dir: &Path, floors: Option<Floors>) -> Workspace {
    Workspace {
        root: dir.to_path_buf(),
        members: vec![PathBuf::new()],
        crates: vec![CrateRoot {
            root: PathBuf::from("src/lib.rs"),
            floors,
        }],
    }
}

fn faults(dir: &Path, floors: Option<Floors>, known: &Known) -> Vec<String> {
    check(&workspace(dir, floors), known).faults
}

/// The edges of the tree's crate as (from, to) file names.
fn edges(dir: &Path) -> Vec<(String, String)> {
    let krate = Crate::load(dir, Path::new("src/lib.rs"));
    let graph = krate.graph();
    let mut out = Vec::new();
    for (from, outs) in graph.iter().enumerate() {
        for &to in outs.keys() {
            out.push((krate.name(from), krate.name(to)));
        }
    }
    out
}

fn edge(from: &str, to: &str) -> (String, String) {
    (from.to_string(), to.to_string())
}

#[test]
fn a_planted_circle_between_siblings_fails_naming_its_edges() {
    let dir = tree(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a.rs", "use crate::b::B;\npub struct A;\n"),
        ("src/b.rs", "pub struct B;\n\npub fn f(_: crate::a::A) {}\n"),
    ]);
    let want = vec![
        "circle of imports: src/a.rs -> src/b.rs (line 1: crate::b::B) -> src/a.rs (line 3: crate::a::A)"
            .to_string(),
    ];
    assert_eq!(faults(dir.path(), None, &NONE), want);
    // An entry covers a circle only with exactly its files.
    let known = Known {
        circles: &[(&["src/a.rs"], "one of its two files")],
        long: &[],
    };
    let got = faults(dir.path(), None, &known);
    assert!(got.contains(&want[0]), "{got:#?}");
}

#[test]
fn a_child_and_its_parent_that_use_each_other_are_a_circle() {
    let dir = tree(&[
        ("src/lib.rs", "pub mod node;\n"),
        (
            "src/node/mod.rs",
            "mod manager;\n\npub struct NodeError;\n\npub fn start() {\n    manager::run();\n}\n",
        ),
        (
            "src/node/manager.rs",
            "use super::NodeError;\n\npub fn run() -> Option<NodeError> {\n    None\n}\n",
        ),
    ]);
    assert_eq!(
        faults(dir.path(), None, &NONE),
        vec![
            "circle of imports: src/node/mod.rs -> src/node/manager.rs (line 6: manager::run) -> src/node/mod.rs (line 1: super::NodeError)"
        ]
    );
}

#[test]
fn a_re_exported_name_the_parent_uses_itself_is_an_import() {
    let dir = tree(&[
        ("src/lib.rs", "pub mod node;\n"),
        (
            "src/node/mod.rs",
            "mod manager;\npub use manager::PodManager;\n\npub struct NodeError;\n\npub fn f(_: &PodManager) {}\n",
        ),
        (
            "src/node/manager.rs",
            "use super::NodeError;\n\npub struct PodManager(Option<NodeError>);\n",
        ),
    ]);
    assert_eq!(
        faults(dir.path(), None, &NONE),
        vec![
            "circle of imports: src/node/mod.rs -> src/node/manager.rs (line 6: PodManager (re-exported, used here)) -> src/node/mod.rs (line 1: super::NodeError)"
        ]
    );
}

#[test]
fn a_parent_that_declares_and_re_exports_its_children_is_no_circle() {
    let dir = tree(&[
        ("src/lib.rs", "pub mod node;\n"),
        (
            "src/node/mod.rs",
            // A field named like a re-exported function is not a use of it.
            "pub mod manager;\nmod stop;\npub use manager::{start_ticks, PodManager};\n\n\
             pub struct NodeError {\n    start_ticks: u64,\n}\n",
        ),
        (
            "src/node/manager.rs",
            "use super::NodeError;\n\npub struct PodManager(Option<NodeError>);\n\n\
             pub fn start_ticks() -> u64 {\n    0\n}\n",
        ),
        (
            "src/node/stop.rs",
            "use super::PodManager;\n\npub fn stop(_: &PodManager) {}\n",
        ),
    ]);
    assert_eq!(faults(dir.path(), None, &NONE), Vec::<String>::new());
    let got = edges(dir.path());
    assert!(
        got.contains(&edge("src/node/stop.rs", "src/node/manager.rs")),
        "the re-export is followed to the file that defines the name: {got:?}"
    );
    assert!(got.contains(&edge("src/node/manager.rs", "src/node/mod.rs")));
    assert!(
        !got.contains(&edge("src/node/mod.rs", "src/node/manager.rs")),
        "containment: {got:?}"
    );
}

#[test]
fn a_name_the_parent_only_imports_is_followed_to_its_file() {
    let dir = tree(&[
        ("src/lib.rs", "pub mod error;\npub mod node;\n"),
        ("src/error.rs", "pub struct Failure;\n"),
        (
            "src/node/mod.rs",
            "mod manager;\nuse crate::error::Failure;\n\npub fn start() -> Option<Failure> {\n    manager::run()\n}\n",
        ),
        (
            "src/node/manager.rs",
            "use super::Failure;\n\npub fn run() -> Option<Failure> {\n    None\n}\n",
        ),
    ]);
    assert_eq!(faults(dir.path(), None, &NONE), Vec::<String>::new());
    let mut got = edges(dir.path());
    got.sort();
    assert_eq!(
        got,
        vec![
            edge("src/node/manager.rs", "src/error.rs"),
            edge("src/node/mod.rs", "src/error.rs"),
            edge("src/node/mod.rs", "src/node/manager.rs"),
        ]
    );
}

#[test]
fn an_import_inside_a_function_is_no_name_of_the_file() {
    let dir = tree(&[
        ("src/lib.rs", "pub mod error;\npub mod node;\n"),
        ("src/error.rs", "pub struct Failure;\n"),
        (
            "src/node/mod.rs",
            "mod manager;\n\npub struct Failure;\n\nfn wrap() {\n    use crate::error::Failure;\n    let _ = Failure;\n}\n",
        ),
        ("src/node/manager.rs", "use super::Failure;\n"),
    ]);
    let got = edges(dir.path());
    assert!(
        got.contains(&edge("src/node/manager.rs", "src/node/mod.rs")),
        "super::Failure is the parent's own struct: {got:?}"
    );
    assert!(
        !got.contains(&edge("src/node/manager.rs", "src/error.rs")),
        "{got:?}"
    );
}

#[test]
fn a_planted_upward_import_fails_naming_both_floors() {
    const FLOORS: Floors = &[&["decide"], &["sense"]];
    let up = tree(&[
        ("src/lib.rs", "pub mod decide;\npub mod sense;\n"),
        (
            "src/decide/mod.rs",
            "//! Pure.\n\npub fn rule() -> u64 {\n    crate::sense::now()\n}\n",
        ),
        ("src/sense/mod.rs", "pub fn now() -> u64 {\n    0\n}\n"),
    ]);
    assert_eq!(
        faults(up.path(), Some(FLOORS), &NONE),
        vec![
            "floor reached up: src/decide/mod.rs (decide, floor 0) uses src/sense/mod.rs (sense, floor 1) at line 4: crate::sense::now"
        ]
    );
    // The same edge downward is the rule kept.
    let down = tree(&[
        ("src/lib.rs", "pub mod decide;\npub mod sense;\n"),
        ("src/decide/mod.rs", "pub fn rule() -> u64 {\n    0\n}\n"),
        (
            "src/sense/mod.rs",
            "pub fn now() -> u64 {\n    crate::decide::rule()\n}\n",
        ),
    ]);
    assert_eq!(
        faults(down.path(), Some(FLOORS), &NONE),
        Vec::<String>::new()
    );
    assert_eq!(
        edges(down.path()),
        vec![edge("src/sense/mod.rs", "src/decide/mod.rs")]
    );
}

#[test]
fn a_sideways_import_a_module_on_no_floor_and_a_stale_floor_fail() {
    let dir = tree(&[
        (
            "src/lib.rs",
            "pub mod decide;\npub mod extra;\npub mod limits;\n",
        ),
        ("src/decide.rs", "use crate::limits::raise;\n"),
        ("src/extra.rs", ""),
        ("src/limits.rs", "pub fn raise() {}\n"),
    ]);
    let mut got = faults(dir.path(), Some(&[&["decide", "limits", "gone"]]), &NONE);
    got.sort();
    assert_eq!(
        got,
        vec![
            "floor reached sideways: src/decide.rs (decide, floor 0) uses src/limits.rs (limits, floor 0) at line 1: crate::limits::raise",
            "no such module: gone is in FLOORS but not in the crate",
            "on no floor: module extra (place it in FLOORS, xtask/src/house/rules.rs)",
        ]
    );
}

#[test]
fn a_file_of_1001_lines_fails_and_one_of_1000_passes() {
    let lines = |n: usize| "// a line\n".repeat(n);
    let (long, ok) = (lines(1001), lines(1000));
    let dir = tree(&[
        ("src/lib.rs", "mod ok;\n"),
        ("src/ok.rs", &ok),
        // Not in any crate: every source file of a member counts.
        ("src/long.rs", &long),
    ]);
    assert_eq!(
        faults(dir.path(), None, &NONE),
        vec!["too long: src/long.rs has 1001 lines, over 1000 (split it by responsibility)"]
    );
}

#[test]
fn known_circles_and_long_files_are_printed_and_may_not_grow_or_linger() {
    let lines = |n: usize| "// a line\n".repeat(n);
    let long = lines(1002);
    let dir = tree(&[
        ("src/lib.rs", "pub mod node;\n"),
        (
            "src/node/mod.rs",
            "mod manager;\n\npub struct NodeError;\n\npub fn start() {\n    manager::run();\n}\n",
        ),
        (
            "src/node/manager.rs",
            "use super::NodeError;\n\npub fn run() {}\n",
        ),
        ("src/long.rs", &long),
    ]);
    let known = Known {
        circles: &[(&["src/node/manager.rs", "src/node/mod.rs"], "why it stays")],
        long: &[("src/long.rs", 1002, "why it stays")],
    };
    let report = check(&workspace(dir.path(), None), &known);
    assert_eq!(report.faults, Vec::<String>::new());
    assert_eq!(report.known.len(), 2, "{:#?}", report.known);
    assert!(report.known[0].starts_with("known: too long: src/long.rs has 1002 lines"));
    assert!(report.known[1].starts_with("known: circle of imports: src/node/mod.rs ->"));
    assert!(report.known[1].ends_with("(why it stays)"));

    let stale = Known {
        circles: &[
            (&["src/node/manager.rs", "src/node/mod.rs"], ""),
            (&["src/gone/mod.rs", "src/gone/child.rs"], ""),
        ],
        long: &[("src/long.rs", 1001, "")],
    };
    assert_eq!(
        faults(dir.path(), None, &stale),
        vec![
            "too long: src/long.rs has 1002 lines, over the 1001 it is known with (split it by responsibility)",
            "no such circle: src/gone/mod.rs, src/gone/child.rs (take it off KNOWN_CIRCLES, or list the files it holds now)",
        ]
    );
}

#[test]
fn a_known_circle_hides_no_new_circle_among_its_files_and_no_file_joining_it() {
    let knot = [
        ("src/lib.rs", "pub mod node;\n"),
        (
            "src/node/mod.rs",
            "mod a;\nmod b;\n\npub struct NodeError;\n\npub fn start() {\n    a::run();\n    b::run();\n}\n",
        ),
        ("src/node/a.rs", "use super::NodeError;\n\npub fn run() {}\n"),
        ("src/node/b.rs", "use super::NodeError;\n\npub fn run() {}\n"),
    ];
    let known = Known {
        circles: &[(
            &["src/node/a.rs", "src/node/b.rs", "src/node/mod.rs"],
            "why it stays",
        )],
        long: &[],
    };
    assert_eq!(
        faults(tree(&knot).path(), None, &known),
        Vec::<String>::new()
    );
    // Two of its children now use each other: a circle of their own.
    let mut siblings = knot;
    siblings[2].1 = "use super::NodeError;\n\npub fn run() {\n    super::b::run();\n}\n";
    siblings[3].1 = "use super::NodeError;\n\npub fn run() {\n    super::a::run();\n}\n";
    assert_eq!(
        faults(tree(&siblings).path(), None, &known),
        vec![
            "circle of imports: src/node/a.rs -> src/node/b.rs (line 4: super::b::run) -> src/node/a.rs (line 4: super::a::run)"
        ]
    );
    // A third child joins the circle: the known one is no longer the tree's.
    let mut joined = knot.to_vec();
    joined[1].1 = "mod a;\nmod b;\nmod c;\n\npub struct NodeError;\n\npub fn start() {\n    a::run();\n    b::run();\n    c::run();\n}\n";
    joined.push((
        "src/node/c.rs",
        "use super::NodeError;\n\npub fn run() {}\n",
    ));
    let got = faults(tree(&joined).path(), None, &known);
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(
        got[0].starts_with("circle of imports: src/node/mod.rs -> "),
        "{got:#?}"
    );
    assert!(
        got[1].starts_with("no such circle: src/node/a.rs, "),
        "{got:#?}"
    );
}

#[test]
fn comments_strings_and_doc_links_are_not_imports() {
    let dir = tree(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        (
            "src/a.rs",
            "//! See [`crate::b::B`].\n// use crate::b::B;\n/* crate::b::B */\n\
             pub const S: &str = \"crate::b::B\";\npub const R: &str = r#\"crate::b::B\"#;\n\
             pub const C: char = '\"';\n",
        ),
        (
            "src/b.rs",
            "pub struct B(&'static str);\n\npub const X: B = B(crate::a::S);\n",
        ),
    ]);
    assert_eq!(edges(dir.path()), vec![edge("src/b.rs", "src/a.rs")]);
}

#[test]
fn path_attributes_and_inline_modules_are_followed() {
    let dir = tree(&[
        (
            "src/lib.rs",
            "#[path = \"../shared/layout.rs\"]\nmod layout;\nmod outer {\n    pub mod inner;\n}\n",
        ),
        (
            "shared/layout.rs",
            "pub fn f() {\n    crate::outer::inner::g()\n}\n",
        ),
        ("src/outer/inner.rs", "pub fn g() {}\n"),
    ]);
    let krate = Crate::load(dir.path(), Path::new("src/lib.rs"));
    let files: Vec<(String, Vec<String>)> = krate
        .files
        .iter()
        .map(|f| (f.rel.display().to_string(), f.module.clone()))
        .collect();
    let m = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        files,
        vec![
            ("src/lib.rs".to_string(), m(&[])),
            ("shared/layout.rs".to_string(), m(&["layout"])),
            ("src/outer/inner.rs".to_string(), m(&["outer", "inner"])),
        ]
    );
    assert_eq!(
        edges(dir.path()),
        vec![edge("shared/layout.rs", "src/outer/inner.rs")]
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
    let broken = links::broken_links(dir.path(), &[PathBuf::from("README.md")]);
    assert_eq!(
        broken,
        vec![
            "README.md:4: (docs/b.md) no such file docs/b.md",
            "README.md:4: (docs/a.md#nope) no heading with the anchor #nope",
        ]
    );
}

#[test]
fn every_crate_of_the_workspace_is_found() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let ws = discover(&root).unwrap();
    for member in ["agent", "agent-ebpf", "proto", "tests", "xtask"] {
        assert!(
            ws.members.contains(&PathBuf::from(member)),
            "{member}: {:?}",
            ws.members
        );
    }
    let roots: Vec<&Path> = ws.crates.iter().map(|c| c.root.as_path()).collect();
    for root in [
        "agent/src/main.rs",
        "agent-ebpf/src/lib.rs",
        "xtask/src/main.rs",
        "tests/src/lib.rs",
        "tests/benches/side_by_side/main.rs",
    ] {
        assert!(roots.contains(&Path::new(root)), "{root}: {roots:?}");
    }
    let floored: Vec<&Path> = ws
        .crates
        .iter()
        .filter(|c| c.floors.is_some())
        .map(|c| c.root.as_path())
        .collect();
    assert_eq!(floored, vec![Path::new("agent/src/lib.rs")]);
}
