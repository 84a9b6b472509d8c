use super::*;
use tonic::Code;

fn create(name: &str, parameters: &[(&str, usize)]) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        parameters: parameters
            .iter()
            .map(|(k, n)| (k.to_string(), "v".repeat(*n)))
            .collect(),
        ..Default::default()
    }
}

#[test]
fn strings_may_be_128_bytes_and_no_more() {
    assert!(create(&"a".repeat(128), &[]).check_sizes().is_ok());
    let err = create(&"a".repeat(129), &[]).check_sizes().unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(
        err.message(),
        "name is 129 bytes; the CSI spec allows at most 128"
    );
    // Multi-byte characters count in bytes, as the spec's limit is in bytes.
    assert!(create(&"é".repeat(65), &[]).check_sizes().is_err());
}

#[test]
fn a_map_may_hold_4_kib_of_keys_and_values_and_its_values_may_pass_128() {
    assert!(create("n", &[("key", 4093)]).check_sizes().is_ok());
    let err = create("n", &[("key", 4000), ("k2", 93)])
        .check_sizes()
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().starts_with("parameters is 4098 bytes"),
        "{err}"
    );
}

#[test]
fn paths_may_be_as_long_as_the_os_allows() {
    let unpublish = |n: usize| NodeUnpublishVolumeRequest {
        volume_id: "v".into(),
        target_path: format!("/{}", "p".repeat(n - 1)),
    };
    assert!(unpublish(4095).check_sizes().is_ok());
    assert!(unpublish(4096).check_sizes().is_err());
}

#[test]
fn mount_flags_are_limited_in_total_and_nested_fields_are_named() {
    let publish = |flags: Vec<String>| NodePublishVolumeRequest {
        volume_capability: Some(VolumeCapability {
            access_type: Some(volume_capability::AccessType::Mount(
                volume_capability::MountVolume {
                    mount_flags: flags,
                    ..Default::default()
                },
            )),
            access_mode: None,
        }),
        ..Default::default()
    };
    assert!(publish(vec!["x".repeat(100); 40]).check_sizes().is_ok());
    let err = publish(vec!["x".repeat(100); 41])
        .check_sizes()
        .unwrap_err();
    assert!(
        err.message()
            .starts_with("volume_capability.mount.mount_flags is 4100 bytes in all"),
        "{err}"
    );
}

#[test]
fn the_request_bound_holds_the_largest_legal_node_publish_three_times_over() {
    use prost::Message;
    // Two-byte keys and empty values give the most encoding per byte of content (one-byte
    // ones more still, but there are only so many distinct ones).
    let alphabet: Vec<char> = ('0'..='9').chain('a'..='z').chain('A'..='Z').collect();
    let keys = alphabet
        .iter()
        .flat_map(|a| alphabet.iter().map(move |b| format!("{a}{b}")));
    let map: HashMap<String, String> = keys.take(MAX_MAP / 2).map(|k| (k, String::new())).collect();
    let cap = VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume {
                fs_type: "f".repeat(MAX_STRING),
                mount_flags: vec!["x".into(); MAX_MOUNT_FLAGS],
                volume_mount_group: "g".repeat(MAX_STRING),
            },
        )),
        access_mode: None,
    };
    let request = NodePublishVolumeRequest {
        volume_id: "v".repeat(MAX_STRING),
        publish_context: map.clone(),
        staging_target_path: "/".repeat(MAX_PATH - 1),
        target_path: "/".repeat(MAX_PATH - 1),
        volume_capability: Some(cap),
        readonly: true,
        secrets: map.clone(),
        volume_context: map,
    };
    request.check_sizes().expect("legal");
    let size = request.encoded_len();
    assert!((50 << 10..70 << 10).contains(&size), "{size} bytes");
    assert!(size * 3 < MAX_REQUEST, "{size} bytes");
}
