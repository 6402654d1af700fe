//! Starting a container process without copying the agent: `clone(CLONE_VM | CLONE_VFORK)`,
//! the way `posix_spawn` starts one, plus the three steps a container needs before exec
//! (join its cgroups, set `oom_score_adj`, `setsid`) that `posix_spawn` has no action for.
//!
//! **Why not `fork`.** `fork` copies the agent's page tables while holding its memory-map
//! lock for writing and write-protects every private page it shares with the child. Each
//! pod started then costs the agent's other threads: any page fault waits for the copy, and
//! every page written afterwards takes a copy-on-write fault, even after the child has
//! exec'd. The reactor loop's real-time thread paid it on its own stack and heap while 50
//! API clients applied pods (3–126 minor faults per loaded reaction, against 2–9 idle). A
//! `CLONE_VM` child borrows the agent's memory until it execs (the calling thread is
//! suspended until then, `CLONE_VFORK`), so nothing is copied or protected. The standard
//! library's `Command` would use `posix_spawn` too, but never with a pre-exec hook.
//!
//! **What the child may do.** It runs on a stack of its own in the agent's memory, beside
//! the agent's other threads, which keep running. So it only reads the [`Plan`] prepared
//! before the clone (which the suspended caller owns) and makes system calls: no allocation,
//! no lock, no return into the caller's frames. Signals are blocked across the clone and
//! their handlers reset in the child before it unblocks them, so no agent handler ever runs
//! on the borrowed memory. A failing step stores its errno in the plan and exits 127.
//!
//! The pidfd comes from the clone itself (`CLONE_PIDFD`), so it names the child before its
//! pid could be reused. The child's exit signal is `SIGCHLD`, so it is an ordinary child
//! that [`reap`] collects through that pidfd.

use std::ffi::{c_int, c_void, CString};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};

use rustix::io::Errno;

/// The child's stack. It runs a few system calls, but Rust code without a known frame
/// bound gets room to spare; pages are touched only as used.
const STACK_BYTES: usize = 256 * 1024;

/// Which step of the child failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// `clone` itself (in the agent: no child was made).
    Clone,
    Stdio,
    JoinCgroup,
    OomScoreAdj,
    Setsid,
    Exec,
}

impl Step {
    const ALL: [Step; 6] = [
        Step::Clone,
        Step::Stdio,
        Step::JoinCgroup,
        Step::OomScoreAdj,
        Step::Setsid,
        Step::Exec,
    ];

    fn from_u8(n: u8) -> Step {
        Step::ALL.get(usize::from(n)).copied().unwrap_or(Step::Exec)
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Step::Clone => "clone",
            Step::Stdio => "redirect stdio",
            Step::JoinCgroup => "join the container cgroup",
            Step::OomScoreAdj => "set oom_score_adj",
            Step::Setsid => "setsid",
            Step::Exec => "exec",
        })
    }
}

/// A start that did not get as far as the container's program.
#[derive(Debug)]
pub(super) struct SpawnError {
    pub step: Step,
    pub error: std::io::Error,
}

impl std::fmt::Display for SpawnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.step, self.error)
    }
}

/// Everything the child does, prepared before the clone.
pub(super) struct Plan {
    path: CString,
    /// Keep the strings that `argv`/`envp` point into alive.
    _strings: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    /// `cgroup.procs` of the container cgroup, one per hierarchy, each written `0`.
    cgroup_procs: Vec<OwnedFd>,
    oom_score_adj: Vec<u8>,
    /// Set by a failing child (the clone shares this memory): the step and its errno.
    failed_step: AtomicU8,
    errno: AtomicI32,
}

// SAFETY: the raw pointers point into `_strings`, which the plan owns and never changes.
unsafe impl Send for Plan {}

/// What the container runs: the resolved program, its argv (argv\[0\] first) and its
/// environment, each key once.
pub(super) struct Program<'a> {
    pub path: &'a std::path::Path,
    pub argv: &'a [&'a String],
    pub env: &'a [(String, String)],
}

/// A program path, argument or variable that holds a NUL byte, which `execve` cannot take.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0} contains a NUL byte")]
pub(super) struct NulByte(String);

impl Plan {
    /// Prepares a start; a NUL byte inside an argument or variable is refused here.
    pub(super) fn new(
        program: Program<'_>,
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: OwnedFd,
        cgroup_procs: Vec<OwnedFd>,
        oom_score_adj: i32,
    ) -> Result<Plan, NulByte> {
        use std::os::unix::ffi::OsStrExt;
        let cstr =
            |what: &str, bytes: &[u8]| CString::new(bytes).map_err(|_| NulByte(what.to_string()));
        let path = cstr("the program path", program.path.as_os_str().as_bytes())?;
        let mut strings = Vec::with_capacity(program.argv.len() + program.env.len());
        for a in program.argv {
            strings.push(cstr("an argument", a.as_bytes())?);
        }
        let argc = strings.len();
        for (k, v) in program.env {
            strings.push(cstr(&format!("env {k:?}"), format!("{k}={v}").as_bytes())?);
        }
        let ptrs = |s: &[CString]| -> Vec<*const libc::c_char> {
            s.iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        let argv = ptrs(&strings[..argc]);
        let envp = ptrs(&strings[argc..]);
        Ok(Plan {
            path,
            _strings: strings,
            argv,
            envp,
            stdin,
            stdout,
            stderr,
            cgroup_procs,
            oom_score_adj: oom_score_adj.to_string().into_bytes(),
            failed_step: AtomicU8::new(0),
            errno: AtomicI32::new(0),
        })
    }

    /// The child's steps, in order; returns only on failure.
    fn run_child(&self) -> (Step, Errno) {
        reset_signals();
        let stdio = rustix::stdio::dup2_stdin(self.stdin.as_fd())
            .and_then(|()| rustix::stdio::dup2_stdout(self.stdout.as_fd()))
            .and_then(|()| rustix::stdio::dup2_stderr(self.stderr.as_fd()));
        if let Err(e) = stdio {
            return (Step::Stdio, e);
        }
        for fd in &self.cgroup_procs {
            if let Err(e) = rustix::io::write(fd, b"0") {
                return (Step::JoinCgroup, e);
            }
        }
        let adj = rustix::fs::open(
            c"/proc/self/oom_score_adj",
            rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .and_then(|fd| rustix::io::write(&fd, &self.oom_score_adj));
        if let Err(e) = adj {
            return (Step::OomScoreAdj, e);
        }
        if let Err(e) = rustix::process::setsid() {
            return (Step::Setsid, e);
        }
        // SAFETY: `path`, `argv` and `envp` are NUL-terminated strings and NULL-terminated
        // arrays of them, owned by this plan, which outlives the call.
        unsafe { libc::execve(self.path.as_ptr(), self.argv.as_ptr(), self.envp.as_ptr()) };
        (Step::Exec, Errno::from_raw_os_error(last_errno()))
    }
}

fn last_errno() -> i32 {
    // SAFETY: `__errno_location` returns this thread's (here: the borrowed thread's) errno.
    unsafe { *libc::__errno_location() }
}

/// Every signal back to its default action and none blocked, as a new program expects
/// (exec keeps ignored signals ignored and the mask as it is; the agent ignores SIGPIPE, and
/// may have inherited other ignored signals from whoever started it).
fn reset_signals() {
    // The kernel's `struct sigaction` for SIG_DFL with no flags and an empty mask is all
    // zeroes. The raw call, because the C library's `sigaction` refuses its own two
    // real-time signals, which an agent's parent may have left ignored.
    let dfl = [0u64; 4];
    // SAFETY: `rt_sigaction`/`sigprocmask` on values on this stack, with the kernel's
    // 8-byte signal set; SIGKILL and SIGSTOP are refused harmlessly.
    unsafe {
        for sig in 1..=libc::c_long::from(libc::SIGRTMAX()) {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                dfl.as_ptr(),
                std::ptr::null_mut::<c_void>(),
                8usize,
            );
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
}

extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Plan` that `spawn` passed, alive while the caller is suspended.
    let plan = unsafe { &*(arg as *const Plan) };
    let (step, errno) = plan.run_child();
    plan.failed_step.store(step as u8, Ordering::Relaxed);
    plan.errno
        .store(errno.raw_os_error().max(1), Ordering::Release);
    // SAFETY: ends the child only; it shares no thread group with the agent.
    unsafe { libc::_exit(127) }
}

/// A child's stack: an anonymous mapping with a guard page below it.
struct Stack {
    base: *mut c_void,
}

impl Stack {
    const GUARD: usize = 4096;

    fn new() -> std::io::Result<Stack> {
        // SAFETY: a fresh private anonymous mapping; checked for failure.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STACK_BYTES + Self::GUARD,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the lowest page of the mapping just made.
        if unsafe { libc::mprotect(base, Self::GUARD, libc::PROT_NONE) } != 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: the mapping made above, not used by anything.
            unsafe { libc::munmap(base, STACK_BYTES + Self::GUARD) };
            return Err(e);
        }
        Ok(Stack { base })
    }

    fn top(&self) -> *mut c_void {
        // SAFETY: one past the end of the mapping: the stack grows down from there.
        unsafe { self.base.cast::<u8>().add(STACK_BYTES + Self::GUARD).cast() }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made; the child that used it has exec'd or exited
        // (the clone returns only then), so nothing uses it any more.
        unsafe { libc::munmap(self.base, STACK_BYTES + Self::GUARD) };
    }
}

/// Starts `plan` in a new process: its pid and a pidfd for it. On an error no child is
/// left behind (a child that failed before exec is reaped here).
pub(super) fn spawn(plan: &Plan) -> Result<(u32, OwnedFd), SpawnError> {
    let clone_failed = |error| SpawnError {
        step: Step::Clone,
        error,
    };
    let stack = Stack::new().map_err(clone_failed)?;
    let mut pidfd: c_int = -1;
    // SAFETY: signal masks on values on this stack; `clone` runs `child_main` on `stack` with
    // this plan, and with CLONE_VFORK returns only once the child has exec'd or exited, so
    // the plan and the stack outlive every use the child makes of them. `pidfd` receives the
    // CLONE_PIDFD descriptor (the wrapper's `ptid` argument).
    let (pid, clone_errno) = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child_main,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            std::ptr::from_ref(plan).cast_mut().cast(),
            &mut pidfd as *mut c_int,
        );
        let clone_errno = last_errno();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        (pid, clone_errno)
    };
    drop(stack);
    if pid < 0 {
        return Err(clone_failed(std::io::Error::from_raw_os_error(clone_errno)));
    }
    // SAFETY: the kernel wrote a new descriptor that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let errno = plan.errno.load(Ordering::Acquire);
    if errno != 0 {
        let _ = reap(&pidfd, true);
        return Err(SpawnError {
            step: Step::from_u8(plan.failed_step.load(Ordering::Relaxed)),
            error: std::io::Error::from_raw_os_error(errno),
        });
    }
    Ok((pid.unsigned_abs(), pidfd))
}

/// How a child ended: the exit code or the terminating signal. `None` while it runs (unless
/// `block`) or when it is not ours to reap.
pub(super) fn reap(pidfd: &OwnedFd, block: bool) -> Option<Ended> {
    use rustix::process::{waitid, WaitId, WaitIdOptions};
    let mut options = WaitIdOptions::EXITED;
    if !block {
        options |= WaitIdOptions::NOHANG;
    }
    loop {
        match waitid(WaitId::PidFd(pidfd.as_fd()), options) {
            Ok(Some(status)) => {
                return match (status.exit_status(), status.terminating_signal()) {
                    (Some(code), _) => Some(Ended::Code(code)),
                    (None, Some(sig)) => Some(Ended::Signal(sig)),
                    (None, None) => None,
                }
            }
            Ok(None) => return None,
            Err(Errno::INTR) => continue,
            Err(_) => return None,
        }
    }
}

/// How a reaped child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    Code(i32),
    Signal(i32),
}

/// Finds `program` the way `execvp` would, in the container's `PATH`: a name with a slash
/// is taken as it is; otherwise the first executable regular file of that name in the
/// `PATH` directories (an empty entry is the working directory).
pub(super) fn resolve(program: &str, path_var: &str) -> Option<std::path::PathBuf> {
    if program.contains('/') {
        return Some(program.into());
    }
    if program.is_empty() {
        return None;
    }
    path_var.split(':').find_map(|dir| {
        let dir = if dir.is_empty() { "." } else { dir };
        let candidate = std::path::Path::new(dir).join(program);
        let is_file = std::fs::metadata(&candidate).is_ok_and(|m| m.is_file());
        (is_file && rustix::fs::access(&candidate, rustix::fs::Access::EXEC_OK).is_ok())
            .then_some(candidate)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn null() -> OwnedFd {
        OwnedFd::from(std::fs::File::open("/dev/null").unwrap())
    }

    /// A plan for `argv` at `path`, stdin and stderr on /dev/null.
    fn plan_at(
        path: &str,
        argv: &[&str],
        env: &[(String, String)],
        stdout: OwnedFd,
    ) -> Result<Plan, NulByte> {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let refs: Vec<&String> = argv.iter().collect();
        let program = Program {
            path: std::path::Path::new(path),
            argv: &refs,
            env,
        };
        Plan::new(program, null(), stdout, null(), Vec::new(), 0)
    }

    /// A plan for `argv`, its program found on a fixed PATH.
    fn plan(argv: &[&str], env: &[(String, String)]) -> Result<Plan, NulByte> {
        let path = resolve(argv[0], "/usr/bin:/bin").expect("on PATH");
        plan_at(path.to_str().unwrap(), argv, env, null())
    }

    #[test]
    fn resolve_follows_path_order_and_takes_slashes_as_given() {
        assert_eq!(resolve("sh", "/nonexistent:/bin"), Some("/bin/sh".into()));
        assert_eq!(resolve("./x", "/bin"), Some("./x".into()));
        assert_eq!(resolve("no-such-program-here", "/bin:/usr/bin"), None);
        // A directory of that name is not a program.
        assert_eq!(resolve("tmp", "/"), None);
    }

    #[test]
    fn a_nul_byte_is_refused_before_any_clone() {
        let e = plan(&["true", "a\0b"], &[]).err().unwrap().to_string();
        assert!(e.contains("argument"), "{e}");
        let env = vec![("K".to_string(), "v\0".to_string())];
        let e = plan(&["true"], &env).err().unwrap().to_string();
        assert!(e.contains("env \"K\""), "{e}");
    }

    #[test]
    fn the_child_runs_the_program_with_its_env_and_is_reaped_with_its_code() {
        let env = vec![("CODE".to_string(), "7".to_string())];
        let p = plan(&["sh", "-c", "exit $CODE"], &env).unwrap();
        let (pid, pidfd) = spawn(&p).unwrap();
        assert!(pid > 0);
        assert_eq!(reap(&pidfd, true), Some(Ended::Code(7)));
    }

    #[test]
    fn a_signal_death_is_reported_as_the_signal() {
        let p = plan(&["sh", "-c", "kill -TERM $$"], &[]).unwrap();
        let (_, pidfd) = spawn(&p).unwrap();
        assert_eq!(reap(&pidfd, true), Some(Ended::Signal(libc::SIGTERM)));
    }

    #[test]
    fn an_exec_failure_names_the_step_and_leaves_no_child() {
        let p = plan_at("/nonexistent/program", &["x"], &[], null()).unwrap();
        let err = spawn(&p).unwrap_err();
        assert_eq!(err.step, Step::Exec);
        assert_eq!(err.error.raw_os_error(), Some(libc::ENOENT));
    }

    #[test]
    fn the_child_starts_with_default_signals_and_an_empty_mask() {
        // SIGPIPE is ignored in every Rust program; the child must not inherit that. `cat`
        // reports its own ignored and blocked signals.
        let (r, w) = rustix::pipe::pipe().unwrap();
        let p = plan_at("/bin/cat", &["cat", "/proc/self/status"], &[], w).unwrap();
        // A signal blocked in the calling thread must not stay blocked in the child.
        // SAFETY: this test thread's own mask, restored below.
        let mut usr1: libc::sigset_t = unsafe { std::mem::zeroed() };
        unsafe {
            libc::sigemptyset(&mut usr1);
            libc::sigaddset(&mut usr1, libc::SIGUSR1);
            libc::pthread_sigmask(libc::SIG_BLOCK, &usr1, std::ptr::null_mut());
        }
        let spawned = spawn(&p);
        // SAFETY: as above.
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &usr1, std::ptr::null_mut()) };
        let (_, pidfd) = spawned.unwrap();
        drop(p);
        let mut out = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(r), &mut out).unwrap();
        assert_eq!(reap(&pidfd, true), Some(Ended::Code(0)));
        for field in ["SigBlk:", "SigIgn:"] {
            let line = out.lines().find(|l| l.starts_with(field)).unwrap();
            assert!(line.ends_with("0000000000000000"), "{line}");
        }
    }
}
