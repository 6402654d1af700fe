//! Tracepoint format files: where tracefs is, and whether a tracepoint's record layout is the
//! one the programs were compiled against.
//!
//! Without CO-RE a program reads tracepoint fields at fixed offsets (`agent_ebpf::layout`).
//! Before attaching, the agent reads `events/<category>/<name>/format` and refuses to attach a
//! program whose fields moved, naming the field, rather than report garbage.

use std::path::{Path, PathBuf};

use agent_ebpf::Field;

/// Where tracefs is usually mounted, newest first.
const TRACEFS_ROOTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The mounted tracefs with an `events` directory, if any.
pub fn root() -> Option<PathBuf> {
    TRACEFS_ROOTS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
}

/// One field of a format file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FormatField {
    /// The field name (last word of its C declaration, without array brackets).
    pub name: String,
    /// Byte offset in the record.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
}

/// Parses the `field:` lines of a tracepoint format file.
pub(crate) fn parse_format(text: &str) -> Vec<FormatField> {
    text.lines()
        .filter_map(|line| {
            let mut decl = None;
            let (mut offset, mut size) = (None, None);
            for part in line.trim().split(';') {
                let part = part.trim();
                if let Some(d) = part.strip_prefix("field:") {
                    decl = Some(d);
                } else if let Some(v) = part.strip_prefix("offset:") {
                    offset = v.parse().ok();
                } else if let Some(v) = part.strip_prefix("size:") {
                    size = v.parse().ok();
                }
            }
            let last = decl?.split_whitespace().last()?;
            let name = last.split('[').next().unwrap_or(last).to_string();
            Some(FormatField {
                name,
                offset: offset?,
                size: size?,
            })
        })
        .collect()
}

/// Checks that every field the program reads is where it expects; the error names the first
/// field that differs.
pub(crate) fn check_layout(format: &[FormatField], expected: &[Field]) -> Result<(), LayoutError> {
    for want in expected {
        match format.iter().find(|f| f.name == want.name) {
            None => return Err(LayoutError::NoField(want.name)),
            Some(f) if f.offset != want.offset || f.size != want.size => {
                return Err(LayoutError::Moved {
                    field: want.name,
                    offset: f.offset,
                    size: f.size,
                    want_offset: want.offset,
                    want_size: want.size,
                })
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Reads `<root>/events/<category>/<name>/format` and checks `expected` against it.
pub(crate) fn check_tracepoint(
    root: &Path,
    category: &str,
    name: &str,
    expected: &[Field],
) -> Result<(), TracepointError> {
    let path = root.join("events").join(category).join(name).join("format");
    let text = std::fs::read_to_string(&path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            TracepointError::Absent {
                tracepoint: format!("{category}:{name}"),
                path: path.clone(),
            }
        } else {
            TracepointError::Read {
                path: path.clone(),
                source,
            }
        }
    })?;
    check_layout(&parse_format(&text), expected).map_err(|source| TracepointError::Layout {
        tracepoint: format!("{category}:{name}"),
        source,
    })
}

/// A field of a tracepoint's record that is not where the program reads it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LayoutError {
    /// The record has no such field.
    #[error("tracepoint has no field {0:?}")]
    NoField(&'static str),
    /// The field moved or changed size.
    #[error("field {field:?} is at offset {offset} size {size}, the program expects offset {want_offset} size {want_size}")]
    Moved {
        /// The field.
        field: &'static str,
        /// Its offset in this kernel.
        offset: usize,
        /// Its size in this kernel.
        size: usize,
        /// The offset the program was compiled with.
        want_offset: usize,
        /// The size the program was compiled with.
        want_size: usize,
    },
}

/// Why a tracepoint cannot be attached to; each names the tracepoint or its file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TracepointError {
    /// This kernel has no such tracepoint.
    #[error("tracepoint {tracepoint} absent ({} not found)", path.display())]
    Absent {
        /// `category:name`.
        tracepoint: String,
        /// The format file looked for.
        path: PathBuf,
    },
    /// The format file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The format file.
        path: PathBuf,
        /// The error from the kernel.
        #[source]
        source: std::io::Error,
    },
    /// The record's layout is not the program's.
    #[error("tracepoint {tracepoint}: {source}")]
    Layout {
        /// `category:name`.
        tracepoint: String,
        /// The field at fault.
        #[source]
        source: LayoutError,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARK_VICTIM: &str = "name: mark_victim
ID: 609
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] comm;\toffset:12;\tsize:4;\tsigned:0;
\tfield:unsigned long total_vm;\toffset:16;\tsize:8;\tsigned:0;
\tfield:char buf[16];\toffset:72;\tsize:16;\tsigned:0;

print fmt: \"pid=%d\", REC->pid
";

    #[test]
    fn parses_field_lines_only() {
        let fields = parse_format(MARK_VICTIM);
        assert_eq!(fields.len(), 6);
        assert_eq!(
            fields[3],
            FormatField {
                name: "comm".into(),
                offset: 12,
                size: 4
            }
        );
        assert_eq!(fields[5].name, "buf");
    }

    #[test]
    fn layout_check_names_the_field_that_moved() {
        let fields = parse_format(MARK_VICTIM);
        let pid = Field {
            name: "pid",
            offset: 8,
            size: 4,
        };
        assert_eq!(check_layout(&fields, &[pid]), Ok(()));
        let moved = Field { offset: 16, ..pid };
        let err = check_layout(&fields, &[moved]).unwrap_err().to_string();
        assert!(err.contains("\"pid\" is at offset 8"), "{err}");
        let absent = Field {
            name: "oom_score_adj",
            ..pid
        };
        assert!(check_layout(&fields, &[absent])
            .unwrap_err()
            .to_string()
            .contains("no field \"oom_score_adj\""));
    }

    #[test]
    fn an_absent_tracepoint_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let err = check_tracepoint(tmp.path(), "memcg", "count_memcg_events", &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("tracepoint memcg:count_memcg_events absent"),
            "{err}"
        );
        let dir = tmp.path().join("events/oom/mark_victim");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("format"), MARK_VICTIM).unwrap();
        let adj = Field {
            name: "oom_score_adj",
            offset: 64,
            size: 2,
        };
        let err = check_tracepoint(tmp.path(), "oom", "mark_victim", &[adj])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("tracepoint oom:mark_victim: "), "{err}");
    }

    #[test]
    fn the_compiled_layouts_match_this_kernel() {
        let Some(root) = root() else {
            eprintln!("skipping: tracefs not mounted");
            return;
        };
        for (cat, name, fields) in super::super::TRACEPOINTS
            .iter()
            .map(|t| (t.category, t.name, t.fields))
        {
            if root.join("events").join(cat).join(name).exists() {
                assert_eq!(
                    check_tracepoint(&root, cat, name, fields).map_err(|e| e.to_string()),
                    Ok(()),
                    "{cat}:{name}"
                );
            }
        }
    }
}
