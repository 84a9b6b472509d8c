//! The image's SBOM: CycloneDX 1.5 JSON, from the dependency list the shipped binary carries
//! (`cargo auditable`'s `.dep-v0` section), so it names what was built, not what a manifest
//! says. `scripts/build-image.sh` writes it beside the OCI archive:
//!
//!     cargo run --example sbom -- <binary> <timestamp>  > csi-nodekit-<version>.cdx.json
//!
//! Reproducible: the timestamp is given (the script passes `SOURCE_DATE_EPOCH`, as for the
//! archive), there is no random serial number (it is optional; `cdx:reproducible` says why it is
//! missing), and components come in the order the binary lists them (sorted by name and
//! version). Build-only crates (the build script's protox and friends) are not in the binary and
//! not in the SBOM.
//!
//! cargo-cyclonedx, the CycloneDX project's own tool, cannot do this: it reads `cargo metadata`,
//! not the binary, and writes a fresh timestamp and serial number on every run.

use std::path::PathBuf;

use auditable_info::Limits;
use auditable_serde::{DependencyKind, Package, Source};
use serde_json::{Value, json};

fn purl(package: &Package) -> String {
    format!("pkg:cargo/{}@{}", package.name, package.version)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    let (Some(binary), Some(timestamp), None) = (args.next(), args.next(), args.next()) else {
        return Err("usage: sbom <binary> <RFC 3339 timestamp>".into());
    };
    let binary = PathBuf::from(binary);
    let timestamp = timestamp.to_string_lossy().into_owned();
    let info = auditable_info::audit_info_from_file(&binary, Limits::default()).map_err(|e| {
        format!(
            "{}: no dependency list (built without cargo auditable?): {e}",
            binary.display()
        )
    })?;
    let packages = &info.packages;
    let in_binary = |p: &Package| p.kind == DependencyKind::Runtime;
    let root = packages
        .iter()
        .find(|p| p.root)
        .ok_or("the dependency list names no root package")?;
    let mut components = Vec::new();
    for package in packages.iter().filter(|p| !p.root && in_binary(p)) {
        if package.source != Source::CratesIo {
            return Err(format!(
                "{} is not from crates.io: {:?}",
                package.name, package.source
            )
            .into());
        }
        components.push(json!({
            "type": "library",
            "bom-ref": purl(package),
            "name": package.name,
            "version": package.version.to_string(),
            "purl": purl(package),
        }));
    }
    let dependencies: Vec<Value> = packages
        .iter()
        .filter(|p| in_binary(p))
        .map(|p| {
            let on: Vec<String> = p
                .dependencies
                .iter()
                .map(|&i| &packages[i])
                .filter(|d| in_binary(d))
                .map(purl)
                .collect();
            json!({ "ref": purl(p), "dependsOn": on })
        })
        .collect();
    let bom = json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "timestamp": timestamp,
            "tools": { "components": [{ "type": "application", "name": "csi-nodekit examples/sbom.rs" }] },
            "component": {
                "type": "application",
                "bom-ref": purl(root),
                "name": root.name,
                "version": root.version.to_string(),
                "purl": purl(root),
                "licenses": [{ "expression": "Apache-2.0" }],
            },
            "properties": [{ "name": "cdx:reproducible", "value": "true" }],
        },
        "components": components,
        "dependencies": dependencies,
    });
    println!("{}", serde_json::to_string_pretty(&bom)?);
    Ok(())
}
