//! DNS as a stub resolver asks it: A and AAAA questions for each name the search list makes,
//! to each name server in turn, over UDP (over TCP when the answer is truncated), within
//! `resolv.conf`'s timeout and attempts.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use simple_dns::rdata::RData;
use simple_dns::{CLASS, Name, Packet, PacketFlag, QCLASS, QTYPE, Question, RCODE, TYPE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

use super::{LookupError, Sources};

/// What one name server said of one name.
#[derive(Debug, PartialEq)]
enum Answer {
    Found(Vec<IpAddr>),
    /// NXDOMAIN, or a name with neither kind of address: the next name of the search list.
    NoSuchName,
}

/// The largest UDP answer read (EDNS is not asked for, so 512 is the most a server sends).
const UDP_MAX: usize = 4096;

pub async fn lookup(sources: &Sources, host: &str) -> Result<Vec<IpAddr>, LookupError> {
    let conf = match std::fs::read(&sources.resolv_conf) {
        Ok(bytes) => resolv_conf::Config::parse_with_errors(&bytes).0,
        Err(_) => resolv_conf::Config::new(),
    };
    let servers: Vec<SocketAddr> = conf
        .get_nameservers_or_local()
        .into_iter()
        .map(|ip| SocketAddr::new(IpAddr::from(ip), sources.dns_port))
        .collect();
    let timeout = Duration::from_secs(conf.timeout.clamp(1, 30).into());
    let attempts = conf.attempts.clamp(1, 5);
    let started = Instant::now();
    for name in candidates(host, &conf) {
        match ask(&servers, &name, timeout, attempts).await {
            Some(Answer::Found(ips)) => return Ok(ips),
            Some(Answer::NoSuchName) => continue,
            None => {
                return Err(LookupError::NoAnswer {
                    servers: servers
                        .iter()
                        .map(|s| s.ip().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    waited: started.elapsed(),
                });
            }
        }
    }
    Err(LookupError::NoSuchHost(host.to_owned()))
}

/// The names to ask for, in order: a name ending in a dot as it is; one with at least `ndots`
/// dots first as it is, then under each search domain; a shorter one the other way round.
fn candidates(host: &str, conf: &resolv_conf::Config) -> Vec<String> {
    if let Some(absolute) = host.strip_suffix('.') {
        return vec![absolute.to_owned()];
    }
    let searched = conf
        .get_last_search_or_domain()
        .filter(|domain| !domain.is_empty() && domain.as_str() != ".")
        .map(|domain| format!("{host}.{}", domain.trim_end_matches('.')));
    let dots = host.bytes().filter(|&b| b == b'.').count();
    match dots >= conf.ndots as usize {
        true => std::iter::once(host.to_owned()).chain(searched).collect(),
        false => searched.chain(std::iter::once(host.to_owned())).collect(),
    }
}

/// Each server in turn, `attempts` rounds; `None` when none answered.
async fn ask(
    servers: &[SocketAddr],
    name: &str,
    timeout: Duration,
    attempts: u32,
) -> Option<Answer> {
    for _ in 0..attempts {
        for server in servers {
            match tokio::time::timeout(timeout, exchange(*server, name)).await {
                Ok(Ok(answer)) => return Some(answer),
                Ok(Err(e)) => log::debug!("DNS {server} for {name:?}: {e}"),
                Err(_) => log::debug!("DNS {server} for {name:?}: no answer within {timeout:?}"),
            }
        }
    }
    None
}

/// Both questions to one server, on one socket; an error for a server that failed to answer
/// (SERVFAIL, REFUSED, a malformed reply), which sends the lookup to the next one.
async fn exchange(server: SocketAddr, name: &str) -> io::Result<Answer> {
    let local: IpAddr = match server {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = UdpSocket::bind(SocketAddr::new(local, 0)).await?;
    socket.connect(server).await?;
    let id = getrandom::u32().map_err(|e| io::Error::other(e.to_string()))? as u16;
    let questions = [(id, TYPE::A), (id.wrapping_add(1), TYPE::AAAA)];
    for (id, kind) in questions {
        socket.send(&query(id, name, kind)?).await?;
    }
    let mut replies: [Option<Answer>; 2] = [None, None];
    let mut buffer = vec![0; UDP_MAX];
    while replies.iter().any(Option::is_none) {
        let read = socket.recv(&mut buffer).await?;
        let Ok(reply) = Packet::parse(&buffer[..read]) else {
            continue;
        };
        let Some(slot) = questions.iter().position(|(id, _)| *id == reply.id()) else {
            continue;
        };
        if replies[slot].is_some() || !answers_the_question(&reply, name, questions[slot].1) {
            continue;
        }
        replies[slot] = Some(match reply.has_flags(PacketFlag::TRUNCATION) {
            true => over_tcp(server, questions[slot].0, name, questions[slot].1).await?,
            false => read_answer(&reply)?,
        });
    }
    let mut ips = Vec::new();
    for reply in replies.into_iter().flatten() {
        if let Answer::Found(found) = reply {
            ips.extend(found);
        }
    }
    Ok(match ips.is_empty() {
        true => Answer::NoSuchName,
        false => Answer::Found(ips),
    })
}

/// A question asked again over TCP, for an answer too long for UDP.
async fn over_tcp(server: SocketAddr, id: u16, name: &str, kind: TYPE) -> io::Result<Answer> {
    let mut stream = TcpStream::connect(server).await?;
    let message = query(id, name, kind)?;
    let mut framed = (message.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&message);
    stream.write_all(&framed).await?;
    let length = stream.read_u16().await?;
    let mut reply = vec![0; usize::from(length)];
    stream.read_exact(&mut reply).await?;
    let reply = Packet::parse(&reply).map_err(malformed)?;
    if reply.id() != id || !answers_the_question(&reply, name, kind) {
        return Err(io::Error::other("a TCP answer to another question"));
    }
    read_answer(&reply)
}

fn query(id: u16, name: &str, kind: TYPE) -> io::Result<Vec<u8>> {
    let mut packet = Packet::new_query(id);
    packet.set_flags(PacketFlag::RECURSION_DESIRED);
    packet.questions.push(Question::new(
        Name::new(name).map_err(malformed)?,
        QTYPE::TYPE(kind),
        QCLASS::CLASS(CLASS::IN),
        false,
    ));
    packet.build_bytes_vec().map_err(malformed)
}

fn answers_the_question(reply: &Packet, name: &str, kind: TYPE) -> bool {
    reply.has_flags(PacketFlag::RESPONSE)
        && reply.questions.len() == 1
        && reply.questions[0].qtype == QTYPE::TYPE(kind)
        && reply.questions[0]
            .qname
            .to_string()
            .eq_ignore_ascii_case(name)
}

/// The addresses of a reply (a CNAME's target's included: servers answer them in the same
/// message), or why the server could not say.
fn read_answer(reply: &Packet) -> io::Result<Answer> {
    match reply.rcode() {
        RCODE::NoError => {}
        RCODE::NameError => return Ok(Answer::NoSuchName),
        other => return Err(io::Error::other(format!("the server answered {other:?}"))),
    }
    let ips: Vec<IpAddr> = reply
        .answers
        .iter()
        .filter_map(|record| match &record.rdata {
            RData::A(a) => Some(Ipv4Addr::from(a.address).into()),
            RData::AAAA(aaaa) => Some(Ipv6Addr::from(aaaa.address).into()),
            _ => None,
        })
        .collect();
    Ok(match ips.is_empty() {
        true => Answer::NoSuchName,
        false => Answer::Found(ips),
    })
}

fn malformed(e: simple_dns::SimpleDnsError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(text: &str) -> resolv_conf::Config {
        resolv_conf::Config::parse(text).unwrap()
    }

    #[test]
    fn short_names_try_the_search_domains_first_and_long_ones_last() {
        let c = conf(
            "nameserver 10.96.0.10\nsearch ns.svc.cluster.local svc.cluster.local\noptions ndots:5\n",
        );
        assert_eq!(
            candidates("kubernetes.default", &c),
            [
                "kubernetes.default.ns.svc.cluster.local",
                "kubernetes.default.svc.cluster.local",
                "kubernetes.default"
            ]
        );
        let c = conf("nameserver 10.0.0.2\nsearch corp.example\n");
        assert_eq!(
            candidates("api.example.com", &c),
            ["api.example.com", "api.example.com.corp.example"]
        );
        assert_eq!(candidates("api", &c), ["api.corp.example", "api"]);
        assert_eq!(candidates("api.example.com.", &c), ["api.example.com"]);
    }
}
