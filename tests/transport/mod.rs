//! What every mode speaks on: the Unix socket layer, gRPC to any `:authority` on the exact
//! method paths, and the HTTP health ports under a flood.

mod grpc_any_authority;
mod http_flood;
mod proto_paths;
mod socket_layer;
