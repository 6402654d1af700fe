//! `chaos --minutes N --seed S [--containerd] [--keep-going]`: one chaos run against the real kernel (root, cgroup v1),
//! as `cargo xtask chaos` starts it; see `reactor_tests::chaos`. Prints what it did, the
//! counts of every action and invariant check, and on a failure the seed and the last
//! actions before it; exits 1 then.

use reactor_tests::chaos::{self, Options};

fn main() {
    let mut opts = Options {
        seed: 0,
        minutes: 2.0,
        containerd: false,
        keep_going: false,
        v2: None,
    };
    let mut seed = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--containerd" {
            opts.containerd = true;
            continue;
        }
        if a == "--keep-going" {
            opts.keep_going = true;
            continue;
        }
        let value = args.next();
        match (a.as_str(), value) {
            ("--minutes", Some(v)) => opts.minutes = v.parse().unwrap_or_else(|_| usage(&a)),
            ("--seed", Some(v)) => seed = Some(v.parse().unwrap_or_else(|_| usage(&a))),
            _ => usage(&a),
        }
    }
    // No seed given: one from the clock, printed first so the run can be repeated.
    opts.seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    if !reactor_tests::require(
        reactor_tests::is_root()
            && std::path::Path::new("/sys/fs/cgroup/memory/memory.oom_control").exists(),
        "root and the cgroup v1 memory hierarchy, for the chaos run",
    ) || (opts.containerd
        && !reactor_tests::require(
            reactor_tests::containerd_available(),
            "containerd, runc and busybox-static, for the chaos run's containerd mode",
        ))
    {
        return;
    }
    println!(
        "chaos: seed {} for {} minutes, {}",
        opts.seed,
        opts.minutes,
        if opts.containerd {
            "pods through containerd"
        } else {
            "pods through the process runtime"
        }
    );
    let seed = opts.seed;
    let result = std::panic::catch_unwind(|| chaos::run(&opts));
    match result {
        Ok(Ok(out)) => {
            print!("{}", out.report(seed));
            println!("chaos: seed {seed}: every invariant held");
        }
        Ok(Err(out)) => {
            print!("{}", out.report(seed));
            println!("chaos: FAILED, seed {seed}; the last actions before it:");
            for l in &out.last {
                println!("  {l}");
            }
            for v in &out.tally.violations {
                println!("  violation: {v}");
            }
            if let Some(log) = &out.agent_log {
                println!("chaos: the agent's log is kept in {}", log.display());
            }
            println!("chaos: repeat with cargo xtask chaos --seed {seed} --minutes ...");
            std::process::exit(1);
        }
        Err(_) => {
            println!("chaos: FAILED (the harness panicked, above), seed {seed}");
            std::process::exit(1);
        }
    }
}

fn usage(arg: &str) -> ! {
    eprintln!("chaos: bad argument {arg:?}; usage: chaos [--minutes N] [--seed S] [--containerd] [--keep-going]");
    std::process::exit(2);
}
