//! A fake Kubernetes API server over real HTTPS: a test CA made with rcgen, canned JSON by
//! path, and a record of every request (method, path, credentials) so a test can prove that a
//! client only read.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;

/// A certificate authority and what it signed, as PEM.
pub struct TestCa {
    pub ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM.
pub struct Signed {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    pub fn new() -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_pem = params.self_signed(&key).unwrap().pem();
        Self {
            ca_pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `names` (IP addresses become IP SANs).
    pub fn sign(&self, names: &[&str]) -> Signed {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &self.issuer)
            .unwrap();
        Signed {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// One request the fake received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
    pub client_certificate: bool,
}

/// The running fake: its address, its CA, and what it saw.
pub struct FakeApi {
    pub address: SocketAddr,
    pub ca: TestCa,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl FakeApi {
    /// Serves `objects` (path → (status, JSON)) on 127.0.0.1; any other path is 404.
    pub async fn start(objects: BTreeMap<String, (u16, Value)>) -> Self {
        let ca = TestCa::new();
        let server = ca.sign(&["127.0.0.1", "localhost"]);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.ca_pem.as_bytes()).unwrap())
            .unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.into(),
            provider.clone(),
        )
        .allow_unauthenticated()
        .build()
        .unwrap();
        let chain = vec![CertificateDer::from_pem_slice(server.cert_pem.as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let objects = Arc::new(objects);
        let record = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, objects, record) =
                    (acceptor.clone(), objects.clone(), record.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let client_certificate = tls.get_ref().1.peer_certificates().is_some();
                    let service = service_fn(
                        move |request: hyper::Request<hyper::body::Incoming>| {
                            let path = request.uri().path().to_owned();
                            record.lock().unwrap().push(Seen {
                                method: request.method().to_string(),
                                path: path.clone(),
                                authorization: request
                                    .headers()
                                    .get(hyper::header::AUTHORIZATION)
                                    .map(|v| v.to_str().unwrap().to_owned()),
                                client_certificate,
                            });
                            let (status, body) = objects.get(&path).cloned().unwrap_or((
                            404,
                            serde_json::json!({"kind": "Status", "message": format!("{path} not found")}),
                        ));
                            let response = hyper::Response::builder()
                                .status(status)
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(body.to_string())))
                                .unwrap();
                            async move { Ok::<_, std::convert::Infallible>(response) }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            address,
            ca,
            seen,
            _task: task,
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// A kubeconfig in `dir` for this server: the CA as a file, and `user` as given (YAML
    /// mapping lines, indented by six spaces).
    pub fn kubeconfig(&self, dir: &Path, user: &str) -> PathBuf {
        std::fs::write(dir.join("ca.crt"), &self.ca.ca_pem).unwrap();
        let text = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\n\
             clusters:\n- name: fake\n  cluster:\n    server: https://{}\n    certificate-authority: ca.crt\n\
             contexts:\n- name: test\n  context:\n    cluster: fake\n    user: doctor\n\
             users:\n- name: doctor\n  user:\n{user}",
            self.address
        );
        let path = dir.join("kubeconfig");
        std::fs::write(&path, text).unwrap();
        path
    }
}
