//! The `reactor` command: runs the agent, watches the kernel, and answers "what would the
//! agent do" offline. Each subcommand lives in its own module under `cli/`.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
