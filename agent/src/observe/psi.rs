//! The PSI figures KEP-5394's node conditions read: the `full` line's `avg10` and `avg60`
//! of `/proc/pressure/{memory,io}` (the system) and of kubepods' `memory.pressure` and
//! `io.pressure` (cgroup v2 only; v1 has no per-cgroup PSI). The kubelet takes the same
//! figures from its Summary API (the node's and the `pods` system container's `psi.full`).
//! The file format is parsed by [`crate::sense::psi::parse_pressure`], which the PSI
//! triggers use too.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use super::ObserveError;
use crate::decide::psi_conditions::{FullAverages, PsiReadings};
use crate::sense::psi::parse_pressure;

/// Where the four figures are read, in `decide::psi_conditions::PSI_CONDITIONS` order;
/// `None` for a figure this node does not have (kubepods' on cgroup v1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PsiFiles {
    /// The four pressure files.
    pub files: [Option<PathBuf>; 4],
}

impl PsiFiles {
    /// The system's files under `proc_root`, and kubepods' in `kubepods_dir` when given.
    pub fn new(proc_root: &Path, kubepods_dir: Option<&Path>) -> PsiFiles {
        let pressure = proc_root.join("pressure");
        PsiFiles {
            files: [
                Some(pressure.join("memory")),
                Some(pressure.join("io")),
                kubepods_dir.map(|d| d.join("memory.pressure")),
                kubepods_dir.map(|d| d.join("io.pressure")),
            ],
        }
    }

    /// Reads every file now; a figure that cannot be read is `None`, with why in `errors`.
    pub fn read(&self, scratch: &mut String, errors: &mut Vec<ObserveError>) -> PsiReadings {
        let mut out = PsiReadings::default();
        for (slot, file) in out.full.iter_mut().zip(&self.files) {
            let Some(path) = file else {
                continue;
            };
            match read_full(path, scratch) {
                Ok(r) => *slot = r,
                Err(e) => errors.push(e),
            }
        }
        out
    }
}

/// The `full` averages of one pressure file (`None` when it has no `full` line).
pub(crate) fn read_full(
    path: &Path,
    scratch: &mut String,
) -> Result<Option<FullAverages>, ObserveError> {
    scratch.clear();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_string(scratch))
        .map_err(|e| ObserveError::io(path, e))?;
    let p = parse_pressure(scratch).map_err(|e| ObserveError::parse(path, e.to_string()))?;
    Ok(p.full.map(|l| FullAverages {
        avg10: l.avg10,
        avg60: l.avg60,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_full_lines_of_the_system_and_kubepods() {
        let tmp = tempfile::tempdir().unwrap();
        let proc_root = tmp.path().join("proc");
        let kubepods = tmp.path().join("cg/kubepods");
        std::fs::create_dir_all(proc_root.join("pressure")).unwrap();
        std::fs::create_dir_all(&kubepods).unwrap();
        let line = |s: f64, f10: f64, f60: f64| {
            format!(
                "some avg10={s:.2} avg60=0.00 avg300=0.00 total=1\nfull avg10={f10:.2} avg60={f60:.2} avg300=0.00 total=1\n"
            )
        };
        std::fs::write(proc_root.join("pressure/memory"), line(9.0, 1.5, 0.75)).unwrap();
        std::fs::write(proc_root.join("pressure/io"), line(3.0, 0.25, 0.0)).unwrap();
        std::fs::write(kubepods.join("memory.pressure"), line(50.0, 40.0, 12.5)).unwrap();
        // kubepods' io.pressure missing: that figure alone is absent, and said.
        let files = PsiFiles::new(&proc_root, Some(&kubepods));
        let mut errors = Vec::new();
        let r = files.read(&mut String::new(), &mut errors);
        let f = |avg10, avg60| Some(FullAverages { avg10, avg60 });
        assert_eq!(r.full, [f(1.5, 0.75), f(0.25, 0.0), f(40.0, 12.5), None]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].to_string().contains("io.pressure"),
            "{}",
            errors[0]
        );
        // Without kubepods' directory (cgroup v1) only the system is read.
        let mut errors = Vec::new();
        let r = PsiFiles::new(&proc_root, None).read(&mut String::new(), &mut errors);
        assert_eq!(r.full[2], None);
        assert!(errors.is_empty());
    }

    #[test]
    fn a_malformed_file_is_an_error_not_a_reading() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("memory");
        std::fs::write(&path, "full avg10=x\n").unwrap();
        assert!(read_full(&path, &mut String::new()).is_err());
    }
}
