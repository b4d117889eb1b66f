//! `trapline stats`: allocation calls, bytes, peak heap, trace cost.

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    #[command(flatten)]
    pub trace: crate::args::TraceArg,
    /// Output format.
    #[arg(long, value_enum, default_value_t = crate::args::Format::Text)]
    pub format: crate::args::Format,
    /// List N sites in each site view (default 10); 0 lists every site.
    #[arg(long, value_name = "N", default_value_t = trapline_analysis::sites::LISTED)]
    pub top: usize,
}

/// Runs the command; see [`crate::output`] for the exit statuses.
pub fn main(args: StatsArgs) -> ExitCode {
    crate::output::run("stats", &args.trace.trace, args.format, None, |input| {
        let listed = if args.top == 0 { usize::MAX } else { args.top };
        trapline_analysis::stats::analyze_top(input, listed)
    })
}
