//! `trapline leaks` (placeholder until implemented).

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct LeaksArgs {
    #[command(flatten)]
    pub trace: crate::TraceArg,
    /// Output format.
    #[arg(long, value_enum, default_value_t = crate::Format::Text)]
    pub format: crate::Format,
}

pub fn main(_args: LeaksArgs) -> ExitCode {
    eprintln!("trapline leaks: not implemented yet");
    ExitCode::from(crate::EXIT_ANALYSIS_ERROR)
}
