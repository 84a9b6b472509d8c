//! `--flow=FILE` of `demo`, `probe kubelet` and `probe doctor`: the drawn run read back — the
//! SVG parsed as XML (lifelines, one arrow per call, failed and skipped steps), the Mermaid
//! text checked against the sequence-diagram grammar (`mermaid_grammar`, our own small
//! parser), the SVG shown by a real headless Chromium (`browser`), and bad `--flow` values
//! refused before anything runs.

mod browser;
mod drawn;
mod mermaid_grammar;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::common::binary;
use crate::common::fake_plugin::{Bind, NodeAnswer, csi_plugin, node, registration};

/// `probe kubelet --once --flow=<file>` against a registry with a good plugin `a.csi` and,
/// when `refused`, a plugin `b.csi` of an unsupported CSI version; the command's output.
pub async fn kubelet_once(dir: &Path, file: &Path, refused: bool) -> Output {
    let registry = dir.join("registry");
    let driver_socket = dir.join("csi.sock");
    let _driver = node(&driver_socket, NodeAnswer::new("n1", 5, &[("zone", "z")]));
    let endpoint = driver_socket.display().to_string();
    let (_good, _) = registration(
        &registry.join("a-reg.sock"),
        Bind::AtPath,
        csi_plugin("a.csi", &endpoint),
    );
    let mut old = csi_plugin("b.csi", &endpoint);
    old.supported_versions = vec!["0.3.0".into()];
    let _bad = refused.then(|| registration(&registry.join("b-reg.sock"), Bind::AtPath, old));
    let mut command = Command::new(binary());
    command
        .args(["probe", "kubelet", "--node-name=node-a", "--once"])
        .arg(format!("--plugins-registry={}", registry.display()))
        .arg(format!("--flow={}", file.display()))
        .stdin(Stdio::null());
    tokio::task::spawn_blocking(move || command.output().expect("run probe kubelet"))
        .await
        .unwrap()
}
