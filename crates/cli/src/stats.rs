//! `trapline stats`: allocation calls, bytes, peak heap, trace cost.

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    #[command(flatten)]
    pub trace: crate::args::TraceArg,
    /// Output format.
    #[arg(long, value_enum, default_value_t = crate::args::Format::Text)]
    pub format: crate::args::Format,
}

/// Runs the command; see [`crate::output`] for the exit statuses.
pub fn main(args: StatsArgs) -> ExitCode {
    crate::output::run("stats", &args.trace.trace, args.format, None, |input| {
        trapline_analysis::stats::analyze(input)
    })
}
