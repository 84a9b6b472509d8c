//! Logging set-up shared by every mode: klog's flags (`--v`, `--vmodule`, `--logging-format`,
//! `--skip_headers`, `--add_dir_header`) on top of env_logger; the lines themselves, klog text
//! or component-base JSON, are written by [`lines`]. The values of the klog flags that are
//! accepted and ignored are checked in `klog_values`.
//!
//! Verbosity maps onto `log` levels so that code uses the ordinary macros:
//! `--v` 0–1 → info (quiet: start-up, state changes, warnings, errors), 2–4 → debug (steady-state
//! detail), 5–7 → trace (every gRPC call and probe), 8 and more → trace for the libraries too.
//! `--vmodule` gives single files or modules their own verbosity. `RUST_LOG`, when set,
//! replaces all of this.

mod klog_values;
mod lines;

pub use klog_values::{BufferSize, KlogValueError, Severity, TraceLocation};

use std::sync::Mutex;

use log::{LevelFilter, Log, Metadata, Record};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// A `--logging-format` we do not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown logging format {0:?}: expected text or json")]
pub struct UnknownFormat(pub String);

impl std::str::FromStr for Format {
    type Err = UnknownFormat;
    fn from_str(text: &str) -> Result<Self, UnknownFormat> {
        match text {
            "text" | "" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(UnknownFormat(other.to_owned())),
        }
    }
}

/// What the logging flags ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub verbosity: u8,
    pub vmodule: VModule,
    pub format: Format,
    /// `--add_dir_header`: the header names `dir/file.rs`, not only `file.rs`.
    pub add_dir_header: bool,
    /// `--skip_headers`: text lines carry the message alone.
    pub skip_headers: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            verbosity: 0,
            vmodule: VModule::default(),
            format: Format::Text,
            add_dir_header: false,
            skip_headers: false,
        }
    }
}

impl Options {
    /// The flags that ask for these options, for a child process to log as its parent does
    /// (the demo's node-server, registrar and kubelet).
    pub fn flags(&self) -> Vec<String> {
        let mut flags = vec![format!("--v={}", self.verbosity)];
        if !self.vmodule.0.is_empty() {
            let settings: Vec<String> = (self.vmodule.0.iter())
                .map(|(pattern, level)| format!("{pattern}={level}"))
                .collect();
            flags.push(format!("--vmodule={}", settings.join(",")));
        }
        if self.format == Format::Json {
            flags.push("--logging-format=json".into());
        }
        if self.add_dir_header {
            flags.push("--add_dir_header".into());
        }
        if self.skip_headers {
            flags.push("--skip_headers".into());
        }
        flags
    }
}

/// `--vmodule`: `pattern=N` settings, the first matching one deciding. A pattern matches a
/// record whose source file name without `.rs` matches it (klog's rule: `supervise=5`), or
/// whose module path, crate prefix dropped and `::` written `/`, matches it or lies under a
/// module that does (`registrar=5`, `probe/serve=5`, `h2=4`). `*` and `?` are wildcards.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VModule(pub Vec<(String, u8)>);

/// A `--vmodule` that is not a comma-separated list of `pattern=N`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} does not have the pattern=N format (N a verbosity from 0 to 255)")]
pub struct VModuleError(pub String);

impl std::str::FromStr for VModule {
    type Err = VModuleError;
    fn from_str(text: &str) -> Result<Self, VModuleError> {
        let mut settings = Vec::new();
        for part in text.split(',').filter(|p| !p.is_empty()) {
            let parsed = part
                .split_once('=')
                .filter(|(pattern, _)| !pattern.is_empty())
                .and_then(|(pattern, level)| Some((pattern.to_owned(), level.parse().ok()?)));
            settings.push(parsed.ok_or_else(|| VModuleError(part.to_owned()))?);
        }
        Ok(Self(settings))
    }
}

/// `*` matches any run of characters, `?` any one; everything else itself.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|skip| glob(rest, &text[skip..])),
        Some((&c, rest)) => match text.split_first() {
            Some((&t, text_rest)) if c == b'?' || c == t => glob(rest, text_rest),
            _ => false,
        },
    }
}

impl VModule {
    /// The verbosity the first matching pattern gives a record from `target` in `file`.
    fn verbosity_for(&self, target: &str, file: Option<&str>) -> Option<u8> {
        let stem = file
            .map(std::path::Path::new)
            .and_then(|f| f.file_stem())
            .and_then(|s| s.to_str());
        let module = target
            .strip_prefix(concat!(env!("CARGO_CRATE_NAME"), "::"))
            .unwrap_or(target)
            .replace("::", "/");
        // The module itself and every module it lies under, at `/` boundaries.
        let mut scopes: Vec<&str> = module
            .match_indices('/')
            .map(|(i, _)| &module[..i])
            .collect();
        scopes.push(&module);
        self.0.iter().find_map(|(pattern, level)| {
            let p = pattern.as_bytes();
            let hit = stem.is_some_and(|s| glob(p, s.as_bytes()))
                || scopes.iter().any(|scope| glob(p, scope.as_bytes()));
            hit.then_some(*level)
        })
    }
}

/// The level our own code logs at for a klog verbosity.
pub fn level_for(verbosity: u8) -> LevelFilter {
    match verbosity {
        0..=1 => LevelFilter::Info,
        2..=4 => LevelFilter::Debug,
        _ => LevelFilter::Trace,
    }
}

/// Libraries (h2, hyper, tonic) stay at warnings until very high verbosity: their debug output
/// is per-frame noise.
fn library_level(verbosity: u8) -> LevelFilter {
    if verbosity >= 8 {
        LevelFilter::Trace
    } else {
        LevelFilter::Warn
    }
}

/// Which records are written: klog's flags, or `RUST_LOG` (env_logger's own filter).
enum Filter {
    Klog { verbosity: u8, vmodule: VModule },
    RustLog,
}

impl Filter {
    fn level(&self, target: &str, file: Option<&str>) -> LevelFilter {
        let Self::Klog { verbosity, vmodule } = self else {
            return LevelFilter::Trace;
        };
        if let Some(level) = vmodule.verbosity_for(target, file) {
            return level_for(level);
        }
        if target.starts_with(env!("CARGO_CRATE_NAME")) {
            level_for(*verbosity)
        } else {
            library_level(*verbosity)
        }
    }

    /// The most verbose level any record can be written at.
    fn max(&self) -> LevelFilter {
        match self {
            Self::Klog { verbosity, vmodule } => vmodule
                .0
                .iter()
                .map(|(_, level)| level_for(*level))
                .chain([level_for(*verbosity), library_level(*verbosity)])
                .max()
                .unwrap_or(LevelFilter::Info),
            Self::RustLog => LevelFilter::Trace,
        }
    }
}

/// env_logger writes (and, with `RUST_LOG`, filters); klog's filter sits in front of it.
struct Logger {
    filter: Filter,
    inner: env_logger::Logger,
}

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= self.filter.max() && self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record) {
        if record.level() <= self.filter.level(record.target(), record.file()) {
            self.inner.log(record);
        }
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

/// Installs the global logger; later calls are ignored (tests may call it many times).
pub fn init(options: Options) {
    let mut builder = env_logger::Builder::new();
    builder.target(env_logger::Target::Stderr);
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.is_empty() => {
            builder.parse_filters(&spec);
            Filter::RustLog
        }
        _ => {
            builder.filter_level(LevelFilter::Trace);
            Filter::Klog {
                verbosity: options.verbosity,
                vmodule: options.vmodule.clone(),
            }
        }
    };
    let style = lines::Style {
        add_dir: options.add_dir_header,
        skip_headers: options.skip_headers,
    };
    match options.format {
        Format::Text => builder.format(move |buf, record| lines::text(buf, record, style)),
        Format::Json => builder.format(lines::json),
    };
    let max = filter.max();
    let logger = Logger {
        filter,
        inner: builder.build(),
    };
    if log::set_boxed_logger(Box::new(logger)).is_ok() {
        log::set_max_level(max);
    }
}

static DEFERRED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Keeps a line to be logged once the mode starts its work (see [`log_deferred`]): what is
/// said about the flags waits until they were all found good, so a bad one stays the only
/// line, and an exec probe that exits at once stays silent.
pub fn defer(line: String) {
    crate::mutex::lock(&DEFERRED).push(line);
}

/// Logs the deferred lines (at info); called where every mode starts its runtime.
pub fn log_deferred() {
    let lines = std::mem::take(&mut *crate::mutex::lock(&DEFERRED));
    for line in lines {
        log::info!("{line}");
    }
}

#[cfg(test)]
mod tests;
