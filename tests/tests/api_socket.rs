//! The API socket refuses a non-root client: a child that switched to `nobody` gets
//! EACCES from connect(2), while root connects.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;

use reactor::api::socket::ApiSocket;
use reactor_tests::{is_root, require};

const NOBODY: u32 = 65534;

/// Runs connect(2) to `path` in a child that is `nobody`; returns the error it got, or
/// `None` when it connected. The child never execs: its pre-exec hook connects and reports
/// the outcome as the spawn error the parent receives.
fn connect_as_nobody(path: &Path) -> Option<std::io::Error> {
    let addr = rustix::net::SocketAddrUnix::new(path).expect("socket address");
    let mut cmd = std::process::Command::new("/bin/true");
    cmd.uid(NOBODY).gid(NOBODY);
    // SAFETY: the hook only makes raw socket/connect system calls on values prepared before
    // the fork; it allocates nothing and takes no locks.
    unsafe {
        cmd.pre_exec(move || {
            let fd = rustix::net::socket(
                rustix::net::AddressFamily::UNIX,
                rustix::net::SocketType::STREAM,
                None,
            )?;
            rustix::net::connect(&fd, &addr)?;
            // Connected: say so with an errno connect(2) never returns here.
            Err(rustix::io::Errno::ISCONN.into())
        });
    }
    match cmd.spawn() {
        Ok(mut child) => {
            let _ = child.wait();
            panic!("the child exec'd instead of reporting its connect");
        }
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::ISCONN.raw_os_error()) => None,
        Err(e) => Some(e),
    }
}

#[tokio::test]
async fn a_non_root_client_cannot_connect() {
    if !require(is_root(), "root, to drop to nobody in a child") {
        return;
    }
    let tmp = tempfile::tempdir().expect("temp dir");
    // A parent that nobody may traverse, so only the socket's own mode can stop it.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let open_dir = tmp.path().join("open");
    std::fs::create_dir(&open_dir).expect("mkdir");
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");

    // Control: a socket with mode 0666 in the same place is reachable by nobody.
    let control_path = open_dir.join("control.sock");
    let control = std::os::unix::net::UnixListener::bind(&control_path).expect("bind control");
    std::fs::set_permissions(&control_path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    assert!(
        connect_as_nobody(&control_path).is_none(),
        "control socket must accept nobody"
    );
    drop(control);

    let path = open_dir.join("reactor.sock");
    let sock = ApiSocket::bind(&path).expect("bind api socket");
    let meta = std::fs::metadata(&path).expect("stat");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!((meta.uid(), meta.gid()), (0, 0));
    let err = connect_as_nobody(&path).expect("nobody must not connect");
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    // Root does.
    tokio::net::UnixStream::connect(&path)
        .await
        .expect("root connects");
    drop(sock);
    assert!(!path.exists());

    // In a parent the agent creates itself (0700), nobody cannot even reach the socket.
    let private = tmp.path().join("run/reactor/reactor.sock");
    let sock = ApiSocket::bind(&private).expect("bind in new dir");
    let err = connect_as_nobody(&private).expect("nobody must not connect");
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    drop(sock);
}
