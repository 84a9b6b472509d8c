//! Dialling gRPC servers on Unix sockets: one attempt ([`connect`]) or patient retries with
//! back-off ([`dial`]).

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{SocketError, io_err};

/// Dials a gRPC server on a Unix socket, retrying with back-off until it answers or `give_up`
/// (if any) has passed. Each attempt is bounded by `attempt_timeout`; "still waiting" is logged
/// at most every 10 seconds.
pub async fn dial(
    path: &Path,
    attempt_timeout: Duration,
    give_up: Option<Duration>,
) -> Result<tonic::transport::Channel, SocketError> {
    let started = Instant::now();
    let mut delay = Duration::from_millis(50);
    let mut last_notice = started;
    loop {
        let error = match tokio::time::timeout(attempt_timeout, connect(path)).await {
            Ok(Ok(channel)) => return Ok(channel),
            Ok(Err(e)) => e,
            Err(_) => io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {attempt_timeout:?}"),
            ),
        };
        if give_up.is_some_and(|limit| started.elapsed() >= limit) {
            return Err(io_err("connect to", path)(error));
        }
        if last_notice.elapsed() >= Duration::from_secs(10) {
            log::info!("still waiting for {} ({error})", path.display());
            last_notice = Instant::now();
        } else {
            log::debug!(
                "connect to {}: {error}; retrying in {delay:?}",
                path.display()
            );
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// One connection attempt. The URI is required by tonic but unused: the connector ignores it.
pub async fn connect(path: &Path) -> io::Result<tonic::transport::Channel> {
    let path = path.to_owned();
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let path = path.clone();
        async move {
            Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(
                tokio::net::UnixStream::connect(path).await?,
            ))
        }
    });
    tonic::transport::Endpoint::from_static("http://[::1]:50051")
        .connect_with_connector(connector)
        .await
        .map_err(|e| io::Error::other(error_chain(&e)))
}

/// The full cause chain of an error on one line; transport errors hide the useful part
/// ("No such file or directory") in their sources.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
