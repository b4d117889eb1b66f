//! 1. Links `csrc/inherited_sigpipe.c` into the `trapline` binary: a C
//!    constructor that notes how SIGPIPE was inherited before Rust's
//!    runtime changes it (the file says why). Linked as an object of its
//!    own, since nothing refers to it and a static library's unreferenced
//!    object would be left out.
//! 2. With the `embed-agent` feature (on by default), builds the agent
//!    library from `crates/agent` in release mode, by a cargo of its own in
//!    a target directory of its own, and hands its path to the binary,
//!    which embeds it (`src/embedded_agent.rs`): `cargo install` then gives
//!    a `trapline` that needs no checkout and no file beside it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let source = "csrc/inherited_sigpipe.c";
    println!("cargo:rerun-if-changed={source}");
    let objects = cc::Build::new()
        .file(source)
        .warnings(true)
        .cargo_metadata(false)
        .compile_intermediates();
    for object in objects {
        println!("cargo:rustc-link-arg-bins={}", object.display());
    }
    if std::env::var_os("CARGO_FEATURE_EMBED_AGENT").is_some() {
        embed_agent();
    }
}

fn embed_agent() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest_dir.join("../..");
    let agent = workspace.join("crates/agent");
    if !agent.join("Cargo.toml").is_file() {
        panic!(
            "the embed-agent feature builds the agent from {}, which is missing: build without \
             default features and install libtrapline_agent.so beside the binary",
            agent.display()
        );
    }
    // Every crate the agent is built from.
    for dir in [
        "crates/agent",
        "crates/contract",
        "crates/trace",
        "crates/memlimits",
    ] {
        println!("cargo:rerun-if-changed={}", workspace.join(dir).display());
    }
    for file in ["Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", workspace.join(file).display());
    }
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
    // Beside the outer build's profile directories (OUT_DIR is
    // <target>/<profile>/build/<unit>/out), so that check, clippy, test and
    // build share one agent build and a rebuild costs only what changed.
    let target = out_dir
        .ancestors()
        .nth(4)
        .map(|t| t.join("embedded-agent"))
        .unwrap_or_else(|| out_dir.join("embedded-agent"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "--release", "--quiet", "-p", "trapline-agent"])
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target);
    // The outer build's settings are not the agent's: its target, flags,
    // wrappers (clippy's) and jobserver stay out.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let outer = (key.starts_with("CARGO_") && key != "CARGO_HOME")
            || key.starts_with("RUSTC")
            || key.starts_with("RUSTFLAGS")
            || key.starts_with("RUSTDOC")
            || key == "TARGET"
            || key == "HOST"
            || key == "OUT_DIR"
            || key == "PROFILE"
            || key == "OPT_LEVEL"
            || key == "DEBUG"
            || key == "NUM_JOBS"
            || key.starts_with("__CARGO");
        if outer {
            build.env_remove(key.as_ref());
        }
    }
    let status = build
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build the agent: {e}"));
    if !status.success() {
        panic!("building the agent to embed failed ({status})");
    }
    let library = target.join("release/libtrapline_agent.so");
    assert!(
        library.is_file(),
        "the agent build left no {}",
        library.display()
    );
    // A copy of its own: the next agent build must not change the bytes
    // this binary was compiled with.
    let embedded = out_dir.join("libtrapline_agent.so");
    copy(&library, &embedded);
    println!(
        "cargo:rustc-env=TRAPLINE_EMBEDDED_AGENT={}",
        embedded.display()
    );
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("cannot copy {} to {}: {e}", from.display(), to.display()));
}
