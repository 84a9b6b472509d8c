//! `probe`: every way to ask "is my driver healthy and registered?", and the kubelet's side of
//! registration for machines without a kubelet.
//!
//! - `serve` — a drop-in livenessprobe HTTP server (`argv[0]` = `livenessprobe`);
//! - `once` — one Probe call as an exec probe for images with no shell;
//! - `registration` — asks the registrar whether the kubelet confirmed registration;
//! - `kubelet` — the kubelet's plugin manager, emulated.

pub mod kubelet;

use argh::{ArgsInfo, FromArgs};

use crate::{BoxError, UsageError, logging};

#[derive(FromArgs, ArgsInfo, Debug)]
/// Health and registration probes, and a kubelet emulator.
pub struct Args {
    /// print the version and exit
    #[argh(switch)]
    pub version: bool,
    #[argh(subcommand)]
    pub command: Option<Command>,
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand)]
pub enum Command {
    Kubelet(kubelet::Args),
}

impl crate::ModeArgs for Args {
    fn version(&self) -> bool {
        self.version
    }
    fn logging(&self) -> (u8, logging::Format) {
        match &self.command {
            Some(Command::Kubelet(args)) => (args.v, args.logging_format),
            None => (0, logging::Format::Text),
        }
    }
}

/// Runs the chosen probe.
pub fn run(args: Args) -> Result<(), BoxError> {
    match args.command {
        Some(Command::Kubelet(args)) => kubelet::run(args),
        None => Err(UsageError(
            "a subcommand is required: serve, once, registration or kubelet".into(),
        )
        .into()),
    }
}
