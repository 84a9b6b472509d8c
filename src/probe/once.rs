//! `probe once`: one Probe call as an exec probe, for images that have no shell and no curl.
//! Exit 0 when the driver is ready; 1 with the reason otherwise. It runs every few seconds on
//! every node, so it does the least it can: one thread, one connection, one call.

use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

use super::check;
use crate::BoxError;
use crate::cli::values::{FlagValue, PositiveDuration, SocketAddress};
use crate::runtime::Threads;

crate::mode_args! {
    #[derive(FromArgs, ArgsInfo, Debug)]
    #[argh(subcommand, name = "once")]
    /// Call the driver's Probe once: exit 0 if it is ready, 1 with the reason otherwise.
    pub struct Args {
        /// address of the CSI driver socket (default "/run/csi/socket")
        #[argh(option, default = "SocketAddress::known(\"/run/csi/socket\")")]
        pub csi_address: SocketAddress,
        /// deadline for connecting and calling Probe (default 3s)
        #[argh(option, default = "PositiveDuration::from_secs(3)", arg_name = "duration")]
        pub probe_timeout: PositiveDuration,
    }
}

/// The command line, as the probe uses it (its values were checked while parsing).
#[derive(Debug, Clone)]
pub struct Settings {
    pub csi_address: std::path::PathBuf,
    pub probe_timeout: Duration,
}

impl Settings {
    pub fn from_args(args: Args) -> Result<Self, BoxError> {
        Ok(Self {
            csi_address: args.csi_address.into_path(),
            probe_timeout: args.probe_timeout.get(),
        })
    }
}

/// One probe: `Ok` when the driver is ready.
pub fn run(settings: Settings) -> Result<(), BoxError> {
    let Settings {
        csi_address: address,
        probe_timeout: timeout,
    } = settings;
    crate::runtime::run(Threads::Current, async {
        let deadline = tokio::time::Instant::now() + timeout;
        let channel = check::connect(&address, deadline, timeout).await?;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        check::probe(channel, left).await?;
        log::debug!("driver at {} is ready", address.display());
        Ok(())
    })
}
