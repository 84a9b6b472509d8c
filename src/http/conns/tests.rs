use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::super::{Reply, accept_loop, bind, get};
use super::*;

const WAIT: Duration = Duration::from_secs(2);

/// What `/slow` waits for (`release`), and how it tells a test it has begun (`entered`, one
/// permit per request): the tests' gates.
struct Gate {
    release: Notify,
    entered: tokio::sync::Semaphore,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            release: Notify::new(),
            entered: tokio::sync::Semaphore::new(0),
        }
    }
}

impl Gate {
    async fn until_entered(&self, requests: u32) {
        let entered = self.entered.acquire_many(requests);
        let permits = tokio::time::timeout(WAIT * 5, entered).await;
        permits.expect("the requests began").unwrap().forget();
    }
}

/// A test server: its address, its shutdown, its task and its accept loop's counters.
struct Server {
    address: String,
    trigger: Trigger,
    task: tokio::task::JoinHandle<()>,
    progress: Arc<Progress>,
}

impl Server {
    /// Waits until the accept loop's counter `count` reaches `at_least`: the gate for what
    /// the loop has done with the connections a test made.
    async fn until(&self, count: fn(&Progress) -> &AtomicUsize, at_least: usize) {
        let reached = async {
            while count(&self.progress).load(Ordering::Relaxed) < at_least {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(WAIT * 5, reached)
            .await
            .expect("the accept loop got there");
    }
}

/// Answers one request on an open `stream`: whether the server still serves it.
async fn answers(stream: &mut TcpStream) -> bool {
    if stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .is_err()
    {
        return false;
    }
    let mut reply = Vec::new();
    let read = async {
        while !reply.ends_with(b"\r\n\r\nok") {
            let mut chunk = [0u8; 256];
            match stream.read(&mut chunk).await {
                Ok(n) if n > 0 => reply.extend_from_slice(&chunk[..n]),
                _ => return,
            }
        }
    };
    let _ = tokio::time::timeout(WAIT, read).await;
    reply.starts_with(b"HTTP/1.1 200") && reply.ends_with(b"ok")
}

/// A server with `limits` whose `/slow` waits for `gate`.
async fn server(limits: Limits, gate: Arc<Gate>) -> Server {
    let listener = bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (trigger, shutdown) = Shutdown::manual();
    let handler = move |path: String| {
        let gate = gate.clone();
        async move {
            if path == "/slow" {
                // Waiting before saying so: a release right after can not be missed.
                let released = gate.release.notified();
                tokio::pin!(released);
                released.as_mut().enable();
                gate.entered.add_permits(1);
                released.await;
            }
            Reply::text(200, "ok")
        }
    };
    let connections = Connections::new(limits);
    let progress = connections.progress();
    let task = tokio::spawn(accept_loop(listener, handler, shutdown, connections));
    Server {
        address,
        trigger,
        task,
        progress,
    }
}

fn limits(max_connections: usize, timeout: Duration) -> Limits {
    Limits {
        max_connections,
        header_timeout: timeout,
        ..Limits::default()
    }
}

/// Whether the server closed `stream` within `limit`.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(limit, stream.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn at_the_cap_the_connection_idle_the_longest_is_shed_for_a_newcomer() {
    let server = server(limits(4, Duration::from_secs(30)), Arc::default()).await;
    let mut idle = Vec::new();
    for admitted in 1..=4 {
        idle.push(TcpStream::connect(&server.address).await.unwrap());
        // Admitted one by one, so their idle ages are in this order.
        server.until(|p| &p.admitted, admitted).await;
    }
    assert_eq!(get(&server.address, "/healthz", WAIT).await.unwrap().0, 200);
    assert!(
        closed_within(&mut idle[0], WAIT).await,
        "the oldest idle one was shed"
    );
    for (i, stream) in idle.iter_mut().enumerate().skip(1) {
        assert!(answers(stream).await, "idle connection {i} was kept");
    }
    server.trigger.fire();
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_header_timeout_even_when_kept_alive() {
    let timeout = Duration::from_millis(200);
    let Server {
        address, trigger, ..
    } = server(limits(4, timeout), Arc::default()).await;
    let mut silent = TcpStream::connect(&address).await.unwrap();
    let started = Instant::now();
    assert!(closed_within(&mut silent, WAIT).await);
    assert!(started.elapsed() >= timeout - Duration::from_millis(50));
    // A head sent byte by byte gets no more time than one sent at once.
    let mut slow = TcpStream::connect(&address).await.unwrap();
    let started = Instant::now();
    for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\n" {
        if slow.write_all(&[*byte]).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(closed_within(&mut slow, WAIT).await);
    assert!(started.elapsed() < timeout + Duration::from_millis(900));
    // A kept-alive connection gets the same time for its next request.
    let mut kept = TcpStream::connect(&address).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut reply = Vec::new();
    while !reply.ends_with(b"\r\n\r\nok") {
        let mut chunk = [0u8; 256];
        let n = kept.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before the reply");
        reply.extend_from_slice(&chunk[..n]);
    }
    assert!(reply.starts_with(b"HTTP/1.1 200"));
    let started = Instant::now();
    assert!(
        closed_within(&mut kept, WAIT).await,
        "an idle kept-alive connection is closed"
    );
    assert!(started.elapsed() >= timeout - Duration::from_millis(50));
    trigger.fire();
}

#[tokio::test]
async fn a_connection_with_a_request_in_progress_is_never_shed() {
    let gate = Arc::new(Gate::default());
    let server = server(limits(2, Duration::from_secs(30)), gate.clone()).await;
    let address = server.address.clone();
    let slow: Vec<_> = (0..2)
        .map(|_| {
            let address = address.clone();
            tokio::spawn(async move { get(&address, "/slow", WAIT * 5).await })
        })
        .collect();
    gate.until_entered(2).await;
    let waiting = {
        let address = address.clone();
        tokio::spawn(async move { get(&address, "/healthz", WAIT * 5).await })
    };
    // The gate: the loop took the newcomer from the backlog and, finding both connections
    // busy, waits for room instead of shedding one (shedding would fail a slow call below).
    server.until(|p| &p.waited_for_room, 1).await;
    assert!(
        !waiting.is_finished(),
        "admitted by shedding a busy connection"
    );
    assert_eq!(server.progress.admitted.load(Ordering::Relaxed), 2);
    gate.release.notify_waiters();
    for call in slow {
        assert_eq!(
            call.await.unwrap().unwrap().0,
            200,
            "the slow requests were answered"
        );
    }
    assert_eq!(waiting.await.unwrap().unwrap().0, 200);
    server.trigger.fire();
}

#[tokio::test]
async fn requests_in_progress_are_answered_when_shutdown_begins() {
    let gate = Arc::new(Gate::default());
    let Server {
        address,
        trigger,
        task,
        ..
    } = server(Limits::default(), gate.clone()).await;
    let address_again = address.clone();
    let call = tokio::spawn(async move { get(&address, "/slow", WAIT).await });
    gate.until_entered(1).await;
    trigger.fire();
    // The gate: shutdown has begun once the listener is gone; only then may the call finish.
    let closed = async {
        while TcpStream::connect(&address_again).await.is_ok() {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(WAIT, closed)
        .await
        .expect("the listener closed");
    gate.release.notify_waiters();
    assert_eq!(call.await.unwrap().unwrap(), (200, "ok".to_owned()));
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_request_head_over_the_limit_is_refused_with_431() {
    let Server {
        address, trigger, ..
    } = server(Limits::default(), Arc::default()).await;
    let mut stream = TcpStream::connect(&address).await.unwrap();
    let big = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let _ = stream.write_all(big.as_bytes()).await;
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(WAIT, stream.read_to_end(&mut reply)).await;
    assert!(
        reply.starts_with(b"HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    trigger.fire();
}
