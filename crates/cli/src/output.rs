//! What the analysis commands share: opening the trace, exit statuses, output.
//!
//! Exit statuses: 0 when a report was produced, even if it found leaks or
//! errors, and also for a truncated or damaged trace that still held events
//! (the report then ends with a warning saying where and why reading stopped,
//! and its JSON has `trace.stopped`); 1 when there is nothing to report: the
//! file cannot be opened, is not a trapline trace, has a newer format version,
//! or holds no readable event at all (the message on stderr names the file);
//! 2 for bad usage (clap).

use std::fs::File;
use std::io::{BufReader, Write};
use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;
use trapline_analysis::report::TraceStatus;
use trapline_trace::TraceError;

use crate::Format;

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
}

impl Report for trapline_analysis::LeaksReport {
    fn text(&self) -> String {
        trapline_analysis::leaks::render_text(self)
    }
    fn status(&self) -> &TraceStatus {
        &self.trace
    }
    fn problem(&self) -> Option<&str> {
        self.problem.as_deref()
    }
}

impl Report for trapline_analysis::StatsReport {
    fn text(&self) -> String {
        trapline_analysis::stats::render_text(self)
    }
    fn status(&self) -> &TraceStatus {
        &self.trace
    }
}

/// Runs `analyze` on the trace at `path` and prints its report in `format`.
pub fn run<T: Report>(
    command: &str,
    path: &Path,
    format: Format,
    analyze: impl FnOnce(&mut BufReader<File>) -> Result<T, TraceError>,
) -> ExitCode {
    let fail = |msg: String| {
        eprintln!("trapline {command}: {}: {msg}", path.display());
        ExitCode::from(crate::EXIT_ANALYSIS_ERROR)
    };
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) => return fail(format!("cannot open: {e}")),
    };
    let mut input = BufReader::with_capacity(1 << 16, file);
    let report = match analyze(&mut input) {
        Ok(r) => r,
        Err(e) => return fail(e.to_string()),
    };
    if let Some(p) = report.problem() {
        return fail(p.to_string());
    }
    let status = report.status();
    if status.events == 0 {
        let why = match &status.stopped {
            Some(s) => s.reason.clone(),
            None => "the file ends after its header (the process was killed before the agent wrote anything?)"
                .to_string(),
        };
        return fail(format!("the trace holds no readable events: {why}"));
    }
    let out = match format {
        Format::Text => report.text(),
        Format::Json => match serde_json::to_string_pretty(&report) {
            Ok(mut s) => {
                s.push('\n');
                s
            }
            Err(e) => return fail(format!("cannot serialize the report: {e}")),
        },
    };
    // A closed pipe (`| head`) is not an error worth reporting.
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush());
    ExitCode::SUCCESS
}
