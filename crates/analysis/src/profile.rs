//! Profile: where the program spent its CPU time, from the samples that
//! `trapline run --profile` recorded, per function and per thread.
//!
//! One streaming pass counts sampling periods per (thread, stack id); only
//! then is each distinct stack symbolized, once. A sample's first address is
//! the interrupted instruction (looked up as is, see
//! [`trapline_symbols::Symbolizer::symbolize_pc`]); the others are return
//! addresses. Inlined calls expand into frames of their own. A function's
//! `self` counts the samples whose innermost source frame is in it; `total`
//! counts the samples with it anywhere on the stack (once per sample, however
//! deep the recursion).

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use serde::Serialize;
use trapline_trace::{Event, ProfileStopReason, TraceError};

use crate::event_class::classes;
use crate::index::{ChunkEntry, MergedEvent, ReadStatus, TraceIndex};
use crate::index_file::{marks, ChunkSummary, Learned, StackUse, TraceInput};
use crate::report::{
    command_text, footer_text, prefix, thousands, warnings_text, Facts, FrameReport, ProcessReport,
    TraceStatus,
};

/// Rows of the text report's function table.
const TEXT_FUNCTIONS: usize = 30;
/// Functions listed per thread in the text report.
const TEXT_THREAD_FUNCTIONS: usize = 5;

/// The `trapline profile` report (its JSON form is the stable schema).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProfileReport {
    /// The traced process.
    pub process: ProcessReport,
    /// Sampling rate: periods per second of each thread's CPU time.
    pub rate_hz: u32,
    /// The real-time signal the agent sampled with.
    pub signal: u32,
    /// The thread the report is restricted to (`--thread`), null for all.
    pub thread_filter: Option<u32>,
    /// Sampling periods with a stack, in the selection: one period is
    /// `1 / rate_hz` s of CPU time.
    pub samples: u64,
    /// `samples / rate_hz`: CPU seconds the samples stand for.
    pub cpu_seconds: f64,
    /// Of `samples`, periods that struck inside trapline's agent while it
    /// served a call of the program's: charged to that call's stack under
    /// the function `[trapline agent]` (its self time is the tool's cost).
    pub samples_in_agent: u64,
    /// Periods that struck in the agent's own code outside a call of the
    /// program's, or where no stack could be taken: counted, not attributed.
    pub samples_skipped: u64,
    /// Periods of CPU time no timer signal came for (the kernel checks CPU
    /// timers at ticks that find the thread running; on a busy machine a
    /// thread can run between them): counted at thread end, not attributed.
    pub samples_missed: u64,
    /// Why sampling stopped before the process ended; null if it did not.
    pub stopped_early: Option<String>,
    /// Functions by `self`, then `total`, highest first.
    pub functions: Vec<FunctionProfile>,
    /// Threads that were sampled, by samples, highest first.
    pub threads: Vec<ThreadProfile>,
    /// Problems met while symbolizing.
    pub warnings: Vec<String>,
    /// Events the agent could not record; null without an end record.
    pub events_lost: Option<u64>,
    /// Whether the trace was complete.
    pub trace: TraceStatus,
    /// The folded stacks (root first, `;`-separated) and their periods, for
    /// `--format folded` and `--format svg`; not part of the JSON.
    #[serde(skip)]
    pub folded: Vec<(String, u64)>,
    /// Every distinct stack of the selection with its samples, frames
    /// innermost first (the agent's frames left out; the agent's
    /// pseudo-function innermost in the calls it served), for the exports
    /// (`trapline export`); not in the JSON.
    #[serde(skip)]
    pub stacks: Vec<SampledStack>,
}

/// A distinct stack and its samples, in one thread.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledStack {
    pub tid: u32,
    /// Innermost first.
    pub frames: Vec<FrameReport>,
    pub samples: u64,
}

/// CPU samples of one function.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FunctionProfile {
    /// Demangled name; `??? (module)` when unknown.
    pub function: String,
    /// Source file, null if unknown.
    pub file: Option<String>,
    /// Module (executable or library) holding it, null if unknown.
    pub module: Option<String>,
    /// Samples in the function itself.
    #[serde(rename = "self")]
    pub self_samples: u64,
    /// Samples with the function on the stack.
    pub total: u64,
    /// `self` as a percentage of `samples`.
    pub self_percent: f64,
    /// `total` as a percentage of `samples`.
    pub total_percent: f64,
}

/// CPU samples of one thread.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ThreadProfile {
    /// Kernel thread id.
    pub tid: u32,
    /// Its name (pthread_setname_np, or the program's name), null if unknown.
    pub name: Option<String>,
    /// Sampling periods with a stack.
    pub samples: u64,
    /// Periods skipped inside trapline's agent.
    pub skipped: u64,
    /// Periods no timer signal came for.
    pub missed: u64,
    /// `samples` as a percentage of all threads' samples.
    pub percent: f64,
    /// This thread's functions by `self`, highest first (percentages of the thread's samples).
    pub functions: Vec<FunctionProfile>,
}

/// Why the profile cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error("the trace holds no CPU samples: it was recorded without `trapline run --profile`")]
    NotProfiled,
    #[error("thread {tid} has no CPU samples in this trace (sampled threads: {known})")]
    NoSuchThread { tid: u32, known: String },
}

/// A function's identity in the tables.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct FunctionKey {
    function: String,
    file: Option<String>,
    module: Option<String>,
}

impl FunctionKey {
    fn of(f: &FrameReport) -> Self {
        let function = match (&f.function, &f.module) {
            (Some(name), _) => name.clone(),
            (None, Some(m)) => format!("??? ({})", m.rsplit('/').next().unwrap_or(m)),
            (None, None) => "???".to_string(),
        };
        FunctionKey {
            function,
            file: f.file.clone(),
            module: f.module.clone(),
        }
    }
}

#[derive(Default)]
struct Counts {
    self_samples: HashMap<FunctionKey, u64>,
    total: HashMap<FunctionKey, u64>,
}

impl Counts {
    fn add(&mut self, frames: &[FunctionKey], periods: u64) {
        let Some(leaf) = frames.first() else { return };
        *self.self_samples.entry(leaf.clone()).or_default() += periods;
        let mut seen = HashSet::new();
        for k in frames {
            if seen.insert(k) {
                *self.total.entry(k.clone()).or_default() += periods;
            }
        }
    }

    fn table(&self, samples: u64) -> Vec<FunctionProfile> {
        let percent = |n: u64| {
            if samples == 0 {
                0.0
            } else {
                (n as f64 * 1000.0 / samples as f64).round() / 10.0
            }
        };
        let mut rows: Vec<FunctionProfile> = self
            .total
            .iter()
            .map(|(k, &total)| {
                let own = self.self_samples.get(k).copied().unwrap_or(0);
                FunctionProfile {
                    function: k.function.clone(),
                    file: k.file.clone(),
                    module: k.module.clone(),
                    self_samples: own,
                    total,
                    self_percent: percent(own),
                    total_percent: percent(total),
                }
            })
            .collect();
        rows.sort_by(|a, b| {
            (b.self_samples, b.total)
                .cmp(&(a.self_samples, a.total))
                .then_with(|| a.function.cmp(&b.function))
        });
        rows
    }
}

/// What to report.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProfileOptions {
    /// Restrict functions and folded stacks to this thread.
    pub thread: Option<u32>,
    /// Attribute inlined code to the function it was inlined into, as
    /// symbol-based profilers (perf without --inline) do.
    pub no_inline: bool,
}

/// Analyses a trace.
pub fn analyze<R: TraceInput>(
    input: &mut R,
    options: ProfileOptions,
) -> Result<ProfileReport, ProfileError> {
    crate::pass::run(input, |_| ProfileAnalysis::new(options))?
}

/// The CPU profile as a [`crate::pass::Pass`]: its report is the profile,
/// or why there is none.
pub struct ProfileAnalysis {
    options: ProfileOptions,
    facts: Facts,
    start: Option<(u32, u32)>,
    stopped_early: Option<String>,
    /// Periods per (tid, where they struck, stack id).
    by_stack: HashMap<(u32, Struck, u32), u64>,
    /// Skipped and missed periods, and names, per thread.
    skipped: HashMap<u32, u64>,
    missed: HashMap<u32, u64>,
    names: HashMap<u32, String>,
    /// The stacks the profile may name, for the index file's marks.
    stack_use: StackUse,
}

/// The event classes a profile reads whatever an index file says.
const PROFILE_CLASSES: u16 = classes::META | classes::SAMPLE;

impl ProfileAnalysis {
    pub fn new(options: ProfileOptions) -> Self {
        ProfileAnalysis {
            options,
            facts: Facts::default(),
            start: None,
            stopped_early: None,
            by_stack: HashMap::new(),
            skipped: HashMap::new(),
            missed: HashMap::new(),
            names: HashMap::new(),
            stack_use: StackUse::default(),
        }
    }
}

impl crate::pass::Pass for ProfileAnalysis {
    type Report = Result<ProfileReport, ProfileError>;

    fn observe(&mut self, m: &MergedEvent) {
        self.facts.observe(m.time, &m.event);
        self.stack_use.define(m.chunk, &m.event);
        if crate::event_class::class_of(&m.event) & PROFILE_CLASSES != 0 {
            self.stack_use.uses(&m.event);
        }
        match &m.event {
            Event::ProfileStart { hz, signal, .. } => {
                self.start.get_or_insert((*hz, *signal));
            }
            Event::Sample { stack, periods, .. } => {
                *self
                    .by_stack
                    .entry((m.tid, Struck::Program, *stack))
                    .or_default() += u64::from(*periods);
            }
            Event::AgentSamples { stack, periods, .. } => {
                *self
                    .by_stack
                    .entry((m.tid, Struck::Agent, *stack))
                    .or_default() += u64::from(*periods);
            }
            Event::SamplesSkipped { periods, .. } => {
                *self.skipped.entry(m.tid).or_default() += periods;
            }
            Event::SamplesMissed { periods, .. } => {
                *self.missed.entry(m.tid).or_default() += periods;
            }
            Event::ProfileStop { time, reason } => {
                self.stopped_early = Some(match reason {
                    ProfileStopReason::SignalTaken => format!(
                        "the program installed a handler for the sampling signal at {:.3} s; later CPU time is not sampled",
                        *time as f64 / 1e9
                    ),
                });
            }
            Event::ThreadName { tid, name } => {
                self.names.insert(*tid, name.clone());
            }
            _ => {}
        }
    }

    fn needs(&self, chunk: ChunkSummary) -> bool {
        chunk.holds(PROFILE_CLASSES) || chunk.marked(marks::SAMPLE_STACKS)
    }
    fn skipped(&mut self, chunk: &ChunkEntry, start: u64) {
        self.facts.skipped_chunk(chunk, start);
    }
    fn learned(&self) -> Learned {
        Learned {
            known: marks::SAMPLE_STACKS,
            marks: self.stack_use.marks(marks::SAMPLE_STACKS),
            lock_heap: Vec::new(),
        }
    }
    fn finish(
        self,
        index: &TraceIndex,
        stopped: ReadStatus,
    ) -> Result<Result<ProfileReport, ProfileError>, TraceError> {
        let ProfileAnalysis {
            options,
            facts,
            start,
            stopped_early,
            by_stack,
            skipped,
            missed,
            names,
            stack_use: _,
        } = self;
        let thread = options.thread;
        Ok((|| {
            let Some((rate_hz, signal)) = start else {
                return Err(ProfileError::NotProfiled);
            };

            // Symbolize each distinct stack once.
            let mut symbolizer = facts.symbolizer();
            let mut keys: HashMap<(Struck, u32), Vec<FunctionKey>> = HashMap::new();
            let mut exported: HashMap<(Struck, u32), Vec<FrameReport>> = HashMap::new();
            let mut folded_names: HashMap<(Struck, u32), String> = HashMap::new();
            let mut stacks: Vec<(Struck, u32)> =
                by_stack.keys().map(|&(_, s, id)| (s, id)).collect();
            stacks.sort_unstable();
            stacks.dedup();
            for (struck, id) in stacks {
                // A sample's frame 0 is the interrupted instruction; the stack of a
                // call the agent served holds return addresses (an allocation's),
                // under the agent's own pseudo-function.
                let (frames, mut k) = match struck {
                    Struck::Program => (symbolizer.sample_stack(&facts.stacks, id), Vec::new()),
                    Struck::Agent => (
                        symbolizer.stack(&facts.stacks, id),
                        vec![FunctionKey {
                            function: AGENT_FUNCTION.to_string(),
                            file: None,
                            module: None,
                        }],
                    ),
                };
                // The agent's own frames (its pthread_create wrapper under every
                // thread's start routine) are not the program's.
                k.extend(
                    frames
                        .iter()
                        .filter(|f| !(is_agent_frame(f) || options.no_inline && f.inlined))
                        .map(FunctionKey::of),
                );
                let mut kept: Vec<FrameReport> = frames
                    .iter()
                    .filter(|f| !(is_agent_frame(f) || options.no_inline && f.inlined))
                    .cloned()
                    .collect();
                if struck == Struck::Agent {
                    kept.insert(
                        0,
                        FrameReport {
                            address: 0,
                            function: Some(AGENT_FUNCTION.to_string()),
                            file: None,
                            line: None,
                            inlined: false,
                            module: None,
                            allocation_wrapper: false,
                        },
                    );
                }
                exported.insert((struck, id), kept);
                let line: Vec<&str> = k.iter().rev().map(|f| f.function.as_str()).collect();
                folded_names.insert((struck, id), line.join(";"));
                keys.insert((struck, id), k);
            }

            let mut all = Counts::default();
            let mut per_thread: HashMap<u32, (u64, Counts)> = HashMap::new();
            let mut folded: HashMap<&str, u64> = HashMap::new();
            let mut sampled_stacks = Vec::new();
            let mut samples = 0;
            let mut samples_in_agent = 0;
            for (&(tid, struck, id), &periods) in &by_stack {
                let frames = keys.get(&(struck, id)).map(Vec::as_slice).unwrap_or(&[]);
                let t = per_thread.entry(tid).or_default();
                t.0 += periods;
                t.1.add(frames, periods);
                if thread.is_none_or(|want| want == tid) {
                    samples += periods;
                    if struck == Struck::Agent {
                        samples_in_agent += periods;
                    }
                    all.add(frames, periods);
                    sampled_stacks.push(SampledStack {
                        tid,
                        frames: exported.get(&(struck, id)).cloned().unwrap_or_default(),
                        samples: periods,
                    });
                    if let Some(line) = folded_names.get(&(struck, id)).filter(|l| !l.is_empty()) {
                        *folded.entry(line.as_str()).or_default() += periods;
                    }
                }
            }
            let known = |tid: u32| {
                per_thread.contains_key(&tid)
                    || skipped.contains_key(&tid)
                    || missed.contains_key(&tid)
            };
            if let Some(tid) = thread.filter(|&t| !known(t)) {
                let mut tids: Vec<u32> = per_thread.keys().copied().collect();
                tids.sort_unstable();
                let known = tids
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(ProfileError::NoSuchThread {
                    tid,
                    known: if known.is_empty() {
                        "none".to_string()
                    } else {
                        known
                    },
                });
            }
            let all_samples: u64 = per_thread.values().map(|t| t.0).sum();
            let mut tids: HashSet<u32> = per_thread.keys().copied().collect();
            tids.extend(
                skipped
                    .keys()
                    .chain(missed.keys())
                    .copied()
                    .filter(|&t| t != 0),
            );
            let mut threads: Vec<ThreadProfile> = tids
                .into_iter()
                .map(|tid| {
                    let (n, counts) = per_thread.remove(&tid).unwrap_or_default();
                    ThreadProfile {
                        tid,
                        name: names.get(&tid).cloned(),
                        samples: n,
                        skipped: skipped.get(&tid).copied().unwrap_or(0),
                        missed: missed.get(&tid).copied().unwrap_or(0),
                        percent: if all_samples == 0 {
                            0.0
                        } else {
                            (n as f64 * 1000.0 / all_samples as f64).round() / 10.0
                        },
                        functions: counts.table(n),
                    }
                })
                .collect();
            threads.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.tid.cmp(&b.tid)));
            let in_selection = |counts: &HashMap<u32, u64>| match thread {
                Some(tid) => counts.get(&tid).copied().unwrap_or(0),
                None => counts.values().sum(),
            };
            let samples_skipped = in_selection(&skipped);
            let samples_missed = in_selection(&missed);
            let mut folded: Vec<(String, u64)> = folded
                .into_iter()
                .map(|(l, n)| (l.to_string(), n))
                .collect();
            folded.sort();

            Ok(ProfileReport {
                process: facts.process_report(),
                rate_hz,
                signal,
                thread_filter: thread,
                samples,
                cpu_seconds: samples as f64 / f64::from(rate_hz.max(1)),
                samples_in_agent,
                samples_skipped,
                samples_missed,
                stopped_early,
                functions: all.table(samples),
                threads,
                warnings: symbolizer.warnings(),
                events_lost: facts.events_lost(),
                trace: facts.trace_status(index, stopped),
                folded,
                stacks: {
                    sampled_stacks
                        .sort_by(|a, b| b.samples.cmp(&a.samples).then(a.tid.cmp(&b.tid)));
                    sampled_stacks
                },
            })
        })())
    }
}

/// File name of the agent library, whose frames are left out of profiles.
const AGENT_LIBRARY: &str = "libtrapline_agent.so";

/// Where a stack's samples struck: in the program, or inside the agent
/// serving the program's call whose stack it is (`AgentSamples`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Struck {
    Program,
    Agent,
}

/// The pseudo-function of the agent's time inside the program's calls.
pub const AGENT_FUNCTION: &str = "[trapline agent]";

fn is_agent_frame(f: &FrameReport) -> bool {
    f.module
        .as_deref()
        .is_some_and(|m| m.rsplit('/').next() == Some(AGENT_LIBRARY))
}

/// The folded stacks, one line per distinct stack: `root;...;leaf COUNT`.
pub fn render_folded(r: &ProfileReport) -> String {
    let mut out = String::new();
    for (line, n) in &r.folded {
        writeln!(out, "{line} {n}").unwrap();
    }
    out
}

fn function_text(f: &FunctionProfile) -> String {
    match &f.file {
        Some(file) => format!(
            "{} ({})",
            f.function,
            file.rsplit('/').next().unwrap_or(file)
        ),
        None => f.function.clone(),
    }
}

/// Renders the report as text.
pub fn render_text(r: &ProfileReport) -> String {
    let p = prefix(&r.process);
    let mut out = String::new();
    writeln!(out, "{p}trapline profile: CPU samples").unwrap();
    writeln!(out, "{p}Command: {}", command_text(&r.process)).unwrap();
    writeln!(
        out,
        "{p}Sampling: {} Hz of each thread's own CPU time (signal {})",
        r.rate_hz, r.signal
    )
    .unwrap();
    let scope = match r.thread_filter {
        Some(tid) => format!(" of thread {tid}"),
        None => String::new(),
    };
    writeln!(
        out,
        "{p}Samples{scope}: {} ({:.3} s of CPU)",
        thousands(r.samples),
        r.cpu_seconds
    )
    .unwrap();
    if r.samples_in_agent > 0 {
        writeln!(
            out,
            "{p}In the agent: {} of the samples struck inside trapline's agent while it served the program's calls; they are charged to those calls, under {AGENT_FUNCTION}",
            thousands(r.samples_in_agent)
        )
        .unwrap();
    }
    if r.samples_skipped > 0 {
        writeln!(
            out,
            "{p}Skipped: {} samples struck in trapline's agent outside the program's calls, or got no stack, and are not attributed",
            thousands(r.samples_skipped)
        )
        .unwrap();
    }
    // A thread's CPU after its last tick check is normal; say more only when it matters.
    if r.samples_missed * 100 > r.samples {
        writeln!(
            out,
            "{p}Missed: {} sampling periods of CPU time got no timer signal (the kernel checks CPU timers at ticks that find the thread running; a busy machine can let a thread run between them); shares are of the samples taken",
            thousands(r.samples_missed)
        )
        .unwrap();
    }
    if let Some(why) = &r.stopped_early {
        writeln!(out, "{p}WARNING: sampling stopped early: {why}").unwrap();
    }
    writeln!(out, "{p}").unwrap();
    writeln!(
        out,
        "{p}FUNCTIONS (self: in the function itself; total: with its callees):"
    )
    .unwrap();
    writeln!(
        out,
        "{p}  {:>10} {:>6}  {:>10} {:>6}  function",
        "self", "%", "total", "%"
    )
    .unwrap();
    for f in r.functions.iter().take(TEXT_FUNCTIONS) {
        writeln!(
            out,
            "{p}  {:>10} {:>5.1}%  {:>10} {:>5.1}%  {}",
            thousands(f.self_samples),
            f.self_percent,
            thousands(f.total),
            f.total_percent,
            function_text(f)
        )
        .unwrap();
    }
    if r.functions.len() > TEXT_FUNCTIONS {
        writeln!(
            out,
            "{p}  ... {} more functions (--format json lists all)",
            r.functions.len() - TEXT_FUNCTIONS
        )
        .unwrap();
    }
    if r.functions.is_empty() {
        writeln!(
            out,
            "{p}  (no samples: the program used less CPU than one sampling period)"
        )
        .unwrap();
    }
    writeln!(out, "{p}").unwrap();
    writeln!(out, "{p}THREADS:").unwrap();
    for t in &r.threads {
        let name = t.name.as_deref().unwrap_or("?");
        let skipped = if t.skipped > 0 {
            format!(", {} skipped", thousands(t.skipped))
        } else {
            String::new()
        };
        writeln!(
            out,
            "{p}  tid {} \"{name}\": {} samples ({:.1}%){skipped}",
            t.tid,
            thousands(t.samples),
            t.percent
        )
        .unwrap();
        for f in t.functions.iter().take(TEXT_THREAD_FUNCTIONS) {
            writeln!(
                out,
                "{p}      {:>5.1}% self {:>5.1}% total  {}",
                f.self_percent,
                f.total_percent,
                function_text(f)
            )
            .unwrap();
        }
    }
    warnings_text(&mut out, &p, &r.warnings);
    footer_text(&mut out, &p, r.events_lost, &r.trace);
    out
}
