//! What the supervisor's steps (`supervise`, `ask_driver`, `stand_by`) share: their back-offs,
//! the sleep that ends at shutdown, what comes after a watch ([`Next`]), and why the registrar
//! gives up ([`GiveUp`]).

use std::path::PathBuf;
use std::time::Duration;

use crate::csi_spec::driver_name::InvalidDriverName;
use crate::shutdown::Shutdown;
use crate::socket::{self, SocketError};

/// Back-off after the kubelet rejects us, and between failed driver calls.
pub(super) const FIRST_BACKOFF: Duration = Duration::from_secs(1);
pub(super) const MAX_DRIVER_BACKOFF: Duration = Duration::from_secs(30);

/// Sleeps unless shutdown begins first; returns false on shutdown.
pub(super) async fn sleep_or_stop(delay: Duration, shutdown: &Shutdown) -> bool {
    tokio::select! {
        biased;
        () = shutdown.clone().wait() => false,
        () = tokio::time::sleep(delay) => true,
    }
}

/// Why the registrar gives up (everything else it waits out and retries).
#[derive(Debug, thiserror::Error)]
pub enum GiveUp {
    /// `--driver-wait-limit` ran out before the driver's socket answered.
    #[error(transparent)]
    Dial(#[from] socket::DialError),
    #[error("driver at {} gave no name within {limit:?}", address.display())]
    NoName { address: PathBuf, limit: Duration },
    #[error(transparent)]
    DriverName(#[from] InvalidDriverName),
    /// A non-socket where the registration socket goes, before we ever created one: a
    /// configuration error, as upstream treats it.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The socket the driver's name gives cannot be bound anywhere: retrying cannot help.
    #[error(
        "--plugin-registration-path {}: the registration socket of driver {driver}, {}, is {} \
         bytes, more than a socket address holds ({}); give a shorter directory",
        dir.display(),
        path.display(),
        path.as_os_str().len(),
        socket::MAX_PATH_BYTES
    )]
    SocketPathTooLong {
        dir: PathBuf,
        driver: String,
        path: PathBuf,
    },
}

/// Why the watch over one registration socket ended.
pub(super) enum Next {
    Shutdown,
    /// Re-create the socket (after the given pause).
    Recreate(Duration),
    /// The driver restarted: ask its name again, then re-create.
    AskDriver,
}
