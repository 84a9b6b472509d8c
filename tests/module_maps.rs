//! The maps of the code cannot drift from the code: every module a file declares is named in
//! that file's module docs (`//!`), and `docs/layout.md` names every room of `src/` and of
//! `src/node_server/` and no file or folder that is not there. A module added, moved or
//! renamed without its map fails here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The modules a file declares (`mod x;`, `pub mod x;`, `pub(crate) mod x;`), those behind
/// `#[cfg(test)]` left out: its tests are not part of its map.
fn declared_modules(source: &str) -> Vec<String> {
    let mut modules = Vec::new();
    let mut previous = "";
    for line in source.lines() {
        let trimmed = line.trim();
        let declaration = trimmed
            .strip_prefix("pub ")
            .or_else(|| trimmed.strip_prefix("pub(crate) "))
            .or_else(|| trimmed.strip_prefix("pub(super) "))
            .unwrap_or(trimmed);
        if let Some(name) = declaration
            .strip_prefix("mod ")
            .and_then(|rest| rest.strip_suffix(';'))
            && !previous.contains("cfg(test)")
        {
            modules.push(name.to_owned());
        }
        if !trimmed.is_empty() {
            previous = trimmed;
        }
    }
    modules
}

/// A file's module docs, its `//!` lines.
fn module_docs(source: &str) -> String {
    let lines = source.lines().filter(|l| l.trim_start().starts_with("//!"));
    lines.collect::<Vec<_>>().join("\n")
}

/// Whether `text` names `module` as code: `` `name` ``, `` `name.rs` ``, `` `name/` ``, or the
/// start of a link or path such as `` [`name`] `` or `` `name::Item` ``.
fn names(text: &str, module: &str) -> bool {
    ["`", "`", ".rs`", "/`", "::", "/"]
        .iter()
        .any(|after| text.contains(&format!("`{module}{after}")))
}

#[test]
fn every_module_a_file_declares_is_named_in_that_files_module_docs() {
    let mut missing = Vec::new();
    for file in rust_files(&repo().join("src")) {
        let source = read(&file);
        let docs = module_docs(&source);
        for module in declared_modules(&source) {
            if !names(&docs, &module) {
                let file = file.strip_prefix(repo()).unwrap().display().to_string();
                missing.push(format!("{file}: `{module}`"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "modules missing from their file's //! map:\n{}",
        missing.join("\n")
    );
}

/// What docs/layout.md must name: the files and folders directly under `src/` and directly
/// under `src/node_server/` (the one mode it maps file by file), `main.rs` and `lib.rs` as
/// they are, the rest as `name.rs` or `name/`.
fn rooms() -> Vec<String> {
    let mut rooms = Vec::new();
    for dir in ["src", "src/node_server"] {
        for entry in std::fs::read_dir(repo().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            rooms.push(match path.is_dir() {
                true => format!("{name}/"),
                false => name,
            });
        }
    }
    rooms.retain(|room| room != "lib.rs" && room != "mod.rs");
    rooms.sort();
    rooms.dedup();
    rooms
}

#[test]
fn the_layout_page_names_every_room_of_src_and_of_node_server() {
    let layout = read(&repo().join("docs/layout.md"));
    let missing: Vec<String> = (rooms().into_iter())
        .filter(|room| !layout.contains(&format!("`{room}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/layout.md does not name: {missing:?}"
    );
}

/// Every file or folder name `tree` holds, anywhere below it.
fn names_below(tree: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut todo = vec![tree.to_owned()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                names.insert(format!("{name}/"));
                todo.push(path);
            } else {
                names.insert(name);
            }
        }
    }
    names
}

#[test]
fn every_file_or_folder_the_layout_page_names_is_there() {
    let layout = read(&repo().join("docs/layout.md"));
    let mut there = names_below(&repo().join("src"));
    for top in std::fs::read_dir(repo()).unwrap() {
        let path = top.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        there.insert(if path.is_dir() {
            format!("{name}/")
        } else {
            name
        });
    }
    let named = layout.split('`').skip(1).step_by(2);
    let gone: Vec<&str> = named
        .filter(|code| {
            let looks_like_one = code.ends_with(".rs") || code.ends_with('/');
            let single = !code.trim_end_matches('/').contains('/');
            looks_like_one && single && !code.contains(' ')
        })
        .filter(|code| !there.contains(*code))
        .collect();
    assert!(
        gone.is_empty(),
        "docs/layout.md names what is not in the tree: {gone:?}"
    );
}
