//! `probe kubelet`: the kubelet's plugin manager, emulated (steps 4–7 of the registration
//! flow): watch the plugin registry, register each plugin socket found, and print what the
//! kubelet would have written to the API server.

use std::path::PathBuf;

use argh::{ArgsInfo, FromArgs};

use crate::{BoxError, logging};

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(subcommand, name = "kubelet")]
/// Emulate the kubelet's plugin registration: watch a registry directory and register plugins.
pub struct Args {
    /// directory the kubelet watches for registration sockets
    #[argh(
        option,
        default = "PathBuf::from(\"/var/lib/kubelet/plugins_registry\")"
    )]
    pub plugins_registry: PathBuf,
    /// prefix for host paths returned by plugins, when running in a container
    #[argh(option)]
    pub host_root: Option<PathBuf>,
    /// node name for the CSINode object (default: $NODE_NAME or the host name)
    #[argh(option)]
    pub node_name: Option<String>,
    /// walk once, register everything found, print one report and exit
    #[argh(switch)]
    pub once: bool,
    /// report format: text or json
    #[argh(option, default = "String::from(\"text\")")]
    pub output: String,
    /// log verbosity, klog style (0 = quiet)
    #[argh(option, default = "0")]
    pub v: u8,
    /// log format: text or json
    #[argh(option, default = "logging::Format::Text")]
    pub logging_format: logging::Format,
}

/// Runs the emulator.
pub fn run(_args: Args) -> Result<(), BoxError> {
    Err("probe kubelet is not built yet".into())
}
