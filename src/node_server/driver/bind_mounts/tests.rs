//! The publish logic against a recording fake: decisions and calls, no root needed. The
//! directories are real (mount points are created), the mounts are not.

use super::*;
use crate::linux::mount::fake::RecordingMounter;

struct Setup {
    _tmp: tempfile::TempDir,
    vol: PathBuf,
    other_vol: PathBuf,
    staging: PathBuf,
    target: PathBuf,
    mounter: RecordingMounter,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let path = |name: &str| tmp.path().join(name);
    for dir in ["vol", "other", "staging"] {
        std::fs::create_dir(path(dir)).unwrap();
    }
    Setup {
        vol: path("vol"),
        other_vol: path("other"),
        staging: path("staging"),
        target: path("target"),
        mounter: RecordingMounter::with_root(),
        _tmp: tmp,
    }
}

fn rw() -> MountOptions {
    MountOptions::default()
}

fn ro() -> MountOptions {
    MountOptions {
        readonly: true,
        ..MountOptions::default()
    }
}

impl Setup {
    fn publication(&self, options: MountOptions) -> Publication<'_> {
        Publication {
            dir: &self.vol,
            staging: Some(&self.staging),
            target: &self.target,
            options,
            exclusive: false,
        }
    }

    fn binds(&self) -> usize {
        self.mounter
            .calls()
            .iter()
            .filter(|c| c.starts_with("bind"))
            .count()
    }
}

#[test]
fn staging_twice_binds_once() {
    let s = setup();
    assert!(bind_staging(&s.mounter, &s.vol, &s.staging, rw()).unwrap());
    assert!(!bind_staging(&s.mounter, &s.vol, &s.staging, rw()).unwrap());
    assert_eq!(s.binds(), 1);
}

#[test]
fn staging_over_another_volume_is_already_exists() {
    let s = setup();
    bind_staging(&s.mounter, &s.other_vol, &s.staging, rw()).unwrap();
    let err = bind_staging(&s.mounter, &s.vol, &s.staging, rw()).unwrap_err();
    assert!(matches!(err, BindError::OtherMount { .. }), "{err}");
}

#[test]
fn publishing_before_staging_is_a_failed_precondition_and_mounts_nothing() {
    let s = setup();
    let err = bind_target(&s.mounter, &s.publication(rw())).unwrap_err();
    assert!(matches!(err, BindError::NotStaged { .. }), "{err}");
    assert_eq!(s.binds(), 0);
}

#[test]
fn publishing_again_with_the_same_arguments_is_a_no_op() {
    let s = setup();
    bind_staging(&s.mounter, &s.vol, &s.staging, rw()).unwrap();
    let first = bind_target(&s.mounter, &s.publication(ro())).unwrap();
    assert_eq!(first, Published::Mounted { created: true });
    let again = bind_target(&s.mounter, &s.publication(ro())).unwrap();
    assert_eq!(again, Published::Already);
    assert_eq!(s.binds(), 2);
    assert!(s.target.is_dir(), "publish creates the target directory");
}

#[test]
fn publishing_again_read_write_over_a_read_only_publish_is_already_exists() {
    let s = setup();
    bind_staging(&s.mounter, &s.vol, &s.staging, rw()).unwrap();
    bind_target(&s.mounter, &s.publication(ro())).unwrap();
    let err = bind_target(&s.mounter, &s.publication(rw())).unwrap_err();
    assert!(matches!(err, BindError::OtherOptions { .. }), "{err}");
}

#[test]
fn a_single_writer_volume_is_not_published_at_a_second_target() {
    let s = setup();
    bind_staging(&s.mounter, &s.vol, &s.staging, rw()).unwrap();
    bind_target(&s.mounter, &s.publication(rw())).unwrap();
    let second = s.target.with_file_name("second");
    let exclusive = Publication {
        target: &second,
        exclusive: true,
        ..s.publication(rw())
    };
    let err = bind_target(&s.mounter, &exclusive).unwrap_err();
    assert!(matches!(err, BindError::PublishedElsewhere { .. }), "{err}");
    let shared = Publication {
        target: &second,
        ..s.publication(rw())
    };
    let published = bind_target(&s.mounter, &shared).unwrap();
    assert_eq!(published, Published::Mounted { created: true });
}

#[test]
fn unmounting_leaves_a_foreign_mount_alone() {
    let s = setup();
    bind_staging(&s.mounter, &s.other_vol, &s.staging, rw()).unwrap();
    let err = unmount_volume(&s.mounter, Field::StagingTargetPath, &s.staging, &s.vol).unwrap_err();
    assert!(matches!(err, BindError::ForeignMount { .. }), "{err}");
    assert!(!s.mounter.calls().iter().any(|c| c.starts_with("unmount")));
}

#[test]
fn unmounting_removes_every_stacked_mount_of_the_volume() {
    let s = setup();
    s.mounter.bind(&s.vol, &s.staging, rw()).unwrap();
    s.mounter.bind(&s.vol, &s.staging, rw()).unwrap();
    assert!(unmount_volume(&s.mounter, Field::StagingTargetPath, &s.staging, &s.vol).unwrap());
    assert!(!unmount_volume(&s.mounter, Field::StagingTargetPath, &s.staging, &s.vol).unwrap());
    let table = s.mounter.mount_table().unwrap();
    assert!(table.mounted_at(&s.staging).is_none());
}

#[test]
fn a_directory_mounted_from_or_on_is_in_use() {
    let s = setup();
    let table = s.mounter.mount_table().unwrap();
    assert_eq!(table.first_user(&s.vol).unwrap(), None);
    bind_staging(&s.mounter, &s.vol, &s.staging, rw()).unwrap();
    let table = s.mounter.mount_table().unwrap();
    assert_eq!(table.first_user(&s.vol).unwrap(), Some(s.staging.clone()));
    assert_eq!(table.first_user(&s.other_vol).unwrap(), None);
    s.mounter
        .bind(&s.other_vol, &s.vol.join("sub"), rw())
        .unwrap();
    let table = s.mounter.mount_table().unwrap();
    assert_eq!(table.first_user(&s.vol).unwrap(), Some(s.staging.clone()));
}

#[test]
fn a_symlink_as_the_last_component_is_refused_and_a_missing_parent_is_reported() {
    let s = setup();
    let link = s.vol.with_file_name("link");
    std::os::unix::fs::symlink(&s.other_vol, &link).unwrap();
    let err = resolve(Field::TargetPath, &link).unwrap_err();
    assert!(matches!(err, BindError::Symlink { .. }), "{err}");
    assert_eq!(
        resolve(Field::TargetPath, &s.vol.join("no/such")).unwrap(),
        None
    );
    let through = link.join("child");
    assert_eq!(
        resolve(Field::TargetPath, &through).unwrap(),
        Some(s.other_vol.canonicalize().unwrap().join("child")),
        "symlinks in the parent are followed, as the kernel will"
    );
}

#[test]
fn removing_a_mount_point_keeps_anything_written_into_it() {
    let s = setup();
    std::fs::write(s.staging.join("file"), b"x").unwrap();
    remove_mount_point(&s.staging).unwrap();
    assert!(s.staging.join("file").exists());
    remove_mount_point(&s.vol).unwrap();
    assert!(!s.vol.exists());
    remove_mount_point(&s.vol).unwrap();
}
