//! The layouts and refusals on hierarchies laid out in a temporary directory: the logic only.
//! Writing `io.max` for real needs a cgroup v2 kernel: the quota VM's (`booted/quota_vm/io_limits.rs`).

use super::*;

const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

fn hierarchy(controllers: &str, cgroups: &[&str]) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("cgroup.controllers"), controllers).unwrap();
    for cgroup in cgroups {
        let dir = root.path().join(cgroup);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("io.max"), "").unwrap();
    }
    root
}

#[test]
fn a_limit_line_names_every_key_and_lifts_the_unset_ones() {
    let limits = Limits {
        read_bytes: Some(1 << 20),
        write_iops: Some(100),
        ..Limits::default()
    };
    assert_eq!(
        limits.io_max_line((7, 3)),
        "7:3 rbps=1048576 wbps=max riops=max wiops=100"
    );
    assert_eq!(
        Limits::default().io_max_line((259, 0)),
        "259:0 rbps=max wbps=max riops=max wiops=max"
    );
}

#[test]
fn the_pod_is_found_under_both_drivers_layouts_in_every_qos_class() {
    let systemd_uid = UID.replace('-', "_");
    for cgroup in [
        format!("kubepods.slice/kubepods-pod{systemd_uid}.slice"),
        format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd_uid}.slice"
        ),
        format!(
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{systemd_uid}.slice"
        ),
        format!("kubepods/pod{UID}"),
        format!("kubepods/burstable/pod{UID}"),
        format!("kubepods/besteffort/pod{UID}"),
    ] {
        let root = hierarchy("cpu io memory", &[&cgroup]);
        let found = Hierarchy::at(root.path()).unwrap().pod(UID).unwrap();
        assert_eq!(found, root.path().join(&cgroup));
        let line = Limits::default().io_max_line((7, 1));
        Hierarchy::at(root.path()).unwrap().set(UID, &line).unwrap();
        assert_eq!(std::fs::read_to_string(found.join("io.max")).unwrap(), line);
    }
}

#[test]
fn a_v1_hierarchy_one_without_io_an_absent_pod_and_a_bad_uid_are_refused_naming_why() {
    let v1 = tempfile::tempdir().unwrap();
    let err = Hierarchy::at(v1.path()).unwrap_err();
    assert!(matches!(err, CgroupError::NotV2 { .. }), "{err}");
    assert!(err.to_string().contains("cgroup v2"), "{err}");

    let no_io = hierarchy("cpu memory pids", &[]);
    let err = Hierarchy::at(no_io.path()).unwrap_err();
    assert!(matches!(err, CgroupError::NoIoController { .. }), "{err}");

    let empty = hierarchy("io", &[]);
    let hierarchy_ = Hierarchy::at(empty.path()).unwrap();
    let err = hierarchy_.pod(UID).unwrap_err();
    assert!(matches!(err, CgroupError::PodNotFound { .. }), "{err}");
    for bad in [
        "../../etc",
        "",
        "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f",
        "g".repeat(36).as_str(),
    ] {
        let err = hierarchy_.pod(bad).unwrap_err();
        assert!(matches!(err, CgroupError::BadUid(_)), "{bad}: {err}");
    }
}

#[test]
fn a_pod_cgroup_without_the_io_controller_enabled_is_refused_naming_it() {
    let root = hierarchy("io", &[]);
    let cgroup = root.path().join(format!("kubepods/pod{UID}"));
    std::fs::create_dir_all(&cgroup).unwrap();
    let err = Hierarchy::at(root.path())
        .unwrap()
        .set(UID, "7:1 rbps=1")
        .unwrap_err();
    assert!(matches!(err, CgroupError::NotEnabled { .. }), "{err}");
    assert!(err.to_string().contains("+io"), "{err}");
}
