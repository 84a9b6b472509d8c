//! `probe`: every way to ask "is my driver healthy and registered?", and the kubelet's side of
//! registration for machines without a kubelet.
//!
//! - `serve` — a drop-in livenessprobe HTTP server (`argv[0]` = `livenessprobe`);
//! - `once` — one Probe call as an exec probe for images with no shell;
//! - `registration` (`registration_status`) — asks the registrar whether the kubelet confirmed
//!   registration;
//! - `kubelet` — the kubelet's plugin manager, emulated;
//! - `doctor` — why a driver is not registered, diagnosed read-only on a live node;
//! - `check` — one health check of the driver (CSI `Probe` under a deadline), which `serve`
//!   and `once` share.

mod check;
pub mod doctor;
pub mod kubelet;
pub mod once;
pub mod registration_status;
pub mod serve;

use argh::{ArgsInfo, FromArgs};

use crate::cli::ModeArgs;
use crate::{BoxError, UsageError, logging};

#[derive(FromArgs, ArgsInfo, Debug)]
/// Health and registration probes, a kubelet emulator, and a node doctor (why is a driver not
/// registered?).
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
    Serve(serve::Args),
    Once(once::Args),
    Registration(registration_status::Args),
    Kubelet(kubelet::Args),
    Doctor(doctor::Args),
}

impl crate::cli::ModeArgs for Args {
    fn version(&self) -> bool {
        self.version || self.chosen().is_some_and(ModeArgs::version)
    }
    fn logging(&self) -> logging::Options {
        self.chosen().map(ModeArgs::logging).unwrap_or_default()
    }
    fn ignored(&self) -> Vec<&'static str> {
        self.chosen().map(ModeArgs::ignored).unwrap_or_default()
    }
}

impl Args {
    /// The chosen subcommand's arguments, which carry the common flags.
    fn chosen(&self) -> Option<&dyn ModeArgs> {
        match &self.command {
            Some(Command::Serve(args)) => Some(args),
            Some(Command::Once(args)) => Some(args),
            Some(Command::Registration(args)) => Some(args),
            Some(Command::Kubelet(args)) => Some(args),
            Some(Command::Doctor(args)) => Some(args),
            None => None,
        }
    }
}

/// The mode's entry from the command line: the chosen probe's settings, then its run.
pub fn main(args: Args) -> Result<(), BoxError> {
    match args.command {
        Some(Command::Serve(args)) => serve::run(serve::Settings::from_args(args)?),
        Some(Command::Once(args)) => once::run(once::Settings::from_args(args)?),
        Some(Command::Registration(args)) => {
            registration_status::run(registration_status::Settings::from_args(args)?)
        }
        Some(Command::Kubelet(args)) => kubelet::run(kubelet::Settings::from_args(args)?),
        Some(Command::Doctor(args)) => doctor::run(doctor::Settings::from_args(args)?),
        None => Err(UsageError::new(
            "a subcommand is required: serve, once, registration, kubelet or doctor",
        )
        .into()),
    }
}
