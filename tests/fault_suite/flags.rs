//! Bad flag values, as manifests written years ago (or by hand) carry them: each is refused
//! before anything starts: exit 2, one line naming the flag, nothing on stdout.

use super::tally::Tally;
use crate::cli::flags::{BadFlag, bad_flag_values, refused_naming, run_as, unusable_flag_values};

#[test]
fn every_bad_flag_value_is_refused_naming_the_flag() {
    tally_refusals(
        "bad flag values of the registrar, livenessprobe and node-server",
        bad_flag_values(),
    );
}

#[test]
fn every_flag_that_would_start_but_cannot_work_is_refused_naming_the_flag() {
    tally_refusals(
        "flags that would start but cannot work (relative or long socket paths, --capacity=0, special socket modes, …)",
        unusable_flag_values(),
    );
}

fn tally_refusals(case: &'static str, flags: Vec<BadFlag>) {
    let mut tally = Tally::new(case);
    for (name, args, flag) in flags {
        let out = run_as(name, args);
        let what = format_args!(
            "{name} {args:?}: {:?}",
            String::from_utf8_lossy(&out.stderr)
        );
        tally.check(refused_naming(&out, flag), what);
    }
    tally.finish();
}

/// A `--plugin-registration-path` that is fine alone but whose socket, once the driver's name
/// is known, is longer than a socket address holds: the registrar exits 1 within a second,
/// one line naming the flag, the driver and the length (before: it retried every 2 s for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_socket_too_long_for_the_drivers_name_ends_the_registrar_naming_the_flag() {
    use crate::common::fake_driver::FakeDriver;
    use std::time::{Duration, Instant};
    let mut tally = Tally::new(
        "a --plugin-registration-path whose <driver>-reg.sock passes 107 bytes once the driver's \
         name is known",
    );
    for driver in ["a.example.io", &format!("{}.example.io", "d".repeat(51))] {
        let node = super::processes::Node::new();
        // Long enough that this driver's socket passes 107 bytes, short enough to be valid.
        let room = 107 - node.dir.path().as_os_str().len() - "/-reg.sock".len() - driver.len();
        let registry = node.dir.path().join("r".repeat(room + 1));
        let _driver = FakeDriver::start(&node.csi(), driver);
        let mut command = std::process::Command::new(crate::common::binary());
        command.args([
            "registrar".to_owned(),
            format!("--csi-address={}", node.csi().display()),
            format!(
                "--kubelet-registration-path={}",
                super::processes::HOST_PATH
            ),
            format!("--plugin-registration-path={}", registry.display()),
        ]);
        let started = Instant::now();
        let mut registrar = crate::common::spawn(&mut command, "registrar");
        let mut status = None;
        while status.is_none() && started.elapsed() < Duration::from_secs(10) {
            status = registrar.0.try_wait().expect("wait for the registrar");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let log = registrar.stderr();
        let named = log.contains("--plugin-registration-path") && log.contains(driver);
        tally.check(
            status.and_then(|s| s.code()) == Some(1) && named,
            format_args!(
                "driver {driver}: exit {:?} after {:?}, log {log:?}",
                status.map(|s| s.code()),
                started.elapsed()
            ),
        );
    }
    tally.finish();
}

/// A `--state-dir` someone else uses (a file, a directory and a socket of theirs in it, alone
/// or beside a layout of ours): refused, exit 2 naming the flag, its mode and entries as they
/// were, nothing made in it. A directory holding only our layout and `lost+found` (a state
/// filesystem's root) still starts. (Before: every one was tightened to 0700 and served.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_directory_that_holds_what_node_server_did_not_make_is_refused_untouched() {
    use std::os::unix::fs::PermissionsExt;
    let mut tally = Tally::new(
        "a --state-dir holding entries node-server did not make (others', or others' beside ours)",
    );
    let listing = |dir: &std::path::Path| {
        let mut names: Vec<_> = (std::fs::read_dir(dir).unwrap())
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    for (round, ours_too) in [(0, false), (1, true)] {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("shared");
        std::fs::create_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(state.join("notes.txt"), "theirs").unwrap();
        std::fs::create_dir(state.join("data")).unwrap();
        let _theirs = std::os::unix::net::UnixListener::bind(state.join("app.sock")).unwrap();
        if ours_too {
            std::fs::create_dir(state.join("volumes")).unwrap();
        }
        let before = listing(&state);
        let endpoint = format!(
            "--endpoint=unix://{}",
            dir.path().join("csi.sock").display()
        );
        let flag = format!("--state-dir={}", state.display());
        let out = run_as("csi-node-server", &[&flag, &endpoint, "--node-id=n"]);
        let mode = std::fs::metadata(&state).unwrap().permissions().mode() & 0o7777;
        let untouched = mode == 0o755 && listing(&state) == before;
        tally.check(
            refused_naming(&out, "--state-dir") && untouched,
            format_args!(
                "round {round}: exit {:?}, mode {mode:04o}, entries {:?} (were {before:?}): {}",
                out.status.code(),
                listing(&state),
                String::from_utf8_lossy(&out.stderr)
            ),
        );
    }
    // The controls: our layout and a filesystem's lost+found; and a directory a node-server
    // used already (its snapshot-meta/), with a stray file of someone's in it.
    for (ours, stray) in [
        (&["volumes", "meta", "lost+found"][..], false),
        (&["snapshot-meta"], true),
    ] {
        let node = super::processes::Node::new();
        for dir in ours {
            std::fs::create_dir_all(node.state().join(dir)).unwrap();
        }
        if stray {
            std::fs::write(node.state().join("backup.tar"), "theirs").unwrap();
        }
        std::fs::create_dir_all(node.csi().parent().unwrap()).unwrap();
        let server = node.node_server().await;
        tally.check(
            server.is_some() && (!stray || node.state().join("backup.tar").exists()),
            format_args!(
                "a state directory holding {ours:?} (a stray file: {stray}) did not start"
            ),
        );
    }
    tally.finish();
}
