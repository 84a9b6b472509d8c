//! `node-server --resizer-only`: the endpoint a cluster-wide external-resizer talks to. Our
//! volumes live on their nodes and the resizer runs once per cluster (it has no per-node
//! mode), so it must never call ControllerExpandVolume on whichever node it happens to reach.
//! It picks its node-only "trivial resizer" — which records the size asked in the PV and
//! leaves the kubelet on the volume's node to call NodeExpandVolume, where node-server grows
//! the volume — when the driver has a Controller service that does not advertise
//! EXPAND_VOLUME and a Node service that does. This endpoint says exactly that and serves
//! nothing else: no state directory, no mounts, no privileges, so it runs beside the resizer
//! in an ordinary Deployment. The answers are node-server's own services over
//! [`Backend::ResizerOnly`] (one copy of tonic's servers in the binary, not two).
//! ControllerModifyVolume, which the same resizer calls for a changed VolumeAttributesClass,
//! is refused with INVALID_ARGUMENT (the resizer marks the PVC Infeasible and says why in an
//! event): it cannot reach the volume's node either.

use tonic::Status;

use super::grpc::{Backend, validate};
use super::settings::Args;
use crate::runtime::Threads;
use crate::{BoxError, UsageError, socket};

/// Serves the resizer's endpoint at `--endpoint` until SIGTERM or SIGINT.
pub fn main(args: Args) -> Result<(), BoxError> {
    crate::csi_spec::driver_name::validate(&args.driver_name)
        .map_err(|e| UsageError::new(format!("--driver-name: {e}")))?;
    // The one node flag a user could expect to work here: refused, not silently ignored.
    if args.http_endpoint.into_option().is_some() {
        return Err(UsageError::new(
            "--http-endpoint is not served with --resizer-only (it has no metrics of its own; \
             csi-resizer serves its own)",
        )
        .into());
    }
    let endpoint = args.endpoint.into_path();
    let perms = socket::Permissions {
        mode: args.socket_mode.bits(),
        gid: args.socket_group.map(crate::cli::values::GroupId::get),
    };
    let name = args.driver_name;
    crate::runtime::serve(Threads::Current, |shutdown| async move {
        let (listener, _guard) = socket::bind_tokio(&endpoint, perms)?;
        log::info!(
            "serving CSI driver {name}'s resizer endpoint on {} (node-only expansion)",
            endpoint.display()
        );
        let backend = Backend::ResizerOnly { driver_name: name };
        super::server::serve_backend(listener, backend, shutdown).await
    })
}

/// ControllerModifyVolume of a changed VolumeAttributesClass: INVALID_ARGUMENT, which
/// csi-resizer's modify controller marks Infeasible (no retries until the class changes), its
/// message in the PVC's event.
pub(super) fn refuse_modify(driver_name: &str, volume_id: &str) -> Status {
    Status::invalid_argument(format!(
        "volume {:?} lives on its node, which this cluster-wide resizer cannot reach: \
         {driver_name} cannot change a bound volume's VolumeAttributesClass (set it back to \
         the current class); give a new class to a clone made on the same node, or call \
         ControllerModifyVolume on the node-server of the volume's node",
        validate::clip(volume_id)
    ))
}
