//! Which node this process runs on: a name given to it, else `$NODE_NAME` (the downward API's
//! `spec.nodeName` in every manifest of ours), else the kernel's host name. The modes say what
//! they do with it: node-server reports it as its node ID as it is, the kubelet emulator
//! lower-cases a host name as the kubelet does for its Node.

use std::io;

/// The kernel's host name (`/proc/sys/kernel/hostname`, read rather than `gethostname(2)`: the
/// same answer, without a buffer to size), without its newline. In a pod it is the pod's name.
pub fn host_name() -> io::Result<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|name| name.trim().to_owned())
}

/// Where a node name came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeName {
    /// Given on the command line or in `$NODE_NAME`, to be used as it is.
    Given(String),
    /// The kernel's host name, trimmed.
    Host(String),
}

impl NodeName {
    /// The name, as it was found.
    pub fn into_string(self) -> String {
        match self {
            Self::Given(name) | Self::Host(name) => name,
        }
    }

    /// The name the kubelet gives its Node: a host name lower-cased, a given name as it is.
    /// ASCII only: a Node's name is a DNS subdomain, so a host name with anything else could
    /// never be one (and Unicode's case tables would cost the binary 2 KB).
    pub fn as_kubelet_names_it(self) -> String {
        match self {
            Self::Given(name) => name,
            Self::Host(name) => name.to_ascii_lowercase(),
        }
    }
}

/// `given`, else `$NODE_NAME`, else the host name; an empty name counts as none (an empty
/// `given` is not replaced by `$NODE_NAME`: it is the host name's turn). The error is the host
/// name's read.
pub fn resolve(given: Option<String>) -> io::Result<NodeName> {
    resolve_from(given, std::env::var("NODE_NAME").ok(), host_name)
}

fn resolve_from(
    given: Option<String>,
    env: Option<String>,
    host: impl FnOnce() -> io::Result<String>,
) -> io::Result<NodeName> {
    match given.or(env).filter(|name| !name.is_empty()) {
        Some(name) => Ok(NodeName::Given(name)),
        None => host().map(NodeName::Host),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> io::Result<String> {
        Ok("Node-1".to_owned())
    }

    #[test]
    fn a_given_name_comes_first_then_node_name_then_the_host_name() {
        let given = |g: Option<&str>, env: Option<&str>| {
            resolve_from(g.map(str::to_owned), env.map(str::to_owned), host).unwrap()
        };
        assert_eq!(given(Some("a"), Some("b")), NodeName::Given("a".into()));
        assert_eq!(given(None, Some("b")), NodeName::Given("b".into()));
        assert_eq!(given(None, Some("")), NodeName::Host("Node-1".into()));
        assert_eq!(given(Some(""), Some("b")), NodeName::Host("Node-1".into()));
        assert_eq!(given(None, None), NodeName::Host("Node-1".into()));
    }

    #[test]
    fn only_a_host_name_is_lower_cased_as_the_kubelet_does() {
        assert_eq!(
            NodeName::Host("Node-1".into()).as_kubelet_names_it(),
            "node-1"
        );
        assert_eq!(
            NodeName::Given("Node-1".into()).as_kubelet_names_it(),
            "Node-1"
        );
        assert_eq!(NodeName::Host("Node-1".into()).into_string(), "Node-1");
    }

    #[test]
    fn an_unreadable_host_name_is_the_error() {
        let gone = || Err(io::Error::from(io::ErrorKind::NotFound));
        let err = resolve_from(None, None, gone).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn the_host_name_has_no_newline() {
        let name = host_name().unwrap();
        assert!(!name.is_empty() && !name.ends_with('\n'), "{name:?}");
    }
}
