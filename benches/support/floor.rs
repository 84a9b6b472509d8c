//! The kernel's floor under a publish+unpublish pair: the same syscalls alone, in one thread,
//! with nothing around them (no gRPC, no checks, no records). `scripts/bench-node-scale.sh`
//! prints it next to node-server's pairs, at the same size of the mount table, so the share of
//! a pair that is the kernel's own work can be read off.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags};

/// Calls per second and their latency percentiles.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    pub count: usize,
    pub per_second: f64,
    pub p50: Duration,
    pub p99: Duration,
}

impl Rate {
    /// From every call's latency, taken over `elapsed` in all.
    pub fn of(mut latencies: Vec<Duration>, elapsed: Duration) -> Self {
        latencies.sort();
        let at = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p).round() as usize];
        Self {
            count: latencies.len(),
            per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.0}/s (p50 {:.3} ms, p99 {:.3} ms)",
            self.per_second,
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3
        )
    }
}

/// Runs `pair` again and again for `seconds` in this thread.
fn repeat(seconds: f64, mut pair: impl FnMut()) -> Rate {
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut latencies = Vec::new();
    while Instant::now() < deadline {
        let t = Instant::now();
        pair();
        latencies.push(t.elapsed());
    }
    Rate::of(latencies, started.elapsed())
}

/// A directory volume's pair as syscalls: mkdir the target, bind the staging mount on it,
/// umount, rmdir. Staged as node-server stages: a bind of a data directory under `dir`.
pub fn directory(dir: &Path, seconds: f64) -> Rate {
    let data = dir.join("floor-data");
    let staging = dir.join("floor-staging");
    let target = dir.join("floor-target");
    for d in [&data, &staging] {
        std::fs::create_dir_all(d).expect("floor dirs");
    }
    bind(&data, &staging);
    let rate = repeat(seconds, || {
        std::fs::create_dir(&target).expect("mkdir");
        bind(&staging, &target);
        nix::mount::umount2(&target, MntFlags::empty()).expect("umount");
        std::fs::remove_dir(&target).expect("rmdir");
    });
    nix::mount::umount2(&staging, MntFlags::MNT_DETACH).expect("umount staging");
    rate
}

/// A block volume's pair as syscalls: create the target file, bind the device node `device`
/// on it, umount, unlink.
pub fn block(dir: &Path, device: &Path, seconds: f64) -> Rate {
    let target = dir.join("floor-block-target");
    repeat(seconds, || {
        std::fs::File::create_new(&target).expect("create");
        bind(device, &target);
        nix::mount::umount2(&target, MntFlags::empty()).expect("umount");
        std::fs::remove_file(&target).expect("unlink");
    })
}

fn bind(source: &Path, target: &Path) {
    nix::mount::mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .expect("bind mount");
}
