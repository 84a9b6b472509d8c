//! The shipped binary looks names up itself (`src/names`): glibc's `getaddrinfo` and its NSS
//! machinery, which `dlopen` the host's `libnss_*.so` plugins, are not linked in.

use super::image::{first_build, unpack};

#[ignore = "needs root and buildah: builds the image (see image.rs)"]
#[test]
fn the_shipped_binary_links_no_getaddrinfo_and_names_no_nss_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let (_, rootfs) = unpack(&first_build().archive, dir.path());
    let binary = std::fs::read(rootfs.join("csi-nodekit")).unwrap();
    // glibc's NSS code names its configuration file and its plugins' file names; getaddrinfo
    // names itself in its assertions. None of them may be in the binary.
    for needle in ["/etc/nsswitch.conf", "libnss_", "getaddrinfo"] {
        let found = binary
            .windows(needle.len())
            .any(|window| window == needle.as_bytes());
        assert!(!found, "the shipped binary contains {needle:?}");
    }
    // The search itself works: the path our own resolver reads is there.
    let ours = b"/etc/resolv.conf";
    assert!(
        binary.windows(ours.len()).any(|w| w == ours),
        "no {ours:?} found"
    );
}
