//! The kubelet emulator in process, watching: which files it ignores, how it follows sockets
//! that go and come back, and when it tries a refused plugin again.

use crate::common;

use std::time::Duration;

use common::fake_plugin::{Bind, NodeAnswer, csi_plugin, node, registration};
use common::kubelet::{Kubelet, WAIT, dirs, failed, registered};
use csi_nodekit::probe::kubelet::{Event, Retry};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dotfiles_regular_files_and_their_like_created_later_are_ignored() {
    let d = dirs();
    std::fs::create_dir_all(&d.registry).unwrap();
    std::fs::write(d.registry.join("notes-reg.sock"), "not a socket").unwrap();
    let info = csi_plugin("h.csi", "/nowhere/csi.sock");
    let (_early, early) = registration(
        &d.registry.join(".early-reg.sock"),
        Bind::AtPath,
        info.clone(),
    );
    let mut kubelet = Kubelet::start(&d.registry, None);
    kubelet.assert_quiet_for(Duration::from_millis(1_200)).await;

    let (_late, late) = registration(
        &d.registry.join(".late-reg.sock"),
        Bind::AtPath,
        info.clone(),
    );
    std::fs::write(d.registry.join("later.txt"), "still not a socket").unwrap();
    std::fs::create_dir(d.registry.join(".hidden-dir")).unwrap();
    let (_inside, inside) = registration(
        &d.registry.join(".hidden-dir/in-reg.sock"),
        Bind::AtPath,
        info.clone(),
    );
    kubelet.assert_quiet_for(Duration::from_millis(1_200)).await;

    // A visible socket is seen, so the silence above was the filter, not a deaf watcher.
    let (_seen, seen) = registration(&d.registry.join("seen-reg.sock"), Bind::AtPath, info);
    let (socket, _, _) = failed(kubelet.next().await);
    assert!(socket.ends_with("seen-reg.sock"));
    assert_eq!(seen.get_info_count(), 1);
    for ignored in [early, late, inside] {
        assert_eq!(ignored.get_info_count(), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_socket_is_deregistered_and_a_recreated_one_registers_again() {
    let d = dirs();
    let driver_socket = d.root.join("csi.sock");
    let _driver = node(&driver_socket, NodeAnswer::new("n1", 0, &[("zone", "z1")]));
    let info = csi_plugin("r.csi", &driver_socket.display().to_string());
    let reg_socket = d.registry.join("r-reg.sock");
    let (reg, _) = registration(&reg_socket, Bind::Renamed, info.clone());
    let mut kubelet = Kubelet::start(&d.registry, None);
    registered(kubelet.next().await);

    reg.stop().await; // the socket layer removes its socket: IN_DELETE
    let Event::Deregistered {
        socket,
        driver,
        node,
    } = kubelet.next().await
    else {
        panic!("expected a deregistration");
    };
    assert_eq!((socket, driver.as_str()), (reg_socket.clone(), "r.csi"));
    assert_eq!(node.csi_node["spec"]["drivers"], json!([]));
    assert_eq!(node.annotation, None);
    assert_eq!(
        node.labels.get("zone").map(String::as_str),
        Some("z1"),
        "labels stay"
    );

    let (_reg, registrar) = registration(&reg_socket, Bind::Renamed, info);
    let (socket, _, node) = registered(kubelet.next().await);
    assert_eq!(socket, reg_socket);
    assert_eq!(node.annotation.as_deref(), Some(r#"{"r.csi":"n1"}"#));
    assert!(registrar.statuses(1, WAIT).await[0].plugin_registered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_replaced_by_a_rename_is_deregistered_then_registered_again() {
    let d = dirs();
    let driver_socket = d.root.join("csi.sock");
    let _driver = node(&driver_socket, NodeAnswer::new("n1", 0, &[]));
    let info = csi_plugin("m.csi", &driver_socket.display().to_string());
    let reg_socket = d.registry.join("m-reg.sock");
    let (_old, _) = registration(&reg_socket, Bind::AtPath, info.clone());
    let mut kubelet = Kubelet::start(&d.registry, None);
    registered(kubelet.next().await);

    // A new server at a hidden name, moved over the live socket: only IN_MOVED_TO is seen.
    let staged = d.registry.join(".staged-reg.sock");
    let (_new, new) = registration(&staged, Bind::AtPath, info);
    std::fs::rename(&staged, &reg_socket).unwrap();
    assert!(matches!(kubelet.next().await, Event::Deregistered { .. }));
    registered(kubelet.next().await);
    assert!(new.statuses(1, WAIT).await[0].plugin_registered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_retried_with_a_doubling_back_off() {
    let d = dirs();
    let mut info = csi_plugin("b.csi", "/p/csi.sock");
    info.supported_versions.clear();
    let (_reg, registrar) = registration(&d.registry.join("b-reg.sock"), Bind::AtPath, info);
    let mut kubelet = Kubelet::start(&d.registry, None);
    let mut waits = Vec::new();
    for _ in 0..4 {
        let (_, _, retry) = failed(kubelet.next().await);
        waits.push(retry);
    }
    let expected: Vec<Retry> = [500, 1_000, 2_000, 4_000]
        .map(|ms| Retry::After(Duration::from_millis(ms)))
        .to_vec();
    assert_eq!(waits, expected);
    let calls = registrar.get_info_calls.lock().unwrap().clone();
    let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1] - w[0]).collect();
    for (gap, wait) in gaps.iter().zip([500, 1_000, 2_000]) {
        assert!(*gap > Duration::from_millis(wait), "gaps {gaps:?}");
    }
    assert!(gaps[2] > gaps[0], "the gaps grow: {gaps:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_in_subdirectories_register_including_directories_made_later() {
    let d = dirs();
    let driver_socket = d.root.join("csi.sock");
    let _driver = node(&driver_socket, NodeAnswer::new("n1", 0, &[]));
    let endpoint = driver_socket.display().to_string();
    let (_early, _) = registration(
        &d.registry.join("deep/er/early-reg.sock"),
        Bind::AtPath,
        csi_plugin("early.csi", &endpoint),
    );
    let mut kubelet = Kubelet::start(&d.registry, None);
    assert!(
        registered(kubelet.next().await)
            .0
            .ends_with("deep/er/early-reg.sock")
    );

    std::fs::create_dir(d.registry.join("later")).unwrap();
    let (_late, registrar) = registration(
        &d.registry.join("later/late-reg.sock"),
        Bind::AtPath,
        csi_plugin("late.csi", &endpoint),
    );
    let (socket, _, node) = registered(kubelet.next().await);
    assert!(socket.ends_with("later/late-reg.sock"));
    assert_eq!(
        node.annotation.as_deref(),
        Some(r#"{"early.csi":"n1","late.csi":"n1"}"#)
    );
    assert!(registrar.statuses(1, WAIT).await[0].plugin_registered);
}
