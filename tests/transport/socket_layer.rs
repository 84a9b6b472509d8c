//! The shared socket layer against real files and real sockets in a temp dir.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use csi_nodekit::socket::{self, Permissions, SocketError};

const PERMS: Permissions = Permissions {
    mode: 0o660,
    gid: None,
};

#[test]
fn a_stale_socket_is_removed_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    drop(UnixListener::bind(&path).unwrap()); // the listener is gone, the file stays: stale
    let (listener, _guard) = socket::bind(&path, PERMS).unwrap();
    let _client = UnixStream::connect(&path).expect("new socket answers");
    listener.accept().expect("and it is ours");
}

#[test]
fn a_live_socket_is_refused_and_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    let live = UnixListener::bind(&path).unwrap();
    let err = socket::bind(&path, PERMS).unwrap_err();
    assert!(matches!(err, SocketError::InUse(_)), "{err}");
    assert!(
        err.to_string().contains("in use by another process"),
        "{err}"
    );
    let _client = UnixStream::connect(&path).expect("the live socket still answers");
    live.set_nonblocking(true).unwrap();
    // Our own probe connection and the client above are both queued on the original listener.
    assert!(live.accept().is_ok());
}

#[test]
fn a_regular_file_is_refused_and_left_intact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    std::fs::write(&path, b"precious").unwrap();
    let err = socket::bind(&path, PERMS).unwrap_err();
    assert!(err.to_string().contains("regular file"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
}

#[test]
fn a_directory_is_refused_and_left_intact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join("inside"), b"data").unwrap();
    let err = socket::bind(&path, PERMS).unwrap_err();
    assert!(err.to_string().contains("directory"), "{err}");
    assert_eq!(std::fs::read(path.join("inside")).unwrap(), b"data");
}

#[test]
fn a_symlink_is_refused_and_neither_it_nor_its_target_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target.sock");
    let _dead = UnixListener::bind(&target).unwrap();
    drop(_dead); // even a stale socket behind the link must survive
    let path = dir.path().join("csi.sock");
    std::os::unix::fs::symlink(&target, &path).unwrap();
    let err = socket::bind(&path, PERMS).unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert_eq!(std::fs::read_link(&path).unwrap(), target);
    assert!(common::is_socket(&target));
}

#[ignore = "needs root: gives the socket to a group the user is not in"]
#[test]
fn the_socket_gets_the_requested_mode_and_group() {
    let dir = tempfile::tempdir().unwrap();
    for (mode, gid) in [(0o600, None), (0o660, Some(4242)), (0o700, None)] {
        let path = dir.path().join(format!("s{mode:o}.sock"));
        let (_listener, _guard) = socket::bind(&path, Permissions { mode, gid }).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(
            meta.permissions().mode() & 0o7777,
            mode,
            "{}",
            path.display()
        );
        if let Some(gid) = gid {
            assert_eq!(meta.gid(), gid);
        }
    }
}

#[test]
fn a_missing_parent_directory_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plugins/example.csi.io/csi.sock");
    let (_listener, _guard) = socket::bind(&path, PERMS).unwrap();
    assert!(common::is_socket(&path));
}

#[test]
fn binding_leaves_no_temporary_file_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    let (_listener, _guard) = socket::bind(&path, PERMS).unwrap();
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("csi.sock")]);
}

#[test]
fn the_guard_removes_our_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    let (_listener, guard) = socket::bind(&path, PERMS).unwrap();
    assert!(guard.is_ours());
    drop(guard);
    assert!(!path.exists());
}

#[test]
fn the_guard_never_removes_a_successors_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    let (_listener, guard) = socket::bind(&path, PERMS).unwrap();
    std::fs::remove_file(&path).unwrap();
    let successor = UnixListener::bind(&path).unwrap();
    assert!(!guard.is_ours());
    drop(guard);
    assert!(common::is_socket(&path), "successor's socket was removed");
    let _client = UnixStream::connect(&path).unwrap();
    assert!(successor.accept().is_ok());
}

#[test]
fn an_over_long_path_is_rejected_naming_path_and_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x".repeat(120));
    let err = socket::bind(&path, PERMS).unwrap_err().to_string();
    assert!(
        err.contains(&path.display().to_string()) && err.contains("at most 107"),
        "{err}"
    );
    assert!(!path.exists());
}

#[tokio::test]
async fn dial_waits_for_a_socket_that_appears_late() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("late.sock");
    let late = path.clone();
    common::logs::capture();
    // Late: the driver comes once dial has found no socket and is backing off.
    let server = tokio::spawn(async move {
        let tried = common::wait_until(Duration::from_secs(10), || {
            common::logs::count("; retrying in") > 0
        })
        .await;
        assert!(tried, "dial never retried");
        common::fake_driver::FakeDriver::start(&late, "late.example.io")
    });
    let channel = socket::dial(
        &path,
        Duration::from_millis(200),
        Some(Duration::from_secs(10)),
    )
    .await
    .unwrap();
    let _driver = server.await.unwrap();
    let mut client = csi_nodekit::proto::csi::identity_client::IdentityClient::new(channel);
    let info = client
        .get_plugin_info(csi_nodekit::proto::csi::GetPluginInfoRequest {})
        .await
        .unwrap();
    assert_eq!(info.into_inner().name, "late.example.io");
    common::logs::finish();
}

#[tokio::test]
async fn dial_gives_up_after_its_limit_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("never.sock");
    let err = socket::dial(
        &path,
        Duration::from_millis(100),
        Some(Duration::from_millis(300)),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}
