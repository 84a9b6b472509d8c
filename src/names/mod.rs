//! Host names to addresses, without glibc: the static binary links glibc, whose
//! `getaddrinfo` loads the host's NSS plugins (`libnss_mdns4_minimal.so.2` and the like) with
//! `dlopen` — libraries built for another glibc, where the binary may run on any node or in a
//! `FROM scratch` image that has neither them nor `/etc/nsswitch.conf`. As Go's own resolver
//! does for the upstream sidecars, names are looked up here in the order a node's default
//! `hosts: files dns` gives: an address literal is itself; then `/etc/hosts`; `localhost` and
//! names under it are the loopback addresses when `/etc/hosts` does not say (RFC 6761: an image
//! may have no `/etc/hosts`), and `invalid` and names under it never exist; then DNS, to the name servers, search domains, `ndots`, timeout
//! and attempts of `/etc/resolv.conf` (its defaults without one).
//!
//! `hosts_file` reads `/etc/hosts`; `dns` asks the name servers.
//!
//! Nothing else in the crate may pass a host name to `std` or tokio (`ToSocketAddrs` for a
//! string, `lookup_host`): either would link `getaddrinfo` back in; a packaging test reads the
//! shipped binary for it.

mod dns;
mod hosts_file;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// Why a name gave no address.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("no such host ({0})")]
    NoSuchHost(String),
    #[error("no answer from the name servers {servers} within {waited:?}")]
    NoAnswer { servers: String, waited: Duration },
    #[error("{0:?} is not a host name")]
    NotAName(String),
}

/// Where a lookup reads its configuration (the node's files, or a test's).
#[derive(Debug, Clone)]
pub struct Sources {
    pub hosts: PathBuf,
    pub resolv_conf: PathBuf,
    /// Name servers listen on 53; a test's on a port of its own.
    pub dns_port: u16,
}

impl Default for Sources {
    fn default() -> Self {
        Self {
            hosts: PathBuf::from("/etc/hosts"),
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            dns_port: 53,
        }
    }
}

/// The addresses of `host` (a name, an IPv4 address or an IPv6 address, bracketed or not)
/// with `port`, IPv4 first; never empty.
pub async fn lookup(host: &str, port: u16) -> Result<Vec<SocketAddr>, LookupError> {
    lookup_with(&Sources::default(), host, port).await
}

/// [`lookup`] reading `sources`.
pub async fn lookup_with(
    sources: &Sources,
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, LookupError> {
    let unbracketed = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = unbracketed.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    if !is_host_name(host) {
        return Err(LookupError::NotAName(host.to_owned()));
    }
    if is_invalid(host) {
        return Err(LookupError::NoSuchHost(host.to_owned()));
    }
    let mut ips = hosts_file::lookup(&sources.hosts, host);
    if ips.is_empty() && is_localhost(host) {
        ips = vec![Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()];
    }
    if ips.is_empty() {
        ips = dns::lookup(sources, host).await?;
    }
    // IPv4 first, as Go dials and listens: a node without IPv6 fails fast on the rest.
    ips.sort_by_key(|ip| ip.is_ipv6());
    ips.dedup();
    Ok(ips
        .into_iter()
        .map(|ip| SocketAddr::new(ip, port))
        .collect())
}

/// Letters, digits, `-`, `_` and dots, 1 to 253 characters, no empty label (but a final dot).
fn is_host_name(host: &str) -> bool {
    let name = host.strip_suffix('.').unwrap_or(host);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// `invalid` and names under it never exist (RFC 6761): answered at once, nobody asked.
fn is_invalid(host: &str) -> bool {
    let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    name == "invalid" || name.ends_with(".invalid")
}

fn is_localhost(host: &str) -> bool {
    let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

#[cfg(test)]
mod tests;
