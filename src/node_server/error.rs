//! The one error type for failed filesystem and mount operations: it names the operation
//! and the path, and becomes an INTERNAL status at the gRPC boundary.

use std::path::{Path, PathBuf};

#[derive(Debug)]
pub struct PathError {
    pub op: &'static str,
    pub path: PathBuf,
    pub source: std::io::Error,
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.op, self.path.display(), self.source)
    }
}

impl std::error::Error for PathError {}

impl From<PathError> for tonic::Status {
    fn from(e: PathError) -> Self {
        tonic::Status::internal(e.to_string())
    }
}

/// `map_err(at("remove", path))`: wraps an I/O error with its operation and path.
pub fn at<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> PathError + 'a {
    move |source| PathError {
        op,
        path: path.to_owned(),
        source,
    }
}
