//! The Controller service's snapshot calls: CreateSnapshot, DeleteSnapshot, ListSnapshots and
//! GetSnapshot (validate → act → respond), and [`status`], the table that gives every snapshot
//! failure its gRPC code (the GroupController's calls use it too).

use std::sync::Arc;

use tonic::{Code, Response, Status};

use crate::node_server::driver::Driver;
use crate::node_server::driver::SnapshotError;
use crate::node_server::grpc::field_limits::SizeLimits;
use crate::node_server::grpc::validate::{self, decode_token, encode_token};
use crate::node_server::state::snapshots::{Filter, Snapshot, Time};
use crate::node_server::state::volumes::VolumeError as V;
use crate::proto::csi::{
    self, CreateSnapshotRequest, CreateSnapshotResponse, DeleteSnapshotRequest,
    DeleteSnapshotResponse, GetSnapshotRequest, GetSnapshotResponse, ListSnapshotsRequest,
    ListSnapshotsResponse, list_snapshots_response,
};

/// The gRPC code of every failure of a snapshot call, as the CSI spec's tables for
/// CreateSnapshot, DeleteSnapshot, GetSnapshot and the group snapshot calls name them.
pub fn status(error: SnapshotError) -> Status {
    use SnapshotError as E;
    let code = match &error {
        // An unknown source volume (the spec has no row; NOT_FOUND is every CO's reading).
        E::Volume(V::NotFound { .. }) | E::NotFound { .. } | E::GroupNotFound { .. } => {
            Code::NotFound
        }
        // "Snapshot already exists but is incompatible".
        E::NameTaken { .. } | E::GroupNameTaken { .. } => Code::AlreadyExists,
        // "Snapshot is part of a group"; a `snapshot_ids` mismatch.
        E::InGroup { .. } | E::MembersDiffer { .. } | E::SnapshotIdsRequired { .. } => {
            Code::InvalidArgument
        }
        // An inline volume: in use by its pod alone.
        E::Volume(V::Ephemeral { .. }) => Code::FailedPrecondition,
        // The source's filesystem frozen by someone else (`fsfreeze`).
        E::Volume(V::Freeze { source, .. }) if source.raw_os_error() == Some(libc::EBUSY) => {
            Code::FailedPrecondition
        }
        // "Operation pending for snapshot" (or for its source).
        E::Volume(V::Busy(_)) | E::SourceBusy(_) => Code::Aborted,
        // "Not enough space to create snapshot": `--capacity`, or the filesystem, is full.
        E::Volume(V::NoSpace { .. } | V::NoInodes { .. }) => Code::ResourceExhausted,
        E::Copy { source, .. } if source.is_out_of_space() => Code::ResourceExhausted,
        E::Volume(
            V::NoRoomToGrow { .. }
            | V::InUse { .. }
            | V::Unlocatable(_)
            | V::Io(_)
            | V::Undeletable { .. }
            | V::Quota(_)
            | V::LimitKept { .. }
            | V::SizeWouldNotHold { .. }
            | V::Freeze { .. },
        )
        | E::Copy { .. }
        | E::Remove(_)
        | E::Flush(_)
        | E::Io(_)
        | E::Worker(_) => Code::Internal,
    };
    Status::new(code, error.to_string())
}

pub fn timestamp((seconds, nanos): Time) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds,
        nanos: i32::try_from(nanos).unwrap_or(0),
    }
}

/// A snapshot as the CO sees it: ready, since only complete snapshots have records.
pub fn message(snapshot: &Snapshot) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: i64::try_from(snapshot.size).unwrap_or(i64::MAX),
        snapshot_id: snapshot.id.clone(),
        source_volume_id: snapshot.source_volume.clone(),
        creation_time: Some(timestamp(snapshot.created)),
        ready_to_use: true,
        group_snapshot_id: snapshot.group.clone().unwrap_or_default(),
    }
}

pub async fn create(
    driver: &Arc<Driver>,
    req: CreateSnapshotRequest,
) -> Result<Response<CreateSnapshotResponse>, Status> {
    req.check_sizes()?;
    // The name first: csi-sanity sends an unknown source with no name.
    let name = validate::named("name", &req.name)?.to_owned();
    let source = validate::volume_id_of("source_volume_id", &req.source_volume_id)?.to_owned();
    log::trace!("CreateSnapshot name={name} source={source}");
    // Names may contain anything; the prefix keeps their keys apart from IDs and volume names.
    let key = format!("snapshot-name/{name}");
    let work = move |d: &Driver| d.create_snapshot(&name, &source);
    let snapshot = driver.claimed(&key, work).await.map_err(status)?;
    Ok(Response::new(CreateSnapshotResponse {
        snapshot: Some(message(&snapshot)),
    }))
}

pub async fn delete(
    driver: &Arc<Driver>,
    req: DeleteSnapshotRequest,
) -> Result<Response<DeleteSnapshotResponse>, Status> {
    req.check_sizes()?;
    let id = validate::snapshot_id("snapshot_id", &req.snapshot_id)?.to_owned();
    log::trace!("DeleteSnapshot snapshot={id}");
    let key = format!("snapshot/{id}");
    let work = move |d: &Driver| d.delete_snapshot(&id);
    driver.claimed(&key, work).await.map_err(status)?;
    Ok(Response::new(DeleteSnapshotResponse {}))
}

pub async fn list(
    driver: &Arc<Driver>,
    req: ListSnapshotsRequest,
) -> Result<Response<ListSnapshotsResponse>, Status> {
    req.check_sizes()?;
    let max = usize::try_from(req.max_entries)
        .map_err(|_| Status::invalid_argument("max_entries may not be negative"))?;
    let start = decode_token(&req.starting_token, validate::issued_snapshot_id)?;
    // Filters are looked up, never used as paths: a well-formed unknown one lists nothing.
    if !req.snapshot_id.is_empty() {
        validate::snapshot_id("snapshot_id", &req.snapshot_id)?;
    }
    if !req.source_volume_id.is_empty() {
        validate::volume_id_of("source_volume_id", &req.source_volume_id)?;
    }
    log::trace!("ListSnapshots max_entries={max}");
    fn given(s: &str) -> Option<&str> {
        (!s.is_empty()).then_some(s)
    }
    let filter = Filter {
        snapshot: given(&req.snapshot_id),
        source_volume: given(&req.source_volume_id),
    };
    let (page, next) = driver.snapshot_page(filter, start.as_deref(), max);
    Ok(Response::new(ListSnapshotsResponse {
        entries: (page.iter())
            .map(|snapshot| list_snapshots_response::Entry {
                snapshot: Some(message(snapshot)),
            })
            .collect(),
        next_token: next.as_deref().map(encode_token).unwrap_or_default(),
    }))
}

pub async fn get(
    driver: &Arc<Driver>,
    req: GetSnapshotRequest,
) -> Result<Response<GetSnapshotResponse>, Status> {
    req.check_sizes()?;
    let id = validate::snapshot_id("snapshot_id", &req.snapshot_id)?;
    log::trace!("GetSnapshot snapshot={id}");
    let snapshot = driver.known_snapshot(id).map_err(status)?;
    Ok(Response::new(GetSnapshotResponse {
        snapshot: Some(message(&snapshot)),
    }))
}
