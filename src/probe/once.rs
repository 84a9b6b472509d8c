//! `probe once`: one Probe call as an exec probe, for images that have no shell and no curl.
//! Exit 0 when the driver is ready; 1 with the reason otherwise. It runs every few seconds on
//! every node, so it does the least it can: one thread, one connection, one call.

use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

use super::check;
use crate::gocompat::GoDuration;
use crate::{BoxError, logging, socket};

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "once")]
/// Call the driver's Probe once: exit 0 if it is ready, 1 with the reason otherwise.
pub struct Args {
    /// address of the CSI driver socket
    #[argh(option, default = "String::from(\"/run/csi/socket\")")]
    pub csi_address: String,
    /// deadline for connecting and calling Probe (Go duration)
    #[argh(option, default = "GoDuration(Duration::from_secs(3))")]
    pub probe_timeout: GoDuration,
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

pub fn run(args: Args) -> Result<(), BoxError> {
    let address = socket::parse_address(&args.csi_address)?;
    let timeout = args.probe_timeout.0;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let deadline = tokio::time::Instant::now() + timeout;
        let channel = check::connect(&address, deadline, timeout).await?;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        check::probe(channel, left, "", None).await?;
        log::debug!("driver at {} is ready", address.display());
        Ok(())
    })
}
