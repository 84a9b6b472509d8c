use super::*;

fn why<T: FlagValue + std::fmt::Debug>(text: &str) -> String {
    T::parse(text).unwrap_err().why().to_owned()
}

#[test]
fn socket_addresses_take_the_three_forms_and_keep_the_text() {
    for text in [
        "unix:///csi/csi.sock",
        "unix:/csi/csi.sock",
        "/csi/csi.sock",
    ] {
        let address = SocketAddress::parse(text).unwrap();
        assert_eq!(address.path(), Path::new("/csi/csi.sock"), "{text}");
        assert!(format!("{address:?}").contains(text), "{address:?}");
    }
    assert_eq!(why::<SocketAddress>(""), "socket address is empty");
    assert_eq!(
        why::<SocketAddress>("unix://csi.sock"),
        "socket address \"unix://csi.sock\" is not an absolute path"
    );
}

#[test]
fn positive_durations_refuse_zero_shown_as_go_prints_it() {
    assert_eq!(
        PositiveDuration::parse("1m30s").unwrap().get(),
        Duration::from_secs(90)
    );
    for zero in ["0", "0s", "0ms"] {
        let refusal = PositiveDuration::parse(zero).unwrap_err();
        assert_eq!(refusal.why(), "must be more than 0");
        assert_eq!(refusal.shown(), Some("0s"));
    }
    let malformed = PositiveDuration::parse("often").unwrap_err();
    assert_eq!(
        malformed.why(),
        "invalid duration \"often\": expected e.g. 1s, 500ms, 2m30s"
    );
    assert_eq!(malformed.shown(), None);
    assert_eq!(PositiveDuration::from_secs(3).get(), Duration::from_secs(3));
}

#[test]
fn http_values_are_checked_as_the_servers_need_them() {
    assert_eq!(HttpEndpoint::parse(":9808").unwrap().into_string(), ":9808");
    assert_eq!(
        why::<HttpEndpoint>(":0"),
        "port 0 would pick a random port no probe can find"
    );
    assert_eq!(why::<HttpEndpoint>("banana"), "expected host:port or :port");
    assert_eq!(
        why::<HttpEndpoint>("999.1.1.1:80"),
        "the host looks like an IPv4 address but is not one"
    );
    assert_eq!(
        HttpEndpoint::parse("10.0.0.1:80").unwrap().into_string(),
        "10.0.0.1:80"
    );
    assert_eq!(MetricsPath::known("/metrics").into_string(), "/metrics");
    assert_eq!(why::<MetricsPath>("metrics"), "must start with /");
    assert_eq!(
        why::<MetricsPath>("/healthz"),
        "clashes with the health check at /healthz"
    );
    for never_requested in ["/metrics?x=1", "/m#top", "/my metrics"] {
        assert!(
            why::<MetricsPath>(never_requested).starts_with("a request's path never holds"),
            "{never_requested}"
        );
    }
}

#[test]
fn tcp_ports_are_digits_from_1_to_65535_kept_as_written() {
    assert_eq!(TcpPort::parse("09808").unwrap().as_str(), "09808");
    for bad in ["0", "65536", "-1", "+80", "banana", ""] {
        assert_eq!(
            why::<TcpPort>(bad),
            "expected a port from 1 to 65535",
            "{bad}"
        );
    }
}

#[test]
fn paths_sizes_and_empty_values() {
    assert_eq!(why::<NonEmptyPath>(""), "must not be empty");
    assert_eq!(
        NonEmptyPath::known("/registration").into_path(),
        PathBuf::from("/registration")
    );
    assert_eq!(ByteSize::parse("2Gi").unwrap().bytes(), 2 << 30);
    assert_eq!(
        why::<ByteSize>("10 parsecs"),
        "invalid size \"10 parsecs\": expected bytes such as 10Gi, 500M or 1073741824"
    );
    for zero in ["0", "0Gi", "0M"] {
        assert_eq!(
            why::<ByteSize>(zero),
            "must be more than 0; leave it out to use the free space",
            "{zero}"
        );
    }
    for tiny in ["1", "1023Ki"] {
        assert!(
            why::<ByteSize>(tiny).starts_with("must be at least 1Mi"),
            "{tiny}"
        );
    }
    assert_eq!(ByteSize::parse("1Mi").unwrap().bytes(), 1 << 20);
    assert_eq!(BlockSize::parse("64Ki").unwrap().bytes(), 64 << 10);
    assert_eq!(BlockSize::parse("4096").unwrap().bytes(), 4096);
    assert_eq!(BlockSize::parse("1Gi").unwrap().bytes(), 1 << 30);
    for bad in ["2Ki", "3000", "2Gi", "0"] {
        assert!(
            why::<BlockSize>(bad).starts_with("must be a power of two from 4Ki to 1Gi"),
            "{bad}"
        );
    }
    assert_eq!(OrEmpty::<HttpEndpoint>::parse(""), Ok(OrEmpty(None)));
    assert!(
        OrEmpty::<HttpEndpoint>::parse(":1")
            .unwrap()
            .into_option()
            .is_some()
    );
    assert_eq!(
        OrEmpty::<HttpEndpoint>::parse("banana").unwrap_err().why(),
        "expected host:port or :port"
    );
}

#[test]
#[should_panic(expected = "must not be empty")]
fn a_bad_default_in_the_code_panics() {
    NonEmptyPath::known("");
}

#[test]
fn a_refusal_is_found_in_any_text_around_it() {
    let framed = from_arg_value::<PositiveDuration>("0ms").unwrap_err();
    for around in [
        format!("Error parsing option '--timeout' with value '0ms': {framed}\n"),
        framed.clone(),
        format!("anything else, {framed}, said otherwise"),
        // A NUL in what argh writes of the value is not taken for the frame.
        format!("with value 'a\0b': {framed}"),
    ] {
        let refusal = Refusal::decode(&around).unwrap();
        assert_eq!(
            (refusal.why(), refusal.shown()),
            ("must be more than 0", Some("0s")),
            "{around:?}"
        );
    }
    let framed = from_arg_value::<SocketAddress>("rel\0ative").unwrap_err();
    let refusal = Refusal::decode(&framed).unwrap();
    assert_eq!(refusal.shown(), Some("rel\\x00ative"));
    assert_eq!(Refusal::decode("Unrecognized argument: --x\n"), None);
    assert_eq!(Refusal::decode("one \0 two \0 three"), None);
}

#[test]
fn flow_files_need_a_known_extension_and_a_place_that_can_be_written() {
    use crate::flow::Format;
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name).display().to_string();
    assert_eq!(FlowFile::known(&at("f.svg")).format, Format::Svg);
    assert_eq!(FlowFile::known(&at("f.mmd")).format, Format::Mermaid);
    assert_eq!(FlowFile::known(&at("f.md")).format, Format::Mermaid);
    assert!(!dir.path().join("f.svg").exists(), "nothing is created");
    assert_eq!(
        why::<FlowFile>(&at("f.png")),
        "expected a file ending in .svg, .mmd or .md"
    );
    assert_eq!(
        why::<FlowFile>(&at("missing/f.svg")),
        format!(
            "cannot be written: directory {}: No such file or directory (os error 2)",
            at("missing")
        )
    );
    std::fs::create_dir(dir.path().join("d.svg")).unwrap();
    assert_eq!(
        why::<FlowFile>(&at("d.svg")),
        "cannot be written: is a directory"
    );
}

#[test]
fn a_group_id_is_a_number_other_than_the_one_chown_takes_as_unchanged() {
    assert_eq!(GroupId::parse("65532").unwrap().get(), 65532);
    assert_eq!(GroupId::parse("0").unwrap().get(), 0);
    assert!(why::<GroupId>("4294967295").contains("leave the group unchanged"));
    assert_eq!(why::<GroupId>("wheel"), "expected a numeric group ID");
    assert_eq!(why::<GroupId>("-1"), "expected a numeric group ID");
}

#[test]
fn a_socket_path_for_the_kubelet_that_ends_in_a_slash_names_no_socket() {
    assert!(why::<HostSocketPath>("/var/lib/kubelet/plugins/x/").starts_with("ends in /"));
    assert!(why::<HostSocketPath>("unix:///var/lib/kubelet/plugins/x/").starts_with("ends in /"));
    assert!(HostSocketPath::parse("/var/lib/kubelet/plugins/x/csi.sock").is_ok());
}
