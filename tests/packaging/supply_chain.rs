//! What a scanner and a security team read from what ships: the dependency list `cargo auditable`
//! puts in the binary's `.dep-v0` section, and the CycloneDX SBOM beside the OCI archive, both
//! checked against `Cargo.lock`, the SBOM against the CycloneDX 1.5 schema
//! (`tests/fixtures/cyclonedx/`) and this machine's C libraries too.
//!
//! They read the binary inside the image the image tests build (one static build for all).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

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

/// `(name, version)` → the SHA-256 of its `.crate`, for every crates.io package of Cargo.lock.
fn lock_checksums() -> BTreeMap<(String, String), String> {
    let lock = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock"))
        .expect("read Cargo.lock");
    let mut out = BTreeMap::new();
    for block in lock.split("\n[[package]]\n") {
        let value = |key: &str| {
            block.lines().find_map(|line| {
                let rest = line.strip_prefix(key)?.strip_prefix(" = \"")?;
                Some(rest.strip_suffix('"')?.to_owned())
            })
        };
        if let (Some(name), Some(version), Some(sum)) =
            (value("name"), value("version"), value("checksum"))
        {
            out.insert((name, version), sum);
        }
    }
    assert!(out.len() > 100, "Cargo.lock's checksums read as {out:?}");
    out
}

/// The dependency list of the binary inside the first image.
pub(super) fn shipped_list() -> VersionInfo {
    let dir = tempfile::tempdir().unwrap();
    let (_, rootfs) = unpack(&first_build().archive, dir.path());
    auditable_info::audit_info_from_file(&rootfs.join("csi-nodekit"), Default::default())
        .expect("the shipped binary has a .dep-v0 section (built with cargo auditable)")
}

/// `cargo metadata` of this checkout, for the target the binary is built for: every package
/// by `name@version`.
pub(super) fn metadata() -> &'static BTreeMap<String, Value> {
    static METADATA: OnceLock<BTreeMap<String, Value>> = OnceLock::new();
    METADATA.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let out = Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--locked"])
            .args(["--filter-platform", "x86_64-unknown-linux-gnu"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("run cargo metadata");
        assert!(out.status.success(), "{out:?}");
        let all: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
        all["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .map(|p| {
                let key = format!(
                    "{}@{}",
                    p["name"].as_str().unwrap(),
                    p["version"].as_str().unwrap()
                );
                (key, p.clone())
            })
            .collect()
    })
}

fn is_proc_macro(name_version: &str) -> bool {
    let package = &metadata()[name_version];
    package["targets"].as_array().unwrap().iter().any(|t| {
        t["kind"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k == "proc-macro")
    })
}

/// `name@version` of every crate the dependency list says is compiled into the binary, without
/// our own: the list walked from our package along runtime packages, never into a proc-macro (it
/// marks a proc-macro that a runtime crate depends on as runtime, async-trait and
/// tracing-attributes here, and syn, quote and proc-macro2 under them). Still more than is linked:
/// the list's features are `cargo metadata`'s, build- and dev-dependencies' included.
pub(super) fn runtime_crates(list: &VersionInfo) -> BTreeSet<String> {
    let key = |i: usize| format!("{}@{}", list.packages[i].name, list.packages[i].version);
    let root = list.packages.iter().position(|p| p.root).expect("a root");
    let mut seen = BTreeSet::new();
    let mut stack = vec![root];
    while let Some(i) = stack.pop() {
        let p = &list.packages[i];
        if p.kind != DependencyKind::Runtime || is_proc_macro(&key(i)) || !seen.insert(i) {
            continue;
        }
        stack.extend(&p.dependencies);
    }
    seen.into_iter().filter(|&i| i != root).map(key).collect()
}

/// The crates whose code is in the shipped binary, by the names its symbols give them (`_`
/// for `-`): the crate roots of the Rust (v0) mangled names in `csi-nodekit.symbols`, the binary
/// as linked, which `scripts/build-static.sh` keeps beside the stripped one (checked to strip
/// to the image's). A crate made only of generics, macros or inlined code may have none.
pub(super) fn crates_with_code() -> BTreeSet<String> {
    let release = super::image::target_dir().join("x86_64-unknown-linux-gnu/release");
    let symbols = release.join("csi-nodekit.symbols");
    let dir = tempfile::tempdir().unwrap();
    let stripped = dir.path().join("stripped");
    stdout_of(
        Command::new("strip")
            .args(["--strip-all", "-o"])
            .arg(&stripped)
            .arg(&symbols),
    );
    let (_, rootfs) = unpack(&first_build().archive, dir.path());
    assert!(
        std::fs::read(&stripped).unwrap() == std::fs::read(rootfs.join("csi-nodekit")).unwrap(),
        "{} is the image's binary before stripping",
        symbols.display()
    );
    let names = stdout_of(Command::new("nm").arg("--defined-only").arg(&symbols));
    let mut crates = BTreeSet::new();
    for symbol in names.lines().filter_map(|l| l.split_whitespace().last()) {
        if let Some(path) = symbol.strip_prefix("_ZN") {
            legacy_crates(path, &mut crates);
        } else if symbol.starts_with("_R") {
            v0_crates(symbol, &mut crates);
        }
    }
    assert!(
        crates.contains("tokio") && crates.contains("std"),
        "{crates:?}"
    );
    crates
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
    let runtime = runtime_crates(&list);
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

/// The SBOM the first build wrote beside its archive.
fn sbom() -> Value {
    let path = &first_build().sbom;
    serde_json::from_slice(&std::fs::read(path).expect("the SBOM beside the archive"))
        .expect("the SBOM is JSON")
}

/// The SBOM's crates (`pkg:cargo/…` purls, not our own), by `name@version`.
fn sbom_crates(bom: &Value) -> BTreeMap<String, &Value> {
    let mut out = BTreeMap::new();
    for c in bom["components"].as_array().expect("components") {
        let Some(purl) = c["purl"].as_str() else {
            continue;
        };
        let Some(key) = purl.strip_prefix("pkg:cargo/") else {
            continue;
        };
        if key != format!("csi-nodekit@{VERSION}") {
            assert!(out.insert(key.to_owned(), c).is_none(), "{key} twice");
        }
    }
    out
}

/// The SBOM's component whose `bom-ref` is `name`.
fn component<'a>(bom: &'a Value, name: &str) -> &'a Value {
    bom["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["bom-ref"] == name)
        .unwrap_or_else(|| panic!("no component {name} in the SBOM"))
}

/// A command's standard output, trimmed.
fn stdout_of(command: &mut Command) -> String {
    let out = command.output().expect("run command");
    assert!(out.status.success(), "{command:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn sha256_of(path: &Path) -> String {
    let out = stdout_of(Command::new("sha256sum").arg(path));
    out.split_whitespace().next().unwrap().to_owned()
}

/// Where the C compiler driver (rustc's linker here) finds a library it links statically.
fn linked_file(name: &str) -> PathBuf {
    let path = stdout_of(Command::new("cc").arg(format!("-print-file-name={name}")));
    std::fs::canonicalize(path).unwrap()
}

#[ignore = "needs root and buildah: builds the image (see image.rs)"]
#[test]
fn the_sbom_is_valid_cyclonedx_1_5_by_its_json_schema() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cyclonedx");
    let schema = |name: &str| -> Value {
        serde_json::from_slice(&std::fs::read(fixtures.join(name)).unwrap()).unwrap()
    };
    // The BOM schema refers to the other two by names relative to its $id; nothing is fetched.
    let registry = jsonschema::Registry::new()
        .add(
            "http://cyclonedx.org/schema/spdx.SNAPSHOT.schema.json",
            schema("spdx.SNAPSHOT.schema.json"),
        )
        .unwrap()
        .add(
            "http://cyclonedx.org/schema/jsf-0.82.SNAPSHOT.schema.json",
            schema("jsf-0.82.SNAPSHOT.schema.json"),
        )
        .unwrap()
        .prepare()
        .unwrap();
    let validator = jsonschema::options()
        .with_registry(&registry)
        .should_validate_formats(true)
        .build(&schema("bom-1.5.SNAPSHOT.schema.json"))
        .expect("the CycloneDX 1.5 schema compiles");
    let bom = sbom();
    let errors: Vec<String> = validator
        .iter_errors(&bom)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "the SBOM breaks the schema:\n{}",
        errors.join("\n")
    );
    // The validator does look: a hash that is not one, a component without a name, a bad
    // timestamp are each refused.
    let mut broken = bom.clone();
    broken["components"][0]["hashes"][0]["alg"] = "SHA-257".into();
    assert!(!validator.is_valid(&broken));
    let mut broken = bom.clone();
    broken["components"][1]
        .as_object_mut()
        .unwrap()
        .remove("name");
    assert!(!validator.is_valid(&broken));
    let mut broken = bom;
    broken["metadata"]["timestamp"] = "yesterday".into();
    assert!(!validator.is_valid(&broken));
}

#[ignore = "needs root and buildah: builds the image (see image.rs)"]
#[test]
fn the_sbom_describes_the_image_by_the_digest_the_build_printed_at_the_commits_date() {
    let build = first_build();
    let bom = sbom();
    assert_eq!(bom["bomFormat"], "CycloneDX");
    assert_eq!(bom["specVersion"], "1.5");
    assert_eq!(
        bom["version"], 1,
        "the schema copy leaves `version` optional"
    );
    // Reproducible: the archive's timestamp (SOURCE_DATE_EPOCH, the commit's date by
    // default), no random serial.
    assert_eq!(bom["metadata"]["timestamp"], super::image::commit_date());
    assert!(bom.get("serialNumber").is_none(), "{}", bom["serialNumber"]);
    let image = &bom["metadata"]["component"];
    let hex = build
        .digest
        .strip_prefix("sha256:")
        .expect("a sha256 digest");
    assert_eq!(image["type"], "container", "{image}");
    assert_eq!(image["name"], "localhost/csi-nodekit");
    assert_eq!(image["version"], build.digest.as_str());
    assert_eq!(
        image["hashes"],
        serde_json::json!([{ "alg": "SHA-256", "content": hex }])
    );
    let purl = image["purl"].as_str().unwrap();
    assert_eq!(
        purl,
        format!(
            "pkg:oci/csi-nodekit@sha256%3A{hex}?repository_url=localhost/csi-nodekit&tag={VERSION}"
        )
    );
    // The image holds the binary; the binary, its crates and libraries.
    let dependencies = bom["dependencies"].as_array().unwrap();
    let on = |r: &str| -> Vec<String> {
        let d = dependencies
            .iter()
            .find(|d| d["ref"] == r)
            .unwrap_or_else(|| panic!("no dependencies entry for {r}"));
        serde_json::from_value(d["dependsOn"].clone()).unwrap()
    };
    let binary = format!("pkg:cargo/csi-nodekit@{VERSION}");
    assert_eq!(on(purl), std::slice::from_ref(&binary));
    for part in [
        "pkg:cargo/tokio@",
        "pkg:cargo/rustls@",
        "rust-std",
        "glibc",
        "libgcc",
    ] {
        assert!(
            on(&binary).iter().any(|d| d.starts_with(part)),
            "the binary depends on {part}…: {:?}",
            on(&binary)
        );
    }
    // Every component has its entry, and every entry names components.
    let refs: BTreeSet<&str> = bom["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["bom-ref"].as_str().unwrap())
        .chain([purl])
        .collect();
    let entries: BTreeSet<&str> = dependencies
        .iter()
        .map(|d| d["ref"].as_str().unwrap())
        .collect();
    assert_eq!(refs, entries);
    for d in dependencies {
        for r in d["dependsOn"].as_array().unwrap() {
            assert!(refs.contains(r.as_str().unwrap()), "{r} is no component");
        }
    }
}

#[ignore = "needs root and buildah: builds the image (see image.rs)"]
#[test]
fn every_component_of_the_sbom_has_a_licence_and_a_sha256_and_each_crates_is_its_cargo_lock_checksum()
 {
    let bom = sbom();
    let components = bom["components"].as_array().unwrap();
    for c in components {
        let expression = c["licenses"][0]["expression"].as_str().unwrap_or_default();
        assert!(
            !expression.is_empty() && c["licenses"].as_array().unwrap().len() == 1,
            "{} has no licence expression: {c}",
            c["bom-ref"]
        );
        let hashes = c["hashes"].as_array().expect("hashes");
        assert_eq!(hashes.len(), 1, "{c}");
        assert_eq!(hashes[0]["alg"], "SHA-256", "{c}");
        let hex = hashes[0]["content"].as_str().unwrap();
        assert!(
            hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
            "{c}"
        );
    }
    // A crate's: its .crate's SHA-256 from Cargo.lock, and the licence its Cargo.toml declares.
    let sums = lock_checksums();
    for (key, c) in sbom_crates(&bom) {
        let (name, version) = key.split_once('@').unwrap();
        assert_eq!(
            c["hashes"][0]["content"].as_str(),
            sums.get(&(name.to_owned(), version.to_owned()))
                .map(String::as_str),
            "{key}"
        );
        let declared = metadata()[&key]["license"].as_str().unwrap();
        assert_eq!(
            c["licenses"][0]["expression"].as_str().unwrap(),
            declared
                .replace('/', " OR ")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
            "{key}"
        );
    }
    // Ours: the shipped binary's bytes.
    let dir = tempfile::tempdir().unwrap();
    let (_, rootfs) = unpack(&first_build().archive, dir.path());
    let me = component(&bom, &format!("pkg:cargo/csi-nodekit@{VERSION}"));
    assert_eq!(
        me["hashes"][0]["content"].as_str().unwrap(),
        sha256_of(&rootfs.join("csi-nodekit"))
    );
    assert_eq!(me["licenses"][0]["expression"], "Apache-2.0");
    // The C libraries': the files linked in, on this machine.
    assert_eq!(
        component(&bom, "glibc")["hashes"][0]["content"]
            .as_str()
            .unwrap(),
        sha256_of(&linked_file("libc.a"))
    );
    assert_eq!(
        component(&bom, "libgcc")["hashes"][0]["content"]
            .as_str()
            .unwrap(),
        sha256_of(&linked_file("libgcc_eh.a"))
    );
}

#[ignore = "needs root and buildah: builds the image (see image.rs)"]
#[test]
fn the_sbom_lists_glibc_libgcc_the_rust_standard_library_and_rings_c_code_as_built() {
    let bom = sbom();
    let dir = tempfile::tempdir().unwrap();
    let (_, rootfs) = unpack(&first_build().archive, dir.path());
    let comment = stdout_of(
        Command::new("readelf")
            .args(["-p", ".comment"])
            .arg(rootfs.join("csi-nodekit")),
    );

    let glibc = component(&bom, "glibc");
    let running = stdout_of(Command::new("getconf").arg("GNU_LIBC_VERSION"));
    assert_eq!(
        format!("glibc {}", glibc["version"].as_str().unwrap()),
        running
    );
    assert_eq!(glibc["licenses"][0]["expression"], "LGPL-2.1-or-later");
    let dev = stdout_of(Command::new("dpkg-query").args(["-W", "-f=${Version}", "libc6-dev"]));
    assert_eq!(
        glibc["purl"],
        format!(
            "pkg:deb/debian/libc6-dev@{}?arch=amd64&distro=debian-12",
            dev.replace('+', "%2B")
        )
        .as_str()
    );

    let libgcc = component(&bom, "libgcc");
    let gcc = stdout_of(Command::new("cc").arg("-dumpfullversion"));
    assert_eq!(libgcc["version"].as_str().unwrap(), gcc);
    assert_eq!(
        libgcc["licenses"][0]["expression"],
        "GPL-3.0-or-later WITH GCC-exception-3.1"
    );

    // The standard library of the compiler the binary names in its .comment.
    let std = component(&bom, "rust-std");
    let version = std["version"].as_str().unwrap();
    assert!(
        comment.contains(&format!("rustc version {version} (")),
        "{version} in {comment}"
    );
    assert_eq!(std["licenses"][0]["expression"], "MIT OR Apache-2.0");

    // ring's C and assembly: a component of its own, under ring's licence, that ring depends on.
    let ring = sbom_crates(&bom)
        .into_iter()
        .find(|(k, _)| k.starts_with("ring@"))
        .map(|(_, c)| c)
        .expect("ring in the SBOM");
    let native = component(
        &bom,
        &format!("{}#c-and-assembly", ring["purl"].as_str().unwrap()),
    );
    assert_eq!(native["version"], ring["version"]);
    assert_eq!(native["licenses"], ring["licenses"]);
    assert_eq!(ring["licenses"][0]["expression"], "Apache-2.0 AND ISC");
}

/// The crates a legacy-mangled name (`_ZN` `<length><part>`… `E`) names: its first part, and
/// in a part that spells types (`_$LT$tokio..net..UnixStream$u20$as$u20$core..fmt..Debug$GT$`)
/// the first name of each path.
fn legacy_crates(mut path: &str, out: &mut BTreeSet<String>) {
    let mut first = true;
    loop {
        let digits = path.bytes().take_while(u8::is_ascii_digit).count();
        let Ok(len) = path[..digits].parse::<usize>() else {
            return;
        };
        let Some(part) = path.get(digits..digits + len) else {
            return;
        };
        path = &path[digits + len..];
        if first && !part.starts_with(['_', '$']) {
            out.insert(part.to_owned());
        }
        first = false;
        // Escapes (`$LT$`, `$u20$`, `$RF$`) become spaces; `..` joins a path's names.
        let mut decoded = String::new();
        for (i, piece) in part.split('$').enumerate() {
            decoded.push_str(if i % 2 == 0 { piece } else { " " });
        }
        for word in decoded.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.')) {
            if let Some((krate, _)) = word.split_once("..") {
                out.insert(krate.to_owned());
            }
        }
    }
}

/// The crates a v0-mangled name (`_R…`) names: each crate root, `C`, an optional
/// disambiguator `s<base 62>_`, then `<length><name>`.
fn v0_crates(symbol: &str, out: &mut BTreeSet<String>) {
    let bytes = symbol.as_bytes();
    for (i, _) in symbol.match_indices('C') {
        let mut j = i + 1;
        if bytes.get(j) == Some(&b's') {
            j += 1;
            while bytes.get(j).is_some_and(u8::is_ascii_alphanumeric) {
                j += 1;
            }
            if bytes.get(j) != Some(&b'_') {
                continue;
            }
            j += 1;
        }
        let digits = bytes[j..].iter().take_while(|b| b.is_ascii_digit()).count();
        let Ok(len) = symbol[j..j + digits].parse::<usize>() else {
            continue;
        };
        if let Some(name) = symbol.get(j + digits..j + digits + len) {
            out.insert(name.to_owned());
        }
    }
}

/// `name@version` of every crate the SBOM lists (not our own).
pub(super) fn sbom_crate_keys() -> BTreeSet<String> {
    sbom_crates(&sbom()).into_keys().collect()
}

#[ignore = "needs root and buildah: builds the image (see image.rs)"]
#[test]
fn the_sbom_names_every_crate_with_code_in_the_binary_and_no_crate_used_only_to_build_it() {
    let named = sbom_crate_keys();
    let list = shipped_list();
    let runtime = runtime_crates(&list);
    let with_code = crates_with_code();
    // A crate's name in symbols is its library's (rustls-webpki's is `webpki`).
    let name_of = |k: &String| -> String {
        let targets = metadata()[k]["targets"].as_array().unwrap();
        let lib = targets
            .iter()
            .find(|t| {
                t["kind"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k == "lib" || k == "rlib")
            })
            .unwrap_or_else(|| panic!("{k} has no library"));
        lib["name"].as_str().unwrap().replace('-', "_")
    };
    let locked = locked();
    for component in &named {
        let (name, version) = component.split_once('@').unwrap();
        assert!(
            locked.contains(&(name.to_owned(), version.to_owned())),
            "{component} is not in Cargo.lock"
        );
        assert!(
            runtime.contains(component),
            "{component} is not a runtime crate of the binary's dependency list"
        );
    }
    // Each is compiled by a build of the binary: features resolved without the
    // build- and dev-dependencies' (which the list's are not: regex comes in through them).
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let tree = stdout_of(
        Command::new(cargo)
            .args(["tree", "--locked", "-e", "normal", "--prefix", "none"])
            .args(["--target", "x86_64-unknown-linux-gnu", "--format", "{p}"])
            .current_dir(env!("CARGO_MANIFEST_DIR")),
    );
    let built: BTreeSet<String> = tree
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            Some(format!(
                "{}@{}",
                words.next()?,
                words.next()?.strip_prefix('v')?
            ))
        })
        .collect();
    for component in &named {
        assert!(
            built.contains(component),
            "{component} is not built into the binary"
        );
    }
    // Every crate whose code is in the binary is named…
    for crate_ in runtime.iter().filter(|k| with_code.contains(&name_of(k))) {
        assert!(
            named.iter().any(|n| name_of(n) == name_of(crate_)),
            "{crate_} has code in the binary and is not in the SBOM"
        );
    }
    // …and those of the list's runtime crates it leaves out have none: the list names more
    // than is linked (proc-macros, crates only other dependencies' features pull in).
    let left_out: Vec<&String> = runtime.difference(&named).collect();
    for crate_ in &left_out {
        assert!(
            !with_code.contains(&name_of(crate_)),
            "{crate_} is left out of the SBOM, but has code in the binary"
        );
    }
    // Not the build script's crates, nor the proc-macros and what only they use, which the
    // dependency list marks as runtime: the case this guards against is in this build.
    let listed_as_runtime: BTreeSet<String> = list
        .packages
        .iter()
        .filter(|p| !p.root && p.kind == DependencyKind::Runtime)
        .map(|p| format!("{}@{}", p.name, p.version))
        .filter(|k| !runtime.contains(k))
        .collect();
    assert!(
        listed_as_runtime
            .iter()
            .any(|k| k.starts_with("async-trait@"))
            && listed_as_runtime.iter().any(|k| k.starts_with("syn@")),
        "the dependency list marks proc-macros as runtime: {listed_as_runtime:?}"
    );
    for p in list.packages.iter().filter(|p| !p.root) {
        let key = format!("{}@{}", p.name, p.version);
        if p.kind == DependencyKind::Build || listed_as_runtime.contains(&key) {
            assert!(
                !named.contains(&key),
                "{key} is used only to build the binary"
            );
        }
    }
    for absent in [
        "protox",
        "syn",
        "quote",
        "proc-macro2",
        "async-trait",
        "serde_derive",
    ] {
        assert!(
            named.iter().all(|k| !k.starts_with(&format!("{absent}@"))),
            "{absent} in the SBOM"
        );
    }
    println!(
        "SBOM: {} crates (+ csi-nodekit itself); of the dependency list's {} runtime crates, \
         proc-macros and what only they use ({}) and {left_out:?} are left out",
        named.len(),
        list.packages
            .iter()
            .filter(|p| !p.root && p.kind == DependencyKind::Runtime)
            .count(),
        listed_as_runtime.len(),
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
