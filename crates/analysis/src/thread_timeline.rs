//! What each thread did with locks over time, for timeline viewers
//! (`trapline export --format perfetto`): every wait for a busy lock, and
//! the holds of the locks some thread waited for.
//!
//! Two streaming passes. The first finds the contended locks and the
//! stacks (definitions can follow their first use); the second replays
//! ownership with [`crate::lockstate`] and hands each span to the caller,
//! so nothing grows with the number of spans. Holds of locks no thread
//! ever waited for are left out: they cannot explain a wait, and a hot
//! uncontended lock would bury the rest under millions of spans. Of a
//! contended lock, the holds one thread made between two waits for the
//! lock, none of them waited for, become one [`SpanKind::Holds`] span:
//! only the holds a thread waited through keep a span each. Times are the
//! trace's, so a single span is as precise as the agent's millisecond tick
//! (docs/recording.md, "Lock recording").

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Seek};

use serde::Serialize;
use trapline_trace::{Event, LockEvent, LockKind, LockMode, LockOp, TraceError};

use crate::index::{MergedEvents, TraceIndex};
use crate::lockstate::{mode_name, Applied, Held, LockId, LockState};
use crate::report::{stack_place, Facts, ProcessReport, StackSymbolizer, TraceStatus};

/// What a span is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    /// The thread waited for the lock, then took it.
    Wait,
    /// The thread held the lock.
    Hold,
    /// The thread was still waiting when the trace ended (a hang).
    WaitingAtEnd,
    /// The thread still held the lock when the trace ended.
    HeldAtEnd,
    /// Holds of one lock by one thread in one mode, between two waits
    /// for the lock, none of them waited for: from the first's start to
    /// the last's end ([`Span::holds`], [`Span::held_ns`]; the site is the
    /// first's).
    Holds,
}

impl SpanKind {
    pub fn name(self) -> &'static str {
        match self {
            SpanKind::Wait => "wait",
            SpanKind::Hold => "hold",
            SpanKind::WaitingAtEnd => "waiting at end",
            SpanKind::HeldAtEnd => "held at end",
            SpanKind::Holds => "holds",
        }
    }
}

/// One span of one thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span<'a> {
    /// The traced process (0 if the trace lost its first record).
    pub pid: u32,
    pub tid: u32,
    pub kind: SpanKind,
    /// The lock's address.
    pub lock: u64,
    /// The lock's kind (`mutex`, `rwlock`, ...).
    pub lock_kind: &'static str,
    /// `read`, `write` or `exclusive`.
    pub mode: &'static str,
    /// Nanoseconds since the start of the trace.
    pub start_ns: u64,
    pub duration_ns: u64,
    /// The holds the span stands for (1 but for [`SpanKind::Holds`]).
    pub holds: u64,
    /// Of those holds, the time the lock was held (the duration but for
    /// [`SpanKind::Holds`]).
    pub held_ns: u64,
    /// Where the thread took or asked for the lock, as
    /// [`crate::report::stack_place`] names it (None without a stack).
    pub site: Option<&'a str>,
}

/// Which locks' spans to keep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockSelector {
    /// The lock at this address.
    Address(u64),
    /// Locks taken or asked for at a place whose name (functions, files
    /// and lines, as [`Span::site`] gives them) contains this text.
    Site(String),
}

/// What the timeline keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpanFilter {
    /// Nanoseconds since the trace's start: spans that end before it are
    /// left out.
    pub from_ns: u64,
    /// Spans that start after it are left out.
    pub to_ns: Option<u64>,
    pub lock: Option<LockSelector>,
    /// Waits shorter than this are left out, and a lock counts as
    /// contended only when some wait for it lasted this long.
    pub min_wait_ns: u64,
}

impl SpanFilter {
    fn keeps(&self, start_ns: u64, duration_ns: u64) -> bool {
        start_ns.saturating_add(duration_ns) >= self.from_ns
            && self.to_ns.is_none_or(|to| start_ns <= to)
    }
}

/// What the filter and the merging of holds left out of the spans.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LeftOut {
    /// Holds of locks no thread waited for (at least `min_wait_ns`).
    pub uncontended_holds: u64,
    /// Waits shorter than `min_wait_ns`.
    pub short_waits: u64,
    /// Spans outside the time window.
    pub outside_window: u64,
    /// Contended locks `--lock` did not choose.
    pub other_locks: u64,
    /// Holds folded into [`SpanKind::Holds`] spans.
    pub merged_holds: u64,
}

/// What the pass learnt besides the spans.
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadTimeline {
    pub process: ProcessReport,
    /// The trace's first event time: span times count from it.
    pub start: u64,
    /// Every thread seen, main thread first, with its name when the trace
    /// holds one.
    pub threads: Vec<(u32, Option<String>)>,
    /// Locks some thread waited for (whose holds are spans too), of those
    /// the filter chose.
    pub contended_locks: u64,
    /// Spans handed out, by kind: wait, hold, waiting at end, held at
    /// end, merged holds.
    pub spans: [u64; 5],
    pub left_out: LeftOut,
    /// The places of the stacks the caller asked to have named (those
    /// without a frame left out).
    pub places: HashMap<u32, String>,
    pub trace: TraceStatus,
    pub warnings: Vec<String>,
}

/// Runs both passes, handing every span `filter` keeps to `sink`;
/// `name_stacks` are other stacks to name in [`ThreadTimeline::places`].
pub fn analyze<R: Read + Seek>(
    input: &mut R,
    name_stacks: &[u32],
    filter: &SpanFilter,
    mut sink: impl FnMut(&Span),
) -> Result<ThreadTimeline, TraceError> {
    let index = TraceIndex::build(input)?;
    let (start, _) = index.time_span();

    // Pass 1: contended locks and what symbolizes their sites.
    let mut facts = Facts::default();
    let mut state = LockState::default();
    let mut contended: HashSet<LockId> = HashSet::new();
    let mut lock_stacks: HashMap<LockId, HashSet<u32>> = HashMap::new();
    let by_site = matches!(filter.lock, Some(LockSelector::Site(_)));
    let mut names: HashMap<u32, String> = HashMap::new();
    let mut tids: Vec<u32> = Vec::new();
    let mut merged = MergedEvents::new(input, &index);
    for m in merged.by_ref() {
        facts.observe(m.time, &m.event);
        if let Event::ThreadName { tid, name } = &m.event {
            names.insert(*tid, name.clone());
        }
        if m.tid != 0 && !tids.contains(&m.tid) {
            tids.push(m.tid);
        }
        match m.event {
            Event::Lock(LockEvent::Acquire {
                addr,
                wait_ns,
                stack,
                ..
            }) => {
                let id = state.lock_id(addr);
                if wait_ns.is_some_and(|w| w >= filter.min_wait_ns) {
                    contended.insert(id);
                }
                if by_site {
                    lock_stacks.entry(id).or_default().insert(stack);
                }
            }
            Event::Lock(LockEvent::Request { addr, stack, .. }) if by_site => {
                let id = state.lock_id(addr);
                lock_stacks.entry(id).or_default().insert(stack);
            }
            _ => {}
        }
        state.apply(m.tid, &m.event);
    }
    for (_, p) in state.pending() {
        contended.insert(p.lock);
    }
    let read = merged.read_status();
    drop(merged);

    let mut sites = Sites {
        symbolizer: facts.symbolizer(),
        places: HashMap::new(),
    };
    let all_contended = contended.len() as u64;
    match &filter.lock {
        None => {}
        Some(LockSelector::Address(addr)) => contended.retain(|l| l.addr == *addr),
        Some(LockSelector::Site(text)) => contended.retain(|l| {
            lock_stacks.get(l).is_some_and(|stacks| {
                stacks.iter().any(|&s| {
                    sites
                        .place(&facts.stacks, s)
                        .is_some_and(|p| p.contains(text.as_str()))
                })
            })
        }),
    }
    drop(lock_stacks);

    // Pass 2: the spans.
    let pid = facts.process.as_ref().map_or(0, |p| p.pid);
    let mut out = SpanOut {
        pid,
        filter,
        spans: [0; 5],
        left_out: LeftOut {
            other_locks: all_contended - contended.len() as u64,
            ..LeftOut::default()
        },
        sites,
        stacks: &facts.stacks,
        sink: &mut sink,
    };
    let since = |t: u64| t.saturating_sub(start);
    let mut state = LockState::default();
    let mut hold_stacks: HashMap<(u32, LockId), u32> = HashMap::new();
    // The threads asking for a contended lock, and which.
    let mut requesting: HashMap<u32, LockId> = HashMap::new();
    // Per contended lock, its threads' holds not yet handed out (ordered,
    // so those left at the end are written in the same order every time).
    let mut runs: BTreeMap<LockId, Vec<Run>> = BTreeMap::new();
    let mut last_time = start;
    for m in MergedEvents::new(input, &index) {
        last_time = last_time.max(m.time);
        match m.event {
            Event::Lock(LockEvent::Request { addr, .. }) => {
                let id = state.lock_id(addr);
                if contended.contains(&id) {
                    requesting.insert(m.tid, id);
                }
            }
            Event::Lock(LockEvent::Failed { .. }) => {
                requesting.remove(&m.tid);
            }
            Event::Lock(LockEvent::Acquire {
                addr,
                kind,
                mode,
                op,
                wait_ns,
                stack,
                ..
            }) => {
                let id = state.lock_id(addr);
                requesting.remove(&m.tid);
                if contended.contains(&id) {
                    if op != LockOp::CondWait {
                        hold_stacks.entry((m.tid, id)).or_insert(stack);
                    }
                    if let Some(w) = wait_ns {
                        // A wait ends every run of the lock: each run's
                        // last hold, if it ended while this thread waited,
                        // was waited for.
                        let waited_since = since(m.time.saturating_sub(w));
                        for r in runs.get_mut(&id).into_iter().flat_map(|r| r.drain(..)) {
                            out.run(&r, r.last.tid != m.tid && r.last.end_ns >= waited_since);
                        }
                        let begin = m.time.saturating_sub(w).max(start);
                        let span = lock_span(m.tid, SpanKind::Wait, id, kind, mode);
                        let span = Span {
                            start_ns: since(begin),
                            duration_ns: m.time - begin,
                            held_ns: m.time - begin,
                            ..span
                        };
                        if w >= filter.min_wait_ns {
                            out.emit(span, stack);
                        }
                    }
                }
                if wait_ns.is_some_and(|w| w < filter.min_wait_ns) {
                    out.left_out.short_waits += 1;
                }
            }
            _ => {}
        }
        if let Applied::Released {
            lock,
            held: Some(h),
        } = state.apply(m.tid, &m.event)
        {
            if h.depth != 0 {
                continue;
            }
            if !contended.contains(&lock) {
                out.left_out.uncontended_holds += 1;
                continue;
            }
            let stack = hold_stacks.remove(&(m.tid, lock)).unwrap_or(h.stack);
            let hold = HoldSpan {
                tid: m.tid,
                held: h,
                stack,
                start_ns: since(h.time),
                end_ns: since(m.time.max(h.time)),
            };
            let lock_runs = runs.entry(lock).or_default();
            let mine = lock_runs.iter().position(|r| r.last.tid == m.tid);
            if requesting.values().any(|&asked| asked == lock) {
                // Some thread is waiting for it now: its own span.
                if let Some(i) = mine {
                    out.run(&lock_runs.swap_remove(i), false);
                }
                out.hold(&hold, SpanKind::Hold);
                continue;
            }
            match mine {
                Some(i) if lock_runs[i].extends(&hold) => lock_runs[i].push(hold),
                Some(i) => {
                    out.run(&lock_runs[i], false);
                    lock_runs[i] = Run::new(hold);
                }
                None => lock_runs.push(Run::new(hold)),
            }
        }
    }
    for r in runs.values().flatten() {
        out.run(r, false);
    }
    // What the end of the trace left open: a hung program's picture.
    let end = last_time.max(facts.last_time);
    for (tid, p) in state.pending() {
        if !contended.contains(&p.lock) {
            continue;
        }
        let span = lock_span(tid, SpanKind::WaitingAtEnd, p.lock, p.kind, p.mode);
        let duration_ns = end.saturating_sub(p.time);
        let span = Span {
            start_ns: since(p.time),
            duration_ns,
            held_ns: duration_ns,
            ..span
        };
        out.emit(span, p.stack);
    }
    let mut open: BTreeMap<(u32, LockId), _> = BTreeMap::new();
    for &tid in &tids {
        for h in state.held(tid) {
            if contended.contains(&h.lock) {
                open.insert((tid, h.lock), *h);
            }
        }
    }
    for ((tid, _), h) in open {
        let hold = HoldSpan {
            tid,
            held: h,
            stack: h.stack,
            start_ns: since(h.time),
            end_ns: since(end.max(h.time)),
        };
        out.hold(&hold, SpanKind::HeldAtEnd);
    }

    let SpanOut {
        spans,
        left_out,
        mut sites,
        ..
    } = out;
    let process = facts.process_report();
    // The main thread first (its tid is the pid), then in order of appearance.
    tids.sort_by_key(|&t| Some(t) != process.pid);
    let threads = tids.into_iter().map(|t| (t, names.remove(&t))).collect();
    let places = name_stacks
        .iter()
        .filter_map(|&id| Some((id, sites.place(&facts.stacks, id)?)))
        .collect();
    let warnings = sites.symbolizer.warnings();
    Ok(ThreadTimeline {
        trace: facts.trace_status(&index, read),
        process,
        start,
        threads,
        contended_locks: contended.len() as u64,
        spans,
        left_out,
        places,
        warnings,
    })
}

/// One ended (or, at the end, open) hold of a contended lock.
#[derive(Clone, Copy, Debug)]
struct HoldSpan {
    tid: u32,
    held: Held,
    stack: u32,
    start_ns: u64,
    end_ns: u64,
}

/// Holds of one lock by one thread, in one mode, not yet handed out:
/// all but the last are unwaited and merged; the last may yet turn out
/// waited for. Other threads' unwaited holds of the lock may fall between
/// them; the next wait for the lock ends the run.
#[derive(Clone, Copy, Debug)]
struct Run {
    first: HoldSpan,
    last: HoldSpan,
    /// The end of the hold before the last (the last's end for one hold).
    before_last_end_ns: u64,
    holds: u64,
    held_ns: u64,
}

impl Run {
    fn new(hold: HoldSpan) -> Run {
        Run {
            first: hold,
            last: hold,
            before_last_end_ns: hold.end_ns,
            holds: 1,
            held_ns: hold.end_ns - hold.start_ns,
        }
    }

    /// Whether `hold` is in the run's mode.
    fn extends(&self, hold: &HoldSpan) -> bool {
        hold.held.mode == self.last.held.mode
    }

    fn push(&mut self, hold: HoldSpan) {
        self.before_last_end_ns = self.last.end_ns;
        self.last = hold;
        self.holds += 1;
        self.held_ns += hold.end_ns - hold.start_ns;
    }
}

/// Where spans go: the filter, the counts, the site names and the sink.
struct SpanOut<'f, 's, F: FnMut(&Span)> {
    pid: u32,
    filter: &'f SpanFilter,
    spans: [u64; 5],
    left_out: LeftOut,
    sites: Sites,
    stacks: &'s HashMap<u32, Vec<u64>>,
    sink: &'s mut F,
}

impl<F: FnMut(&Span)> SpanOut<'_, '_, F> {
    fn emit(&mut self, span: Span, stack: u32) {
        if !self.filter.keeps(span.start_ns, span.duration_ns) {
            self.left_out.outside_window += span.holds;
            return;
        }
        let site = self.sites.place(self.stacks, stack);
        self.spans[span.kind as usize] += 1;
        if span.kind == SpanKind::Holds {
            self.left_out.merged_holds += span.holds;
        }
        (self.sink)(&Span {
            pid: self.pid,
            site: site.as_deref(),
            ..span
        });
    }

    fn hold(&mut self, hold: &HoldSpan, kind: SpanKind) {
        let h = &hold.held;
        let duration_ns = hold.end_ns - hold.start_ns;
        let span = Span {
            start_ns: hold.start_ns,
            duration_ns,
            held_ns: duration_ns,
            ..lock_span(hold.tid, kind, h.lock, h.kind, h.mode)
        };
        self.emit(span, hold.stack);
    }

    /// Hands out a run: one hold as itself, more as one merged span; with
    /// `last_waited`, the last hold apart, as a hold some thread waited
    /// for.
    fn run(&mut self, run: &Run, last_waited: bool) {
        let (holds, held_ns, end_ns) = if last_waited {
            self.hold(&run.last, SpanKind::Hold);
            let last = run.last.end_ns - run.last.start_ns;
            (run.holds - 1, run.held_ns - last, run.before_last_end_ns)
        } else {
            (run.holds, run.held_ns, run.last.end_ns)
        };
        match holds {
            0 => {}
            1 => self.hold(&run.first, SpanKind::Hold),
            _ => {
                let h = &run.first.held;
                let span = Span {
                    start_ns: run.first.start_ns,
                    duration_ns: end_ns - run.first.start_ns,
                    holds,
                    held_ns,
                    ..lock_span(run.first.tid, SpanKind::Holds, h.lock, h.kind, h.mode)
                };
                self.emit(span, run.first.stack);
            }
        }
    }
}

fn lock_span(
    tid: u32,
    kind: SpanKind,
    lock: LockId,
    lock_kind: LockKind,
    mode: LockMode,
) -> Span<'static> {
    Span {
        pid: 0,
        tid,
        kind,
        lock: lock.addr,
        lock_kind: lock_kind.name(),
        mode: mode_name(lock_kind, mode),
        start_ns: 0,
        duration_ns: 0,
        holds: 1,
        held_ns: 0,
        site: None,
    }
}

/// Stack ids to places, symbolized once each.
struct Sites {
    symbolizer: StackSymbolizer,
    places: HashMap<u32, Option<String>>,
}

impl Sites {
    fn place(&mut self, stacks: &HashMap<u32, Vec<u64>>, stack: u32) -> Option<String> {
        if stack == 0 {
            return None;
        }
        if let Some(p) = self.places.get(&stack) {
            return p.clone();
        }
        let frames = self.symbolizer.stack(stacks, stack);
        let place = stack_place(&frames, " <- ");
        self.places.insert(stack, place.clone());
        place
    }
}
