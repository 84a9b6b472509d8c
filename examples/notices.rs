//! The image's licence notices: the licence texts and notices of everything linked into the
//! binary, as a directory that `scripts/build-image.sh` copies to `/licenses/` in the image:
//!
//!     cargo run --example notices -- <binary> <directory> <commit>
//!
//! - `README`: what is linked in, each part with its version, licence and where its texts are;
//! - `csi-nodekit/`: our licence;
//! - `crates/<name>-<version>/`: every crate linked in (the binary's `.dep-v0` list, less the
//!   crates it names that are never linked: `support/shipped.rs`), with every licence file of its
//!   published source
//!   (`LICENSE*`, `COPYING*`, `NOTICE*`, `COPYRIGHT*`, `UNLICENSE`, at any depth: ring keeps
//!   those of its C and assembly in `third_party/`), byte for byte. A crate that ships no
//!   licence text gets the standard text of each SPDX licence it names, from the SPDX texts the
//!   Rust toolchain ships (`share/doc/rust/licenses/`), and the README says so;
//! - `rust-std/`: the notices the Rust toolchain ships for its standard library;
//! - `glibc/`: Debian's copyright file for the package libc.a came from, the LGPL-2.1 and GPL-2
//!   texts it refers to, and `SOURCE`: where glibc's source is, and how to relink the program
//!   with a modified glibc (LGPL-2.1 section 6);
//! - `libgcc/`: Debian's copyright file for GCC's runtime (with the GCC Runtime Library
//!   Exception) and the GPL-3 text.
//!
//! It prints one SPDX expression on stdout: the licences of everything in the image, for the
//! image's `org.opencontainers.image.licenses` label.
//!
//! Reproducible: the same binary, commit and build machine give the same bytes (files are
//! written in sorted order with fixed modes; the image build fixes their times).
//!
//! Why not cargo-about, the usual tool: it reads `cargo metadata`, in which every proc-macro a
//! runtime crate depends on (and syn, quote, proc-macro2, unicode-ident under them) is a normal
//! dependency and features are unified with the build- and dev-dependencies', so it would list
//! crates that are never linked (13 here); it knows nothing of glibc, libgcc or the standard library; and it
//! is one more tool for CI to compile and pin.

use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

#[path = "support/shipped.rs"]
#[allow(dead_code)] // the SBOM uses the rest
mod shipped;
use shipped::{Result, Shipped, combined, spdx_ids};

/// Copies `from` to `dir/name`, creating directories as needed, with fixed modes.
fn copy(from: &Path, dir: &Path, name: &Path) -> Result<()> {
    let bytes = std::fs::read(from).map_err(|e| format!("{}: {e}", from.display()))?;
    write(&dir.join(name), &bytes)
}

fn write(to: &Path, bytes: &[u8]) -> Result<()> {
    let parent = to.parent().ok_or("no parent")?;
    std::fs::create_dir_all(parent)?;
    std::fs::write(to, bytes)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o644))?;
    Ok(())
}

/// Every directory under `dir`, mode 0755 whatever the umask.
fn fix_dir_modes(dir: &Path) -> Result<()> {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            fix_dir_modes(&entry.path())?;
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let mut args = std::env::args_os().skip(1);
    let (Some(binary), Some(out), Some(commit), None) =
        (args.next(), args.next(), args.next(), args.next())
    else {
        return Err("usage: notices <binary> <directory> <commit>".into());
    };
    let (binary, out) = (PathBuf::from(binary), PathBuf::from(out));
    let commit = commit.to_string_lossy().into_owned();
    if out.exists() && std::fs::read_dir(&out)?.next().is_some() {
        return Err(format!("{} is not empty", out.display()).into());
    }
    let shipped = shipped::read(&binary)?;
    let Shipped {
        root,
        crates,
        libraries,
        licence_texts,
        ..
    } = &shipped;
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));

    let mut readme = String::new();
    let source = if root.repository.is_empty() {
        format!("commit {commit}")
    } else {
        format!("{}, commit {commit}", root.repository)
    };
    writeln!(
        readme,
        "{name} {version}: the licences of what this image holds\n\
         \n\
         The image holds one program, /{name} (the other names at / are links to it), built\n\
         from the {name} source at\n\
         \x20   {source}\n\
         Linked into it statically: {n} crates from crates.io, the Rust standard library,\n\
         GNU libc (glibc) and GCC's runtime library (libgcc). Each has a directory here with\n\
         the licence texts and notices its source ships.\n",
        name = root.name,
        version = root.version,
        n = crates.len(),
    )?;

    // Ours.
    let ours = Path::new(&root.name);
    copy(&manifest_dir.join("LICENSE"), &out, &ours.join("LICENSE"))?;
    let mut ours_files = vec!["LICENSE".to_owned()];
    for id in spdx_ids(&root.licence) {
        let name = format!("{id}.txt");
        copy(&licence_texts.join(&name), &out, &ours.join(&name))?;
        ours_files.push(name);
    }
    writeln!(
        readme,
        "{}/\n  {} {}, {}: {}\n",
        root.name,
        root.name,
        root.version,
        root.licence,
        ours_files.join(", ")
    )?;

    // The crates.
    writeln!(
        readme,
        "crates/<name>-<version>/\n  \
         The crates linked in, each with every licence file of its source as published on\n  \
         crates.io, byte for byte (paths inside the crate kept). Licence as its Cargo.toml\n  \
         declares it (SPDX).\n"
    )?;
    let mut standard = Vec::new();
    for c in crates {
        let dir = Path::new("crates").join(c.key());
        let mut files: Vec<String> = Vec::new();
        for file in shipped::licence_files(&c.dir)? {
            copy(&c.dir.join(&file), &out, &dir.join(&file))?;
            files.push(file.display().to_string());
        }
        if files.is_empty() {
            for id in spdx_ids(&c.licence) {
                let name = format!("{id}.txt");
                let text = licence_texts.join(&name);
                if !text.is_file() {
                    return Err(format!(
                        "{} {} ships no licence text, and there is no standard text for {id} \
                         in {}",
                        c.name,
                        c.version,
                        licence_texts.display()
                    )
                    .into());
                }
                copy(&text, &out, &dir.join(&name))?;
                files.push(format!("{name} (*)"));
            }
            standard.push(c);
        }
        writeln!(
            readme,
            "  {} {}, {}: {}",
            c.name,
            c.version,
            c.licence,
            files.join(", ")
        )?;
    }
    for c in &standard {
        writeln!(
            readme,
            "\n  (*) {} {} ships no licence text: this is the standard text of the SPDX\n  \
             licence it declares, from the SPDX licence list as the Rust toolchain ships it\n  \
             (share/doc/rust/licenses/). Its copyright holders, as its Cargo.toml names them:\n  \
             {}.",
            c.name,
            c.version,
            if c.authors.is_empty() {
                "none named".to_owned()
            } else {
                c.authors.join(", ")
            }
        )?;
    }
    for c in crates.iter().filter(|c| c.native) {
        writeln!(
            readme,
            "\n  {name} {version} also compiles C and assembly into the binary (its build\n  \
             script): their licence files are among those in crates/{key}/.",
            name = c.name,
            version = c.version,
            key = c.key()
        )?;
    }
    readme.push('\n');

    // The libraries that are not crates.
    for lib in libraries {
        let dir = Path::new(lib.key);
        let mut files = Vec::new();
        for (name, from) in &lib.notices {
            copy(from, &out, &dir.join(name))?;
            files.push(name.clone());
        }
        if lib.key == "glibc" {
            let d = lib.debian.as_ref().ok_or("glibc: no Debian package")?;
            write(
                &out.join(dir).join("SOURCE"),
                glibc_source(lib, d, root, &source).as_bytes(),
            )?;
            files.push("SOURCE".to_owned());
        }
        let from = match &lib.debian {
            Some(d) => format!(
                " (Debian's {} {}, from the source package {} {})",
                d.package, d.version, d.source, d.source_version
            ),
            None => String::new(),
        };
        writeln!(
            readme,
            "{}/\n  {} {}{from}, {}: {}\n",
            lib.key,
            lib.name,
            lib.version,
            lib.licence,
            files.join(", ")
        )?;
    }
    writeln!(
        readme,
        "The CycloneDX SBOM written beside the image's archive lists the same parts, with the\n\
         SHA-256 of each crate's .crate and of each library file linked in."
    )?;
    write(&out.join("README"), readme.as_bytes())?;
    fix_dir_modes(&out)?;

    let everything = std::iter::once(root.licence.clone())
        .chain(crates.iter().map(|c| c.licence.clone()))
        .chain(libraries.iter().map(|l| l.licence.clone()));
    println!("{}", combined(everything));
    Ok(())
}

/// glibc's source, and how to relink the program with a modified glibc.
fn glibc_source(
    lib: &shipped::Library,
    d: &shipped::Debian,
    root: &shipped::Root,
    source: &str,
) -> String {
    let snapshot = format!(
        "https://snapshot.debian.org/package/{}/{}/",
        d.source,
        d.source_version.replace('+', "%2B")
    );
    format!(
        "The GNU C Library (glibc) {version} is linked statically into /{name}.\n\
         \n\
         It is free software under the GNU Lesser General Public License, version 2.1 or (at\n\
         your option) any later version: its text is in LGPL-2.1 here. Debian's copyright file\n\
         for the package (copyright, here) names the licences of its other parts.\n\
         \n\
         The library's source. The program was linked with\n\
         \x20   {file}\n\
         from Debian's package {package} {pversion} ({distro}), built from Debian's\n\
         source package {src} {sversion}: the glibc {version} source with Debian's changes.\n\
         That source package is kept in Debian's archive and at\n\
         \x20   {snapshot}\n\
         and with Debian's source repositories enabled this fetches it:\n\
         \x20   apt-get source {src}={sversion}\n\
         \n\
         Relinking with a modified glibc (LGPL-2.1, section 6). The program that uses the\n\
         library is {name} {pver}, whose complete source is free software (Apache-2.0), at\n\
         \x20   {source}\n\
         To link it with a modified glibc, build the modified library's libc.a, check out that\n\
         commit, and run\n\
         \x20   RUSTFLAGS=\"-L native=<directory of the modified libc.a>\" scripts/build-static.sh\n\
         which links the same program statically against it, that libc.a first in the\n\
         linker's search path (docs/binary.md, \"Build\").\n\
         \n\
         For at least three years from this image's date, the {name} project will give anyone\n\
         who asks a copy of the source of this glibc and of {name} as named above, for no more\n\
         than the cost of providing it: ask through the project's repository{repository}\n",
        version = lib.version,
        name = root.name,
        file = lib.file.display(),
        package = d.package,
        pversion = d.version,
        distro = d.distro,
        src = d.source,
        sversion = d.source_version,
        pver = root.version,
        repository = if root.repository.is_empty() {
            ".".to_owned()
        } else {
            format!(",\n    {}", root.repository)
        },
    )
}
