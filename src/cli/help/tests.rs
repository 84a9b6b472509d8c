use super::*;
use argh::{ArgsInfo, FromArgs};

// Flags of every kind, to pin the layout of Go's `flag.PrintDefaults`.
#[derive(FromArgs, ArgsInfo, Debug)]
/// Layout sample.
#[allow(dead_code)] // only its description is used
struct Sample {
    /// a one-letter switch
    #[argh(switch)]
    x: bool,
    /// a duration (default 1s)
    #[argh(option, default = "String::new()", arg_name = "duration")]
    timeout: String,
    /// a string (default "/run/csi/socket")
    #[argh(option, default = "String::new()")]
    csi_address: String,
    /// klog's spelling
    #[argh(option)]
    log_dir: Option<String>,
    /// sorts after log_dir
    #[argh(option, default = "String::new()")]
    logging_format: String,
    /// sorts before log_dir
    #[argh(option, default = "String::new()")]
    log_flush_frequency: String,
}

#[test]
fn help_lays_flags_out_as_go_flag_package_does() {
    let text = render("sample", &Sample::get_args_info());
    let expected = "Usage: sample [flags]\nLayout sample.\n\nFlags:\n\
        \x20 -csi-address string\n    \ta string (default \"/run/csi/socket\")\n\
        \x20 -log-flush-frequency string\n    \tsorts before log_dir\n\
        \x20 -log_dir string\n    \tklog's spelling\n\
        \x20 -logging-format string\n    \tsorts after log_dir\n\
        \x20 -timeout duration\n    \ta duration (default 1s)\n\
        \x20 -x\ta one-letter switch\n";
    assert_eq!(text, expected);
}

/// The text after "(default " in a description, up to its closing parenthesis.
fn documented_default(description: &str) -> Option<String> {
    let text = one_line(description);
    let start = text.rfind("(default ")? + "(default ".len();
    let end = text[start..].rfind(')')? + start;
    let default = text[start..end].to_owned();
    // "(default: ...)" explains a computed default in words; not a value.
    (!default.starts_with(':')).then_some(default)
}

/// The Debug text of `field` in a struct's Debug output: up to the next known field.
fn debug_value<'a>(debug: &'a str, field: &str, fields: &[String]) -> Option<&'a str> {
    let start = [format!("{{ {field}: "), format!(", {field}: ")]
        .iter()
        .find_map(|key| debug.find(key.as_str()).map(|at| at + key.len()))?;
    let rest = &debug[start..];
    let end = fields
        .iter()
        .filter_map(|other| rest.find(&format!(", {other}: ")))
        .chain(rest.rfind(" }"))
        .min()?;
    Some(&rest[..end])
}

/// Every "(default X)" a help shows is what the flags parse to when not given.
fn defaults_hold(parsed: &str, info: &argh::CommandInfoWithArgs) {
    let fields: Vec<String> = info
        .flags
        .iter()
        .map(|f| f.long.trim_start_matches('-').replace('-', "_"))
        .collect();
    let mut checked = 0;
    for (flag, field) in info.flags.iter().zip(&fields) {
        let Some(default) = documented_default(flag.description) else {
            continue;
        };
        if flag.kind == argh::FlagInfoKind::Switch {
            continue; // klog's --logtostderr: a switch we cannot turn off, said in words
        }
        let value = debug_value(parsed, field, &fields).unwrap_or_else(|| panic!("{field}"));
        if value == "None" && flag.description.starts_with("accepted and ignored") {
            continue; // upstream's default, told for an operator's benefit; nothing uses it
        }
        let default = default.trim_matches('"').to_lowercase();
        assert!(
            value.to_lowercase().contains(&default),
            "--{field}: help says (default {default}), parsed {value}"
        );
        checked += 1;
    }
    assert!(checked > 0, "no default checked in {parsed}");
}

#[test]
fn every_default_the_help_shows_is_the_default_parsed() {
    let empty: &[String] = &[];
    let registrar: crate::registrar::Args = crate::cli::parse_mode_args("r", empty).unwrap();
    defaults_hold(
        &format!("{registrar:?}"),
        &crate::registrar::Args::get_args_info(),
    );
    let node: crate::node_server::Args = crate::cli::parse_mode_args("n", empty).unwrap();
    defaults_hold(
        &format!("{node:?}"),
        &crate::node_server::Args::get_args_info(),
    );
    let probe = crate::probe::Args::get_args_info();
    for sub in &probe.commands {
        let words = [sub.name.to_owned()];
        let parsed: crate::probe::Args = crate::cli::parse_mode_args("p", &words).unwrap();
        defaults_hold(&format!("{parsed:?}"), &sub.command);
    }
}

#[test]
fn livenessprobe_help_names_the_command_that_works() {
    let info = crate::probe::Args::get_args_info();
    let words = ["serve".to_owned(), "--help".to_owned()];
    let implied = for_words("livenessprobe", &info, &words, 1);
    assert!(
        implied.starts_with("Usage: livenessprobe [flags]\n"),
        "{implied}"
    );
    let given = for_words("csi-nodekit probe", &info, &words, 0);
    assert!(
        given.starts_with("Usage: csi-nodekit probe serve [flags]\n"),
        "{given}"
    );
    let top = for_words("csi-nodekit probe", &info, &words[1..], 0);
    assert!(
        top.starts_with("Usage: csi-nodekit probe <command> [flags]\n"),
        "{top}"
    );
    assert!(top.contains("\n  serve "), "{top}");
}
