//! `trapline deadlocks`: potential deadlocks (generalized Goodlock), lock-order inversions, actual deadlocks and lock misuse.

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct DeadlocksArgs {
    #[command(flatten)]
    pub trace: crate::args::TraceArg,
    /// Output format (SARIF: one result per finding, for code-scanning
    /// services).
    #[arg(long, value_enum, default_value_t = crate::args::FindingsFormat::Text)]
    pub format: crate::args::FindingsFormat,
    /// Exit with this status when the report finds something (see `found`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..))]
    pub error_exitcode: Option<u8>,
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
    /// Potential and actual deadlocks and lock misuse (not lock-order
    /// inversions of one thread, a lower severity).
    fn found(&self) -> bool {
        trapline_analysis::findings::LockFindings::of(self).is_some_and(|l| l.fail())
    }
    fn sarif(&self, trace: &std::path::Path) -> Option<trapline_export::sarif::SarifLog> {
        Some(trapline_export::sarif::deadlocks(self, trace))
    }
}

/// Runs the command; see [`crate::output`] for the exit statuses.
pub fn main(args: DeadlocksArgs) -> ExitCode {
    crate::output::run(
        "deadlocks",
        &args.trace.trace,
        args.format,
        args.error_exitcode,
        trapline_analysis::deadlocks::analyze,
    )
}
