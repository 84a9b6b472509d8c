//! Lexical checks on the absolute paths requests name (staging and target paths the kubelet
//! made): normalised without touching the filesystem, and compared for nesting. node-server's
//! request checks and its operations both use them.

use std::path::{Component, Path, PathBuf};

/// Normalises an absolute path (`//` and `.` dropped); refuses relative paths, `..`, NUL.
pub fn normalise(value: &str) -> Result<PathBuf, &'static str> {
    let path = Path::new(value);
    if !path.is_absolute() {
        return Err("must be an absolute path");
    }
    if value.contains('\0') {
        return Err("contains NUL");
    }
    if value.len() > 4095 {
        return Err("is longer than PATH_MAX");
    }
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => return Err("may not contain '..'"),
        }
    }
    if out == Path::new("/") {
        return Err("may not be the root directory");
    }
    Ok(out)
}

/// Whether one path is the other or inside it: a target so placed would mount onto (or
/// under) the staging mount it binds from.
pub fn nested(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}
