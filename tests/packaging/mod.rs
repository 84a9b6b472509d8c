//! What ships: the container image, the Kubernetes manifests, and the `demo` mode the
//! README runs first.

mod demo;
mod image;
mod manifests;
mod supply_chain;
