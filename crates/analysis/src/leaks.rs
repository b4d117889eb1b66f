//! Leaks: the blocks still allocated when the process ended, grouped into loss
//! records by allocation stack, and the allocation errors the agent detected.
//!
//! The source of truth for what was still allocated is the agent's exit
//! snapshot (taken after atexit handlers and libc's freeres). A trace without
//! one (the process was killed by SIGKILL, or the trace is truncated or
//! corrupt) falls back to replaying `Alloc`, `Free` and `Realloc` in global
//! time order (see [`crate::index`]) to find the blocks live at the end of what
//! was recorded; the report then says that the process did not finish.

use crate::index_file::TraceInput;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hasher};

use serde::Serialize;
use trapline_trace::{AllocFn, ErrorKind, Event, TraceError, Verdict};

use crate::growth::{Growth, GrowthTracker};
use crate::index::{MergedEvent, ReadStatus, TraceIndex};
use crate::pass::Pass;
use crate::replay::{Block, HeapReplay};
use crate::report::{
    command_text, footer_text, frame_text, prefix, seconds, serialize_hex, thousands,
    warnings_text, Facts, FrameReport, ProcessReport, StackSymbolizer, TraceStatus,
};
pub use crate::report::{BytesBlocks, HeapUsage};
use crate::sampling::{Estimate, Sampling, SamplingReport};
use crate::staleness::Staleness;
use crate::suppressions::Suppression;
pub use crate::verdicts::{HistoryPoint, ScanReport, SiteHistory, SkippedScan};
use crate::verdicts::{ScanCollector, Totals};

/// Loss record kind for blocks from the exit snapshot.
pub const KIND_UNFREED_AT_EXIT: &str = "unfreed_at_exit";
/// Loss record kind for blocks found by replay, when the trace has no exit snapshot.
pub const KIND_LIVE_AT_END_OF_TRACE: &str = "live_at_end_of_trace";
/// Allocation sites an unfinished trace lists unless every kind is asked for.
pub const UNFINISHED_SITES_LISTED: usize = 25;

/// The `trapline leaks` report (its JSON form is the stable schema).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LeaksReport {
    /// The traced process.
    pub process: ProcessReport,
    /// Totals.
    pub summary: LeaksSummary,
    /// Loss records: bytes descending, then blocks descending, then first
    /// frame. With a reachability scan, only the kinds asked for (`--kinds`,
    /// default definitely and possibly lost) and not suppressed.
    pub records: Vec<LossRecord>,
    /// The reachability scan the records come from; null when the trace
    /// holds none (the process did not reach exit, or ran with `--no-scan`).
    pub scan: Option<ScanReport>,
    /// Reachability scans that were due and did not run, because their
    /// memory would have passed a limit that ends or fails the program (a
    /// cgroup's, `ulimit -v`): a skipped exit scan leaves the records
    /// unjudged, as with `--no-scan` (format version 8; empty before).
    pub scans_skipped: Vec<SkippedScan>,
    /// The suppressions that hid records, with what they hid.
    pub suppressions: Vec<SuppressionMatch>,
    /// Allocation sites that kept growing through the run and have no loss
    /// record, fastest first.
    pub growing_sites: Vec<GrowingSite>,
    /// Allocation sites a watcher judged stale that have no loss record and
    /// did not grow (a bounded set of blocks nobody reads, of a kind not
    /// listed), most untouched blocks first.
    pub stale_sites: Vec<StaleSite>,
    /// With `--history`: per allocation site with lost blocks, how each scan
    /// judged it; null otherwise.
    pub history: Option<Vec<SiteHistory>>,
    /// Allocation errors, identical ones (same kind, function and stack) merged, in order of first occurrence.
    pub errors: Vec<ErrorRecord>,
    /// Allocation calls that failed, merged by function and stack, in order
    /// of first occurrence (empty in traces older than format version 7).
    pub allocation_failures: Vec<FailureRecord>,
    /// Events the agent could not record; null when the trace has no end record to tell.
    pub events_lost: Option<u64>,
    /// Allocations passed through unrecorded because the thread was already
    /// inside the agent, their addresses kept so that releasing them is no
    /// error. Mostly the C library functions the agent itself calls
    /// (`pthread_getattr_np` for every thread, `setenv`/`unsetenv` and `dlsym`
    /// at start-up: about a dozen per process is normal), plus allocator calls
    /// from a signal handler that interrupted the agent, and blocks at
    /// addresses the agent cannot store. Null without an end record.
    pub untracked_calls: Option<u64>,
    /// Whether releases were recorded with their call stacks: false after
    /// `trapline run --no-release-stacks`, when the `free_stack` of errors is
    /// empty (the stack of each erroneous call itself is still recorded).
    pub release_stacks: bool,
    /// Sampled recording (`trapline run --sample`): how it sampled; null
    /// when every allocation took its full stack. Records then either
    /// group the blocks of one caller that took no full stack
    /// (`caller_only`), or count the sampled blocks of one full stack and
    /// estimate all of its blocks (`estimate`).
    pub sampling: Option<SamplingReport>,
    /// Whether the trace was complete.
    pub trace: TraceStatus,
    /// Problems met while symbolizing, one sentence each: a module file that
    /// is missing, unreadable or of another build than the traced one (its
    /// frames stay unnamed), debug information that could not be read.
    pub warnings: Vec<String>,
    /// Why the report cannot answer what was asked (a `--snapshot` the trace
    /// does not hold); the CLI prints it and fails.
    #[serde(skip)]
    pub problem: Option<String>,
}

/// A loss record of a scan.
fn scan_record(verdict: Verdict, stack_id: u32, func: AllocFn, t: Totals) -> LossRecord {
    let definite = verdict == Verdict::DefinitelyLost;
    LossRecord {
        caller_only: false,
        estimate: Some(t.estimate.estimate()),
        kind: verdict.name(),
        bytes: t.bytes + if definite { t.indirect_bytes } else { 0 },
        blocks: t.blocks,
        direct_bytes: definite.then_some(t.bytes),
        indirect_bytes: definite.then_some(t.indirect_bytes),
        allocated_by: func.name(),
        stack_id,
        stack: Vec::new(),
        suppression: None,
        verdicts: Vec::new(),
        growth: None,
        staleness: None,
    }
}

/// Totals of the leaks report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LeaksSummary {
    /// The blocks still allocated at exit (from the exit snapshot), or, when
    /// the trace has no snapshot, those live at the end of what was recorded.
    pub unfreed_at_exit: BytesBlocks,
    /// Where `unfreed_at_exit` comes from: `"exit_snapshot"` or `"replay"`.
    pub source: &'static str,
    /// Blocks no root reaches that head a lost structure (memcheck's
    /// definitely lost), leaders' own bytes only. Null without a scan; all
    /// four kinds exclude suppressed blocks.
    pub definitely_lost: Option<BytesBlocks>,
    /// Blocks no root reaches that a lost block points to.
    pub indirectly_lost: Option<BytesBlocks>,
    /// Blocks reached only through an interior pointer somewhere on every chain.
    pub possibly_lost: Option<BytesBlocks>,
    /// Blocks reached from a root through start pointers only.
    pub still_reachable: Option<BytesBlocks>,
    /// Blocks hidden by suppressions (null without a scan).
    pub suppressed: Option<BytesBlocks>,
    /// With a production-mode trace's scan: what every block at the stacks
    /// of the definitely and indirectly lost sampled blocks comes to,
    /// estimated from those (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimated_lost: Option<Estimate>,
    /// Heap usage computed by replaying the recorded events.
    pub total_heap_usage: HeapUsage,
    /// Number of loss records.
    pub loss_records: u64,
    /// Allocation sites not listed: an unfinished trace (no exit snapshot)
    /// lists its top sites unless `--kinds all` (none with `--kinds none`).
    pub records_omitted: u64,
    /// Errors detected, counting every occurrence.
    pub errors: u64,
    /// Distinct error contexts (entries of `errors`).
    pub error_contexts: u64,
}

/// Blocks allocated from the same stack by the same function, still live.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LossRecord {
    /// With a scan: `"definitely_lost"`, `"indirectly_lost"`,
    /// `"possibly_lost"` or `"still_reachable"`. Without one:
    /// `"unfreed_at_exit"` or `"live_at_end_of_trace"` (no exit snapshot).
    pub kind: &'static str,
    /// Total bytes of the blocks; for definitely lost records, their own
    /// bytes plus those lost through them (`direct_bytes + indirect_bytes`).
    pub bytes: u64,
    /// Definitely lost records: the bytes of the leader blocks themselves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_bytes: Option<u64>,
    /// Definitely lost records: the bytes of the blocks lost through them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub indirect_bytes: Option<u64>,
    /// Number of blocks.
    pub blocks: u64,
    /// The allocation function (C or C++ spelling).
    pub allocated_by: &'static str,
    /// The trace's stack id (0: no stack recorded).
    pub stack_id: u32,
    /// The allocation stack, innermost first, inlined frames expanded.
    pub stack: Vec<FrameReport>,
    /// A Valgrind suppression that hides this record (`--gen-suppressions`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suppression: Option<String>,
    /// What is wrong with the site, strongest first, drawn from
    /// `"unreachable"` (definitely or indirectly lost), `"growing"` (its
    /// live bytes kept rising to the end: `growth`), `"stale"` (a watcher
    /// saw its watched blocks go untouched: `staleness`) and
    /// `"unfreed_at_exit"` (the process ended with the blocks allocated).
    pub verdicts: Vec<&'static str>,
    /// Why the site was judged growing (null unless it was).
    pub growth: Option<Growth>,
    /// Why a watcher judged the site stale (null unless one did).
    pub staleness: Option<Staleness>,
    /// Sampled recording: the stack holds only the allocation's caller,
    /// and the record groups the blocks allocated there that took no full
    /// stack (absent when false).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub caller_only: bool,
    /// Sampled recording, a record of a full stack: what every block with
    /// this stack comes to, estimated from the sampled ones the record
    /// counts (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimate: Option<Estimate>,
}

/// An allocation site whose live bytes kept growing through the run but
/// that has no loss record: its blocks were freed by the end, or its
/// records are of a kind not listed (`--kinds`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GrowingSite {
    /// The allocation function (C or C++ spelling).
    pub allocated_by: &'static str,
    /// The trace's stack id.
    pub stack_id: u32,
    /// The allocation stack, innermost first, inlined frames expanded.
    pub stack: Vec<FrameReport>,
    /// `"growing"`, and `"stale"` when a watcher judged it so.
    pub verdicts: Vec<&'static str>,
    /// Why the site was judged growing.
    pub growth: Growth,
    /// Why a watcher judged the site stale (null unless one did).
    pub staleness: Option<Staleness>,
}

/// An allocation site judged stale by a watcher, with no loss record and
/// no growth.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StaleSite {
    /// The allocation function (C or C++ spelling).
    pub allocated_by: &'static str,
    /// The trace's stack id.
    pub stack_id: u32,
    /// The allocation stack, innermost first, inlined frames expanded.
    pub stack: Vec<FrameReport>,
    /// Why the site was judged stale.
    pub staleness: Staleness,
}

/// A suppression that hid loss records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SuppressionMatch {
    /// The Valgrind suppression's name, or the `leak:PATTERN` line.
    pub name: String,
    /// `file:line` where it was read.
    pub source: String,
    /// Loss records it hid.
    pub records: u64,
    /// Bytes it hid (direct bytes for definitely lost records).
    pub bytes: u64,
    /// Blocks it hid.
    pub blocks: u64,
}

/// What `trapline leaks` is asked to show.
#[derive(Clone, Debug)]
pub struct LeaksOptions {
    /// Which scan (1-based position); None = the last.
    pub snapshot: Option<u32>,
    /// Follow every allocation site across scans.
    pub history: bool,
    /// The kinds of loss records listed (the summary counts all).
    pub kinds: Vec<Verdict>,
    /// Suppressions to apply.
    pub suppressions: Vec<Suppression>,
    /// Give each listed record a ready suppression (`--gen-suppressions`).
    pub gen_suppressions: bool,
    /// Read the modules' symbols for the stacks; false leaves frames as
    /// addresses, for a report only counted (`findings`).
    pub symbolize: bool,
}

impl Default for LeaksOptions {
    /// memcheck's defaults: definite and possible records, last scan.
    fn default() -> Self {
        LeaksOptions {
            snapshot: None,
            history: false,
            kinds: vec![Verdict::DefinitelyLost, Verdict::PossiblyLost],
            suppressions: Vec::new(),
            gen_suppressions: false,
            symbolize: true,
        }
    }
}

/// Allocation calls of one function that failed at one stack.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FailureRecord {
    /// The function that failed (`malloc`, `operator new(unsigned long)`, ...).
    pub function: &'static str,
    /// How many calls failed at this stack.
    pub count: u64,
    /// Bytes asked for by the first, and the least and most asked for.
    pub size: u64,
    pub min_size: u64,
    pub max_size: u64,
    /// The alignment asked for by the first (0: none).
    pub alignment: u64,
    /// Thread and time of the first.
    pub thread: u32,
    pub time_seconds: f64,
    /// Stack id and stack of the calls.
    pub stack_id: u32,
    pub stack: Vec<FrameReport>,
}

/// One allocation error, possibly repeated.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ErrorRecord {
    /// `"double_free"`, `"invalid_free"`, `"mismatched_free"`,
    /// `"invalid_realloc"`, `"mismatched_size"` or `"mismatched_alignment"`.
    pub kind: &'static str,
    /// How many times this error happened at this stack.
    pub count: u64,
    /// The pointer passed (of the first occurrence).
    #[serde(serialize_with = "serialize_hex")]
    pub address: u64,
    /// The function called with it.
    pub function: &'static str,
    /// Thread of the first occurrence.
    pub thread: u32,
    /// Time of the first occurrence, seconds since the start.
    pub time_seconds: f64,
    /// Whether the invalid call was passed on to the C library anyway
    /// (`--pass-invalid-frees`). Absent for the mismatches, which are
    /// always performed (the block is released).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passed_on: Option<bool>,
    /// For `mismatched_size`: the size the release gave (the block's is
    /// `alloc_size`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub given_size: Option<u64>,
    /// For `mismatched_alignment`: the alignment the release gave, 0 when
    /// it gave none (the block came from an aligned `new`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub given_alignment: Option<u64>,
    /// For `mismatched_alignment`: the alignment the block was allocated
    /// with, 0 when none (absent when the trace does not say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_alignment: Option<u64>,
    /// Stack id of the faulty call.
    pub stack_id: u32,
    /// Stack of the faulty call.
    pub stack: Vec<FrameReport>,
    /// How the block was allocated, when known.
    pub alloc_function: Option<&'static str>,
    /// Size of the block, when known.
    pub alloc_size: Option<u64>,
    /// Stack id of the block's allocation (0: unknown).
    pub alloc_stack_id: u32,
    /// Stack of the block's allocation (empty: unknown).
    pub alloc_stack: Vec<FrameReport>,
    /// The function of the block's first release, for double frees, when
    /// known: the release function the trace recorded at `free_stack` (the
    /// `Error` event itself does not say).
    pub free_function: Option<&'static str>,
    /// Stack id of the block's first release, for double frees (0: unknown).
    pub free_stack_id: u32,
    /// Stack of the block's first release (empty: unknown).
    pub free_stack: Vec<FrameReport>,
}

/// An error as first seen, and how many times it happened at its stack.
struct PendingError {
    /// The `Event::Error` of the first occurrence.
    event: Event,
    tid: u32,
    count: u64,
    /// For a mismatched alignment: the block's, from its `Alloc`.
    alloc_align: Option<u64>,
}

/// Groups of live blocks: (stack, function) → bytes and blocks.
type Groups = HashMap<(u32, AllocFn), Totals>;

fn add(groups: &mut Groups, stack: u32, func: AllocFn, size: u64, sampling: Option<Sampling>) {
    groups.entry((stack, func)).or_default().add(size, sampling);
}

/// State of the pass over the trace.
#[derive(Default)]
struct LeaksPass {
    facts: Facts,
    heap: HeapReplay<Block>,
    /// The live blocks of the exit snapshot, grouped.
    snapshot: Groups,
    /// The reachability scans.
    scans: ScanCollector,
    errors: Vec<PendingError>,
    error_index: HashMap<(ErrorKind, AllocFn, u32), usize>,
    failures: Vec<FailureRecord>,
    failure_index: HashMap<(AllocFn, u32), usize>,
    /// Each allocation site's live bytes over the run.
    growth: Option<GrowthTracker>,
    /// The release function called at each release stack (the first seen):
    /// names the first release of a double-freed block, whose `Error` event
    /// gives only that release's stack.
    release_fn: StackMap<AllocFn>,
    /// Each site's latest stale verdict from a watcher (`SiteVerdict`).
    stale: HashMap<(u32, AllocFn), Staleness>,
    /// The alignment of each live block from an aligned `operator new`
    /// (few programs have many), by address; aHash, as every release looks
    /// here.
    cxx_aligned: HashMap<u64, u64, ahash::RandomState>,
    /// Per thread, the last such block released (address, alignment): its
    /// `Error` follows the release's `Free` on the same thread.
    cxx_aligned_released: HashMap<u32, (u64, u64)>,
    /// The trace's `Recording` was read (or is given up on): events are
    /// observed as they come. Until then they wait in `held`.
    recording_read: bool,
    /// The events read before the trace's `Recording`: how the blocks were
    /// sampled decides what each one stands for (estimates, growth), and a
    /// production-mode process ended by a signal writes its `Recording`
    /// after its heap events (the writer had not started: the agent's own
    /// records go last), where the merge puts them.
    held: Vec<MergedEvent>,
}

/// Events held back waiting for a trace's `Recording`, at most: a
/// production-mode trace whose `Recording` comes last holds fewer (only its
/// sampled blocks have events, and its writer starts once 1 MiB of them
/// waits, writing the agent's records first); a trace without `Recording`
/// (older than format version 3, or written by a test) was not sampled,
/// and is read as it comes after these. Bounded so that holding them costs
/// a few MiB: the run summary's reader runs under memory limits
/// (`tests/scan_limits.rs`).
const HELD_FOR_RECORDING: usize = 1 << 15;

/// A map keyed by stack id, hashed with one multiplication: it is updated
/// for every release of the trace.
type StackMap<V> = HashMap<u32, V, BuildHasherDefault<StackIdHasher>>;

#[derive(Default)]
struct StackIdHasher(u64);

impl Hasher for StackIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

impl LeaksPass {
    /// Takes one event of the merge: observed once the trace's `Recording`
    /// is known (see `held`).
    fn take(&mut self, m: &MergedEvent) {
        if self.recording_read {
            return self.observe(m);
        }
        if matches!(m.event, Event::Recording { .. }) {
            // Observed before the events it came after, with no time of
            // its own: it moves no series on.
            self.recording_read = true;
            self.observe(&MergedEvent {
                time: 0,
                ..m.clone()
            });
            self.release_held();
            return;
        }
        self.held.push(m.clone());
        if self.held.len() >= HELD_FOR_RECORDING {
            self.recording_read = true;
            self.release_held();
        }
    }

    /// Observes the events held back, in their order.
    fn release_held(&mut self) {
        for m in std::mem::take(&mut self.held) {
            self.observe(&m);
        }
    }

    fn observe(&mut self, m: &MergedEvent) {
        self.facts.observe_merged(m);
        match &mut self.growth {
            Some(g) => {
                if m.time != 0 {
                    g.advance(m.time);
                }
                let facts = &self.facts;
                self.heap.apply_observed(&m.event, |b, allocated| {
                    // A sampled stack's blocks stand for all of its blocks:
                    // its growth is judged on the estimate.
                    let site = (b.stack, b.func);
                    match facts.sampled_full_stack(b.stack) {
                        Some(s) => {
                            g.changed_by_weight(site, s.weight_bytes(b.size), b.size, allocated)
                        }
                        None => g.changed(site, b.size, allocated),
                    }
                });
            }
            None => self.heap.apply(&m.event),
        }
        self.scans.observe(&m.event);
        match &m.event {
            Event::Error {
                kind,
                func,
                stack,
                addr,
                ..
            } => {
                if *stack != 0 {
                    let key = (*kind, *func, *stack);
                    if let Some(&i) = self.error_index.get(&key) {
                        self.errors[i].count += 1;
                        return;
                    }
                    self.error_index.insert(key, self.errors.len());
                }
                let alloc_align = self
                    .cxx_aligned_released
                    .get(&m.tid)
                    .filter(|&&(a, _)| *kind == ErrorKind::MismatchedAlignment && a == *addr)
                    .map(|&(_, align)| align);
                self.errors.push(PendingError {
                    event: m.event.clone(),
                    tid: m.tid,
                    count: 1,
                    alloc_align,
                });
            }
            Event::Alloc {
                addr, align, func, ..
            } if func.cxx_aligned() => {
                self.cxx_aligned.insert(*addr, *align);
            }
            Event::Free {
                addr, func, stack, ..
            } => {
                if *stack != 0 {
                    self.release_fn.entry(*stack).or_insert(*func);
                }
                let aligned = match self.cxx_aligned.is_empty() {
                    true => None,
                    false => self.cxx_aligned.remove(addr),
                };
                if let Some(align) = aligned {
                    self.cxx_aligned_released.insert(m.tid, (*addr, align));
                }
            }
            Event::Realloc { old_addr, .. } => {
                self.cxx_aligned.remove(old_addr);
            }
            Event::SiteVerdict {
                stack,
                func,
                kinds,
                watched_blocks,
                untouched_blocks,
                untouched_ns,
                ..
            } => {
                let site = (*stack, *func);
                if kinds & trapline_trace::event::site_verdict::STALE != 0 {
                    self.stale.insert(
                        site,
                        Staleness {
                            watched_blocks: *watched_blocks,
                            untouched_blocks: *untouched_blocks,
                            touched_blocks: watched_blocks.saturating_sub(*untouched_blocks),
                            untouched_seconds: *untouched_ns as f64 / 1e9,
                            last_access_seconds_ago: None,
                        },
                    );
                } else {
                    self.stale.remove(&site);
                }
            }
            Event::AllocFailed {
                time,
                func,
                size,
                align,
                stack,
            } => {
                if let Some(&i) = self.failure_index.get(&(*func, *stack)) {
                    let f = &mut self.failures[i];
                    f.count += 1;
                    f.min_size = f.min_size.min(*size);
                    f.max_size = f.max_size.max(*size);
                    return;
                }
                self.failure_index
                    .insert((*func, *stack), self.failures.len());
                self.failures.push(FailureRecord {
                    function: func.name(),
                    count: 1,
                    size: *size,
                    min_size: *size,
                    max_size: *size,
                    alignment: *align,
                    thread: m.tid,
                    time_seconds: seconds(*time),
                    stack_id: *stack,
                    stack: Vec::new(),
                });
            }
            // A trace holds at most one snapshot; its live blocks may come in
            // chunks without timed events, so they are not tied to the order
            // of SnapshotBegin and SnapshotEnd (see Facts::has_exit_snapshot).
            Event::LiveBlock {
                size, func, stack, ..
            } => add(
                &mut self.snapshot,
                *stack,
                *func,
                *size,
                self.facts.sampling,
            ),
            _ => {}
        }
    }
}

/// Analyses a trace. Fails only when the input is not a readable trace at all;
/// a truncated or damaged trace gives a report of what could be read, with
/// [`TraceStatus::stopped`] set.
pub fn analyze<R: TraceInput>(input: &mut R) -> Result<LeaksReport, TraceError> {
    analyze_with(input, &LeaksOptions::default())
}

/// Analyses a trace as [`analyze`] does, with options (scan, kinds,
/// suppressions, history). A `snapshot` the trace does not hold gives a
/// report whose [`LeaksReport::problem`] says so.
pub fn analyze_with<R: TraceInput>(
    input: &mut R,
    options: &LeaksOptions,
) -> Result<LeaksReport, TraceError> {
    crate::pass::run(input, |index| LeaksAnalysis::new(index, options.clone()))
}

/// The leaks analysis as a [`Pass`], to share a read of the trace with others.
pub struct LeaksAnalysis {
    pass: LeaksPass,
    options: LeaksOptions,
}

impl LeaksAnalysis {
    /// The pass over the trace `index` indexes, with `options`.
    pub fn new(index: &TraceIndex, options: LeaksOptions) -> Self {
        let (start, end) = index.time_span();
        let pass = LeaksPass {
            scans: ScanCollector::new(options.history),
            growth: Some(GrowthTracker::new(start, end)),
            ..LeaksPass::default()
        };
        LeaksAnalysis { pass, options }
    }
}

impl Pass for LeaksAnalysis {
    type Report = LeaksReport;
    fn observe(&mut self, m: &MergedEvent) {
        self.pass.take(m);
    }
    fn finish(mut self, index: &TraceIndex, read: ReadStatus) -> Result<LeaksReport, TraceError> {
        // A trace without `Recording` (older, or cut before it).
        self.pass.release_held();
        Ok(leaks_report(self.pass, &self.options, index, read))
    }
}

/// The report, from the pass's state once the trace is read.
fn leaks_report(
    mut pass: LeaksPass,
    options: &LeaksOptions,
    index: &TraceIndex,
    stopped: ReadStatus,
) -> LeaksReport {
    let mut growing = pass
        .growth
        .take()
        .map(GrowthTracker::growing)
        .unwrap_or_default();
    let has_exit_snapshot = pass.facts.has_exit_snapshot();
    let (kind, source, groups) = match has_exit_snapshot {
        true => (
            KIND_UNFREED_AT_EXIT,
            "exit_snapshot",
            std::mem::take(&mut pass.snapshot),
        ),
        false => {
            let mut g = Groups::new();
            for b in pass.heap.live.values() {
                add(&mut g, b.stack, b.func, b.size, pass.facts.sampling);
            }
            (KIND_LIVE_AT_END_OF_TRACE, "replay", g)
        }
    };

    let complete = pass.scans.complete();
    let mut problem = None;
    let chosen = match options.snapshot {
        None => complete.len(),
        Some(n) if (1..=complete.len()).contains(&(n as usize)) => n as usize,
        Some(n) => {
            problem = Some(if complete.is_empty() {
                format!("snapshot {n} was asked for, but the trace holds no reachability scan")
            } else {
                format!(
                    "snapshot {n} was asked for, but the trace holds {} reachability scans",
                    complete.len()
                )
            });
            0
        }
    };
    let production = pass.facts.production.is_some();
    let scan = chosen.checked_sub(1).and_then(|i| {
        pass.scans
            .scan_report(complete[i], chosen as u32, complete.len() as u32)
            .map(|s| ScanReport { production, ..s })
    });
    let mut history = options.history.then(|| pass.scans.history());
    let scan_groups = match &scan {
        Some(_) => pass.scans.take_groups(complete[chosen - 1]),
        None => HashMap::new(),
    };

    let facts = &pass.facts;
    let mut symbolizer = match options.symbolize {
        true => facts.symbolizer(),
        false => StackSymbolizer::addresses_only(),
    };
    let mut records: Vec<LossRecord> = match &scan {
        Some(_) => scan_groups
            .into_iter()
            .map(|((verdict, stack_id, func), t)| scan_record(verdict, stack_id, func, t))
            .collect(),
        None => groups
            .into_iter()
            .map(|((stack_id, func), bb)| LossRecord {
                caller_only: false,
                estimate: Some(bb.estimate.estimate()),
                kind,
                bytes: bb.bytes,
                blocks: bb.blocks,
                direct_bytes: None,
                indirect_bytes: None,
                allocated_by: func.name(),
                stack_id,
                stack: Vec::new(),
                suppression: None,
                verdicts: Vec::new(),
                growth: None,
                staleness: None,
            })
            .collect(),
    };
    for r in &mut records {
        r.caller_only = facts.sampling.is_some() && facts.caller_only.contains(&r.stack_id);
        if facts.sampled_full_stack(r.stack_id).is_none() {
            r.estimate = None;
        }
    }
    let first_frame = |r: &LossRecord| {
        facts
            .stacks
            .get(&r.stack_id)
            .and_then(|f| f.first().copied())
            .unwrap_or(u64::MAX)
    };
    records.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.blocks.cmp(&a.blocks))
            .then(first_frame(a).cmp(&first_frame(b)))
            .then(a.stack_id.cmp(&b.stack_id))
            .then(a.allocated_by.cmp(b.allocated_by))
    });
    let unfreed = records
        .iter()
        .fold(BytesBlocks::default(), |acc, r| BytesBlocks {
            bytes: acc.bytes + r.direct_bytes.unwrap_or(r.bytes),
            blocks: acc.blocks + r.blocks,
        });
    // An unfinished trace has no verdicts: its live blocks by site, the top
    // ones listed unless every kind is asked for (a killed perl run had
    // 698,621 sites, each printed and symbolized).
    let mut records_omitted = 0;
    if scan.is_none() && !has_exit_snapshot {
        let keep = if options.kinds.is_empty() {
            0
        } else if Verdict::ALL.iter().all(|k| options.kinds.contains(k)) {
            records.len()
        } else {
            UNFINISHED_SITES_LISTED
        };
        records_omitted = records.len().saturating_sub(keep) as u64;
        records.truncate(keep);
    }
    let shown_kinds: Vec<&str> = options.kinds.iter().map(|k| k.name()).collect();
    let mut kinds_total = [BytesBlocks::default(); 4];
    let mut suppressed = BytesBlocks::default();
    let mut estimated_lost = None;
    let mut matches: Vec<SuppressionMatch> = Vec::new();
    records.retain_mut(|r| {
        let symbolize =
            scan.is_none() || !options.suppressions.is_empty() || shown_kinds.contains(&r.kind);
        if symbolize {
            r.stack = symbolizer.stack(&facts.stacks, r.stack_id);
        }
        let Some(verdict) = Verdict::ALL.into_iter().find(|v| v.name() == r.kind) else {
            return true;
        };
        let own = r.direct_bytes.unwrap_or(r.bytes);
        let func = AllocFn::ALL
            .into_iter()
            .find(|f| f.name() == r.allocated_by)
            .unwrap_or(AllocFn::Malloc);
        if let Some(s) = options
            .suppressions
            .iter()
            .find(|s| s.matches(verdict, func, &r.stack))
        {
            suppressed.bytes += own;
            suppressed.blocks += r.blocks;
            let i = match matches.iter().position(|m| m.source == s.source) {
                Some(i) => i,
                None => {
                    matches.push(SuppressionMatch {
                        name: s.name.clone(),
                        source: s.source.clone(),
                        records: 0,
                        bytes: 0,
                        blocks: 0,
                    });
                    matches.len() - 1
                }
            };
            matches[i].records += 1;
            matches[i].bytes += own;
            matches[i].blocks += r.blocks;
            return false;
        }
        let k = &mut kinds_total[verdict as usize - 1];
        k.bytes += own;
        k.blocks += r.blocks;
        if let (true, true, Some(e)) = (
            production,
            matches!(verdict, Verdict::DefinitelyLost | Verdict::IndirectlyLost),
            r.estimate,
        ) {
            estimated_lost = Some(estimated_lost.map_or(e, |t: Estimate| t.plus(e)));
        }
        shown_kinds.contains(&r.kind)
    });
    if options.gen_suppressions {
        for r in &mut records {
            let func = AllocFn::ALL
                .into_iter()
                .find(|f| f.name() == r.allocated_by)
                .unwrap_or(AllocFn::Malloc);
            r.suppression = Some(crate::suppressions::generate(r.kind, func, &r.stack));
        }
    }
    let func_of = |name: &str| {
        AllocFn::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .unwrap_or(AllocFn::Malloc)
    };
    let mut stale = std::mem::take(&mut pass.stale);
    for r in &mut records {
        let site = (r.stack_id, func_of(r.allocated_by));
        r.growth = growing.get(&site).cloned();
        r.staleness = stale.get(&site).cloned();
        r.verdicts = verdicts_of(r.kind, r.growth.is_some(), r.staleness.is_some());
    }
    for r in &records {
        growing.remove(&(r.stack_id, func_of(r.allocated_by)));
        stale.remove(&(r.stack_id, func_of(r.allocated_by)));
    }
    let mut growing_sites: Vec<GrowingSite> = growing
        .into_iter()
        .map(|((stack_id, func), growth)| {
            let staleness = stale.remove(&(stack_id, func));
            GrowingSite {
                allocated_by: func.name(),
                stack_id,
                stack: symbolizer.stack(&facts.stacks, stack_id),
                verdicts: [Some("growing"), staleness.as_ref().map(|_| "stale")]
                    .into_iter()
                    .flatten()
                    .collect(),
                growth,
                staleness,
            }
        })
        .collect();
    growing_sites.sort_by(|a, b| {
        b.growth
            .bytes_per_second
            .total_cmp(&a.growth.bytes_per_second)
            .then(a.stack_id.cmp(&b.stack_id))
    });
    let mut stale_sites: Vec<StaleSite> = stale
        .into_iter()
        .map(|((stack_id, func), staleness)| StaleSite {
            allocated_by: func.name(),
            stack_id,
            stack: symbolizer.stack(&facts.stacks, stack_id),
            staleness,
        })
        .collect();
    stale_sites.sort_by(|a, b| {
        b.staleness
            .untouched_blocks
            .cmp(&a.staleness.untouched_blocks)
            .then(a.stack_id.cmp(&b.stack_id))
    });
    if let Some(h) = history.as_mut() {
        for site in h.iter_mut() {
            site.stack = symbolizer.stack(&facts.stacks, site.stack_id);
        }
    }

    let errors: Vec<ErrorRecord> = pass
        .errors
        .iter()
        .filter_map(|e| error_record(e, facts, &pass.release_fn, &mut symbolizer))
        .collect();

    let mut allocation_failures = core::mem::take(&mut pass.failures);
    for f in &mut allocation_failures {
        f.stack = symbolizer.stack(&facts.stacks, f.stack_id);
    }

    let trace = facts.trace_status(index, stopped);
    let with_scan = |k: Verdict| scan.as_ref().map(|_| kinds_total[k as usize - 1]);
    LeaksReport {
        process: facts.process_report_with_crash(&mut symbolizer),
        summary: LeaksSummary {
            unfreed_at_exit: unfreed,
            source: if scan.is_some() {
                "reachability_scan"
            } else {
                source
            },
            definitely_lost: with_scan(Verdict::DefinitelyLost),
            indirectly_lost: with_scan(Verdict::IndirectlyLost),
            possibly_lost: with_scan(Verdict::PossiblyLost),
            still_reachable: with_scan(Verdict::StillReachable),
            suppressed: scan.as_ref().map(|_| suppressed),
            estimated_lost: (production && scan.is_some())
                .then(|| estimated_lost.unwrap_or_default()),
            total_heap_usage: pass.heap.usage,
            loss_records: records.len() as u64,
            records_omitted,
            errors: errors.iter().map(|e| e.count).sum(),
            error_contexts: errors.len() as u64,
        },
        records,
        growing_sites,
        stale_sites,
        scan,
        scans_skipped: pass.scans.take_skipped(),
        suppressions: matches,
        history,
        errors,
        allocation_failures,
        events_lost: facts.events_lost(),
        untracked_calls: facts.end.as_ref().map(|(_, _, c)| c.untracked_calls),
        release_stacks: !facts.no_release_stacks,
        sampling: facts.sampling_report(),
        trace,
        warnings: facts.memory_warnings(&symbolizer),
        problem,
    }
}

/// A loss record's verdicts, strongest first.
fn verdicts_of(kind: &str, growing: bool, stale: bool) -> Vec<&'static str> {
    let unreachable =
        kind == Verdict::DefinitelyLost.name() || kind == Verdict::IndirectlyLost.name();
    let unfreed = kind != KIND_LIVE_AT_END_OF_TRACE;
    [
        (unreachable, "unreachable"),
        (growing, "growing"),
        (stale, "stale"),
        (unfreed, "unfreed_at_exit"),
    ]
    .into_iter()
    .filter_map(|(holds, name)| holds.then_some(name))
    .collect()
}

fn error_record(
    e: &PendingError,
    facts: &Facts,
    release_fn: &StackMap<AllocFn>,
    symbolizer: &mut StackSymbolizer,
) -> Option<ErrorRecord> {
    let Event::Error {
        time,
        kind,
        func,
        addr,
        stack,
        alloc_func,
        alloc_size,
        alloc_stack,
        free_stack,
        passed_on,
        given,
    } = e.event
    else {
        return None;
    };
    let block_known = alloc_func.is_some() || alloc_size != 0 || alloc_stack != 0;
    let mut frames = |id| symbolizer.stack(&facts.stacks, id);
    Some(ErrorRecord {
        kind: kind.name(),
        count: e.count,
        address: addr,
        function: func.name(),
        thread: e.tid,
        time_seconds: seconds(time),
        passed_on: (!kind.performed()).then_some(passed_on),
        given_size: (kind == ErrorKind::MismatchedSize).then_some(given),
        given_alignment: (kind == ErrorKind::MismatchedAlignment).then_some(given),
        alloc_alignment: e.alloc_align.or_else(|| {
            // A block from an unaligned `new` had none.
            (kind == ErrorKind::MismatchedAlignment
                && !alloc_func.is_some_and(AllocFn::cxx_aligned))
            .then_some(0)
        }),
        stack_id: stack,
        stack: frames(stack),
        alloc_function: alloc_func.map(AllocFn::name),
        alloc_size: block_known.then_some(alloc_size),
        alloc_stack_id: alloc_stack,
        alloc_stack: frames(alloc_stack),
        free_function: release_fn.get(&free_stack).map(|f| f.name()),
        free_stack_id: free_stack,
        free_stack: frames(free_stack),
    })
}

/// One failed allocation site, memcheck-style.
fn failure_text(out: &mut String, p: &str, f: &FailureRecord) {
    let sizes = if f.min_size == f.max_size {
        format!("{} bytes", thousands(f.size))
    } else {
        format!(
            "{} to {} bytes",
            thousands(f.min_size),
            thousands(f.max_size)
        )
    };
    let times = if f.count == 1 {
        "once".to_owned()
    } else {
        format!("{} times", thousands(f.count))
    };
    let aligned = if f.alignment != 0 {
        format!(", aligned to {}", thousands(f.alignment))
    } else {
        String::new()
    };
    writeln!(
        out,
        "{p}Allocation failed {times} at this stack ({sizes}{aligned}): out of memory or a bad argument"
    )
    .unwrap();
    stack_text(out, p, Some(f.function), &f.stack, f.stack_id);
}

/// Writes a stack memcheck-style: the called function on top (when given),
/// then the recorded frames.
fn stack_text(out: &mut String, p: &str, top: Option<&str>, frames: &[FrameReport], id: u32) {
    let mut word = "at";
    if let Some(f) = top {
        writeln!(out, "{p}   {word} {f}").unwrap();
        word = "by";
    }
    for f in frames {
        writeln!(out, "{p}   {word} {}", frame_text(f)).unwrap();
        word = "by";
    }
    if frames.is_empty() {
        if id == 0 {
            writeln!(out, "{p}   (no stack recorded)").unwrap();
        } else {
            writeln!(out, "{p}   (stack {id} is missing from the trace)").unwrap();
        }
    }
}

/// Renders the report as text, in the style of Valgrind memcheck.
pub fn render_text(r: &LeaksReport) -> String {
    let p = prefix(&r.process);
    let mut out = String::new();
    let exit_snapshot = r.summary.source != "replay";
    writeln!(
        out,
        "{p}trapline leaks: blocks still allocated at exit and allocation errors"
    )
    .unwrap();
    writeln!(out, "{p}Command: {}", command_text(&r.process)).unwrap();
    match &r.process.exit {
        Some(e) => writeln!(out, "{p}Exit: {}", e.describe()).unwrap(),
        None => writeln!(out, "{p}Exit: unknown (the process did not finish)").unwrap(),
    }
    if let Some(c) = &r.process.crash {
        // memcheck's "Process terminating with default action of signal".
        let cause = c
            .cause
            .as_deref()
            .map_or(String::new(), |k| format!(" ({k})"));
        let address = c
            .address
            .as_deref()
            .map_or(String::new(), |a| format!(" at address {a}"));
        writeln!(
            out,
            "{p}CRASH: thread {} died of {}{cause}{address}; the blocks below are as the crash left them",
            c.tid, c.signal_name
        )
        .unwrap();
        stack_text(&mut out, &p, None, &c.stack, 0);
        for t in &c.other_threads {
            writeln!(out, "{p}  thread {} was stopped at", t.tid).unwrap();
            stack_text(&mut out, &p, None, &t.stack, 0);
        }
    }
    if !exit_snapshot {
        writeln!(
            out,
            "{p}UNFINISHED TRACE: the process did not finish while recorded (killed, or the trace was cut off): there is no exit snapshot and no reachability verdict. Below: the blocks live at the end of what was recorded, by allocation site, largest first."
        )
        .unwrap();
    }
    if let Some((sampling, prod)) = r
        .sampling
        .as_ref()
        .and_then(|s| s.production.as_ref().map(|prod| (s, prod)))
    {
        writeln!(
            out,
            "{p}PRODUCTION MODE: {} ({} of {} allocation calls; one per {} bytes allocated on average). Only sampled blocks are recorded: each record estimates all blocks of its stack (95% interval), and growth is judged on those estimates; calls per function are exact; double and invalid frees are found for sampled blocks only; {}",
            prod.share(thousands),
            thousands(prod.sampled_allocations),
            thousands(prod.allocation_calls),
            thousands(sampling.mean_bytes),
            if r.scan.is_some() {
                "leaks are the sampled blocks a scan of all memory finds lost (below)."
            } else {
                "no reachability verdicts."
            }
        )
        .unwrap();
    } else if let Some(sampling) = &r.sampling {
        writeln!(
            out,
            "{p}SAMPLED RECORDING: every block is counted, but only about one per {} bytes allocated took its full stack. A record of a full stack counts its sampled blocks and estimates all of them (95% interval); a record of a caller groups the blocks allocated there that took no full stack.",
            thousands(sampling.mean_bytes)
        )
        .unwrap();
    }
    if let Some(lost) = r.events_lost.filter(|&n| n > 0) {
        writeln!(
            out,
            "{p}WARNING: {} events were lost: the results below may be incomplete",
            thousands(lost)
        )
        .unwrap();
    }
    writeln!(out, "{p}").unwrap();

    writeln!(out, "{p}HEAP SUMMARY:").unwrap();
    let u = r.summary.unfreed_at_exit;
    let label = if exit_snapshot {
        "in use at exit"
    } else {
        "in use at end of trace"
    };
    writeln!(
        out,
        "{p}    {label}: {} bytes in {} blocks",
        thousands(u.bytes),
        thousands(u.blocks)
    )
    .unwrap();
    let h = r.summary.total_heap_usage;
    match r.sampling.as_ref().and_then(|s| s.production.as_ref()) {
        Some(prod) => {
            writeln!(
                out,
                "{p}  total heap usage: {} allocs, {} frees, {} bytes allocated (every call counted; {} allocs sampled)",
                thousands(prod.allocation_calls),
                thousands(prod.release_calls),
                thousands(prod.bytes_allocated),
                thousands(h.allocs)
            )
            .unwrap();
        }
        None => writeln!(
            out,
            "{p}  total heap usage: {} allocs, {} frees, {} bytes allocated",
            thousands(h.allocs),
            thousands(h.frees),
            thousands(h.bytes_allocated)
        )
        .unwrap(),
    }
    if !exit_snapshot {
        writeln!(
            out,
            "{p}  (no exit snapshot in the trace: blocks live at the end of what was recorded, found by replay)"
        )
        .unwrap();
    }
    writeln!(out, "{p}").unwrap();

    let n = r.records.len();
    let what = if exit_snapshot {
        "are still allocated at exit"
    } else {
        "were still allocated when the trace ends"
    };
    if let Some(scan) = &r.scan {
        scan_text(&mut out, &p, scan);
    }
    skipped_scans_text(&mut out, &p, &r.scans_skipped, r.scan.is_some());
    for (i, rec) in r.records.iter().enumerate() {
        let (amount, what) = match rec.kind {
            KIND_UNFREED_AT_EXIT | KIND_LIVE_AT_END_OF_TRACE => (thousands(rec.bytes), what),
            kind => (record_amount(rec), kind_text(kind)),
        };
        writeln!(
            out,
            "{p}{amount} bytes in {} blocks {what} in loss record {} of {}",
            thousands(rec.blocks),
            thousands(i as u64 + 1),
            thousands(n as u64)
        )
        .unwrap();
        if rec.caller_only {
            writeln!(
                out,
                "{p}   (sampled recording: these blocks took no full stack; the stack is their caller)"
            )
            .unwrap();
        }
        if let Some(e) = &rec.estimate {
            writeln!(
                out,
                "{p}   estimated for this stack: {} bytes ± {} in {} blocks, from {} sampled blocks",
                thousands(e.bytes),
                thousands(e.bytes_error),
                thousands(e.blocks),
                thousands(e.sampled_blocks)
            )
            .unwrap();
        }
        if let Some(g) = &rec.growth {
            growth_text(&mut out, &p, g);
        }
        if let Some(st) = &rec.staleness {
            staleness_text(&mut out, &p, st);
        }
        stack_text(
            &mut out,
            &p,
            Some(rec.allocated_by),
            &rec.stack,
            rec.stack_id,
        );
        writeln!(out, "{p}").unwrap();
        if let Some(s) = &rec.suppression {
            // Unprefixed, as memcheck prints it: ready to paste into a file.
            writeln!(out, "{s}").unwrap();
        }
    }
    if r.summary.records_omitted > 0 {
        writeln!(
            out,
            "{p}... and {} more allocation sites with blocks live at the end of the trace (--kinds all lists every one)",
            thousands(r.summary.records_omitted)
        )
        .unwrap();
        writeln!(out, "{p}").unwrap();
    }

    for site in &r.growing_sites {
        writeln!(
            out,
            "{p}An allocation site kept growing, with no loss record (its blocks were freed, or are of a kind not listed):"
        )
        .unwrap();
        growth_text(&mut out, &p, &site.growth);
        if let Some(st) = &site.staleness {
            staleness_text(&mut out, &p, st);
        }
        stack_text(
            &mut out,
            &p,
            Some(site.allocated_by),
            &site.stack,
            site.stack_id,
        );
        writeln!(out, "{p}").unwrap();
    }
    for site in &r.stale_sites {
        writeln!(
            out,
            "{p}A watcher found an allocation site's blocks untouched, with no loss record (its blocks were freed, or are of a kind not listed):"
        )
        .unwrap();
        staleness_text(&mut out, &p, &site.staleness);
        stack_text(
            &mut out,
            &p,
            Some(site.allocated_by),
            &site.stack,
            site.stack_id,
        );
        writeln!(out, "{p}").unwrap();
    }

    leak_summary_text(&mut out, &p, r);
    history_text(&mut out, &p, r);

    for e in &r.errors {
        error_text(&mut out, &p, e, r.release_stacks);
        writeln!(out, "{p}").unwrap();
    }

    for f in &r.allocation_failures {
        failure_text(&mut out, &p, f);
        writeln!(out, "{p}").unwrap();
    }

    writeln!(
        out,
        "{p}ERROR SUMMARY: {} errors from {} contexts",
        thousands(r.summary.errors),
        thousands(r.summary.error_contexts)
    )
    .unwrap();
    warnings_text(&mut out, &p, &r.warnings);
    footer_text(&mut out, &p, r.events_lost, &r.trace);
    out
}

/// "stale: U of W watched blocks untouched for at least S s".
fn staleness_text(out: &mut String, p: &str, s: &Staleness) {
    writeln!(
        out,
        "{p}   stale: {} of {} watched blocks untouched for at least {:.1} s",
        thousands(s.untouched_blocks),
        thousands(s.watched_blocks),
        s.untouched_seconds
    )
    .unwrap();
}

/// "growing: +R bytes/s for S s (confidence C), A -> B bytes live", the
/// bytes "estimated" under sampled recording.
fn growth_text(out: &mut String, p: &str, g: &Growth) {
    writeln!(
        out,
        "{p}   growing: +{} bytes/s for {:.1} s (confidence {:.2}), {} -> {} bytes live{}",
        thousands(g.bytes_per_second.round() as u64),
        g.growing_for_seconds,
        g.confidence,
        thousands(g.live_bytes_first),
        thousands(g.live_bytes_last),
        if g.estimated {
            " (estimated from the sampled blocks)"
        } else {
            ""
        }
    )
    .unwrap();
}

/// "N" or, for a leader with indirect bytes, "N (D direct, I indirect)",
/// as memcheck words its loss records.
pub fn record_amount(rec: &LossRecord) -> String {
    match (rec.direct_bytes, rec.indirect_bytes) {
        (Some(d), Some(i)) if i > 0 => format!(
            "{} ({} direct, {} indirect)",
            thousands(rec.bytes),
            thousands(d),
            thousands(i)
        ),
        _ => thousands(rec.bytes),
    }
}

/// "N bytes in M blocks", memcheck's way.
fn bytes_in_blocks(bb: BytesBlocks) -> String {
    format!(
        "{} bytes in {} blocks",
        thousands(bb.bytes),
        thousands(bb.blocks)
    )
}

fn kind_text(kind: &str) -> &'static str {
    match kind {
        "definitely_lost" => "are definitely lost",
        "indirectly_lost" => "are indirectly lost",
        "possibly_lost" => "are possibly lost",
        _ => "are still reachable",
    }
}

/// Periodic scans skipped that text reports name one by one; the rest are counted.
const SKIPPED_SCANS_NAMED: usize = 3;

/// `judged`: the records come from a scan that ran (a periodic one, when
/// the exit scan was skipped).
fn skipped_scans_text(out: &mut String, p: &str, skipped: &[SkippedScan], judged: bool) {
    let periodic = skipped.iter().filter(|s| s.trigger == "periodic").count();
    let mut named = 0;
    for s in skipped {
        if s.trigger == "periodic" {
            named += 1;
            if named > SKIPPED_SCANS_NAMED {
                continue;
            }
        }
        writeln!(out, "{p}WARNING: {}", s.text).unwrap();
        if s.trigger == "exit" && judged {
            writeln!(
                out,
                "{p}The records below are the last scan's that ran (above), not the exit's."
            )
            .unwrap();
        } else if s.trigger == "exit" {
            writeln!(
                out,
                "{p}The blocks below are unjudged, as with `trapline run --no-scan`."
            )
            .unwrap();
        }
    }
    if periodic > SKIPPED_SCANS_NAMED {
        writeln!(
            out,
            "{p}WARNING: {} more periodic scans were skipped (the JSON report lists them)",
            periodic - SKIPPED_SCANS_NAMED
        )
        .unwrap();
    }
    if !skipped.is_empty() {
        writeln!(out, "{p}").unwrap();
    }
}

/// What a production-mode scan's verdicts mean, for the text report.
const PRODUCTION_VERDICTS: &str = "Production mode: a sampled block is definitely lost when no word of the process's memory (stacks, registers, data, the whole heap with its blocks not sampled) points into it, nor any block reached from there: never a false leak. A sampled block that only blocks not sampled point to counts as still reachable (referenced), lost or not: a leak reachable only from a leaked structure of unsampled blocks is missed.";

fn scan_text(out: &mut String, p: &str, scan: &ScanReport) {
    let (blocks, read) = match scan.production {
        true => ("sampled blocks", "bytes of memory read"),
        false => ("blocks", "root bytes"),
    };
    writeln!(
        out,
        "{p}Reachability scan {} of {} ({}, at {:.3} s): {} {blocks}, {} {read}, {} threads, paused {:.1} ms",
        scan.snapshot,
        scan.snapshots,
        scan.trigger,
        scan.time_seconds,
        thousands(scan.blocks),
        thousands(scan.root_bytes),
        scan.threads,
        scan.pause_ms
    )
    .unwrap();
    if scan.production {
        writeln!(out, "{p}{PRODUCTION_VERDICTS}").unwrap();
    }
    if scan.threads_not_suspended > 0 {
        writeln!(
            out,
            "{p}WARNING: {} threads not suspended: false leaks possible",
            scan.threads_not_suspended
        )
        .unwrap();
    }
    if scan.mappings_not_excluded > 0 {
        writeln!(
            out,
            "{p}WARNING: {} mappings of the allocator or the agent read as roots (their tables were full): missed leaks possible",
            thousands(scan.mappings_not_excluded)
        )
        .unwrap();
    }
    writeln!(out, "{p}").unwrap();
}

fn leak_summary_text(out: &mut String, p: &str, r: &LeaksReport) {
    let s = &r.summary;
    let (Some(d), Some(i), Some(ps), Some(sr)) = (
        s.definitely_lost,
        s.indirectly_lost,
        s.possibly_lost,
        s.still_reachable,
    ) else {
        if r.trace.has_exit_snapshot || r.trace.has_end {
            writeln!(
                out,
                "{p}No reachability scan in the trace (recorded with --no-scan or by `trapline attach`, ended by a signal or exec, or under a seccomp filter that left the agent no way to read its memory): blocks are not judged lost or reachable."
            )
            .unwrap();
            writeln!(out, "{p}").unwrap();
        }
        return;
    };
    writeln!(out, "{p}LEAK SUMMARY:").unwrap();
    for (label, bb) in [
        ("   definitely lost", d),
        ("   indirectly lost", i),
        ("     possibly lost", ps),
        ("   still reachable", sr),
        ("        suppressed", s.suppressed.unwrap_or_default()),
    ] {
        writeln!(out, "{p}{label}: {}", bytes_in_blocks(bb)).unwrap();
    }
    if let Some(e) = &s.estimated_lost {
        writeln!(
            out,
            "{p}   (sampled blocks; lost at their stacks, estimated: {} bytes ± {} in {} blocks)",
            thousands(e.bytes),
            thousands(e.bytes_error),
            thousands(e.blocks)
        )
        .unwrap();
    }
    writeln!(out, "{p}").unwrap();
    for m in &r.suppressions {
        let hidden = BytesBlocks {
            bytes: m.bytes,
            blocks: m.blocks,
        };
        writeln!(
            out,
            "{p}used suppression: {} records, {}: {} ({})",
            thousands(m.records),
            bytes_in_blocks(hidden),
            m.name,
            m.source
        )
        .unwrap();
    }
    if !r.suppressions.is_empty() {
        writeln!(out, "{p}").unwrap();
    }
}

fn history_text(out: &mut String, p: &str, r: &LeaksReport) {
    let Some(history) = &r.history else { return };
    writeln!(
        out,
        "{p}HISTORY: lost bytes (definitely + indirectly, possibly) per scan, per allocation site"
    )
    .unwrap();
    for site in history {
        let points: Vec<String> = site
            .snapshots
            .iter()
            .map(|pt| {
                format!(
                    "#{}: {} + {}",
                    pt.snapshot,
                    thousands(pt.definitely_lost.bytes + pt.indirectly_lost.bytes),
                    thousands(pt.possibly_lost.bytes)
                )
            })
            .collect();
        writeln!(out, "{p}{}", points.join(", ")).unwrap();
        writeln!(
            out,
            "{p} lost in every scan since allocated: {}",
            bytes_in_blocks(site.lost_in_every_snapshot)
        )
        .unwrap();
        stack_text(out, p, Some(site.allocated_by), &site.stack, site.stack_id);
        writeln!(out, "{p}").unwrap();
    }
}

fn error_text(out: &mut String, p: &str, e: &ErrorRecord, release_stacks: bool) {
    // Without release stacks, say why a first-free stack is missing.
    let free_stack_text = |out: &mut String| {
        if e.free_stack_id == 0 && !release_stacks {
            writeln!(
                out,
                "{p}   (not recorded: the trace was made with --no-release-stacks)"
            )
            .unwrap();
        } else {
            stack_text(out, p, e.free_function, &e.free_stack, e.free_stack_id);
        }
    };
    let (title, what) = match e.kind {
        "double_free" => (
            "Invalid free() / delete / delete[] / realloc()",
            " (double free)",
        ),
        "invalid_free" => (
            "Invalid free() / delete / delete[] / realloc()",
            " (invalid free)",
        ),
        "mismatched_free" => ("Mismatched free() / delete / delete []", ""),
        "mismatched_size" => ("Mismatched size in a sized delete / free_sized()", ""),
        "mismatched_alignment" => ("Mismatched alignment in new / delete", ""),
        _ => (
            "Invalid free() / delete / delete[] / realloc()",
            " (invalid realloc)",
        ),
    };
    writeln!(out, "{p}{title}{what}").unwrap();
    if e.count > 1 {
        writeln!(
            out,
            "{p} (happened {} times at this stack; the first is shown)",
            thousands(e.count)
        )
        .unwrap();
    }
    stack_text(out, p, Some(e.function), &e.stack, e.stack_id);
    let addr = format!("{:#x}", e.address);
    let alloc_at = |out: &mut String| {
        stack_text(out, p, e.alloc_function, &e.alloc_stack, e.alloc_stack_id);
    };
    match (e.kind, e.alloc_size) {
        ("mismatched_free", Some(size)) => {
            writeln!(
                out,
                "{p} Address {addr} is 0 bytes inside a block of size {} alloc'd",
                thousands(size)
            )
            .unwrap();
            alloc_at(out);
        }
        ("mismatched_size", Some(size)) => {
            writeln!(
                out,
                "{p} Address {addr} is a block of size {} released as size {}{}",
                thousands(size),
                thousands(e.given_size.unwrap_or(0)),
                if e.function.starts_with("operator delete") {
                    " (deleted through a pointer to another type?)"
                } else {
                    ""
                }
            )
            .unwrap();
            alloc_at(out);
        }
        ("mismatched_alignment", Some(size)) => {
            let side = |a: Option<u64>| match a {
                Some(0) => "without alignment".to_owned(),
                Some(a) => format!("with alignment {}", thousands(a)),
                None => "with alignment".to_owned(),
            };
            let (allocated, released) = (side(e.alloc_alignment), side(e.given_alignment));
            writeln!(
                out,
                "{p} Address {addr} is a block of size {} allocated {allocated}, released {released}",
                thousands(size)
            )
            .unwrap();
            alloc_at(out);
        }
        ("mismatched_free", None) => {
            writeln!(
                out,
                "{p} Address {addr} is a block allocated by another family"
            )
            .unwrap();
        }
        ("double_free" | "invalid_realloc", Some(size)) => {
            writeln!(
                out,
                "{p} Address {addr} is 0 bytes inside a block of size {} free'd",
                thousands(size)
            )
            .unwrap();
            free_stack_text(out);
            writeln!(out, "{p} Block was alloc'd at").unwrap();
            alloc_at(out);
        }
        ("double_free", None) => {
            writeln!(out, "{p} Address {addr} was already freed").unwrap();
            if e.free_stack_id != 0 || !release_stacks {
                writeln!(out, "{p} First freed at").unwrap();
                free_stack_text(out);
            }
        }
        _ => {
            writeln!(out, "{p} Address {addr} is not a block allocated by the program (or it was freed long ago)")
                .unwrap();
        }
    }
    if e.passed_on == Some(true) {
        writeln!(out, "{p} (the call was passed on to the C library anyway)").unwrap();
    }
}

#[cfg(test)]
mod tests {
    use trapline_trace::{EndCounters, ExitKind, SnapshotKind, TraceBuilder};

    use super::*;

    /// A production-mode trace as a one-threaded program ended by SIGTERM
    /// leaves it: the thread's sampled blocks first, then the exit
    /// snapshot, then the agent's own records with `Recording`. A stack
    /// leaks one sampled 1 KiB block a second: its estimate and its growth
    /// are of the bytes those blocks stand for, said to be estimates.
    #[test]
    fn a_recording_written_last_still_weighs_the_sampled_blocks() {
        let (mean, size, n) = (512u64 << 10, 1024u64, 40u64);
        let second = 1_000_000_000u64;
        let mut thread = vec![Event::StackDef {
            id: 1,
            frames: vec![0x1000],
        }];
        let block = |i: u64| 0x10_0000 + i * 0x1000;
        thread.extend((0..n).map(|i| Event::Alloc {
            time: (i + 1) * second,
            addr: block(i),
            size,
            align: 0,
            func: AllocFn::Malloc,
            stack: 1,
        }));
        let mut snapshot = vec![Event::SnapshotBegin {
            time: (n + 1) * second,
            kind: SnapshotKind::Exit,
        }];
        snapshot.extend((0..n).map(|i| Event::LiveBlock {
            addr: block(i),
            size,
            func: AllocFn::Malloc,
            stack: 1,
        }));
        snapshot.push(Event::SnapshotEnd {
            blocks: n,
            bytes: n * size,
        });
        snapshot.push(Event::End {
            time: (n + 1) * second,
            exit: ExitKind::Signal(15),
            counters: EndCounters::default(),
        });
        let agent = [Event::Recording {
            no_release_stacks: true,
            allocator_shadowed_by: None,
            allocator_library: None,
            memory_recorded: true,
            locks_recorded: false,
            sample_bytes: mean,
            production: true,
        }];
        let mut b = TraceBuilder::new();
        b.chunk(7, &thread).chunk(0, &snapshot).chunk(0, &agent);
        let report = analyze(&mut std::io::Cursor::new(b.into_bytes())).expect("a trace");
        let weight = Sampling { mean_bytes: mean }.weight_bytes(size);
        let r = &report.records[0];
        let e = r.estimate.expect("an estimate");
        // Each block's weight is rounded, the estimate's sum is not.
        assert!(
            e.bytes.abs_diff(n * weight) <= n && e.sampled_blocks == n,
            "{e:?}"
        );
        let g = r.growth.as_ref().expect("the leak grows");
        assert!(g.estimated, "{g:?}");
        assert!(
            (g.bytes_per_second / weight as f64 - 1.0).abs() < 0.05,
            "{g:?}, a block of {weight} a second"
        );
        let prod = report
            .sampling
            .and_then(|s| s.production)
            .expect("production");
        assert_eq!(prod.sampled_allocations, n);
    }
}
