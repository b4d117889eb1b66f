//! `trapline stats` (placeholder until implemented).

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    #[command(flatten)]
    pub trace: crate::TraceArg,
    /// Output format.
    #[arg(long, value_enum, default_value_t = crate::Format::Text)]
    pub format: crate::Format,
}

pub fn main(_args: StatsArgs) -> ExitCode {
    eprintln!("trapline stats: not implemented yet");
    ExitCode::from(crate::EXIT_ANALYSIS_ERROR)
}
