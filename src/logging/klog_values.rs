//! The values of klog's and component-base's flags that every upstream drop-in accepts and
//! ignores (`--stderrthreshold`, `--log_backtrace_at`, the info buffer sizes), each refused as
//! klog refuses it, so an old manifest with a value klog took still starts and one with a
//! value klog refused still fails.

use crate::quantity::Quantity;

/// A klog or component-base flag value that klog would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KlogValueError(&'static str);

/// `--stderrthreshold`: `INFO`, `WARNING`, `ERROR`, `FATAL` (any case) or 0 to 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Severity(pub u8);

impl std::str::FromStr for Severity {
    type Err = KlogValueError;
    fn from_str(text: &str) -> Result<Self, KlogValueError> {
        const NAMES: [&str; 4] = ["INFO", "WARNING", "ERROR", "FATAL"];
        let upper = text.to_ascii_uppercase();
        NAMES
            .iter()
            .position(|name| *name == upper)
            .and_then(|n| u8::try_from(n).ok())
            .or_else(|| text.parse().ok().filter(|n| *n < 4))
            .map(Severity)
            .ok_or(KlogValueError(
                "expected INFO, WARNING, ERROR, FATAL or 0 to 3",
            ))
    }
}

/// `--log_backtrace_at`: `file.go:N`, or empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceLocation(pub String);

impl std::str::FromStr for TraceLocation {
    type Err = KlogValueError;
    fn from_str(text: &str) -> Result<Self, KlogValueError> {
        let valid = text.is_empty()
            || text.split_once(':').is_some_and(|(file, line)| {
                file.contains('.') && !line.contains(':') && line.parse::<u32>().is_ok()
            });
        valid
            .then(|| TraceLocation(text.to_owned()))
            .ok_or(KlogValueError("syntax error: expect file.go:234"))
    }
}

/// `--log-json-info-buffer-size` and `--log-text-info-buffer-size`: a byte count as a
/// Kubernetes quantity (`512`, `1k`, `2Ki`, `3M`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferSize(pub Quantity);

impl std::str::FromStr for BufferSize {
    type Err = KlogValueError;
    fn from_str(text: &str) -> Result<Self, KlogValueError> {
        // component-base's help writes 1K for the decimal kilo that quantities spell 1k.
        let text = text
            .strip_suffix('K')
            .map_or(text.to_owned(), |n| format!("{n}k"));
        text.parse()
            .map(BufferSize)
            .map_err(|_| KlogValueError("expected a byte count such as 512, 1k, 2Ki or 3M"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn klog_flag_values_are_checked_as_klog_checks_them() {
        assert_eq!("warning".parse::<Severity>(), Ok(Severity(1)));
        assert_eq!("3".parse::<Severity>(), Ok(Severity(3)));
        assert!("LOUD".parse::<Severity>().is_err() && "4".parse::<Severity>().is_err());
        assert!("main.go:234".parse::<TraceLocation>().is_ok());
        assert!("".parse::<TraceLocation>().is_ok());
        for bad in [":0", "main.go", "main:1", "main.go:x"] {
            assert!(bad.parse::<TraceLocation>().is_err(), "{bad}");
        }
        let bytes = |text: &str| text.parse::<BufferSize>().map(|size| size.0.bytes());
        assert_eq!(bytes("2Ki"), Ok(2048));
        assert_eq!(bytes("1K"), Ok(1000));
        assert_eq!(
            bytes("lots").unwrap_err().to_string(),
            "expected a byte count such as 512, 1k, 2Ki or 3M"
        );
    }
}
