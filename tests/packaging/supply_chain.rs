//! What a scanner and a security team read from what ships: the dependency list `cargo auditable`
//! puts in the binary's `.dep-v0` section, and the CycloneDX SBOM beside the OCI archive, both
//! checked against `Cargo.lock`.
//!
//! They read the binary inside the image the image tests build (one static build for all).

use std::collections::BTreeSet;
use std::path::Path;

use auditable_serde::{DependencyKind, Source, VersionInfo};
use serde_json::Value;

use super::image::{first_build, unpack};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Every `(name, version)` of Cargo.lock.
fn locked() -> BTreeSet<(String, String)> {
    let lock = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock"))
        .expect("read Cargo.lock");
    let value = |line: &str, key: &str| {
        line.strip_prefix(key)
            .and_then(|rest| rest.strip_prefix(" = \""))
            .and_then(|rest| rest.strip_suffix('"'))
            .map(str::to_owned)
    };
    let mut name = None;
    let mut out = BTreeSet::new();
    for line in lock.lines() {
        if let Some(n) = value(line, "name") {
            name = Some(n);
        } else if let Some(v) = value(line, "version") {
            out.insert((name.take().expect("a name before the version"), v));
        }
    }
    assert!(out.len() > 100, "Cargo.lock read as {out:?}");
    out
}

/// The dependency list of the binary inside the first image.
fn shipped_list() -> VersionInfo {
    let dir = tempfile::tempdir().unwrap();
    let (_, rootfs) = unpack(&first_build().archive, dir.path());
    auditable_info::audit_info_from_file(&rootfs.join("csi-nodekit"), Default::default())
        .expect("the shipped binary has a .dep-v0 section (built with cargo auditable)")
}

/// `name@version` of every crate compiled into the binary (not the build-only ones: build
/// scripts' crates and proc-macros), without our own.
fn in_binary(list: &VersionInfo) -> BTreeSet<String> {
    list.packages
        .iter()
        .filter(|p| !p.root && p.kind == DependencyKind::Runtime)
        .map(|p| format!("{}@{}", p.name, p.version))
        .collect()
}

#[ignore = "needs root and buildah: builds the image (see image.rs)"]
#[test]
fn the_shipped_binary_carries_its_dependency_list_and_every_crate_of_it_is_in_cargo_lock() {
    let list = shipped_list();
    let locked = locked();
    let root: Vec<_> = list.packages.iter().filter(|p| p.root).collect();
    assert_eq!(root.len(), 1, "one root package");
    assert_eq!(
        (root[0].name.as_str(), root[0].version.to_string()),
        ("csi-nodekit", VERSION.to_owned())
    );
    for package in &list.packages {
        let key = (package.name.clone(), package.version.to_string());
        assert!(locked.contains(&key), "{key:?} is not in Cargo.lock");
        if !package.root {
            assert_eq!(package.source, Source::CratesIo, "{}", package.name);
        }
    }
    let runtime = in_binary(&list);
    let names: BTreeSet<&str> = runtime
        .iter()
        .map(|c| c.split('@').next().unwrap())
        .collect();
    // The core of the binary, and the doctor's TLS (the default feature kube-api).
    for core in [
        "tokio", "tonic", "prost", "hyper", "nix", "argh", "rustls", "ring",
    ] {
        assert!(names.contains(core), "{core} missing from {names:?}");
    }
    // What only the build script and the tests use is not in the binary.
    let build: BTreeSet<&str> = list
        .packages
        .iter()
        .filter(|p| p.kind == DependencyKind::Build)
        .map(|p| p.name.as_str())
        .collect();
    assert!(build.contains("protox"), "{build:?}");
    for absent in ["protox", "proptest", "rcgen", "tempfile", "auditable-info"] {
        assert!(
            !names.contains(absent),
            "{absent} is listed as in the binary"
        );
    }
    println!(
        ".dep-v0: {} packages, {} compiled into the binary, {} build-only; Cargo.lock: {}",
        list.packages.len(),
        runtime.len() + 1,
        build.len(),
        locked.len()
    );
}

#[ignore = "needs root and buildah: builds the image (see image.rs)"]
#[test]
fn the_sbom_beside_the_archive_names_every_crate_in_the_binary_at_its_cargo_lock_version() {
    let build = first_build();
    let bom: Value =
        serde_json::from_slice(&std::fs::read(&build.sbom).expect("the SBOM beside the archive"))
            .expect("the SBOM is JSON");
    assert_eq!(bom["bomFormat"], "CycloneDX");
    assert_eq!(bom["specVersion"], "1.5");
    // Reproducible: the archive's timestamp (SOURCE_DATE_EPOCH, the commit's date by
    // default), no random serial.
    assert_eq!(bom["metadata"]["timestamp"], super::image::commit_date());
    assert!(bom.get("serialNumber").is_none(), "{}", bom["serialNumber"]);
    let me = &bom["metadata"]["component"];
    assert_eq!(me["name"], "csi-nodekit");
    assert_eq!(me["version"], VERSION);

    let components = bom["components"].as_array().expect("components");
    let named: BTreeSet<String> = components
        .iter()
        .map(|c| {
            let (name, version) = (c["name"].as_str().unwrap(), c["version"].as_str().unwrap());
            assert_eq!(c["purl"], format!("pkg:cargo/{name}@{version}").as_str());
            format!("{name}@{version}")
        })
        .collect();
    assert_eq!(named.len(), components.len(), "each crate once");
    assert_eq!(
        named,
        in_binary(&shipped_list()),
        "the SBOM names what the binary carries"
    );
    let locked = locked();
    for component in &named {
        let (name, version) = component.split_once('@').unwrap();
        assert!(
            locked.contains(&(name.to_owned(), version.to_owned())),
            "{component} is not in Cargo.lock"
        );
    }
    let refs: BTreeSet<&str> = bom["dependencies"]
        .as_array()
        .expect("dependencies")
        .iter()
        .map(|d| d["ref"].as_str().unwrap())
        .collect();
    assert!(refs.contains(format!("pkg:cargo/csi-nodekit@{VERSION}").as_str()));
    println!(
        "SBOM: {} components (+ csi-nodekit itself); Cargo.lock: {} packages",
        named.len(),
        locked.len()
    );
}

/// Built in any directory by any user, the same commit gives the same bytes: the binary names
/// no path of this checkout, of cargo's home (the crates' sources) or of the target directory
/// (`--remap-path-prefix` in `scripts/build-static.sh`).
#[ignore = "needs root and buildah: builds the image (see image.rs)"]
#[test]
fn the_shipped_binary_names_no_directory_of_the_machine_that_built_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_, rootfs) = unpack(&first_build().archive, dir.path());
    let binary = std::fs::read(rootfs.join("csi-nodekit")).unwrap();
    let cargo_home = std::env::var("CARGO_HOME")
        .unwrap_or_else(|_| format!("{}/.cargo", std::env::var("HOME").unwrap()));
    let target = Path::new(env!("CARGO_BIN_EXE_csi-nodekit"))
        .ancestors()
        .nth(2)
        .unwrap();
    for place in [
        env!("CARGO_MANIFEST_DIR"),
        &cargo_home,
        &target.to_string_lossy(),
    ] {
        let found = binary
            .windows(place.len())
            .filter(|w| *w == place.as_bytes())
            .count();
        assert_eq!(found, 0, "the binary names {place} {found} times");
    }
    let remapped = binary.windows(7).filter(|w| *w == b"/cargo/").count();
    assert!(
        remapped > 0,
        "no crate source path is named as /cargo/…: remapped at all?"
    );
}
