//! The agent carried inside the `trapline` binary: a binary alone in a
//! directory, with no agent beside it and no TRAPLINE_AGENT (what
//! `cargo install` leaves), writes its agent out on first use and records.

mod common;

use common::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A copy of the trapline binary alone in DIR/bin.
fn lone_binary(dir: &TestDir) -> PathBuf {
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let lone = bin.join("trapline");
    if std::fs::hard_link(trapline(), &lone).is_err() {
        std::fs::copy(trapline(), &lone).unwrap();
    }
    lone
}

/// `trapline run` of PROGRAM by `binary`, with the cache in `cache`.
fn run_alone(dir: &TestDir, binary: &Path, cache: &Path, program: &Path) -> Finished {
    let mut cmd = Command::new(binary);
    cmd.arg("run")
        .arg("-o")
        .arg(dir.trace())
        .arg("--force")
        .arg("--")
        .arg(program)
        .current_dir(dir.path())
        .env_remove("TRAPLINE_AGENT")
        .env("XDG_CACHE_HOME", cache);
    output_of(cmd, "trapline run")
}

/// The one agent file under the cache.
fn cached_agent(cache: &Path) -> PathBuf {
    let dir = cache.join("trapline");
    let versions: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(versions.len(), 1, "{versions:?}");
    let name = versions[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(name.starts_with("agent-0."), "{name}");
    versions[0].join("libtrapline_agent.so")
}

#[test]
fn a_lone_binary_writes_its_agent_out_and_records() {
    let dir = TestDir::new("embedded_agent");
    let binary = lone_binary(&dir);
    let cache = dir.path().join("cache");
    let prog = compile_c(&dir, "leaks.c");

    let first = run_alone(&dir, &binary, &cache, &prog);
    assert_eq!(first.code(), 0, "{}", first.describe());
    let stats = analysis_json("stats", &dir.trace());
    assert_eq!(stats["live_at_end"], json!({"bytes": 1032, "blocks": 9}));
    let agent = cached_agent(&cache);
    let written = std::fs::read(&agent).unwrap();
    assert_eq!(&written[..4], b"\x7fELF");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&agent).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);

    // A damaged copy is replaced by a whole one, and the run records.
    std::fs::write(&agent, b"not a library").unwrap();
    let again = run_alone(&dir, &binary, &cache, &prog);
    assert_eq!(again.code(), 0, "{}", again.describe());
    assert_eq!(std::fs::read(cached_agent(&cache)).unwrap(), written);
    let stats = analysis_json("stats", &dir.trace());
    assert_eq!(stats["live_at_end"], json!({"bytes": 1032, "blocks": 9}));
    // Nothing half-written is left beside it.
    let left: Vec<String> = std::fs::read_dir(agent.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["libtrapline_agent.so"]);
}

/// A cache that cannot be written: a clear error, the program not run.
#[test]
fn an_unwritable_cache_is_a_clear_error() {
    let dir = TestDir::new("embedded_agent_unwritable");
    let binary = lone_binary(&dir);
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"").unwrap();
    let marker = dir.path().join("ran");
    let finished = {
        let mut cmd = Command::new(&binary);
        cmd.args(["run", "-o"])
            .arg(dir.trace())
            .args(["--", "touch"])
            .arg(&marker)
            .env_remove("TRAPLINE_AGENT")
            .env("XDG_CACHE_HOME", blocker.join("cache"));
        output_of(cmd, "trapline run")
    };
    assert_eq!(finished.code(), 125, "{}", finished.describe());
    assert!(
        finished
            .stderr
            .starts_with("trapline run: cannot write the embedded agent: cannot create "),
        "{}",
        finished.stderr
    );
    assert!(
        finished.stderr.contains("set XDG_CACHE_HOME"),
        "{}",
        finished.stderr
    );
    assert!(!marker.exists());
}
