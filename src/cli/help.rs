//! `--help` as Go's flag package prints it (`flag.PrintDefaults`), built from argh's own
//! description of the arguments, so it can never drift from the structs: every flag in byte
//! order of its name, `  -name placeholder` then the usage on the next line after four spaces
//! and a tab (on the same line after a tab for a one-letter switch), defaults as
//! ` (default "text")` for strings and ` (default 1s)` otherwise. The defaults are written in
//! the flags' doc comments in that form (a test checks them against the parsed defaults).

use argh::{CommandInfoWithArgs, FlagInfo, FlagInfoKind};

use super::UNDERSCORED;

/// A description on one line (argh keeps a doc comment's line breaks).
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The name the command line and the help spell a flag with: klog's underscores for klog's.
pub fn spelled(long: &str) -> String {
    let name = long.trim_start_matches('-');
    let underscored = name.replace('-', "_");
    match UNDERSCORED.contains(&underscored.as_str()) {
        true => underscored,
        false => name.to_owned(),
    }
}

/// Go's placeholder: none for a switch, else the option's `arg_name` (`duration`, `int`,
/// `uint`, `value`), `string` where argh was given none.
fn placeholder<'a>(flag: &FlagInfo<'a>) -> &'a str {
    match flag.kind {
        FlagInfoKind::Switch => "",
        FlagInfoKind::Option { arg_name } if arg_name == flag.long.trim_start_matches('-') => {
            "string"
        }
        FlagInfoKind::Option { arg_name } => arg_name,
    }
}

/// One flag's entry, exactly as `flag.PrintDefaults` lays it out.
fn entry(flag: &FlagInfo) -> String {
    let mut line = format!("  -{}", spelled(flag.long));
    let placeholder = placeholder(flag);
    if !placeholder.is_empty() {
        line.push(' ');
        line.push_str(placeholder);
    }
    // Go: a one-letter switch keeps its usage on the same line.
    line.push_str(if line.len() <= 4 { "\t" } else { "\n    \t" });
    line.push_str(&one_line(flag.description));
    line.push('\n');
    line
}

/// The help of one command: a usage line that works as written, what it does, its
/// subcommands if any, then its flags.
pub fn render(usage_name: &str, info: &CommandInfoWithArgs) -> String {
    let commands = !info.commands.is_empty();
    let mut text = match commands {
        true => format!("Usage: {usage_name} <command> [flags]\n"),
        false => format!("Usage: {usage_name} [flags]\n"),
    };
    text.push_str(&one_line(info.description));
    text.push('\n');
    if commands {
        text.push_str("\nCommands:\n");
        for sub in &info.commands {
            text.push_str(&format!(
                "  {:<14}{}\n",
                sub.name,
                one_line(sub.command.description)
            ));
        }
    }
    text.push_str("\nFlags:\n");
    for flag in listed_flags(info) {
        text.push_str(&entry(flag));
    }
    if commands {
        text.push_str(&format!(
            "\nRun \"{usage_name} <command> --help\" for the flags of a command.\n"
        ));
    }
    text
}

/// What Go's flag package prints after `flag provided but not defined`: `Usage of <name>:` and
/// the flags of the (sub)command the words chose, in `flag.PrintDefaults`' layout.
pub fn go_usage(
    program: &str,
    info: &CommandInfoWithArgs,
    words: &[String],
    implied: usize,
) -> String {
    let (usage_name, chosen) = chosen(program, info, words, implied);
    let mut text = format!("Usage of {usage_name}:\n");
    for flag in listed_flags(chosen) {
        text.push_str(&entry(flag));
    }
    text
}

/// The flags help lists, in byte order of their spelled names (not `--help`, nor hidden ones).
fn listed_flags(info: &CommandInfoWithArgs) -> Vec<&FlagInfo<'static>> {
    let mut flags: Vec<&FlagInfo> = info
        .flags
        .iter()
        .filter(|f| f.long != "--help" && !f.hidden)
        .collect();
    flags.sort_by_key(|f| spelled(f.long));
    flags
}

/// The subcommand a command line's words chose (if any) and its name, without the words the
/// program's name implied.
fn chosen<'a>(
    program: &str,
    info: &'a CommandInfoWithArgs,
    words: &[String],
    implied: usize,
) -> (String, &'a CommandInfoWithArgs) {
    let mut usage_name = program.to_owned();
    let mut chosen: Option<&CommandInfoWithArgs> = None;
    let mut depth = 0;
    for word in words {
        let current = chosen.unwrap_or(info);
        if let Some(sub) = current.commands.iter().find(|c| c.name == word) {
            if depth >= implied {
                usage_name.push(' ');
                usage_name.push_str(sub.name);
            }
            depth += 1;
            chosen = Some(&sub.command);
        }
    }
    (usage_name, chosen.unwrap_or(info))
}

/// The help for a command line that asked for it: the subcommand its words chose (if any),
/// named without the words the program's name implied.
pub fn for_words(
    program: &str,
    info: &CommandInfoWithArgs,
    words: &[String],
    implied: usize,
) -> String {
    let (usage_name, chosen) = chosen(program, info, words, implied);
    render(&usage_name, chosen)
}

#[cfg(test)]
mod tests;
