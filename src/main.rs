//! Entry point: pick the mode, parse its flags, run it, and choose the exit code.
//! Exit codes: 0 success (and `--help`/`--version`), 1 the mode failed, 2 bad usage.

use std::process::ExitCode;

use csi_nodekit::cli::{self, Dispatch, Mode, ModeArgs, ParseStop};
use csi_nodekit::{BoxError, UsageError, demo, logging, node_server, probe, registrar, rlimit};

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    match cli::dispatch(&argv) {
        Dispatch::Version => {
            println!("{} {}", cli::BINARY, cli::VERSION);
            ExitCode::SUCCESS
        }
        Dispatch::Help => {
            print!("{}", cli::help_text());
            ExitCode::SUCCESS
        }
        Dispatch::UnknownFlag(why) => {
            eprintln!("{}: {why}", cli::BINARY);
            ExitCode::from(2)
        }
        Dispatch::Unknown(why) => {
            eprintln!("{}: {why}", cli::BINARY);
            eprintln!("{}", cli::usage());
            ExitCode::from(2)
        }
        Dispatch::Run(invocation) => match invocation.mode {
            Mode::NodeServer => run_mode(&invocation, node_server::main),
            Mode::Probe => run_mode(&invocation, probe::main),
            Mode::Demo => run_mode(&invocation, demo::main),
            Mode::Registrar => run_mode(&invocation, registrar::main),
        },
    }
}

/// Parses a mode's flags, handles `--help` and `--version`, sets up logging, raises the
/// open-files limit and hands the arguments to the mode's entry (`<mode>::main`: settings, then
/// run). The flags accepted without effect are named once the mode starts its work.
fn run_mode<A: ModeArgs + argh::FromArgs + argh::ArgsInfo>(
    invocation: &cli::Invocation,
    entry: fn(A) -> Result<(), BoxError>,
) -> ExitCode {
    let program = invocation.program.as_str();
    let parsed = cli::parse_implied(program, &invocation.args, invocation.implied);
    let args: A = match parsed {
        Ok(args) => args,
        Err(ParseStop::Help(text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Err(ParseStop::Usage(line)) => {
            eprintln!("{line}");
            return ExitCode::from(2);
        }
    };
    if args.version() {
        println!("{program} {}", cli::VERSION);
        return ExitCode::SUCCESS;
    }
    logging::init(args.logging());
    let ignored = args.ignored();
    if !ignored.is_empty() {
        logging::defer(format!(
            "accepted for compatibility and ignored (no effect here): {}",
            ignored.join(" ")
        ));
    }
    rlimit::raise_open_files();
    match entry(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.is::<UsageError>() => {
            eprintln!("{program}: {error}");
            ExitCode::from(2)
        }
        Err(error) => {
            log::error!(err:% = error; "{program} failed");
            ExitCode::FAILURE
        }
    }
}
