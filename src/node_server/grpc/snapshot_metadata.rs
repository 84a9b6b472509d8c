//! The CSI SnapshotMetadata service: the block maps of raw block snapshots, streamed
//! (`block_maps` computes them). The request is checked and the snapshots held and opened
//! before the stream starts, so every error the spec names (INVALID_ARGUMENT, NOT_FOUND,
//! OUT_OF_RANGE) is the call's status; the map is then computed on a blocking thread that hands
//! batches to the stream as the client reads them, and stops once the client is gone — or has
//! read nothing for [`STALLED`], so a client that never reads cannot keep a snapshot from
//! being deleted.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::node_server::block_maps::{self, Batcher, Shape, Sink};
use crate::node_server::driver::{Driver, MapSource, MetadataError};
use crate::node_server::grpc::controller_snapshots;
use crate::node_server::grpc::field_limits::SizeLimits;
use crate::node_server::grpc::validate;
use crate::proto::csi::snapshot_metadata_server::SnapshotMetadata;
use crate::proto::csi::{
    BlockMetadata, BlockMetadataType, GetMetadataAllocatedRequest, GetMetadataAllocatedResponse,
    GetMetadataDeltaRequest, GetMetadataDeltaResponse,
};

pub struct SnapshotMetadataService(pub(in crate::node_server) Arc<Driver>);

/// Entries per message when the client sets no `max_results`, and the most we send in one
/// whatever it asks (16,384 entries encode to about 400 KiB, under every client's 4 MiB).
const DEFAULT_RESULTS: usize = 1024;
const MOST_RESULTS: usize = 16384;
/// How long a message may wait for the client to read it before the stream is given up.
const STALLED: Duration = Duration::from_secs(60);

/// The gRPC code of each failure; the snapshots' own (NOT_FOUND, ABORTED while one is being
/// deleted) as the Controller gives them.
fn status(error: MetadataError) -> Status {
    use tonic::Code;
    let error = match error {
        MetadataError::Snapshot(e) => return controller_snapshots::status(e),
        other => other,
    };
    let code = match &error {
        // "Missing or otherwise invalid argument".
        MetadataError::NotBlock { .. } | MetadataError::OtherVolumes { .. } => {
            Code::InvalidArgument
        }
        // "Invalid starting_offset: the starting offset exceeds the volume size".
        MetadataError::PastEnd { .. } => Code::OutOfRange,
        MetadataError::Snapshot(_) | MetadataError::Io(_) | MetadataError::Worker(_) => {
            Code::Internal
        }
    };
    Status::new(code, error.to_string())
}

/// `starting_offset` and `max_results`: neither negative; the batch size bounded.
fn paging(starting_offset: i64, max_results: i32) -> Result<(u64, usize), Status> {
    let start = u64::try_from(starting_offset).map_err(|_| {
        Status::invalid_argument(format!(
            "starting_offset may not be negative ({starting_offset})"
        ))
    })?;
    let max = usize::try_from(max_results).map_err(|_| {
        Status::invalid_argument(format!("max_results may not be negative ({max_results})"))
    })?;
    let max = if max == 0 { DEFAULT_RESULTS } else { max };
    Ok((start, max.min(MOST_RESULTS)))
}

/// One message's entries, or the error that ends the stream.
type Batch = Result<Vec<BlockMetadata>, Status>;
/// A call's stream of response messages.
type Messages<M> = Pin<Box<dyn Stream<Item = Result<M, Status>> + Send>>;

/// Sends batches into the stream, waiting for the client's reads up to [`STALLED`].
struct Channel {
    sender: mpsc::Sender<Batch>,
    runtime: tokio::runtime::Handle,
}

impl Sink for Channel {
    fn send(&mut self, batch: Vec<(u64, u64)>) -> bool {
        let entries = (batch.into_iter())
            .map(|(offset, size)| BlockMetadata {
                byte_offset: to_i64(offset),
                size_bytes: to_i64(size),
            })
            .collect();
        let sent = self
            .runtime
            .block_on(tokio::time::timeout(STALLED, self.sender.send(Ok(entries))));
        matches!(sent, Ok(Ok(())))
    }

    fn closed(&self) -> bool {
        self.sender.is_closed()
    }
}

/// The snapshots a call maps: one (allocated), or a base and a target (delta).
enum Snapshots {
    One(String),
    Pair(String, String),
}

/// Starts the stream of the map of `source` from `from` (aligned already) on a blocking thread
/// (the snapshots stay held until it returns); each batch becomes a message by `message`.
fn stream<M: Send + 'static>(
    shape: Shape,
    max: usize,
    (source, from): (MapSource, u64),
    message: fn(i32, i64, Vec<BlockMetadata>) -> M,
) -> Messages<M> {
    let (kind, capacity) = (metadata_type(shape), to_i64(source.capacity));
    let (sender, receiver) = mpsc::channel(2);
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        write_map(shape, max, source, from, Channel { sender, runtime })
    });
    Box::pin(
        ReceiverStream::new(receiver).map(move |batch| batch.map(|b| message(kind, capacity, b))),
    )
}

/// The blocking half of [`stream`]: the map written into the channel, an I/O error sent after
/// what was sent already.
fn write_map(shape: Shape, max: usize, source: MapSource, from: u64, mut channel: Channel) {
    let mut out = Batcher::new(shape, max, &mut channel);
    let result = match &source.base {
        None => block_maps::allocated(&source.target, from, source.capacity, &mut out),
        Some(base) => block_maps::delta(base, &source.target, from, source.capacity, &mut out),
    };
    let open = out.finish();
    drop(source);
    if let Err(e) = result
        && open
    {
        log::warn!("block map failed: {e}");
        let failed = Err(Status::internal(format!(
            "read the snapshot's extents or data: {e}"
        )));
        let sent = tokio::time::timeout(STALLED, channel.sender.send(failed));
        let _ = channel.runtime.block_on(sent);
    }
}

/// The shape's wire name.
fn metadata_type(shape: Shape) -> i32 {
    match shape {
        Shape::Extents => BlockMetadataType::VariableLength as i32,
        Shape::Blocks(_) => BlockMetadataType::FixedLength as i32,
    }
}

impl SnapshotMetadataService {
    /// What a call maps, its snapshots held, and where its map starts (`start` rounded down
    /// to the shape's alignment); one path for both calls.
    async fn open(
        &self,
        snapshots: Snapshots,
        start: u64,
    ) -> Result<(Shape, (MapSource, u64)), Status> {
        let shape = self.0.config().block_metadata;
        let work = move |d: &Driver| match &snapshots {
            Snapshots::One(id) => d.allocated_source(id, start),
            Snapshots::Pair(base, target) => d.delta_source(base, target, start),
        };
        let source = self.0.blocking(work).await.map_err(status)?;
        Ok((
            shape,
            (source, start / shape.alignment() * shape.alignment()),
        ))
    }
}

#[tonic::async_trait]
impl SnapshotMetadata for SnapshotMetadataService {
    type GetMetadataAllocatedStream = Messages<GetMetadataAllocatedResponse>;
    type GetMetadataDeltaStream = Messages<GetMetadataDeltaResponse>;

    async fn get_metadata_allocated(
        &self,
        request: Request<GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let req = request.into_inner();
        req.check_sizes()?;
        let id = validate::snapshot_id("snapshot_id", &req.snapshot_id)?.to_owned();
        let (start, max) = paging(req.starting_offset, req.max_results)?;
        log::trace!("GetMetadataAllocated snapshot={id} start={start} max={max}");
        let (shape, opened) = self.open(Snapshots::One(id), start).await?;
        let message = |block_metadata_type, volume_capacity_bytes, block_metadata| {
            GetMetadataAllocatedResponse {
                block_metadata_type,
                volume_capacity_bytes,
                block_metadata,
            }
        };
        Ok(Response::new(stream(shape, max, opened, message)))
    }

    async fn get_metadata_delta(
        &self,
        request: Request<GetMetadataDeltaRequest>,
    ) -> Result<Response<Self::GetMetadataDeltaStream>, Status> {
        let req = request.into_inner();
        req.check_sizes()?;
        let base = validate::snapshot_id("base_snapshot_id", &req.base_snapshot_id)?.to_owned();
        let target =
            validate::snapshot_id("target_snapshot_id", &req.target_snapshot_id)?.to_owned();
        let (start, max) = paging(req.starting_offset, req.max_results)?;
        log::trace!("GetMetadataDelta base={base} target={target} start={start} max={max}");
        let (shape, opened) = self.open(Snapshots::Pair(base, target), start).await?;
        let message =
            |block_metadata_type, volume_capacity_bytes, block_metadata| GetMetadataDeltaResponse {
                block_metadata_type,
                volume_capacity_bytes,
                block_metadata,
            };
        Ok(Response::new(stream(shape, max, opened, message)))
    }
}

fn to_i64(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}
