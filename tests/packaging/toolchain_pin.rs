//! The compiler the repository pins (`packaging/rust-toolchain.txt`, what `rustc --version`
//! prints): another gives other bytes, so another image digest from the same commit. The build
//! machines have one Rust and cannot fetch another, so the pin is a check, not a download:
//! `scripts/build-static.sh` refuses another compiler unless told, and this suite fails on a
//! machine whose compiler moved, so a new toolchain is pinned on purpose, never by drift.

use std::path::Path;
use std::process::Command;

fn pinned() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("packaging/rust-toolchain.txt")).unwrap();
    text.trim_end().to_owned()
}

#[test]
fn the_compiler_building_this_checkout_is_the_one_it_pins() {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(rustc).arg("--version").output().unwrap();
    let running = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        running.trim_end(),
        pinned(),
        "the machine's compiler moved: pin it in packaging/rust-toolchain.txt (and expect \
         other image digests) or build with the pinned one"
    );
}

/// A directory with a `rustc` that says it is another version, and a `cargo` that stops the
/// script at its next step, first on the PATH.
fn another_compiler() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    for (name, body) in [
        ("rustc", "echo 'rustc 1.96.0 (0123456789 2026-09-01)'"),
        ("cargo", "exit 3"),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir
}

fn build_static(fake: &Path, allow: bool) -> std::process::Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = format!("{}:{}", fake.display(), std::env::var("PATH").unwrap());
    let mut command = Command::new("bash");
    command
        .arg(root.join("scripts/build-static.sh"))
        .env("PATH", path)
        .env_remove("RUSTC")
        .env_remove("ALLOW_OTHER_RUSTC");
    if allow {
        command.env("ALLOW_OTHER_RUSTC", "1");
    }
    command.output().unwrap()
}

#[test]
fn the_static_build_refuses_a_compiler_other_than_the_pinned_one_unless_told() {
    let fake = another_compiler();
    let refused = build_static(fake.path(), false);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    for words in [pinned().as_str(), "rustc 1.96.0", "ALLOW_OTHER_RUSTC=1"] {
        assert!(stderr.contains(words), "{words}: {stderr}");
    }
    // Told: a warning naming both, and on to the next step (here a cargo without auditable).
    let allowed = build_static(fake.path(), true);
    let stderr = String::from_utf8_lossy(&allowed.stderr);
    assert!(
        stderr.contains("warning: building with rustc 1.96.0"),
        "{stderr}"
    );
    assert!(
        stderr.contains("cargo-auditable is not installed"),
        "{stderr}"
    );
}
