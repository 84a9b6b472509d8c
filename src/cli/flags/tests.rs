use super::*;
use crate::cli::values::{
    FlagValue, HttpEndpoint, NonEmptyPath, OrEmpty, PositiveDuration, SocketAddress,
};
use proptest::prelude::*;

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

const SWITCHES: &[&str] = &["enable-pprof", "version"];

#[test]
fn normalization_table_rewrites_every_go_flag_form() {
    let table: &[(&[&str], &[&str])] = &[
        (
            &["--csi-address=/csi/csi.sock"],
            &["--csi-address", "/csi/csi.sock"],
        ),
        (
            &["--csi-address", "/csi/csi.sock"],
            &["--csi-address", "/csi/csi.sock"],
        ),
        (
            &["-csi-address=/csi/csi.sock"],
            &["--csi-address", "/csi/csi.sock"],
        ),
        (
            &["-csi-address", "/csi/csi.sock"],
            &["--csi-address", "/csi/csi.sock"],
        ),
        (&["-v=5"], &["--v", "5"]),
        (&["--v=5"], &["--v", "5"]),
        (&["-v", "5"], &["--v", "5"]),
        (&["--enable-pprof"], &["--enable-pprof"]),
        (&["-enable-pprof"], &["--enable-pprof"]),
        (&["--enable-pprof=true"], &["--enable-pprof"]),
        (&["--enable-pprof=1"], &["--enable-pprof"]),
        (&["--enable-pprof=false"], &[]),
        (&["--enable-pprof=F"], &[]),
        (&["-h"], &["--help"]),
        (&["-help"], &["--help"]),
        (&["--version"], &["--version"]),
        (
            &["--timeout=2m30s", "serve"],
            &["--timeout", "2m30s", "serve"],
        ),
        (&["--endpoint=unix:///a=b"], &["--endpoint", "unix:///a=b"]),
        (&["--label", "-not-a-flag"], &["--label", "-not-a-flag"]),
        (&["--empty="], &["--empty", ""]),
        (&["once", "-"], &["once", "-"]),
        (&["--", "--csi-address=x"], &["--", "--csi-address=x"]),
        (&["--dangling"], &["--dangling"]),
        (
            &["--v=2", "--csi-address=/a", "--v=5"],
            &["--v", "5", "--csi-address", "/a"],
        ),
        (&["--enable-pprof", "--enable-pprof=false"], &[]),
        (
            &["--enable-pprof=false", "-enable-pprof"],
            &["--enable-pprof"],
        ),
        (
            &["--v=1", "serve", "--v=2"],
            &["--v", "1", "serve", "--v", "2"],
        ),
    ];
    for (input, expected) in table {
        assert_eq!(
            normalize_flags(&argv(input), SWITCHES).as_deref(),
            Ok(&argv(expected)[..]),
            "{input:?}"
        );
    }
}

#[test]
fn malformed_flags_are_errors_that_name_the_flag() {
    let table: &[(&[&str], &str)] = &[
        (&["---v=1"], "bad flag syntax: ---v=1"),
        (&["-=x"], "bad flag syntax: -=x"),
        (
            &["--enable-pprof=maybe"],
            "invalid boolean value \"maybe\" for flag --enable-pprof",
        ),
    ];
    for (input, message) in table {
        assert_eq!(
            normalize_flags(&argv(input), SWITCHES),
            Err(FlagError((*message).into()))
        );
    }
}

/// A small Args to drive argh through the whole parse step.
#[derive(argh::FromArgs, argh::ArgsInfo, Debug)]
/// test args
struct Sample {
    /// an address
    #[argh(option, default = "String::from(\"/run/csi/socket\")")]
    csi_address: String,
    /// verbosity
    #[argh(option, default = "0")]
    v: u8,
    /// a go-only switch
    #[argh(switch)]
    enable_pprof: bool,
}

#[test]
fn parse_mode_args_accepts_manifest_style_flags() {
    let args = argv(&[
        "-v=5",
        "--csi-address",
        "/csi/csi.sock",
        "-enable-pprof=true",
    ]);
    let parsed: Sample = parse_mode_args("csi-nodekit test", &args).unwrap();
    assert_eq!(
        (parsed.v, parsed.csi_address.as_str(), parsed.enable_pprof),
        (5, "/csi/csi.sock", true)
    );
}

#[test]
fn an_unknown_flag_gets_gos_line_and_gos_usage_of_the_command() {
    // Go names the flag with one dash however it was spelled, and prints the usage after it.
    for spelling in ["--bogus=1", "-bogus", "--bogus"] {
        let stop =
            parse_mode_args::<Sample>("csi-nodekit test", &argv(&["-v=2", spelling])).unwrap_err();
        assert_eq!(
            stop,
            ParseStop::Undefined {
                line: "flag provided but not defined: -bogus".into(),
                usage: "Usage of csi-nodekit test:\n  \
                        -csi-address string\n    \tan address\n  \
                        -enable-pprof\n    \ta go-only switch\n  \
                        -v string\n    \tverbosity\n"
                    .into(),
            },
            "{spelling}"
        );
    }
}

#[test]
fn a_bad_value_is_one_line_naming_the_flag() {
    let stop = parse_mode_args::<Sample>("csi-nodekit test", &argv(&["--v=loud"])).unwrap_err();
    let ParseStop::Usage(line) = stop else {
        panic!("expected a usage error, got {stop:?}")
    };
    assert!(line.contains("--v"), "{line}");
    assert!(!line.contains('\n'), "{line}");
}

#[test]
fn help_is_not_an_error() {
    let stop = parse_mode_args::<Sample>("csi-nodekit test", &argv(&["-h"])).unwrap_err();
    assert!(
        matches!(stop, ParseStop::Help(ref text) if text.contains("  -csi-address string\n")),
        "{stop:?}"
    );
}

#[test]
fn argh_errors_are_worded_as_go_words_them() {
    let table: &[(&[&str], &str)] = &[
        (
            &["--v=loud"],
            "csi-nodekit test: invalid value \"loud\" for flag --v: invalid digit found in string",
        ),
        (&["--v"], "csi-nodekit test: flag needs an argument: --v"),
        (
            &["stray"],
            "csi-nodekit test: unexpected argument \"stray\"",
        ),
    ];
    for (input, expected) in table {
        let stop = parse_mode_args::<Sample>("csi-nodekit test", &argv(input)).unwrap_err();
        assert_eq!(stop, ParseStop::Usage((*expected).into()), "{input:?}");
    }
}

#[test]
fn klog_underscore_names_reach_their_dashed_fields() {
    let input = argv(&[
        "-log_dir=/x",
        "--add_dir_header",
        "-skip_headers=false",
        "--v",
        "3",
    ]);
    assert_eq!(
        normalize_flags(&input, &["add-dir-header", "skip-headers"]),
        Ok(argv(&["--log-dir", "/x", "--add-dir-header", "--v", "3"]))
    );
}

/// One Go-style spelling of an option flag with a value.
fn spelled(name: &str, value: &str, form: u8) -> Vec<String> {
    match form % 4 {
        0 => vec![format!("--{name}={value}")],
        1 => vec![format!("-{name}={value}")],
        2 => vec![format!("--{name}"), value.to_owned()],
        _ => vec![format!("-{name}"), value.to_owned()],
    }
}

proptest! {
    #[test]
    fn normalization_never_panics(args in proptest::collection::vec(".*", 0..8)) {
        let _ = normalize_flags(&args, SWITCHES);
    }

    #[test]
    fn normalization_never_loses_a_value(
        flags in proptest::collection::vec(("[a-z][a-z0-9-]{0,12}", ".*", any::<u8>()), 0..6)
    ) {
        let mut seen = std::collections::HashSet::new();
        let flags: Vec<_> = flags
            .into_iter()
            .filter(|(n, _, _)| !SWITCHES.contains(&n.as_str()) && n != "h" && n != "help")
            .filter(|(n, _, _)| seen.insert(n.clone()))
            .collect();
        let input: Vec<String> = flags.iter().flat_map(|(n, v, f)| spelled(n, v, *f)).collect();
        let expected: Vec<String> = flags.iter().flat_map(|(n, v, _)| [format!("--{n}"), v.clone()]).collect();
        prop_assert_eq!(normalize_flags(&input, SWITCHES), Ok(expected));
    }

    #[test]
    fn a_repeated_flag_keeps_its_last_value(first in ".*", last in ".*", form in any::<u8>()) {
        let input: Vec<String> = [spelled("v", &first, form), spelled("v", &last, form / 4)].concat();
        prop_assert_eq!(normalize_flags(&input, SWITCHES), Ok(vec!["--v".to_owned(), last]));
    }
}

/// The texts of argh's that `go_wording` reads, exactly as argh writes them: an argh upgrade
/// that rewords one fails here, instead of turning a manifest's error line into argh's words.
#[test]
fn argh_texts_go_wording_reads_are_as_pinned() {
    let table: &[(&[&str], &str)] = &[
        (&["--bogus", "1"], "Unrecognized argument: --bogus\n"),
        (&["stray"], "Unrecognized argument: stray\n"),
        (&["--v"], "No value provided for option '--v'.\n"),
        (
            &["--v", "loud"],
            "Error parsing option '--v' with value 'loud': invalid digit found in string\n",
        ),
    ];
    for (words, text) in table {
        let early = <Sample as argh::FromArgs>::from_args(&["test"], words).unwrap_err();
        assert_eq!((early.output.as_str(), early.status), (*text, Err(())));
    }
}

/// Flags of our typed values, to drive their refusals through argh.
#[derive(argh::FromArgs, argh::ArgsInfo, Debug)]
/// typed args
struct Typed {
    /// an address
    #[argh(option, default = "SocketAddress::known(\"/run/csi/socket\")")]
    csi_address: SocketAddress,
    /// empty means none
    #[argh(option, default = "OrEmpty::default()")]
    http_endpoint: OrEmpty<HttpEndpoint>,
    /// a deadline
    #[argh(
        option,
        default = "PositiveDuration::from_secs(1)",
        arg_name = "duration"
    )]
    timeout: PositiveDuration,
    /// a klog name
    #[argh(option)]
    log_dir: Option<NonEmptyPath>,
    /// a foreign type
    #[argh(option, default = "0")]
    v: u8,
}

#[test]
fn a_refused_typed_value_is_worded_from_the_command_line_not_argh() {
    let table: &[(&[&str], &str)] = &[
        (
            &["--csi-address="],
            "t: invalid value \"\" for flag --csi-address: socket address is empty",
        ),
        (
            &["-csi-address", "unix://x.sock"],
            "t: invalid value \"unix://x.sock\" for flag --csi-address: \
             socket address \"unix://x.sock\" is not an absolute path",
        ),
        (
            &["--timeout=0ms"],
            "t: invalid value \"0s\" for flag --timeout: must be more than 0",
        ),
        (
            &["--timeout=often"],
            "t: invalid value \"often\" for flag --timeout: \
             invalid duration \"often\": expected e.g. 1s, 500ms, 2m30s",
        ),
        // The same value given to a flag that takes it first: the flag that refused is named.
        (
            &["--http-endpoint=", "--csi-address="],
            "t: invalid value \"\" for flag --csi-address: socket address is empty",
        ),
        (
            &["--v=1", "--http-endpoint=:0", "--timeout=1s"],
            "t: invalid value \":0\" for flag --http-endpoint: \
             port 0 would pick a random port no probe can find",
        ),
        // The first refused value in the words is the one reported, as argh reads them.
        (
            &["--timeout=0", "--csi-address="],
            "t: invalid value \"0s\" for flag --timeout: must be more than 0",
        ),
        // klog's spelling in the line, Go's quoting of the value.
        (
            &["-log_dir="],
            "t: invalid value \"\" for flag --log_dir: must not be empty",
        ),
        (
            &["--csi-address=tab\there"],
            "t: invalid value \"tab\\there\" for flag --csi-address: \
             socket address \"tab\\there\" is not an absolute path",
        ),
        // A type that is not ours still gets Go's words, from argh's text.
        (
            &["--v=loud"],
            "t: invalid value \"loud\" for flag --v: invalid digit found in string",
        ),
    ];
    for (input, expected) in table {
        let stop = parse_mode_args::<Typed>("t", &argv(input)).unwrap_err();
        assert_eq!(stop, ParseStop::Usage((*expected).into()), "{input:?}");
    }
    let parsed: Typed = parse_mode_args("t", &argv(&["--http-endpoint=", "-v=2"])).unwrap();
    assert!(parsed.http_endpoint.into_option().is_none());
    assert_eq!(
        parsed.csi_address.path(),
        std::path::Path::new("/run/csi/socket")
    );
    assert!(parsed.log_dir.is_none() && parsed.v == 2 && !parsed.timeout.get().is_zero());
}
