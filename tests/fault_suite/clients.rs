//! Clients as nodes have them: gRPC clients that send the socket's path as `:authority` (old
//! kubelets, grpcio), idle connections held open against the health ports, and a driver that
//! hangs while a healthy one is re-created at its path.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::processes::{self, Node};
use super::tally::Tally;
use crate::common::raw_h2::RawH2;
use crate::common::{free_local_address, hung_listener};

const GET_PLUGIN_INFO: &str = "/csi.v1.Identity/GetPluginInfo";
const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_send_the_socket_path_as_authority_are_answered_on_both_sockets() {
    let node = Node::new();
    let _driver = node.node_server().await.expect("node-server");
    let _registrar = node
        .registrar(&free_local_address())
        .await
        .expect("registered");
    let mut tally =
        Tally::new("calls with the socket path as :authority (CSI and registration sockets)");
    for (socket, method) in [(node.csi(), GET_PLUGIN_INFO), (node.reg_socket(), GET_INFO)] {
        let answers = tokio::task::spawn_blocking(move || {
            let mut client = RawH2::connect(&socket);
            let authority = socket.display().to_string();
            (0..10)
                .map(|_| client.unary(Some(&authority), method, &[]))
                .map(|reply| {
                    reply
                        .map(|r| (r.status, r.grpc_status))
                        .map_err(|e| e.to_string())
                })
                .collect::<Vec<_>>()
        })
        .await
        .expect("raw client");
        for answer in answers {
            let ok = matches!(&answer, Ok((status, grpc)) if status == "200" && grpc == "0");
            tally.check(ok, format_args!("{method}: {answer:?}"));
        }
    }
    tally.finish();
}

/// The kubelet restarts a container after this many probes in a row fail (its default
/// `failureThreshold`); one late probe on a crowded node restarts nothing.
const KUBELET_FAILURE_THRESHOLD: u32 = 3;

/// Probes that missed the kubelet's default timeout and the slowest answer, over all floods.
#[derive(Default)]
struct Misses {
    late: u32,
    slowest: Duration,
}

/// Probes `/healthz` 20 times while 500 idle connections are held, three floods in a row. A
/// probe answers when it gets 200 within the kubelet's default probe timeout (1 s); a try is
/// lost when the kubelet would restart the mode: [`KUBELET_FAILURE_THRESHOLD`] misses in a row.
fn flood(tally: &mut Tally, misses: &mut Misses, name: &str, address: &str) {
    for round in 0..3 {
        let idle: Vec<TcpStream> = (0..500)
            .filter_map(|_| TcpStream::connect(address).ok())
            .collect();
        let mut missed_in_a_row = 0;
        for probe in 0..20 {
            let started = Instant::now();
            let status = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(processes::healthz(address));
            let took = started.elapsed();
            misses.slowest = misses.slowest.max(took);
            if status == 200 && took < Duration::from_secs(1) {
                missed_in_a_row = 0;
            } else {
                missed_in_a_row += 1;
                misses.late += 1;
            }
            tally.check(
                missed_in_a_row < KUBELET_FAILURE_THRESHOLD,
                format_args!(
                    "{name} round {round} probe {probe}: {status} in {took:?}, \
                     miss {missed_in_a_row} in a row"
                ),
            );
        }
        drop(idle);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_ports_answer_probes_while_500_idle_connections_are_held() {
    let node = Node::new();
    let _driver = node.node_server().await.expect("node-server");
    let (probe_http, registrar_http) = (free_local_address(), free_local_address());
    let _probe = node
        .livenessprobe(&probe_http)
        .await
        .expect("livenessprobe");
    let _registrar = node.registrar(&registrar_http).await.expect("registered");
    let tally = tokio::task::spawn_blocking(move || {
        let mut tally =
            Tally::new("/healthz under 500 idle connections (3 floods x 20 probes, 2 modes)");
        let mut misses = Misses::default();
        flood(&mut tally, &mut misses, "livenessprobe", &probe_http);
        flood(&mut tally, &mut misses, "registrar", &registrar_http);
        tally.note(format_args!(
            "{} probes missed 1 s, a restart takes {KUBELET_FAILURE_THRESHOLD} in a row; \
             slowest {:?}",
            misses.late, misses.slowest
        ));
        tally
    });
    tally.await.expect("flood").finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn livenessprobe_follows_a_driver_recreated_beside_a_hung_one() {
    let node = Node::new();
    std::fs::create_dir_all(node.csi().parent().unwrap()).unwrap();
    let http = free_local_address();
    let _probe = node.livenessprobe_process(&http);
    let mut tally = Tally::new("hung driver, then a healthy one re-created at its path");
    for attempt in 0..3 {
        let hung = hung_listener(&node.csi(), None);
        let unhealthy = processes::healthz_within(&http, 500, Duration::from_secs(5)).await;
        // The hung peer keeps its connection; a healthy driver takes over the path.
        std::fs::remove_file(node.csi()).unwrap();
        let driver = node.node_server().await;
        let healthy = processes::healthz_within(&http, 200, Duration::from_secs(5)).await;
        tally.check(
            unhealthy && healthy && driver.is_some(),
            format_args!("try {attempt}: 500 while hung {unhealthy}, 200 after {healthy}"),
        );
        hung.abort();
        if let Some(driver) = driver {
            processes::kill(driver);
        }
        let _ = std::fs::remove_file(node.csi());
    }
    tally.finish();
}
