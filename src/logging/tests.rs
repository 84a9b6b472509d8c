use super::*;

#[test]
fn verbosity_maps_to_levels_quiet_by_default() {
    assert_eq!(level_for(0), LevelFilter::Info);
    assert_eq!(level_for(2), LevelFilter::Debug);
    assert_eq!(level_for(5), LevelFilter::Trace);
    assert_eq!(library_level(5), LevelFilter::Warn);
    assert_eq!(library_level(8), LevelFilter::Trace);
}

#[test]
fn formats_parse_and_unknown_ones_are_named() {
    assert_eq!("json".parse::<Format>(), Ok(Format::Json));
    assert_eq!("text".parse::<Format>(), Ok(Format::Text));
    assert!(
        "xml"
            .parse::<Format>()
            .unwrap_err()
            .to_string()
            .contains("\"xml\"")
    );
}

#[test]
fn vmodule_parses_comma_separated_pattern_settings() {
    let parsed: VModule = "supervise=5,probe/*=3,,h2=8".parse().unwrap();
    let expected = [("supervise", 5), ("probe/*", 3), ("h2", 8)];
    let expected: Vec<(String, u8)> = expected.iter().map(|(p, n)| ((*p).into(), *n)).collect();
    assert_eq!(parsed.0, expected);
    assert_eq!("".parse::<VModule>(), Ok(VModule::default()));
    for bad in ["supervise", "=3", "x=high", "x=-1", "x=300"] {
        let error = bad.parse::<VModule>().unwrap_err().to_string();
        assert!(error.contains("pattern=N"), "{bad}: {error}");
    }
}

#[test]
fn vmodule_patterns_match_file_names_modules_and_the_modules_under_them() {
    let vmodule: VModule = "supervise=5,probe/serve=4,h2=8,check*=2".parse().unwrap();
    let table = [
        (
            "csi_nodekit::registrar::supervise",
            "src/registrar/supervise.rs",
            Some(5),
        ),
        ("csi_nodekit::probe::serve", "src/probe/serve.rs", Some(4)),
        (
            "h2::codec::framed_read",
            "/r/h2-0.4/src/codec/framed_read.rs",
            Some(8),
        ),
        ("csi_nodekit::probe::check", "src/probe/check.rs", Some(2)),
        ("csi_nodekit::probe", "src/probe/mod.rs", None),
        (
            "csi_nodekit::registrar::service",
            "src/registrar/service.rs",
            None,
        ),
        ("hyper::proto", "/r/hyper/src/proto/mod.rs", None),
    ];
    for (target, file, expected) in table {
        assert_eq!(
            vmodule.verbosity_for(target, Some(file)),
            expected,
            "{target}"
        );
    }
    // The first matching pattern decides, as in klog.
    let first: VModule = "serve=1,probe=6".parse().unwrap();
    assert_eq!(
        first.verbosity_for("csi_nodekit::probe::serve", Some("src/probe/serve.rs")),
        Some(1)
    );
}

#[test]
fn globs_match_any_run_or_any_one_character() {
    for (pattern, text, expected) in [
        ("*", "", true),
        ("ser*", "serve", true),
        ("s?rve", "serve", true),
        ("s?rve", "srve", false),
        ("*ve", "serve", true),
        ("serve", "server", false),
    ] {
        assert_eq!(
            glob(pattern.as_bytes(), text.as_bytes()),
            expected,
            "{pattern} {text}"
        );
    }
}

#[test]
fn the_filter_gives_vmodule_modules_their_own_level_and_keeps_libraries_quiet() {
    let filter = Filter::Klog {
        verbosity: 0,
        vmodule: "supervise=5".parse().unwrap(),
    };
    let supervise = (
        "csi_nodekit::registrar::supervise",
        Some("src/registrar/supervise.rs"),
    );
    assert_eq!(filter.level(supervise.0, supervise.1), LevelFilter::Trace);
    assert_eq!(
        filter.level("csi_nodekit::registrar", Some("src/registrar/mod.rs")),
        LevelFilter::Info
    );
    assert_eq!(filter.level("h2::proto", None), LevelFilter::Warn);
    assert_eq!(filter.max(), LevelFilter::Trace);
}
