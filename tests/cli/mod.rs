//! The binary's command line, common to every mode: dispatch by mode and name, upstream's
//! flags and `--help`, logging, and signals.

mod dispatch;
// `fault_suite::flags` tries its bad values again and again.
pub(crate) mod flags;
mod flags_fixture;
mod flags_help;
mod logging;
mod signals;
