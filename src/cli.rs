//! The command line's front door: which mode runs (from `argv[0]` or a subcommand), and the
//! rewriting of Go-style flags into the one form argh parses.
//!
//! Kubernetes manifests were written for Go's `flag` package, which accepts `-flag` and
//! `--flag`, `=value` or a separate value, and booleans as `--flag=false`. argh accepts only
//! `--flag value` and bare switches, so [`normalize_flags`] sits in front of it. Everything here
//! is pure and unit-tested; `main` turns the outcomes into exit codes.

use argh::{ArgsInfo, CommandInfoWithArgs, FlagInfoKind, FromArgs};

/// The name the multi-call binary is published under.
pub const BINARY: &str = "csi-nodekit";
/// The crate version, printed by every `--version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// A mode of the multi-call binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    NodeServer,
    Registrar,
    Probe,
    Demo,
}

/// Every name that selects a mode, as a subcommand or as the file name in `argv[0]`.
/// `livenessprobe` is `probe serve`: the upstream image's entry point.
const NAMES: &[(&str, Mode, Option<&str>)] = &[
    ("node-server", Mode::NodeServer, None),
    ("csi-node-server", Mode::NodeServer, None),
    ("registrar", Mode::Registrar, None),
    ("csi-node-driver-registrar", Mode::Registrar, None),
    ("node-driver-registrar", Mode::Registrar, None),
    ("probe", Mode::Probe, None),
    ("livenessprobe", Mode::Probe, Some("serve")),
    ("demo", Mode::Demo, None),
];

/// A mode chosen, with the name it was invoked as and the arguments that follow it.
#[derive(Debug, PartialEq, Eq)]
pub struct Invocation {
    pub mode: Mode,
    /// What `--version` and error messages call the program: `livenessprobe`,
    /// `csi-nodekit registrar`, ...
    pub program: String,
    pub args: Vec<String>,
    /// How many of `args` the name implied (`livenessprobe` is `probe serve`): the help's
    /// usage line leaves them out, so that it shows a command line that works.
    pub implied: usize,
}

/// What the first look at `argv` decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Dispatch {
    Run(Invocation),
    /// `csi-nodekit --version`
    Version,
    /// `csi-nodekit --help`: the modes, on stdout, success.
    Help,
    /// No mode or an unknown one: a one-line complaint, then the usage text, exit 2.
    Unknown(String),
    /// `csi-nodekit --bogus`: one line naming the flag, exit 2.
    UnknownFlag(String),
}

/// The usage line that lists the modes.
pub fn usage() -> String {
    format!(
        "usage: {BINARY} <mode> [flags]   modes: node-server, registrar, probe, demo \
         (also invoked as csi-node-server, csi-node-driver-registrar, node-driver-registrar, \
         livenessprobe); {BINARY} help <mode> shows a mode's flags"
    )
}

/// The top-level help: what the binary is, and each mode with one line of what it is for
/// (the mode's own description, which its `--help` starts with too).
pub fn help_text() -> String {
    use argh::ArgsInfo;
    let modes = [
        (
            "node-server",
            crate::node_server::Args::get_args_info().description,
        ),
        (
            "registrar",
            crate::registrar::Args::get_args_info().description,
        ),
        ("probe", crate::probe::Args::get_args_info().description),
        ("demo", crate::demo::Args::get_args_info().description),
    ];
    let mut text = format!(
        "{BINARY} {VERSION}: what a Kubernetes CSI driver needs on a node, in one binary.\n\n\
         Usage: {BINARY} <mode> [flags]\n       {BINARY} help <mode>\n\nModes:\n"
    );
    for (name, description) in modes {
        text.push_str(&format!("  {name:<13}{}\n", help::one_line(description)));
    }
    text.push_str(
        "\nAlso installed as the upstream names: csi-node-server (node-server), \
         csi-node-driver-registrar and node-driver-registrar (registrar), livenessprobe \
         (probe serve).\n",
    );
    text
}

fn lookup(name: &str) -> Option<(Mode, Option<&'static str>)> {
    NAMES
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|&(_, mode, sub)| (mode, sub))
}

fn invocation(mode: Mode, implied: Option<&str>, program: String, rest: &[String]) -> Dispatch {
    let args = implied
        .map(str::to_owned)
        .into_iter()
        .chain(rest.iter().cloned())
        .collect();
    Dispatch::Run(Invocation {
        mode,
        program,
        args,
        implied: usize::from(implied.is_some()),
    })
}

/// Picks the mode: the file name of `argv[0]` first (busybox-style symlinks), then the first
/// argument (`csi-nodekit <mode> ...`); `csi-nodekit help <mode> [command]` is that mode's
/// `--help`.
pub fn dispatch(argv: &[String]) -> Dispatch {
    let invoked = argv.first().map(String::as_str).unwrap_or(BINARY);
    let invoked = std::path::Path::new(invoked)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(BINARY);
    let rest = argv.get(1..).unwrap_or_default();
    if let Some((mode, implied)) = lookup(invoked) {
        return invocation(mode, implied, invoked.to_owned(), rest);
    }
    match rest.first().map(String::as_str) {
        None => Dispatch::Unknown("no mode given".into()),
        Some("--version" | "-version") => Dispatch::Version,
        Some("--help" | "-help" | "-h" | "--h") => Dispatch::Help,
        Some("help") if rest.len() == 1 => Dispatch::Help,
        Some("help") => match lookup(&rest[1]) {
            Some((mode, implied)) => {
                let words: Vec<String> = rest[2..]
                    .iter()
                    .cloned()
                    .chain(["--help".to_owned()])
                    .collect();
                invocation(mode, implied, format!("{invoked} {}", rest[1]), &words)
            }
            None => Dispatch::Unknown(format!("unknown mode {:?}", rest[1])),
        },
        Some(flag) if flag.starts_with('-') && flag.len() > 1 => Dispatch::UnknownFlag(format!(
            "unknown flag {}: give a mode first (node-server, registrar, probe, demo); \
             see {BINARY} --help",
            flag.split('=').next().unwrap_or(flag)
        )),
        Some(name) => match lookup(name) {
            Some((mode, implied)) => {
                invocation(mode, implied, format!("{invoked} {name}"), &rest[1..])
            }
            None => Dispatch::Unknown(format!("unknown mode {name:?}")),
        },
    }
}

/// A flag that cannot be rewritten: the message names it.
#[derive(Debug, PartialEq, Eq)]
pub struct FlagError(pub String);

/// What a command line says about one flag; as with Go's flag package, the last setting wins.
enum Setting {
    Value(String),
    /// An option with nothing after it: passed on so argh names the missing value.
    Missing,
    On,
    Off,
}

/// The flags given since the last positional word (a subcommand starts a new command level),
/// each once, at its first position, with its last setting.
#[derive(Default)]
struct Level(Vec<(String, Setting)>);

impl Level {
    fn set(&mut self, name: &str, setting: Setting) {
        match self.0.iter_mut().find(|(known, _)| known == name) {
            Some(slot) => slot.1 = setting,
            None => self.0.push((name.to_owned(), setting)),
        }
    }

    fn flush(&mut self, out: &mut Vec<String>) {
        for (name, setting) in self.0.drain(..) {
            match setting {
                Setting::Value(value) => out.extend([format!("--{name}"), value]),
                Setting::Missing | Setting::On => out.push(format!("--{name}")),
                Setting::Off => {}
            }
        }
    }
}

/// Rewrites Go-style flags into argh's form: `-name`/`--name`, `=value` or a following value,
/// become `--name value`; a switch given `=true` becomes `--name` and `=false` disappears;
/// `-h` becomes `--help`. A flag given twice keeps its last value, as in Go (charts often append
/// overrides such as a second `--v`). `switches` lists the long names (without dashes) of
/// boolean flags, since only they take no value. Positional words and everything after `--`
/// pass unchanged.
pub fn normalize_flags(args: &[String], switches: &[&str]) -> Result<Vec<String>, FlagError> {
    let mut out = Vec::with_capacity(args.len());
    let mut level = Level::default();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--" {
            level.flush(&mut out);
            out.push(arg.clone());
            out.extend(iter.by_ref().cloned());
            return Ok(out);
        }
        let body = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-'));
        // A lone "-" is a positional word, as in Go.
        let Some(body) = body.filter(|b| !b.is_empty()) else {
            level.flush(&mut out);
            out.push(arg.clone());
            continue;
        };
        let (name, value) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (body, None),
        };
        if name.is_empty() || name.starts_with('-') {
            return Err(FlagError(format!("bad flag syntax: {arg}")));
        }
        let name = match name {
            "h" => "help".to_owned(),
            klog if UNDERSCORED.contains(&klog) => klog.replace('_', "-"),
            other => other.to_owned(),
        };
        let name = name.as_str();
        let setting = if name == "help" || switches.contains(&name) {
            match value.map(|v| (v, crate::gocompat::parse_bool(v))) {
                None | Some((_, Some(true))) => Setting::On,
                Some((_, Some(false))) => Setting::Off,
                Some((v, None)) => {
                    return Err(FlagError(format!(
                        "invalid boolean value {v:?} for flag --{name}"
                    )));
                }
            }
        } else {
            // The next word is this flag's value even when it starts with '-', as in Go.
            match value.map(str::to_owned).or_else(|| iter.next().cloned()) {
                Some(value) => Setting::Value(value),
                None => Setting::Missing,
            }
        };
        level.set(name, setting);
    }
    level.flush(&mut out);
    Ok(out)
}

/// The long names of every switch in a command and its subcommands, from argh's own
/// description of the arguments, so the switch list can never drift from the structs.
pub fn switch_names(info: &CommandInfoWithArgs) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = info
        .flags
        .iter()
        .filter(|f| f.kind == FlagInfoKind::Switch)
        .map(|f| f.long.trim_start_matches('-'))
        .collect();
    for sub in &info.commands {
        names.extend(switch_names(&sub.command));
    }
    names
}

#[path = "cli_common.rs"]
mod common;
#[path = "cli_help.rs"]
pub mod help;

pub use common::{Given, ModeArgs, UNDERSCORED};

/// Why parsing a mode's flags did not produce its arguments.
#[derive(Debug, PartialEq, Eq)]
pub enum ParseStop {
    /// `--help` was asked for: the text goes to stdout and the exit is a success.
    Help(String),
    /// A wrong flag: one line naming it, exit 2.
    Usage(String),
}

/// Normalises Go-style flags, then lets argh parse them into the mode's `Args`; `--help`
/// gives the help of the (sub)command chosen, in Go's format.
pub fn parse_mode_args<T: FromArgs + ArgsInfo>(
    program: &str,
    args: &[String],
) -> Result<T, ParseStop> {
    parse_implied(program, args, 0)
}

/// [`parse_mode_args`] for a program whose name implied the first `implied` words of `args`.
pub fn parse_implied<T: FromArgs + ArgsInfo>(
    program: &str,
    args: &[String],
    implied: usize,
) -> Result<T, ParseStop> {
    let info = T::get_args_info();
    let switches = switch_names(&info);
    let normalized = normalize_flags(args, &switches)
        .map_err(|FlagError(msg)| ParseStop::Usage(format!("{program}: {msg}")))?;
    let flags_end = normalized
        .iter()
        .position(|w| w == "--")
        .unwrap_or(normalized.len());
    if normalized[..flags_end].iter().any(|w| w == "--help") {
        return Err(ParseStop::Help(help::for_words(
            program,
            &info,
            &normalized[..flags_end],
            implied,
        )));
    }
    let words: Vec<&str> = normalized.iter().map(String::as_str).collect();
    let command: Vec<&str> = program.split(' ').collect();
    T::from_args(&command, &words).map_err(|early| match early.status {
        Ok(()) => ParseStop::Help(early.output),
        Err(()) => ParseStop::Usage(format!("{program}: {}", go_wording(&early.output))),
    })
}

/// argh's error texts in one line (a wrong flag must be reported on one line), in the words
/// Go's flag package uses for the same mistakes.
fn go_wording(text: &str) -> String {
    let line = one_line(text);
    if let Some(arg) = line.strip_prefix("Unrecognized argument: ") {
        let arg = arg.trim_matches('"');
        return match arg.starts_with('-') {
            true => format!("unknown flag {arg}"),
            false => format!("unexpected argument {arg:?}"),
        };
    }
    if let Some(rest) = line.strip_prefix("Error parsing option '")
        && let Some((flag, rest)) = rest.split_once("' with value '")
        && let Some((value, why)) = rest.split_once("': ")
    {
        let flag = help::spelled(flag);
        return format!("invalid value {value:?} for flag --{flag}: {why}");
    }
    if let Some(rest) = line.strip_prefix("No value provided for option '") {
        let flag = help::spelled(rest.trim_end_matches("'."));
        return format!("flag needs an argument: --{flag}");
    }
    line
}

/// argh's error texts can span lines ("Required options not provided:\n    --x").
fn one_line(text: &str) -> String {
    let words: Vec<&str> = text.split_whitespace().collect();
    words.join(" ")
}

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;
