//! The cgroup v2 suite's runner, PID 1's child in the guest `cargo xtask vm-test` boots.
//!
//! usage: v2-suite [--results FILE] [--only NAME,NAME] [--list]
//!
//! Runs every enabled check of `reactor_tests::v2::CHECKS` (or the named ones) in order and
//! writes one JSON line per check to FILE (the guest's second serial port): `{"start": name}`
//! before it runs, `{"name", "pass", "output"}` after, `{"done": true, "seconds": S}` at the
//! end, flushed line by line so a crash or a hang still names the test it happened in.
//! Progress goes to stdout (the console). A failing check is a caught panic: the others
//! still run.

use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use reactor_tests::v2::{enable_root_controllers, CHECKS};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut results: Option<String> = None;
    let mut only: Option<Vec<String>> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--results" => results = it.next().cloned(),
            "--only" => {
                only = it
                    .next()
                    .map(|v| v.split(',').map(str::to_string).collect())
            }
            "--list" => {
                for e in CHECKS {
                    println!("{}{}", e.name, if e.enabled { "" } else { " (disabled)" });
                }
                return;
            }
            other => {
                eprintln!(
                    "v2-suite: unknown argument {other:?} (--results FILE, --only A,B, --list)"
                );
                std::process::exit(2);
            }
        }
    }
    if let Some(names) = &only {
        for n in names {
            if !CHECKS.iter().any(|e| e.name == n) {
                eprintln!("v2-suite: no check named {n:?} (see --list)");
                std::process::exit(2);
            }
        }
    }
    let mut out: Box<dyn std::io::Write> = match &results {
        Some(path) => match std::fs::OpenOptions::new().write(true).open(path) {
            Ok(f) => Box::new(f),
            Err(e) => {
                eprintln!("v2-suite: cannot open {path}: {e}");
                std::process::exit(2);
            }
        },
        None => Box::new(std::io::stdout()),
    };
    let mut emit = |v: serde_json::Value| {
        let _ = writeln!(out, "{v}");
        let _ = out.flush();
    };
    // Panics are failures of the check that raised them: keep their message (and
    // location) for the result instead of printing them.
    let panic_message = Arc::new(Mutex::new(String::new()));
    {
        let slot = Arc::clone(&panic_message);
        std::panic::set_hook(Box::new(move |info| {
            let text = format!("{info}");
            if let Ok(mut s) = slot.lock() {
                s.push_str(&text);
                s.push('\n');
            }
        }));
    }
    let started = Instant::now();
    if let Err(e) = enable_root_controllers() {
        emit(serde_json::json!({"name": "setup", "pass": false, "output": e}));
    }
    for entry in CHECKS {
        let selected = only
            .as_ref()
            .map_or(entry.enabled, |names| names.iter().any(|n| n == entry.name));
        if !selected {
            if !entry.enabled {
                println!("@@ disabled: {}", entry.name);
            }
            continue;
        }
        println!("@@ start {}", entry.name);
        emit(serde_json::json!({"start": entry.name}));
        if let Ok(mut s) = panic_message.lock() {
            s.clear();
        }
        let t0 = Instant::now();
        let outcome = std::panic::catch_unwind(entry.check);
        let (pass, output) = match outcome {
            Ok(notes) => (true, notes),
            Err(_) => (
                false,
                panic_message.lock().map(|s| s.clone()).unwrap_or_default(),
            ),
        };
        println!(
            "@@ {} {} ({:.1} s emulated)",
            if pass { "PASS" } else { "FAIL" },
            entry.name,
            t0.elapsed().as_secs_f64()
        );
        emit(serde_json::json!({"name": entry.name, "pass": pass, "output": output}));
    }
    emit(serde_json::json!({"done": true, "seconds": started.elapsed().as_secs_f64()}));
}
