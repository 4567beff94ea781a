//! Generates the kubelet plugin's gRPC servers and clients from the kubelet's published APIs, vendored in
//! `proto/` (provenance and license: `proto/README.md`): the DRA service `v1.DRAPlugin` and the plugin
//! registration service. `protox` compiles them in Rust, so building Tessera needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["dra/v1/api.proto", "pluginregistration/v1/api.proto"];
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
