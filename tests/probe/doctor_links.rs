//! The doctor on nodes as they are laid out in the field, run as a real process: a kubelet
//! root reached through an absolute symbolic link under `--host-root` (the way the doctor pod
//! runs), links in the registry that point outside `--host-root` (never followed there), and
//! every kind of non-socket in the registry, each named.

use crate::common;

use std::os::unix::fs::symlink;
use std::path::Path;

use common::doctor::{
    KubeletRoot, bait_behind_a_registry_link, behaviour, doctor, fake_driver, registration,
};
use common::fake_plugin::{NodeAnswer, csi_plugin};

const D: &str = "x.csi.example.io";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_kubelet_root_behind_an_absolute_link_is_healthy_under_host_root() {
    let host = tempfile::tempdir().unwrap();
    let on_host = |p: &str| host.path().join(p.trim_start_matches('/'));
    // The host's /var/lib/kubelet -> /data/kubelet: the data disk, as many nodes have it.
    std::fs::create_dir_all(on_host("/var/lib")).unwrap();
    symlink("/data/kubelet", on_host("/var/lib/kubelet")).unwrap();
    let endpoint = "/var/lib/kubelet/plugins/x.csi.example.io/csi.sock";
    let _driver = fake_driver(
        &on_host("/data/kubelet/plugins/x.csi.example.io/csi.sock"),
        behaviour(D),
        NodeAnswer::new("node-a", 0, &[]),
    );
    let reg = "/var/lib/kubelet/plugins_registry/x.csi.example.io-reg.sock";
    let (_reg, _) = registration(
        &on_host("/data/kubelet/plugins_registry/x.csi.example.io-reg.sock"),
        csi_plugin(D, endpoint),
    );
    let host_root = format!("--host-root={}", host.path().display());
    let out = doctor(Path::new("/var/lib/kubelet"), &[&host_root]).await;
    assert_eq!(out.code, Some(0), "{:#}", out.report);
    assert_eq!(
        out.plugin(Path::new(reg))["healthy"],
        true,
        "{:#}",
        out.report
    );
    assert!(out.errors().is_empty(), "{:?}", out.errors());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it"]
async fn a_registry_link_pointing_outside_host_root_is_not_followed_there() {
    let host = tempfile::tempdir().unwrap();
    // A live registration socket in the doctor's own filesystem, outside the host root.
    let (_outside, _bait, bait_registrar) = bait_behind_a_registry_link(host.path(), D);
    let host_root = format!("--host-root={}", host.path().display());
    let out = doctor(Path::new("/var/lib/kubelet"), &[&host_root]).await;
    assert_eq!(out.code, Some(1), "{:#}", out.report);
    let (_, saw) = &out.of("registry.not-socket")[0];
    assert!(
        saw.ends_with("x.csi.example.io-reg.sock is a dangling symbolic link, not a socket"),
        "{saw}"
    );
    assert_eq!(
        bait_registrar.get_info_count(),
        0,
        "the doctor called the socket outside --host-root"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: the doctor refuses to check a node without it (and mknod)"]
async fn every_kind_of_non_socket_in_the_registry_is_named() {
    let node = KubeletRoot::new();
    let registry = node.registry();
    let named = |driver: &str| node.reg_socket(driver);
    std::fs::create_dir(named("dir.csi.example.io")).unwrap();
    std::fs::write(named("file.csi.example.io"), b"").unwrap();
    nix::unistd::mkfifo(&named("fifo.csi.example.io"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let null = nix::sys::stat::makedev(1, 3);
    let char_mode = nix::sys::stat::SFlag::S_IFCHR;
    nix::sys::stat::mknod(
        &named("char.csi.example.io"),
        char_mode,
        nix::sys::stat::Mode::S_IRWXU,
        null,
    )
    .unwrap();
    symlink("/nowhere", named("link.csi.example.io")).unwrap();
    nix::unistd::mkfifo(&registry.join("notes.fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let out = doctor(&node.root, &[]).await;
    assert_eq!(out.code, Some(1), "{:#}", out.report);
    let mut saw: Vec<String> = out
        .of("registry.not-socket")
        .into_iter()
        .map(|(severity, saw)| {
            assert_eq!(severity, "error", "{saw}");
            let name = Path::new(&saw).file_name().unwrap().to_string_lossy();
            name.into_owned()
        })
        .collect();
    saw.sort();
    assert_eq!(
        saw,
        [
            "char.csi.example.io-reg.sock is a character device, not a socket",
            "dir.csi.example.io-reg.sock is a directory, not a socket",
            "fifo.csi.example.io-reg.sock is a FIFO (named pipe), not a socket",
            "file.csi.example.io-reg.sock is a regular file, not a socket",
            "link.csi.example.io-reg.sock is a dangling symbolic link, not a socket",
        ]
    );
    let ignored = out.of("registry.ignored");
    assert_eq!(ignored.len(), 1, "{ignored:?}");
    assert!(
        ignored[0].1.ends_with("notes.fifo is a FIFO (named pipe)"),
        "{ignored:?}"
    );
}
