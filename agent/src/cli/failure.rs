//! How a command fails: the exit code each failure maps to. Its own file, not `mod.rs`:
//! every command returns it and `mod.rs` dispatches to the commands, so defined there it
//! made each command and `mod.rs` use each other (a circle `cargo xtask house` reports).

/// A failure with the exit code it maps to.
pub(crate) enum Failure {
    /// Bad input: exit 2 with one line on stderr.
    Input(String),
    /// Something failed while running: exit 1.
    Runtime(anyhow::Error),
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Runtime(e.into())
    }
}
