//! The end of the grace period for calls in flight at SIGTERM. Until then they run to the end
//! (tonic's graceful stop: no new connections, GOAWAY on the open ones); a call still running
//! when the grace period is over is answered UNAVAILABLE, which a kubelet retries against the
//! next node-server, instead of losing its connection without a status. The work behind it
//! (a copy, a mount syscall on a hung filesystem) is left to the process exit, and what it
//! leaves behind is cleaned up at the next start, as after a crash.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::codegen::http;

use crate::node_server::in_flight::InFlight;
use crate::shutdown::Shutdown;

/// Wraps every call of a server: see the module docs. Each call is counted in `calls` while
/// it runs.
#[derive(Clone, Debug)]
pub struct CutAtGraceEnd {
    over: Shutdown,
    grace: Duration,
    calls: InFlight,
}

impl CutAtGraceEnd {
    /// `over` begins when the grace period of `grace` is over.
    pub fn new(over: Shutdown, grace: Duration, calls: InFlight) -> Self {
        Self { over, grace, calls }
    }
}

impl<S> tower::Layer<S> for CutAtGraceEnd {
    type Service = Cut<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Cut {
            inner,
            over: self.over.clone(),
            grace: self.grace,
            calls: self.calls.clone(),
        }
    }
}

/// One server's services, behind [`CutAtGraceEnd`].
#[derive(Clone, Debug)]
pub struct Cut<S> {
    inner: S,
    over: Shutdown,
    grace: Duration,
    calls: InFlight,
}

type Answer<B, E> = Pin<Box<dyn Future<Output = Result<http::Response<B>, E>> + Send>>;

impl<S, Request, B> tower::Service<Request> for Cut<S>
where
    S: tower::Service<Request, Response = http::Response<B>>,
    S::Future: Send + 'static,
    B: Default + Send + 'static,
{
    type Response = http::Response<B>;
    type Error = S::Error;
    type Future = Answer<B, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let running = self.calls.begin();
        let call = self.inner.call(request);
        let over = self.over.clone();
        let grace = self.grace;
        Box::pin(async move {
            let _running = running;
            tokio::select! {
                biased;
                answer = call => answer,
                () = over.wait() => {
                    let why = format!(
                        "the node-server is shutting down and the call did not finish within \
                         its {grace:?} grace period"
                    );
                    log::warn!("{why}; answering UNAVAILABLE");
                    Ok(tonic::Status::unavailable(why).into_http())
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, Service, ServiceExt};

    fn slow(
        delay: Duration,
    ) -> impl Service<(), Response = http::Response<tonic::body::Body>, Error = (), Future: Send> + Clone
    {
        tower::service_fn(move |()| async move {
            tokio::time::sleep(delay).await;
            Ok::<_, ()>(http::Response::new(tonic::body::Body::default()))
        })
    }

    fn grpc_status(response: &http::Response<tonic::body::Body>) -> Option<&str> {
        response
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_ends_within_the_grace_period_gets_its_own_answer() {
        let (trigger, over) = Shutdown::manual();
        let layer = CutAtGraceEnd::new(over, Duration::from_secs(10), InFlight::default());
        let answer = tokio::spawn(layer.layer(slow(Duration::from_secs(1))).oneshot(()));
        tokio::time::sleep(Duration::from_secs(2)).await;
        trigger.fire();
        let response = answer.await.unwrap().unwrap();
        assert_eq!(grpc_status(&response), None, "the handler's own answer");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_still_running_at_the_end_of_the_grace_period_is_answered_unavailable() {
        let (trigger, over) = Shutdown::manual();
        let layer = CutAtGraceEnd::new(over, Duration::from_secs(10), InFlight::default());
        let answer = tokio::spawn(layer.layer(slow(Duration::from_secs(3600))).oneshot(()));
        tokio::time::sleep(Duration::from_secs(1)).await;
        trigger.fire();
        let response = answer.await.unwrap().unwrap();
        assert_eq!(grpc_status(&response), Some("14"));
        let message = response.headers()["grpc-message"].to_str().unwrap();
        assert!(message.contains("grace%20period"), "{message}");
    }
}
