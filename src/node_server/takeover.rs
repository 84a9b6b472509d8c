//! Becoming the state directory's one node-server: take its lock (`state::owner`), or, when
//! another instance holds it, say so once and either exit (`--state-dir-busy=exit`) or wait
//! without touching the directory and take over the moment the holder is gone — how a
//! `maxSurge` DaemonSet rollout hands a node from one generation to the next.
//!
//! While waiting, if the CSI socket is free (the holder serves another one: two DaemonSets on
//! one hostPath), it is bound and answers every Identity call UNAVAILABLE naming the holder,
//! so a liveness probe says why; once the lock is ours the same listening socket serves the
//! plugin. When the holder serves the same socket (a rollout), the socket is left to it.

use std::sync::Arc;
use std::time::Instant;

use super::grpc::identity::WaitingIdentity;
use super::server::bounded_server;
use super::settings::{Settings, StateDirBusy};
use super::state::owner::{Owner, OwnerError};
use super::state::state_dir::StateDir;
use crate::BoxError;
use crate::proto::csi::identity_server::IdentityServer;
use crate::shutdown::Shutdown;
use crate::socket::{self, SocketError, SocketGuard};

/// The socket bound while waiting, handed on to the plugin.
pub struct Bound {
    pub listener: std::os::unix::net::UnixListener,
    pub guard: SocketGuard,
}

/// The state directory, ours, and the socket if it was bound while waiting.
pub struct Taken {
    pub owner: Owner,
    pub socket: Option<Bound>,
}

/// Takes the state directory as `--state-dir-busy` says (see the module docs); `None` when
/// shutdown began while waiting for it.
pub async fn take(settings: &Settings, shutdown: Shutdown) -> Result<Option<Taken>, BoxError> {
    let state_dir = StateDir::open(&settings.config.state_dir)?;
    let busy = match Owner::try_take(&state_dir) {
        Ok(owner) => {
            return Ok(Some(Taken {
                owner,
                socket: None,
            }));
        }
        Err(busy @ OwnerError::Busy { .. }) => busy,
        Err(e) => return Err(e.into()),
    };
    if settings.state_dir_busy == StateDirBusy::Exit {
        return Err(format!("{busy} (--state-dir-busy=exit)").into());
    }
    log::warn!("{busy}; waiting for it to exit before serving");
    let since = Instant::now();
    let (sender, lock) = tokio::sync::oneshot::channel();
    // A thread of its own, blocked in flock(2): the kernel wakes it the moment the holder's
    // file is closed. Not the blocking pool, whose threads the runtime waits for at exit.
    let waiting_on = state_dir.clone();
    std::thread::Builder::new()
        .name("state-dir-wait".into())
        .spawn(move || {
            // The receiver is gone only when shutdown began meanwhile.
            let _ = sender.send(Owner::wait(&waiting_on));
        })?;
    let socket = bind_if_free(settings)?;
    let waiting_server = socket
        .as_ref()
        .map(|bound| serve_waiting(bound, busy.to_string()))
        .transpose()?;
    let outcome = tokio::select! {
        owner = lock => Some(owner.map_err(|_| "the state directory's lock waiter is gone")??),
        () = shutdown.wait() => None,
    };
    if let Some(server) = waiting_server {
        server.abort();
    }
    let Some(owner) = outcome else {
        return Ok(None);
    };
    log::info!(
        "took over state directory {} after waiting {} ms",
        state_dir.root().display(),
        since.elapsed().as_millis()
    );
    Ok(Some(Taken { owner, socket }))
}

/// Binds the CSI socket unless another process listens on it (the holder, in a rollout).
fn bind_if_free(settings: &Settings) -> Result<Option<Bound>, BoxError> {
    match socket::bind(&settings.endpoint, settings.socket_perms) {
        Ok((listener, guard)) => Ok(Some(Bound { listener, guard })),
        Err(SocketError::InUse(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Serves [`WaitingIdentity`] on a second descriptor of the socket, so that stopping it leaves
/// the socket listening (connections queued meanwhile are the plugin's to accept).
fn serve_waiting(bound: &Bound, why: String) -> Result<tokio::task::JoinHandle<()>, BoxError> {
    let listener = bound.listener.try_clone()?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::UnixListener::from_std(listener)?;
    let identity = IdentityServer::new(WaitingIdentity(Arc::from(why)));
    let server = bounded_server()
        .add_service(identity)
        .serve_with_incoming(socket::grpc_incoming(listener));
    Ok(tokio::spawn(async move {
        if let Err(e) = server.await {
            log::warn!("serving while waiting for the state directory: {e}");
        }
    }))
}
