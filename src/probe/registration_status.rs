//! `probe registration`: "has the kubelet registered my driver?", answered by the registrar's
//! `/readyz` (which turns 200 only after the kubelet's NotifyRegistrationStatus(true)).
//! Nothing is written to disk, so it works with `readOnlyRootFilesystem`.

use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

use crate::gocompat::GoDuration;
use crate::runtime::Threads;
use crate::{BoxError, UsageError};

crate::mode_args! {
    #[derive(FromArgs, ArgsInfo, Debug)]
    #[argh(subcommand, name = "registration")]
    /// Exit 0 if the kubelet confirmed the driver's registration (asks the registrar's /readyz).
    pub struct Args {
        /// the registrar's --http-endpoint, :9809 meaning this host (default ":9809")
        #[argh(option, default = "String::from(\":9809\")")]
        pub http_endpoint: String,
        /// deadline for the answer (default 3s)
        #[argh(option, default = "GoDuration(Duration::from_secs(3))", arg_name = "duration")]
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
        crate::http::check_endpoint(&args.http_endpoint)
            .map_err(|e| UsageError::flag("--http-endpoint", &args.http_endpoint, e))?;
        if args.timeout.0.is_zero() {
            return Err(UsageError::flag("--timeout", "0s", "must be more than 0").into());
        }
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
