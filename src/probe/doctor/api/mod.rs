//! The doctor's read-only view of the Kubernetes API: GETs of the node's CSINode, the
//! CSIDriver list and the Node, compared with what the node itself shows. Credentials come
//! from `--kubeconfig` or, in a pod, from the service account.
//!
//! - [`kubeconfig`] — the current context's server, CA and user.
//! - [`client`] — one GET over TLS (rustls, ring provider) or plain HTTP, under a deadline.
//! - [`compare`] — the comparisons and their findings.

pub mod client;
pub mod compare;
pub mod kubeconfig;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::path_io::PathIoError;

pub use compare::compare;

/// Where a pod finds its service account's token and the cluster CA.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Why the API cannot be used as configured.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error(transparent)]
    Read(#[from] PathIoError),
    #[error("kubeconfig {}: {reason}", path.display())]
    Kubeconfig { path: PathBuf, reason: String },
    #[error("kubeconfig {}: {what}", path.display())]
    Unsupported { path: PathBuf, what: String },
    #[error("API server {server:?}: {reason}")]
    Server { server: String, reason: String },
    #[error(
        "API server {server:?} uses HTTPS, but no CA certificate is given (the doctor's image \
         has no system CA store): add certificate-authority(-data)"
    )]
    NoCa { server: String },
    #[error("TLS setup: {0}")]
    Tls(#[source] rustls::Error),
    #[error("PEM data: {0}")]
    Pem(#[source] rustls::pki_types::pem::Error),
}

/// A usable connection recipe to the API server.
#[derive(Clone)]
pub struct Access {
    /// For the report: `kubeconfig <path> (context <c>)` or `in-cluster credentials`.
    source: String,
    server: String,
    host: String,
    port: u16,
    /// `host:port` as the `Host` header wants it.
    authority: String,
    /// A path prefix of the server URL (API proxies put one), without trailing slash.
    base_path: String,
    tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    token: Option<String>,
}

impl std::fmt::Debug for Access {
    /// Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("source", &self.source)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// The environment a pod gets for the in-cluster API.
#[derive(Debug, Clone, Default)]
pub struct InCluster {
    pub host: Option<String>,
    pub port: Option<String>,
    pub dir: PathBuf,
}

impl InCluster {
    pub fn from_env() -> Self {
        Self {
            host: std::env::var("KUBERNETES_SERVICE_HOST").ok(),
            port: std::env::var("KUBERNETES_SERVICE_PORT").ok(),
            dir: PathBuf::from(SERVICE_ACCOUNT_DIR),
        }
    }
}

fn tls_config(
    server: &str,
    ca_pem: Option<&[u8]>,
    client: Option<(&[u8], &[u8])>,
) -> Result<Arc<rustls::ClientConfig>, AccessError> {
    let ca_pem = ca_pem.ok_or_else(|| AccessError::NoCa {
        server: server.to_owned(),
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots
            .add(cert.map_err(AccessError::Pem)?)
            .map_err(AccessError::Tls)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(AccessError::Tls)?
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(AccessError::Pem)?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(AccessError::Pem)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(AccessError::Tls)?
        }
    };
    Ok(Arc::new(config))
}

impl Access {
    fn new(
        source: String,
        server: &str,
        ca_pem: Option<&[u8]>,
        tls_server_name: Option<&str>,
        client: Option<(&[u8], &[u8])>,
        token: Option<String>,
    ) -> Result<Self, AccessError> {
        let bad = |reason: &str| AccessError::Server {
            server: server.to_owned(),
            reason: reason.to_owned(),
        };
        let uri: hyper::Uri = server.parse().map_err(|_| bad("not a URL"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(bad("the scheme must be https or http")),
        };
        let host = uri.host().ok_or_else(|| bad("no host"))?;
        let bare_host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = if https {
            let name = tls_server_name.unwrap_or(&bare_host).to_owned();
            let name = ServerName::try_from(name).map_err(|_| bad("invalid TLS server name"))?;
            Some((tls_config(server, ca_pem, client)?, name))
        } else {
            None
        };
        Ok(Self {
            source,
            server: server.to_owned(),
            authority: format!("{host}:{port}"),
            host: bare_host,
            port,
            base_path: uri.path().trim_end_matches('/').to_owned(),
            tls,
            token,
        })
    }

    pub fn from_kubeconfig(path: &Path) -> Result<Self, AccessError> {
        let c = kubeconfig::load(path)?;
        let client = c
            .client_cert_pem
            .as_deref()
            .zip(c.client_key_pem.as_deref());
        Self::new(
            format!("kubeconfig {} (context {})", path.display(), c.context),
            &c.server,
            c.ca_pem.as_deref(),
            c.tls_server_name.as_deref(),
            client,
            c.token,
        )
    }

    /// `None` outside a pod; otherwise the service account's access, or why it is unusable.
    pub fn in_cluster(env: &InCluster) -> Option<Result<Self, AccessError>> {
        let host = env.host.as_deref().filter(|h| !h.is_empty())?;
        let port = env.port.as_deref().unwrap_or("443");
        let read = |name: &str| {
            let path = env.dir.join(name);
            std::fs::read(&path).map_err(|e| AccessError::from(PathIoError::new("read", &path, e)))
        };
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        Some((|| {
            let token = String::from_utf8_lossy(&read("token")?).trim().to_owned();
            let ca = read("ca.crt")?;
            Self::new(
                "in-cluster credentials".into(),
                &format!("https://{host}:{port}"),
                Some(&ca),
                None,
                None,
                Some(token),
            )
        })())
    }

    pub fn describe(&self) -> String {
        format!("{}, server {}", self.source, self.server)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_servers_keep_their_path_prefix_and_default_port() {
        let access =
            Access::new("t".into(), "http://proxy/k8s/c1/", None, None, None, None).unwrap();
        assert_eq!(
            (access.host.as_str(), access.port, access.base_path.as_str()),
            ("proxy", 80, "/k8s/c1")
        );
        assert!(access.tls.is_none());
    }

    #[test]
    fn https_without_a_ca_is_refused_with_the_reason() {
        let err =
            Access::new("t".into(), "https://[::1]:6443", None, None, None, None).unwrap_err();
        assert!(err.to_string().contains("no CA certificate"), "{err}");
        let err = Access::new("t".into(), "ftp://x", None, None, None, None).unwrap_err();
        assert!(err.to_string().contains("https or http"), "{err}");
    }

    #[test]
    fn in_cluster_access_needs_the_service_host_and_reports_a_missing_token() {
        assert!(Access::in_cluster(&InCluster::default()).is_none());
        let env = InCluster {
            host: Some("10.96.0.1".into()),
            port: Some("443".into()),
            dir: PathBuf::from("/nonexistent"),
        };
        let err = Access::in_cluster(&env).unwrap().unwrap_err();
        assert!(err.to_string().contains("/nonexistent/token"), "{err}");
    }
}
