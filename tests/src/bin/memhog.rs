//! A process that allocates memory at a set rate and touches every page, to drive a memory
//! cgroup into reclaim and OOM from inside the cgroup (never the whole machine).
//!
//! usage: memhog <total-MiB> [MiB-per-second] [hold-seconds]
//! A rate of 0 allocates as fast as it can. After allocating it holds the memory for
//! hold-seconds (default 3600) so the test decides when it ends.
//!
//! With `MEMHOG_SHARED=1` the memory is shared anonymous memory (shmem, `MAP_SHARED`)
//! instead of the heap: charged to the cgroup like the rest, but not what the kernel's OOM
//! reaper or `process_mrelease` can take back from a process that is killed and cannot
//! exit (frozen) — it comes back only when the process is gone.
//!
//! With `MEMHOG_PROGRESS=<path>` it also keeps a progress record there: per 256 KiB piece of
//! each 1 MiB chunk, the CLOCK_MONOTONIC times just before and just after touching it and the usage in the file
//! `MEMHOG_PROGRESS_USAGE` names (required with it: the OOM bench gives kubepods'), laid out
//! as `hog_record/layout.rs` describes. That is the OOM bench's clock
//! for when the workload charged the page that crossed a threshold, independent of every
//! kernel notification under test. The file must already exist, sized for
//! `total-MiB × 4 + 1` entries, with its pages written by whoever created it: the hog maps it shared and only
//! stores into pages that are already in the page cache and charged to the creator's
//! cgroup, so the record adds no charge of its own to the cgroup the hog is measured in.
//! Each entry is stored into the shared mapping as it is made (no buffering), so whatever
//! the hog had done when it was SIGKILLed is there to read.
//!
//! With `MEMHOG_PAGE_TRACE=<usage file>` and `MEMHOG_PAGE_TRACE_FROM=<MiB>` the chunks from
//! that MiB on are touched one page at a time, paced page by page at the rate (the chunks
//! before them at once), and after
//! each page the CLOCK_MONOTONIC time and the usage in the file are noted (in memory
//! allocated up front); when the allocation is done they are printed, one `page <ns>
//! <usage>` line each. That is a clock for the page whose charge crossed a level, for a test
//! that a kernel check runs on that very page. With `MEMHOG_PAGE_TRACE_HOP=<bytes>` too, after
//! the first traced page whose usage is at least that, the hog moves itself to another CPU
//! and stays there (`hop <from> <to>` is printed with the pages): the pages that follow are
//! charged by a CPU that charged none of the ramp, as when the scheduler moves a workload
//! just before its crossing.
//!
//! With `MEMHOG_OUTLIVE=<cgroup.procs>[:<cgroup.procs>…]` it first starts a second process
//! that shares its address space (`clone(CLONE_VM)`, not a thread), which moves itself into
//! those cgroups, out of the pod's, and keeps the address space alive for
//! `MEMHOG_OUTLIVE_MS` (default 1000) after the hog has died, touching
//! `MEMHOG_OUTLIVE_EXTRA_MIB` (default 0) more of it then, charged to its own cgroup: pressure
//! that keeps a threshold met while the hog's memory is held. The pod's cgroup is then empty
//! while everything the hog allocated is still charged to it, anonymous memory on its way
//! back, as when a killed victim's teardown has not begun: what an agent must not mistake
//! for memory that will never come back.
//!
//! With `MEMHOG_BLOCK_TERM=1` it blocks SIGTERM: a pod that ignores a graceful stop and
//! dies only by SIGKILL. Blocked rather than ignored so the SIGTERM stays pending, where
//! `/proc/<pid>/status` (`ShdPnd`) shows the concurrent bench when the stop began.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[path = "../hog_record/layout.rs"]
mod layout;

fn arg(args: &[String], i: usize, default: u64) -> u64 {
    match args.get(i) {
        None => default,
        Some(text) => match text.parse() {
            Ok(v) => v,
            Err(_) => {
                eprintln!("memhog: argument {i} ({text:?}) is not a whole number");
                std::process::exit(2);
            }
        },
    }
}

fn fail(what: String) -> ! {
    eprintln!("memhog: {what}");
    std::process::exit(2);
}

/// CLOCK_MONOTONIC in ns, the clock the agent stamps its events with.
fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// The usage in the open counter file `file` (read from offset 0 each time); 0 if unreadable.
fn read_usage(file: &File, buf: &mut [u8; 32]) -> u64 {
    let n = file.read_at(buf, 0).unwrap_or(0);
    std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// The progress record being written (see the module doc).
struct Progress {
    words: &'static [AtomicU64],
    /// The usage file named by `MEMHOG_PROGRESS_USAGE`, kept open and read from offset 0
    /// each time.
    usage: File,
    buf: [u8; 32],
}

impl Progress {
    /// Maps the record at `path` for `entries` entries; exits if it cannot.
    fn open(path: &str, entries: usize) -> Progress {
        let usage_path = std::env::var_os(layout::USAGE_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| fail(format!("{} needs {}", layout::ENV, layout::USAGE_ENV)));
        let usage = File::open(&usage_path)
            .unwrap_or_else(|e| fail(format!("{}: {e}", usage_path.display())));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap_or_else(|e| fail(format!("progress record {path}: {e}")));
        let need = entries * layout::WORDS * 8;
        let len = file
            .metadata()
            .map(|m| m.len())
            .unwrap_or_else(|e| fail(format!("progress record {path}: {e}")));
        if len < need as u64 {
            fail(format!(
                "progress record {path} has {len} bytes, {need} needed for {entries} entries"
            ));
        }
        // SAFETY: a fresh shared mapping of a file we opened read-write, at least `need`
        // bytes long; it is never unmapped (it lives until the process ends), and the kernel
        // places it page-aligned, so the words are aligned. MAP_POPULATE maps the pages now,
        // not on the first store in a chunk's timing.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                need,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED | rustix::mm::MapFlags::POPULATE,
                &file,
                0,
            )
        }
        .unwrap_or_else(|e| fail(format!("progress record {path}: mmap: {e}")));
        // SAFETY: the mapping above, `need` bytes, valid and aligned for the process's
        // lifetime; only this process stores into it (the reader reads the file after).
        let words =
            unsafe { std::slice::from_raw_parts(ptr.cast::<AtomicU64>(), entries * layout::WORDS) };
        Progress {
            words,
            usage,
            buf: [0; 32],
        }
    }

    fn usage(&mut self) -> u64 {
        read_usage(&self.usage, &mut self.buf)
    }

    fn word(&self, entry: usize, field: usize) -> &AtomicU64 {
        &self.words[entry * layout::WORDS + field]
    }

    fn before(&self, entry: usize, at: u64) {
        self.word(entry, layout::BEFORE)
            .store(at, Ordering::Relaxed);
    }

    /// Completes `entry`: its after time and usage, then its sequence word.
    fn after(&mut self, entry: usize, at: u64) {
        let usage = self.usage();
        self.word(entry, layout::AFTER).store(at, Ordering::Relaxed);
        self.word(entry, layout::USAGE)
            .store(usage, Ordering::Relaxed);
        self.word(entry, layout::SEQ)
            .store(entry as u64 + 1, Ordering::Release);
    }
}

/// Blocks SIGTERM for the process (see the module doc); exits if it cannot.
fn block_term() {
    // SAFETY: a zeroed sigset_t is a valid argument to sigemptyset, which initialises it;
    // the pointers are to locals that outlive the calls; one thread exists at this point,
    // so the thread's mask is the process's.
    let rc = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
    };
    if rc != 0 {
        fail(format!("blocking SIGTERM: error {rc}"));
    }
}

/// What the process sharing the hog's address space needs (see the module doc): the
/// `cgroup.procs` files to join (open descriptors), the hog's pid, and how long to keep the
/// address space once the hog has died.
struct Outlive {
    procs: Vec<i32>,
    hog: i32,
    hold_ms: u64,
    extra_mib: usize,
}

/// Starts the process that outlives the hog (see the module doc); exits if it cannot.
fn outlive(paths: &str) {
    let hold_ms = std::env::var("MEMHOG_OUTLIVE_MS")
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| fail(format!("MEMHOG_OUTLIVE_MS {v:?}")))
        })
        .unwrap_or(1000);
    let extra_mib = std::env::var("MEMHOG_OUTLIVE_EXTRA_MIB")
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| fail(format!("MEMHOG_OUTLIVE_EXTRA_MIB {v:?}")))
        })
        .unwrap_or(0);
    let procs = paths
        .split(':')
        .map(|p| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .unwrap_or_else(|e| fail(format!("{p}: {e}")));
            std::os::fd::IntoRawFd::into_raw_fd(f)
        })
        .collect();
    // Leaked: the other process reads them after this function has returned.
    let args = Box::leak(Box::new(Outlive {
        procs,
        hog: std::process::id() as i32,
        hold_ms,
        extra_mib,
    }));
    let stack = Box::leak(vec![0u8; 256 << 10].into_boxed_slice());
    // SAFETY: the stack and arguments are leaked, so they stay valid for the other
    // process's whole life; it runs only raw system calls on its own stack (no allocation,
    // no lock shared with this process) and ends with `_exit`. The stack grows down from
    // its (16-byte aligned) top.
    let pid = unsafe {
        let top = stack.as_mut_ptr().add(stack.len()) as usize & !15;
        libc::clone(
            outliver,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::SIGCHLD,
            (args as *mut Outlive).cast(),
        )
    };
    if pid < 0 {
        fail(format!("clone: {}", std::io::Error::last_os_error()));
    }
}

/// The process sharing the hog's address space: leaves the hog's session, joins the cgroups, waits for the hog to
/// die (its parent changes), holds the address space `hold_ms` longer, and ends.
extern "C" fn outliver(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the leaked `Outlive` (see `outlive`); only raw system calls follow.
    unsafe {
        let args = &*(arg as *const Outlive);
        // Out of the hog's process group and session too: a runtime that stops a pod by
        // its process group must not end this process with it.
        libc::setsid();
        let mut text = [0u8; 24];
        let mut n = text.len();
        let mut pid = libc::getpid() as u32;
        loop {
            n -= 1;
            text[n] = b'0' + (pid % 10) as u8;
            pid /= 10;
            if pid == 0 {
                break;
            }
        }
        for &fd in &args.procs {
            if libc::write(fd, text[n..].as_ptr().cast(), text.len() - n) < 0 {
                libc::_exit(3);
            }
            libc::close(fd);
        }
        let nap = |ms: u64| {
            let ts = libc::timespec {
                tv_sec: (ms / 1000) as libc::time_t,
                tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
            };
            libc::nanosleep(&ts, std::ptr::null_mut());
        };
        while libc::getppid() == args.hog {
            nap(2);
        }
        if args.extra_mib > 0 {
            let len = args.extra_mib << 20;
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                libc::_exit(4);
            }
            let mut at = 0;
            while at < len {
                *p.cast::<u8>().add(at) = 1;
                at += 4096;
            }
        }
        nap(args.hold_ms);
        libc::_exit(0)
    }
}

fn main() {
    if let Ok(paths) = std::env::var("MEMHOG_OUTLIVE") {
        outlive(&paths);
    }
    if std::env::var_os("MEMHOG_BLOCK_TERM").is_some_and(|v| v == "1") {
        block_term();
    }
    let args: Vec<String> = std::env::args().collect();
    let total_mib = arg(&args, 1, 128);
    let rate = arg(&args, 2, 0);
    let hold = arg(&args, 3, 3600);
    let mut progress = std::env::var(layout::ENV)
        .ok()
        .map(|p| Progress::open(&p, total_mib as usize * layout::PIECES_PER_MIB + 1));
    if let Some(p) = &mut progress {
        let now = monotonic_ns();
        p.before(0, now);
        p.after(0, now);
    }
    let mut trace = PageTrace::from_env(total_mib);
    let start = Instant::now();
    let shared = std::env::var_os("MEMHOG_SHARED").is_some_and(|v| v == "1");
    let mut chunks: Vec<Chunk> = Vec::new();
    for i in 0..total_mib {
        let mut chunk = Chunk::new(shared);
        if let Some(t) = trace.as_mut().filter(|t| i >= t.from_mib) {
            t.touch(&mut chunk, i, rate);
            chunks.push(chunk);
            continue;
        }
        // Touch every page so the memory is really charged to the cgroup, a piece at a time
        // (one record entry each). Volatile stores: the compiler may not move them out from
        // between the two clock reads (the chunk is not yet visible to anything else, so
        // plain stores could be sunk or hoisted).
        for (j, piece) in chunk.bytes().chunks_mut(layout::PIECE_BYTES).enumerate() {
            let entry = i as usize * layout::PIECES_PER_MIB + j + 1;
            if let Some(p) = &progress {
                p.before(entry, monotonic_ns());
            }
            for page in piece.chunks_mut(4096) {
                // SAFETY: a valid, aligned, exclusively borrowed byte of the chunk.
                unsafe { std::ptr::write_volatile(&mut page[0], 1) };
            }
            if let Some(p) = &mut progress {
                p.after(entry, monotonic_ns());
            }
        }
        chunks.push(chunk);
        if rate > 0 && trace.is_none() {
            let due = Duration::from_secs_f64((i + 1) as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    if let Some(t) = &trace {
        t.print();
    }
    println!("allocated {total_mib} MiB");
    std::thread::sleep(Duration::from_secs(hold));
    drop(chunks);
}

/// The page-by-page trace of `MEMHOG_PAGE_TRACE` (see the module doc).
struct PageTrace {
    from_mib: u64,
    usage: File,
    buf: [u8; 32],
    /// (time after the page's touch, usage then), one per traced page.
    pages: Vec<(u64, u64)>,
    /// When the first traced page was due.
    start: Option<Instant>,
    /// `MEMHOG_PAGE_TRACE_HOP`: the usage at which to move to another CPU, until it is done.
    hop_at: Option<u64>,
    /// The CPUs of the move, once made (`None` for the second if there was no other CPU).
    hopped: Option<(usize, Option<usize>)>,
}

impl PageTrace {
    fn from_env(total_mib: u64) -> Option<PageTrace> {
        let path = std::env::var_os("MEMHOG_PAGE_TRACE")?;
        let from_mib = std::env::var("MEMHOG_PAGE_TRACE_FROM")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let usage = File::open(&path)
            .unwrap_or_else(|e| fail(format!("{}: {e}", PathBuf::from(&path).display())));
        let pages = total_mib.saturating_sub(from_mib) as usize * 256;
        let hop_at = std::env::var("MEMHOG_PAGE_TRACE_HOP").ok().map(|v| {
            v.parse()
                .unwrap_or_else(|_| fail(format!("MEMHOG_PAGE_TRACE_HOP={v:?} is not bytes")))
        });
        Some(PageTrace {
            from_mib,
            usage,
            buf: [0; 32],
            pages: Vec::with_capacity(pages),
            start: None,
            hop_at,
            hopped: None,
        })
    }

    /// Touches chunk `i` page by page, each page due at the rate (MiB/s; 0: at once).
    fn touch(&mut self, chunk: &mut Chunk, i: u64, rate: u64) {
        let start = *self.start.get_or_insert_with(Instant::now);
        for (n, page) in chunk.bytes().chunks_mut(4096).enumerate() {
            if rate > 0 {
                let index = (i - self.from_mib) * 256 + n as u64;
                let due = index as f64 / (rate * 256) as f64;
                if let Some(wait) = Duration::from_secs_f64(due).checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            // SAFETY: a valid, aligned, exclusively borrowed byte of the chunk.
            unsafe { std::ptr::write_volatile(&mut page[0], 1) };
            let at = monotonic_ns();
            let usage = read_usage(&self.usage, &mut self.buf);
            if self.pages.len() < self.pages.capacity() {
                self.pages.push((at, usage));
            }
            if self.hop_at.is_some_and(|at| usage >= at) {
                self.hop_at = None;
                self.hopped = Some(hop_to_another_cpu());
            }
        }
    }

    fn print(&self) {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        match self.hopped {
            Some((from, Some(to))) => {
                let _ = writeln!(out, "hop {from} {to}");
            }
            Some((from, None)) => {
                let _ = writeln!(out, "hop {from} none: no other CPU to move to");
            }
            None => {}
        }
        for (at, usage) in &self.pages {
            let _ = writeln!(out, "page {at} {usage}");
        }
    }
}

/// Moves the calling process to one CPU other than the one it runs on, among those it may
/// run on; returns (that CPU, the new one or `None` if there is none). Exits if it cannot.
fn hop_to_another_cpu() -> (usize, Option<usize>) {
    // SAFETY: plain syscalls on a zeroed cpu_set_t local that outlives them; pid 0 is this
    // process (it has one thread).
    unsafe {
        let from = libc::sched_getcpu();
        if from < 0 {
            fail(format!("sched_getcpu: {}", std::io::Error::last_os_error()));
        }
        let from = from as usize;
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            fail(format!(
                "sched_getaffinity: {}",
                std::io::Error::last_os_error()
            ));
        }
        let Some(to) =
            (0..libc::CPU_SETSIZE as usize).find(|&c| c != from && libc::CPU_ISSET(c, &set))
        else {
            return (from, None);
        };
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(to, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            fail(format!(
                "sched_setaffinity to CPU {to}: {}",
                std::io::Error::last_os_error()
            ));
        }
        (from, Some(to))
    }
}

/// One MiB of memory: from the heap, or a shared anonymous mapping (`MEMHOG_SHARED`).
enum Chunk {
    Heap(Vec<u8>),
    Shared(*mut u8),
}

impl Chunk {
    fn new(shared: bool) -> Chunk {
        if !shared {
            return Chunk::Heap(vec![0u8; 1 << 20]);
        }
        // SAFETY: a fresh anonymous mapping, owned by this chunk alone.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                1 << 20,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
            )
        };
        match p {
            Ok(p) => Chunk::Shared(p.cast()),
            Err(e) => fail(format!("mmap of a shared MiB: {e}")),
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        match self {
            Chunk::Heap(v) => v,
            // SAFETY: the mapping is 1 MiB, readable and writable, and lives as long as the
            // chunk (it is never unmapped: the process holds it until it exits).
            Chunk::Shared(p) => unsafe { std::slice::from_raw_parts_mut(*p, 1 << 20) },
        }
    }
}
