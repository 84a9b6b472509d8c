//! The parts of a kubeconfig the doctor can use in a `FROM scratch` image: the current
//! context's cluster (server, CA file or data, TLS server name) and user (token or token file,
//! client certificate and key, file or data). Exec and auth-provider plugins need programs the
//! image does not have; they are refused with a clear message instead of failing later.

use std::path::{Path, PathBuf};

use base64::Engine;
use yaml_rust2::{Yaml, YamlLoader};

use super::AccessError;
use crate::path_io::PathIoError;

/// What the current context says, with every file already read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub context: String,
    pub server: String,
    pub ca_pem: Option<Vec<u8>>,
    pub tls_server_name: Option<String>,
    pub token: Option<String>,
    pub client_cert_pem: Option<Vec<u8>>,
    pub client_key_pem: Option<Vec<u8>>,
}

fn named<'a>(doc: &'a Yaml, list: &str, name: &str, field: &str) -> Option<&'a Yaml> {
    doc[list]
        .as_vec()?
        .iter()
        .find(|entry| entry["name"].as_str() == Some(name))
        .map(|entry| &entry[field])
}

/// A `<field>` (a path, relative to the kubeconfig's directory) or `<field>-data` (base64).
fn file_or_data(
    section: &Yaml,
    field: &str,
    dir: &Path,
    path: &Path,
) -> Result<Option<Vec<u8>>, AccessError> {
    if let Some(data) = section[format!("{field}-data").as_str()].as_str() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| AccessError::Kubeconfig {
                path: path.to_owned(),
                reason: format!("{field}-data is not base64: {e}"),
            })?;
        return Ok(Some(bytes));
    }
    let Some(file) = section[field].as_str() else {
        return Ok(None);
    };
    read(&dir.join(file)).map(Some)
}

fn read(path: &Path) -> Result<Vec<u8>, AccessError> {
    Ok(std::fs::read(path).map_err(PathIoError::at("read", path))?)
}

/// Reads the kubeconfig at `path` and the files it names.
pub fn load(path: &Path) -> Result<Credentials, AccessError> {
    let bad = |reason: String| AccessError::Kubeconfig {
        path: path.to_owned(),
        reason,
    };
    let text = String::from_utf8(read(path)?).map_err(|_| bad("not UTF-8 text".into()))?;
    let docs = YamlLoader::load_from_str(&text).map_err(|e| bad(e.to_string()))?;
    let doc = docs.first().ok_or_else(|| bad("empty".into()))?;
    let dir = path
        .parent()
        .map(Path::to_owned)
        .unwrap_or_else(|| PathBuf::from("."));
    let context_name = doc["current-context"]
        .as_str()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| bad("no current-context".into()))?;
    let context = named(doc, "contexts", context_name, "context")
        .ok_or_else(|| bad(format!("context {context_name:?} is not defined")))?;
    let cluster_name = context["cluster"].as_str().unwrap_or_default();
    let cluster = named(doc, "clusters", cluster_name, "cluster")
        .ok_or_else(|| bad(format!("cluster {cluster_name:?} is not defined")))?;
    let server = cluster["server"]
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad(format!("cluster {cluster_name:?} has no server")))?;
    if cluster["insecure-skip-tls-verify"].as_bool() == Some(true) {
        return Err(AccessError::Unsupported {
            path: path.to_owned(),
            what: format!(
                "cluster {cluster_name:?} sets insecure-skip-tls-verify; the doctor verifies the \
                 API server: give certificate-authority or certificate-authority-data"
            ),
        });
    }
    let mut credentials = Credentials {
        context: context_name.to_owned(),
        server: server.to_owned(),
        ca_pem: file_or_data(cluster, "certificate-authority", &dir, path)?,
        tls_server_name: cluster["tls-server-name"].as_str().map(str::to_owned),
        ..Default::default()
    };
    let user_name = context["user"].as_str().unwrap_or_default();
    let Some(user) = named(doc, "users", user_name, "user") else {
        return Ok(credentials); // anonymous
    };
    for plugin in ["exec", "auth-provider"] {
        if !user[plugin].is_badvalue() && !matches!(user[plugin], Yaml::Null) {
            let command = user[plugin]["command"]
                .as_str()
                .or_else(|| user[plugin]["name"].as_str())
                .unwrap_or("?");
            return Err(AccessError::Unsupported {
                path: path.to_owned(),
                what: format!(
                    "user {user_name:?} authenticates through an {plugin} plugin ({command}), \
                     which cannot run in the doctor's FROM scratch image: give a kubeconfig with \
                     a token (e.g. from `kubectl create token`) or a client certificate"
                ),
            });
        }
    }
    credentials.token = match (user["token"].as_str(), user["tokenFile"].as_str()) {
        (Some(token), _) => Some(token.to_owned()),
        (None, Some(file)) => Some(
            String::from_utf8_lossy(&read(&dir.join(file))?)
                .trim()
                .to_owned(),
        ),
        (None, None) => None,
    };
    credentials.client_cert_pem = file_or_data(user, "client-certificate", &dir, path)?;
    credentials.client_key_pem = file_or_data(user, "client-key", &dir, path)?;
    if credentials.client_cert_pem.is_some() != credentials.client_key_pem.is_some() {
        return Err(bad(format!(
            "user {user_name:?} has a client certificate without a key, or a key without one"
        )));
    }
    Ok(credentials)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    const CONFIG: &str = "apiVersion: v1\nkind: Config\ncurrent-context: b\n\
        contexts:\n- name: a\n  context: {cluster: c1, user: u1}\n\
        - name: b\n  context: {cluster: c2, user: u2}\n\
        clusters:\n- name: c1\n  cluster: {server: 'https://one'}\n\
        - name: c2\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority: ca.pem\n    tls-server-name: api.local\n\
        users:\n- name: u2\n  user:\n    tokenFile: token\n    client-certificate-data: Y2VydA==\n    client-key-data: a2V5\n";

    #[test]
    fn the_current_context_gives_server_ca_token_and_client_certificate() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "ca.pem", "CA");
        write(dir.path(), "token", "sekret\n");
        let path = write(dir.path(), "config", CONFIG);
        let credentials = load(&path).unwrap();
        assert_eq!(
            credentials,
            Credentials {
                context: "b".into(),
                server: "https://10.0.0.1:6443".into(),
                ca_pem: Some(b"CA".to_vec()),
                tls_server_name: Some("api.local".into()),
                token: Some("sekret".into()),
                client_cert_pem: Some(b"cert".to_vec()),
                client_key_pem: Some(b"key".to_vec()),
            }
        );
    }

    #[test]
    fn exec_plugins_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let text = "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n\
            clusters: [{name: c, cluster: {server: 'https://a'}}]\n\
            users: [{name: u, user: {exec: {command: aws, args: [eks, get-token]}}}]\n";
        let err = load(&write(dir.path(), "config", text))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("exec plugin (aws)") && err.contains("FROM scratch"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_context_or_server_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = load(&write(dir.path(), "c1", "current-context: nope\n")).unwrap_err();
        assert!(
            err.to_string().contains("context \"nope\" is not defined"),
            "{err}"
        );
        let text = "current-context: x\ncontexts: [{name: x, context: {cluster: c}}]\nclusters: [{name: c, cluster: {}}]\n";
        let err = load(&write(dir.path(), "c2", text)).unwrap_err();
        assert!(
            err.to_string().contains("cluster \"c\" has no server"),
            "{err}"
        );
    }
}
