//! One shutdown signal for the whole process: SIGTERM or SIGINT flips it once, and every task
//! that must stop holds a receiver of it.

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

/// The process-wide shutdown signal.
pub(crate) struct Shutdown {
    rx: watch::Receiver<bool>,
}

impl Shutdown {
    /// Installs the SIGTERM/SIGINT handlers (before anything else starts, so an early signal
    /// is not lost) and returns the signal. Must be called inside a tokio runtime.
    pub(crate) fn install() -> std::io::Result<Shutdown> {
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            tracing::info!(signal = name, "shutting down");
            let _ = tx.send(true);
        });
        Ok(Shutdown { rx })
    }

    /// A receiver for another task to stop on.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }

    /// Resolves once the signal has come.
    pub(crate) async fn wait(&mut self) {
        // An error means the handler task is gone, which only happens at runtime shutdown.
        let _ = self.rx.wait_for(|&down| down).await;
    }
}
