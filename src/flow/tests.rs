use super::*;

fn arrow(step: u8, at_ns: u64, group: Option<&str>) -> Arrow {
    Arrow {
        at_ns,
        group: group.map(str::to_owned),
        ..Arrow::untimed(step, Party::Kubelet, Party::Registrar, "GetInfo", "x")
    }
}

#[test]
fn arrows_are_drawn_in_the_order_observed_and_a_plugins_arrows_stay_together() {
    let flow = Flow::new(
        "t",
        vec![
            arrow(5, 30, Some("a")),
            arrow(4, 10, Some("b")),
            arrow(4, 20, Some("a")),
            arrow(7, 40, Some("b")),
        ],
    );
    let order: Vec<_> = flow
        .arrows
        .iter()
        .map(|a| (a.group.as_deref().unwrap_or_default(), a.step))
        .collect();
    assert_eq!(order, [("a", 4), ("a", 5), ("b", 4), ("b", 7)]);
}

#[test]
fn lifelines_are_the_parties_used_from_the_driver_to_the_api() {
    let flow = Flow::new(
        "t",
        vec![
            Arrow::untimed(6, Party::Kubelet, Party::Api, "writes", ""),
            Arrow::untimed(1, Party::Driver, Party::Driver, "creates csi.sock", ""),
        ],
    );
    assert_eq!(
        flow.lifelines(),
        [Party::Driver, Party::Kubelet, Party::Api]
    );
}

#[test]
fn durations_read_as_people_write_them() {
    let took = |us| Arrow {
        took_us: Some(us),
        ..arrow(4, 0, None)
    };
    assert_eq!(took(35).took_text().as_deref(), Some("35 µs"));
    assert_eq!(took(1_240).took_text().as_deref(), Some("1.2 ms"));
    assert_eq!(took(2_010_000).took_text().as_deref(), Some("2.01 s"));
    assert_eq!(took(1_240).heading(), "4. GetInfo (1.2 ms)");
    assert_eq!(arrow(4, 0, None).heading(), "4. GetInfo");
}

#[test]
fn the_format_is_the_files_extension() {
    let format = |p: &str| FlowFile::format_of(Path::new(p));
    assert_eq!(format("/tmp/f.svg"), Ok(Format::Svg));
    assert_eq!(format("f.mmd"), Ok(Format::Mermaid));
    assert_eq!(format("docs/f.md"), Ok(Format::Mermaid));
    assert!(format("f.png").is_err());
    assert!(format("f").is_err());
    assert!(format("svg").is_err());
}

#[test]
fn a_stamp_is_on_the_monotonic_clock_and_times_the_call() {
    let before = monotonic_ns();
    let stamp = Stamp::now();
    let arrow = stamp.arrow(
        4,
        Party::Kubelet,
        Party::Registrar,
        "GetInfo",
        "",
        Outcome::Ok,
    );
    assert!(arrow.at_ns >= before && arrow.at_ns <= monotonic_ns());
    assert!(arrow.took_us.is_some());
}
