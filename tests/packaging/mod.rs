//! What ships: the container image and the malloc settings it gives every mode, the Kubernetes
//! manifests (as shipped and rendered for another image and kubelet root), the dependency
//! policy, and the `demo` mode the README runs first.

mod demo;
mod dependency_policy;
mod image;
mod malloc_settings;
mod manifests;
mod rendered_manifests;
mod supply_chain;
