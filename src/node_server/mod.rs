//! `node-server`: the CSI plugin itself, serving Identity (and, as it grows, Node and
//! Controller for its own local volumes) on a Unix socket.

mod identity;

use std::path::PathBuf;

use argh::{ArgsInfo, FromArgs};
use tokio_stream::wrappers::UnixListenerStream;

pub use identity::IdentityService;

use crate::proto::csi::identity_server::IdentityServer;
use crate::shutdown::Shutdown;
use crate::{BoxError, logging, socket};

/// The default driver name: domain-style, as the CSI spec requires.
pub const DEFAULT_DRIVER_NAME: &str = "nodekit.csi.local";

#[derive(FromArgs, ArgsInfo, Debug)]
/// A CSI plugin for node-local volumes, serving Identity, Node and Controller on a Unix socket.
pub struct Args {
    /// CSI endpoint to listen on: unix:///path, unix:/path or /path
    #[argh(option, default = "String::from(\"unix:///csi/csi.sock\")")]
    pub endpoint: String,
    /// driver name reported by GetPluginInfo (domain style, at most 63 characters)
    #[argh(option, default = "String::from(DEFAULT_DRIVER_NAME)")]
    pub driver_name: String,
    /// directory holding volumes and their state
    #[argh(option, default = "PathBuf::from(\"/var/lib/csi-nodekit\")")]
    pub state_dir: PathBuf,
    /// file mode of the CSI socket, octal
    #[argh(option, default = "String::from(\"0660\")")]
    pub socket_mode: String,
    /// numeric group ID to own the CSI socket
    #[argh(option)]
    pub socket_group: Option<u32>,
    /// log verbosity, klog style (0 = quiet)
    #[argh(option, default = "0")]
    pub v: u8,
    /// log format: text or json
    #[argh(option, default = "logging::Format::Text")]
    pub logging_format: logging::Format,
    /// print the version and exit
    #[argh(switch)]
    pub version: bool,
}

impl crate::ModeArgs for Args {
    fn version(&self) -> bool {
        self.version
    }
    fn logging(&self) -> (u8, logging::Format) {
        (self.v, self.logging_format)
    }
}

/// Validates the arguments, binds the socket and serves until SIGTERM or SIGINT.
pub fn run(args: Args) -> Result<(), BoxError> {
    let path = socket::parse_address(&args.endpoint)?;
    let perms = socket::Permissions {
        mode: socket::parse_mode(&args.socket_mode)?,
        gid: args.socket_group,
    };
    let identity = IdentityService {
        driver_name: args.driver_name,
        state_dir: args.state_dir,
    };
    std::fs::create_dir_all(&identity.state_dir).map_err(|e| {
        format!(
            "create state directory {}: {e}",
            identity.state_dir.display()
        )
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let shutdown = Shutdown::on_signals()?;
        let (listener, _guard) = socket::bind_tokio(&path, perms)?;
        log::info!(
            "serving CSI driver {} on {}",
            identity.driver_name,
            path.display()
        );
        serve(listener, identity, shutdown).await
    })
}

/// Serves the CSI services on `listener` until `shutdown`, then finishes in-flight calls within
/// the grace period.
pub async fn serve(
    listener: tokio::net::UnixListener,
    identity: IdentityService,
    shutdown: Shutdown,
) -> Result<(), BoxError> {
    let server = tonic::transport::Server::builder()
        .add_service(IdentityServer::new(identity))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown.clone().wait());
    match crate::shutdown::run_with_grace(server, shutdown, crate::shutdown::GRACE_PERIOD).await {
        Some(result) => result.map_err(Into::into),
        None => Ok(()),
    }
}
