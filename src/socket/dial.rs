//! Dialling gRPC servers on Unix sockets: one attempt ([`connect`]) or patient retries with
//! back-off ([`dial`]).

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::backoff::Doubling;

/// Why a gRPC server on a Unix socket could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// Nothing accepted the connection (no socket, no listener, no permission). The `errno` is
    /// kept: Go-compatible texts are built from it.
    #[error("connect to {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The socket accepted, but no gRPC conversation came of it (the HTTP/2 handshake failed).
    #[error("connect to {}: {}", path.display(), crate::deepest_cause(source))]
    Transport {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("connect to {}: no answer within {limit:?}", path.display())]
    TimedOut { path: PathBuf, limit: Duration },
}

/// Dials a gRPC server on a Unix socket, retrying with back-off until it answers or `give_up`
/// (if any) has passed. Each attempt is bounded by `attempt_timeout`; "still waiting" is logged
/// at most every 10 seconds.
pub async fn dial(
    path: &Path,
    attempt_timeout: Duration,
    give_up: Option<Duration>,
) -> Result<tonic::transport::Channel, DialError> {
    let started = Instant::now();
    let mut backoff = Doubling::new(Duration::from_millis(50), Duration::from_secs(2));
    let mut last_notice = started;
    loop {
        let error = match tokio::time::timeout(attempt_timeout, connect(path)).await {
            Ok(Ok(channel)) => return Ok(channel),
            Ok(Err(e)) => e,
            Err(_) => DialError::TimedOut {
                path: path.to_owned(),
                limit: attempt_timeout,
            },
        };
        if give_up.is_some_and(|limit| started.elapsed() >= limit) {
            return Err(error);
        }
        let delay = backoff.next_delay();
        if last_notice.elapsed() >= Duration::from_secs(10) {
            log::info!("still waiting: {error}");
            last_notice = Instant::now();
        } else {
            log::debug!("{error}; retrying in {delay:?}");
        }
        tokio::time::sleep(delay).await;
    }
}

/// One connection attempt. The URI is required by tonic but unused: the connector ignores it.
pub async fn connect(path: &Path) -> Result<tonic::transport::Channel, DialError> {
    let target = path.to_owned();
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let target = target.clone();
        async move {
            Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(
                tokio::net::UnixStream::connect(target).await?,
            ))
        }
    });
    tonic::transport::Endpoint::from_static("http://[::1]:50051")
        .connect_with_connector(connector)
        .await
        .map_err(|source| classify(path, source))
}

/// The connector's own `io::Error` travels inside tonic's error; found, it becomes the typed
/// cause (with its errno), so callers need not read error texts.
fn classify(path: &Path, source: tonic::transport::Error) -> DialError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&source);
    while let Some(error) = cause {
        if let Some(io) = error.downcast_ref::<io::Error>() {
            let source = match io.raw_os_error() {
                Some(errno) => io::Error::from_raw_os_error(errno),
                None => io::Error::new(io.kind(), io.to_string()),
            };
            return DialError::Connect {
                path: path.to_owned(),
                source,
            };
        }
        cause = error.source();
    }
    DialError::Transport {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_socket_is_a_connect_error_with_its_errno() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("none.sock");
        let error = connect(&path).await.unwrap_err();
        let DialError::Connect { source, .. } = &error else {
            panic!("not a connect error: {error:?}");
        };
        assert_eq!(source.raw_os_error(), Some(nix::libc::ENOENT));
        let text = error.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(std::error::Error::source(&error).is_some());
    }
}
