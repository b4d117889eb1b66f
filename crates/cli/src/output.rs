//! What the analysis commands share: opening the trace, exit statuses, output.
//!
//! Exit statuses: 0 when a report was produced, even if it found leaks or
//! errors, and also for a truncated or damaged trace that still held events
//! (the report then ends with a warning saying where and why reading stopped,
//! and its JSON has `trace.stopped`); 1 when there is nothing to report: the
//! file cannot be opened, is not a trapline trace, has a newer format version,
//! or holds no readable event at all (the message on stderr names the file);
//! 2 for bad usage (clap); with `--error-exitcode N` (leaks, locks,
//! deadlocks), N when the report found what that command counts as errors.

use std::fs::File;
use std::fs::OpenOptions;
use std::io::{BufReader, BufWriter, Write};
use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;
use trapline_analysis::report::{ProcessReport, TraceStatus};
use trapline_trace::TraceError;

use crate::args::{FindingsFormat, Format};

/// What an analysis command prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
    /// SARIF 2.1.0 (`trapline_export::sarif`).
    Sarif,
}

impl From<Format> for Output {
    fn from(f: Format) -> Self {
        match f {
            Format::Text => Output::Text,
            Format::Json => Output::Json,
        }
    }
}

impl From<FindingsFormat> for Output {
    fn from(f: FindingsFormat) -> Self {
        match f {
            FindingsFormat::Text => Output::Text,
            FindingsFormat::Json => Output::Json,
            FindingsFormat::Sarif => Output::Sarif,
        }
    }
}

/// A report an analysis command can print.
pub trait Report: Serialize {
    /// The report as text.
    fn text(&self) -> String;
    /// How reading the trace went.
    fn status(&self) -> &TraceStatus;
    /// Why the report cannot answer what was asked, if it cannot.
    fn problem(&self) -> Option<&str> {
        None
    }
    /// The traced process.
    fn process(&self) -> &ProcessReport;
    /// Whether the report found something `--error-exitcode` stands for.
    fn found(&self) -> bool {
        false
    }
    /// The report's findings as a SARIF log, for the commands that offer
    /// `--format sarif`.
    fn sarif(&self, _trace: &Path) -> Option<trapline_export::sarif::SarifLog> {
        None
    }
}

impl Report for trapline_analysis::LeaksReport {
    fn process(&self) -> &ProcessReport {
        &self.process
    }
    fn text(&self) -> String {
        trapline_analysis::leaks::render_text(self)
    }
    fn status(&self) -> &TraceStatus {
        &self.trace
    }
    fn problem(&self) -> Option<&str> {
        self.problem.as_deref()
    }
    /// memcheck's rule: errors, and leaks of the kinds that count as errors
    /// (definite and possible), suppressed ones excepted.
    fn found(&self) -> bool {
        trapline_analysis::findings::Findings::of(self, None).leaks_fail()
    }
    fn sarif(&self, trace: &Path) -> Option<trapline_export::sarif::SarifLog> {
        Some(trapline_export::sarif::leaks(self, trace))
    }
}

/// Two reports of one read of the trace (see `trapline_analysis::pass`):
/// the first says how reading went.
impl<A: Report, B: Report> Report for (A, B) {
    fn process(&self) -> &ProcessReport {
        self.0.process()
    }
    fn text(&self) -> String {
        self.0.text() + &self.1.text()
    }
    fn status(&self) -> &TraceStatus {
        self.0.status()
    }
    fn problem(&self) -> Option<&str> {
        self.0.problem().or(self.1.problem())
    }
    fn found(&self) -> bool {
        self.0.found() || self.1.found()
    }
}

impl Report for trapline_analysis::ProfileReport {
    fn process(&self) -> &ProcessReport {
        &self.process
    }
    fn text(&self) -> String {
        trapline_analysis::profile::render_text(self)
    }
    fn status(&self) -> &TraceStatus {
        &self.trace
    }
}

impl Report for trapline_analysis::heap_profile::HeapProfile {
    fn process(&self) -> &ProcessReport {
        &self.process
    }
    fn text(&self) -> String {
        String::new()
    }
    fn status(&self) -> &TraceStatus {
        &self.trace
    }
}

impl Report for trapline_analysis::StatsReport {
    fn process(&self) -> &ProcessReport {
        &self.process
    }
    fn text(&self) -> String {
        trapline_analysis::stats::render_text(self)
    }
    fn status(&self) -> &TraceStatus {
        &self.trace
    }
}

/// Runs `analyze` on the trace at `path` and prints its report in `format`.
/// With `error_exitcode`, a report that found something returns that status.
pub fn run<T: Report>(
    command: &str,
    path: &Path,
    format: impl Into<Output>,
    error_exitcode: Option<u8>,
    analyze: impl FnOnce(&mut TraceReader) -> Result<T, TraceError>,
) -> ExitCode {
    let format = format.into();
    let report = match load(command, path, analyze) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let out: Result<String, String> = match format {
        Output::Text => Ok(report.text()),
        Output::Json => json(&report),
        Output::Sarif => match report.sarif(path) {
            Some(log) => json(&log),
            None => Err(format!("{command} has no SARIF output")),
        },
    };
    let out = match out {
        Ok(s) => s,
        Err(e) => return fail(command, path, e),
    };
    print(&out);
    if format == Output::Text {
        next_image_hint(path, report.process());
    }
    match error_exitcode {
        Some(code) if report.found() => ExitCode::from(code),
        _ => ExitCode::SUCCESS,
    }
}

/// For a trace whose image replaced itself with exec: where the next
/// image's trace is, when it is there (`TRACE.<pid>`, then
/// `TRACE.<pid>.1`, ...: agent.md, "Trace file names"), on stderr.
fn next_image_hint(path: &Path, process: &ProcessReport) {
    let (Some(pid), Some(exit)) = (process.pid, process.exit) else {
        return;
    };
    if !exit.exec {
        return;
    }
    let next = crate::trace_names::next_image_trace(path, pid);
    if next.is_file() {
        eprintln!(
            "==trapline== this image replaced itself with exec; the next image's trace: {}",
            next.display()
        );
    }
}

/// Prints an analysis error about the trace at `path`; returns the exit status for it.
pub fn fail(command: &str, path: &Path, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("trapline {command}: {}: {msg}", path.display());
    ExitCode::from(crate::args::EXIT_ANALYSIS_ERROR)
}

/// A trace file being read, with its index file beside it.
pub type TraceReader = trapline_analysis::index_file::TraceFile<BufReader<File>>;

/// Opens the trace at `path` for `command`'s reading; a failure is
/// reported on stderr and becomes the exit status.
pub fn open_trace(command: &str, path: &Path) -> Result<TraceReader, ExitCode> {
    let file = File::open(path).map_err(|e| fail(command, path, format!("cannot open: {e}")))?;
    match file.metadata() {
        Ok(m) if m.is_dir() => {
            return Err(fail(command, path, "is a directory, not a trace"));
        }
        Ok(m) if m.len() == 0 => {
            return Err(fail(
                command,
                path,
                "is empty (0 bytes), not a trace: the recording wrote nothing (it was killed \
                 before it began, or the file was made by something else)",
            ));
        }
        _ => {}
    }
    Ok(trapline_analysis::index_file::TraceFile::new(
        BufReader::with_capacity(1 << 16, file),
        path,
    ))
}

/// Why `path` could not be created, naming the directory when it is the
/// cause (a missing directory, or one this user cannot write).
pub fn why_not_created(path: &Path, e: &std::io::Error) -> String {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match e.kind() {
        std::io::ErrorKind::NotFound if !dir.exists() => {
            format!("the directory {} does not exist", dir.display())
        }
        std::io::ErrorKind::PermissionDenied => {
            format!(
                "permission denied: this user cannot create files in {}",
                dir.display()
            )
        }
        _ => e.to_string(),
    }
}

/// Opens the trace at `path` and runs `analyze` on it. A failure, or a trace
/// without a readable event, is reported on stderr and becomes the exit status.
pub fn load<T: Report, E: std::fmt::Display>(
    command: &str,
    path: &Path,
    analyze: impl FnOnce(&mut TraceReader) -> Result<T, E>,
) -> Result<T, ExitCode> {
    let mut input = open_trace(command, path)?;
    let report = crate::progress::while_running(command, || analyze(&mut input))
        .map_err(|e| fail(command, path, e))?;
    if let Some(p) = report.problem() {
        return Err(fail(command, path, p));
    }
    let status = report.status();
    if status.events == 0 {
        let why = match &status.stopped {
            Some(s) => s.reason.clone(),
            None => "the file ends after its header (the process was killed before the agent \
                     wrote anything, or it is still running and its first chunk is not written \
                     yet: try again)"
                .to_string(),
        };
        return Err(fail(
            command,
            path,
            format!("the trace holds no readable events: {why}"),
        ));
    }
    Ok(report)
}

/// The report as pretty JSON with a final newline.
pub fn json<T: Serialize>(report: &T) -> Result<String, String> {
    serde_json::to_string_pretty(report)
        .map(|s| s + "\n")
        .map_err(|e| format!("cannot serialize the report: {e}"))
}

/// Writes a report to stdout; a closed pipe (`| head`) is not an error worth reporting.
pub fn print(out: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush());
}

/// Fails (`command`'s error on `path`) when `path` is one of the traces
/// `inputs` the command reads (even with `force`), or exists and `force`
/// is not given: checked before any work, so nothing is lost or written.
pub fn refuse_existing(
    command: &str,
    path: &Path,
    force: bool,
    inputs: &[&Path],
) -> Result<(), ExitCode> {
    if inputs.iter().any(|input| same_file(path, input)) {
        return Err(fail(
            command,
            path,
            "is a trace this command reads: choose another output (nothing was written)",
        ));
    }
    if path.is_dir() {
        return Err(fail(
            command,
            path,
            "is a directory: name a file to write (nothing was written)",
        ));
    }
    if path.exists() && !force {
        return Err(fail(
            command,
            path,
            "exists; --force replaces it (nothing was written)",
        ));
    }
    Ok(())
}

/// Whether `a` and `b` name the same file: the same inode when both exist;
/// else the same absolute path once the directories are resolved (a file
/// not yet there, which one of them is about to create).
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        (Err(_), Err(_)) | (Ok(_), Err(_)) | (Err(_), Ok(_)) => {
            resolved(a).is_some_and(|x| resolved(b).is_some_and(|y| x == y))
        }
    }
}

/// `path` absolute, its directory's links and `..` resolved, the last
/// component kept as written (it need not exist).
fn resolved(path: &Path) -> Option<std::path::PathBuf> {
    let name = path.file_name()?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    Some(std::fs::canonicalize(dir).ok()?.join(name))
}

/// Writes `FILE` through `write` into a temporary file beside it, renamed
/// over it when complete: a failed export leaves no half-written file.
pub fn write_file(
    file: &Path,
    force: bool,
    write: impl FnOnce(&mut BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> Result<(), String> {
    let name = file
        .file_name()
        .ok_or_else(|| "is not a file name".to_string())?;
    let mut partial = name.to_os_string();
    partial.push(".partial");
    let temp = file.with_file_name(partial);
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp)
        .map_err(|e| {
            format!(
                "cannot create {}: {}",
                temp.display(),
                why_not_created(&temp, &e)
            )
        })?;
    let mut out = BufWriter::new(f);
    let done = write(&mut out).and_then(|()| out.flush());
    if let Err(e) = done {
        let _ = std::fs::remove_file(&temp);
        return Err(format!("cannot write: {e}"));
    }
    if !force && file.exists() {
        let _ = std::fs::remove_file(&temp);
        return Err("appeared while it was written; --force replaces it".into());
    }
    std::fs::rename(&temp, file).map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        format!("cannot rename {} to it: {e}", temp.display())
    })
}

/// A number of seconds for `--at`: finite and not negative.
pub fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds (0 or more)")),
    }
}

/// Seconds (of [`parse_seconds`]) as the nanoseconds analyses count.
pub fn nanos(seconds: f64) -> u64 {
    (seconds * 1e9).round() as u64
}

/// The heap profile of the trace at `path`, with the live blocks at `at`
/// seconds when asked; a time after the trace's end is an error.
pub fn heap_profile_at(
    command: &str,
    path: &Path,
    at: Option<f64>,
) -> Result<trapline_analysis::heap_profile::HeapProfile, ExitCode> {
    let at_ns = at.map(nanos);
    let heap = load(command, path, |input| {
        trapline_analysis::heap_profile::analyze_at(input, at_ns)
    })?;
    refuse_at_after_end(command, path, at_ns, &heap)?;
    Ok(heap)
}

/// Refuses `--at` past the end of the trace the heap profile is of.
pub fn refuse_at_after_end(
    command: &str,
    path: &Path,
    at_ns: Option<u64>,
    heap: &trapline_analysis::heap_profile::HeapProfile,
) -> Result<(), ExitCode> {
    if let Some(ns) = at_ns.filter(|&ns| ns > heap.end_ns) {
        return Err(fail(
            command,
            path,
            format!(
                "--at {} s is after the trace's end ({} s)",
                ns as f64 / 1e9,
                heap.end_ns as f64 / 1e9
            ),
        ));
    }
    Ok(())
}
