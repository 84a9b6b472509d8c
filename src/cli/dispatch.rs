//! Which mode runs, from `argv[0]` or a subcommand, read from the one table of modes that
//! `main.rs` owns (as uutils' `util_map`): each mode's names, its one-line description and its
//! entry. Usage, help and dispatch all read that table, so a mode is added in one place.
//! Everything here is pure and unit-tested; `main` turns the outcomes into exit codes.

use std::process::ExitCode;

use super::mode_args::BINARY;

/// A mode of the multi-call binary: one row of the table in `main.rs`.
pub struct Mode {
    /// The subcommand that selects it: `csi-nodekit <name>`.
    pub name: &'static str,
    /// The upstream names it also answers to, as a subcommand or as the file name in `argv[0]`
    /// (the symlinks in the image), each with the word it implies: `livenessprobe` is
    /// `probe serve`, the upstream image's entry point.
    pub aliases: &'static [(&'static str, Option<&'static str>)],
    /// What it is for, in one line: its `Args`' description, which its `--help` starts with.
    pub description: fn() -> &'static str,
    /// Parses its flags and runs it; the exit code is the process's.
    pub run: fn(&Invocation) -> ExitCode,
}

impl std::fmt::Debug for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mode({})", self.name)
    }
}

/// Modes are told apart by name (their `fn` entries cannot be compared reliably).
impl PartialEq for Mode {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Mode {}

/// A mode chosen, with the name it was invoked as and the arguments that follow it.
#[derive(Debug, PartialEq, Eq)]
pub struct Invocation {
    pub mode: &'static Mode,
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
    /// `csi-nodekit --bogus`: Go's line naming the flag, then the usage text, exit 2.
    UnknownFlag(String),
}

fn names(modes: &[Mode]) -> String {
    let names: Vec<&str> = modes.iter().map(|m| m.name).collect();
    names.join(", ")
}

fn alias_names(modes: &[Mode]) -> String {
    let aliases: Vec<&str> = modes
        .iter()
        .flat_map(|m| m.aliases.iter().map(|(alias, _)| *alias))
        .collect();
    aliases.join(", ")
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// The usage line that lists the modes.
pub fn usage(modes: &[Mode]) -> String {
    format!(
        "usage: {BINARY} <mode> [flags]   modes: {} (also invoked as {}); {BINARY} help <mode> \
         shows a mode's flags",
        names(modes),
        alias_names(modes)
    )
}

/// The top-level help: what the binary is, and each mode with one line of what it is for.
pub fn help_text(modes: &[Mode]) -> String {
    let mut text = format!(
        "{BINARY} {}: what a Kubernetes CSI driver needs on a node, in one binary.\n\n\
         Usage: {BINARY} <mode> [flags]\n       {BINARY} help <mode>\n\nModes:\n",
        super::VERSION
    );
    for mode in modes {
        let description = super::help::one_line((mode.description)());
        text.push_str(&format!("  {:<13}{description}\n", mode.name));
    }
    let upstream: Vec<String> = modes
        .iter()
        .filter(|m| !m.aliases.is_empty())
        .map(|m| {
            let aliases: Vec<String> = m.aliases.iter().map(|(a, _)| (*a).to_owned()).collect();
            let implied = m.aliases.iter().find_map(|(_, implied)| *implied);
            match implied {
                Some(word) => format!("{} ({} {word})", and_list(&aliases), m.name),
                None => format!("{} ({})", and_list(&aliases), m.name),
            }
        })
        .collect();
    text.push_str(&format!(
        "\nIn the image also linked as the upstream names: {}.\n",
        upstream.join(", ")
    ));
    text
}

/// The mode a name selects, and the word that name implies.
fn lookup(modes: &'static [Mode], name: &str) -> Option<(&'static Mode, Option<&'static str>)> {
    modes.iter().find_map(|mode| {
        if mode.name == name {
            return Some((mode, None));
        }
        let (_, implied) = mode.aliases.iter().find(|(alias, _)| *alias == name)?;
        Some((mode, *implied))
    })
}

/// "unknown mode", with the closest name a mode answers to when one is near enough to be a
/// slip of the keyboard (`regsitrar`, `liveness-probe`).
fn unknown_mode(modes: &'static [Mode], name: &str) -> String {
    let names = modes
        .iter()
        .flat_map(|mode| std::iter::once(mode.name).chain(mode.aliases.iter().map(|(a, _)| *a)));
    let closest = names
        .map(|known| (strsim::damerau_levenshtein(name, known), known))
        .filter(|(distance, known)| *distance <= (known.len() / 3).max(1))
        .min();
    match closest {
        Some((_, known)) => format!("unknown mode {name:?} (did you mean {known:?}?)"),
        None => format!("unknown mode {name:?}"),
    }
}

fn invocation(
    mode: &'static Mode,
    implied: Option<&str>,
    program: String,
    rest: &[String],
) -> Dispatch {
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
pub fn dispatch(modes: &'static [Mode], argv: &[String]) -> Dispatch {
    let invoked = argv.first().map(String::as_str).unwrap_or(BINARY);
    let invoked = std::path::Path::new(invoked)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(BINARY);
    let rest = argv.get(1..).unwrap_or_default();
    if let Some((mode, implied)) = lookup(modes, invoked) {
        return invocation(mode, implied, invoked.to_owned(), rest);
    }
    match rest.first().map(String::as_str) {
        None => Dispatch::Unknown("no mode given".into()),
        Some("--version" | "-version") => Dispatch::Version,
        Some("--help" | "-help" | "-h" | "--h") => Dispatch::Help,
        Some("help") if rest.len() == 1 => Dispatch::Help,
        Some("help") => match lookup(modes, &rest[1]) {
            Some((mode, implied)) => {
                let words: Vec<String> = rest[2..]
                    .iter()
                    .cloned()
                    .chain(["--help".to_owned()])
                    .collect();
                invocation(mode, implied, format!("{invoked} {}", rest[1]), &words)
            }
            None => Dispatch::Unknown(unknown_mode(modes, &rest[1])),
        },
        // Go's words, as a mode says them; the usage that follows tells to give a mode first.
        Some(flag) if flag.starts_with('-') && flag.len() > 1 => Dispatch::UnknownFlag(format!(
            "flag provided but not defined: -{}",
            flag.split('=')
                .next()
                .unwrap_or(flag)
                .trim_start_matches('-')
        )),
        Some(name) => match lookup(modes, name) {
            Some((mode, implied)) => {
                invocation(mode, implied, format!("{invoked} {name}"), &rest[1..])
            }
            None => Dispatch::Unknown(unknown_mode(modes, name)),
        },
    }
}
