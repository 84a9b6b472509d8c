//! Go's formatting of the values that appear in the kubelet's error texts (`%q`, `%v` of a
//! string slice, a gRPC status error), so that the reasons we send and print read exactly as the
//! real kubelet's would.

/// What grpc-go says when a call's context deadline passes.
pub const DEADLINE_EXCEEDED: &str =
    "rpc error: code = DeadlineExceeded desc = context deadline exceeded";

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
    format!(
        "rpc error: code = {} desc = {}",
        crate::metrics::go_code_name(status.code()),
        status.message()
    )
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
                Some(first) => first.to_lowercase().chain(chars).collect(),
                None => String::new(),
            }
        }
        None => error.to_string(),
    };
    let inner = format!(
        "transport: Error while dialing: dial unix {}: connect: {reason}",
        path.display()
    );
    format!(
        "rpc error: code = Unavailable desc = connection error: desc = {}",
        quote(&inner)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
                DEADLINE_EXCEEDED,
            ),
        ];
        for (input, expected) in table {
            assert_eq!(status(&input), expected);
        }
    }

    #[test]
    fn dial_errors_name_the_path_and_the_lower_case_errno() {
        let error = std::io::Error::from_raw_os_error(libc_enoent());
        assert_eq!(
            dial_error(std::path::Path::new("/x/csi.sock"), &error),
            "rpc error: code = Unavailable desc = connection error: desc = \"transport: Error \
             while dialing: dial unix /x/csi.sock: connect: no such file or directory\""
        );
    }

    fn libc_enoent() -> i32 {
        nix::errno::Errno::ENOENT as i32
    }
}
