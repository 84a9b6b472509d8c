//! The name of a driver's registration socket in the kubelet's plugin registry
//! (`/var/lib/kubelet/plugins_registry/`): `<driver>-reg.sock`, node-driver-registrar's
//! convention, which the registrar creates, the demo shows and the doctor reads back. The
//! kubelet itself takes any socket name; the driver's name comes from GetInfo.

use std::path::{Path, PathBuf};

/// What a registration socket's file name ends with.
pub const SOCKET_SUFFIX: &str = "-reg.sock";

/// The registration socket of `driver` in the registry `dir`.
pub fn socket_path(dir: &Path, driver: &str) -> PathBuf {
    dir.join(format!("{driver}{SOCKET_SUFFIX}"))
}

/// The driver a registration socket's file name is named after, if it is named like one.
pub fn driver_of(file_name: &str) -> Option<&str> {
    file_name.strip_suffix(SOCKET_SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drivers_socket_name_gives_the_driver_back() {
        let path = socket_path(Path::new("/reg"), "hostpath.csi.k8s.io");
        assert_eq!(path, Path::new("/reg/hostpath.csi.k8s.io-reg.sock"));
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_eq!(driver_of(name), Some("hostpath.csi.k8s.io"));
        assert_eq!(driver_of("csi.sock"), None);
    }
}
