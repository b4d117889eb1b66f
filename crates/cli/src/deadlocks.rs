//! `trapline deadlocks`: potential deadlocks (generalized Goodlock), lock-order inversions, actual deadlocks and lock misuse.

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct DeadlocksArgs {
    #[command(flatten)]
    pub trace: crate::TraceArg,
    /// Output format.
    #[arg(long, value_enum, default_value_t = crate::Format::Text)]
    pub format: crate::Format,
}

impl crate::output::Report for trapline_analysis::DeadlocksReport {
    fn process(&self) -> &trapline_analysis::report::ProcessReport {
        &self.process
    }
    fn text(&self) -> String {
        trapline_analysis::deadlocks::render_text(self)
    }
    fn status(&self) -> &trapline_analysis::report::TraceStatus {
        &self.trace
    }
}

/// Runs the command; see [`crate::output`] for the exit statuses.
pub fn main(args: DeadlocksArgs) -> ExitCode {
    crate::output::run("deadlocks", &args.trace.trace, args.format, |input| {
        trapline_analysis::deadlocks::analyze(input)
    })
}
