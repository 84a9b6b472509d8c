//! The image's SBOM: CycloneDX 1.5 JSON, written by `scripts/build-image.sh` beside the OCI
//! archive once the image's digest is known:
//!
//!     cargo run --example sbom -- <binary> <timestamp> <image name> <image digest>  > csi-nodekit-<version>.cdx.json
//!
//! Its subject (`metadata.component`) is the image, by its digest. Its components are what the
//! image holds: the binary, every crate linked into it (the binary's own `.dep-v0` list, less the
//! crates it names that are never linked: `support/shipped.rs`), the Rust standard library,
//! glibc and libgcc (linked statically, each with its version and the Debian package it came
//! from), and the C and assembly a crate's build script compiles in (ring's). Each has its
//! licence (an SPDX expression: a crate's from its Cargo.toml) and a SHA-256 hash: a crate's is
//! its `.crate`'s, from Cargo.lock; a library's is the file linked in, on this build machine.
//! Build-only crates (the build script's protox and friends, every proc-macro) are left out;
//! `metadata.properties` names those the `.dep-v0` list calls runtime (`csi-nodekit:not-linked`).
//!
//! Reproducible: the timestamp is given (the script passes the archive's `SOURCE_DATE_EPOCH`,
//! the commit's date by default), there is no random serial number (it is optional;
//! `cdx:reproducible` says why it is missing), and components come sorted.
//!
//! cargo-cyclonedx, the CycloneDX project's own tool, cannot do this: it reads `cargo metadata`,
//! not the binary (so it lists proc-macros as shipped), knows nothing of the image or the C
//! libraries, and writes a fresh timestamp and serial number on every run.

use std::path::PathBuf;

use serde_json::{Value, json};

#[path = "support/shipped.rs"]
#[allow(dead_code)] // the notices use the rest
mod shipped;
use shipped::{Result, purl};

fn sha256(hex: &str) -> Value {
    json!([{ "alg": "SHA-256", "content": hex }])
}

fn licence(expression: &str) -> Value {
    json!([{ "expression": expression }])
}

fn property(name: &str, value: impl Into<String>) -> Value {
    json!({ "name": name, "value": value.into() })
}

fn main() -> Result<()> {
    let mut args = std::env::args_os().skip(1);
    let (Some(binary), Some(timestamp), Some(image), Some(digest), None) = (
        args.next(),
        args.next(),
        args.next(),
        args.next(),
        args.next(),
    ) else {
        return Err("usage: sbom <binary> <RFC 3339 timestamp> <image name> <image digest>".into());
    };
    let binary = PathBuf::from(binary);
    let [timestamp, image, digest] =
        [timestamp, image, digest].map(|a| a.to_string_lossy().into_owned());
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| format!("{digest} is no sha256 digest"))?;
    let shipped = shipped::read(&binary)?;
    let root = &shipped.root;
    let root_ref = purl(&root.name, &root.version);

    let mut components = vec![json!({
        "type": "application",
        "bom-ref": root_ref,
        "name": root.name,
        "version": root.version,
        "description": format!("/{}, the image's one program (statically linked)", root.name),
        "purl": root_ref,
        "licenses": licence(&root.licence),
        "hashes": sha256(&shipped.binary_sha256),
        "externalReferences": [{ "type": "vcs", "url": root.repository }],
    })];
    let mut dependencies = Vec::new();
    let mut root_on = root.depends_on.clone();
    for c in &shipped.crates {
        components.push(json!({
            "type": "library",
            "bom-ref": c.purl(),
            "name": c.name,
            "version": c.version,
            "purl": c.purl(),
            "licenses": licence(&c.licence),
            "hashes": sha256(&c.checksum),
        }));
        let mut on = c.depends_on.clone();
        if c.native {
            // What its build script compiles in: from the same .crate, under the same licence.
            let native = format!("{}#c-and-assembly", c.purl());
            components.push(json!({
                "type": "library",
                "bom-ref": native,
                "name": format!("{} (C and assembly)", c.name),
                "version": c.version,
                "description": format!(
                    "The C and assembly {}'s build script compiles and links in",
                    c.name
                ),
                "licenses": licence(&c.licence),
                "hashes": sha256(&c.checksum),
                "properties": [property(
                    "csi-nodekit:hash-of",
                    format!("{}.crate, the source it is compiled from", c.key()),
                )],
            }));
            dependencies.push(json!({ "ref": native, "dependsOn": [] }));
            on.push(native);
        }
        dependencies.push(json!({ "ref": c.purl(), "dependsOn": on }));
    }
    for lib in &shipped.libraries {
        let mut properties = vec![property("csi-nodekit:hash-of", &lib.shown)];
        if let Some(d) = &lib.debian {
            properties.push(property("csi-nodekit:debian-package", &d.package));
            properties.push(property("csi-nodekit:debian-version", &d.version));
            properties.push(property(
                "csi-nodekit:debian-source",
                format!("{} {}", d.source, d.source_version),
            ));
        }
        let mut component = json!({
            "type": "library",
            "bom-ref": lib.key,
            "name": lib.name,
            "version": lib.version,
            "description": lib.description,
            "licenses": licence(&lib.licence),
            "hashes": sha256(&lib.sha256),
            "properties": properties,
        });
        if let Some(p) = &lib.purl {
            component["purl"] = json!(p);
        }
        components.push(component);
        dependencies.push(json!({ "ref": lib.key, "dependsOn": [] }));
        root_on.push(lib.key.to_owned());
    }
    dependencies.push(json!({ "ref": root_ref, "dependsOn": root_on }));

    // The subject: the image, by its digest.
    let short = image.rsplit('/').next().unwrap_or(&image);
    let image_ref = format!(
        "pkg:oci/{short}@sha256%3A{hex}?repository_url={image}&tag={}",
        root.version
    );
    dependencies.push(json!({ "ref": image_ref, "dependsOn": [root_ref] }));
    dependencies.sort_by(|a, b| a["ref"].as_str().cmp(&b["ref"].as_str()));
    let everything = std::iter::once(root.licence.clone())
        .chain(shipped.crates.iter().map(|c| c.licence.clone()))
        .chain(shipped.libraries.iter().map(|l| l.licence.clone()));
    let bom = json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "timestamp": timestamp,
            "tools": { "components": [{ "type": "application", "name": "csi-nodekit examples/sbom.rs" }] },
            "component": {
                "type": "container",
                "bom-ref": image_ref,
                "name": image,
                "version": digest,
                "description": format!(
                    "The {} {} image: /{} and its mode links, and its licence notices in /licenses/",
                    root.name, root.version, root.name
                ),
                "purl": image_ref,
                "hashes": sha256(hex),
                "licenses": licence(&shipped::combined(everything)),
                "properties": [property("csi-nodekit:tag", &root.version)],
            },
            "properties": [
                property("cdx:reproducible", "true"),
                // Listed as runtime crates by the binary's .dep-v0, which scanners read, but never
                // linked: proc-macros and what only they use, and crates listed only because
                // build- and dev-dependencies' features are unified into the list
                // (support/shipped.rs).
                property("csi-nodekit:not-linked", shipped.not_linked.join(" ")),
            ],
        },
        "components": components,
        "dependencies": dependencies,
    });
    println!("{}", serde_json::to_string_pretty(&bom)?);
    Ok(())
}
