//! The quota tests that run inside the VM, each in its own process. Every generic case runs
//! on XFS and on ext4; a few are about one filesystem's particular behaviour.

use std::path::PathBuf;

use csi_nodekit::linux::quota::{FsKind, Limits, PROJECT_IDS, QuotaFs};

use super::copies::*;
use super::enforce::*;
use super::escapes::*;
use super::fixtures::{Prep, TestFs};
use super::grown::*;
use super::io_limits::*;
use super::leftovers::*;
use super::lifecycle::*;
use super::modify::*;
use super::persistent::*;
use super::reserve::*;
use super::through_grpc::*;

pub const MIB: u64 = 1 << 20;
/// The capability number of CAP_SYS_RESOURCE (linux/capability.h).
pub const CAP_SYS_RESOURCE: u32 = 24;
pub const FIRST: u32 = *PROJECT_IDS.start();

type Case = fn(FsKind);

/// Lists cases by their function names, which are the sentences they test.
macro_rules! cases {
    ($($case:ident),* $(,)?) => {
        &[$((stringify!($case), $case as Case)),*]
    };
}

/// Cases that run on both filesystems.
const GENERIC: &[(&str, Case)] = cases![
    a_prepared_filesystem_is_detected_as_enforcing,
    new_files_and_directories_inherit_the_project,
    an_unprivileged_writer_stops_at_the_hard_limit,
    concurrent_writers_together_stop_at_the_hard_limit,
    raising_the_limit_lets_the_writer_continue,
    an_inode_limit_stops_file_creation,
    usage_and_inodes_match_the_blocks_of_the_tree,
    df_on_the_directory_shows_the_project_limit_not_the_filesystem,
    the_allocator_skips_ids_already_in_use_and_survives_a_restart,
    release_clears_the_limit_and_deletion_frees_the_id,
    the_device_path_fallback_sees_the_same_quota,
    a_root_writer_with_cap_sys_resource_behaves_as_documented,
    an_unprepared_filesystem_is_not_enforcing_and_on_refuses_it,
    measure_create_and_delete_cost_against_a_plain_directory,
    node_server_holds_a_published_volume_to_its_size_and_expansion_raises_it,
    node_server_finds_its_project_ids_after_a_restart_avoids_others_and_frees_them,
    an_ephemeral_inline_volume_with_a_size_is_held_to_it,
    node_server_on_an_unprepared_filesystem_refuses_quota_on_and_auto_says_why,
    node_server_holds_a_volume_to_its_inode_limit_and_modify_volume_changes_it_live,
    node_server_bounds_a_volumes_inodes_by_default_from_its_size,
    measure_create_and_delete_through_grpc_quotad_against_plain,
    restores_and_clones_get_a_project_of_their_own_and_are_held_to_their_size,
    root_without_cap_sys_resource_on_its_thread_stops_at_the_limit,
    restores_and_clones_hold_to_the_size_asked_for_and_a_full_source_fits_at_its_own,
    expanding_a_quotad_volume_under_quota_off_is_refused_and_applied_once_enforced,
    a_pods_file_moved_out_of_its_project_is_found_and_charged_back_within_a_minute,
    a_subdirectory_with_projinherit_cleared_is_found_and_its_files_charged_back,
    a_root_pod_without_capabilities_retagging_the_volume_root_is_set_back_and_charged,
    files_moved_into_a_neighbours_project_are_charged_back_to_their_own_volume,
    a_pod_in_a_user_namespace_cannot_change_a_project_id,
    measure_the_quota_check_walk_per_10000_files,
    a_pod_that_keeps_escaping_is_fenced_and_ends_within_twice_its_size,
    a_file_escaped_a_thousand_directories_down_is_found_and_charged_back,
    what_the_check_cannot_reach_makes_the_volume_abnormal_naming_it,
    a_flood_of_symlinks_and_fifos_in_an_escaped_directory_is_fenced_and_made_again_in_the_project,
    a_flood_hidden_by_moving_its_directory_back_is_found_by_each_entrys_own_project,
    a_large_volume_does_not_hold_back_a_neighbours_check,
    a_deleted_volume_still_charged_elsewhere_keeps_a_one_block_limit_and_a_plain_delete_releases,
    a_deletion_cut_short_ends_once_its_set_aside_data_is_removed,
    node_server_reserves_sizes_and_inodes_and_stats_never_claim_more_than_the_filesystem_has,
    an_image_volumes_ext4_grows_online_from_the_template_and_checks_clean,
    node_server_stages_an_image_volume_growing_its_ext4_to_the_size_it_holds,
    a_volumes_write_limit_holds_its_pod_changes_live_and_spares_the_neighbour,
];

/// Names only the cases containing one of its comma-separated words, for a developer's
/// run of a few; the run then says that it was filtered, and never passes as the whole suite.
pub const ONLY: &str = "QUOTA_VM_ONLY";

/// The filesystem a VM runs the cases of (`xfs` or `ext4`), set by the host for the guest.
pub const FS: &str = "CSI_NODEKIT_QUOTA_VM_FS";

/// Inside the VM: the names of the cases of the filesystem [`FS`] names.
pub fn names() -> Vec<String> {
    names_on(&std::env::var(FS).unwrap_or_default())
}

/// Every case's name on `fs` (`xfs::…` or `ext4::…`; only those [`ONLY`] names, when it is
/// set).
pub fn names_on(fs: &str) -> Vec<String> {
    let only = std::env::var(ONLY).unwrap_or_default();
    let words: Vec<&str> = only.split(',').filter(|w| !w.is_empty()).collect();
    let prefix = format!("{fs}::");
    all_names()
        .into_iter()
        .filter(|name| name.starts_with(&prefix))
        .filter(|name| words.is_empty() || words.iter().any(|w| name.contains(w)))
        .collect()
}

fn all_names() -> Vec<String> {
    ["xfs", "ext4"]
        .iter()
        .flat_map(|fs| GENERIC.iter().map(move |(name, _)| format!("{fs}::{name}")))
        .chain(
            ["ext4::without_the_project_feature_directories_cannot_get_a_project"]
                .map(str::to_owned),
        )
        .collect()
}

/// Runs one case by name (role `case:NAME`).
pub fn run_one(name: &str) {
    if name == "ext4::without_the_project_feature_directories_cannot_get_a_project" {
        return without_the_project_feature_directories_cannot_get_a_project();
    }
    let (fs, case) = name.split_once("::").expect("fs::case");
    let kind = match fs {
        "xfs" => FsKind::Xfs,
        "ext4" => FsKind::Ext4,
        other => panic!("unknown filesystem {other}"),
    };
    let (_, run) = GENERIC
        .iter()
        .find(|(n, _)| *n == case)
        .expect("known case");
    run(kind);
}

pub fn figure(kind: FsKind, text: std::fmt::Arguments<'_>) {
    println!("quota-vm-figure: {kind:?}: {text}");
}

/// A prepared filesystem with a directory `vol` in project FIRST under these limits.
pub fn prepared_volume(kind: FsKind, bytes: u64, inodes: u64) -> (TestFs, QuotaFs, PathBuf) {
    let fs = TestFs::new(kind, Prep::Prepared);
    let q = open(&fs);
    let vol = fs.dir("vol");
    q.assign(&vol, FIRST, Limits { bytes, inodes })
        .expect("assign");
    (fs, q, vol)
}

pub fn open(fs: &TestFs) -> QuotaFs {
    QuotaFs::open(&fs.mnt).expect("open quota fs")
}
