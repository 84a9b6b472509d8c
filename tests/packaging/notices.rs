//! The licence notices the image carries in `/licenses/` (`examples/notices.rs`, run by
//! `scripts/build-image.sh`): for every crate linked into the shipped binary, every licence file
//! its published source has; for glibc, libgcc and the Rust standard library, the notices of
//! this build machine's copies; glibc's source and relinking offer. Checked against the
//! binary's own dependency list, `Cargo.lock`, the crates' sources in cargo's registry and this
//! machine's C libraries, on the image the image tests build.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::image::{first_build, unpack};
use super::supply_chain::{metadata, sbom_crate_keys};

/// The first image's `/licenses/`, unpacked (the directory lives as long as the guard).
fn notices() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (_, rootfs) = unpack(&first_build().archive, dir.path());
    let licenses = rootfs.join("licenses");
    assert!(licenses.is_dir(), "the image has no /licenses/");
    (dir, licenses)
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn text(path: &Path) -> String {
    String::from_utf8(read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn stdout_of(command: &mut Command) -> String {
    let out = command.output().expect("run command");
    assert!(out.status.success(), "{command:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Every file under `dir`, relative to it.
fn files(dir: &Path) -> BTreeSet<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.insert(path.strip_prefix(root).unwrap().to_owned());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

/// The files of a crate's top directory that say they hold its licence, by their name.
fn top_level_licence_files(source: &Path) -> Vec<String> {
    std::fs::read_dir(source)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| {
            let upper = name.to_ascii_uppercase();
            ["LICENSE", "LICENCE", "COPYING", "NOTICE", "COPYRIGHT"]
                .iter()
                .any(|w| upper.contains(w))
        })
        .collect()
}

#[ignore = "needs root and buildah: builds the image (see image.rs)"]
#[test]
fn every_crate_linked_into_the_shipped_binary_has_its_licence_files_in_the_image_and_no_other_crate_has()
 {
    let (_guard, licenses) = notices();
    // The crates linked in, as the SBOM names them (which `supply_chain.rs` checks against the
    // binary's dependency list and its symbols).
    let linked = sbom_crate_keys();
    let dirs: BTreeSet<String> = std::fs::read_dir(licenses.join("crates"))
        .expect("/licenses/crates/")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let expected: BTreeSet<String> = linked.iter().map(|k| k.replacen('@', "-", 1)).collect();
    assert_eq!(
        dirs, expected,
        "one directory per crate linked in (no proc-macro, no build-only crate)"
    );
    let readme = text(&licenses.join("README"));
    let mut from_source = 0;
    let mut standard = Vec::new();
    for key in &linked {
        let package = &metadata()[key];
        let source = Path::new(package["manifest_path"].as_str().unwrap())
            .parent()
            .unwrap();
        let dir = licenses.join("crates").join(key.replacen('@', "-", 1));
        let shipped = files(&dir);
        let top = top_level_licence_files(source);
        if top.is_empty() {
            // No text in the crate: the standard text of each licence it declares, and the
            // README says so.
            let declared = package["license"].as_str().unwrap();
            for id in declared
                .split([' ', '/', '(', ')'])
                .filter(|w| !w.is_empty() && !["AND", "OR", "WITH"].contains(w))
            {
                assert!(
                    shipped.contains(Path::new(&format!("{id}.txt"))),
                    "{key}: the standard {id} text: {shipped:?}"
                );
            }
            let (name, version) = key.split_once('@').unwrap();
            assert!(
                readme.contains(&format!("{name} {version} ships no licence text")),
                "the README says {key} ships none"
            );
            standard.push(key.clone());
            continue;
        }
        for name in &top {
            assert_eq!(
                read(&dir.join(name)),
                read(&source.join(name)),
                "{key}: {name}, byte for byte"
            );
            from_source += 1;
        }
        // Nothing that is not the crate's.
        for file in &shipped {
            assert_eq!(
                read(&dir.join(file)),
                read(&source.join(file)),
                "{key}: {file:?}"
            );
        }
    }
    // The README names each.
    for key in &linked {
        let (name, version) = key.split_once('@').unwrap();
        assert!(
            readme.contains(&format!("\n  {name} {version}, ")),
            "README: {key}"
        );
    }
    println!(
        "/licenses/crates/: {} crates, {from_source} licence files from their sources, standard \
         texts for {standard:?}",
        linked.len()
    );
}

#[ignore = "needs root and buildah: builds the image (see image.rs)"]
#[test]
fn the_image_carries_the_notices_of_glibc_libgcc_rings_c_code_and_the_rust_standard_library() {
    let (_guard, licenses) = notices();
    let commit = stdout_of(
        Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(env!("CARGO_MANIFEST_DIR")),
    );

    // glibc: the LGPL-2.1, Debian's copyright file of the package libc.a came from, and where
    // the source is with the exact versions of this machine, and how to relink.
    let lgpl = text(&licenses.join("glibc/LGPL-2.1"));
    assert!(
        lgpl.contains("GNU LESSER GENERAL PUBLIC LICENSE") && lgpl.contains("Version 2.1"),
        "glibc/LGPL-2.1 is the LGPL-2.1"
    );
    assert_eq!(
        read(&licenses.join("glibc/copyright")),
        read(Path::new("/usr/share/doc/libc6-dev/copyright"))
    );
    let source = text(&licenses.join("glibc/SOURCE"));
    let running = stdout_of(Command::new("getconf").arg("GNU_LIBC_VERSION"));
    let version = running.strip_prefix("glibc ").unwrap();
    let debian = stdout_of(Command::new("dpkg-query").args([
        "-W",
        "-f=${source:Package} ${source:Version}",
        "libc6-dev",
    ]));
    let (package, debian_version) = debian.split_once(' ').unwrap();
    for needed in [
        format!("The GNU C Library (glibc) {version} is linked statically"),
        format!("source package {package} {debian_version}"),
        format!("apt-get source {package}={debian_version}"),
        format!("commit {commit}"),
        "scripts/build-static.sh".to_owned(),
        "LGPL-2.1, section 6".to_owned(),
    ] {
        assert!(
            source.contains(&needed),
            "glibc/SOURCE says {needed:?}:\n{source}"
        );
    }

    // libgcc: GCC's runtime under the GPL-3 with the GCC Runtime Library Exception.
    let copyright = text(&licenses.join("libgcc/copyright"));
    assert!(
        copyright.contains("GCC RUNTIME LIBRARY EXCEPTION") && copyright.contains("Version 3.1"),
        "libgcc/copyright has the runtime library exception"
    );
    let gpl = text(&licenses.join("libgcc/GPL-3"));
    assert!(gpl.contains("GNU GENERAL PUBLIC LICENSE") && gpl.contains("Version 3"));

    // ring: its notices for the C and assembly from BoringSSL and fiat-crypto beside its own.
    let ring = files(&licenses.join("crates"))
        .into_iter()
        .find_map(|p| {
            let top = p
                .components()
                .next()?
                .as_os_str()
                .to_string_lossy()
                .into_owned();
            top.starts_with("ring-").then_some(top)
        })
        .expect("ring's notices");
    let ring_source = Path::new(
        metadata()[&ring.replacen('-', "@", 1)]["manifest_path"]
            .as_str()
            .unwrap(),
    )
    .parent()
    .unwrap()
    .to_owned();
    for file in [
        "LICENSE",
        "LICENSE-BoringSSL",
        "LICENSE-other-bits",
        "third_party/fiat/LICENSE",
        "src/polyfill/once_cell/LICENSE-MIT",
    ] {
        assert_eq!(
            read(&licenses.join("crates").join(&ring).join(file)),
            read(&ring_source.join(file)),
            "{ring}/{file}"
        );
    }
    assert!(text(&licenses.join("README")).contains(&format!(
        "{} also compiles C and assembly into the binary",
        ring.replacen('-', " ", 1)
    )));

    // The Rust standard library: the toolchain's own notices for it.
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let sysroot = stdout_of(Command::new(rustc).args(["--print", "sysroot"]));
    let docs = Path::new(&sysroot).join("share/doc/rust");
    assert_eq!(
        read(&licenses.join("rust-std/COPYRIGHT-library.html")),
        read(&docs.join("COPYRIGHT-library.html"))
    );
    for id in ["MIT", "Apache-2.0", "Unicode-3.0"] {
        assert_eq!(
            read(&licenses.join(format!("rust-std/{id}.txt"))),
            read(&docs.join(format!("licenses/{id}.txt")))
        );
    }

    // Ours.
    assert_eq!(
        read(&licenses.join("csi-nodekit/LICENSE")),
        read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("LICENSE"))
    );
    let bytes: u64 = files(&licenses)
        .iter()
        .map(|f| std::fs::metadata(licenses.join(f)).unwrap().len())
        .sum();
    println!(
        "/licenses/: {} files, {bytes} bytes",
        files(&licenses).len()
    );
}
