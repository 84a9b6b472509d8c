//! The health ports under a slowloris flood, for the real registrar and `probe serve`: with 500
//! idle TCP connections held open, `/healthz` still answers 200 at once, again and again; the
//! idle connections are shed; once they are gone, memory is within 1.5 times what it was
//! before, and flat across floods; the process may open as many files as its hard limit allows.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::fake_driver::FakeDriver;

const IDLE: usize = 500;
const PROBES: usize = 20;
/// The server tracks at most this many connections (`http::Limits::default`).
const TRACKED: usize = 64;

/// One kubelet-style probe: a new connection, `Connection: close`, the status code.
fn probe(address: &str) -> u16 {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let request = "GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.33\r\n\
                   Connection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).expect("send probe");
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    let status = String::from_utf8_lossy(&reply);
    status
        .get(9..12)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer within 2 s: {status:?}"))
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The connections to `address` (`127.0.0.1:PORT`) the server still holds open: those on
/// its port, ESTABLISHED or CLOSE_WAIT, in the kernel's table.
fn held_by_server(address: &str) -> usize {
    let port = address.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    let local = format!("0100007F:{port:04X}");
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(1) == Some(&local.as_str()) && matches!(fields.get(3), Some(&"01" | &"08"))
        })
        .count()
}

/// The binary with `args`, started with a soft open-files limit of 1024 (the traditional
/// default) under a higher hard one, as on many nodes.
fn with_low_soft_limit(args: &[String]) -> Command {
    let mut command = Command::new("sh");
    command
        .args(["-c", "ulimit -Sn 1024 && exec \"$0\" \"$@\""])
        .arg(common::binary())
        .args(args);
    command
}

/// Whether the server has closed `stream` (it is readable at end of file).
fn closed(stream: &mut TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    !matches!(stream.read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// Floods `address` twice and checks the probes, the shedding and the memory of `pid`.
fn survives_a_flood(name: &str, address: &str, pid: u32) {
    assert!(
        common::wait_until_blocking(Duration::from_secs(10), || {
            TcpStream::connect(address).is_ok() && probe(address) == 200
        }),
        "{name}: /healthz never answered 200"
    );
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let files: Vec<&str> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        files[3], files[4],
        "{name}: soft open-files limit raised to the hard one"
    );
    let before = rss_kib(pid);
    let mut after = Vec::new();
    for round in 0..2 {
        let mut idle: Vec<TcpStream> = (0..IDLE)
            .map(|_| TcpStream::connect(address).expect("open an idle connection"))
            .collect();
        let mut latencies: Vec<Duration> = (0..PROBES)
            .map(|_| {
                let started = Instant::now();
                assert_eq!(probe(address), 200, "{name}: /healthz under the flood");
                started.elapsed()
            })
            .collect();
        let shed = idle.iter_mut().map(closed).filter(|c| *c).count();
        latencies.sort();
        let (p50, max) = (latencies[PROBES / 2], latencies[PROBES - 1]);
        println!(
            "{name} round {round}: /healthz with {IDLE} idle connections held: p50 {p50:?}, \
             max {max:?}; {shed} idle ones shed; RSS {} KiB",
            rss_kib(pid)
        );
        assert!(
            shed >= IDLE - TRACKED,
            "{name}: only {shed} of {IDLE} idle connections were shed"
        );
        // The acceptance bound is 100 ms; the median is asserted (a loaded 2-core CI machine
        // may stall one probe), and every probe answered within 2 s above.
        assert!(p50 < Duration::from_millis(100), "{name}: median {p50:?}");
        drop(idle);
        // The server gives the memory back when the last of them has ended, which it sees a
        // moment after they are dropped here: every reading is taken once it holds none of
        // them, so none counts buffers not yet given back as growth.
        assert!(
            common::wait_until_blocking(Duration::from_secs(10), || held_by_server(address) == 0),
            "{name}: still {} connections held 10 s after the flood",
            held_by_server(address)
        );
        // The trim runs on the server's task just after it closes the last of them.
        std::thread::sleep(Duration::from_millis(100));
        after.push(rss_kib(pid));
    }
    println!("{name}: RSS {before} KiB before, {after:?} KiB after each flood");
    // The buffers of shed connections go back to the kernel once the flood is over
    // (`http/conns.rs`): what stays is at most the code the flood ran for the first time.
    assert!(
        after[0] * 2 <= before * 3,
        "{name}: a flood grew RSS from {before} to {} KiB, over 1.5 times",
        after[0]
    );
    assert!(
        after[1] < after[0] + 512,
        "{name}: a second flood grew RSS from {} to {} KiB: not flat",
        after[0],
        after[1]
    );
}

/// Starts the binary with the arguments `args` makes from a fake driver's socket and a free
/// HTTP address, then floods it.
async fn flood(name: &'static str, args: impl FnOnce(&Path, &str) -> Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let driver = FakeDriver::start(&dir.path().join("csi.sock"), "flood.csi.example.io");
    let address = common::free_local_address();
    let args = args(&driver.socket, &address);
    let child = common::spawn(&mut with_low_soft_limit(&args), name);
    let pid = child.0.id();
    tokio::task::spawn_blocking(move || survives_a_flood(name, &address, pid))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_serve_answers_healthz_at_once_while_500_idle_connections_are_held() {
    flood("probe serve", |csi, address| {
        vec![
            "probe".to_owned(),
            "serve".to_owned(),
            format!("--csi-address={}", csi.display()),
            format!("--http-endpoint={address}"),
        ]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registrar_answers_healthz_at_once_while_500_idle_connections_are_held() {
    flood("registrar", |csi, address| {
        let registry = csi.with_file_name("registry");
        vec![
            "registrar".to_owned(),
            format!("--csi-address={}", csi.display()),
            "--kubelet-registration-path=/var/lib/kubelet/plugins/flood/csi.sock".to_owned(),
            format!("--plugin-registration-path={}", registry.display()),
            format!("--http-endpoint={address}"),
        ]
    })
    .await;
}
