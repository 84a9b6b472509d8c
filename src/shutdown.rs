//! One shutdown signal for every server in the process: SIGTERM or SIGINT starts a graceful
//! stop (stop accepting, let in-flight calls finish within a grace period, drop the socket
//! guards); a second signal removes our sockets and exits at once.

use std::future::Future;
use std::time::Duration;

use signal_hook::consts::{SIGINT, SIGTERM};
use tokio::sync::watch;
use tokio_stream::StreamExt;

/// How long in-flight calls may run after a shutdown signal before we stop waiting for them.
/// Kubernetes waits 30 s by default before SIGKILL; we stay well inside that.
pub const GRACE_PERIOD: Duration = Duration::from_secs(10);

/// A cloneable handle that resolves once shutdown has begun.
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Receiver<bool>);

/// Starts a shutdown by hand (tests, or a mode that decides to stop by itself).
#[derive(Debug)]
pub struct Trigger(watch::Sender<bool>);

impl Trigger {
    pub fn fire(&self) {
        self.0.send_replace(true);
    }
}

impl Shutdown {
    /// A shutdown that only the returned trigger can start.
    pub fn manual() -> (Trigger, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (Trigger(tx), Shutdown(rx))
    }

    /// A shutdown started by SIGTERM or SIGINT. Must be called inside a tokio runtime.
    pub fn on_signals() -> std::io::Result<Shutdown> {
        let mut signals = signal_hook_tokio::Signals::new([SIGTERM, SIGINT])?;
        let (trigger, shutdown) = Self::manual();
        tokio::spawn(async move {
            if let Some(signal) = signals.next().await {
                log::info!("received {}, shutting down", signal_name(signal));
                trigger.fire();
            }
            if let Some(signal) = signals.next().await {
                log::warn!("received a second {}, exiting now", signal_name(signal));
                crate::socket::remove_owned_sockets();
                // The one exit outside main: the process was asked twice and must not wait for
                // the runtime. 128 + signal number is the shell's convention for it.
                std::process::exit(128 + signal);
            }
        });
        Ok(shutdown)
    }

    /// A shutdown that begins `delay` after this one does: the end of a grace period.
    /// Must be called inside a tokio runtime.
    pub fn later(&self, delay: Duration) -> Shutdown {
        let (trigger, later) = Self::manual();
        let begun = self.clone();
        tokio::spawn(async move {
            begun.wait().await;
            tokio::time::sleep(delay).await;
            trigger.fire();
        });
        later
    }

    pub fn is_started(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves when shutdown begins (or when its trigger is gone, which means the same).
    pub async fn wait(mut self) {
        let _ = self.0.wait_for(|started| *started).await;
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        _ => "signal",
    }
}

/// Runs a server future (which must itself stop accepting on `shutdown`) and, once shutdown
/// has begun, waits at most `grace` for it to finish its in-flight work, or until `settled`
/// (nothing left worth waiting for, such as no call in flight) resolves.
/// Returns `None` when it was not waited for to the end.
pub async fn run_with_grace<F: Future>(
    server: F,
    shutdown: Shutdown,
    grace: Duration,
    settled: impl Future<Output = ()>,
) -> Option<F::Output> {
    tokio::pin!(server);
    tokio::select! {
        output = &mut server => return Some(output),
        () = shutdown.wait() => {}
    }
    tokio::select! {
        output = &mut server => Some(output),
        () = settled => {
            log::debug!("no call in flight; not waiting for idle connections to close");
            None
        }
        () = tokio::time::sleep(grace) => {
            log::warn!("in-flight calls did not finish within {grace:?}; stopping anyway");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_later_shutdown_begins_its_delay_after_the_first() {
        let (trigger, shutdown) = Shutdown::manual();
        let later = shutdown.later(Duration::from_secs(10));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!later.is_started(), "not before the first one");
        trigger.fire();
        let began = tokio::time::Instant::now();
        later.wait().await;
        assert_eq!(began.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test]
    async fn a_fired_trigger_resolves_every_clone() {
        let (trigger, shutdown) = Shutdown::manual();
        let other = shutdown.clone();
        assert!(!shutdown.is_started());
        trigger.fire();
        shutdown.wait().await;
        other.wait().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_that_overruns_the_grace_period_is_abandoned() {
        let (trigger, shutdown) = Shutdown::manual();
        trigger.fire();
        let stuck = std::future::pending::<()>();
        assert_eq!(
            run_with_grace(
                stuck,
                shutdown,
                Duration::from_secs(1),
                std::future::pending()
            )
            .await,
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_settled_server_is_not_waited_for_to_the_end_of_the_grace_period() {
        let (trigger, shutdown) = Shutdown::manual();
        trigger.fire();
        let waiting_for_idle_connections = std::future::pending::<()>();
        let began = tokio::time::Instant::now();
        let settled = tokio::time::sleep(Duration::from_secs(1));
        let output = run_with_grace(
            waiting_for_idle_connections,
            shutdown,
            Duration::from_secs(10),
            settled,
        )
        .await;
        assert_eq!(output, None);
        assert_eq!(began.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_server_that_finishes_in_time_returns_its_output() {
        let (trigger, shutdown) = Shutdown::manual();
        let server = {
            let shutdown = shutdown.clone();
            async move {
                shutdown.wait().await;
                7
            }
        };
        trigger.fire();
        assert_eq!(
            run_with_grace(
                server,
                shutdown,
                Duration::from_secs(5),
                std::future::pending()
            )
            .await,
            Some(7)
        );
    }
}
