//! `trapline locks`: lock contention per lock: acquisitions, contention, owner changes, wait and hold times.

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct LocksArgs {
    #[command(flatten)]
    pub trace: crate::args::TraceArg,
    /// Output format.
    #[arg(long, value_enum, default_value_t = crate::args::Format::Text)]
    pub format: crate::args::Format,
    /// List the N highest-ranked locks (each mode of an rwlock apart); 0
    /// lists all. The totals count every lock.
    #[arg(long, value_name = "N", default_value_t = trapline_analysis::locks::DEFAULT_TOP)]
    pub top: usize,
    /// Exit with this status when the report finds something (see `found`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..))]
    pub error_exitcode: Option<u8>,
}

impl crate::output::Report for trapline_analysis::LocksReport {
    fn process(&self) -> &trapline_analysis::report::ProcessReport {
        &self.process
    }
    fn text(&self) -> String {
        trapline_analysis::locks::render_text(self)
    }
    fn status(&self) -> &trapline_analysis::report::TraceStatus {
        &self.trace
    }
    /// Lock misuse.
    fn found(&self) -> bool {
        !self.errors.is_empty()
    }
}

/// Runs the command; see [`crate::output`] for the exit statuses.
pub fn main(args: LocksArgs) -> ExitCode {
    crate::output::run(
        "locks",
        &args.trace.trace,
        args.format,
        args.error_exitcode,
        |input| {
            let top = (args.top > 0).then_some(args.top);
            trapline_analysis::locks::analyze_top(input, top)
        },
    )
}
