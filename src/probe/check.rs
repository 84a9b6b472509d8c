//! One health check of the driver: CSI `Probe` under a deadline, read the way upstream
//! livenessprobe reads it (error = unhealthy, `ready=false` = not ready, unset = ready).

use std::time::{Duration, Instant};

use crate::proto::csi::{ProbeRequest, ProbeResponse, identity_client::IdentityClient};

pub const PROBE: &str = "/csi.v1.Identity/Probe";

/// Why the driver is not healthy; the text is what `/healthz` and `probe once` report.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    Dial(#[from] crate::socket::DialError),
    /// The call failed: grpc-go's text, as upstream reports it.
    #[error("{}", crate::gocompat::status_with_cause(.0))]
    Call(#[source] tonic::Status),
    #[error("driver responded but is not ready")]
    NotReady,
    /// The shared probe task ended without a result (it panicked).
    #[error("probe task ended without a result")]
    Lost,
}

/// Connects to the driver at `address` within `deadline`.
pub async fn connect(
    address: &std::path::Path,
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> Result<tonic::transport::Channel, ProbeError> {
    match tokio::time::timeout_at(deadline, crate::socket::connect(address)).await {
        Ok(connected) => Ok(connected?),
        Err(_) => Err(crate::socket::DialError::TimedOut {
            path: address.to_owned(),
            limit: timeout,
        }
        .into()),
    }
}

/// Calls Probe on `channel` within `timeout` and reads the reply (see [`call`], [`verdict`]).
pub async fn probe(
    channel: tonic::transport::Channel,
    timeout: Duration,
) -> Result<(), ProbeError> {
    verdict(call(channel, timeout).await.0)
}

/// Calls Probe on `channel` within `timeout`: the reply (DEADLINE_EXCEEDED when the time ran
/// out) and how long it took.
pub async fn call(
    channel: tonic::transport::Channel,
    timeout: Duration,
) -> (Result<ProbeResponse, tonic::Status>, Duration) {
    let started = Instant::now();
    // The deadline is enforced here, not sent as grpc-timeout: tonic reports its own expiry
    // as CANCELLED, and the code must read DEADLINE_EXCEEDED as Go clients report it.
    let request = tonic::Request::new(ProbeRequest {});
    let reply = tokio::time::timeout(timeout, IdentityClient::new(channel).probe(request))
        .await
        .unwrap_or_else(|_| {
            Err(tonic::Status::deadline_exceeded(format!(
                "no answer within {timeout:?}"
            )))
        })
        .map(tonic::Response::into_inner);
    (reply, started.elapsed())
}

/// The gRPC code of a reply, for metrics.
pub fn code<T>(reply: &Result<T, tonic::Status>) -> tonic::Code {
    reply
        .as_ref()
        .map_or_else(|s| s.code(), |_| tonic::Code::Ok)
}

/// A Probe reply read as upstream reads it.
pub fn verdict(reply: Result<ProbeResponse, tonic::Status>) -> Result<(), ProbeError> {
    match reply {
        Ok(reply) if reply.ready == Some(false) => Err(ProbeError::NotReady),
        Ok(_) => Ok(()),
        Err(status) => Err(ProbeError::Call(status)),
    }
}
