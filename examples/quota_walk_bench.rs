//! The quota check's walk (`csi_nodekit::linux::quota::escape_walk::walk`) over 10,000 files on this
//! machine's own filesystem, unpaced: wall and CPU time, warm and after dropping the caches
//! (root only). A filesystem without project IDs answers the ioctls with errors, which the walk
//! counts and goes on; the quota VM measures the same walk on XFS and ext4 with escapes set
//! back.
//!
//! Then the same walk making 10,000 symlinks and FIFOs of an escaped directory again in the
//! project ([`escape_walk::Remakes`]): this needs a filesystem with project IDs (XFS keeps
//! them without quota enforcement, so a loop-mounted XFS on this machine will do).
//!
//! `cargo run --example quota_walk_bench [-- DIR]` (DIR: where to make the tree; default a
//! temporary directory).

use std::ops::ControlFlow;
use std::path::PathBuf;

use csi_nodekit::linux::quota::escape_walk;

fn main() {
    let base = std::env::args().nth(1).map(PathBuf::from);
    let scratch = match &base {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .expect("scratch directory");
    let root = scratch.path();
    let (dirs, per_dir) = (100, 100);
    for d in 0..dirs {
        let dir = root.join(format!("d{d}"));
        std::fs::create_dir(&dir).expect("dir");
        for f in 0..per_dir {
            std::fs::write(dir.join(format!("f{f}")), b"x").expect("file");
        }
    }
    let fs_type = nix::sys::statfs::statfs(root)
        .map(|s| format!("{:?}", s.filesystem_type()))
        .unwrap_or_default();
    println!(
        "machine: {} CPUs, load {}; filesystem {fs_type} at {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim(),
        root.display()
    );
    for cache in ["warm", "cold"] {
        if cache == "cold" && std::fs::write("/proc/sys/vm/drop_caches", b"3").is_err() {
            println!("cold: not measured (dropping the caches needs root)");
            continue;
        }
        // The project ID the walk holds the tree to; nothing here has it, which is the most
        // work (every inode found, every set-back tried).
        let walk = escape_walk::walk(root, 1, None, None, &mut |_| ControlFlow::Continue(()))
            .expect("walk");
        let per = 10_000.0 / walk.tally.inodes as f64;
        println!(
            "quota check walk, {cache} cache, {} inodes: {:.1} ms wall, {:.1} ms CPU; per 10,000 \
             files {:.1} ms wall, {:.1} ms CPU",
            walk.tally.inodes,
            walk.wall.as_secs_f64() * 1e3,
            walk.cpu.as_secs_f64() * 1e3,
            walk.wall.as_secs_f64() * 1e3 * per,
            walk.cpu.as_secs_f64() * 1e3 * per,
        );
    }
    remakes(root);
    watch(root);
}

/// The write watch (`write_watch::WriteWatch`, root only): what it adds to a writer's write on
/// the watched filesystem, and what reading it costs per written file (the handle opened and
/// its path read, which is all a file outside the volumes costs the quota watch).
fn watch(base: &std::path::Path) {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    const WRITES: u32 = 200_000;
    const FILES: u32 = 10_000;
    let dir = base.join("watched");
    std::fs::create_dir_all(&dir).expect("dir");
    let mut file = std::fs::File::create(dir.join("busy")).expect("file");
    let mut writes = |label: &str| {
        let started = std::time::Instant::now();
        for _ in 0..WRITES {
            file.write_all(b"x").expect("write");
        }
        let each = started.elapsed().as_secs_f64() * 1e9 / f64::from(WRITES);
        println!("write watch: {WRITES} one-byte writes to one file, {label}: {each:.0} ns each");
    };
    writes("unwatched");
    let mut watch = match csi_nodekit::linux::quota::write_watch::WriteWatch::new(&dir) {
        Ok(watch) => watch,
        Err(e) => return println!("write watch: not measured ({e})"),
    };
    writes("watched");
    let mut merged = 0;
    watch.written(&mut |_| merged += 1).expect("read the watch");
    for f in 0..FILES {
        std::fs::write(dir.join(format!("f{f}")), b"x").expect("file");
    }
    let cpu = || {
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
            .map_or(0.0, |t| t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9)
    };
    let started = cpu();
    let (mut events, mut paths) = (0, 0);
    let overflowed = watch
        .written(&mut |fd| {
            events += 1;
            let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
            paths += usize::from(nix::fcntl::readlink(link.as_str()).is_ok());
        })
        .expect("read the watch");
    let each = (cpu() - started) * 1e6 / f64::from(events.max(1));
    println!(
        "write watch: the {WRITES} writes read as {merged} event(s); {FILES} files written, \
         {events} events read and {paths} paths resolved at {each:.2} µs CPU each{}",
        if overflowed {
            " (the queue overflowed)"
        } else {
            ""
        }
    );
}

/// 10,000 symlinks and FIFOs in a directory out of project 1, made again in it by one walk.
fn remakes(base: &std::path::Path) {
    const ENTRIES: u64 = 10_000;
    let root = base.join("remakes");
    let out = root.join("out");
    std::fs::create_dir_all(&out).expect("dir");
    // Out of the project, as a pod leaves it (the first walk put the tree above in it).
    if let Err(e) = csi_nodekit::linux::quota::clear_project(&out) {
        return println!("remakes: not measured ({e})");
    }
    for i in 0..ENTRIES {
        let name = out.join(format!("n{i}"));
        match i % 2 {
            0 => std::os::unix::fs::symlink("/nowhere", &name).expect("symlink"),
            _ => nix::unistd::mkfifo(&name, nix::sys::stat::Mode::S_IRUSR).expect("fifo"),
        }
    }
    let lift = || false;
    let mut remakes = escape_walk::Remakes {
        aside: &base.join(".aside"),
        lift: &lift,
        pending: Default::default(),
    };
    let walk = escape_walk::walk(&root, 1, None, Some(&mut remakes), &mut |_| {
        ControlFlow::Continue(())
    })
    .expect("walk");
    if walk.tally.remade == 0 {
        println!(
            "remakes: not measured ({})",
            walk.tally
                .first_error
                .as_deref()
                .unwrap_or("nothing made again")
        );
        return;
    }
    let per = ENTRIES as f64 / walk.tally.remade as f64;
    println!(
        "quota check walk making {} symlinks and FIFOs again: {:.1} ms wall, {:.1} ms CPU; per \
         10,000 {:.1} ms wall ({:.1} µs each)",
        walk.tally.remade,
        walk.wall.as_secs_f64() * 1e3,
        walk.cpu.as_secs_f64() * 1e3,
        walk.wall.as_secs_f64() * 1e3 * per,
        walk.wall.as_secs_f64() * 1e6 / walk.tally.remade as f64,
    );
}
