//! The rules themselves, each turning what the tree holds into one line per fault.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::graph::{cycles, Crate, Edges};

/// The longest a source file may be: past it a file holds more than one responsibility, or
/// one that should be split by its parts.
pub(super) const MAX_LINES: usize = 1000;

/// The floors of the agent library, bottom first. A module may use modules on floors below
/// its own, never on its own floor (rooms side by side do not know each other) or above.
///
/// The reactor loop runs sense → observe → decide → act → record; the floors say who may
/// *use* whom, so the stages the loop joins sit below the loop, each below what calls it:
///
/// 0. `decide`: the kubelet's rules, pure, used by everything; `limits` (the process's
///    open-file limit): it uses nothing of the crate and only the binary uses it, so it
///    stands on the ground floor, where any room may reach it.
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
/// The binary's front end (`main.rs`, `cli/`) is another crate, above the library.
pub(super) const FLOORS: &[&[&str]] = &[
    &["decide", "limits"],
    &["human", "config", "priority"],
    &["sense"],
    &["observe", "record"],
    &["act", "plan"],
    &["devices", "images"],
    &["reactor"],
    &["node"],
    &["api"],
];

/// Every file of `files` (relative to `root`) over [`MAX_LINES`] lines, as faults and
/// known lines ([`KNOWN_LONG`] passed as `known`).
pub(super) fn too_long(
    root: &Path,
    files: &[PathBuf],
    known: &[(&str, usize, &str)],
) -> (Vec<String>, Vec<String>) {
    let (mut faults, mut seen) = (Vec::new(), Vec::new());
    for rel in files {
        let Ok(text) = std::fs::read_to_string(root.join(rel)) else {
            faults.push(format!("cannot read {}", rel.display()));
            continue;
        };
        let n = text.lines().count();
        let name = rel.display().to_string();
        match known.iter().find(|(k, _, _)| *k == name) {
            Some((_, cap, why)) if n > MAX_LINES => {
                if n > *cap {
                    faults.push(format!(
                        "too long: {name} has {n} lines, over the {cap} it is known with (split it by responsibility)"
                    ));
                } else {
                    seen.push(format!(
                        "known: too long: {name} has {n} lines (allowed up to {cap}: {why})"
                    ));
                }
            }
            Some(_) => faults.push(format!(
                "no longer too long: {name} has {n} lines (take it off KNOWN_LONG)"
            )),
            None if n > MAX_LINES => faults.push(format!(
                "too long: {name} has {n} lines, over {MAX_LINES} (split it by responsibility)"
            )),
            None => {}
        }
    }
    for (k, _, _) in known {
        if !files.iter().any(|f| f.display().to_string() == *k) {
            faults.push(format!("no such file: {k} is in KNOWN_LONG (take it off)"));
        }
    }
    (faults, seen)
}

/// The circles of imports the tree held when the check first read every crate (issue 40),
/// each as the exact set of files tangled in it, with why it stays for now; empty since the
/// last, the bench's `oom.rs` ↔ `oom_ref.rs`, went with that file's split into `oom/`. A
/// circle is known only when its files are exactly an entry's, so a file joining or leaving
/// one, or a new circle among the files of a known one (the circles left without the
/// parent's file are checked too), is a fault; the check prints every known circle on each
/// run, and an entry that matches no circle is a fault, so the list can only shrink.
pub(super) const KNOWN_CIRCLES: &[(&[&str], &str)] = &[];

/// Files over [`MAX_LINES`] that the tree held when the check first read every crate, each
/// with the count it may not pass and why it stays for now; printed on each run, and a
/// fault once the file is back under the limit (take it off the list). Empty since the
/// last, the bench's `oom.rs` (1,490 lines), was split by responsibility into `oom/`.
pub(super) const KNOWN_LONG: &[(&str, usize, &str)] = &[];

/// One circle of imports, as a line naming its edges, and every file tangled in it, sorted.
pub(super) struct Circle {
    pub(super) line: String,
    pub(super) files: BTreeSet<String>,
}

/// Every circle of imports in `krate`: a closed walk through it, every edge with the line
/// and path that makes it, and the other files tangled in the same knot.
///
/// A parent ↔ child circle (all of it in one module's folder) is followed by the circles
/// left among its files without the parent's: a known parent ↔ child circle does not hide
/// two children that use each other.
pub(super) fn circles(krate: &Crate, edges: &Edges) -> Vec<Circle> {
    let all = (0..krate.files.len()).collect();
    let mut out = Vec::new();
    knots(krate, edges, &all, &mut out);
    out
}

/// The circles among the files `within`, with the edges between them only.
fn knots(krate: &Crate, edges: &Edges, within: &BTreeSet<usize>, out: &mut Vec<Circle>) {
    let sub: Edges = edges
        .iter()
        .enumerate()
        .map(|(from, outs)| {
            outs.iter()
                .filter(|(to, _)| within.contains(&from) && within.contains(to))
                .map(|(to, how)| (*to, how.clone()))
                .collect()
        })
        .collect();
    for (walk, component) in cycles(&sub) {
        let mut line = krate.name(walk[0]);
        for w in walk.windows(2) {
            let (at, path) = &sub[w[0]][&w[1]];
            line += &format!(" -> {} (line {at}: {path})", krate.name(w[1]));
        }
        let others: Vec<String> = component
            .iter()
            .filter(|f| !walk.contains(f))
            .map(|&f| krate.name(f))
            .collect();
        if !others.is_empty() {
            line += &format!("; tangled with it: {}", others.join(", "));
        }
        let top = component
            .iter()
            .copied()
            .min_by_key(|&f| krate.files[f].module.len());
        let parent = top.filter(|&p| component.iter().all(|&f| f == p || krate.contains(p, f)));
        let files = component.iter().map(|&f| krate.name(f)).collect();
        out.push(Circle {
            line: format!("circle of imports: {line}"),
            files,
        });
        if let Some(p) = parent {
            let rest = component.iter().copied().filter(|&f| f != p).collect();
            knots(krate, edges, &rest, out);
        }
    }
}

/// The top-level module (room) a file of the crate belongs to; `None` for the root file.
fn room(krate: &Crate, file: usize) -> Option<&str> {
    krate.files[file].module.first().map(String::as_str)
}

fn floor_of(floors: &[&[&str]], room: &str) -> Option<usize> {
    floors.iter().position(|f| f.contains(&room))
}

/// Every import in `krate` from a room to one on its own floor or above, every room on no
/// floor, and every floor name that is no room (a stale list is no check).
pub(super) fn floors(krate: &Crate, edges: &Edges, floors: &[&[&str]]) -> Vec<String> {
    let mut out = Vec::new();
    let rooms: BTreeSet<&str> = (0..krate.files.len())
        .filter_map(|f| room(krate, f))
        .collect();
    for &r in &rooms {
        if floor_of(floors, r).is_none() {
            out.push(format!(
                "on no floor: module {r} (place it in FLOORS, xtask/src/house/rules.rs)"
            ));
        }
    }
    for name in floors.iter().flat_map(|f| f.iter()) {
        if !rooms.contains(name) {
            out.push(format!(
                "no such module: {name} is in FLOORS but not in the crate"
            ));
        }
    }
    for (i, outs) in edges.iter().enumerate() {
        let Some(from) = room(krate, i) else { continue };
        for (&to, (line, path)) in outs {
            let Some(to_room) = room(krate, to) else {
                continue;
            };
            if from == to_room {
                continue;
            }
            let (Some(a), Some(b)) = (floor_of(floors, from), floor_of(floors, to_room)) else {
                continue;
            };
            if a <= b {
                let how = if a == b { "sideways" } else { "up" };
                out.push(format!(
                    "floor reached {how}: {} ({from}, floor {a}) uses {} ({to_room}, floor {b}) at line {line}: {path}",
                    krate.name(i),
                    krate.name(to)
                ));
            }
        }
    }
    out
}
