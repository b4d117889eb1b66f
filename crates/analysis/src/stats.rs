//! Stats: allocation calls per function, bytes allocated, peak heap and when
//! it happened, allocation rate, and what the trace itself costs.
//!
//! One streaming pass in global time order (see [`crate::index`] for how the
//! chunks of the threads are merged with bounded memory). The live-bytes
//! replay keeps one entry per live block (address → size), so its memory is
//! bounded by the traced program's live heap, not by the trace's length.

use crate::index_file::TraceInput;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::io::{Read, Seek};

use serde::Serialize;
use trapline_trace::{AllocFn, Event, RunTotals, TraceError};

use crate::index::{MergedEvent, ReadStatus, TraceIndex};
use crate::replay::{Block, HeapReplay, LiveValue};
use crate::report::{
    command_text, footer_text, prefix, seconds, thousands, BytesBlocks, Facts, ProcessReport,
    TraceStatus,
};
use crate::sites::{SiteTotals, SiteView, SiteViews};
use crate::verdicts::SkippedScan;

/// The recorders a run had on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Recorded {
    /// Allocations and releases.
    pub memory: bool,
    /// Locks, condition waits and joins.
    pub locks: bool,
}

/// The `trapline stats` report (its JSON form is the stable schema).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StatsReport {
    /// The traced process.
    pub process: ProcessReport,
    /// What the run recorded (`trapline run --record`).
    pub recorded: Recorded,
    /// Run time in nanoseconds: the end record's time, or the last recorded
    /// time when the trace has no end record.
    pub duration_ns: u64,
    /// The same in seconds.
    pub duration_seconds: f64,
    /// Calls per allocator function, in the trace format's function order; only functions called.
    pub calls: Vec<FunctionCalls>,
    /// Calls that allocate or resize (malloc, new, realloc, ...).
    pub allocation_calls: u64,
    /// Calls that release (free, delete, ..., including erroneous ones).
    pub release_calls: u64,
    /// Bytes requested by all allocation calls (realloc's new sizes included).
    pub bytes_allocated: u64,
    /// Recorded in production mode (`--production`): the calls are exact,
    /// and the heap figures and sites count the sampled blocks only.
    pub production_mode: bool,
    /// The most bytes live at once.
    pub peak_heap: PeakHeap,
    /// Blocks live at the end of the recorded events (replayed).
    pub live_at_end: BytesBlocks,
    /// The blocks still allocated when the process ended, as the agent's exit
    /// snapshot counted them (after atexit handlers and freeres, and including
    /// blocks a fork child inherited, which no event of its trace allocated);
    /// null when the trace has no exit snapshot (then only `live_at_end` is known).
    pub unfreed_at_exit: Option<BytesBlocks>,
    /// Reachability scans that were due and did not run (their memory would
    /// have passed a limit that ends or fails the program; see `leaks`).
    pub scans_skipped: Vec<SkippedScan>,
    /// `allocation_calls` per second of run time; null for a zero duration.
    pub allocations_per_second: Option<f64>,
    /// Allocation errors detected.
    pub errors: u64,
    /// Allocation calls that failed (format version 7; 0 in older traces),
    /// not counted in `allocation_calls`.
    pub failed_allocations: u64,
    /// Distinct threads that recorded events.
    pub threads: u64,
    /// Threads started by pthread_create while recording, their ends, and the
    /// most threads alive at once (the main thread included).
    pub thread_lifecycle: ThreadLifecycle,
    /// Distinct call stacks recorded.
    pub stacks: u64,
    /// Size of the trace file.
    pub trace_bytes: u64,
    /// Events read from the trace.
    pub events: u64,
    /// `trace_bytes / events`; null without events.
    pub trace_bytes_per_event: Option<f64>,
    /// Events the agent could not record; null when the trace has no end record to tell.
    pub events_lost: Option<u64>,
    /// Allocations passed through unrecorded because the thread was already
    /// inside the agent: mostly the agent's own C library calls (about a
    /// dozen per process is normal), and calls from signal handlers that
    /// interrupted it (see [`crate::LeaksReport::untracked_calls`]). Null
    /// without an end record.
    pub untracked_calls: Option<u64>,
    /// Whether the totals the agent kept itself for `trapline run`'s summary
    /// (allocation and release calls, errors, peak heap) equal this replay's:
    /// null when the trace has none (the agent writes them only when a single
    /// thread allocated; see docs/recording.md, "The agent's totals"). False would be a bug to report.
    pub agent_totals_match: Option<bool>,
    /// Allocation sites ranked four ways (most calls, most temporary
    /// allocations, most live bytes at the peak, most bytes allocated).
    pub sites: SiteViews,
    /// Whether the trace was complete.
    pub trace: TraceStatus,
}

/// Calls of one allocator function.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FunctionCalls {
    /// C or C++ spelling.
    pub function: &'static str,
    /// Number of calls.
    pub calls: u64,
    /// Bytes requested through it (0 for release functions).
    pub bytes: u64,
    /// Calls that failed (NULL for a request of at least a byte, an error
    /// from `posix_memalign`, `std::bad_alloc`); not counted in `calls`.
    pub failed: u64,
}

/// Thread creation and ends, from the thread lifecycle events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ThreadLifecycle {
    /// Threads that started (pthread_create) while the trace was recorded.
    pub started: u64,
    /// Threads that ended (returned, pthread_exit, cancelled) while recorded.
    pub ended: u64,
    /// Most threads alive at once: the main thread plus started minus ended.
    pub peak_alive: u64,
}

/// The highest heap occupancy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PeakHeap {
    /// Live bytes at the peak.
    pub bytes: u64,
    /// Live blocks at the peak.
    pub blocks: u64,
    /// When the peak was first reached, nanoseconds since the start.
    pub time_ns: u64,
    /// The same in seconds.
    pub time_seconds: f64,
}

/// What `trapline run` prints when the program ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSummary {
    pub allocation_calls: u64,
    pub release_calls: u64,
    pub peak_heap_bytes: u64,
    pub peak_heap_time_ns: u64,
    /// The exit snapshot's totals, or without one the blocks live at the end
    /// of a replay (`unfreed_replayed`: the process did not finish).
    pub unfreed: BytesBlocks,
    pub unfreed_replayed: bool,
    pub errors: u64,
    /// Allocation calls that failed.
    pub failed_allocations: u64,
    /// None without an end record.
    pub events_lost: Option<u64>,
    /// What the reader has to say about a damaged or incomplete trace.
    pub warnings: Vec<String>,
    /// The program's allocator, as the trace names it (`warnings` has the
    /// lines about it too).
    pub allocators: Allocators,
    /// The process: its pid, command and how it ended (an exec'd image's
    /// `exit` says so; `trapline run` then follows the pid to its next trace).
    pub process: ProcessReport,
}

impl RunSummary {
    /// The summary of a full `stats` pass.
    pub fn from_stats(s: &StatsReport) -> Self {
        RunSummary {
            allocation_calls: s.allocation_calls,
            release_calls: s.release_calls,
            peak_heap_bytes: s.peak_heap.bytes,
            peak_heap_time_ns: s.peak_heap.time_ns,
            unfreed: s.unfreed_at_exit.unwrap_or(s.live_at_end),
            unfreed_replayed: s.unfreed_at_exit.is_none(),
            errors: s.errors,
            failed_allocations: s.failed_allocations,
            events_lost: s.events_lost,
            warnings: skipped_exit_scan(&s.scans_skipped)
                .into_iter()
                .chain(crate::report::status_warnings(&s.trace))
                .collect(),
            allocators: Allocators {
                shadowed_by: s.trace.allocator_shadowed_by.clone(),
                library: s.trace.allocator_library.clone(),
            },
            process: s.process.clone(),
        }
    }
}

/// The summary's line about an exit scan that did not run.
fn skipped_exit_scan(skipped: &[SkippedScan]) -> Option<String> {
    let s = skipped.iter().find(|s| s.trigger == "exit")?;
    Some(format!(
        "WARNING: {}; `trapline leaks` shows the last scan that ran, or without one the \
         blocks unfreed at exit, unjudged",
        s.text
    ))
}

/// Most chunks read back from the end of the file looking for the records
/// the agent writes last (the end record, its totals, the snapshot's end).
const SUMMARY_TAIL_CHUNKS: usize = 64;

/// The end-of-run summary from the records the agent writes last: its own
/// totals (`RunTotals`), the exit snapshot's totals and the end record. These
/// sit in the last chunks of a complete trace, so nothing else is decoded.
/// `None` when any of them is missing (the agent writes totals only when they
/// equal what [`analyze`] computes: see the agent's totals.rs), when the trace
/// is damaged or lost events; then [`analyze`] is the way.
pub fn summary_from_tail<R: Read + Seek>(input: &mut R) -> Result<Option<RunSummary>, TraceError> {
    let index = TraceIndex::build(input)?;
    if index.stopped.is_some() || !index.damaged.is_empty() {
        return Ok(None);
    }
    let (mut totals, mut end_lost, mut unfreed, mut exit) = (None, None, None, None);
    let mut skipped = Vec::new();
    let mut production = crate::report::ProductionFacts::default();
    for entry in index.chunks.iter().rev().take(SUMMARY_TAIL_CHUNKS) {
        let chunk = index.read_chunk(input, entry)?;
        for ev in chunk.events() {
            match ev.map_err(|e| TraceError::Corrupt {
                offset: entry.offset,
                what: format!("an event of the chunk does not decode: {e}"),
            })? {
                Event::RunTotals(t) => totals = Some(t),
                // Production mode: every call, where the totals count the
                // sampled ones.
                Event::CallCounts {
                    func, calls, bytes, ..
                } => {
                    production.calls.insert(func, (calls, bytes));
                }
                Event::End {
                    counters, exit: e, ..
                } => {
                    exit = Some(crate::report::ExitReport::from(e));
                    let in_file = index
                        .chunks
                        .iter()
                        .map(|c| u64::from(c.header.events))
                        .sum();
                    end_lost = Some(crate::report::events_lost(&counters, in_file));
                }
                Event::SnapshotEnd { blocks, bytes } => {
                    unfreed = Some(BytesBlocks { bytes, blocks })
                }
                ev @ Event::ScanSkipped { .. } => skipped.extend(SkippedScan::from_event(&ev)),
                _ => {}
            }
        }
        if totals.is_some() && end_lost.is_some() && unfreed.is_some() {
            break;
        }
    }
    let (Some(t), Some(0), Some(unfreed)) = (totals, end_lost, unfreed) else {
        return Ok(None);
    };
    let (allocators, mut process) = first_chunk_facts(input, &index)?;
    process.exit = exit;
    let warnings = skipped_exit_scan(&skipped)
        .into_iter()
        .chain(allocators.warnings())
        .collect();
    let (allocation_calls, release_calls) = if production.calls.is_empty() {
        (t.allocation_calls, t.release_calls)
    } else {
        let r = production.report();
        (r.allocation_calls, r.release_calls)
    };
    Ok(Some(RunSummary {
        allocation_calls,
        release_calls,
        peak_heap_bytes: t.peak_bytes,
        peak_heap_time_ns: t.peak_time,
        unfreed,
        unfreed_replayed: false,
        errors: t.errors,
        failed_allocations: t.failed_allocations,
        events_lost: Some(0),
        warnings,
        allocators,
        process,
    }))
}

/// What the trace says about the program's allocator, read from the agent's
/// first chunk only: see `TraceStatus::allocator_shadowed_by` and
/// `TraceStatus::allocator_library`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allocators {
    pub shadowed_by: Option<String>,
    pub library: Option<String>,
}

impl Allocators {
    /// The lines text reports print about them.
    pub fn warnings(&self) -> Vec<String> {
        let shadowed = self.shadowed_by.as_deref();
        let library = self.library.as_deref();
        shadowed
            .map(crate::report::shadowed_allocator_warning)
            .into_iter()
            .chain(library.map(crate::report::allocator_library_note))
            .collect()
    }
}

/// What the agent's first chunk says: the program's allocator and the
/// process (without its exit, which the end record has).
fn first_chunk_facts<R: Read + Seek>(
    input: &mut R,
    index: &TraceIndex,
) -> Result<(Allocators, ProcessReport), TraceError> {
    // The process record comes first, then the recording's settings.
    let (mut allocators, mut process) = (Allocators::default(), ProcessReport::default());
    let Some(entry) = index.chunks.iter().find(|c| c.header.tid == 0) else {
        return Ok((allocators, process));
    };
    let chunk = index.read_chunk(input, entry)?;
    for ev in chunk.events().flatten() {
        match ev {
            Event::Process(p) => process = ProcessReport::from(&p),
            Event::Recording {
                allocator_shadowed_by,
                allocator_library,
                ..
            } => {
                allocators = Allocators {
                    shadowed_by: allocator_shadowed_by,
                    library: allocator_library,
                };
                break;
            }
            _ => {}
        }
    }
    Ok((allocators, process))
}

/// Analyses a trace. Fails only when the input is not a readable trace at all.
pub fn analyze<R: TraceInput>(input: &mut R) -> Result<StatsReport, TraceError> {
    analyze_top(input, crate::sites::LISTED)
}

/// [`analyze`] with at most `listed` sites in each site view.
pub fn analyze_top<R: TraceInput>(input: &mut R, listed: usize) -> Result<StatsReport, TraceError> {
    analyze_keeping::<Block, R>(input, Some(listed))
}

/// [`analyze`] without the site views (`sites` empty): the replay keeps 8
/// bytes per live block instead of 16, for `trapline run`'s summary of a
/// trace without the agent's totals, which may be read in the memory
/// cgroup that just killed the program.
pub fn analyze_totals<R: TraceInput>(input: &mut R) -> Result<StatsReport, TraceError> {
    analyze_keeping::<u64, R>(input, None)
}

/// `sites_listed`: the sites per view, None for no site views at all.
fn analyze_keeping<V: LiveValue, R: TraceInput>(
    input: &mut R,
    sites_listed: Option<usize>,
) -> Result<StatsReport, TraceError> {
    let mut report = crate::pass::run(input, |_| StatsAnalysis::<V>::new(sites_listed))?;
    report.name_sites(input)?;
    Ok(report)
}

impl StatsReport {
    /// Names the stacks of the site views, read from `input` (the trace the
    /// report is of).
    pub fn name_sites<R: Read + Seek>(&mut self, input: &mut R) -> Result<(), TraceError> {
        let named = crate::report::symbolized_stacks(input, &self.sites.stack_ids())?;
        self.sites.name(&named);
        Ok(())
    }
}

/// Stats as a [`crate::pass::Pass`]. Its report's sites are not named yet:
/// [`StatsReport::name_sites`] reads their stacks from the trace, which
/// keeps the frames of the other stacks out of memory.
pub(crate) struct StatsAnalysis<V: LiveValue> {
    sites_listed: Option<usize>,
    facts: Facts,
    /// (calls, bytes) per function, by format value.
    calls: [(u64, u64); AllocFn::ALL.len() + 1],
    failed: [u64; AllocFn::ALL.len() + 1],
    failed_allocations: u64,
    heap: HeapReplay<V>,
    sites: SiteTotals,
    peak: PeakHeap,
    allocation_calls: u64,
    release_calls: u64,
    bytes_allocated: u64,
    errors: u64,
    stacks: HashSet<u32>,
    tids: HashSet<u32>,
    last_tid: u32,
    lifecycle: ThreadLifecycle,
    agent_totals: Option<RunTotals>,
    scans_skipped: Vec<SkippedScan>,
}

impl<V: LiveValue> StatsAnalysis<V> {
    /// `sites_listed`: the sites per view, None for no site views at all.
    pub(crate) fn new(sites_listed: Option<usize>) -> Self {
        StatsAnalysis {
            sites_listed,
            facts: Facts::default(),
            calls: [(0, 0); AllocFn::ALL.len() + 1],
            failed: [0; AllocFn::ALL.len() + 1],
            failed_allocations: 0,
            heap: HeapReplay::default(),
            sites: SiteTotals::default(),
            peak: PeakHeap::default(),
            allocation_calls: 0,
            release_calls: 0,
            bytes_allocated: 0,
            errors: 0,
            stacks: HashSet::new(),
            tids: HashSet::new(),
            last_tid: 0,
            lifecycle: ThreadLifecycle {
                peak_alive: 1,
                ..Default::default()
            },
            agent_totals: None,
            scans_skipped: Vec::new(),
        }
    }

    /// The heap replay, which a pass beside this one may read.
    pub(crate) fn heap(&self) -> &HeapReplay<V> {
        &self.heap
    }

    fn count(&mut self, f: AllocFn, bytes: u64) {
        let c = &mut self.calls[f as usize];
        c.0 += 1;
        c.1 += bytes;
    }
}

impl<V: LiveValue> crate::pass::Pass for StatsAnalysis<V> {
    type Report = StatsReport;

    fn observe(&mut self, m: &MergedEvent) {
        // Only the ids matter here: keep the frames out of the facts.
        if let Event::StackDef { id, .. } = &m.event {
            self.stacks.insert(*id);
            self.facts.events += 1;
            return;
        }
        if let Event::RunTotals(t) = &m.event {
            self.agent_totals = Some(t.clone());
        }
        self.facts.observe(m.time, &m.event);
        if m.tid != 0 && m.tid != self.last_tid {
            self.tids.insert(m.tid);
            self.last_tid = m.tid;
        }
        if self.sites_listed.is_some() {
            self.sites.replay(&mut self.heap, m.tid, &m.event);
        } else {
            self.heap.apply(&m.event);
        }
        match &m.event {
            Event::Alloc { size, func, .. } | Event::Realloc { size, func, .. } => {
                self.count(*func, *size);
                self.allocation_calls += 1;
                self.bytes_allocated += size;
            }
            Event::Free { func, .. } => {
                self.count(*func, 0);
                self.release_calls += 1;
            }
            Event::AllocFailed { func, .. } => {
                self.failed[*func as usize] += 1;
                self.failed_allocations += 1;
            }
            Event::Error { kind, func, .. } => {
                self.errors += 1;
                // A mismatch also has its Free event; other erroneous calls
                // appear only here.
                if !kind.performed() {
                    self.count(*func, 0);
                    if func.is_release() {
                        self.release_calls += 1;
                    } else {
                        self.allocation_calls += 1;
                    }
                }
            }
            Event::ThreadStart { .. } => {
                let life = &mut self.lifecycle;
                life.started += 1;
                let alive = (1 + life.started).saturating_sub(life.ended);
                life.peak_alive = life.peak_alive.max(alive);
            }
            Event::ThreadEnd { .. } => self.lifecycle.ended += 1,
            ev @ Event::ScanSkipped { .. } => {
                self.scans_skipped.extend(SkippedScan::from_event(ev))
            }
            _ => {}
        }
        if self.heap.live_bytes > self.peak.bytes {
            self.peak = PeakHeap {
                bytes: self.heap.live_bytes,
                blocks: self.heap.live.len() as u64,
                time_ns: m.time,
                time_seconds: seconds(m.time),
            };
        }
    }

    fn finish(self, index: &TraceIndex, stopped: ReadStatus) -> Result<StatsReport, TraceError> {
        let StatsAnalysis {
            sites_listed,
            facts,
            calls,
            failed,
            failed_allocations,
            heap,
            sites,
            peak,
            allocation_calls,
            release_calls,
            bytes_allocated,
            errors,
            stacks,
            tids,
            lifecycle,
            agent_totals,
            scans_skipped,
            ..
        } = self;
        let site_views = sites.views_top(sites_listed.unwrap_or(0));
        let duration_ns = facts.end.as_ref().map_or(facts.last_time, |(t, _, _)| *t);
        // Production mode counted every call; the trace holds the sampled.
        let exact = facts.production.as_ref().map(|p| (p.report(), &p.calls));
        let count = |f: AllocFn| match &exact {
            Some((_, by_func)) => by_func.get(&f).copied().unwrap_or((0, 0)),
            None => calls[f as usize],
        };
        let calls_listed: Vec<FunctionCalls> = AllocFn::ALL
            .iter()
            .filter(|&&f| count(f).0 > 0 || failed[f as usize] > 0)
            .map(|&f| FunctionCalls {
                function: f.name(),
                calls: count(f).0,
                bytes: count(f).1,
                failed: failed[f as usize],
            })
            .collect();
        let (all_allocation_calls, all_release_calls, all_bytes) = match &exact {
            Some((r, _)) => (r.allocation_calls, r.release_calls, r.bytes_allocated),
            None => (allocation_calls, release_calls, bytes_allocated),
        };
        let events = facts.events;
        Ok(StatsReport {
            recorded: Recorded {
                memory: !facts.memory_off,
                locks: !facts.locks_off,
            },
            process: facts.process_report(),
            duration_ns,
            duration_seconds: seconds(duration_ns),
            calls: calls_listed,
            allocation_calls: all_allocation_calls,
            release_calls: all_release_calls,
            bytes_allocated: all_bytes,
            production_mode: exact.is_some(),
            peak_heap: peak,
            live_at_end: BytesBlocks {
                bytes: heap.live_bytes,
                blocks: heap.live.len() as u64,
            },
            unfreed_at_exit: facts.exit_snapshot_totals(),
            scans_skipped,
            allocations_per_second: (duration_ns > 0)
                .then(|| all_allocation_calls as f64 / seconds(duration_ns)),
            errors,
            failed_allocations,
            threads: tids.len() as u64,
            thread_lifecycle: lifecycle,
            stacks: stacks.len() as u64,
            trace_bytes: index.file_len,
            events,
            trace_bytes_per_event: (events > 0).then(|| index.file_len as f64 / events as f64),
            events_lost: facts.events_lost(),
            untracked_calls: facts.end.as_ref().map(|(_, _, c)| c.untracked_calls),
            sites: site_views,
            agent_totals_match: agent_totals.map(|t| {
                t == RunTotals {
                    allocation_calls,
                    release_calls,
                    errors,
                    failed_allocations,
                    peak_bytes: peak.bytes,
                    peak_time: peak.time_ns,
                }
            }),
            trace: facts.trace_status(index, stopped),
        })
    }
}

fn float(v: f64, decimals: usize) -> String {
    let s = format!("{v:.decimals$}");
    let (int, frac) = s.split_once('.').unwrap_or((&s, ""));
    let int = thousands(int.parse().unwrap_or(0));
    if frac.is_empty() {
        int
    } else {
        format!("{int}.{frac}")
    }
}

/// Renders the report as text.
pub fn render_text(r: &StatsReport) -> String {
    let p = prefix(&r.process);
    let mut out = String::new();
    writeln!(out, "{p}trapline stats: allocation statistics").unwrap();
    writeln!(out, "{p}Command: {}", command_text(&r.process)).unwrap();
    if !r.recorded.memory || !r.recorded.locks {
        let off: Vec<&str> = [
            (r.recorded.memory, "allocations"),
            (r.recorded.locks, "locks"),
        ]
        .into_iter()
        .filter_map(|(on, what)| (!on).then_some(what))
        .collect();
        writeln!(
            out,
            "{p}Not recorded ({}): {}",
            crate::report::recording_command(r.trace.attached.is_some()),
            off.join(", ")
        )
        .unwrap();
    }
    let exit = r
        .process
        .exit
        .map_or("unknown (the process did not finish)".to_string(), |e| {
            e.describe()
        });
    writeln!(out, "{p}Exit: {exit}").unwrap();
    writeln!(out, "{p}Duration: {} s", float(r.duration_seconds, 3)).unwrap();
    let life = &r.thread_lifecycle;
    writeln!(
        out,
        "{p}Threads: {} recorded events; {} started and {} ended while recorded, at most {} alive at once",
        thousands(r.threads),
        thousands(life.started),
        thousands(life.ended),
        thousands(life.peak_alive)
    )
    .unwrap();
    writeln!(out, "{p}").unwrap();
    writeln!(out, "{p}CALLS:").unwrap();
    let width = r.calls.iter().map(|c| c.function.len()).max().unwrap_or(0);
    for c in &r.calls {
        let mut bytes = if c.bytes > 0 {
            format!("  {} bytes", thousands(c.bytes))
        } else {
            String::new()
        };
        if c.failed > 0 {
            bytes += &format!("  ({} failed)", thousands(c.failed));
        }
        writeln!(
            out,
            "{p}  {:<width$}  {:>15}{bytes}",
            c.function,
            thousands(c.calls)
        )
        .unwrap();
    }
    if r.calls.is_empty() {
        writeln!(out, "{p}  (no allocator calls recorded)").unwrap();
    }
    writeln!(out, "{p}").unwrap();
    writeln!(
        out,
        "{p}  allocation calls: {}, release calls: {}, {} bytes allocated",
        thousands(r.allocation_calls),
        thousands(r.release_calls),
        thousands(r.bytes_allocated)
    )
    .unwrap();
    if r.production_mode {
        writeln!(
            out,
            "{p}  PRODUCTION MODE: the calls above are exact; the heap figures and sites below count the sampled blocks only (`trapline leaks` estimates every stack's)"
        )
        .unwrap();
    }
    writeln!(
        out,
        "{p}  peak heap: {} bytes in {} blocks at {} s",
        thousands(r.peak_heap.bytes),
        thousands(r.peak_heap.blocks),
        float(r.peak_heap.time_seconds, 6)
    )
    .unwrap();
    writeln!(
        out,
        "{p}  live at end: {} bytes in {} blocks",
        thousands(r.live_at_end.bytes),
        thousands(r.live_at_end.blocks)
    )
    .unwrap();
    if let Some(u) = r.unfreed_at_exit {
        writeln!(
            out,
            "{p}  unfreed at exit: {} bytes in {} blocks (exit snapshot)",
            thousands(u.bytes),
            thousands(u.blocks)
        )
        .unwrap();
    }
    for skipped in &r.scans_skipped {
        writeln!(out, "{p}  {}", skipped.text).unwrap();
    }
    let rate = r
        .allocations_per_second
        .map_or("n/a".to_string(), |v| float(v, 1));
    writeln!(out, "{p}  allocations per second: {rate}").unwrap();
    writeln!(out, "{p}  allocation errors: {}", thousands(r.errors)).unwrap();
    if r.failed_allocations > 0 {
        writeln!(
            out,
            "{p}  failed allocation calls: {} (out of memory, or a bad alignment; see `trapline leaks` for where)",
            thousands(r.failed_allocations)
        )
        .unwrap();
    }
    writeln!(out, "{p}  distinct stacks: {}", thousands(r.stacks)).unwrap();
    writeln!(out, "{p}").unwrap();
    sites_text(&mut out, &p, &r.sites);
    let per_event = r
        .trace_bytes_per_event
        .map_or("n/a".to_string(), |v| float(v, 2));
    writeln!(
        out,
        "{p}TRACE: {} bytes, {} events, {per_event} bytes per event",
        thousands(r.trace_bytes),
        thousands(r.events)
    )
    .unwrap();
    if let Some(n) = r.untracked_calls.filter(|&n| n > 0) {
        writeln!(out, "{p}untracked calls: {}", thousands(n)).unwrap();
    }
    footer_text(&mut out, &p, r.events_lost, &r.trace);
    out
}

/// The four rankings of allocation sites, each site named by its first
/// frame with a known function (the allocating call's caller).
/// A view's title, its sites, and how a site's value reads.
type ViewText<'a> = (&'a str, &'a [SiteView], fn(&SiteView) -> String);

fn sites_text(out: &mut String, p: &str, v: &SiteViews) {
    let views: [ViewText; 4] = [
        ("most allocation calls", &v.most_calls, |s| {
            format!("{} calls", thousands(s.calls))
        }),
        ("most temporary allocations", &v.most_temporary, |s| {
            format!("{} of {} calls", thousands(s.temporary), thousands(s.calls))
        }),
        ("most bytes live at the peak", &v.peak_contribution, |s| {
            format!("{} bytes", thousands(s.peak_bytes))
        }),
        ("most bytes allocated", &v.most_allocated, |s| {
            format!("{} bytes", thousands(s.bytes_allocated))
        }),
    ];
    for (title, sites, value) in views {
        if sites.is_empty() {
            continue;
        }
        writeln!(out, "{p}SITES, {title}:").unwrap();
        for s in sites {
            writeln!(out, "{p}  {:>24}  {}", value(s), site_name(s)).unwrap();
        }
        writeln!(out, "{p}").unwrap();
    }
}

/// A site by its first two named frames: "f (file:line) <- g (file:line)".
fn site_name(s: &SiteView) -> String {
    crate::report::stack_place(&s.stack, " <- ").unwrap_or_else(|| format!("stack {}", s.stack_id))
}
