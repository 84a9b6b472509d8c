//! `probe kubelet`: the kubelet's plugin manager, emulated (steps 4–7 of the registration
//! flow): watch the plugin registry, register each plugin socket found, and print what the
//! kubelet would have written to the API server.
//!
//! - [`watcher`] — inotify on the registry, recursively; the walk at start.
//! - [`state`] — desired and actual state, operations in flight, what was written.
//! - [`reconciler`] — the 1 s loop: deregister, then register, one operation per socket path.
//! - [`handshake`] — one registration: GetInfo, validation, NodeGetInfo, notify.
//! - [`csi_versions`] — CSI version rules with the kubelet's error texts.
//! - [`csinode`] — the Node annotation, topology labels and the CSINode object.
//! - [`per_socket_backoff`] — 500 ms doubling to 2 m 2 s, per socket path (on the crate's one
//!   [`Doubling`](crate::backoff::Doubling)).
//! - [`output`] — events and the `--once` report, as text or JSON.

pub mod csi_versions;
pub mod csinode;
pub mod handshake;
pub mod output;
pub mod per_socket_backoff;
pub mod reconciler;
pub mod state;
pub mod watcher;

use std::path::PathBuf;
use std::sync::Arc;

use argh::{ArgsInfo, FromArgs};
use tokio::sync::mpsc::{self, UnboundedSender};

use crate::BoxError;
use crate::cli::values::{AbsolutePath, FlagValue};
use crate::flow::{Flow, FlowFile, Recorder};
use crate::runtime::Threads;
use crate::shutdown::Shutdown;
pub use output::{Event, Failure, NodeView, Output, Registration, Report, Retry};
use state::Shared;

crate::mode_args! {
    #[derive(FromArgs, ArgsInfo, Debug)]
    #[argh(subcommand, name = "kubelet")]
    /// Emulate the kubelet's plugin registration: watch a registry directory and register plugins.
    pub struct Args {
        /// directory the kubelet watches for registration sockets (default
        /// "/var/lib/kubelet/plugins_registry")
        #[argh(
            option,
            default = "AbsolutePath::known(\"/var/lib/kubelet/plugins_registry\")"
        )]
        pub plugins_registry: AbsolutePath,
        /// prefix for host paths returned by plugins, when running in a container
        #[argh(option)]
        pub host_root: Option<PathBuf>,
        /// node name for the CSINode object (default: $NODE_NAME or the host name)
        #[argh(option)]
        pub node_name: Option<String>,
        /// walk once, register everything found, print one report and exit
        #[argh(switch)]
        pub once: bool,
        /// report format: text or json (default "text")
        #[argh(option, default = "Output::Text")]
        pub output: Output,
        /// draw the calls seen as a sequence diagram in this file: .svg, or .mmd/.md (Mermaid);
        /// rewritten after every event
        #[argh(option)]
        pub flow: Option<FlowFile>,
    }
}

/// What the emulated kubelet needs to know.
#[derive(Debug, Clone)]
pub struct Config {
    /// The watched directory (the kubelet's `<root>/plugins_registry`).
    pub registry: PathBuf,
    /// Prefix for the host paths plugins give as endpoints.
    pub host_root: Option<PathBuf>,
    /// Name of the Node and the CSINode.
    pub node_name: String,
}

/// `--node-name`, else `$NODE_NAME`, else the host name lower-cased as the kubelet does.
pub(crate) fn node_name(given: Option<String>) -> Result<String, BoxError> {
    let name = crate::node_name::resolve(given)
        .map_err(|e| format!("cannot read the host name for the node name: {e}"))?;
    Ok(name.as_kubelet_names_it())
}

/// The registry could not be prepared, walked or watched.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Preparing, walking or starting to watch it: the error says so in the kubelet's words,
    /// path included.
    #[error(transparent)]
    Setup(#[from] std::io::Error),
    #[error("watching {}: {source}", registry.display())]
    Watch {
        registry: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Runs the emulator until `shutdown`, sending every event to `events`.
pub async fn watch(
    config: Config,
    events: UnboundedSender<Event>,
    shutdown: Shutdown,
) -> Result<(), RegistryError> {
    watch_drawn(config, events, shutdown, Recorder::off()).await
}

/// [`watch`], drawing every call and socket event into `flow`.
pub async fn watch_drawn(
    config: Config,
    events: UnboundedSender<Event>,
    shutdown: Shutdown,
    flow: Recorder,
) -> Result<(), RegistryError> {
    let shared = Arc::new(Shared::new(config.node_name.clone(), config.host_root).drawn(flow));
    let watcher = watcher::Watcher::start(&config.registry, shared.clone())?;
    log::info!(
        "watching {} for plugins of node {}",
        config.registry.display(),
        config.node_name
    );
    tokio::select! {
        result = watcher.run() => result.map_err(|source| RegistryError::Watch {
            registry: config.registry.clone(),
            source,
        }),
        () = reconciler::run(shared, events) => Ok(()),
        () = shutdown.wait() => Ok(()),
    }
}

/// Walks the registry once and registers every socket found, one after the other (so that
/// duplicate driver names resolve in walk order). A failure is reported, not retried.
pub async fn once(config: Config) -> Result<Report, RegistryError> {
    once_drawn(config, Recorder::off()).await
}

/// [`once`], drawing every call and socket event into `flow`.
pub async fn once_drawn(config: Config, flow: Recorder) -> Result<Report, RegistryError> {
    watcher::ensure_dir(&config.registry)?;
    let sockets = watcher::sockets(&config.registry)?;
    let shared = Shared::new(config.node_name, config.host_root).drawn(flow);
    let mut plugins = Vec::with_capacity(sockets.len());
    for socket in sockets {
        let identity = shared.socket_found(&socket);
        let mut calls = Vec::new();
        let result = handshake::register(&shared, &socket, identity, &mut calls).await;
        shared.flow.extend(calls);
        if let Err(failure) = &result {
            log::info!("failed {}: {}", socket.display(), failure.reason);
        }
        plugins.push((socket, result));
    }
    Ok(Report {
        registry: config.registry,
        plugins,
        node: shared.view(),
    })
}

/// The command line, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    pub config: Config,
    /// Walk once, print one report, exit.
    pub once: bool,
    pub output: Output,
    /// Where to draw the flow, if anywhere.
    pub flow: Option<FlowFile>,
}

impl Settings {
    pub fn from_args(args: Args) -> Result<Self, BoxError> {
        Ok(Self {
            output: args.output,
            once: args.once,
            flow: args.flow,
            config: Config {
                registry: args.plugins_registry.into_path(),
                host_root: args.host_root,
                node_name: node_name(args.node_name)?,
            },
        })
    }
}

/// Runs the emulator as the settings ask: one report, or events until SIGTERM or SIGINT.
pub fn run(settings: Settings) -> Result<(), BoxError> {
    let Settings {
        config,
        once: just_once,
        output,
        flow: file,
    } = settings;
    let flow = match file {
        Some(_) => Recorder::on(),
        None => Recorder::off(),
    };
    let title = format!("probe kubelet: {}", config.registry.display());
    let draw = move |flow: &Recorder| -> Result<(), BoxError> {
        match &file {
            Some(file) => Ok(file.write(&Flow::new(title.clone(), flow.arrows()))?),
            None => Ok(()),
        }
    };
    let threads = Threads::Multi {
        workers: 2,
        blocking: None,
    };
    if just_once {
        return crate::runtime::run(threads, async move {
            let report = once_drawn(config, flow.clone()).await?;
            draw(&flow)?;
            crate::cli::print_line(&report.render(output))?;
            match report.problem() {
                None => Ok(()),
                Some(problem) => Err(problem.into()),
            }
        });
    }
    crate::runtime::serve(threads, |shutdown| async move {
        let (sender, mut events) = mpsc::unbounded_channel::<Event>();
        let printing = async {
            while let Some(event) = events.recv().await {
                if !printed(&event.render(output)) {
                    break;
                }
                if let Err(e) = draw(&flow) {
                    log::error!("{e}");
                }
            }
        };
        let result = tokio::select! {
            result = watch_drawn(config, sender, shutdown, flow.clone()) => result.map_err(Into::into),
            () = printing => Ok(()),
        };
        // Events that were already queued when the signal came are still printed.
        while let Ok(event) = events.try_recv() {
            if !printed(&event.render(output)) {
                break;
            }
        }
        result.and(draw(&flow))
    })
}

/// Prints one event; `false` once nobody reads them any more (the reader went away, or
/// standard output failed, which is logged): the watch then ends.
fn printed(text: &str) -> bool {
    crate::cli::print_line(text).unwrap_or_else(|e| {
        log::error!("printing an event: {e}");
        false
    })
}
