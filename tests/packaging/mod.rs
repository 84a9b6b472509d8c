//! What ships: the container image, the Kubernetes manifests (as shipped and rendered for
//! another image and kubelet root), the dependency policy, and the `demo` mode the README runs
//! first.

mod demo;
mod dependency_policy;
mod image;
mod manifests;
mod rendered_manifests;
mod supply_chain;
