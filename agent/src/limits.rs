//! The agent's open-file limit.
//!
//! The observer keeps files open between passes — each pod's and each container's memory
//! usage and `memory.stat`, the node's and kubepods' — so that the reads between the
//! kernel's event and the SIGKILL are `pread`s, not path walks through cgroupfs: four per pod
//! of one container, more on a node of many pods than a service manager's default soft
//! limit of 1024 leaves beside the agent's sockets. The agent raises its soft limit to the
//! hard one at start, as Go's runtime does for every Go program (the kubelet among them).

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit before and
/// after.
pub fn raise_open_files() -> std::io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid pointer to an rlimit for the kernel to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let was = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: a valid pointer to an initialised rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok((was, limit.rlim_cur))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        let (was, now) = raise_open_files().unwrap();
        assert!(now >= was);
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid pointer.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        assert_eq!(limit.rlim_cur, limit.rlim_max);
        assert_eq!(limit.rlim_cur, now);
    }
}
