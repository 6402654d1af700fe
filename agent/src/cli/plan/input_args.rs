//! The arguments every plan takes: where the snapshot comes from and how to print the
//! answer. Its own file, not `plan/mod.rs`: every plan uses it and `plan/mod.rs` dispatches
//! to the plans, so defined there it made each plan and `plan/mod.rs` use each other.

use std::path::PathBuf;

use clap::Args;
use reactor::plan::input::{read_input, render, InputError};
use serde::Serialize;

use super::Failure;

/// Where the snapshot comes from and how to print the answer.
#[derive(Args)]
pub(crate) struct InputArgs {
    /// The JSON snapshot; `-` reads stdin.
    #[arg(long, value_name = "FILE")]
    input: PathBuf,
    /// Print the answer on one line instead of indented.
    #[arg(long)]
    compact: bool,
}

impl InputArgs {
    /// Reads the snapshot, runs `plan` on it and prints the answer on stdout.
    pub(super) fn answer<T: Serialize>(
        &self,
        plan: impl FnOnce(&[u8]) -> Result<T, InputError>,
    ) -> Result<(), Failure> {
        let bytes = read_input(&self.input).map_err(|e| Failure::Input(e.to_string()))?;
        let answer = plan(&bytes).map_err(|e| Failure::Input(e.to_string()))?;
        println!("{}", render(&answer, !self.compact));
        Ok(())
    }
}
