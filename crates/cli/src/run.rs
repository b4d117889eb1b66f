//! `trapline run` (placeholder until implemented).

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The command to run.
    #[arg(trailing_var_arg = true, required = true)]
    pub command: Vec<std::ffi::OsString>,
}

pub fn main(_args: RunArgs) -> ExitCode {
    ExitCode::from(125)
}
