//! Compiles `proto/**/*.proto` with protox (pure Rust, no `protoc` binary) and feeds the
//! descriptor set to tonic's code generator; the same bytes (every file with its imports,
//! including the vendored `google.rpc` error details) are written out for reflection and for
//! gateways.

use std::{
    env, fs,
    path::{Path, PathBuf},
};

use prost::Message;

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let root = root.canonicalize()?;
    let mut files = Vec::new();
    collect(&root, &mut files)?;
    files.sort();
    println!("cargo:rerun-if-changed={}", root.display());
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }

    let fds = protox::compile(&files, [&root])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out.join("flashsale_descriptor.bin"), fds.encode_to_vec())?;

    // `proto/google/rpc/` is there for its descriptors only: the Rust types of those messages
    // are tonic-types' (what the services encode refusal details with), so no code is
    // generated for them and a contract message that ever uses one gets tonic-types' type.
    tonic_prost_build::configure()
        .extern_path(".google.rpc", "::tonic_types::pb")
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
