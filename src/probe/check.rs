//! One health check of the driver: CSI `Probe` under a deadline, read the way upstream
//! livenessprobe reads it (error = unhealthy, `ready=false` = not ready, unset = ready).

use std::time::{Duration, Instant};

use crate::metrics::Metrics;
use crate::proto::csi::{ProbeRequest, identity_client::IdentityClient};

pub const PROBE: &str = "/csi.v1.Identity/Probe";

/// Why the driver is not healthy; the text is what `/healthz` and `probe once` report.
pub const NOT_READY: &str = "driver responded but is not ready";

/// Calls Probe on `channel` within `timeout`, recording the call in `metrics` if given.
pub async fn probe(
    channel: tonic::transport::Channel,
    timeout: Duration,
    driver: &str,
    metrics: Option<&Metrics>,
) -> Result<(), String> {
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
        });
    if let Some(metrics) = metrics {
        let code = reply
            .as_ref()
            .map(|_| tonic::Code::Ok)
            .unwrap_or_else(|s| s.code());
        metrics.observe(driver, PROBE, code, started.elapsed());
    }
    match reply {
        Ok(reply) if reply.get_ref().ready == Some(false) => Err(NOT_READY.to_owned()),
        Ok(_) => Ok(()),
        Err(status) => Err(describe(&status)),
    }
}

/// A gRPC failure on one line, in the shape Go's status errors print.
pub fn describe(status: &tonic::Status) -> String {
    let mut message = status.message().to_owned();
    if let Some(source) = std::error::Error::source(status) {
        let cause = crate::socket::error_chain(source);
        if !message.contains(&cause) {
            message = if message.is_empty() {
                cause
            } else {
                format!("{message}: {cause}")
            };
        }
    }
    format!(
        "rpc error: code = {} desc = {message}",
        crate::metrics::go_code_name(status.code())
    )
}
