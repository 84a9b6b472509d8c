//! The command line, for every mode: which mode runs ([`dispatch`], from the table of modes in
//! `main.rs`), Go-style flags rewritten for argh and parsed into a mode's `Args` ([`flags`]),
//! the typed flag values argh parses, so a bad value is refused while parsing ([`values`]),
//! `--help` in Go's layout ([`help`]), and what every mode's `Args` shares ([`mode_args`]:
//! [`ModeArgs`], [`mode_args!`](crate::mode_args), [`VERSION`]), and printing a report to a
//! reader that may go away ([`print_line`]). This module knows no mode: modes depend on it,
//! never the other way round.

pub mod dispatch;
pub mod flags;
pub mod help;
pub mod mode_args;
pub mod values;

pub use dispatch::{Dispatch, Invocation, Mode, dispatch, help_text, usage};
pub use flags::{
    FlagError, ParseStop, normalize_flags, parse_implied, parse_mode_args, switch_names,
};
pub use mode_args::{BINARY, Given, ModeArgs, UNDERSCORED, VERSION};

/// Writes `text` and a newline to standard output. A reader that went away (`… | head -3`)
/// is not an error: `Ok(false)` says to stop printing, as a C tool stops at SIGPIPE. Rust
/// ignores SIGPIPE, so `println!` would panic there instead.
pub fn print_line(text: &str) -> std::io::Result<bool> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e),
    }
}
