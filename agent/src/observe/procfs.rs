//! The few `/proc` figures the signals need: `MemTotal` for the node's memory capacity, and the
//! task limit and task count behind `pid.available`.
//!
//! `pid.available` follows the kubelet's `pidlimit.Stats`: the limit is the smaller of
//! `kernel.pid_max` and `kernel.threads-max` (both bound the number of tasks), and the count
//! of tasks is the total after the slash in `/proc/loadavg`'s fourth field, which unlike
//! `sysinfo(2)`'s 16-bit `procs` does not wrap past 65535; `sysinfo` is only the fallback.
//! The root (`/proc`) is injected so the parsers are tested on fixtures as well as the
//! machine.

use std::path::{Path, PathBuf};

use super::cgroupfs::KeptFiles;
use super::ObserveError;

/// `/proc`, or a directory standing in for it.
#[derive(Debug)]
pub struct ProcFs {
    root: PathBuf,
    path: PathBuf,
    buf: Vec<u8>,
    /// The few files read on every observation, kept open.
    files: KeptFiles,
}

/// The node's task limit and current task count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tasks {
    /// `min(pid_max, threads-max)`.
    pub max: u64,
    /// Tasks (threads included) that exist now.
    pub running: u64,
}

impl Tasks {
    /// `max - running`, the kubelet's `pid.available` (negative if the count ever overtakes
    /// a lowered limit).
    pub fn available(&self) -> i64 {
        i64::try_from(self.max).unwrap_or(i64::MAX)
            - i64::try_from(self.running).unwrap_or(i64::MAX)
    }
}

impl ProcFs {
    /// A procfs rooted at `root` (normally `/proc`).
    pub fn new(root: PathBuf) -> ProcFs {
        ProcFs {
            root,
            path: PathBuf::with_capacity(64),
            buf: Vec::with_capacity(4096),
            files: KeptFiles::default(),
        }
    }

    fn read(&mut self, rel: &str) -> Result<&str, ObserveError> {
        self.path.as_mut_os_string().clear();
        self.path.push(&self.root);
        self.path.push(rel);
        if !self.files.read(&self.path, &mut self.buf)? {
            return Err(ObserveError::parse(&self.path, "absent".to_string()));
        }
        std::str::from_utf8(&self.buf)
            .map_err(|_| ObserveError::parse(&self.path, "not UTF-8".to_string()))
    }

    fn path_of(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// `MemTotal` in bytes: the machine's memory capacity as cadvisor reports it. The one
    /// reader of it: the observer, the node plan and `reactor watch` all come here
    /// ([`super::memory_capacity`]).
    pub(crate) fn mem_total_bytes(&mut self) -> Result<u64, ObserveError> {
        let text = self.read("meminfo")?;
        parse_mem_total(text)
            .map_err(|e| ObserveError::parse(&self.path_of("meminfo"), e.to_string()))
    }

    /// `SwapTotal` in bytes: the node's swap, as cadvisor reports it to the kubelet (the
    /// base of LimitedSwap shares and of the `failSwapOn` check). 0 without swap.
    pub fn swap_total_bytes(&mut self) -> Result<u64, ObserveError> {
        self.meminfo_bytes("SwapTotal")
    }

    /// `SwapTotal` and `SwapFree` in bytes, read together, for status and metrics.
    pub fn swap_bytes(&mut self) -> Result<Swap, ObserveError> {
        let text = self.read("meminfo")?;
        let parsed = parse_meminfo_bytes(text, "SwapTotal")
            .and_then(|total| Ok((total, parse_meminfo_bytes(text, "SwapFree")?)));
        let (total, free) =
            parsed.map_err(|e| ObserveError::parse(&self.path_of("meminfo"), e.to_string()))?;
        Ok(Swap {
            total,
            used: total.saturating_sub(free),
        })
    }

    fn meminfo_bytes(&mut self, key: &'static str) -> Result<u64, ObserveError> {
        let text = self.read("meminfo")?;
        parse_meminfo_bytes(text, key)
            .map_err(|e| ObserveError::parse(&self.path_of("meminfo"), e.to_string()))
    }

    /// The task limit and count (see the module docs).
    pub(crate) fn tasks(&mut self) -> Result<Tasks, ObserveError> {
        let mut max: Option<u64> = None;
        for rel in ["sys/kernel/pid_max", "sys/kernel/threads-max"] {
            let parsed = {
                let text = self.read(rel)?.trim();
                text.parse::<u64>().map_err(|_| text.to_string())
            };
            let limit = parsed.map_err(|text| {
                ObserveError::parse(&self.path_of(rel), format!("{text:?} is not a count"))
            })?;
            max = Some(max.map_or(limit, |m| m.min(limit)));
        }
        let running = match self.read("loadavg").ok().and_then(parse_loadavg_tasks) {
            Some(n) => n,
            None => u64::from(rustix::system::sysinfo().procs),
        };
        Ok(Tasks {
            max: max.unwrap_or(0),
            running,
        })
    }

    /// The root this reads from.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

/// The node's swap now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swap {
    /// `SwapTotal`, bytes.
    pub total: u64,
    /// `SwapTotal - SwapFree`, bytes.
    pub used: u64,
}

/// `MemTotal:  16314204 kB` → bytes.
pub(crate) fn parse_mem_total(meminfo: &str) -> Result<u64, MeminfoError> {
    parse_meminfo_bytes(meminfo, "MemTotal")
}

/// A `/proc/meminfo` line that is missing or not `N kB`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MeminfoError {
    /// No line for the key.
    #[error("no {key} line")]
    Missing {
        /// The key (`SwapTotal`).
        key: &'static str,
    },
    /// The value is not a number of kB, or does not fit in bytes.
    #[error("{key} {text:?} is not a number of kB")]
    NotKib {
        /// The key.
        key: &'static str,
        /// What the line holds after the key.
        text: String,
    },
}

/// One `Key:  N kB` line of `/proc/meminfo` → bytes.
pub(crate) fn parse_meminfo_bytes(meminfo: &str, key: &'static str) -> Result<u64, MeminfoError> {
    let rest = meminfo
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
        .ok_or(MeminfoError::Missing { key })?;
    let not_kib = || MeminfoError::NotKib {
        key,
        text: rest.trim().to_string(),
    };
    let mut parts = rest.split_whitespace();
    let kib = parts
        .next()
        .and_then(|n| n.parse::<u64>().ok())
        .ok_or_else(not_kib)?;
    if parts.next().is_some_and(|unit| unit != "kB") {
        return Err(not_kib());
    }
    kib.checked_mul(1024).ok_or_else(not_kib)
}

/// The task total of `/proc/loadavg` (`0.10 0.20 0.30 2/3518 12345` → 3518).
pub fn parse_loadavg_tasks(loadavg: &str) -> Option<u64> {
    loadavg
        .split_whitespace()
        .nth(3)?
        .split_once('/')?
        .1
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers_read_fixture_lines() {
        assert_eq!(
            parse_mem_total("MemTotal:       16314204 kB\nMemFree: 1 kB\n"),
            Ok(16314204 * 1024)
        );
        assert!(parse_mem_total("MemFree: 1 kB\n").is_err());
        assert!(parse_mem_total("MemTotal: many kB\n").is_err());
        assert_eq!(
            parse_loadavg_tasks("1.36 3.49 4.53 2/3518 3715089\n"),
            Some(3518)
        );
        assert_eq!(parse_loadavg_tasks("1.36 3.49\n"), None);
    }

    #[test]
    fn swap_is_read_from_meminfo() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("meminfo"),
            "MemTotal: 2048 kB\nSwapCached: 4 kB\nSwapTotal:  1048572 kB\nSwapFree:  1048000 kB\n",
        )
        .unwrap();
        let mut proc = ProcFs::new(tmp.path().to_path_buf());
        assert_eq!(proc.swap_total_bytes().unwrap(), 1_048_572 * 1024);
        assert_eq!(
            proc.swap_bytes().unwrap(),
            Swap {
                total: 1_048_572 * 1024,
                used: 572 * 1024
            }
        );
        // `SwapCached` is not `SwapTotal`, nor `Swap` a prefix match.
        assert_eq!(
            parse_meminfo_bytes("SwapCached: 4 kB\n", "SwapTotal"),
            Err(MeminfoError::Missing { key: "SwapTotal" })
        );
        assert!(matches!(
            parse_meminfo_bytes("SwapTotal: 4 MB\n", "SwapTotal"),
            Err(MeminfoError::NotKib { .. })
        ));
    }

    #[test]
    fn tasks_take_the_smaller_limit() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("sys/kernel")).unwrap();
        std::fs::write(tmp.path().join("sys/kernel/pid_max"), "4194304\n").unwrap();
        std::fs::write(tmp.path().join("sys/kernel/threads-max"), "62000\n").unwrap();
        std::fs::write(tmp.path().join("loadavg"), "0.00 0.01 0.05 1/700 99\n").unwrap();
        let mut proc = ProcFs::new(tmp.path().to_path_buf());
        let t = proc.tasks().unwrap();
        assert_eq!(
            t,
            Tasks {
                max: 62000,
                running: 700
            }
        );
        assert_eq!(t.available(), 61300);
        std::fs::write(tmp.path().join("sys/kernel/pid_max"), "x\n").unwrap();
        let err = proc.tasks().unwrap_err().to_string();
        assert!(err.contains("pid_max"), "{err}");
    }

    #[test]
    fn real_proc_agrees_with_itself() {
        let mut proc = ProcFs::new(PathBuf::from("/proc"));
        let total = proc.mem_total_bytes().unwrap();
        assert!(total > 64 << 20, "MemTotal {total}");
        let t = proc.tasks().unwrap();
        let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(t.max <= pid_max && t.max > 0);
        // This test process and its threads are tasks.
        assert!(t.running >= 1 && t.available() > 0, "{t:?}");
    }
}
