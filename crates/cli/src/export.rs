//! `trapline export`: a trace's analyses in the formats other tools read.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::ValueEnum;
use trapline_analysis::profile;
use trapline_analysis::thread_timeline::{LockSelector, SpanFilter};

use crate::output;

/// Formats of `trapline export`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// pprof's gzipped protocol buffer (`go tool pprof`, Pyroscope, Grafana).
    Pprof,
    /// Parquet tables (DuckDB, DataFusion, Spark): FILE is a directory that
    /// gets events.parquet and stacks.parquet.
    Parquet,
    /// Chrome's trace event JSON (Perfetto's UI, Chrome DevTools): lock
    /// waits and holds per thread, the heap as a counter, scans and
    /// verdicts as instants.
    #[value(alias = "chrome-trace")]
    Perfetto,
}

/// What a profile export holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Profiled {
    /// The heap by allocation stack: allocated over the run, and live at
    /// the end.
    Heap,
    /// CPU samples by stack (a trace recorded with --profile).
    Cpu,
}

#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    #[command(flatten)]
    pub trace: crate::args::TraceArg,
    /// The format to write.
    #[arg(long, value_enum)]
    pub format: ExportFormat,
    /// pprof: the heap (default) or the CPU profile.
    #[arg(long, value_enum, default_value_t = Profiled::Heap)]
    pub profile: Profiled,
    /// The file to write (for parquet, the directory).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// Replace FILE if it exists.
    #[arg(long)]
    pub force: bool,
    /// pprof heap: the inuse values are the blocks live SECS seconds into
    /// the run instead of at its end.
    #[arg(long, value_name = "SECS", value_parser = crate::output::parse_seconds)]
    pub at: Option<f64>,
    /// perfetto: leave out what ended before SECS seconds into the run.
    #[arg(long, value_name = "SECS", value_parser = crate::output::parse_seconds)]
    pub from: Option<f64>,
    /// perfetto: leave out what began after SECS seconds into the run.
    #[arg(long, value_name = "SECS", value_parser = crate::output::parse_seconds)]
    pub to: Option<f64>,
    /// perfetto: only this lock: its address (0x...), or text in the name
    /// of a place that takes it (a function, file or file:line).
    #[arg(long, value_name = "ADDR|SITE", value_parser = parse_lock)]
    pub lock: Option<LockSelector>,
    /// perfetto: leave out waits shorter than NS nanoseconds, and the holds
    /// of locks no thread waited for that long.
    #[arg(long, value_name = "NS")]
    pub min_wait: Option<u64>,
}

/// `--lock`: an address when it reads as one, a place's text otherwise.
fn parse_lock(s: &str) -> Result<LockSelector, String> {
    if s.is_empty() {
        return Err("an empty --lock chooses nothing".to_owned());
    }
    Ok(
        match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
            Some(hex) => LockSelector::Address(
                u64::from_str_radix(hex, 16)
                    .map_err(|_| format!("{s:?} is not a hexadecimal address"))?,
            ),
            None => LockSelector::Site(s.to_owned()),
        },
    )
}

/// Runs the command: 0 when the file is written, 1 when the trace cannot
/// give it or the file cannot be written, 2 for bad usage.
pub fn main(args: ExportArgs) -> ExitCode {
    let path = &args.trace.trace;
    if args.at.is_some() && (args.format != ExportFormat::Pprof || args.profile != Profiled::Heap) {
        eprintln!("trapline export: --at applies only to the pprof heap profile");
        return ExitCode::from(crate::args::EXIT_USAGE);
    }
    let filtered =
        args.from.is_some() || args.to.is_some() || args.lock.is_some() || args.min_wait.is_some();
    if filtered && args.format != ExportFormat::Perfetto {
        eprintln!(
            "trapline export: --from, --to, --lock and --min-wait apply only to --format perfetto"
        );
        return ExitCode::from(crate::args::EXIT_USAGE);
    }
    if let (Some(from), Some(to)) = (args.from, args.to) {
        if from > to {
            eprintln!(
                "trapline export: --from {from} is after --to {to}: the window holds nothing"
            );
            return ExitCode::from(crate::args::EXIT_USAGE);
        }
    }
    if args.format == ExportFormat::Parquet {
        return parquet(path, &args.output, args.force);
    }
    if let Err(code) = output::refuse_existing("export", &args.output, args.force, &[path]) {
        return code;
    }
    if args.format == ExportFormat::Perfetto {
        let filter = SpanFilter {
            from_ns: args.from.map_or(0, output::nanos),
            to_ns: args.to.map(output::nanos),
            lock: args.lock,
            min_wait_ns: args.min_wait.unwrap_or(0),
        };
        return perfetto(path, &filter, &args.output, args.force);
    }
    let written = match args.profile {
        Profiled::Heap => {
            let report = match output::heap_profile_at("export", path, args.at) {
                Ok(r) => r,
                Err(code) => return code,
            };
            for w in &report.warnings {
                eprintln!("trapline export: warning: {w}");
            }
            output::write_file(&args.output, args.force, |out| {
                trapline_export::pprof::write_heap(&report, out)
            })
        }
        Profiled::Cpu => {
            let report = match output::load("export", path, |input| {
                profile::analyze(input, profile::ProfileOptions::default())
            }) {
                Ok(r) => r,
                Err(code) => return code,
            };
            output::write_file(&args.output, args.force, |out| {
                trapline_export::pprof::write_cpu(&report, out)
            })
        }
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => output::fail("export", &args.output, e),
    }
}

/// Writes the Parquet tables into `dir` (created; an existing one must be
/// empty unless `force`).
fn parquet(trace: &Path, dir: &Path, force: bool) -> ExitCode {
    let full = dir
        .read_dir()
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    if full && !force {
        return output::fail(
            "export",
            dir,
            "is a directory that is not empty; --force writes into it (nothing was written)",
        );
    }
    if dir.exists() && !dir.is_dir() {
        return output::fail(
            "export",
            dir,
            "is not a directory: parquet writes a directory of tables, name one (nothing was written)",
        );
    }
    if let Err(e) = std::fs::create_dir_all(dir) {
        return output::fail("export", dir, format!("cannot create the directory: {e}"));
    }
    let mut input = match output::open_trace("export", trace) {
        Ok(i) => i,
        Err(code) => return code,
    };
    let written = crate::progress::while_running("export", || {
        trapline_export::parquet::write(&mut input, dir)
    });
    match written {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => output::fail("export", trace, e),
    }
}

/// Writes the Chrome trace event JSON of the trace at `trace` to `file`.
fn perfetto(trace: &Path, filter: &SpanFilter, file: &Path, force: bool) -> ExitCode {
    use trapline_export::perfetto::{self, Error};
    let mut input = match output::open_trace("export", trace) {
        Ok(i) => i,
        Err(code) => return code,
    };
    // The analysis writes as it goes: its own failure is kept apart from
    // the file's, and either leaves no file behind.
    let mut analysis_error = None;
    let mut found = None;
    let written = crate::progress::while_running("export", || {
        output::write_file(file, force, |out| {
            match perfetto::write(&mut input, filter, out) {
                Ok(t) if t.trace.events == 0 => {
                    analysis_error = Some("the trace holds no readable events".to_string());
                    Err(std::io::Error::other("no events"))
                }
                Ok(t) => {
                    found = Some(t);
                    Ok(())
                }
                Err(Error::Io(e)) => Err(e),
                Err(Error::Trace(e)) => {
                    analysis_error = Some(e.to_string());
                    Err(std::io::Error::other("analysis failed"))
                }
            }
        })
    });
    if let Some(e) = analysis_error {
        return output::fail("export", trace, e);
    }
    if let Err(e) = written {
        return output::fail("export", file, e);
    }
    let Some(found) = found else {
        return ExitCode::from(crate::args::EXIT_ANALYSIS_ERROR);
    };
    for w in found
        .warnings
        .iter()
        .chain(&trapline_analysis::report::status_warnings(&found.trace))
    {
        eprintln!("trapline export: warning: {w}");
    }
    ExitCode::SUCCESS
}
