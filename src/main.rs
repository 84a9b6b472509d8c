//! Entry point: the table of modes, and for the mode chosen its flags parsed, its run, and the
//! exit code. Exit codes: 0 success (and `--help`/`--version`), 1 the mode failed, 2 bad usage.

use std::process::ExitCode;

use argh::ArgsInfo;
use csi_nodekit::cli::{self, Dispatch, Invocation, Mode, ModeArgs, ParseStop};
use csi_nodekit::{
    BoxError, Reported, UsageError, demo, logging, node_server, probe, registrar, rlimit,
};

/// Every mode, in the order help and usage list them: the one place a mode is named. Aliases
/// are the upstream images' entry points, which the image installs as symlinks.
static MODES: &[Mode] = &[
    Mode {
        name: "node-server",
        aliases: &[("csi-node-server", None)],
        description: || node_server::Args::get_args_info().description,
        run: |invocation| run_mode(invocation, node_server::main),
    },
    Mode {
        name: "registrar",
        aliases: &[
            ("csi-node-driver-registrar", None),
            ("node-driver-registrar", None),
        ],
        description: || registrar::Args::get_args_info().description,
        run: |invocation| run_mode(invocation, registrar::main),
    },
    Mode {
        name: "probe",
        aliases: &[("livenessprobe", Some("serve"))],
        description: || probe::Args::get_args_info().description,
        run: |invocation| run_mode(invocation, probe::main),
    },
    Mode {
        name: "demo",
        aliases: &[],
        description: || demo::Args::get_args_info().description,
        run: |invocation| run_mode(invocation, demo::main),
    },
];

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    match cli::dispatch(MODES, &argv) {
        Dispatch::Version => {
            println!("{} {}", cli::BINARY, cli::VERSION);
            ExitCode::SUCCESS
        }
        Dispatch::Help => {
            print!("{}", cli::help_text(MODES));
            ExitCode::SUCCESS
        }
        Dispatch::UnknownFlag(line) => {
            eprintln!("{line}");
            eprintln!("{}", cli::usage(MODES));
            ExitCode::from(2)
        }
        Dispatch::Unknown(why) => {
            eprintln!("{}: {why}", cli::BINARY);
            eprintln!("{}", cli::usage(MODES));
            ExitCode::from(2)
        }
        Dispatch::Run(invocation) => (invocation.mode.run)(&invocation),
    }
}

/// Parses a mode's flags, handles `--help` and `--version`, sets up logging, raises the
/// open-files limit and hands the arguments to the mode's entry (`<mode>::main`: settings, then
/// run). The flags accepted without effect are named once the mode starts its work. The only
/// place besides `main` that picks exit codes.
fn run_mode<A: ModeArgs + argh::FromArgs + ArgsInfo>(
    invocation: &Invocation,
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
        Err(ParseStop::Undefined { line, usage }) => {
            eprint!("{line}\n{usage}");
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
        Err(error) if error.is::<Reported>() => ExitCode::FAILURE,
        Err(error) => {
            log::error!(err:% = error; "{program} failed");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    fn run(mode: &str, program: &str, args: &[&str]) -> Dispatch {
        let mode = MODES
            .iter()
            .find(|m| m.name == mode)
            .expect("a mode of the table");
        // Only livenessprobe's name implies a word (`serve`).
        let implied = usize::from(program.ends_with("livenessprobe"));
        Dispatch::Run(Invocation {
            mode,
            program: program.into(),
            args: argv(args),
            implied,
        })
    }

    #[test]
    fn dispatch_table_covers_symlink_names_and_subcommands() {
        let table: &[(&[&str], Dispatch)] = &[
            (
                &["/usr/bin/csi-node-driver-registrar", "--v=2"],
                run("registrar", "csi-node-driver-registrar", &["--v=2"]),
            ),
            (
                &["node-driver-registrar"],
                run("registrar", "node-driver-registrar", &[]),
            ),
            (
                &["/livenessprobe", "--csi-address=/csi/csi.sock"],
                run(
                    "probe",
                    "livenessprobe",
                    &["serve", "--csi-address=/csi/csi.sock"],
                ),
            ),
            (
                &["./csi-node-server"],
                run("node-server", "csi-node-server", &[]),
            ),
            (
                &["csi-nodekit", "node-server", "-v", "5"],
                run("node-server", "csi-nodekit node-server", &["-v", "5"]),
            ),
            (
                &["/bin/csi-nodekit", "registrar"],
                run("registrar", "csi-nodekit registrar", &[]),
            ),
            (
                &["csi-nodekit", "probe", "once"],
                run("probe", "csi-nodekit probe", &["once"]),
            ),
            (
                &["csi-nodekit", "livenessprobe"],
                run("probe", "csi-nodekit livenessprobe", &["serve"]),
            ),
            (
                &["renamed-binary", "probe"],
                run("probe", "renamed-binary probe", &[]),
            ),
            (
                &["csi-nodekit", "demo"],
                run("demo", "csi-nodekit demo", &[]),
            ),
            (&["csi-nodekit", "--version"], Dispatch::Version),
            (&["csi-nodekit", "--help"], Dispatch::Help),
            (&["csi-nodekit", "-h"], Dispatch::Help),
            (&["csi-nodekit"], Dispatch::Unknown("no mode given".into())),
            (&[], Dispatch::Unknown("no mode given".into())),
            (
                &["csi-nodekit", "frobnicate"],
                Dispatch::Unknown("unknown mode \"frobnicate\"".into()),
            ),
            (
                &["csi-nodekit", "--v=2"],
                Dispatch::UnknownFlag("flag provided but not defined: -v".into()),
            ),
            (
                &["csi-nodekit", "help", "registrar"],
                run("registrar", "csi-nodekit registrar", &["--help"]),
            ),
            (
                &["csi-nodekit", "help", "livenessprobe"],
                run("probe", "csi-nodekit livenessprobe", &["serve", "--help"]),
            ),
            (
                &["csi-nodekit", "help", "probe", "once"],
                run("probe", "csi-nodekit probe", &["once", "--help"]),
            ),
            (&["csi-nodekit", "help"], Dispatch::Help),
            (
                &["csi-nodekit", "help", "nothing"],
                Dispatch::Unknown("unknown mode \"nothing\"".into()),
            ),
            (
                &["csi-nodekit", "regsitrar"],
                Dispatch::Unknown(
                    "unknown mode \"regsitrar\" (did you mean \"registrar\"?)".into(),
                ),
            ),
            (
                &["csi-nodekit", "liveness-probe"],
                Dispatch::Unknown(
                    "unknown mode \"liveness-probe\" (did you mean \"livenessprobe\"?)".into(),
                ),
            ),
            (
                &["csi-nodekit", "help", "node-sever"],
                Dispatch::Unknown(
                    "unknown mode \"node-sever\" (did you mean \"node-server\"?)".into(),
                ),
            ),
            (
                &["csi-nodekit", "pr"],
                Dispatch::Unknown("unknown mode \"pr\"".into()),
            ),
        ];
        for (words, expected) in table {
            assert_eq!(
                &cli::dispatch(MODES, &argv(words)),
                expected,
                "argv {words:?}"
            );
        }
    }

    #[test]
    fn usage_lists_every_mode() {
        for mode in ["node-server", "registrar", "probe", "livenessprobe", "demo"] {
            assert!(
                cli::usage(MODES).contains(mode),
                "{mode} missing from usage"
            );
        }
    }

    #[test]
    fn usage_and_help_name_every_mode_and_upstream_name_as_before_the_table() {
        assert_eq!(
            cli::usage(MODES),
            "usage: csi-nodekit <mode> [flags]   modes: node-server, registrar, probe, demo \
         (also invoked as csi-node-server, csi-node-driver-registrar, node-driver-registrar, \
         livenessprobe); csi-nodekit help <mode> shows a mode's flags"
        );
        let help = cli::help_text(MODES);
        assert!(
            help.contains(
                "\nIn the image also linked as the upstream names: csi-node-server (node-server), \
             csi-node-driver-registrar and node-driver-registrar (registrar), livenessprobe \
             (probe serve).\n"
            ),
            "{help}"
        );
        for mode in MODES {
            let line = format!(
                "\n  {:<13}{}\n",
                mode.name,
                cli::help::one_line((mode.description)())
            );
            assert!(help.contains(&line), "{line:?} missing from {help}");
        }
    }

    #[test]
    fn no_name_selects_two_modes() {
        let mut names: Vec<&str> = MODES
            .iter()
            .flat_map(|m| std::iter::once(m.name).chain(m.aliases.iter().map(|(a, _)| *a)))
            .collect();
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all, "a name appears twice in {names:?}");
    }
}
