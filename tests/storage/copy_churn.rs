//! Copies of a tree whose names churn while it is walked (a pod replacing symlinks, fifos,
//! files and directories under the same names): every copy succeeds, and what vanished or kept
//! changing type is left out and counted, never an error.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use csi_nodekit::linux::copy::{self, Options};

const COPIES: usize = 300;
const NAMES: usize = 24;

/// Turns `dir/<name>` into a symlink, a fifo, a file and a directory in turn, until `stop`.
fn churn(dir: &Path, names: std::ops::Range<usize>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        for i in names.clone() {
            let path = dir.join(format!("churn-{i}"));
            let _ = std::os::unix::fs::symlink("target", &path);
            let _ = std::fs::remove_file(&path);
            let _ = nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU);
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::write(&path, b"data");
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::create_dir(&path);
            let _ = std::fs::remove_dir(&path);
        }
    }
}

/// Two threads churning [`NAMES`] names in a directory, until stopped.
pub(crate) struct Churn {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Churn {
    pub(crate) fn start(dir: &Path) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = [0..NAMES / 2, NAMES / 2..NAMES]
            .into_iter()
            .map(|names| {
                let (dir, stop) = (dir.to_owned(), Arc::clone(&stop));
                std::thread::spawn(move || churn(&dir, names, &stop))
            })
            .collect();
        Self { stop, threads }
    }

    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().unwrap();
        }
    }
}

#[test]
fn copies_of_a_churning_tree_all_succeed_and_count_what_they_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for i in 0..20 {
        std::fs::write(src.join(format!("kept-{i}")), b"kept").unwrap();
    }
    let churn = Churn::start(&src);
    let (mut failed, mut left_out) = (Vec::new(), 0);
    for n in 0..COPIES {
        let dst = dir.path().join(format!("copy-{n}"));
        match copy::copy_tree(&src, &dst, Options::default()) {
            Ok(report) => {
                left_out += report.churned();
                for i in 0..20 {
                    assert!(
                        dst.join(format!("kept-{i}")).exists(),
                        "copy {n} lost kept-{i}"
                    );
                }
                copy::remove_tree(&dst).unwrap();
            }
            Err(e) => failed.push(format!("copy {n}: {e}")),
        }
    }
    churn.stop();
    println!(
        "{COPIES} copies under churn: {} failed, {left_out} entries left out",
        failed.len()
    );
    assert!(failed.is_empty(), "{failed:#?}");
    assert!(
        left_out > 0,
        "the churn never reached a walk: the test tried nothing"
    );
}
