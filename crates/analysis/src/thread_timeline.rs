//! What each thread did with locks over time, for timeline viewers
//! (`trapline export --format perfetto`): every wait for a busy lock, and
//! every hold of a lock that some thread waited for.
//!
//! Two streaming passes. The first finds the contended locks and the
//! stacks (definitions can follow their first use); the second replays
//! ownership with [`crate::lockstate`] and hands each span to the caller as
//! it ends, so nothing grows with the number of spans. Holds of locks no
//! thread ever waited for are left out: they cannot explain a wait, and a
//! hot uncontended lock would bury the rest under millions of spans. Times
//! are the trace's, so a single span is as precise as the agent's
//! millisecond tick (docs/recording.md, "Lock recording").

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Seek};

use trapline_trace::{Event, LockEvent, LockKind, LockMode, LockOp, TraceError};

use crate::index::{MergedEvents, TraceIndex};
use crate::lockstate::{mode_name, Applied, LockId, LockState};
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
}

impl SpanKind {
    pub fn name(self) -> &'static str {
        match self {
            SpanKind::Wait => "wait",
            SpanKind::Hold => "hold",
            SpanKind::WaitingAtEnd => "waiting at end",
            SpanKind::HeldAtEnd => "held at end",
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
    /// Where the thread took or asked for the lock, as
    /// [`crate::report::stack_place`] names it (None without a stack).
    pub site: Option<&'a str>,
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
    /// Locks some thread waited for (whose holds are spans too).
    pub contended_locks: u64,
    /// Spans handed out, by kind: wait, hold, waiting at end, held at end.
    pub spans: [u64; 4],
    /// The places of the stacks the caller asked to have named (those
    /// without a frame left out).
    pub places: HashMap<u32, String>,
    pub trace: TraceStatus,
    pub warnings: Vec<String>,
}

/// Runs both passes, handing every span to `sink` in the order spans end;
/// `name_stacks` are other stacks to name in [`ThreadTimeline::places`].
pub fn analyze<R: Read + Seek>(
    input: &mut R,
    name_stacks: &[u32],
    mut sink: impl FnMut(&Span),
) -> Result<ThreadTimeline, TraceError> {
    let index = TraceIndex::build(input)?;
    let (start, _) = index.time_span();

    // Pass 1: contended locks and what symbolizes their sites.
    let mut facts = Facts::default();
    let mut state = LockState::default();
    let mut contended: HashSet<LockId> = HashSet::new();
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
        if let Event::Lock(LockEvent::Acquire {
            addr,
            wait_ns: Some(_),
            ..
        }) = m.event
        {
            contended.insert(state.lock_id(addr));
        }
        state.apply(m.tid, &m.event);
    }
    for (_, p) in state.pending() {
        contended.insert(p.lock);
    }
    let read = merged.read_status();
    drop(merged);

    // Pass 2: the spans.
    let mut sites = Sites {
        symbolizer: facts.symbolizer(),
        places: HashMap::new(),
    };
    let mut spans = [0u64; 4];
    let pid = facts.process.as_ref().map_or(0, |p| p.pid);
    let mut emit = |sites: &mut Sites, stacks: &HashMap<u32, Vec<u64>>, span: Span, stack: u32| {
        let site = sites.place(stacks, stack);
        spans[span.kind as usize] += 1;
        sink(&Span {
            pid,
            site: site.as_deref(),
            ..span
        });
    };
    let since = |t: u64| t.saturating_sub(start);
    let mut state = LockState::default();
    let mut hold_stacks: HashMap<(u32, LockId), u32> = HashMap::new();
    let mut last_time = start;
    for m in MergedEvents::new(input, &index) {
        last_time = last_time.max(m.time);
        if let Event::Lock(LockEvent::Acquire {
            addr,
            kind,
            mode,
            op,
            wait_ns,
            stack,
            ..
        }) = m.event
        {
            let id = state.lock_id(addr);
            if contended.contains(&id) {
                if op != LockOp::CondWait {
                    hold_stacks.entry((m.tid, id)).or_insert(stack);
                }
                if let Some(w) = wait_ns {
                    let begin = m.time.saturating_sub(w).max(start);
                    let span = lock_span(m.tid, SpanKind::Wait, id, kind, mode);
                    emit(
                        &mut sites,
                        &facts.stacks,
                        Span {
                            start_ns: since(begin),
                            duration_ns: m.time - begin,
                            ..span
                        },
                        stack,
                    );
                }
            }
        }
        if let Applied::Released {
            lock,
            held: Some(h),
        } = state.apply(m.tid, &m.event)
        {
            if h.depth == 0 && contended.contains(&lock) {
                let stack = hold_stacks.remove(&(m.tid, lock)).unwrap_or(h.stack);
                let span = lock_span(m.tid, SpanKind::Hold, lock, h.kind, h.mode);
                emit(
                    &mut sites,
                    &facts.stacks,
                    Span {
                        start_ns: since(h.time),
                        duration_ns: m.time.saturating_sub(h.time),
                        ..span
                    },
                    stack,
                );
            }
        }
    }
    // What the end of the trace left open: a hung program's picture.
    let end = last_time.max(facts.last_time);
    for (tid, p) in state.pending() {
        let span = lock_span(tid, SpanKind::WaitingAtEnd, p.lock, p.kind, p.mode);
        emit(
            &mut sites,
            &facts.stacks,
            Span {
                start_ns: since(p.time),
                duration_ns: end.saturating_sub(p.time),
                ..span
            },
            p.stack,
        );
    }
    let mut open: BTreeMap<(u32, LockId), _> = BTreeMap::new();
    for &tid in &tids {
        for h in state.held(tid) {
            if contended.contains(&h.lock) {
                open.insert((tid, h.lock), *h);
            }
        }
    }
    for ((tid, lock), h) in open {
        let span = lock_span(tid, SpanKind::HeldAtEnd, lock, h.kind, h.mode);
        emit(
            &mut sites,
            &facts.stacks,
            Span {
                start_ns: since(h.time),
                duration_ns: end.saturating_sub(h.time),
                ..span
            },
            h.stack,
        );
    }

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
        places,
        warnings,
    })
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
