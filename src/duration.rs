//! Go's duration syntax (`1s`, `500ms`, `2m30s`, `1.5h`), which every upstream flag such as
//! `--timeout` and `--probe-timeout` uses. No crate parses exactly this grammar.

use std::time::Duration;

/// A duration flag value; parses with Go's `time.ParseDuration` rules (negative values are
/// refused: no flag of ours means anything by them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration(pub Duration);

impl std::str::FromStr for GoDuration {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        parse(text)
            .map(GoDuration)
            .ok_or_else(|| format!("invalid duration {text:?}: expected e.g. 1s, 500ms, 2m30s"))
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
pub fn parse(text: &str) -> Option<Duration> {
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
            assert_eq!(parse(text), Some(expected), "{text}");
        }
    }

    #[test]
    fn malformed_durations_are_refused() {
        for text in ["", "1", "s", "1x", "-1s", "1..2s", "1s2", " 1s", "ms"] {
            assert_eq!(parse(text), None, "{text:?}");
        }
        assert!("10".parse::<GoDuration>().unwrap_err().contains("\"10\""));
    }
}
