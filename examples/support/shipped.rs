//! What the image ships, as its SBOM (`examples/sbom.rs`) and its licence notices
//! (`examples/notices.rs`) both describe it: the crates linked into the binary, the Rust
//! standard library, the C libraries linked in statically (glibc, libgcc) and the C and assembly
//! some crates compile in (ring's).
//!
//! The crates come from the dependency list the binary carries (`cargo auditable`'s `.dep-v0`),
//! walked from our own package along runtime dependencies, never into a proc-macro, and kept
//! only where a build of the binary compiles them. The list says more than is linked, in two
//! ways: it records a proc-macro that a runtime crate depends on (async-trait,
//! tracing-attributes, prometheus-client-derive-encode) as a runtime dependency, and with it
//! syn, quote, proc-macro2 and unicode-ident; and it is made from `cargo metadata`, whose
//! features are those of every target at once, build- and dev-dependencies' included, so it
//! lists crates the binary's build never compiles: regex and its three crates as env_filter's
//! (optional, and active there because the build script's prost-build uses regex) and
//! allocator-api2 as hashbrown's (a default feature a test's jsonschema asks for). `cargo tree -e normal` resolves
//! features as that build does. `cargo metadata` says which crates are proc-macros, what licence
//! each declares and where its source is; `Cargo.lock` gives each `.crate`'s SHA-256. The C libraries are the ones the C compiler driver (`cc`, rustc's linker
//! here) links, found on this machine and named by the Debian packages that installed them: the
//! binary must have been built here.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::Command;

use auditable_serde::{DependencyKind, Source, VersionInfo};
use serde_json::Value;

pub type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The target the static binary is built for (`scripts/build-static.sh`).
pub const TARGET: &str = "x86_64-unknown-linux-gnu";

/// Our own package.
pub struct Root {
    pub name: String,
    pub version: String,
    pub licence: String,
    pub repository: String,
    /// The crates it depends on directly (purls), linked ones only.
    pub depends_on: Vec<String>,
}

/// A crate linked into the binary.
pub struct Crate {
    pub name: String,
    pub version: String,
    /// Its `license` from Cargo.toml as an SPDX expression (`MIT/Apache-2.0` → `MIT OR Apache-2.0`).
    pub licence: String,
    pub authors: Vec<String>,
    /// Its source as cargo unpacked it from crates.io.
    pub dir: PathBuf,
    /// The SHA-256 of its `.crate`, from Cargo.lock.
    pub checksum: String,
    /// Its build script compiles C or assembly into the binary (a `links` key and `cc`).
    pub native: bool,
    /// The linked crates it depends on (purls).
    pub depends_on: Vec<String>,
}

impl Crate {
    pub fn purl(&self) -> String {
        purl(&self.name, &self.version)
    }

    /// Its directory under `/licenses/crates/`.
    pub fn key(&self) -> String {
        format!("{}-{}", self.name, self.version)
    }
}

pub fn purl(name: &str, version: &str) -> String {
    format!("pkg:cargo/{name}@{version}")
}

/// A library linked in that is not a crate: the Rust standard library, glibc, libgcc.
pub struct Library {
    /// Its directory under `/licenses/` and its `bom-ref`.
    pub key: &'static str,
    pub name: String,
    pub version: String,
    pub description: String,
    pub licence: String,
    pub purl: Option<String>,
    /// The file linked in, and its SHA-256.
    pub file: PathBuf,
    pub sha256: String,
    /// That file's path as the SBOM names it: the Rust toolchain's relative to its sysroot,
    /// which differs between machines.
    pub shown: String,
    /// The Debian package that installed that file: name (with architecture), version, and the
    /// source package with its version.
    pub debian: Option<Debian>,
    /// Its notices: the name each gets in its directory, and where it is on this machine.
    pub notices: Vec<(String, PathBuf)>,
}

pub struct Debian {
    pub package: String,
    pub version: String,
    pub source: String,
    pub source_version: String,
    /// `debian-12`, from /etc/os-release.
    pub distro: String,
}

pub struct Shipped {
    pub root: Root,
    /// Sorted by name and version.
    pub crates: Vec<Crate>,
    /// The Rust standard library, glibc, libgcc, in that order.
    pub libraries: Vec<Library>,
    /// Crates the dependency list marks as runtime that are never linked (proc-macros and what
    /// only they use), `name@version`.
    pub not_linked: Vec<String>,
    /// The binary's SHA-256.
    pub binary_sha256: String,
    /// The Rust toolchain's directory of standard licence texts (`<SPDX id>.txt`).
    pub licence_texts: PathBuf,
}

/// Runs a command and returns its standard output, trimmed.
pub fn output(command: &mut Command) -> Result<String> {
    let out = command
        .output()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

/// The SHA-256 of a file, in hex (sha256sum, from coreutils).
pub fn sha256(path: &Path) -> Result<String> {
    let out = output(Command::new("sha256sum").arg(path))?;
    Ok(out
        .split_whitespace()
        .next()
        .ok_or("sha256sum printed nothing")?
        .to_owned())
}

/// `MIT/Apache-2.0` and `Apache-2.0 / MIT`, old Cargo spellings, as SPDX expressions.
pub fn spdx(licence: &str) -> String {
    licence
        .replace('/', " OR ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The licence and exception ids an SPDX expression names.
pub fn spdx_ids(expression: &str) -> Vec<String> {
    expression
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter(|w| !w.is_empty() && !["AND", "OR", "WITH"].contains(w))
        .map(str::to_owned)
        .collect()
}

/// `(name, version)` → the `.crate`'s SHA-256, for every crates.io package in Cargo.lock.
fn lock_checksums(manifest_dir: &Path) -> Result<BTreeMap<(String, String), String>> {
    let lock = std::fs::read_to_string(manifest_dir.join("Cargo.lock"))?;
    let mut out = BTreeMap::new();
    for block in lock.split("[[package]]").skip(1) {
        let field = |key: &str| {
            block.lines().find_map(|line| {
                line.strip_prefix(key)?
                    .strip_prefix(" = \"")?
                    .strip_suffix('"')
                    .map(str::to_owned)
            })
        };
        if let (Some(name), Some(version), Some(sum)) =
            (field("name"), field("version"), field("checksum"))
        {
            out.insert((name, version), sum);
        }
    }
    Ok(out)
}

/// `name@version` of every crate a release build of the binary compiles into it: `cargo tree`
/// along normal dependencies (features resolved as that build resolves them, without the
/// build- and dev-dependencies'), not into proc-macros. With default features: a binary built with fewer
/// lists fewer crates, and only the ones in both count.
fn built_crates(manifest_dir: &Path) -> Result<BTreeSet<String>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let tree = output(
        Command::new(cargo)
            .args(["tree", "--locked", "-e", "normal", "--target", TARGET])
            .args(["--prefix", "depth", "--no-dedupe", "--format", "{p}"])
            .current_dir(manifest_dir),
    )?;
    let mut out = BTreeSet::new();
    // Lines are `<depth><name> v<version>[ (proc-macro)][ (<path>)]`; a proc-macro's subtree is
    // every deeper line after it.
    let mut pruned_below: Option<usize> = None;
    for line in tree.lines() {
        let digits = line.bytes().take_while(u8::is_ascii_digit).count();
        let depth: usize = line[..digits].parse()?;
        if pruned_below.is_some_and(|d| depth > d) {
            continue;
        }
        pruned_below = None;
        let mut words = line[digits..].split_whitespace();
        let (Some(name), Some(version)) = (words.next(), words.next()) else {
            return Err(format!("cargo tree: {line}").into());
        };
        if line.contains(" (proc-macro)") {
            pruned_below = Some(depth);
            continue;
        }
        let version = version.strip_prefix('v').unwrap_or(version);
        out.insert(format!("{name}@{version}"));
    }
    Ok(out)
}

/// What the binary links, from its dependency list, `cargo metadata` and this machine.
pub fn read(binary: &Path) -> Result<Shipped> {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let info: VersionInfo = auditable_info::audit_info_from_file(binary, Default::default())
        .map_err(|e| {
            format!(
                "{}: no dependency list (built without cargo auditable?): {e}",
                binary.display()
            )
        })?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let metadata: Value = serde_json::from_str(&output(
        Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--locked"])
            .args(["--filter-platform", TARGET])
            .current_dir(manifest_dir),
    )?)?;
    let mut packages: BTreeMap<(String, String), &Value> = BTreeMap::new();
    for p in metadata["packages"]
        .as_array()
        .ok_or("cargo metadata: no packages")?
    {
        let key = (
            p["name"].as_str().unwrap_or_default().to_owned(),
            p["version"].as_str().unwrap_or_default().to_owned(),
        );
        packages.insert(key, p);
    }
    let meta = |name: &str, version: &str| {
        packages
            .get(&(name.to_owned(), version.to_owned()))
            .copied()
            .ok_or_else(|| {
                format!("{name} {version} is not in `cargo metadata`: another checkout?")
            })
    };
    let is_proc_macro = |p: &Value| {
        p["targets"].as_array().is_some_and(|targets| {
            targets.iter().any(|t| {
                t["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "proc-macro"))
            })
        })
    };

    // The walk: from the root, along runtime packages, never into a proc-macro, nor into a
    // crate the binary's build does not compile.
    let built = built_crates(manifest_dir)?;
    let list = &info.packages;
    let root_index = list
        .iter()
        .position(|p| p.root)
        .ok_or("the dependency list names no root package")?;
    let mut linked = BTreeSet::new();
    let mut stack = vec![root_index];
    while let Some(i) = stack.pop() {
        let p = &list[i];
        let version = p.version.to_string();
        if p.kind != DependencyKind::Runtime
            || is_proc_macro(meta(&p.name, &version)?)
            || (!p.root && !built.contains(&format!("{}@{version}", p.name)))
            || !linked.insert(i)
        {
            continue;
        }
        stack.extend(&p.dependencies);
    }
    let deps_of = |i: usize| -> Vec<String> {
        let mut on: Vec<String> = list[i]
            .dependencies
            .iter()
            .filter(|d| linked.contains(*d))
            .map(|&d| purl(&list[d].name, &list[d].version.to_string()))
            .collect();
        on.sort();
        on.dedup();
        on
    };

    let checksums = lock_checksums(manifest_dir)?;
    let mut crates = Vec::new();
    for &i in linked.iter().filter(|&&i| i != root_index) {
        let p = &list[i];
        let version = p.version.to_string();
        if p.source != Source::CratesIo {
            return Err(format!("{} is not from crates.io: {:?}", p.name, p.source).into());
        }
        let m = meta(&p.name, &version)?;
        let licence = m["license"]
            .as_str()
            .map(spdx)
            .ok_or_else(|| format!("{} {version} declares no licence", p.name))?;
        let checksum = checksums
            .get(&(p.name.clone(), version.clone()))
            .ok_or_else(|| format!("{} {version} has no checksum in Cargo.lock", p.name))?
            .clone();
        let dir = Path::new(m["manifest_path"].as_str().ok_or("no manifest_path")?)
            .parent()
            .ok_or("manifest_path has no parent")?
            .to_owned();
        let native = m["links"].is_string()
            && m["dependencies"].as_array().is_some_and(|deps| {
                deps.iter()
                    .any(|d| d["name"] == "cc" && d["kind"] == "build")
            });
        let authors = m["authors"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        crates.push(Crate {
            name: p.name.clone(),
            version,
            licence,
            authors,
            dir,
            checksum,
            native,
            depends_on: deps_of(i),
        });
    }
    crates.sort_by(|a, b| (&a.name, &a.version).cmp(&(&b.name, &b.version)));
    let mut not_linked: Vec<String> = list
        .iter()
        .enumerate()
        .filter(|(i, p)| p.kind == DependencyKind::Runtime && !linked.contains(i))
        .map(|(_, p)| format!("{}@{}", p.name, p.version))
        .collect();
    not_linked.sort();

    let root = &list[root_index];
    let root_meta = meta(&root.name, &root.version.to_string())?;
    let root = Root {
        name: root.name.clone(),
        version: root.version.to_string(),
        licence: root_meta["license"]
            .as_str()
            .map(spdx)
            .ok_or("our package declares no licence")?,
        repository: root_meta["repository"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        depends_on: deps_of(root_index),
    };

    let (rust_std, licence_texts) = rust_std(binary)?;
    Ok(Shipped {
        root,
        crates,
        libraries: vec![rust_std, glibc()?, libgcc()?],
        not_linked,
        binary_sha256: sha256(binary)?,
        licence_texts,
    })
}

/// The Rust standard library of the toolchain that built the binary (its `.comment` names the
/// compiler; it must be this one), with the notices the toolchain ships for it.
fn rust_std(binary: &Path) -> Result<(Library, PathBuf)> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let version = output(Command::new(&rustc).arg("--version"))?;
    let comment = output(Command::new("readelf").args(["-p", ".comment"]).arg(binary))?;
    let named = version.replacen("rustc ", "rustc version ", 1);
    if !comment.contains(&named) {
        return Err(format!(
            "{} was not built by this toolchain ({version}): its .comment says\n{comment}",
            binary.display()
        )
        .into());
    }
    let sysroot = PathBuf::from(output(Command::new(&rustc).args(["--print", "sysroot"]))?);
    let lib = sysroot.join("lib/rustlib").join(TARGET).join("lib");
    let mut libstd: Vec<PathBuf> = std::fs::read_dir(&lib)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libstd-") && n.ends_with(".rlib"))
        })
        .collect();
    let [file] = &mut libstd[..] else {
        return Err(format!("not one libstd-*.rlib in {}", lib.display()).into());
    };
    let file = std::mem::take(file);
    let docs = sysroot.join("share/doc/rust");
    let copyright = docs.join("COPYRIGHT-library.html");
    let html = std::fs::read_to_string(&copyright).map_err(|e| {
        format!(
            "{}: {e}: the Rust standard library's notices come with the toolchain's rust-docs \
             component (rustup component add rust-docs)",
            copyright.display()
        )
    })?;
    // The licences the notices name by id only (the files of the Rust tree); the crates it
    // lists come with their texts inside the HTML.
    let texts = docs.join("licenses");
    let mut notices = vec![("COPYRIGHT-library.html".to_owned(), copyright)];
    let named: BTreeSet<String> = html
        .lines()
        .filter_map(|l| l.trim().strip_prefix("<p><b>License:</b>"))
        .filter_map(|l| l.strip_suffix("</p>"))
        .flat_map(|l| spdx_ids(&spdx(l)))
        .collect();
    for id in named {
        let text = texts.join(format!("{id}.txt"));
        if text.is_file() {
            notices.push((format!("{id}.txt"), text));
        }
    }
    let number = version
        .split_whitespace()
        .nth(1)
        .ok_or("rustc --version: no version")?
        .to_owned();
    Ok((
        Library {
            key: "rust-std",
            name: "rust-std".to_owned(),
            description: format!(
                "The Rust standard library (core, alloc, std and the crates they use), from \
                 {version}"
            ),
            purl: Some(format!("pkg:generic/rust-std@{number}")),
            version: number,
            licence: "MIT OR Apache-2.0".to_owned(),
            sha256: sha256(&file)?,
            shown: format!(
                "<rustc --print sysroot>/{}",
                file.strip_prefix(&sysroot)?.display()
            ),
            file,
            debian: None,
            notices,
        },
        texts,
    ))
}

/// Where the C compiler driver finds a file it links, with symbolic links resolved.
fn linked_file(name: &str) -> Result<PathBuf> {
    let path = output(Command::new("cc").arg(format!("-print-file-name={name}")))?;
    let path = std::fs::canonicalize(&path)
        .map_err(|e| format!("cc finds {name} at {path}, which cannot be read: {e}"))?;
    Ok(path)
}

/// The Debian package that installed a file.
fn debian(file: &Path) -> Result<Debian> {
    let owner = output(Command::new("dpkg").arg("-S").arg(file)).map_err(|e| {
        format!(
            "{e}\nthe notices and the SBOM name the Debian packages the C libraries come from; \
             this build machine has no dpkg (only Debian and Ubuntu are supported)"
        )
    })?;
    let package = owner
        .split_once(": ")
        .map(|(p, _)| p.to_owned())
        .ok_or_else(|| format!("dpkg -S: {owner}"))?;
    let fields = output(Command::new("dpkg-query").args([
        "-W",
        "-f=${Version}\t${source:Package}\t${source:Version}",
        &package,
    ]))?;
    let mut fields = fields.split('\t').map(str::to_owned);
    let (Some(version), Some(source), Some(source_version)) =
        (fields.next(), fields.next(), fields.next())
    else {
        return Err(format!("dpkg-query {package}: no version").into());
    };
    let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let field = |key: &str| {
        os.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(|v| v.trim_matches('"').to_owned())
            .unwrap_or_default()
    };
    Ok(Debian {
        package,
        version,
        source,
        source_version,
        distro: format!("{}-{}", field("ID"), field("VERSION_ID")),
    })
}

fn deb_purl(d: &Debian) -> String {
    let (name, arch) = d.package.split_once(':').unwrap_or((&d.package, "all"));
    let version = d.version.replace('+', "%2B").replace(':', "%3A");
    format!(
        "pkg:deb/debian/{name}@{version}?arch={arch}&distro={}",
        d.distro
    )
}

/// The Debian package's copyright file: its notices, as Debian ships them.
fn copyright(d: &Debian) -> PathBuf {
    let name = d.package.split(':').next().unwrap_or(&d.package);
    PathBuf::from(format!("/usr/share/doc/{name}/copyright"))
}

/// glibc, linked statically from libc.a.
fn glibc() -> Result<Library> {
    let file = linked_file("libc.a")?;
    let d = debian(&file)?;
    // `glibc 2.36`: the C library of this machine, the one libc.a is built from.
    let running = output(Command::new("getconf").arg("GNU_LIBC_VERSION"))?;
    let version = running
        .strip_prefix("glibc ")
        .ok_or_else(|| format!("getconf GNU_LIBC_VERSION: {running}"))?
        .to_owned();
    if !d.source_version.starts_with(&format!("{version}-")) && d.source_version != version {
        return Err(format!(
            "libc.a comes from {} {}, but this machine runs glibc {version}",
            d.source, d.source_version
        )
        .into());
    }
    let notices = vec![
        ("copyright".to_owned(), copyright(&d)),
        (
            "LGPL-2.1".to_owned(),
            "/usr/share/common-licenses/LGPL-2.1".into(),
        ),
        (
            "GPL-2".to_owned(),
            "/usr/share/common-licenses/GPL-2".into(),
        ),
    ];
    Ok(Library {
        key: "glibc",
        name: "glibc".to_owned(),
        description: format!(
            "The GNU C Library, linked statically: {} from Debian's {} {}",
            file.display(),
            d.package,
            d.version
        ),
        licence: "LGPL-2.1-or-later".to_owned(),
        purl: Some(deb_purl(&d)),
        version,
        sha256: sha256(&file)?,
        shown: file.display().to_string(),
        file,
        debian: Some(d),
        notices,
    })
}

/// libgcc, linked statically: its unwinder (libgcc_eh.a, which Rust's standard library uses)
/// and its support routines (libgcc.a).
fn libgcc() -> Result<Library> {
    let file = linked_file("libgcc_eh.a")?;
    let d = debian(&file)?;
    let version = output(Command::new("cc").arg("-dumpfullversion"))?;
    let notices = vec![
        ("copyright".to_owned(), copyright(&d)),
        (
            "GPL-3".to_owned(),
            "/usr/share/common-licenses/GPL-3".into(),
        ),
    ];
    Ok(Library {
        key: "libgcc",
        name: "libgcc".to_owned(),
        description: format!(
            "GCC's runtime library, linked statically: the unwinder ({}) and support \
             routines (libgcc.a beside it), from Debian's {} {}",
            file.display(),
            d.package,
            d.version
        ),
        licence: "GPL-3.0-or-later WITH GCC-exception-3.1".to_owned(),
        purl: Some(deb_purl(&d)),
        version,
        sha256: sha256(&file)?,
        shown: file.display().to_string(),
        file,
        debian: Some(d),
        notices,
    })
}

/// One SPDX expression for everything: each distinct term once (an `AND` list split into its
/// terms, an `OR` list's terms sorted), joined with `AND`.
pub fn combined(expressions: impl IntoIterator<Item = String>) -> String {
    let mut parts = BTreeSet::new();
    for e in expressions {
        if e.contains('(') {
            parts.insert(format!("({e})"));
        } else if e.contains(" OR ") {
            let mut terms: Vec<&str> = e.split(" OR ").collect();
            terms.sort();
            terms.dedup();
            parts.insert(format!("({})", terms.join(" OR ")));
        } else {
            parts.extend(e.split(" AND ").map(str::to_owned));
        }
    }
    parts.into_iter().collect::<Vec<_>>().join(" AND ")
}

/// Whether a file's name says it holds a licence or notice (`LICENSE-MIT`, `COPYING`,
/// `Apache-LICENSE`, `LICENSE.txt`, `NOTICE`, `COPYRIGHT`), and it is no source file.
pub fn is_licence_file(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    let named = ["LICENSE", "LICENCE", "COPYING", "NOTICE", "COPYRIGHT"]
        .iter()
        .any(|w| upper.contains(w));
    let code = [
        ".RS", ".C", ".H", ".S", ".PL", ".PY", ".TOML", ".JSON", ".SH",
    ]
    .iter()
    .any(|ext| upper.ends_with(ext));
    named && !code
}

/// A crate's licence files, anywhere in its source (ring keeps the licences of its C parts
/// beside them, tracing-core its spin module's), as paths relative to it, sorted.
pub fn licence_files(dir: &Path) -> Result<Vec<PathBuf>> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let path = entry.path();
            let kind = entry.file_type()?;
            if kind.is_dir() {
                walk(root, &path, out)?;
            } else if kind.is_file() && is_licence_file(&entry.file_name().to_string_lossy()) {
                out.push(path.strip_prefix(root)?.to_owned());
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.sort();
    Ok(out)
}
