//! Compiles `proto/` with protox (a pure-Rust protobuf compiler) so that no system `protoc` is
//! needed, then generates prost messages and tonic clients and servers from the descriptors.

const PROTOS: &[&str] = &["csi/v1/csi.proto", "pluginregistration/v1/api.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
