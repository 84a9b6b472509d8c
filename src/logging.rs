//! Logging set-up shared by every mode: klog-style `--v=N` verbosity on top of env_logger, text
//! lines that look like klog's, or one JSON object per line with `--logging-format=json`.
//!
//! Verbosity maps onto `log` levels so that code uses the ordinary macros:
//! `--v` 0–1 → info (quiet: start-up, state changes, warnings, errors), 2–4 → debug (steady-state
//! detail), 5–7 → trace (every gRPC call and probe), 8 and more → trace for the libraries too.
//! `RUST_LOG`, when set, replaces all of this.

use std::io::Write;

use log::LevelFilter;

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

fn klog_letter(level: log::Level) -> char {
    match level {
        log::Level::Error => 'E',
        log::Level::Warn => 'W',
        log::Level::Info => 'I',
        log::Level::Debug | log::Level::Trace => 'D',
    }
}

/// Installs the global logger; later calls are ignored (tests may call it many times).
pub fn init(verbosity: u8, format: Format) {
    let mut builder = env_logger::Builder::new();
    builder.target(env_logger::Target::Stderr);
    match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.is_empty() => {
            builder.parse_filters(&spec);
        }
        _ => {
            builder
                .filter_level(library_level(verbosity))
                .filter_module(env!("CARGO_CRATE_NAME"), level_for(verbosity));
        }
    }
    match format {
        Format::Text => builder.format(|buf, record| {
            // "2026-11-29T20:27:17.123456Z" → klog's "1129 20:27:17.123456".
            let ts = buf.timestamp_micros().to_string();
            let (month_day, time) = (
                ts.get(5..10).unwrap_or("").replace('-', ""),
                ts.get(11..26).unwrap_or(""),
            );
            let target = record
                .target()
                .strip_prefix("csi_nodekit::")
                .unwrap_or(record.target());
            writeln!(
                buf,
                "{}{month_day} {time} {target}] {}",
                klog_letter(record.level()),
                record.args()
            )
        }),
        Format::Json => builder.format(|buf, record| {
            let ts = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or_default();
            let line = serde_json::json!({
                "ts": ts,
                "level": record.level().as_str().to_ascii_lowercase(),
                "caller": record.target(),
                "msg": record.args().to_string(),
            });
            writeln!(buf, "{line}")
        }),
    };
    let _ = builder.try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_maps_to_levels_quiet_by_default() {
        assert_eq!(level_for(0), LevelFilter::Info);
        assert_eq!(level_for(2), LevelFilter::Debug);
        assert_eq!(level_for(5), LevelFilter::Trace);
        assert_eq!(library_level(5), LevelFilter::Warn);
        assert_eq!(library_level(8), LevelFilter::Trace);
    }

    #[test]
    fn formats_parse_and_unknown_ones_are_named() {
        assert_eq!("json".parse::<Format>(), Ok(Format::Json));
        assert_eq!("text".parse::<Format>(), Ok(Format::Text));
        assert!(
            "xml"
                .parse::<Format>()
                .unwrap_err()
                .to_string()
                .contains("\"xml\"")
        );
    }
}
