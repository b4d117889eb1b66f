//! `trapline report`: one self-contained HTML page of a run's traces.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use trapline_analysis::profile::{self, ProfileAnalysis, ProfileError};
use trapline_analysis::{findings, heap_profile, locks, pass, timeline};
use trapline_export::html::{self, ProcessPage};
use trapline_trace::TraceError;

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

/// Every analysis of one trace, in two reads. The first feeds stats and
/// the heap profile (on one heap replay) and the locks on one thread, and the leak and deadlock
/// findings and the CPU profile on another (deadlocks' search is the
/// dearest pass on a service's trace). Stats' sites then name what the
/// second read follows over time: the timeline of the sites that made the
/// peak.
fn page(path: &Path, at: Option<f64>) -> Result<ProcessPage, ExitCode> {
    let at_ns = at.map(output::nanos);
    let mut others = None;
    let stats = output::load("report", path, |input| {
        let (((mut stats, heap), locks), (findings, profile)) = pass::run_split(input, |index| {
            (
                (
                    heap_profile::with_stats(trapline_analysis::sites::LISTED, at_ns),
                    locks::LocksAnalysis::new(None),
                ),
                (
                    findings::pass(index),
                    ProfileAnalysis::new(profile::ProfileOptions::default()),
                ),
            )
        })?;
        stats.name_sites(input)?;
        others = Some((findings, heap, profile, locks));
        Ok::<_, TraceError>(stats)
    })?;
    let ((leaks, deadlocks), heap, profile, locks) =
        others.expect("the first read gives every report");
    output::refuse_at_after_end("report", path, at_ns, &heap)?;
    let profile = match profile {
        Ok(p) => Some(p),
        Err(ProfileError::NotProfiled) => None,
        Err(e) => return Err(output::fail("report", path, e)),
    };
    let plotted: Vec<_> = stats
        .sites
        .peak_contribution
        .iter()
        .take(PLOTTED_SITES)
        .collect();
    let ids: Vec<u32> = plotted.iter().map(|s| s.stack_id).collect();
    let names = plotted.iter().map(|s| html::stack_name(&s.stack)).collect();
    let mut input = output::open_trace("report", path)?;
    let timeline =
        timeline::analyze(&mut input, &ids).map_err(|e| output::fail("report", path, e))?;
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
