//! The small HTTP/1.1 server behind `/healthz`, `/readyz` and `/metrics` (registrar and probe),
//! and the one-request client `probe registration` uses to ask the registrar.
//!
//! Idle or slow clients cannot delay a probe and memory stays bounded whatever arrives (see
//! [`conns`]); each reply is built by the caller's handler from shared state. On shutdown,
//! requests in progress are answered before [`serve`] returns.

use std::future::Future;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::shutdown::Shutdown;

mod conns;
pub use conns::Limits;

/// Why a listener could not be bound or a GET got no answer; each names the address.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("invalid HTTP endpoint {0:?}")]
    InvalidEndpoint(String),
    #[error("listen on {endpoint}: {source}")]
    Bind {
        endpoint: String,
        #[source]
        source: std::io::Error,
    },
    #[error("connect to {address}: {source}")]
    Connect {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("build request for {path}: {source}")]
    Request {
        path: String,
        #[source]
        source: hyper::http::Error,
    },
    #[error("{step} with {address}: {source}")]
    Exchange {
        step: &'static str,
        address: String,
        #[source]
        source: hyper::Error,
    },
    #[error("no answer from {address} within {timeout:?}")]
    TimedOut { address: String, timeout: Duration },
    #[error("{address}: {source}")]
    Lookup {
        address: String,
        #[source]
        source: crate::names::LookupError,
    },
}

/// One HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }

    pub fn not_found() -> Self {
        Self::text(404, "404 page not found\n")
    }

    pub(crate) fn into_response(self) -> hyper::Response<Full<Bytes>> {
        let mut response = hyper::Response::new(Full::new(Bytes::from(self.body)));
        *response.status_mut() = hyper::StatusCode::from_u16(self.status)
            .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
        if let Ok(value) = hyper::header::HeaderValue::from_str(self.content_type) {
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_TYPE, value);
        }
        response
    }
}

/// Checks a Go-style listen address (`:9808`, `0.0.0.0:9808`, `[::1]:9808`,
/// `localhost:9808`) before anything starts: a host (or none) and a port from 1 to 65535.
/// Port 0 would listen on a port chosen at random, which no probe could find.
pub fn check_endpoint(endpoint: &str) -> Result<(), &'static str> {
    let Some((host, port)) = endpoint.rsplit_once(':') else {
        return Err("expected host:port or :port");
    };
    match port.parse::<u16>() {
        Ok(0) => return Err("port 0 would pick a random port no probe can find"),
        Ok(_) if port.bytes().all(|b| b.is_ascii_digit()) => {}
        _ => return Err("the port must be a number from 1 to 65535"),
    }
    let bracketed = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    // A host of digits and dots is meant as an IPv4 address: no name can be all digits (its
    // last label may not be), so `999.1.1.1` is a typo, not a name to look up at bind time.
    let looks_v4 = !host.is_empty() && host.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    if looks_v4 && host.parse::<std::net::Ipv4Addr>().is_err() {
        return Err("the host looks like an IPv4 address but is not one");
    }
    let valid_host = match bracketed {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-'),
    };
    match valid_host {
        true => Ok(()),
        false => Err("the host must be a name, an IPv4 address or an [IPv6] address"),
    }
}

/// Turns a Go-style listen address into addresses to bind: `:9808` means every interface
/// (IPv6 and IPv4 where the node has IPv6, IPv4 otherwise), a name its addresses (IPv4 first,
/// as Go listens on a name's first IPv4 address), an address itself.
async fn bind_candidates(endpoint: &str) -> Result<Vec<SocketAddr>, HttpError> {
    let invalid = || HttpError::InvalidEndpoint(endpoint.to_owned());
    let (host, port) = endpoint.rsplit_once(':').ok_or_else(invalid)?;
    let port: u16 = port.parse().map_err(|_| invalid())?;
    if host.is_empty() {
        return Ok(vec![
            SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port),
            SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port),
        ]);
    }
    crate::names::lookup(host, port)
        .await
        .map_err(|source| HttpError::Lookup {
            address: endpoint.to_owned(),
            source,
        })
}

/// Binds the HTTP listener for `endpoint` (`:9808`, `0.0.0.0:9808`, `[::1]:9808`, `localhost:9808`).
pub async fn bind(endpoint: &str) -> Result<TcpListener, HttpError> {
    let mut last_error = HttpError::InvalidEndpoint(endpoint.to_owned());
    for candidate in bind_candidates(endpoint).await? {
        match TcpListener::bind(candidate).await {
            Ok(listener) => return Ok(listener),
            Err(source) => {
                last_error = HttpError::Bind {
                    endpoint: endpoint.to_owned(),
                    source,
                }
            }
        }
    }
    Err(last_error)
}

/// Serves until `shutdown`, answering every request with `handler(path)`; then answers the
/// requests in progress (within the grace period) and returns.
pub async fn serve<H, F>(listener: TcpListener, handler: H, shutdown: Shutdown)
where
    H: Fn(String) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Reply> + Send + 'static,
{
    serve_with(listener, handler, shutdown, Limits::default()).await
}

/// [`serve`] with other limits (tests use short ones).
pub async fn serve_with<H, F>(listener: TcpListener, handler: H, shutdown: Shutdown, limits: Limits)
where
    H: Fn(String) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Reply> + Send + 'static,
{
    accept_loop(listener, handler, shutdown, conns::Connections::new(limits)).await
}

/// The body of [`serve_with`], given its connections (tests keep a handle on their counters).
async fn accept_loop<H, F>(
    listener: TcpListener,
    handler: H,
    shutdown: Shutdown,
    mut connections: conns::Connections,
) where
    H: Fn(String) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Reply> + Send + 'static,
{
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.clone().wait() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors (EMFILE) is the likely cause; the backlog waits meanwhile.
                log::warn!("HTTP accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if !connections.make_room(&shutdown).await {
            break;
        }
        connections.admit(stream, handler.clone());
    }
    drop(listener);
    connections.shut_down().await;
}

/// Where to connect for a listen address: `:port` and the wildcard addresses mean this host.
fn dial_target(address: &str) -> String {
    if let Some(port) = address
        .strip_prefix(':')
        .or_else(|| address.strip_prefix("0.0.0.0:"))
    {
        return format!("127.0.0.1:{port}");
    }
    match address.strip_prefix("[::]:") {
        Some(port) => format!("[::1]:{port}"),
        None => address.to_owned(),
    }
}

/// One GET of `path` on `address` (`host:port`), within `timeout`; returns status and body.
pub async fn get(address: &str, path: &str, timeout: Duration) -> Result<(u16, String), HttpError> {
    let address = dial_target(address);
    let exchange = |step| {
        let address = address.clone();
        move |source| HttpError::Exchange {
            step,
            address,
            source,
        }
    };
    let conversation = async {
        let (host, port) = address
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
            .ok_or_else(|| HttpError::InvalidEndpoint(address.clone()))?;
        let addresses =
            crate::names::lookup(host, port)
                .await
                .map_err(|source| HttpError::Lookup {
                    address: address.clone(),
                    source,
                })?;
        let stream = tokio::net::TcpStream::connect(&addresses[..])
            .await
            .map_err(|source| HttpError::Connect {
                address: address.clone(),
                source,
            })?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(exchange("HTTP handshake"))?;
        tokio::spawn(connection);
        let request = hyper::Request::get(path)
            .header(hyper::header::HOST, address.as_str())
            .body(http_body_util::Empty::<Bytes>::new())
            .map_err(|source| HttpError::Request {
                path: path.to_owned(),
                source,
            })?;
        let response = sender
            .send_request(request)
            .await
            .map_err(exchange("GET"))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(exchange("read reply"))?;
        Ok((
            status,
            String::from_utf8_lossy(&body.to_bytes()).into_owned(),
        ))
    };
    tokio::time::timeout(timeout, conversation)
        .await
        .unwrap_or_else(|_| Err(HttpError::TimedOut { address, timeout }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_are_dialled_on_this_host() {
        assert_eq!(dial_target(":9809"), "127.0.0.1:9809");
        assert_eq!(dial_target("0.0.0.0:9809"), "127.0.0.1:9809");
        assert_eq!(dial_target("[::]:9809"), "[::1]:9809");
        assert_eq!(dial_target("10.0.0.0:9809"), "10.0.0.0:9809");
        assert_eq!(dial_target("localhost:9809"), "localhost:9809");
    }

    #[tokio::test]
    async fn a_bare_port_means_every_interface_and_localhost_its_loopback_addresses() {
        let texts = |addresses: Vec<SocketAddr>| -> Vec<String> {
            addresses.iter().map(ToString::to_string).collect()
        };
        let got = texts(bind_candidates(":9808").await.unwrap());
        assert_eq!(got, ["[::]:9808", "0.0.0.0:9808"]);
        let got = texts(bind_candidates("127.0.0.1:9808").await.unwrap());
        assert_eq!(got, ["127.0.0.1:9808"]);
        // localhost is loopback from /etc/hosts, or without it (RFC 6761): IPv4 first either way.
        let got = texts(bind_candidates("localhost:9808").await.unwrap());
        assert_eq!(
            got.first().map(String::as_str),
            Some("127.0.0.1:9808"),
            "{got:?}"
        );
    }

    #[tokio::test]
    async fn the_server_answers_with_the_handlers_reply_and_stops_on_shutdown() {
        let listener = bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (trigger, shutdown) = Shutdown::manual();
        let server = tokio::spawn(serve(
            listener,
            |path: String| async move {
                if path == "/healthz" {
                    Reply::text(200, "ok")
                } else {
                    Reply::not_found()
                }
            },
            shutdown,
        ));
        let timeout = Duration::from_secs(5);
        assert_eq!(
            get(&address, "/healthz", timeout).await.unwrap(),
            (200, "ok".to_owned())
        );
        assert_eq!(get(&address, "/nope", timeout).await.unwrap().0, 404);
        trigger.fire();
        server.await.unwrap();
        assert!(
            get(&address, "/healthz", timeout).await.is_err(),
            "still listening after shutdown"
        );
    }
}
