//! What every command shares, below them all: the exit codes of analyses,
//! the output format and the trace argument.

use clap::ValueEnum;
use std::path::PathBuf;

/// Exit status of analysis commands on an analysis error (bad trace, unreadable file).
pub const EXIT_ANALYSIS_ERROR: u8 = 1;
/// Exit status on bad usage (clap uses it too).
pub const EXIT_USAGE: u8 = 2;

/// Output format of an analysis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// For people.
    Text,
    /// A stable schema, documented in docs/json-schema.md.
    Json,
}

/// Output format of an analysis whose findings code-scanning services
/// read (`leaks`, `deadlocks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FindingsFormat {
    /// For people.
    Text,
    /// A stable schema, documented in docs/json-schema.md.
    Json,
    /// SARIF 2.1.0, for code-scanning services and editors.
    Sarif,
}

/// A trace path argument shared by analyses.
#[derive(clap::Args, Debug)]
pub struct TraceArg {
    /// The trace file written by `trapline run`.
    pub trace: PathBuf,
}
