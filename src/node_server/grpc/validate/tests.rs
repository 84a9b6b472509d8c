use tonic::Code;

use super::*;
use crate::proto::csi::volume_capability::{
    AccessMode as ModeMsg, AccessType, BlockVolume, MountVolume,
};
use std::path::Path;

fn mount_cap(mode: AccessMode, flags: &[&str], group: &str) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(ModeMsg { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: String::new(),
            mount_flags: flags.iter().map(|s| s.to_string()).collect(),
            volume_mount_group: group.into(),
        })),
    }
}

fn code<T: std::fmt::Debug>(result: Result<T, Status>) -> Code {
    result.unwrap_err().code()
}

#[test]
fn volume_ids_must_be_one_plain_path_component() {
    assert_eq!(volume_id("vol-1").unwrap(), "vol-1");
    assert_eq!(volume_id("csi-4f2a:x y").unwrap(), "csi-4f2a:x y");
    for bad in ["", "a/b", "..", ".", ".hidden", "nul\0", &"x".repeat(201)] {
        assert_eq!(code(volume_id(bad)), Code::InvalidArgument, "{bad:?}");
    }
}

#[test]
fn paths_are_normalised_and_traversal_is_refused() {
    assert_eq!(
        path(Field::TargetPath, "//a/./b//c/").unwrap(),
        PathBuf::from("/a/b/c")
    );
    for bad in ["", "relative/x", "/a/../b", "/..", "/", "/a/b/..", "/a\0b"] {
        assert_eq!(
            code(path(Field::TargetPath, bad)),
            Code::InvalidArgument,
            "{bad:?}"
        );
    }
    let message = path(Field::StagingTargetPath, "/a/../etc").unwrap_err();
    assert!(
        message.message().contains("staging_target_path"),
        "{message:?}"
    );
}

#[test]
fn a_missing_or_empty_capability_is_an_invalid_argument() {
    assert_eq!(code(capability(None)), Code::InvalidArgument);
    let no_mode = VolumeCapability {
        access_mode: None,
        ..mount_cap(AccessMode::SingleNodeWriter, &[], "")
    };
    assert_eq!(code(capability(Some(&no_mode))), Code::InvalidArgument);
    let unknown = mount_cap(AccessMode::Unknown, &[], "");
    assert_eq!(code(capability(Some(&unknown))), Code::InvalidArgument);
    let mut bogus_mode = mount_cap(AccessMode::SingleNodeWriter, &[], "");
    bogus_mode.access_mode = Some(ModeMsg { mode: 99 });
    assert_eq!(code(capability(Some(&bogus_mode))), Code::InvalidArgument);
    let no_type = VolumeCapability {
        access_type: None,
        ..mount_cap(AccessMode::SingleNodeWriter, &[], "")
    };
    assert_eq!(code(capability(Some(&no_type))), Code::InvalidArgument);
    assert_eq!(code(capabilities(&[])), Code::InvalidArgument);
}

#[test]
fn mount_capabilities_carry_flags_and_a_numeric_group() {
    let cap = capability(Some(&mount_cap(
        AccessMode::MultiNodeReaderOnly,
        &["nosuid"],
        "2000",
    )))
    .unwrap();
    assert_eq!(cap.mode, AccessMode::MultiNodeReaderOnly);
    assert_eq!(cap.group, Some(2000));
    assert!(!cap.block);
    assert!(cap.options(true).unwrap().readonly);
    let bad_group = mount_cap(AccessMode::SingleNodeWriter, &[], "wheel");
    assert_eq!(code(capability(Some(&bad_group))), Code::InvalidArgument);
    let bad_flag = mount_cap(AccessMode::SingleNodeWriter, &["size=1g"], "");
    assert_eq!(code(capability(Some(&bad_flag))), Code::InvalidArgument);
}

#[test]
fn block_capabilities_parse_with_no_mount_flags_or_group() {
    let block = VolumeCapability {
        access_mode: Some(ModeMsg {
            mode: AccessMode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    };
    let cap = capability(Some(&block)).unwrap();
    assert!(cap.block);
    assert_eq!((cap.flags.len(), cap.group), (0, None));
}

#[test]
fn capacity_ranges_reject_negatives_and_inverted_bounds() {
    assert_eq!(capacity_range(None).unwrap(), (0, 0));
    let range = |required_bytes, limit_bytes| CapacityRange {
        required_bytes,
        limit_bytes,
    };
    assert_eq!(capacity_range(Some(&range(10, 20))).unwrap(), (10, 20));
    assert_eq!(capacity_range(Some(&range(10, 0))).unwrap(), (10, 0));
    assert_eq!(
        code(capacity_range(Some(&range(-1, 0)))),
        Code::InvalidArgument
    );
    assert_eq!(
        code(capacity_range(Some(&range(0, -5)))),
        Code::InvalidArgument
    );
    assert_eq!(code(capacity_range(Some(&range(30, 20)))), Code::OutOfRange);
}

#[test]
fn pagination_tokens_round_trip_and_foreign_tokens_abort() {
    for id in ["vol-0123", "csi-x y:z", "ünï"] {
        assert_eq!(
            decode_token(&encode_token(id), any_volume_id)
                .unwrap()
                .as_deref(),
            Some(id)
        );
    }
    assert_eq!(decode_token("", any_volume_id).unwrap(), None);
    for bad in [
        "invalid-token",
        "abc",
        "zz",
        "2f",
        "ff",
        "2e2e",
        "03",
        "+3",
        "+a",
        "0A",
    ] {
        let answer = decode_token(bad, any_volume_id);
        assert_eq!(code(answer), Code::Aborted, "{bad:?}");
    }
    let long = "76".repeat(MAX_TOKEN / 2 + 1);
    assert_eq!(code(decode_token(&long, any_volume_id)), Code::Aborted);
}

#[test]
fn snapshot_tokens_name_an_id_this_plugin_could_have_issued_and_are_never_echoed() {
    let id = format!("snap-{}", "0123456789abcdef".repeat(2));
    let token = encode_token(&id);
    assert_eq!(
        decode_token(&token, issued_snapshot_id).unwrap().as_deref(),
        Some(id.as_str())
    );
    let forged = [
        "03".to_owned(),
        "+3".to_owned(),
        "18446744073709551616".to_owned(),
        encode_token("snap-1"),
        encode_token("vol-0123"),
        "ab".repeat(5000),
    ];
    for bad in forged {
        let status = decode_token(&bad, issued_snapshot_id).unwrap_err();
        assert_eq!(status.code(), Code::Aborted, "{bad:?}");
        assert!(status.message().len() < 120, "{}", status.message());
        assert!(!status.message().contains(&bad), "{}", status.message());
    }
}

#[test]
fn snapshot_ids_are_bounded_and_one_plain_path_component() {
    assert!(snapshot_id("snapshot_id", "snap-1").is_ok());
    for bad in ["", "../victim", "a/b", ".hidden", "a\0b"] {
        assert_eq!(
            code(snapshot_id("snapshot_id", bad)),
            Code::InvalidArgument,
            "{bad:?}"
        );
    }
    let long = "s".repeat(205);
    let status = snapshot_id("snapshot_id", &long).unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        !status.message().contains(&long),
        "clipped: {}",
        status.message()
    );
}

#[test]
fn names_may_hold_any_unicode_but_the_excluded_control_characters() {
    for good in [
        "pvc-1",
        "tab\there",
        "line\nbreak",
        "cr\r",
        "ünïcödé ✓",
        "\u{a0}",
    ] {
        assert_eq!(name(good).unwrap(), good);
    }
    for bad in [
        "",
        "nul\0",
        "bell\u{7}",
        "vt\u{b}",
        "esc\u{1b}",
        "del\u{7f}",
        "c1\u{9f}",
    ] {
        assert_eq!(code(name(bad)), Code::InvalidArgument, "{bad:?}");
    }
    let err = name("a\u{1b}b").unwrap_err();
    assert!(err.message().contains("U+001B"), "{err}");
}

#[test]
fn a_path_is_nested_in_another_when_it_is_it_or_below_it_component_wise() {
    let p = Path::new;
    assert!(nested(p("/a/b"), p("/a/b")));
    assert!(nested(p("/a/b/c"), p("/a/b")));
    assert!(nested(p("/a"), p("/a/b")));
    assert!(!nested(p("/a/bc"), p("/a/b")));
    assert!(!nested(p("/x/t"), p("/x/s")));
}
