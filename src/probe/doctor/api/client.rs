//! One GET to the API server: TCP, TLS when the server is HTTPS, HTTP/1.1, the bearer token if
//! any, JSON back; all within one deadline. GET is the only method this client has.

use std::io;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{ACCEPT, AUTHORIZATION, HOST, USER_AGENT};
use hyper_util::rt::TokioIo;

use super::Access;
use crate::BoxError;

/// The CSIDriver list of a big cluster fits easily; anything larger is not an API server.
const MAX_BODY: usize = 16 << 20;

/// Why a GET got no answer.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("the host name {host:?} does not resolve: {source}")]
    Resolve {
        host: String,
        #[source]
        source: crate::names::LookupError,
    },
    #[error("connect: {0}")]
    Connect(#[source] io::Error),
    #[error("TLS: {}", tls_words(.0))]
    Tls(#[source] io::Error),
    #[error("building the request: {0}")]
    Request(#[source] hyper::http::Error),
    #[error("HTTP: {0}")]
    Http(#[source] hyper::Error),
    #[error("reading the reply: {0}")]
    Body(#[source] BoxError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

async fn exchange<IO>(
    io: IO,
    request: hyper::Request<Empty<Bytes>>,
) -> Result<(u16, Vec<u8>), RequestError>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(RequestError::Http)?;
    tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(RequestError::Http)?;
    let status = response.status().as_u16();
    let body = Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(RequestError::Body)?;
    Ok((status, body.to_bytes().to_vec()))
}

/// GETs `path` (e.g. `/apis/storage.k8s.io/v1/csidrivers`); the status and the body.
pub async fn get(
    access: &Access,
    path: &str,
    limit: Duration,
) -> Result<(u16, Vec<u8>), RequestError> {
    let attempt = async {
        let addresses = crate::names::lookup(&access.host, access.port)
            .await
            .map_err(|source| RequestError::Resolve {
                host: access.host.clone(),
                source,
            })?;
        let tcp = tokio::net::TcpStream::connect(&addresses[..])
            .await
            .map_err(RequestError::Connect)?;
        let mut request = hyper::Request::get(format!("{}{path}", access.base_path))
            .header(HOST, &access.authority)
            .header(ACCEPT, "application/json")
            .header(
                USER_AGENT,
                concat!("csi-nodekit/", env!("CARGO_PKG_VERSION"), " (probe doctor)"),
            );
        if let Some(token) = &access.token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(RequestError::Request)?;
        log::debug!("GET {}{path}", access.server);
        match &access.tls {
            Some((config, name)) => {
                let connector = tokio_rustls::TlsConnector::from(config.clone());
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(RequestError::Tls)?;
                exchange(TokioIo::new(tls), request).await
            }
            None => exchange(TokioIo::new(tcp), request).await,
        }
    };
    tokio::time::timeout(limit, attempt)
        .await
        .unwrap_or(Err(RequestError::Timeout(limit)))
}

/// What went wrong in the TLS handshake, in words: rustls names its errors by their Rust
/// variants (`invalid peer certificate: UnknownIssuer`), which say little to an operator.
fn tls_words(error: &io::Error) -> String {
    use rustls::{CertificateError, Error};
    let Some(tls) = error.get_ref().and_then(|e| e.downcast_ref::<Error>()) else {
        return error.to_string();
    };
    match tls {
        // A CA of the same name but another key fails on the signature, not the issuer.
        Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => "the server's certificate is not signed by the certificate authority the \
             kubeconfig gives"
            .into(),
        Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => "the server's certificate is not issued for the host name or address used".into(),
        Error::InvalidCertificate(
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. },
        ) => "the server's certificate is outside its validity period (or this node's clock \
              is wrong)"
            .into(),
        other => format!("the handshake failed ({other})"),
    }
}

/// Whether the handshake failed on the server's certificate (not on the connection).
pub fn is_certificate_error(error: &RequestError) -> bool {
    let RequestError::Tls(io) = error else {
        return false;
    };
    io.get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
        .is_some_and(|e| matches!(e, rustls::Error::InvalidCertificate(_)))
}
