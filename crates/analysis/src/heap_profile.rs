//! The heap by allocation stack, for the exports (`trapline export`): per
//! stack, what was allocated over the run and what was still live at the
//! end (the exit snapshot when the trace has one, else the replay's live
//! blocks), as the four sample types of a pprof heap profile.
//!
//! Under sampled recording only the sampled blocks, which carry their full
//! stack, are counted, each weighted by the inverse of its chance to be
//! sampled (`sampling.rs`): the totals are estimates of all blocks, as a
//! sampling heap profiler's are. The caller-only blocks are left out, since
//! their full stacks are what the estimate stands for.

use crate::index_file::TraceInput;
use std::collections::HashMap;

use serde::Serialize;
use trapline_trace::{Event, ScanTrigger, TraceError};

use crate::index::{MergedEvent, ReadStatus, TraceIndex};
use crate::replay::{Block, HeapReplay};
use crate::report::{Facts, FrameReport, ProcessReport, TraceStatus};
use crate::sampling::SamplingReport;
use crate::stats::{StatsAnalysis, StatsReport};

/// The heap by allocation stack.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HeapProfile {
    pub process: ProcessReport,
    /// Sampled recording's mean, when the values are estimates.
    pub sampling: Option<SamplingReport>,
    /// Nanoseconds from the trace's first to its last event.
    pub duration_ns: u64,
    /// The time of the trace's last event.
    pub end_ns: u64,
    /// Where the live values come from: `"exit_snapshot"` or `"replay"`.
    pub live_source: &'static str,
    /// The time asked for (seconds of the trace's clock) at which the
    /// sites' `live_at_*` values were taken, from the heap replay.
    pub live_at_seconds: Option<f64>,
    /// Allocation stacks, most live bytes first, then most bytes allocated.
    pub sites: Vec<HeapSite>,
    pub warnings: Vec<String>,
    pub trace: TraceStatus,
}

/// One allocation stack's totals.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HeapSite {
    /// Innermost first, inlined frames expanded.
    pub frames: Vec<FrameReport>,
    pub allocations: u64,
    pub allocated_bytes: u64,
    pub live_blocks: u64,
    pub live_bytes: u64,
    /// Live at [`HeapProfile::live_at_seconds`] (0 when not asked).
    pub live_at_blocks: u64,
    pub live_at_bytes: u64,
}

#[derive(Default, Clone, Copy)]
struct Totals {
    allocations: f64,
    allocated_bytes: f64,
    live_blocks: f64,
    live_bytes: f64,
    live_at_blocks: f64,
    live_at_bytes: f64,
}

/// How a block of one stack counts: as itself (not sampled), as `1 / p`
/// blocks of `size / p` bytes (a sampled full stack), or not at all (the
/// other stacks of a sampled trace).
fn weight(facts: &Facts, stack: u32, size: u64) -> Option<f64> {
    match (facts.sampling, facts.sampled_full_stack(stack)) {
        (None, _) => Some(1.0),
        (Some(_), Some(s)) => Some(1.0 / s.probability(size)),
        (Some(_), None) => None,
    }
}

/// Analyses a trace.
pub fn analyze<R: TraceInput>(input: &mut R) -> Result<HeapProfile, TraceError> {
    analyze_at(input, None)
}

/// Analyses a trace, and takes the live blocks at its time `at_ns` too
/// (the trace's clock, as every report prints times): as they were before
/// the first event after that time, at the end when the trace ends before.
pub fn analyze_at<R: TraceInput>(
    input: &mut R,
    at_ns: Option<u64>,
) -> Result<HeapProfile, TraceError> {
    crate::pass::run(input, |_| HeapProfileAnalysis::new(at_ns))
}

/// The heap profile as a [`crate::pass::Pass`] (see [`analyze_at`]).
pub struct HeapProfileAnalysis {
    heap: HeapReplay<Block>,
    sites: HeapSites,
}

impl HeapProfileAnalysis {
    pub fn new(at_ns: Option<u64>) -> Self {
        HeapProfileAnalysis {
            heap: HeapReplay::default(),
            sites: HeapSites::new(at_ns),
        }
    }
}

impl crate::pass::Pass for HeapProfileAnalysis {
    type Report = HeapProfile;

    fn observe(&mut self, m: &MergedEvent) {
        self.sites.before_replay(m, &self.heap);
        self.heap.apply(&m.event);
        self.sites.after_replay(m);
    }

    fn finish(self, index: &TraceIndex, stopped: ReadStatus) -> Result<HeapProfile, TraceError> {
        self.sites.finish(&self.heap, index, stopped)
    }
}

/// Stats and the heap profile on one heap replay, stats': the live
/// blocks are kept once.
pub fn with_stats(
    listed: usize,
    at_ns: Option<u64>,
) -> impl crate::pass::Pass<Report = (StatsReport, HeapProfile)> {
    StatsAndHeapProfile {
        stats: StatsAnalysis::new(Some(listed)),
        sites: HeapSites::new(at_ns),
    }
}

struct StatsAndHeapProfile {
    stats: StatsAnalysis<Block>,
    sites: HeapSites,
}

impl crate::pass::Pass for StatsAndHeapProfile {
    type Report = (StatsReport, HeapProfile);

    fn observe(&mut self, m: &MergedEvent) {
        self.sites.before_replay(m, self.stats.heap());
        self.stats.observe(m);
        self.sites.after_replay(m);
    }

    fn finish(
        self,
        index: &TraceIndex,
        read: ReadStatus,
    ) -> Result<(StatsReport, HeapProfile), TraceError> {
        let heap = self.sites.finish(self.stats.heap(), index, read.clone())?;
        Ok((self.stats.finish(index, read)?, heap))
    }
}

/// The heap profile's own state, beside a heap replay that another part
/// applies the events to.
struct HeapSites {
    at_ns: Option<u64>,
    take_at: Option<u64>,
    facts: Facts,
    sites: HashMap<u32, Totals>,
    /// By (scan number, 0 for live blocks; stack).
    snapshot: HashMap<(u32, u32), Totals>,
    exit_scan: u32,
    first: u64,
    last: u64,
}

impl HeapSites {
    fn new(at_ns: Option<u64>) -> Self {
        HeapSites {
            at_ns,
            take_at: at_ns,
            facts: Facts::default(),
            sites: HashMap::new(),
            snapshot: HashMap::new(),
            exit_scan: 0,
            first: u64::MAX,
            last: 0,
        }
    }

    /// Before `m` is applied to `heap`: the live blocks at `--at` are the
    /// ones before the first event after it.
    fn before_replay(&mut self, m: &MergedEvent, heap: &HeapReplay<Block>) {
        self.facts.observe(m.time, &m.event);
        if m.time != 0 {
            self.first = self.first.min(m.time);
            self.last = self.last.max(m.time);
            if self.take_at.is_some_and(|t| m.time > t) {
                self.take_at = None;
                count_live(&self.facts, heap, &mut self.sites, true);
            }
        }
    }

    fn after_replay(&mut self, m: &MergedEvent) {
        let allocated = match m.event {
            Event::Alloc { size, stack, .. } => Some((size, stack)),
            Event::Realloc {
                new_addr,
                size,
                stack,
                ..
            } if new_addr != 0 => Some((size, stack)),
            _ => None,
        };
        if let Some((size, stack)) = allocated {
            if let Some(w) = weight(&self.facts, stack, size) {
                let t = self.sites.entry(stack).or_default();
                t.allocations += w;
                t.allocated_bytes += w * size as f64;
            }
        }
        // The exit snapshot's blocks: its live blocks, or, when the exit
        // scan judged them, that scan's blocks.
        let live = match m.event {
            Event::LiveBlock { size, stack, .. } => Some((0, size, stack)),
            Event::ScanBlock {
                scan, size, stack, ..
            } => Some((scan, size, stack)),
            Event::ScanBegin {
                scan,
                trigger: ScanTrigger::Exit,
                ..
            } => {
                self.exit_scan = scan;
                None
            }
            _ => None,
        };
        if let Some((scan, size, stack)) = live {
            if let Some(w) = weight(&self.facts, stack, size) {
                let t = self.snapshot.entry((scan, stack)).or_default();
                t.live_blocks += w;
                t.live_bytes += w * size as f64;
            }
        }
    }

    fn finish(
        self,
        heap: &HeapReplay<Block>,
        index: &TraceIndex,
        stopped: ReadStatus,
    ) -> Result<HeapProfile, TraceError> {
        let HeapSites {
            at_ns,
            take_at,
            facts,
            mut sites,
            snapshot,
            exit_scan,
            first,
            last,
        } = self;
        if take_at.is_some() {
            count_live(&facts, heap, &mut sites, true);
        }

        let live_source = if facts.has_exit_snapshot() {
            for ((_, stack), t) in snapshot
                .into_iter()
                .filter(|((scan, _), _)| *scan == exit_scan)
            {
                let s = sites.entry(stack).or_default();
                s.live_blocks = t.live_blocks;
                s.live_bytes = t.live_bytes;
            }
            "exit_snapshot"
        } else {
            count_live(&facts, heap, &mut sites, false);
            "replay"
        };

        let mut symbolizer = facts.symbolizer();
        let round = |v: f64| v.round() as u64;
        let mut out: Vec<(u32, HeapSite)> = sites
            .into_iter()
            .map(|(stack, t)| {
                (
                    stack,
                    HeapSite {
                        frames: symbolizer.stack(&facts.stacks, stack),
                        allocations: round(t.allocations),
                        allocated_bytes: round(t.allocated_bytes),
                        live_blocks: round(t.live_blocks),
                        live_bytes: round(t.live_bytes),
                        live_at_blocks: round(t.live_at_blocks),
                        live_at_bytes: round(t.live_at_bytes),
                    },
                )
            })
            .collect();
        out.sort_by(|(a_id, a), (b_id, b)| {
            b.live_bytes
                .cmp(&a.live_bytes)
                .then(b.allocated_bytes.cmp(&a.allocated_bytes))
                .then(a_id.cmp(b_id))
        });
        Ok(HeapProfile {
            process: facts.process_report(),
            sampling: facts.sampling_report(),
            duration_ns: last.saturating_sub(first.min(last)),
            live_source,
            live_at_seconds: at_ns.map(|at| at.min(last) as f64 / 1e9),
            end_ns: last,
            sites: out.into_iter().map(|(_, s)| s).collect(),
            warnings: facts.memory_warnings(&symbolizer),
            trace: facts.trace_status(index, stopped),
        })
    }
}

/// Counts the replay's live blocks into the sites' `live_*`, or their
/// `live_at_*` when `at`.
fn count_live(facts: &Facts, heap: &HeapReplay<Block>, sites: &mut HashMap<u32, Totals>, at: bool) {
    for b in heap.live.values() {
        if let Some(w) = weight(facts, b.stack, b.size) {
            let t = sites.entry(b.stack).or_default();
            let (blocks, bytes) = if at {
                (&mut t.live_at_blocks, &mut t.live_at_bytes)
            } else {
                (&mut t.live_blocks, &mut t.live_bytes)
            };
            *blocks += w;
            *bytes += w * b.size as f64;
        }
    }
}
