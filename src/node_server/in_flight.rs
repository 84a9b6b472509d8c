//! The calls running now, counted by [`grace`](super::grace)'s layer around every call. Once
//! shutdown has begun, node-server waits for these, not for its connections to close: a
//! client that connected and stopped reading (a hung or stopped process, one that never
//! spoke) never answers the GOAWAY's ping, and tonic's graceful stop would wait for it to the
//! end of the grace period, holding every rollout of the DaemonSet for 11 s.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// How long no call must have been running before shutdown stops waiting: a request the
/// server has read but not yet dispatched (its headers decoded on a connection's task) gets
/// this long to begin.
pub const QUIET: Duration = Duration::from_millis(100);

/// A count of the calls running, shared by every connection.
#[derive(Clone, Debug, Default)]
pub struct InFlight(Arc<Count>);

#[derive(Debug, Default)]
struct Count {
    calls: AtomicUsize,
    /// Every call ever begun: tells a burst that has ended from no call at all.
    begun: AtomicUsize,
    ended: Notify,
}

/// One call, counted until it is dropped (answered, or its future dropped).
#[derive(Debug)]
pub struct Running(InFlight);

impl InFlight {
    /// Counts a call that begins now.
    pub fn begin(&self) -> Running {
        self.0.calls.fetch_add(1, Ordering::SeqCst);
        self.0.begun.fetch_add(1, Ordering::Relaxed);
        Running(self.clone())
    }

    /// How many calls have begun since the server started.
    pub fn begun(&self) -> usize {
        self.0.begun.load(Ordering::Relaxed)
    }

    /// Resolves when the next call ends.
    pub async fn one_ends(&self) {
        self.0.ended.notified().await;
    }

    pub fn running(&self) -> usize {
        self.0.calls.load(Ordering::SeqCst)
    }

    /// Resolves once no call has been running for [`QUIET`].
    pub async fn quiet(&self) {
        loop {
            self.none().await;
            tokio::time::sleep(QUIET).await;
            if self.running() == 0 {
                return;
            }
        }
    }

    /// Resolves when no call is running.
    async fn none(&self) {
        loop {
            let ended = self.0.ended.notified();
            tokio::pin!(ended);
            // Registered before the check, so an end between the two is not missed.
            ended.as_mut().enable();
            if self.running() == 0 {
                return;
            }
            ended.await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.0.calls.fetch_sub(1, Ordering::SeqCst);
        self.0.0.ended.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn with_no_call_running_it_is_quiet_after_the_quiet_moment() {
        let calls = InFlight::default();
        let began = tokio::time::Instant::now();
        calls.quiet().await;
        assert_eq!(began.elapsed(), QUIET);
    }

    #[tokio::test(start_paused = true)]
    async fn it_is_quiet_only_once_the_last_running_call_has_ended() {
        let calls = InFlight::default();
        let (first, second) = (calls.begin(), calls.begin());
        assert_eq!(calls.running(), 2);
        let ends = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(first);
            tokio::time::sleep(Duration::from_secs(2)).await;
            drop(second);
        });
        let began = tokio::time::Instant::now();
        calls.quiet().await;
        assert_eq!(began.elapsed(), Duration::from_secs(3) + QUIET);
        assert_eq!(calls.running(), 0);
        ends.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_begins_in_the_quiet_moment_is_waited_for() {
        let calls = InFlight::default();
        let late = calls.clone();
        let call = tokio::spawn(async move {
            tokio::time::sleep(QUIET / 2).await;
            let running = late.begin();
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(running);
        });
        let began = tokio::time::Instant::now();
        calls.quiet().await;
        assert!(
            began.elapsed() >= QUIET / 2 + Duration::from_secs(5) + QUIET,
            "{:?}",
            began.elapsed()
        );
        call.await.unwrap();
    }
}
