//! `reactor plan <what>` inputs (also the API's `Plan` call): a JSON node snapshot, decided
//! offline. The input is the plan's name, a newline, and the document.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reactor::plan::input::{render, InputError};
use reactor_fuzz::one_line;

type Answer = Result<serde_json::Value, InputError>;

fn preempt(bytes: &[u8]) -> Answer {
    reactor::plan::preempt::run(bytes)
        .map(|a| serde_json::to_value(a).expect("an answer serializes"))
}

fuzz_target!(|data: &[u8]| {
    let (what, input) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    // The entry points `reactor plan` (cli/plan) calls with the file's bytes.
    let run: fn(&[u8]) -> Answer = match what {
        b"evict" => reactor::plan::evict::run,
        b"preempt" => preempt,
        b"image-gc" => reactor::plan::image_gc::run,
        b"cgroups" => reactor::plan::cgroups::run,
        b"pressure" => reactor::plan::pressure::run,
        _ => return,
    };
    match run(input) {
        Err(e) => one_line("plan", &e.to_string()),
        Ok(answer) => {
            // What the command prints is JSON, and the decision is a function of the input.
            let printed = render(&answer, true);
            let back: serde_json::Value =
                serde_json::from_str(&printed).expect("the printed answer is JSON");
            assert_eq!(back, answer, "printed answer");
            let twice = run(input).expect("the same input is accepted twice");
            assert_eq!(twice, answer, "the same input decided twice");
        }
    }
});
