//! Go-style flags rewritten into the one form argh parses, and a mode's flags parsed into its
//! `Args`.
//!
//! Kubernetes manifests were written for Go's `flag` package, which accepts `-flag` and
//! `--flag`, `=value` or a separate value, and booleans as `--flag=false`. argh accepts only
//! `--flag value` and bare switches, so [`normalize_flags`] sits in front of it.

use argh::{ArgsInfo, CommandInfoWithArgs, FlagInfoKind, FromArgs};

use super::help;
use super::mode_args::UNDERSCORED;
use super::values::Refusal;

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

/// Why parsing a mode's flags did not produce its arguments.
#[derive(Debug, PartialEq, Eq)]
pub enum ParseStop {
    /// `--help` was asked for: the text goes to stdout and the exit is a success.
    Help(String),
    /// A wrong flag: one line naming it, exit 2.
    Usage(String),
    /// A flag the command does not define. As Go's flag package does: its line
    /// (`flag provided but not defined: -bogus`), then the command's flags as `Usage of <name>:`,
    /// both to stderr, exit 2. Scripts and people grep for Go's line.
    Undefined { line: String, usage: String },
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
        Err(()) => {
            if let Some(name) = undefined_flag(&early.output) {
                return ParseStop::Undefined {
                    line: format!("flag provided but not defined: -{name}"),
                    usage: help::go_usage(program, &info, &normalized[..flags_end], implied),
                };
            }
            let line = match Refusal::decode(&early.output) {
                Some(refusal) => refused::<T>(&refusal, &command, &words, &early.output),
                None => go_wording(&early.output),
            };
            ParseStop::Usage(format!("{program}: {line}"))
        }
    })
}

/// The line for a value one of our [flag values](super::values) refused, in Go's words:
/// `invalid value "" for flag --csi-address: socket address is empty`. The refusal carries the
/// reason and the value; the flag is found in the command line's words, not in argh's text.
/// argh reads the words in order and stops at the first value it cannot parse, so the
/// shortest run of words that argh refuses with the same text ends with that value, after its
/// flag (an earlier flag given the same value, and accepted it, fails no shorter run).
fn refused<T: FromArgs>(refusal: &Refusal, command: &[&str], words: &[&str], text: &str) -> String {
    let shown = crate::gocompat::quote(refusal.shown().unwrap_or_default());
    let why = refusal.why();
    // Only a word before `--` is a flag.
    let flags_end = words.iter().position(|w| *w == "--").unwrap_or(words.len());
    let flag = (2..=words.len())
        .find(|&end| T::from_args(command, &words[..end]).is_err_and(|e| e.output == text))
        .filter(|end| end - 2 < flags_end)
        .map(|end| words[end - 2])
        .filter(|word| word.starts_with("--"));
    match flag {
        Some(flag) => format!(
            "invalid value {shown} for flag --{}: {why}",
            help::spelled(flag)
        ),
        // A positional argument: none of our commands takes one.
        None => format!("invalid value {shown}: {why}"),
    }
}

/// The name (without dashes) of the flag argh did not know, from its text: Go names it with one
/// dash whichever way it was spelled (`--bogus=1` → `-bogus`).
fn undefined_flag(text: &str) -> Option<String> {
    let arg = one_line(text)
        .strip_prefix("Unrecognized argument: ")?
        .trim_matches('"')
        .to_owned();
    arg.starts_with('-')
        .then(|| arg.trim_start_matches('-').to_owned())
}

/// argh's error texts in one line (a wrong flag must be reported on one line), in the words
/// Go's flag package uses for the same mistakes. The one place that reads argh's English, for
/// what only argh knows: a flag no struct has (see [`undefined_flag`]), a word no command takes, an option given last
/// with no value, and a value refused by a type that is not one of our
/// [flag values](super::values) (`u8`, `u16`, a `FromStr` type), whose error argh turns into
/// bare text. The texts it reads are pinned by `argh_texts_go_wording_reads_are_as_pinned`
/// in the tests, so an argh upgrade that rewords them fails a test instead of this line.
fn go_wording(text: &str) -> String {
    let line = one_line(text);
    if let Some(arg) = line.strip_prefix("Unrecognized argument: ") {
        // A flag was taken by `undefined_flag` before: this is a word no command takes.
        return format!("unexpected argument {:?}", arg.trim_matches('"'));
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
mod tests;
