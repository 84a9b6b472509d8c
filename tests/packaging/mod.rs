//! What ships: the container image and the size of its binary, its licence notices and SBOM, and the malloc settings it
//! gives every mode, the Kubernetes manifests (the kustomize base, its components and overlays,
//! the upstream sidecars held to their pinned releases, the changed-block backups component, the
//! examples' volume attributes), the dependency policy, and the `demo` mode the README runs
//! first.

mod binary_size;
mod demo;
mod dependency_policy;
mod image;
mod malloc_settings;
mod manifests;
mod name_lookups;
mod notices;
mod rendered_manifests;
mod snapshot_metadata;
mod supply_chain;
mod toolchain_pin;
mod topology_and_metrics;
mod upstream_sidecars;
mod volume_attributes;
