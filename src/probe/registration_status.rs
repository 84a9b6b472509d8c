//! `probe registration`: "has the kubelet registered my driver?", answered by the registrar's
//! `/readyz` (which turns 200 only after the kubelet's NotifyRegistrationStatus(true)).
//! Nothing is written to disk, so it works with `readOnlyRootFilesystem`.

use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

use crate::BoxError;
use crate::cli::values::{FlagValue, HttpEndpoint, PositiveDuration};
use crate::runtime::Threads;

crate::mode_args! {
    #[derive(FromArgs, ArgsInfo, Debug)]
    #[argh(subcommand, name = "registration")]
    /// Exit 0 if the kubelet confirmed the driver's registration (asks the registrar's /readyz).
    pub struct Args {
        /// the registrar's --http-endpoint, :9809 meaning this host (default ":9809")
        #[argh(option, default = "HttpEndpoint::known(\":9809\")")]
        pub http_endpoint: HttpEndpoint,
        /// deadline for the answer (default 3s)
        #[argh(option, default = "PositiveDuration::from_secs(3)", arg_name = "duration")]
        pub timeout: PositiveDuration,
    }
}

/// The command line, as the question uses it (its values were checked while parsing).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The registrar's HTTP endpoint.
    pub http_endpoint: String,
    pub timeout: Duration,
}

impl Settings {
    pub fn from_args(args: Args) -> Result<Self, BoxError> {
        Ok(Self {
            http_endpoint: args.http_endpoint.into_string(),
            timeout: args.timeout.get(),
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
