//! `cargo xtask house`: the house rules, checked on the source tree of every crate of the
//! workspace, with no build and no root:
//!
//! - no `.rs` file of a workspace member is over 1,000 lines ([`rules::MAX_LINES`]);
//! - no circle of imports between the files of any crate (each library, binary, test,
//!   bench and build script is a crate of its own; see [`graph`] for what is an edge, and
//!   why a parent and its child can make a circle);
//! - no floor of the agent library reaches up or sideways ([`rules::FLOORS`]), and every
//!   module of it stands on a floor;
//! - every relative link in `README.md` and `docs/**/*.md` resolves, anchors included.
//!
//! The crates come from `cargo metadata --no-deps` (which reads the manifests and builds
//! nothing), so a new member or target is checked without being listed here. Each fault is
//! one line naming the file, and the edge and line where there is one. `REACTOR_HOUSE_ROOT`
//! or `--root DIR` points the check at another checkout (an older commit, a scratch copy
//! with a fault planted in it).
//!
//! What the tree held when the check first read every crate, and was not mended at once,
//! went into two allowlists with the reason for each ([`rules::KNOWN_CIRCLES`],
//! [`rules::KNOWN_LONG`]); both are empty now. An entry is printed on every run and the
//! lists cannot grow unnoticed: a known file past its count, a circle whose files are not
//! exactly a known one's, or an entry no longer needed is a fault.

mod graph;
mod links;
mod rules;
mod source;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use graph::Crate;

/// The crate the floors are for: the agent library.
const FLOORED: (&str, &str) = ("reactor", "lib");

/// Floors, bottom first: the rooms (top-level modules) on each.
type Floors = &'static [&'static [&'static str]];

/// One crate of the workspace: a target of a member package.
pub(crate) struct CrateRoot {
    /// Its root file, relative to the workspace root.
    root: PathBuf,
    /// The floors, for the one crate they apply to.
    floors: Option<Floors>,
}

/// What the check reads: the workspace root, its members' folders (relative to it) and
/// their crates.
pub(crate) struct Workspace {
    root: PathBuf,
    members: Vec<PathBuf>,
    crates: Vec<CrateRoot>,
}

/// `cargo xtask house [--root DIR]`: prints the known lines and the faults, one per line,
/// and fails if there is a fault.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let start = Instant::now();
    let root = match args {
        [] => match std::env::var_os("REACTOR_HOUSE_ROOT") {
            Some(root) => PathBuf::from(root),
            None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
        },
        [flag, dir] if flag == "--root" => PathBuf::from(dir),
        _ => bail!("usage: cargo xtask house [--root DIR]"),
    };
    let ws = discover(&root)?;
    let report = check(
        &ws,
        &Known {
            circles: rules::KNOWN_CIRCLES,
            long: rules::KNOWN_LONG,
        },
    );
    for line in report.known.iter().chain(&report.faults) {
        println!("house: {line}");
    }
    eprintln!(
        "xtask: took {:.1} s: house ({} crates, {} files, {} imports between files)",
        start.elapsed().as_secs_f64(),
        ws.crates.len(),
        report.files,
        report.edges
    );
    if !report.faults.is_empty() {
        bail!(
            "house: {} faults in {} (above)",
            report.faults.len(),
            ws.root.display()
        );
    }
    Ok(())
}

/// The workspace at `root` as `cargo metadata` describes it.
fn discover(root: &Path) -> Result<Workspace> {
    let out = crate::cargo()
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .output()
        .context("cannot start cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed in {}: {}",
            root.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let ws_root = PathBuf::from(meta["workspace_root"].as_str().context("workspace_root")?);
    let rel = |p: &str| -> Result<PathBuf> {
        Ok(Path::new(p)
            .strip_prefix(&ws_root)
            .with_context(|| format!("{p} is outside the workspace"))?
            .to_path_buf())
    };
    let mut members = Vec::new();
    let mut crates = Vec::new();
    for package in meta["packages"].as_array().context("packages")? {
        let name = package["name"].as_str().context("package name")?;
        let manifest = rel(package["manifest_path"].as_str().context("manifest")?)?;
        members.push(manifest.parent().unwrap_or(Path::new("")).to_path_buf());
        for target in package["targets"].as_array().context("targets")? {
            let kind = target["kind"][0].as_str().context("target kind")?;
            crates.push(CrateRoot {
                root: rel(target["src_path"].as_str().context("src_path")?)?,
                floors: ((name, kind) == FLOORED).then_some(rules::FLOORS),
            });
        }
    }
    if !crates.iter().any(|c| c.floors.is_some()) {
        bail!(
            "no {} {} target in {}: the floors would check nothing",
            FLOORED.0,
            FLOORED.1,
            root.display()
        );
    }
    Ok(Workspace {
        root: ws_root,
        members,
        crates,
    })
}

/// What the check found: faults, allowlisted circles and long files (printed, not failed),
/// and how much was looked at (a check that read nothing passes nothing: the counts are
/// printed).
struct Report {
    faults: Vec<String>,
    known: Vec<String>,
    files: usize,
    edges: usize,
}

/// The allowlists: [`rules::KNOWN_CIRCLES`] and [`rules::KNOWN_LONG`] for the workspace,
/// others in the tests.
struct Known {
    circles: &'static [(&'static [&'static str], &'static str)],
    long: &'static [(&'static str, usize, &'static str)],
}

/// Every rule over the workspace. Lines are deduplicated: a file several crates share
/// (`tests/tests/devices_common/mod.rs`) makes the same circle in each.
fn check(ws: &Workspace, allow: &Known) -> Report {
    let sources: Vec<PathBuf> = ws
        .members
        .iter()
        .flat_map(|m| files(&ws.root, m, "rs"))
        .collect();
    let (mut faults, mut known) = rules::too_long(&ws.root, &sources, allow.long);
    let mut edge_count = 0;
    let mut matched = Vec::new();
    for c in &ws.crates {
        let krate = Crate::load(&ws.root, &c.root);
        let edges = krate.graph();
        edge_count += edges.iter().map(|e| e.len()).sum::<usize>();
        for circle in rules::circles(&krate, &edges) {
            let why = allow.circles.iter().find(|(files, _)| {
                circle.files == files.iter().map(|f| f.to_string()).collect::<BTreeSet<_>>()
            });
            let (line, list) = match why {
                Some((files, why)) => {
                    matched.push(*files);
                    (format!("known: {} ({why})", circle.line), &mut known)
                }
                None => (circle.line, &mut faults),
            };
            if !list.contains(&line) {
                list.push(line);
            }
        }
        if let Some(floors) = c.floors {
            faults.extend(rules::floors(&krate, &edges, floors));
        }
    }
    for (files, _) in allow.circles {
        if !matched.contains(files) {
            faults.push(format!(
                "no such circle: {} (take it off KNOWN_CIRCLES, or list the files it holds now)",
                files.join(", ")
            ));
        }
    }
    let mut docs = vec![PathBuf::from("README.md")];
    docs.extend(files(&ws.root, Path::new("docs"), "md"));
    faults.extend(links::broken_links(&ws.root, &docs));
    Report {
        faults,
        known,
        files: sources.len(),
        edges: edge_count,
    }
}

/// Every file under `root/dir` whose name ends in `.ext`, sorted, relative to `root`; build
/// output (`target/`) and hidden folders left out.
fn files(root: &Path, dir: &Path, ext: &str) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let rel = dir.join(&name);
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let name = name.to_string_lossy();
                if name != "target" && !name.starts_with('.') {
                    walk(root, &rel, ext, out);
                }
            } else if rel.extension().is_some_and(|e| e == ext) {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, dir, ext, &mut out);
    out.sort();
    out
}
