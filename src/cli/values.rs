//! Flag values as types argh parses, so that a value no mode can use is refused while the
//! command line is parsed, before anything starts, and the modes' `Settings::from_args` only
//! assemble what was parsed: [`SocketAddress`], [`PositiveDuration`], [`HttpEndpoint`],
//! [`MetricsPath`], [`TcpPort`], [`NonEmptyPath`], [`ByteSize`], and [`OrEmpty`] for a flag
//! whose empty value means "not set"; in `files`, [`AbsolutePath`], [`HostSocketPath`] and
//! [`SocketMode`].
//!
//! Each implements [`FlagValue`]; [`flag_value!`] gives it argh's `FromArgValue`. A refusal
//! travels through argh's error text framed by NUL characters, which no command-line word can
//! hold: [`Refusal::decode`] finds it there without reading a word of argh's English, and
//! `flags` finds the flag it belongs to in the command line's own words. The line it becomes is
//! Go's: `invalid value "<value>" for flag --<flag>: <why>`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::quantity::Quantity;

mod files;
pub use files::{AbsolutePath, GroupId, HostSocketPath, SocketMode};

/// What frames a refusal inside argh's error text.
const FRAME: char = '\0';

/// Why a flag's value cannot be used, and the value the error line shows (the text given,
/// unless the type says otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    why: String,
    shown: Option<String>,
}

impl Refusal {
    /// A refusal for a reason, shown with the text given.
    pub fn new(why: impl std::fmt::Display) -> Self {
        Self {
            why: why.to_string(),
            shown: None,
        }
    }

    /// The same refusal, shown with `shown` instead of the text given (a zero duration is
    /// shown as Go prints it, `0s`, however it was written).
    pub fn showing(self, shown: &str) -> Self {
        Self {
            shown: Some(shown.to_owned()),
            ..self
        }
    }

    /// The reason, in Go's words: `socket address is empty`.
    pub fn why(&self) -> &str {
        &self.why
    }

    /// The value the error line shows; known once the refusal has been through argh
    /// ([`Refusal::decode`] always sets it).
    pub fn shown(&self) -> Option<&str> {
        self.shown.as_deref()
    }

    /// The refusal of `text`, as argh is handed it: framed, so it can be found in whatever
    /// argh writes around it. A NUL in the reason or the value (impossible on a real command
    /// line) is written as Go's `\x00`, so the frame stays whole.
    fn encode(&self, text: &str) -> String {
        let clean = |s: &str| s.replace(FRAME, "\\x00");
        let shown = self.shown.as_deref().unwrap_or(text);
        format!("{FRAME}{}{FRAME}{}{FRAME}", clean(&self.why), clean(shown))
    }

    /// The refusal in an error text of argh's, if it holds one, with the value to show.
    /// Only the frame is read: what argh writes around it does not matter.
    pub fn decode(text: &str) -> Option<Self> {
        let mut parts = text.rsplitn(4, FRAME);
        let _after = parts.next()?;
        let shown = parts.next()?;
        let why = parts.next()?;
        parts.next()?;
        Some(Self {
            why: why.to_owned(),
            shown: Some(shown.to_owned()),
        })
    }
}

/// A flag value of ours: what a command-line text stands for, or why it cannot be used.
pub trait FlagValue: Sized {
    fn parse(text: &str) -> Result<Self, Refusal>;

    /// A value written in the code, such as a flag's default; panics if it cannot be used
    /// (the tests parse every mode's empty command line, so a bad default fails them).
    fn known(text: &str) -> Self {
        Self::parse(text).unwrap_or_else(|refusal| panic!("{text:?}: {}", refusal.why))
    }
}

/// What argh's `FromArgValue` does for a [`FlagValue`]: the value, or the framed refusal.
pub fn from_arg_value<T: FlagValue>(text: &str) -> Result<T, String> {
    T::parse(text).map_err(|refusal| refusal.encode(text))
}

/// Implements argh's `FromArgValue` for [`FlagValue`] types (argh's own blanket impl is for
/// `FromStr` types, whose errors it turns into bare text).
macro_rules! flag_value {
    ($($type:ty),* $(,)?) => {$(
        impl argh::FromArgValue for $type {
            fn from_arg_value(text: &str) -> Result<Self, String> {
                $crate::cli::values::from_arg_value(text)
            }
        }
    )*};
}
pub(crate) use flag_value;

flag_value!(
    SocketAddress,
    PositiveDuration,
    HttpEndpoint,
    MetricsPath,
    TcpPort,
    NonEmptyPath,
    ByteSize,
    BlockSize,
    AbsolutePath,
    HostSocketPath,
    SocketMode,
    GroupId,
    FlowFile,
);

/// A Unix socket address: `unix:///path`, `unix:/path` or `/path`, absolute and short enough
/// for a socket. Keeps the text given (the help's defaults are written that way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketAddress {
    text: String,
    path: PathBuf,
}

impl SocketAddress {
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn into_path(self) -> PathBuf {
        self.path
    }
}

impl FlagValue for SocketAddress {
    fn parse(text: &str) -> Result<Self, Refusal> {
        let path = crate::socket::parse_address(text).map_err(Refusal::new)?;
        Ok(Self {
            text: text.to_owned(),
            path,
        })
    }
}

/// A Go duration (`3s`, `1m30s`) of more than zero: a deadline of zero would fail every call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PositiveDuration(Duration);

impl PositiveDuration {
    /// A default written in the code; panics at zero.
    pub const fn from_secs(secs: u64) -> Self {
        assert!(secs > 0, "a positive duration");
        Self(Duration::from_secs(secs))
    }

    pub fn get(self) -> Duration {
        self.0
    }
}

impl FlagValue for PositiveDuration {
    fn parse(text: &str) -> Result<Self, Refusal> {
        let crate::gocompat::GoDuration(duration) = text.parse().map_err(Refusal::new)?;
        match duration.is_zero() {
            true => Err(Refusal::new("must be more than 0").showing("0s")),
            false => Ok(Self(duration)),
        }
    }
}

/// A Go-style listen address: `:9808`, `0.0.0.0:9808`, `[::1]:9808`, `localhost:9808`
/// (see [`crate::http::check_endpoint`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpEndpoint(String);

impl HttpEndpoint {
    pub fn into_string(self) -> String {
        self.0
    }
}

impl FlagValue for HttpEndpoint {
    fn parse(text: &str) -> Result<Self, Refusal> {
        crate::http::check_endpoint(text).map_err(Refusal::new)?;
        Ok(Self(text.to_owned()))
    }
}

/// The path of the metrics page: `/metrics`. Not the health check's `/healthz` (which would
/// answer instead, and the metrics never be read), and without `?` or `#` (a request's path
/// never holds them, so the page would never be found).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsPath(String);

/// The path the health check is served at, beside the metrics page.
const HEALTH_PATH: &str = "/healthz";

impl MetricsPath {
    pub fn into_string(self) -> String {
        self.0
    }
}

impl FlagValue for MetricsPath {
    fn parse(text: &str) -> Result<Self, Refusal> {
        if !text.starts_with('/') {
            return Err(Refusal::new("must start with /"));
        }
        if text == HEALTH_PATH {
            return Err(Refusal::new(format!(
                "clashes with the health check at {HEALTH_PATH}"
            )));
        }
        match text.contains(['?', '#']) || text.contains(char::is_whitespace) {
            true => Err(Refusal::new(
                "a request's path never holds ?, # or spaces; the page could not be found",
            )),
            false => Ok(Self(text.to_owned())),
        }
    }
}

/// A TCP port from 1 to 65535, in digits only, kept as written (`--health-port`, a string
/// flag upstream, is compared and joined to an address as text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpPort(String);

impl TcpPort {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FlagValue for TcpPort {
    fn parse(text: &str) -> Result<Self, Refusal> {
        let valid = text.parse::<u16>().is_ok_and(|port| port > 0)
            && text.bytes().all(|b| b.is_ascii_digit());
        match valid {
            true => Ok(Self(text.to_owned())),
            false => Err(Refusal::new("expected a port from 1 to 65535")),
        }
    }
}

/// A path that is not empty (a directory the mode works in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NonEmptyPath(PathBuf);

impl NonEmptyPath {
    pub fn into_path(self) -> PathBuf {
        self.0
    }
}

impl FlagValue for NonEmptyPath {
    fn parse(text: &str) -> Result<Self, Refusal> {
        match text.is_empty() {
            true => Err(Refusal::new("must not be empty")),
            false => Ok(Self(PathBuf::from(text))),
        }
    }
}

/// A byte count of at least [`ByteSize::LEAST`] as Kubernetes writes it: `100Gi`, `500M`,
/// `1073741824` (see [`crate::quantity`]). Less would refuse every volume: a directory alone
/// takes a block of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(Quantity);

impl ByteSize {
    /// 1 MiB: the smallest volume a PersistentVolumeClaim usually asks for.
    pub const LEAST: u64 = 1 << 20;

    pub fn bytes(self) -> u64 {
        self.0.bytes()
    }
}

impl FlagValue for ByteSize {
    fn parse(text: &str) -> Result<Self, Refusal> {
        let size: Quantity = text.parse().map_err(Refusal::new)?;
        match size.bytes() {
            0 => Err(Refusal::new(
                "must be more than 0; leave it out to use the free space",
            )),
            bytes if bytes < Self::LEAST => Err(Refusal::new(format!(
                "must be at least 1Mi ({}): no volume fits in {bytes} bytes",
                Self::LEAST
            ))),
            _ => Ok(Self(size)),
        }
    }
}

/// `--snapshot-metadata-block-size`: a power of two from 4Ki (the granule deltas are compared
/// in) to 1Gi, in the quantity forms `--capacity` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSize(u64);

impl BlockSize {
    pub const LEAST: u64 = 4 << 10;
    pub const MOST: u64 = 1 << 30;

    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl FlagValue for BlockSize {
    fn parse(text: &str) -> Result<Self, Refusal> {
        let size: Quantity = text.parse().map_err(Refusal::new)?;
        match size.bytes() {
            bytes if bytes.is_power_of_two() && (Self::LEAST..=Self::MOST).contains(&bytes) => {
                Ok(Self(bytes))
            }
            bytes => Err(Refusal::new(format!(
                "must be a power of two from 4Ki to 1Gi, not {bytes}"
            ))),
        }
    }
}

pub use crate::flow::FlowFile;

/// `--flow=FILE`: the extension picks the format, and the file must be writable now, so that
/// a run is not made only to find that its picture cannot be kept. Nothing is created here.
impl FlagValue for FlowFile {
    fn parse(text: &str) -> Result<Self, Refusal> {
        use nix::unistd::{AccessFlags, access};
        let path = PathBuf::from(text);
        let format = FlowFile::format_of(&path).map_err(Refusal::new)?;
        let writable = match std::fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => Err("is a directory".to_owned()),
            Ok(_) => access(&path, AccessFlags::W_OK).map_err(|e| e.desc().to_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let dir = match path.parent() {
                    Some(dir) if !dir.as_os_str().is_empty() => dir,
                    _ => Path::new("."),
                };
                match std::fs::metadata(dir) {
                    Ok(meta) if meta.is_dir() => access(dir, AccessFlags::W_OK | AccessFlags::X_OK)
                        .map_err(|e| format!("directory {}: {}", dir.display(), e.desc())),
                    Ok(_) => Err(format!("{} is not a directory", dir.display())),
                    Err(e) => Err(format!("directory {}: {e}", dir.display())),
                }
            }
            Err(e) => Err(e.to_string()),
        };
        match writable {
            Ok(()) => Ok(Self { path, format }),
            Err(why) => Err(Refusal::new(format!("cannot be written: {why}"))),
        }
    }
}

/// A flag whose empty value means "not set", as its default is: `--http-endpoint=`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrEmpty<T>(Option<T>);

impl<T> OrEmpty<T> {
    pub fn into_option(self) -> Option<T> {
        self.0
    }
}

impl<T> Default for OrEmpty<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<T: FlagValue> FlagValue for OrEmpty<T> {
    fn parse(text: &str) -> Result<Self, Refusal> {
        match text.is_empty() {
            true => Ok(Self(None)),
            false => T::parse(text).map(|value| Self(Some(value))),
        }
    }
}

impl<T: FlagValue> argh::FromArgValue for OrEmpty<T> {
    fn from_arg_value(text: &str) -> Result<Self, String> {
        from_arg_value(text)
    }
}

#[cfg(test)]
mod tests;
