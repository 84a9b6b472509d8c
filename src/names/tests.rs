//! Lookups against a real name server on loopback (a UDP and TCP responder in this process,
//! on a port of its own) and files in a temporary directory.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::sync::{Arc, Mutex};

use simple_dns::rdata::{A, AAAA, RData};
use simple_dns::{CLASS, Packet, PacketFlag, QTYPE, RCODE, ResourceRecord, TYPE};

use super::*;

/// What the responder does for a name.
#[derive(Clone)]
enum Zone {
    Addresses(Vec<IpAddr>),
    /// The addresses only over TCP: over UDP an empty answer with TC set.
    Truncated(Vec<IpAddr>),
}

struct Server {
    port: u16,
    asked: Arc<Mutex<Vec<String>>>,
}

fn reply_to(query: &[u8], zones: &HashMap<String, Zone>, tcp: bool) -> Option<Vec<u8>> {
    let query = Packet::parse(query).ok()?;
    let question = query.questions.first()?.clone();
    let name = question.qname.to_string();
    let mut reply = Packet::new_reply(query.id());
    reply.questions.push(question.clone());
    let kind = question.qtype;
    match zones.get(&name) {
        None => *reply.rcode_mut() = RCODE::NameError,
        Some(Zone::Truncated(_)) if !tcp => reply.set_flags(PacketFlag::TRUNCATION),
        Some(Zone::Addresses(ips) | Zone::Truncated(ips)) => {
            for ip in ips {
                let rdata = match (ip, kind) {
                    (IpAddr::V4(v4), QTYPE::TYPE(TYPE::A)) => RData::A(A::from(*v4)),
                    (IpAddr::V6(v6), QTYPE::TYPE(TYPE::AAAA)) => RData::AAAA(AAAA::from(*v6)),
                    _ => continue,
                };
                let record = ResourceRecord::new(question.qname.clone(), CLASS::IN, 60, rdata);
                reply.answers.push(record);
            }
        }
    }
    reply.build_bytes_vec().ok()
}

/// A name server answering `zones` (NXDOMAIN for any other name) over UDP and TCP.
fn serve(zones: &[(&str, Zone)]) -> Server {
    let zones: HashMap<String, Zone> = zones
        .iter()
        .map(|(n, z)| ((*n).to_owned(), z.clone()))
        .collect();
    let (udp, tcp) = loop {
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = udp.local_addr().unwrap().port();
        if let Ok(tcp) = TcpListener::bind(("127.0.0.1", port)) {
            break (udp, tcp);
        }
    };
    let port = udp.local_addr().unwrap().port();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let (udp_zones, udp_asked) = (zones.clone(), asked.clone());
    std::thread::spawn(move || {
        let mut buffer = [0u8; 1500];
        while let Ok((read, from)) = udp.recv_from(&mut buffer) {
            if let Ok(p) = Packet::parse(&buffer[..read]) {
                let q = &p.questions[0];
                udp_asked
                    .lock()
                    .unwrap()
                    .push(format!("{} {:?}", q.qname, q.qtype));
            }
            if let Some(reply) = reply_to(&buffer[..read], &udp_zones, false) {
                let _ = udp.send_to(&reply, from);
            }
        }
    });
    std::thread::spawn(move || {
        for mut stream in tcp.incoming().map_while(Result::ok) {
            let mut length = [0u8; 2];
            if stream.read_exact(&mut length).is_err() {
                continue;
            }
            let mut query = vec![0; usize::from(u16::from_be_bytes(length))];
            if stream.read_exact(&mut query).is_err() {
                continue;
            }
            if let Some(reply) = reply_to(&query, &zones, true) {
                let _ = stream.write_all(&(reply.len() as u16).to_be_bytes());
                let _ = stream.write_all(&reply);
            }
        }
    });
    Server { port, asked }
}

fn sources(dir: &tempfile::TempDir, hosts: &str, resolv_conf: &str, port: u16) -> Sources {
    std::fs::write(dir.path().join("hosts"), hosts).unwrap();
    std::fs::write(dir.path().join("resolv.conf"), resolv_conf).unwrap();
    Sources {
        hosts: dir.path().join("hosts"),
        resolv_conf: dir.path().join("resolv.conf"),
        dns_port: port,
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

#[tokio::test]
async fn address_literals_are_themselves_and_nothing_is_read() {
    let nowhere = Sources {
        hosts: "/nonexistent/hosts".into(),
        resolv_conf: "/nonexistent/resolv.conf".into(),
        dns_port: 1,
    };
    for (host, want) in [
        ("10.1.2.3", "10.1.2.3"),
        ("fd00::7", "fd00::7"),
        ("[::1]", "::1"),
    ] {
        let got = lookup_with(&nowhere, host, 443).await.unwrap();
        assert_eq!(got, [SocketAddr::new(ip(want), 443)], "{host}");
    }
}

#[tokio::test]
async fn the_hosts_file_answers_before_dns_and_localhost_needs_no_file() {
    let server = serve(&[("api.example", Zone::Addresses(vec![ip("192.0.2.99")]))]);
    let dir = tempfile::tempdir().unwrap();
    let s = sources(
        &dir,
        "192.0.2.1 api.example\n",
        "nameserver 127.0.0.1\n",
        server.port,
    );
    let got = lookup_with(&s, "api.example", 6443).await.unwrap();
    assert_eq!(got, [SocketAddr::new(ip("192.0.2.1"), 6443)]);
    assert!(server.asked.lock().unwrap().is_empty(), "DNS was asked");

    let s = sources(&dir, "", "nameserver 127.0.0.1\n", server.port);
    let got = lookup_with(&s, "localhost", 80).await.unwrap();
    let want = [
        SocketAddr::new(ip("127.0.0.1"), 80),
        SocketAddr::new(ip("::1"), 80),
    ];
    assert_eq!(got, want);
    assert!(
        server.asked.lock().unwrap().is_empty(),
        "DNS was asked for localhost"
    );
}

#[tokio::test]
async fn dns_walks_the_search_list_and_gives_both_families_ipv4_first() {
    let server = serve(&[(
        "kubernetes.default.svc.cluster.local",
        Zone::Addresses(vec![ip("fd00::1"), ip("10.96.0.1")]),
    )]);
    let dir = tempfile::tempdir().unwrap();
    let conf =
        "nameserver 127.0.0.1\nsearch ns.svc.cluster.local svc.cluster.local\noptions ndots:5\n";
    let s = sources(&dir, "", conf, server.port);
    let got = lookup_with(&s, "kubernetes.default", 443).await.unwrap();
    assert_eq!(
        got,
        [
            SocketAddr::new(ip("10.96.0.1"), 443),
            SocketAddr::new(ip("fd00::1"), 443)
        ]
    );
    let asked = server.asked.lock().unwrap().clone();
    assert!(
        asked
            .iter()
            .any(|q| q.starts_with("kubernetes.default.ns.svc.cluster.local "))
            && !asked.iter().any(|q| q.starts_with("kubernetes.default ")),
        "{asked:?}"
    );
}

#[tokio::test]
async fn a_truncated_answer_is_asked_again_over_tcp() {
    let server = serve(&[("big.example", Zone::Truncated(vec![ip("198.51.100.7")]))]);
    let dir = tempfile::tempdir().unwrap();
    let s = sources(&dir, "", "nameserver 127.0.0.1\n", server.port);
    let got = lookup_with(&s, "big.example", 1).await.unwrap();
    assert_eq!(got, [SocketAddr::new(ip("198.51.100.7"), 1)]);
}

#[tokio::test]
async fn an_unknown_name_is_no_such_host_and_a_silent_server_is_no_answer() {
    let server = serve(&[]);
    let dir = tempfile::tempdir().unwrap();
    let s = sources(
        &dir,
        "",
        "nameserver 127.0.0.1\nsearch example\n",
        server.port,
    );
    let error = lookup_with(&s, "nothing.invalid", 1).await.unwrap_err();
    assert!(
        matches!(error, LookupError::NoSuchHost(ref h) if h == "nothing.invalid"),
        "{error}"
    );

    // A bound socket that never answers.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let conf = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n";
    let s = sources(&dir, "", conf, port);
    let started = std::time::Instant::now();
    let error = lookup_with(&s, "api.example", 1).await.unwrap_err();
    assert!(matches!(error, LookupError::NoAnswer { .. }), "{error}");
    assert!(error.to_string().contains("127.0.0.1"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn what_is_not_a_host_name_is_refused_before_any_lookup() {
    for host in ["", "a b", "api..example", "x/y"] {
        let got = lookup_with(&Sources::default(), host, 1).await;
        assert!(
            matches!(got, Err(LookupError::NotAName(_))),
            "{host:?}: {got:?}"
        );
    }
}
