//! Go compatibility in one place. Our flags, texts and labels must read exactly as the Go tools
//! they replace: Go's duration syntax (`--timeout=2m30s`) and booleans (`--flag=false`), gRPC
//! code names as grpc-go spells them (`Canceled`), and Go's formatting of values in the kubelet's
//! error texts (`%q`, `%v` of a slice, a status error, a failed dial). klog's flag values are
//! in [`logging`](crate::logging), beside the flags they belong to.

use std::time::Duration;

// ---- Durations (`time.ParseDuration`) ----

/// A duration flag value; parses with Go's `time.ParseDuration` rules (negative values are
/// refused: no flag of ours means anything by them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration(pub Duration);

/// A value that is not a Go duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?}: expected e.g. 1s, 500ms, 2m30s")]
pub struct DurationError(pub String);

impl std::str::FromStr for GoDuration {
    type Err = DurationError;
    fn from_str(text: &str) -> Result<Self, DurationError> {
        parse_duration(text)
            .map(GoDuration)
            .ok_or_else(|| DurationError(text.to_owned()))
    }
}

const UNITS: &[(&str, f64)] = &[
    ("ns", 1e-9),
    ("us", 1e-6),
    ("µs", 1e-6),
    ("μs", 1e-6),
    ("ms", 1e-3),
    ("s", 1.0),
    ("m", 60.0),
    ("h", 3600.0),
];

/// Parses a Go duration: a sequence of decimal numbers, each with a unit; `0` alone is allowed.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let body = text.strip_prefix('+').unwrap_or(text);
    if body == "0" {
        return Some(Duration::ZERO);
    }
    if body.is_empty() {
        return None;
    }
    let mut rest = body;
    let mut seconds = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        // Longest unit first so "ms" is not read as "m" followed by garbage.
        let (unit, scale) = UNITS
            .iter()
            .filter(|(unit, _)| after.starts_with(unit))
            .max_by_key(|(unit, _)| unit.len())?;
        seconds += value * scale;
        rest = &after[unit.len()..];
    }
    Duration::try_from_secs_f64(seconds).ok()
}

// ---- Booleans (`strconv.ParseBool`) ----

/// Go's `strconv.ParseBool`, which is what `--flag=value` means for a Go boolean flag.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

// ---- gRPC code names (`codes.Code.String()`) ----

/// gRPC status codes as Go spells them (`codes.Code.String()`), which is what upstream puts in
/// the `grpc_status_code` label.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

// ---- Values and errors as Go prints them ----

/// grpc-go's text of a failed call: `rpc error: code = NotFound desc = …`.
fn status_text(code: tonic::Code, desc: &str) -> String {
    format!("rpc error: code = {} desc = {desc}", code_name(code))
}

/// What grpc-go says when a call's context deadline passes.
pub fn deadline_exceeded() -> String {
    status_text(tonic::Code::DeadlineExceeded, "context deadline exceeded")
}

/// Go's `%q` of a string (`strconv.Quote`): double quotes, backslash escapes for quotes,
/// backslashes and control characters, printable Unicode kept as it is.
pub fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `%v` of a `[]string`: `[a b c]`.
pub fn list(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

/// Go's `%q` of a `[]string`: `["a" "b"]`.
pub fn quoted_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|item| quote(item)).collect();
    format!("[{}]", quoted.join(" "))
}

/// A gRPC status as grpc-go prints it: `rpc error: code = NotFound desc = …`.
pub fn status(status: &tonic::Status) -> String {
    status_text(status.code(), status.message())
}

/// grpc-go's text for a call on a connection whose dial failed, e.g.
/// `… desc = connection error: desc = "transport: Error while dialing: dial unix /x: connect: no
/// such file or directory"`.
pub fn dial_error(path: &std::path::Path, error: &std::io::Error) -> String {
    let reason = match error.raw_os_error() {
        // Go's syscall error strings are the C library's with a lower-case first letter.
        Some(errno) => {
            let text = nix::errno::Errno::from_raw(errno).desc();
            let mut chars = text.chars();
            match chars.next() {
                // The C library's strings are ASCII: no Unicode case tables for this.
                Some(first) => std::iter::once(first.to_ascii_lowercase())
                    .chain(chars)
                    .collect(),
                None => String::new(),
            }
        }
        None => error.to_string(),
    };
    let inner = format!(
        "transport: Error while dialing: dial unix {}: connect: {reason}",
        path.display()
    );
    let desc = format!("connection error: desc = {}", quote(&inner));
    status_text(tonic::Code::Unavailable, &desc)
}

/// A failed call as a probe reports it: grpc-go's status text, with the transport's cause
/// added when the message alone does not say what happened (a refused or broken connection).
pub fn status_with_cause(status: &tonic::Status) -> String {
    let mut message = status.message().to_owned();
    if let Some(source) = std::error::Error::source(status) {
        let cause = crate::deepest_cause(source);
        if !message.contains(&cause) {
            message = if message.is_empty() {
                cause
            } else {
                format!("{message}: {cause}")
            };
        }
    }
    status_text(status.code(), &message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_as_go_does() {
        let table = [
            ("1s", Duration::from_secs(1)),
            ("500ms", Duration::from_millis(500)),
            ("2m30s", Duration::from_secs(150)),
            ("1.5h", Duration::from_secs(5400)),
            ("0", Duration::ZERO),
            ("+3s", Duration::from_secs(3)),
            ("10us", Duration::from_micros(10)),
            ("1h2m3s4ms", Duration::from_millis(3_723_004)),
        ];
        for (text, expected) in table {
            assert_eq!(parse_duration(text), Some(expected), "{text}");
        }
    }

    #[test]
    fn malformed_durations_are_refused() {
        for text in ["", "1", "s", "1x", "-1s", "1..2s", "1s2", " 1s", "ms"] {
            assert_eq!(parse_duration(text), None, "{text:?}");
        }
        assert!(
            "10".parse::<GoDuration>()
                .unwrap_err()
                .to_string()
                .contains("\"10\"")
        );
    }

    #[test]
    fn booleans_parse_as_strconv_parse_bool_does() {
        for (text, expected) in [("1", Some(true)), ("T", Some(true)), ("False", Some(false))] {
            assert_eq!(parse_bool(text), expected, "{text}");
        }
        assert_eq!(parse_bool("yes"), None);
    }

    #[test]
    fn strings_are_quoted_as_go_quotes_them() {
        let table = [
            ("plain", r#""plain""#),
            ("1.0.0", r#""1.0.0""#),
            ("say \"hi\"", r#""say \"hi\"""#),
            ("back\\slash", r#""back\\slash""#),
            ("line\nbreak\ttab", r#""line\nbreak\ttab""#),
            ("esc\u{1b}", r#""esc\x1b""#),
            ("del\u{7f}", r#""del\x7f""#),
            ("été", r#""été""#),
            ("\u{85}", r#""\u0085""#),
        ];
        for (input, expected) in table {
            assert_eq!(quote(input), expected, "{input:?}");
        }
    }

    #[test]
    fn string_slices_print_as_go_prints_them() {
        let items = vec!["1".to_owned(), "v2.0.0".to_owned()];
        assert_eq!(list(&items), "[1 v2.0.0]");
        assert_eq!(quoted_list(&items), r#"["1" "v2.0.0"]"#);
        assert_eq!(list(&[]), "[]");
        assert_eq!(quoted_list(&[]), "[]");
    }

    #[test]
    fn statuses_use_grpc_go_code_names() {
        let table = [
            (
                tonic::Status::not_found("gone"),
                "rpc error: code = NotFound desc = gone",
            ),
            (
                tonic::Status::cancelled("stop"),
                "rpc error: code = Canceled desc = stop",
            ),
            (
                tonic::Status::deadline_exceeded("context deadline exceeded"),
                "rpc error: code = DeadlineExceeded desc = context deadline exceeded",
            ),
        ];
        for (input, expected) in table {
            assert_eq!(status(&input), expected);
        }
        assert_eq!(
            deadline_exceeded(),
            "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
        );
    }

    #[test]
    fn dial_errors_name_the_path_and_the_lower_case_errno() {
        let error = std::io::Error::from_raw_os_error(nix::errno::Errno::ENOENT as i32);
        assert_eq!(
            dial_error(std::path::Path::new("/x/csi.sock"), &error),
            "rpc error: code = Unavailable desc = connection error: desc = \"transport: Error \
             while dialing: dial unix /x/csi.sock: connect: no such file or directory\""
        );
    }
}
