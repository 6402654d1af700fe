//! Compiles every `.proto` under `proto/` with protox (pure Rust, no `protoc` needed) and
//! generates tonic clients and servers for all of them.

use std::path::{Path, PathBuf};

fn protos(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            protos(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    protos(&root, &mut files)?;
    files.sort();
    if files.is_empty() {
        return Ok(());
    }
    let descriptors = protox::compile(&files, [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Device-plugin maps (envs, annotations) encode in key order, so a checkpointed
        // allocation response is byte-for-byte stable, as the kubelet's gogo encoding is.
        .btree_map(".v1beta1")
        .compile_fds(descriptors)?;
    Ok(())
}
