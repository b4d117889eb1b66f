//! The names of a traced tree's trace files, as paths: the rule is the
//! contract's (`trapline_contract::trace_names`), which the agent writes by;
//! `trapline run` and the analysis commands follow them.

use std::path::{Path, PathBuf};

/// Trace files of a previous run with the same output name (PATH.<pid>[.<n>]).
pub fn family_files(output: &Path) -> Vec<PathBuf> {
    let dir = output
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Some(base) = output.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if trapline_contract::trace_names::is_member(&base, &name) {
                out.push(dir.join(&name));
            }
        }
    }
    out.sort();
    out
}

/// The trace of generation `generation` of process `pid` under the top
/// trace `top`: TRACE.<pid> for 0, TRACE.<pid>.<n> after.
pub fn image_trace(top: &Path, pid: u32, generation: u32) -> PathBuf {
    PathBuf::from(trapline_contract::trace_names::image_trace(
        &top.to_string_lossy(),
        pid,
        generation,
    ))
}

/// The trace that process `pid`'s next image writes after `trace` (which
/// is TRACE, TRACE.<pid> or TRACE.<pid>.<n>).
pub fn next_image_trace(trace: &Path, pid: u32) -> PathBuf {
    let name = trace.as_os_str().to_string_lossy();
    match name.rsplit_once(&format!(".{pid}")) {
        Some((top, "")) => image_trace(Path::new(top), pid, 1),
        Some((top, rest)) => match rest.strip_prefix('.').and_then(|n| n.parse::<u32>().ok()) {
            Some(n) => image_trace(Path::new(top), pid, n + 1),
            None => image_trace(trace, pid, 0),
        },
        None => image_trace(trace, pid, 0),
    }
}

/// The pid in the name of a trace of the tree, `TRACE.<pid>` or
/// `TRACE.<pid>.<n>` for the top trace `output`.
pub fn pid_in_name(output: &Path, path: &Path) -> Option<u32> {
    let base = output.file_name()?.to_str()?;
    let rest = path
        .file_name()?
        .to_str()?
        .strip_prefix(base)?
        .strip_prefix('.')?;
    rest.split('.').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::{next_image_trace, pid_in_name};
    use std::path::Path;

    #[test]
    fn the_pid_of_a_trace_is_the_first_number_after_the_top_traces_name() {
        let top = Path::new("/tmp/out.5");
        for (name, pid) in [
            ("/tmp/out.5.123", Some(123)),
            ("/tmp/out.5.123.2", Some(123)),
            ("/tmp/out.5", None),
            ("/tmp/other.123", None),
            ("/tmp/out.5.x", None),
        ] {
            assert_eq!(pid_in_name(top, Path::new(name)), pid, "{name}");
        }
    }

    #[test]
    fn the_next_image_of_a_trace_is_the_next_generation() {
        for (trace, next) in [
            ("/tmp/t", "/tmp/t.42"),
            ("/tmp/t.42", "/tmp/t.42.1"),
            ("/tmp/t.42.1", "/tmp/t.42.2"),
            ("/tmp/t.42.9", "/tmp/t.42.10"),
        ] {
            assert_eq!(
                next_image_trace(Path::new(trace), 42),
                Path::new(next),
                "{trace}"
            );
        }
    }
}
