//! Handing a kernel fd the sources own (eventfd, inotify, PSI trigger) to tokio's poller.

/// Registers an fd we own with tokio's reactor for the given readiness.
pub(crate) fn register_fd(
    fd: std::os::fd::OwnedFd,
    interest: tokio::io::Interest,
) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: an `OwnedFd` owns its descriptor until it is dropped, and the `AsyncFd` owns the
    // `OwnedFd`, so the raw fd stays open and the same for the `AsyncFd`'s whole life.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, interest) }
        .map_err(|e| std::io::Error::other(e.to_string()))
}
