//! `trapline profile`: CPU hotspots per function and per thread, as text,
//! JSON, folded stacks or an interactive flame graph (SVG, by inferno).

use std::process::ExitCode;

use clap::ValueEnum;
use trapline_analysis::profile::{self, ProfileReport};

use crate::output;

/// Output formats of `trapline profile`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProfileFormat {
    /// For people.
    Text,
    /// A stable schema, documented in docs/json-schema.md.
    Json,
    /// Folded stacks, one line per distinct stack: `main;f;g 42`.
    Folded,
    /// An interactive flame graph (open it in a browser).
    Svg,
}

#[derive(clap::Args, Debug)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub trace: crate::args::TraceArg,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ProfileFormat::Text)]
    pub format: ProfileFormat,
    /// Only this thread's samples (a kernel thread id, as listed under THREADS).
    #[arg(long, value_name = "TID")]
    pub thread: Option<u32>,
    /// Attribute inlined code to the function it was inlined into (as perf
    /// does without --inline) instead of listing inlined functions.
    #[arg(long)]
    pub no_inline: bool,
}

/// Runs the command; see [`crate::output`] for the exit statuses.
pub fn main(args: ProfileArgs) -> ExitCode {
    let path = &args.trace.trace;
    let report = match output::load("profile", path, |input| {
        profile::analyze(
            input,
            profile::ProfileOptions {
                thread: args.thread,
                no_inline: args.no_inline,
            },
        )
    }) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let out = match args.format {
        ProfileFormat::Text => Ok(profile::render_text(&report)),
        ProfileFormat::Json => output::json(&report),
        ProfileFormat::Folded => Ok(profile::render_folded(&report)),
        ProfileFormat::Svg => flame_graph(&report),
    };
    match out {
        Ok(s) => {
            output::print(&s);
            ExitCode::SUCCESS
        }
        Err(e) => output::fail("profile", path, e),
    }
}

/// Renders the folded stacks as an SVG flame graph.
fn flame_graph(report: &ProfileReport) -> Result<String, String> {
    if report.folded.is_empty() {
        return Err(
            "no samples to draw (the program used less CPU than one sampling period)".into(),
        );
    }
    let mut options = inferno::flamegraph::Options::default();
    options.title = match report.thread_filter {
        Some(tid) => format!("CPU of thread {tid}"),
        None => "CPU".to_string(),
    };
    options.subtitle = Some(format!(
        "{} samples at {} Hz of thread CPU time; {}",
        report.samples,
        report.rate_hz,
        report.process.command.join(" ")
    ));
    options.count_name = "samples".to_string();
    let lines = profile::render_folded(report);
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, lines.lines(), &mut svg)
        .map_err(|e| format!("cannot draw the flame graph: {e}"))?;
    String::from_utf8(svg).map_err(|e| e.to_string())
}
