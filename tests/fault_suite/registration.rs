//! The registration socket under what nodes do to it: deleted, replaced, rejected in storms,
//! and the driver behind it restarting. Each time the kubelet's GetInfo must work again.

use std::time::Duration;

use super::processes::{self, Node};
use super::tally::Tally;
use crate::common::{self, free_local_address};
use csi_nodekit::proto::registration::RegistrationStatus;
use csi_nodekit::proto::registration::registration_client::RegistrationClient;
use csi_nodekit::socket::identity_of;

const TRIES: usize = 5;

/// Whether a new socket (not `before`) is at `node`'s registration path and answers GetInfo
/// within `limit`.
async fn healed(
    node: &Node,
    before: Option<csi_nodekit::socket::Identity>,
    limit: Duration,
) -> bool {
    let path = node.reg_socket();
    let replaced = common::wait_until(limit, || {
        identity_of(&path).is_some_and(|now| Some(now) != before)
    })
    .await;
    replaced && processes::registered(&path).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_or_replaced_registration_socket_heals() {
    let node = Node::new();
    let _driver = node.node_server().await.expect("node-server");
    let http = free_local_address();
    let _registrar = node.registrar(&http).await.expect("registered");
    let mut tally = Tally::new("registration socket deleted or replaced by a dead one");
    for attempt in 0..TRIES {
        let before = identity_of(&node.reg_socket());
        std::fs::remove_file(node.reg_socket()).expect("delete the registration socket");
        let back = healed(&node, before, processes::BACK_WITHIN).await;
        tally.check(back, format_args!("deleted, try {attempt}"));

        let before = identity_of(&node.reg_socket());
        std::fs::remove_file(node.reg_socket()).expect("delete the registration socket");
        drop(std::os::unix::net::UnixListener::bind(node.reg_socket()).unwrap());
        let dead = identity_of(&node.reg_socket());
        let back = healed(&node, dead.or(before), processes::BACK_WITHIN).await;
        tally.check(back, format_args!("replaced, try {attempt}"));
    }
    tally.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storms_of_rejections_from_the_kubelet_end_in_a_registration_each_time() {
    let node = Node::new();
    let _driver = node.node_server().await.expect("node-server");
    let http = free_local_address();
    let mut registrar = node.registrar(&http).await.expect("registered");
    let mut tally = Tally::new("NotifyRegistrationStatus(false) storms of 50");
    for storm in 0..TRIES {
        let before = identity_of(&node.reg_socket());
        let channel = csi_nodekit::socket::connect(&node.reg_socket())
            .await
            .unwrap();
        let calls = (0..50).map(|_| {
            let mut kubelet = RegistrationClient::new(channel.clone());
            tokio::spawn(async move {
                let status = RegistrationStatus {
                    plugin_registered: false,
                    error: "plugin registration failed: storm".into(),
                };
                let _ = kubelet.notify_registration_status(status).await;
            })
        });
        for call in calls.collect::<Vec<_>>() {
            let _ = call.await;
        }
        // The registrar backs off before a new socket; the kubelet then accepts it.
        let back = healed(&node, before, Duration::from_secs(15)).await;
        let alive = matches!(registrar.0.try_wait(), Ok(None));
        tally.check(
            back && alive,
            format_args!("storm {storm}: alive {alive}, back {back}"),
        );
        if back {
            let channel = csi_nodekit::socket::connect(&node.reg_socket())
                .await
                .unwrap();
            let accepted = RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            };
            let _ = RegistrationClient::new(channel)
                .notify_registration_status(accepted)
                .await;
        }
    }
    let healthy = processes::healthz_within(&http, 200, processes::BACK_WITHIN).await;
    tally.check(healthy, "/healthz after the storms");
    tally.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registrar_follows_a_driver_killed_and_restarted_ten_times() {
    let node = Node::new();
    let mut driver = node.node_server().await.expect("node-server");
    let http = free_local_address();
    let _registrar = node.registrar(&http).await.expect("registered");
    let mut tally = Tally::new("driver SIGKILL and restart behind the registrar");
    for cycle in 0..10 {
        processes::kill(driver);
        let Some(again) = node.node_server().await else {
            panic!("node-server did not come back in cycle {cycle}");
        };
        driver = again;
        let registered = processes::registered(&node.reg_socket()).await;
        let healthy = processes::healthz_within(&http, 200, processes::BACK_WITHIN).await;
        tally.check(
            registered && healthy,
            format_args!("cycle {cycle}: registered {registered}, healthy {healthy}"),
        );
    }
    tally.finish();
}
