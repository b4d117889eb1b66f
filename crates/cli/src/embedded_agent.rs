//! The agent library carried inside the `trapline` binary (the
//! `embed-agent` feature, on by default; `build.rs` builds it), written out
//! on first use: `cargo install` gives one file that needs no checkout.
//!
//! `LD_PRELOAD` needs a file, so the bytes go to
//! `$XDG_CACHE_HOME/trapline/agent-VERSION-CRC/` (else `~/.cache/...`,
//! else `/tmp/trapline-UID/...`), named by a checksum of the bytes so that
//! two builds never share a file. A file found there is used only when its
//! bytes equal the embedded ones; otherwise a whole new copy is written
//! beside it and renamed over it, so a reader never sees half a library.
//! The file is readable by everyone: a traced program that changes its
//! user and runs another program must still be able to load it.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// File name of the agent library.
pub const AGENT_FILE: &str = "libtrapline_agent.so";

#[cfg(feature = "embed-agent")]
static AGENT: Option<&[u8]> = Some(include_bytes!(env!("TRAPLINE_EMBEDDED_AGENT")));
#[cfg(not(feature = "embed-agent"))]
static AGENT: Option<&[u8]> = None;

/// The embedded agent's file, written out when missing or different; None
/// when this binary embeds no agent.
pub fn path() -> Option<Result<PathBuf, String>> {
    AGENT.map(write_out)
}

fn write_out(bytes: &[u8]) -> Result<PathBuf, String> {
    let dir = cache_dir()?.join(format!(
        "agent-{}-{:08x}",
        env!("CARGO_PKG_VERSION"),
        crc32fast::hash(bytes)
    ));
    let file = dir.join(AGENT_FILE);
    if fs::read(&file).is_ok_and(|found| found == bytes) {
        return Ok(file);
    }
    let fail = |what: &str, path: &Path, e: std::io::Error| {
        format!(
            "cannot write the embedded agent: {what} {}: {e} (set XDG_CACHE_HOME to a writable directory, or TRAPLINE_AGENT to the library)",
            path.display()
        )
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&dir)
        .map_err(|e| fail("cannot create", &dir, e))?;
    let partial = dir.join(format!(".{AGENT_FILE}.{}", std::process::id()));
    let written = fs::File::create(&partial).and_then(|mut f| {
        f.write_all(bytes)?;
        f.set_permissions(fs::Permissions::from_mode(0o755))?;
        f.sync_all()
    });
    if let Err(e) = written.and_then(|()| fs::rename(&partial, &file)) {
        let _ = fs::remove_file(&partial);
        return Err(fail("cannot write", &file, e));
    }
    Ok(file)
}

/// The user's cache directory for trapline. In the shared `/tmp`, only a
/// directory this user owns and nobody else can write to is used: another
/// user could otherwise put a library of theirs in the agent's place.
fn cache_dir() -> Result<PathBuf, String> {
    let absolute = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    if let Some(cache) = std::env::var_os("XDG_CACHE_HOME").and_then(absolute) {
        return Ok(cache.join("trapline"));
    }
    if let Some(home) = std::env::var_os("HOME").and_then(absolute) {
        return Ok(home.join(".cache/trapline"));
    }
    let uid = nix::unistd::getuid().as_raw();
    let dir = PathBuf::from(format!("/tmp/trapline-{uid}"));
    match fs::DirBuilder::new().mode(0o755).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    let meta = fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is not a directory of this user's that only it can write to: the embedded agent is not written there (set XDG_CACHE_HOME or TRAPLINE_AGENT)",
            dir.display()
        ));
    }
    Ok(dir)
}
