//! Compiles our own `.proto` files (under `protos/`) with protox, a pure-Rust
//! protobuf compiler, so no `protoc` is needed anywhere, and hands the
//! descriptors to prost-build. The descriptor set is also written out so the
//! text-format config parser can walk the schema at run time.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir("protos")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .collect();
    files.sort();
    println!("cargo:rerun-if-changed=protos");
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, ["protos"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("descriptor_set.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    let mut cfg = prost_build::Config::new();
    cfg.btree_map(["."]);
    cfg.compile_fds(fds)?;
    Ok(())
}
