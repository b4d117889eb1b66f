//! `trapline leaks`: blocks still allocated at exit, and allocation errors.

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct LeaksArgs {
    #[command(flatten)]
    pub trace: crate::TraceArg,
    /// Output format.
    #[arg(long, value_enum, default_value_t = crate::Format::Text)]
    pub format: crate::Format,
}

/// Runs the command; see [`crate::output`] for the exit statuses.
pub fn main(args: LeaksArgs) -> ExitCode {
    crate::output::run("leaks", &args.trace.trace, args.format, |input| {
        trapline_analysis::leaks::analyze(input)
    })
}
