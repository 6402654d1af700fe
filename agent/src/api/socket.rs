//! The API's unix socket: root only, never stolen from a live agent, never left behind.
//!
//! Why each step:
//! - The API can stop pods, so only root may connect: the socket is mode `0600`, owned by
//!   root (when the agent runs as root). It is bound under a temporary name, given its mode
//!   and owner, and only then renamed to the configured path, so there is no moment at which
//!   the final path accepts connections with looser permissions.
//! - A missing parent directory is created `0700` (an existing one, like `/run`, is left as
//!   it is).
//! - An existing socket is removed only when nothing answers on it (a stale file from a
//!   crash); if another agent is listening the bind is refused, so two agents never fight
//!   over one node. Anything that is not a socket is never deleted.
//! - Dropping the [`ApiSocket`] removes the path, but only while it is still this socket.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why the API socket could not be set up. One line, naming the path.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// A file system or socket call failed.
    #[error("api socket {path}: {op}: {source}")]
    Io {
        /// The path concerned.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The kernel's error.
        source: std::io::Error,
    },
    /// Another process is listening on the path (another agent?).
    #[error("api socket {path}: another process is already listening there")]
    InUse {
        /// The socket path.
        path: PathBuf,
    },
    /// The path exists and is not a socket; it is left alone.
    #[error("api socket {path}: exists and is not a socket; refusing to replace it")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// The path has no file name or parent (`/`, `..`).
    #[error("api socket {path}: not a usable socket path")]
    BadPath {
        /// The path.
        path: PathBuf,
    },
}

/// A bound, listening API socket; removes its path on drop.
#[derive(Debug)]
pub struct ApiSocket {
    listener: tokio::net::UnixListener,
    path: PathBuf,
    ino: u64,
}

fn io(path: &Path, op: &'static str) -> impl FnOnce(std::io::Error) -> SocketError {
    let path = path.to_path_buf();
    move |source| SocketError::Io { path, op, source }
}

impl ApiSocket {
    /// Binds `path` as described in the module doc. Must be called inside a tokio runtime.
    pub fn bind(path: &Path) -> Result<ApiSocket, SocketError> {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(SocketError::BadPath {
                path: path.to_path_buf(),
            });
        };
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        if !parent.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(io(parent, "create parent directory"))?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => {
                match std::os::unix::net::UnixStream::connect(path) {
                    Ok(_) => {
                        return Err(SocketError::InUse {
                            path: path.to_path_buf(),
                        })
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                        std::fs::remove_file(path).map_err(io(path, "remove stale socket"))?;
                    }
                    Err(source) => {
                        return Err(SocketError::Io {
                            path: path.to_path_buf(),
                            op: "probe existing socket",
                            source,
                        })
                    }
                }
            }
            Ok(_) => {
                return Err(SocketError::NotASocket {
                    path: path.to_path_buf(),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(SocketError::Io {
                    path: path.to_path_buf(),
                    op: "stat",
                    source,
                })
            }
        }

        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let tmp = parent.join(tmp_name);
        let _ = std::fs::remove_file(&tmp);
        let result = (|| {
            let listener =
                std::os::unix::net::UnixListener::bind(&tmp).map_err(io(&tmp, "bind"))?;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
                .map_err(io(&tmp, "chmod 0600"))?;
            if rustix::process::geteuid().is_root() {
                rustix::fs::chown(
                    &tmp,
                    Some(rustix::fs::Uid::ROOT),
                    Some(rustix::fs::Gid::ROOT),
                )
                .map_err(|e| SocketError::Io {
                    path: tmp.clone(),
                    op: "chown root:root",
                    source: e.into(),
                })?;
            }
            let ino = std::fs::symlink_metadata(&tmp)
                .map_err(io(&tmp, "stat"))?
                .ino();
            std::fs::rename(&tmp, path).map_err(io(path, "rename into place"))?;
            listener
                .set_nonblocking(true)
                .map_err(io(path, "set non-blocking"))?;
            let listener =
                tokio::net::UnixListener::from_std(listener).map_err(io(path, "register"))?;
            Ok(ApiSocket {
                listener,
                path: path.to_path_buf(),
                ino,
            })
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// The listener, for the gRPC server (`tokio_stream::wrappers::UnixListenerStream`).
    pub(crate) fn listener(&self) -> &tokio::net::UnixListener {
        &self.listener
    }
}

impl Drop for ApiSocket {
    fn drop(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn binds_0600_in_a_new_0700_dir_and_cleans_up() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("run/reactor/reactor.sock");
        let sock = ApiSocket::bind(&path).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        // The owner can connect; the listener accepts.
        let client = tokio::net::UnixStream::connect(&path).await.unwrap();
        let (_server, _) = sock.listener().accept().await.unwrap();
        drop(client);
        // A second agent is refused while the first listens.
        let err = ApiSocket::bind(&path).unwrap_err();
        assert!(matches!(err, SocketError::InUse { .. }), "{err}");
        drop(sock);
        assert!(!path.exists());
        // Only this socket and its directory were left in the parent.
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            0
        );
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_but_a_file_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("reactor.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap()); // left behind by a crash
        assert!(path.exists());
        let sock = ApiSocket::bind(&path).unwrap();
        tokio::net::UnixStream::connect(&path).await.unwrap();
        drop(sock);
        std::fs::write(&path, "not a socket").unwrap();
        let err = ApiSocket::bind(&path).unwrap_err().to_string();
        assert!(err.contains("not a socket"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");
    }
}
