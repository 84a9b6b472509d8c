//! The fault suite: what real nodes do to the three modes, tried again and again on real
//! processes, sockets and mounts. Each case prints one line,
//! `fault <case>: tried N, survived N, lost N`, and fails unless every try survived and
//! nothing was lost. "Survived": the process kept (or came back to) serving and answered what
//! the spec or upstream answers. "Lost": data in a volume, a file that was not ours, or a
//! registration that never came back. `cargo test --test integration fault_suite -- \
//! --include-ignored --nocapture` prints the table docs/testing.md shows.

mod access_modes;
mod clients;
mod copies;
mod deep_trees;
mod deletes;
mod doctor;
mod flags;
mod full_disk;
mod image_volumes;
mod own_paths;
mod path_swaps;
mod private_state;
mod processes;
mod registrar_surge;
mod registration;
mod restarts;
mod snapshot_requests;
mod socket_paths;
mod state_dir_owners;
mod tally;
mod volumes;
