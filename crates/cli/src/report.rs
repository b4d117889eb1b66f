//! `trapline report`: one self-contained HTML page of a run's traces.

use std::fs::File;
use std::io::{BufReader, Seek};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use trapline_analysis::profile::{self, ProfileError};
use trapline_analysis::{locks, stats, timeline};
use trapline_export::html::{self, ProcessPage};

use crate::output;

/// Sites followed over time in the heap plot.
const PLOTTED_SITES: usize = 5;

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// The traces of the run (the top process's and its children's), one
    /// tab each.
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,
    /// The HTML file to write.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// Replace FILE if it exists.
    #[arg(long)]
    pub force: bool,
    /// Also draw the bytes live SECS seconds into each run (a flame graph,
    /// marked on the heap plot).
    #[arg(long, value_name = "SECS", value_parser = crate::output::parse_seconds)]
    pub at: Option<f64>,
}

/// Runs the command: 0 when the page is written, 1 when a trace cannot be
/// read or the page cannot be written, 2 for bad usage.
pub fn main(args: ReportArgs) -> ExitCode {
    let inputs: Vec<&Path> = args.traces.iter().map(PathBuf::as_path).collect();
    if let Err(code) = output::refuse_existing("report", &args.output, args.force, &inputs) {
        return code;
    }
    let mut pages = Vec::new();
    for path in &args.traces {
        match crate::progress::while_running("report", || page(path, args.at)) {
            Ok(p) => pages.push(p),
            Err(code) => return code,
        }
    }
    match output::write_file(&args.output, args.force, |out| html::write(&pages, out)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => output::fail("report", &args.output, e),
    }
}

/// Every analysis of one trace. `stats` reads it first: it refuses a file
/// that is no usable trace, once, and chooses the sites the timeline
/// plots. The others then run on two threads, the leak and deadlock
/// findings (one shared read) beside the rest, as each pass's own work is
/// bound to one core.
fn page(path: &Path, at: Option<f64>) -> Result<ProcessPage, ExitCode> {
    let stats = output::load("report", path, stats::analyze)?;
    let plotted: Vec<_> = stats
        .sites
        .peak_contribution
        .iter()
        .take(PLOTTED_SITES)
        .collect();
    let ids: Vec<u32> = plotted.iter().map(|s| s.stack_id).collect();
    let names = plotted.iter().map(|s| html::stack_name(&s.stack)).collect();
    let (findings, rest) = std::thread::scope(|scope| {
        let findings =
            scope.spawn(|| output::load("report", path, trapline_analysis::findings::analyze));
        let rest = the_rest(path, at, &ids);
        (findings.join().expect("the findings' thread"), rest)
    });
    let (leaks, deadlocks) = findings?;
    let (heap, timeline, profile, locks) = rest?;
    let has_locks = locks.has_lock_events;
    Ok(ProcessPage {
        leaks,
        stats,
        heap,
        timeline,
        timeline_sites: names,
        profile,
        locks: has_locks.then_some(locks),
        deadlocks: has_locks.then_some(deadlocks),
    })
}

type TheRest = (
    trapline_analysis::heap_profile::HeapProfile,
    timeline::Timeline,
    Option<profile::ProfileReport>,
    locks::LocksReport,
);

/// The heap profile, the timeline of the sites `ids`, the CPU profile (if
/// recorded) and the locks.
fn the_rest(path: &Path, at: Option<f64>, ids: &[u32]) -> Result<TheRest, ExitCode> {
    let heap = output::heap_profile_at("report", path, at)?;
    let mut input = output::open_trace("report", path)?;
    let timeline =
        timeline::analyze(&mut input, ids).map_err(|e| output::fail("report", path, e))?;
    rewind(&mut input, path)?;
    let profile = match profile::analyze(&mut input, profile::ProfileOptions::default()) {
        Ok(p) => Some(p),
        Err(ProfileError::NotProfiled) => None,
        Err(e) => return Err(output::fail("report", path, e)),
    };
    rewind(&mut input, path)?;
    let locks = locks::analyze(&mut input).map_err(|e| output::fail("report", path, e))?;
    Ok((heap, timeline, profile, locks))
}

fn rewind(input: &mut BufReader<File>, path: &Path) -> Result<(), ExitCode> {
    input
        .rewind()
        .map_err(|e| output::fail("report", path, format!("cannot read: {e}")))
}
