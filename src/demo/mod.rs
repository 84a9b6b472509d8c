//! `demo`: the whole node-side flow in one command, with no cluster, no container runtime and
//! no network. Act one runs `node-server`, `registrar` and `probe kubelet` as real processes
//! (this same binary) in a temporary directory and shows what the kubelet would have written;
//! act two creates, stages and publishes a volume and shows it mounted. Everything runs in a
//! private mount namespace and is taken down at the end, leaving nothing behind.
//!
//! `processes` starts the three modes as a DaemonSet would; `volume` is act two; `drawing` is
//! `--flow`, the demo's observations and the kubelet's calls in one diagram.

mod drawing;
mod processes;
mod volume;

use std::path::{Path, PathBuf};
use std::time::Duration;

use argh::{ArgsInfo, FromArgs};

use crate::BoxError;
use crate::flow::{FlowFile, Party, Stamp};
use crate::linux::mountinfo::MountTable;
use crate::runtime::Threads;
use drawing::Drawing;
use processes::{Child, Kubelet};

/// The demo's driver and node names.
const DRIVER: &str = "demo.nodekit.csi.local";
const NODE: &str = "demo-node";

crate::mode_args! {
    #[derive(FromArgs, ArgsInfo, Debug)]
    /// Run the whole registration flow and a volume's life on this machine (root; no cluster).
    pub struct Args {
        /// draw act one's registration flow as a sequence diagram in this file: .svg, or
        /// .mmd/.md (Mermaid)
        #[argh(option)]
        pub flow: Option<FlowFile>,
    }
}

/// The demo's directory layout, laid out as on a real node.
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn csi_socket(&self) -> PathBuf {
        self.root.join(format!("plugins/{DRIVER}/csi.sock"))
    }
    pub fn registry(&self) -> PathBuf {
        self.root.join("plugins_registry")
    }
    pub fn state(&self) -> PathBuf {
        self.root.join("state")
    }
    pub fn pods(&self) -> PathBuf {
        self.root.join("pods")
    }
}

/// Mounts made from here on stay in this process and its children, and vanish with them.
fn private_mount_namespace() -> Result<(), BoxError> {
    use nix::mount::{MsFlags, mount};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("a private mount namespace needs root (unshare: {e})"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("make mounts private: {e}"))?;
    Ok(())
}

fn make_root() -> Result<PathBuf, BoxError> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos();
    let root =
        std::env::temp_dir().join(format!("csi-nodekit-demo.{}.{stamp:x}", std::process::id()));
    std::fs::create_dir(&root).map_err(|e| format!("create {}: {e}", root.display()))?;
    Ok(root)
}

/// What the demo needs from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The demo's logging flags (`--v`, `--logging-format`, …), which its processes get too.
    pub logging: crate::logging::Options,
    /// Where to draw act one, if anywhere.
    pub flow: Option<FlowFile>,
}

/// The mode's entry from the command line.
pub fn main(args: Args) -> Result<(), BoxError> {
    run(Settings {
        logging: crate::cli::ModeArgs::logging(&args),
        flow: args.flow,
    })
}

pub fn run(settings: Settings) -> Result<(), BoxError> {
    private_mount_namespace()?;
    let layout = Layout { root: make_root()? };
    println!(
        "csi-nodekit demo in {} (--v=2 shows the processes' logs)\n",
        layout.root.display()
    );
    let outcome = crate::runtime::run(Threads::Current, acts(&layout, settings));
    let cleanup = cleanup(&layout);
    outcome.and(cleanup)
}

async fn acts(layout: &Layout, settings: Settings) -> Result<(), BoxError> {
    let log_flags = settings.logging.flags();
    let log_flags = &log_flags[..];
    let drawing = Drawing::new(settings.flow);
    println!("== Act one: registration (steps 1-7 of the flow) ==");
    let started = Stamp::now();
    let driver = Child::node_server(layout, DRIVER, NODE, log_flags)?;
    let csi_socket = layout.csi_socket();
    processes::wait_for_socket(&csi_socket, Duration::from_secs(10)).await?;
    drawing.socket_appeared(
        started,
        1,
        Party::Driver,
        "csi.sock",
        &csi_socket.display().to_string(),
    );
    println!(
        "1. node-server is serving {DRIVER} on {}",
        csi_socket.display()
    );
    let mut kubelet = Kubelet::start(layout, NODE, log_flags)?;
    let started = Stamp::now();
    let registrar = Child::registrar(layout, log_flags)?;
    let reg_socket = crate::plugin_registry::socket_path(&layout.registry(), DRIVER);
    processes::wait_for_socket(&reg_socket, Duration::from_secs(10)).await?;
    let name = reg_socket
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let at = drawing.socket_appeared(
        started,
        2,
        Party::Registrar,
        &name,
        &reg_socket.display().to_string(),
    );
    drawing.get_plugin_info(at, DRIVER);
    println!("2. registrar started; 3. it asks the driver its name (GetPluginInfo)");
    // Every attempt is drawn: a failed one is retried by the kubelet after its back-off.
    let registered = loop {
        let event = kubelet.next_event(Duration::from_secs(15)).await?;
        drawing.kubelet_event(&event);
        match event["event"].as_str() {
            Some("registered") => break event,
            Some("failed") => println!("   the kubelet failed, and retries: {}", event["reason"]),
            _ => {
                drawing.write()?;
                return Err(format!("registration did not succeed: {event}").into());
            }
        }
    };
    println!(
        "4. the kubelet found {}, called GetInfo",
        registered["socket"].as_str().unwrap_or("?")
    );
    println!(
        "5. then NodeGetInfo on {}: node ID {}",
        registered["endpoint"].as_str().unwrap_or("?"),
        registered["nodeID"]
    );
    println!("6. what the kubelet writes to the API server:");
    print_writes(&registered);
    println!(
        "7. NotifyRegistrationStatus(true); the registrar's /readyz now says: {}\n",
        registrar.readyz().await
    );
    drawing.write()?;

    println!("== Act two: a volume's life ==");
    volume::life(layout, &layout.csi_socket()).await?;

    println!("\n== Curtain: shutting down ==");
    registrar.stop()?;
    let gone = kubelet.next_event(Duration::from_secs(15)).await?;
    println!(
        "registrar stopped (SIGTERM): its socket is gone, and the kubelet: {}",
        gone["event"].as_str().unwrap_or("?")
    );
    kubelet.stop()?;
    driver.stop()?;
    println!("probe kubelet and node-server stopped (SIGTERM, exit 0)");
    Ok(())
}

fn print_writes(event: &serde_json::Value) {
    let pretty =
        |value: &serde_json::Value| serde_json::to_string_pretty(value).unwrap_or_default();
    println!("   Node annotations: {}", event["node"]["annotations"]);
    println!("   Node labels:      {}", event["node"]["labels"]);
    for line in pretty(&event["csiNode"]).lines() {
        println!("   {line}");
    }
}

/// Removes the demo directory after checking that nothing is mounted in it and no socket of
/// ours is left; refuses (and says so) rather than delete through a mount.
fn cleanup(layout: &Layout) -> Result<(), BoxError> {
    let mounted = mounts_under(&layout.root)?;
    if !mounted.is_empty() {
        return Err(format!(
            "not removing {}: still mounted: {mounted:?}",
            layout.root.display()
        )
        .into());
    }
    let sockets = [
        layout.csi_socket(),
        crate::plugin_registry::socket_path(&layout.registry(), DRIVER),
    ];
    let left: Vec<_> = sockets.iter().filter(|s| s.exists()).collect();
    std::fs::remove_dir_all(&layout.root)
        .map_err(|e| format!("remove {}: {e}", layout.root.display()))?;
    if !left.is_empty() {
        return Err(format!("sockets were left behind: {left:?}").into());
    }
    println!(
        "nothing left behind: no sockets, no mounts, {} removed",
        layout.root.display()
    );
    Ok(())
}

/// Mount points at or below `dir`, from the kernel's mount table (parsed as node-server
/// parses it: escapes, namespace mounts and all).
fn mounts_under(dir: &Path) -> Result<Vec<PathBuf>, BoxError> {
    let table = MountTable::read()?;
    Ok(table
        .mounts_under(dir)
        .map(|entry| entry.mount_point.clone())
        .collect())
}
