//! Compiles `proto/` with protox (a pure-Rust protobuf compiler) so that no system `protoc` is
//! needed, then generates prost messages and tonic clients and servers from the descriptors.
//! It also makes cargo link again when `packaging/text-order.txt` changes: the static build
//! hands that list to the linker, and cargo does not know a linker's input files.

const PROTOS: &[&str] = &["csi/v1/csi.proto", "pluginregistration/v1/api.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=packaging/text-order.txt");
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
