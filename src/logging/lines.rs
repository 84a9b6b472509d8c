//! One log line, as the tools that parse Kubernetes logs expect it.
//!
//! Text, as klog writes it: `Lmmdd hh:mm:ss.uuuuuu PPPPPPP file:line] msg`, L one of I W E F
//! (every verbose line is I), the time in UTC (a scratch image has no time zone), the process
//! ID right-aligned in 7 columns, the source file's name (`dir/mod.rs` for a `mod.rs`, which
//! alone says nothing). A record with key-values is written as klog's structured lines are:
//! the message quoted, then ` err="…"` first, then ` key="value"`.
//!
//! JSON, as component-base writes it: `{"ts":<epoch milliseconds>,"caller":"dir/file.rs:N",
//! "msg":…,"v":N,<key-values>}`, and for errors no `v` and `"err"` last.

use std::io::Write;

use env_logger::fmt::Formatter;
use log::kv::{Key, Value, VisitSource};
use log::{Level, Record};

/// The text flags that shape a line.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub add_dir: bool,
    pub skip_headers: bool,
}

fn letter(level: Level) -> char {
    match level {
        Level::Error => 'E',
        Level::Warn => 'W',
        Level::Info | Level::Debug | Level::Trace => 'I',
    }
}

/// The klog V level a record needs: the lowest `--v` that writes it.
fn verbosity(level: Level) -> u8 {
    match level {
        Level::Error | Level::Warn | Level::Info => 0,
        Level::Debug => 2,
        Level::Trace => 5,
    }
}

/// The file a record comes from, as `file.rs` or (with `add_dir`, and always for the many
/// `mod.rs`) `dir/file.rs`.
fn file_name(record: &Record, add_dir: bool) -> String {
    let Some(file) = record.file() else {
        return "???".to_owned();
    };
    let mut parts = file.rsplit(['/', '\\']);
    let name = parts.next().unwrap_or(file);
    match parts.next() {
        Some(dir) if add_dir || name == "mod.rs" => format!("{dir}/{name}"),
        _ => name.to_owned(),
    }
}

/// The key-values of a record, as text; `err` first.
#[derive(Default)]
struct Pairs(Vec<(String, Rendered)>);

enum Rendered {
    Text(String),
    Number(String),
}

impl<'kvs> VisitSource<'kvs> for Pairs {
    fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), log::kv::Error> {
        let number = value
            .to_i64()
            .map(|n| n.to_string())
            .or_else(|| value.to_u64().map(|n| n.to_string()))
            .or_else(|| {
                value
                    .to_f64()
                    .filter(|f| f.is_finite())
                    .map(|f| f.to_string())
            })
            .or_else(|| value.to_bool().map(|b| b.to_string()));
        let rendered = match number {
            Some(number) => Rendered::Number(number),
            None => Rendered::Text(value.to_string()),
        };
        self.0.push((key.as_str().to_owned(), rendered));
        Ok(())
    }
}

fn pairs(record: &Record) -> Pairs {
    let mut pairs = Pairs::default();
    let _ = record.key_values().visit(&mut pairs);
    pairs.0.sort_by_key(|(key, _)| key != "err");
    pairs
}

/// klog's text line.
pub fn text(buf: &mut Formatter, record: &Record, style: Style) -> std::io::Result<()> {
    if !style.skip_headers {
        // "2026-11-29T20:27:17.123456Z" → klog's "1129 20:27:17.123456".
        let ts = buf.timestamp_micros().to_string();
        let month_day = ts.get(5..10).unwrap_or("").replace('-', "");
        let time = ts.get(11..26).unwrap_or("");
        write!(
            buf,
            "{}{month_day} {time} {:>7} {}:{}] ",
            letter(record.level()),
            std::process::id(),
            file_name(record, style.add_dir),
            record.line().unwrap_or(1)
        )?;
    }
    let pairs = pairs(record);
    if pairs.0.is_empty() {
        return writeln!(buf, "{}", record.args());
    }
    write!(
        buf,
        "{}",
        crate::gocompat::quote(&record.args().to_string())
    )?;
    for (key, value) in pairs.0 {
        match value {
            Rendered::Number(n) => write!(buf, " {key}={n}")?,
            Rendered::Text(t) => write!(buf, " {key}={}", crate::gocompat::quote(&t))?,
        }
    }
    writeln!(buf)
}

fn json_string(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

/// component-base's JSON line; its keys in its order (serde_json's maps would sort them).
pub fn json(buf: &mut Formatter, record: &Record) -> std::io::Result<()> {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or_default();
    let mut line = format!(
        "{{\"ts\":{millis:.3},\"caller\":{},\"msg\":{}",
        json_string(&format!(
            "{}:{}",
            file_name(record, true),
            record.line().unwrap_or(1)
        )),
        json_string(&record.args().to_string())
    );
    let error = record.level() == Level::Error;
    if !error {
        line.push_str(&format!(",\"v\":{}", verbosity(record.level())));
    }
    let mut pairs = pairs(record).0;
    // Errors carry `err` last, as zapr writes it.
    if let Some(at) = pairs.iter().position(|(key, _)| key == "err") {
        let err = pairs.remove(at);
        pairs.push(err);
    }
    for (key, value) in pairs {
        let value = match value {
            Rendered::Number(n) => n,
            Rendered::Text(t) => json_string(&t),
        };
        line.push_str(&format!(",{}:{value}", json_string(&key)));
    }
    line.push('}');
    writeln!(buf, "{line}")
}
