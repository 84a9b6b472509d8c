//! `probe registration`: "has the kubelet registered my driver?", answered by the registrar's
//! `/readyz` (which turns 200 only after the kubelet's NotifyRegistrationStatus(true)).
//! Nothing is written to disk, so it works with `readOnlyRootFilesystem`.

use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

use crate::BoxError;
use crate::gocompat::GoDuration;
use crate::runtime::Threads;

crate::mode_args! {
    #[derive(FromArgs, ArgsInfo, Debug)]
    #[argh(subcommand, name = "registration")]
    /// Exit 0 if the kubelet confirmed the driver's registration (asks the registrar's /readyz).
    pub struct Args {
        /// the registrar's --http-endpoint (":9809" means this host)
        #[argh(option, default = "String::from(\":9809\")")]
        pub http_endpoint: String,
        /// deadline for the answer (Go duration)
        #[argh(option, default = "GoDuration(Duration::from_secs(3))")]
        pub timeout: GoDuration,
    }
}

/// The command line, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The registrar's HTTP endpoint.
    pub http_endpoint: String,
    pub timeout: Duration,
}

impl Settings {
    pub fn from_args(args: Args) -> Result<Self, BoxError> {
        Ok(Self {
            http_endpoint: args.http_endpoint,
            timeout: args.timeout.0,
        })
    }
}

/// One question to the registrar: `Ok` when the kubelet confirmed the registration.
pub fn run(settings: Settings) -> Result<(), BoxError> {
    let ask = crate::http::get(&settings.http_endpoint, "/readyz", settings.timeout);
    let (status, body) = crate::runtime::run(Threads::Current, async { Ok(ask.await?) })?;
    match status {
        200 => Ok(()),
        _ => Err(format!("not registered: {}", body.trim()).into()),
    }
}
