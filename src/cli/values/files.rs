//! Flag values that name files on the node: [`AbsolutePath`], [`HostSocketPath`] (a socket
//! path handed to the kubelet), [`SocketMode`] and [`GroupId`] (a socket's group).

use std::path::PathBuf;

use super::{FlagValue, Refusal};

/// The longest socket path a Unix socket address holds: `sun_path` is 108 bytes, ending in NUL.
const MAX_SOCKET_PATH: usize = 107;

/// An absolute path: a relative one would depend on the directory the container happens to
/// start in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbsolutePath(PathBuf);

impl AbsolutePath {
    pub fn into_path(self) -> PathBuf {
        self.0
    }
}

impl FlagValue for AbsolutePath {
    fn parse(text: &str) -> Result<Self, Refusal> {
        match text.starts_with('/') {
            true => Ok(Self(PathBuf::from(text))),
            false if text.is_empty() => Err(Refusal::new("must not be empty")),
            false => Err(Refusal::new("must be an absolute path")),
        }
    }
}

/// The driver socket's path on the host, as the registrar hands it to the kubelet, which dials
/// it from its own working directory: absolute (`/path` or `unix:///path`) and short enough
/// for a socket address. Kept as written: the kubelet is given the text verbatim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSocketPath(String);

impl HostSocketPath {
    pub fn into_string(self) -> String {
        self.0
    }
}

impl FlagValue for HostSocketPath {
    fn parse(text: &str) -> Result<Self, Refusal> {
        let path = text.strip_prefix("unix://").unwrap_or(text);
        if text.is_empty() {
            return Err(Refusal::new("must not be empty"));
        }
        if !path.starts_with('/') {
            return Err(Refusal::new(
                "must be an absolute path: the kubelet dials it from its own directory",
            ));
        }
        if path.ends_with('/') {
            return Err(Refusal::new(
                "ends in /: a socket path names the socket file, not a directory",
            ));
        }
        match path.len() > MAX_SOCKET_PATH {
            true => Err(Refusal::new(format!(
                "{} bytes, longer than the {MAX_SOCKET_PATH} a socket path can have",
                path.len()
            ))),
            false => Ok(Self(text.to_owned())),
        }
    }
}

/// A socket's file mode, octal (`0660`, `660`, `0o660`): permission bits only. The kernel
/// keeps setuid, setgid and sticky bits on a socket file, where they mean nothing and alarm
/// every audit (`srwsrwsrwt`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SocketMode(u32);

impl SocketMode {
    /// A default written in the code; panics on more than permission bits.
    pub const fn from_bits(mode: u32) -> Self {
        assert!(mode <= 0o777, "permission bits only");
        Self(mode)
    }

    pub fn bits(self) -> u32 {
        self.0
    }
}

impl std::fmt::Debug for SocketMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SocketMode({:04o})", self.0)
    }
}

impl FlagValue for SocketMode {
    fn parse(text: &str) -> Result<Self, Refusal> {
        let digits = text.strip_prefix("0o").unwrap_or(text);
        let octal = !digits.is_empty() && digits.bytes().all(|b| (b'0'..=b'7').contains(&b));
        match u32::from_str_radix(digits, 8) {
            Ok(mode) if octal && mode <= 0o777 => Ok(Self(mode)),
            Ok(mode) if octal && mode <= 0o7777 => Err(Refusal::new(
                "setuid, setgid and sticky bits cannot be set on a socket; \
                 expected permission bits such as 0660",
            )),
            _ => Err(Refusal::new("expected octal such as 0660")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn why<T: FlagValue + std::fmt::Debug>(text: &str) -> String {
        T::parse(text).unwrap_err().why().to_owned()
    }

    #[test]
    fn absolute_paths_refuse_relative_and_empty_ones() {
        assert_eq!(
            AbsolutePath::parse("/registration").unwrap().into_path(),
            PathBuf::from("/registration")
        );
        assert_eq!(
            why::<AbsolutePath>("registration"),
            "must be an absolute path"
        );
        assert_eq!(
            why::<AbsolutePath>("./registration"),
            "must be an absolute path"
        );
        assert_eq!(why::<AbsolutePath>(""), "must not be empty");
    }

    #[test]
    fn host_socket_paths_are_absolute_fit_a_socket_address_and_keep_the_text() {
        for text in ["/var/lib/kubelet/plugins/x/csi.sock", "unix:///x/csi.sock"] {
            assert_eq!(HostSocketPath::parse(text).unwrap().into_string(), text);
        }
        let longest = format!("/{}", "a".repeat(106));
        assert!(HostSocketPath::parse(&longest).is_ok());
        let too_long = format!("/{}", "a".repeat(107));
        assert_eq!(
            why::<HostSocketPath>(&too_long),
            "108 bytes, longer than the 107 a socket path can have"
        );
        for relative in ["csi.sock", "plugins/x/csi.sock", "unix://csi.sock"] {
            assert!(
                why::<HostSocketPath>(relative).starts_with("must be an absolute path"),
                "{relative}"
            );
        }
        assert_eq!(why::<HostSocketPath>(""), "must not be empty");
    }

    #[test]
    fn socket_modes_are_octal_permission_bits_only() {
        assert_eq!(SocketMode::parse("0660").unwrap().bits(), 0o660);
        assert_eq!(SocketMode::parse("700").unwrap().bits(), 0o700);
        assert_eq!(SocketMode::parse("0o755").unwrap().bits(), 0o755);
        assert_eq!(SocketMode::parse("0").unwrap().bits(), 0);
        for special in ["07777", "4660", "01777", "02770"] {
            assert!(
                why::<SocketMode>(special).starts_with("setuid, setgid and sticky bits"),
                "{special}"
            );
        }
        for bad in ["rw", "99", "", "0o", "+660", "-660", "017777"] {
            assert_eq!(
                why::<SocketMode>(bad),
                "expected octal such as 0660",
                "{bad}"
            );
        }
    }
}

/// A numeric group ID for a socket file. `4294967295` is `(gid_t)-1`, which `chown(2)` takes
/// as "leave the group unchanged": accepted, it would silently do nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupId(u32);

impl GroupId {
    pub fn get(self) -> u32 {
        self.0
    }
}

impl FlagValue for GroupId {
    fn parse(text: &str) -> Result<Self, Refusal> {
        match text.parse::<u32>() {
            Ok(u32::MAX) => Err(Refusal::new(
                "is (gid_t)-1, which chown takes as \"leave the group unchanged\"",
            )),
            Ok(gid) => Ok(Self(gid)),
            Err(_) => Err(Refusal::new("expected a numeric group ID")),
        }
    }
}
