//! Where `trapline run` writes its traces, made safe before anything runs:
//! the output path must be a regular file that can hold a trace, never one
//! that is not a trace (unless `--force`), never a symbolic link followed,
//! never a file the command itself names; and the previous run's traces of
//! the same name are moved aside to `PATH.old*`, as `perf record` keeps
//! `perf.data.old`, so a second run loses nothing of the first but what was
//! already old.

use crate::trace_names;
use std::ffi::OsString;
use std::io::{Error, ErrorKind, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// What `prepare` did that the user should know.
pub struct Prepared {
    /// The previous run's traces, moved aside (their new names).
    pub moved_aside: Vec<PathBuf>,
    /// How many older traces (`PATH.old*`) the move deleted.
    pub deleted: usize,
}

/// Checks `output` against the command's arguments and what is there, moves
/// the previous run's traces aside and creates the trace file with a header
/// mark (the agent rewrites it whole).
pub fn prepare(output: &Path, command: &[OsString], force: bool) -> Result<Prepared, String> {
    let shown = output.display();
    if let Some(arg) = names_the_same_file(output, command) {
        return Err(format!(
            "the trace {shown} would overwrite {}, which the command names (choose another -o)",
            Path::new(&arg).display()
        ));
    }
    // Whether `output` holds the previous run's top trace, to move aside.
    let mut previous_top = false;
    if let Ok(meta) = std::fs::symlink_metadata(output) {
        let kind = meta.file_type();
        if kind.is_symlink() {
            if !force {
                return Err(format!(
                    "{shown} is a symbolic link: trapline does not write through links (--force replaces the link itself)"
                ));
            }
            std::fs::remove_file(output)
                .map_err(|e| format!("cannot remove the link {shown}: {e}"))?;
        } else if let Some(what) = not_regular(kind) {
            return Err(format!("cannot write the trace {shown}: {what}"));
        } else if is_trace_or_empty(output) {
            previous_top = meta.len() > 0;
        } else if !force {
            return Err(format!(
                "{shown} exists and is not a trapline trace: refusing to overwrite it (--force replaces it)"
            ));
        }
    }
    let (moved_aside, deleted) = move_previous_aside(output, previous_top)?;
    create(output).map_err(|e| {
        format!(
            "cannot write the trace {shown}: {}",
            crate::output::why_not_created(output, &e)
        )
    })?;
    Ok(Prepared {
        moved_aside,
        deleted,
    })
}

fn not_regular(kind: std::fs::FileType) -> Option<&'static str> {
    if kind.is_dir() {
        Some("it is a directory")
    } else if kind.is_fifo() {
        Some("it is a FIFO, not a regular file")
    } else if kind.is_char_device() || kind.is_block_device() {
        Some("it is a device, not a regular file")
    } else if kind.is_socket() {
        Some("it is a socket, not a regular file")
    } else {
        None
    }
}

/// Whether the file begins with a trace's magic, or is empty (a trace that
/// was never written: the agent could not start).
pub(crate) fn is_trace_or_empty(path: &Path) -> bool {
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    let mut head = [0u8; 8];
    let mut got = 0;
    while got < head.len() {
        match std::io::Read::read(&mut f, &mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(_) => return false,
        }
    }
    got == 0 || (got == head.len() && &head == trapline_trace::format::MAGIC)
}

/// The command argument (or the command) that names `output`, as a path or
/// as the value of a `KEY=PATH` argument (`dd of=PATH`), whether the file
/// exists yet or not: a command that writes it would corrupt the trace.
fn names_the_same_file(output: &Path, command: &[OsString]) -> Option<OsString> {
    command
        .iter()
        .find(|arg| {
            let bytes = arg.as_bytes();
            let value = bytes
                .iter()
                .position(|&b| b == b'=')
                .map(|i| std::ffi::OsStr::from_bytes(&bytes[i + 1..]));
            [Some(arg.as_os_str()), value]
                .into_iter()
                .flatten()
                .any(|p| !p.is_empty() && crate::output::same_file(output, Path::new(p)))
        })
        .cloned()
}

/// `PATH.old` for `PATH`, `PATH.old.<pid>[.n]` for `PATH.<pid>[.n]`.
fn old_name(output: &Path, trace: &Path) -> PathBuf {
    let top = output.as_os_str().to_string_lossy();
    let name = trace.as_os_str().to_string_lossy();
    let rest = name.strip_prefix(top.as_ref()).unwrap_or("");
    PathBuf::from(format!("{top}.old{rest}"))
}

/// Moves the previous run's traces (PATH when `top_is_trace`, and every
/// PATH.<pid>[.n]) to PATH.old*, after removing an older PATH.old family;
/// returns the new names and how many older files were removed.
fn move_previous_aside(output: &Path, top_is_trace: bool) -> Result<(Vec<PathBuf>, usize), String> {
    let mut previous = trace_names::family_files(output);
    if top_is_trace {
        previous.insert(0, output.to_path_buf());
    }
    if previous.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let old_top = old_name(output, output);
    let mut older = trace_names::family_files(&old_top);
    older.push(old_top);
    let mut deleted = 0;
    for f in older {
        match std::fs::remove_file(&f) {
            Ok(()) => deleted += 1,
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => {
                return Err(format!(
                    "cannot remove the older trace {}: {e}",
                    f.display()
                ))
            }
        }
    }
    let mut moved = Vec::new();
    for f in previous {
        let to = old_name(output, &f);
        std::fs::rename(&f, &to).map_err(|e| {
            format!(
                "cannot move the previous trace {} aside to {}: {e}",
                f.display(),
                to.display()
            )
        })?;
        moved.push(to);
    }
    Ok((moved, deleted))
}

/// Creates the trace file (never through a link) and writes the magic: a
/// write that succeeds, so that a disk that refuses it fails here, and a file
/// that a later run knows for a trace even if the agent never starts.
fn create(path: &Path) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                Error::new(ErrorKind::InvalidInput, "it is a symbolic link")
            } else {
                e
            }
        })?;
    file.write_all(trapline_trace::format::MAGIC)
}
