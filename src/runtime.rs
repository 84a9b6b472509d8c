//! The one place a mode builds its tokio runtime, and with it the signal-driven [`Shutdown`]:
//! every mode's `run` is "settings in, runtime up, serve until a signal".

use std::future::Future;

use crate::BoxError;
use crate::shutdown::Shutdown;

/// Blocking work that never reported back (it panicked or was cancelled).
#[derive(Debug, thiserror::Error)]
#[error("worker failed: {0}")]
pub struct WorkerError(#[from] pub tokio::task::JoinError);

/// How many threads a mode's runtime has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// One thread: the sidecars do little, and every thread costs memory on every node.
    Current,
    /// `workers` async threads; blocking work (syscalls, fsync) on at most `blocking` more
    /// (`None`: tokio's default).
    Multi {
        workers: usize,
        blocking: Option<usize>,
    },
}

/// Every mode's work starts here, so the lines kept until then are logged here.
fn build(threads: Threads) -> std::io::Result<tokio::runtime::Runtime> {
    crate::logging::log_deferred();
    let mut builder = match threads {
        Threads::Current => tokio::runtime::Builder::new_current_thread(),
        Threads::Multi { workers, blocking } => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(workers);
            if let Some(blocking) = blocking {
                builder.max_blocking_threads(blocking);
            }
            builder
        }
    };
    builder.enable_all().build()
}

/// Runs a task that ends by itself (`probe once`, `probe registration`, `kubelet --once`); a
/// signal stops it the default way.
pub fn run<T>(
    threads: Threads,
    task: impl Future<Output = Result<T, BoxError>>,
) -> Result<T, BoxError> {
    build(threads)?.block_on(task)
}

/// [`run`] for a task whose blocking work may never return (a `stat` through a hung network
/// mount, given up on by a timeout): once the task is done, the runtime's threads are left
/// behind instead of waited for, so the process can exit.
pub fn run_detached<T>(
    threads: Threads,
    task: impl Future<Output = Result<T, BoxError>>,
) -> Result<T, BoxError> {
    let runtime = build(threads)?;
    let result = runtime.block_on(task);
    runtime.shutdown_background();
    result
}

/// Runs a server until SIGTERM or SIGINT: `serve` gets the [`Shutdown`] the first signal
/// starts (a second one exits at once, see [`Shutdown::on_signals`]).
pub fn serve<T, F, Fut>(threads: Threads, serve: F) -> Result<T, BoxError>
where
    F: FnOnce(Shutdown) -> Fut,
    Fut: Future<Output = Result<T, BoxError>>,
{
    let runtime = build(threads)?;
    let served = runtime.block_on(async {
        let shutdown = Shutdown::on_signals()?;
        serve(shutdown).await
    });
    // The server is done, its grace period included. Blocking work still running (a syscall
    // stuck on a hung filesystem, work whose call the grace period already answered) gets a
    // moment more and is then left to the exit: dropping the runtime would wait for it for
    // ever, and the process must stop within the grace period Kubernetes gives it.
    runtime.shutdown_timeout(LEFTOVER_WORK);
    served
}

/// How long blocking work may go on once a server is done (see [`serve`]).
const LEFTOVER_WORK: std::time::Duration = std::time::Duration::from_secs(1);
