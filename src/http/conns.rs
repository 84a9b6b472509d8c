//! The connections of one HTTP server, kept so that idle or slow clients can never delay a
//! probe: a fixed number are tracked; at the cap the one idle the longest (no request in
//! progress) is shed to admit the newcomer; a connection must deliver its request head within
//! a short deadline from the moment it could start (accept, or the previous reply, so this is
//! the keep-alive idle timeout too); heads are size-limited. Memory is bounded by the cap, whatever arrives.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::Reply;
use crate::shutdown::{Shutdown, Trigger};

/// The bounds of one server; [`Limits::default`] is what the binary uses.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections tracked at once. Probes from a kubelet and a scraper need a handful.
    pub max_connections: usize,
    /// From accept, or from the previous reply on a kept-alive connection, to a complete
    /// request head (hyper's header timer runs in both cases): the first-byte deadline, the
    /// slow-head deadline and the keep-alive idle timeout in one. A kubelet sends its probe at
    /// once; anything slower is a client we must not wait for.
    pub header_timeout: Duration,
    /// The largest request head read (hyper's minimum is 8 KiB).
    pub max_header_bytes: usize,
    /// How long in-flight requests may take to be answered once shutdown begins.
    pub grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 64,
            header_timeout: Duration::from_secs(3),
            max_header_bytes: 16 * 1024,
            grace: crate::shutdown::GRACE_PERIOD,
        }
    }
}

/// Whether a connection has a request in progress, and since when it has had none.
#[derive(Debug)]
struct Activity {
    busy: AtomicUsize,
    idle_since: Mutex<Instant>,
    /// Wakes the accept loop when a request ends (room may have appeared).
    room: Arc<Notify>,
}

impl Activity {
    fn idle_since(&self) -> Option<Instant> {
        let since = *crate::mutex::lock(&self.idle_since);
        (self.busy.load(Ordering::SeqCst) == 0).then_some(since)
    }
}

/// Held by a request from the moment its head is parsed until its reply body is gone.
struct Busy(Arc<Activity>);

impl Busy {
    fn new(activity: &Arc<Activity>) -> Self {
        activity.busy.fetch_add(1, Ordering::SeqCst);
        Self(activity.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *crate::mutex::lock(&self.0.idle_since) = Instant::now();
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
        self.0.room.notify_one();
    }
}

/// A reply body that keeps its connection busy until hyper has taken all of it, so that a
/// connection is never shed while its answer is being written.
struct BusyBody {
    inner: Full<Bytes>,
    _busy: Busy,
}

impl Body for BusyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// How far the accept loop has got: counted so that tests wait for these events instead of
/// sleeping (two relaxed increments per connection; nothing reads them in the binary).
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// Connections handed to their own task.
    pub(super) admitted: AtomicUsize,
    /// Times the loop found every tracked connection busy and waited for one to finish.
    pub(super) waited_for_room: AtomicUsize,
}

/// Connections open now, and served since freed heap memory was last given back.
#[derive(Debug)]
struct Open {
    now: AtomicUsize,
    since_trim: AtomicUsize,
    /// Connections served between two trims at most (the tracked maximum).
    trim_after: usize,
}

/// Held by a connection's task from admission to its end (or abort, when it is shed).
struct OpenGuard(Arc<Open>);

impl OpenGuard {
    fn new(open: &Arc<Open>) -> Self {
        open.now.fetch_add(1, Ordering::SeqCst);
        open.since_trim.fetch_add(1, Ordering::SeqCst);
        Self(open.clone())
    }
}

impl Drop for OpenGuard {
    /// The last connection of a burst gives its memory back: glibc's malloc keeps the pages a
    /// flood's connections freed (hyper's buffers among live allocations) unless asked, and the
    /// registrar's RSS stayed at 12–13 MB after floods of 300–900 connections. Asked at most
    /// once per `max_connections` connections, so a kubelet's probe every 10 s costs one trim
    /// (well under a millisecond) every few minutes.
    fn drop(&mut self) {
        let open = &self.0;
        let bursty = open.since_trim.load(Ordering::SeqCst) >= open.trim_after;
        if open.now.fetch_sub(1, Ordering::SeqCst) == 1 && bursty {
            open.since_trim.store(0, Ordering::SeqCst);
            crate::malloc_trim::give_back_freed_memory();
        }
    }
}

struct Live {
    activity: Arc<Activity>,
    task: tokio::task::JoinHandle<()>,
}

/// Every connection of one server.
pub(super) struct Connections {
    limits: Limits,
    live: Vec<Live>,
    room: Arc<Notify>,
    stop: Trigger,
    stopping: Shutdown,
    progress: Arc<Progress>,
    open: Arc<Open>,
}

impl Connections {
    pub(super) fn new(limits: Limits) -> Self {
        let (stop, stopping) = Shutdown::manual();
        Self {
            limits,
            live: Vec::with_capacity(limits.max_connections),
            room: Arc::new(Notify::new()),
            stop,
            stopping,
            progress: Arc::default(),
            open: Arc::new(Open {
                now: AtomicUsize::new(0),
                since_trim: AtomicUsize::new(0),
                trim_after: limits.max_connections,
            }),
        }
    }

    /// The counters of this server's accept loop.
    #[cfg(test)]
    pub(super) fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// Makes room for one more connection: at the cap, sheds the connection idle the longest;
    /// when every one has a request in progress (each bounded by its handler), waits for one
    /// to finish. Returns false if `shutdown` came first.
    pub(super) async fn make_room(&mut self, shutdown: &Shutdown) -> bool {
        loop {
            self.live.retain(|c| !c.task.is_finished());
            if self.live.len() < self.limits.max_connections || self.shed_longest_idle() {
                return true;
            }
            self.progress
                .waited_for_room
                .fetch_add(1, Ordering::Relaxed);
            tokio::select! {
                () = self.room.notified() => {}
                () = shutdown.clone().wait() => return false,
            }
        }
    }

    fn shed_longest_idle(&mut self) -> bool {
        let longest = self
            .live
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.activity.idle_since().map(|since| (since, i)))
            .min();
        let Some((_, i)) = longest else {
            return false;
        };
        log::trace!("HTTP: shedding the connection idle the longest");
        self.live.swap_remove(i).task.abort();
        true
    }

    /// Serves one accepted connection with `handler`.
    pub(super) fn admit<H, F>(&mut self, stream: TcpStream, handler: H)
    where
        H: Fn(String) -> F + Send + Sync + 'static,
        F: Future<Output = Reply> + Send + 'static,
    {
        let activity = Arc::new(Activity {
            busy: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            room: self.room.clone(),
        });
        let open = OpenGuard::new(&self.open);
        let served = connection(
            stream,
            handler,
            activity.clone(),
            self.limits,
            self.stopping.clone(),
        );
        let task = tokio::spawn(async move {
            let _open = open;
            served.await
        });
        self.live.push(Live { activity, task });
        self.progress.admitted.fetch_add(1, Ordering::Relaxed);
    }

    /// Lets every connection finish the request it is in (idle ones close at once), within
    /// the grace period.
    pub(super) async fn shut_down(self) {
        self.stop.fire();
        let deadline = tokio::time::Instant::now() + self.limits.grace;
        for live in self.live {
            let abort = live.task.abort_handle();
            if tokio::time::timeout_at(deadline, live.task).await.is_err() {
                abort.abort();
            }
        }
    }
}

async fn connection<H, F>(
    stream: TcpStream,
    handler: H,
    activity: Arc<Activity>,
    limits: Limits,
    stopping: Shutdown,
) where
    H: Fn(String) -> F + Send + Sync + 'static,
    F: Future<Output = Reply> + Send + 'static,
{
    let service =
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let busy = Busy::new(&activity);
            let reply = handler(request.uri().path().to_owned());
            async move {
                let response = reply.await.into_response();
                Ok::<_, Infallible>(response.map(|inner| BusyBody { inner, _busy: busy }))
            }
        });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = stopping.wait() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = result {
        log::trace!("HTTP connection: {e}");
    }
}

#[cfg(test)]
mod tests;
