//! `trapline leaks`: loss records judged by reachability (definitely,
//! indirectly, possibly lost, still reachable), and allocation errors.

use std::path::PathBuf;
use std::process::ExitCode;

use trapline_analysis::leaks::LeaksOptions;
use trapline_analysis::suppressions;

#[derive(clap::Args, Debug)]
pub struct LeaksArgs {
    #[command(flatten)]
    pub trace: crate::args::TraceArg,
    /// Output format (SARIF: one result per finding, for code-scanning
    /// services).
    #[arg(long, value_enum, default_value_t = crate::args::FindingsFormat::Text)]
    pub format: crate::args::FindingsFormat,
    /// Show reachability scan N (1 = the first; default: the last).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub snapshot: Option<u32>,
    /// Show how each allocation site was judged across all scans.
    #[arg(long)]
    pub history: bool,
    /// Kinds of loss records to list: definite, indirect, possible,
    /// reachable, all, none (comma-separated; the summary counts every kind).
    #[arg(long, value_name = "LIST", default_value = "definite,possible", value_parser = parse_kinds)]
    pub kinds: Kinds,
    /// A suppression file (LeakSanitizer `leak:PATTERN` lines or Valgrind
    /// `{ ... Memcheck:Leak ... }` blocks); may be repeated.
    #[arg(long = "suppressions", value_name = "FILE")]
    pub suppressions: Vec<PathBuf>,
    /// Print with each loss record listed a Valgrind suppression that hides
    /// it, ready for a --suppressions file (in the JSON: each record's
    /// `suppression`).
    #[arg(long)]
    pub gen_suppressions: bool,
    /// Exit with this status when the report holds an error or a definitely
    /// or possibly lost block (not suppressed), as memcheck's --error-exitcode.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..))]
    pub error_exitcode: Option<u8>,
}

/// The kinds of loss records to list.
#[derive(Clone, Debug)]
pub struct Kinds(Vec<trapline_trace::Verdict>);

fn parse_kinds(s: &str) -> Result<Kinds, String> {
    suppressions::leak_kinds(s).map(Kinds).map_err(|k| {
        format!("unknown leak kind `{k}` (use definite, indirect, possible, reachable, all, none)")
    })
}

/// Runs the command; see [`crate::output`] for the exit statuses.
pub fn main(args: LeaksArgs) -> ExitCode {
    let mut options = LeaksOptions {
        snapshot: args.snapshot,
        history: args.history,
        kinds: args.kinds.0,
        suppressions: Vec::new(),
        gen_suppressions: args.gen_suppressions,
        ..LeaksOptions::default()
    };
    for path in &args.suppressions {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!(
                    "trapline leaks: {}: cannot read suppressions: {e}",
                    path.display()
                );
                return ExitCode::from(crate::args::EXIT_USAGE);
            }
        };
        match suppressions::parse(&text, &path.display().to_string()) {
            Ok(s) => options.suppressions.extend(s),
            Err(e) => {
                eprintln!("trapline leaks: {e}");
                return ExitCode::from(crate::args::EXIT_USAGE);
            }
        }
    }
    crate::output::run(
        "leaks",
        &args.trace.trace,
        args.format,
        args.error_exitcode,
        |input| trapline_analysis::leaks::analyze_with(input, &options),
    )
}
