//! What the storage benchmarks share: scratch filesystems, the volume they copy (files of
//! incompressible bytes in directories of 100), `BENCH_FS` and `BENCH_DIR`.

use std::fs;
use std::path::Path;

#[path = "../../tests/common/scratch_fs.rs"]
pub mod scratch_fs;
use scratch_fs::Kind;

pub const GIB: u64 = 1 << 30;
pub const MIB: u64 = 1 << 20;

/// Bytes that neither compress nor dedupe.
pub fn fill(buf: &mut [u8], mut seed: u64) {
    seed = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf.chunks_mut(8) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        chunk.copy_from_slice(&seed.to_le_bytes()[..chunk.len()]);
    }
}

/// `files` files in directories of 100, `bytes` in all, under `root` (created if missing).
pub fn volume(root: &Path, files: u64, bytes: u64) {
    let size = (bytes / files) as usize;
    let mut buf = vec![0u8; size];
    for i in 0..files {
        let dir = root.join(format!("d{:02}", i / 100));
        if i % 100 == 0 {
            fs::create_dir_all(&dir).expect("mkdir");
        }
        fill(&mut buf, i);
        fs::write(dir.join(format!("f{i:05}")), &buf).expect("write");
    }
}

pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

/// `BENCH_FS=xfs,ext4` limits the filesystems (default: all).
pub fn selected(kind: Kind) -> bool {
    std::env::var("BENCH_FS").map_or(true, |list| {
        list.split(',')
            .any(|name| name.eq_ignore_ascii_case(&format!("{kind:?}")))
    })
}

/// Checks for root and points temporary files (the scratch images) at `BENCH_DIR`. Call it
/// before any thread starts.
pub fn prepare(part: &str) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root: run scripts/bench-storage.sh {part}"
    );
    if let Ok(dir) = std::env::var("BENCH_DIR") {
        // SAFETY: no other thread runs yet (the caller's promise); tempfile reads TMPDIR.
        unsafe { std::env::set_var("TMPDIR", dir) };
    }
}

/// node-server served in-process on `<dir>/csi.sock` with its state in `state` (sizes
/// overcommitted: a scratch filesystem without project quotas only accounts them), until
/// [`Served::stop`].
pub struct Served {
    pub channel: tonic::transport::Channel,
    trigger: csi_nodekit::shutdown::Trigger,
    server: tokio::task::JoinHandle<Result<(), csi_nodekit::BoxError>>,
}

impl Served {
    pub async fn start(dir: &Path, state: &Path) -> Self {
        use csi_nodekit::node_server::state::{owner::Owner, state_dir::StateDir};
        use csi_nodekit::node_server::{Config, Plugin, Seams, serve};
        let mut config = Config::new("bench.nodekit.io", "bench", state);
        config.overcommit = true;
        let owner = Owner::try_take(&StateDir::open(state).expect("state")).expect("owner");
        let plugin = Plugin::open(config, owner, Seams::linux()).expect("open");
        let socket = dir.join("csi.sock");
        let perms = csi_nodekit::socket::Permissions {
            mode: 0o600,
            gid: None,
        };
        let (listener, guard) = csi_nodekit::socket::bind_tokio(&socket, perms).expect("bind");
        let (trigger, shutdown) = csi_nodekit::shutdown::Shutdown::manual();
        let server = tokio::spawn(async move {
            let _guard = guard;
            serve(listener, plugin, shutdown).await
        });
        let channel = csi_nodekit::socket::connect(&socket)
            .await
            .expect("connect");
        Self {
            channel,
            trigger,
            server,
        }
    }

    pub async fn stop(self) {
        self.trigger.fire();
        self.server.await.expect("join").expect("serve");
    }
}
