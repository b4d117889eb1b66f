//! Locks: a contention profile (what mutrace shows). Per lock and, for
//! rwlocks, per mode: acquisitions, contended acquisitions (the lock was busy
//! when asked for; the agent measured the wait), owner changes (an
//! acquisition by another thread than the previous one), threads, wait and
//! hold times, where the lock was initialized or first used, and the call
//! sites that waited most.
//!
//! One streaming pass in global time order over the lock events, replaying
//! ownership with [`crate::lockstate`]. Hold times come from event times,
//! which are the agent's millisecond tick made strictly increasing per lock:
//! totals over many holds are unbiased, a single short hold reads as
//! nanoseconds or as a tick (docs/recording.md, "Lock recording").

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::Serialize;
use trapline_trace::{Event, LockEvent, LockKind, LockMode, LockOp, TraceError};

use crate::index::{ChunkEntry, MergedEvent, ReadStatus, TraceIndex};
use crate::index_file::{ChunkSummary, IndexFile, Learned, TraceInput};
use crate::lockstate::{errors_text, mode_name, stack_text, Applied, LockError, LockId, LockState};
use crate::pass::Pass;
use crate::report::{
    command_text, footer_text, prefix, serialize_hex, thousands, warnings_text, Facts, FrameReport,
    ProcessReport, TraceStatus,
};

/// Contending call sites listed per lock.
const TOP_SITES: usize = 5;

/// The `trapline locks` report (its JSON form is the stable schema).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LocksReport {
    /// The traced process.
    pub process: ProcessReport,
    /// Whether the trace holds any lock event at all.
    pub has_lock_events: bool,
    /// Whether locks were recorded (`trapline run --record` without
    /// `locks` leaves them out).
    pub locks_recorded: bool,
    /// Recorded in production mode (`trapline run --production`): only
    /// contended acquisitions and the holds of each thread's first
    /// acquisition at a new pair of lock sites are in the trace.
    pub production_mode: bool,
    /// Totals over every lock.
    pub totals: LockTotals,
    /// Per lock and mode: most contended first, then most owner changes,
    /// then most acquisitions; the first `--top` of them.
    pub locks: Vec<LockReport>,
    /// Lock and mode entries ranked after those listed (`--top`); the
    /// totals count them.
    pub locks_omitted: u64,
    /// Lock misuse found in the trace.
    pub errors: Vec<LockError>,
    /// Events the agent could not record; null without an end record.
    pub events_lost: Option<u64>,
    /// Whether the trace was complete.
    pub trace: TraceStatus,
    /// Problems met while symbolizing.
    pub warnings: Vec<String>,
}

/// Totals of the run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LockTotals {
    /// Distinct locks used.
    pub locks: u64,
    pub acquisitions: u64,
    pub contended: u64,
    pub owner_changes: u64,
    /// Nanoseconds threads waited for busy locks.
    pub wait_ns: u64,
    /// Threads that took a lock.
    pub threads: u64,
}

/// Total, maximum and average of a duration, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Durations {
    pub total: u64,
    pub max: u64,
    /// total / count (0 without any).
    pub avg: u64,
}

/// One lock, in one mode for rwlocks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LockReport {
    /// The lock's address.
    #[serde(serialize_with = "serialize_hex")]
    pub address: u64,
    /// `mutex`, `recursive_mutex`, `errorcheck_mutex`, `adaptive_mutex`, `rwlock` or `spinlock`.
    pub kind: &'static str,
    /// `read` or `write` for rwlocks, `exclusive` otherwise.
    pub mode: &'static str,
    /// Successful acquisitions (lock, trylock, timed), condition-wait re-acquisitions excluded.
    pub acquisitions: u64,
    /// Acquisitions that found the lock busy and waited, and waits still
    /// under way when the trace ended (`waiting_at_end`).
    pub contended: u64,
    /// Threads still waiting for the lock when the trace ended (a hung
    /// program): counted in `contended`, their wait until the end in
    /// `wait_ns`.
    pub waiting_at_end: u64,
    /// Acquisitions by another thread than the lock's previous acquirer.
    pub owner_changes: u64,
    /// Distinct threads that acquired it.
    pub threads: u64,
    /// trylock calls that found it busy.
    pub try_failures: u64,
    /// Timed acquisitions that gave up.
    pub timeouts: u64,
    /// Re-acquisitions on return from a condition wait.
    pub cond_waits: u64,
    /// Waits of contended acquisitions and of waits under way at the end
    /// (avg over `contended`).
    pub wait_ns: Durations,
    /// Holds (avg over holds that ended), without the agent's own work
    /// inside them (`agent_ns_in_holds`).
    pub hold_ns: Durations,
    /// The time trapline's agent spent inside the holds, recording calls
    /// the program made while holding the lock (a `malloc` under its
    /// allocator's mutex), left out of `hold_ns` (0 in traces before
    /// format version 12).
    pub agent_ns_in_holds: u64,
    /// `init` when the trace holds its pthread_*_init, else `first_acquisition`.
    pub first_use: &'static str,
    /// Where it was initialized or first used.
    pub first_use_stack: Vec<FrameReport>,
    /// Call sites of contended acquisitions, most contended first.
    pub top_sites: Vec<ContendingSite>,
}

/// A call site that waited for the lock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ContendingSite {
    pub contended: u64,
    pub wait_ns: u64,
    pub stack: Vec<FrameReport>,
}

#[derive(Default)]
struct Acc {
    kind: Option<LockKind>,
    acquisitions: u64,
    contended: u64,
    owner_changes: u64,
    threads: Vec<u32>,
    try_failures: u64,
    timeouts: u64,
    cond_waits: u64,
    waiting_at_end: u64,
    wait_total: u64,
    wait_max: u64,
    holds: u64,
    hold_total: u64,
    /// The agent's time inside the holds, left out of them.
    hold_agent: u64,
    hold_max: u64,
    /// stack id -> (contended, wait)
    sites: HashMap<u32, (u64, u64)>,
}

#[derive(Default)]
struct PerLock {
    last_owner: Option<u32>,
    first_stack: u32,
    from_init: bool,
    seen: bool,
}

/// Locks listed by default (`trapline locks --top`).
pub const DEFAULT_TOP: usize = 20;

/// Analyses a trace, every lock listed. Fails only when the input is not a
/// readable trace at all.
pub fn analyze<R: TraceInput>(input: &mut R) -> Result<LocksReport, TraceError> {
    analyze_top(input, None)
}

/// Analyses a trace, listing the `top` highest-ranked lock and mode
/// entries (all with None).
pub fn analyze_top<R: TraceInput>(
    input: &mut R,
    top: Option<usize>,
) -> Result<LocksReport, TraceError> {
    crate::pass::run(input, |_| LocksAnalysis::new(top))
}

/// The locks analysis as a [`Pass`], to share a read of the trace.
pub struct LocksAnalysis {
    top: Option<usize>,
    facts: Facts,
    state: LockState,
    accs: HashMap<(LockId, LockMode), Acc>,
    per_lock: HashMap<LockId, PerLock>,
    threads: Vec<u32>,
}

impl LocksAnalysis {
    /// Lists the `top` most contended locks (None: all).
    pub fn new(top: Option<usize>) -> Self {
        LocksAnalysis {
            top,
            facts: Facts::default(),
            state: LockState::default(),
            accs: HashMap::new(),
            per_lock: HashMap::new(),
            threads: Vec::new(),
        }
    }
}

impl Pass for LocksAnalysis {
    type Report = LocksReport;

    fn observe(&mut self, m: &MergedEvent) {
        self.facts.observe(m.time, &m.event);
        self.state.at(m);
        if let Event::Lock(l) = &m.event {
            if let Some(addr) = l.addr() {
                let id = self.state.lock_id(addr);
                let p = self.per_lock.entry(id).or_default();
                let stack = match l {
                    LockEvent::Init { stack, .. }
                    | LockEvent::Acquire { stack, .. }
                    | LockEvent::Request { stack, .. }
                    | LockEvent::Failed { stack, .. } => Some(*stack),
                    _ => None,
                };
                if let Some(stack) = stack.filter(|_| !p.seen) {
                    p.seen = true;
                    p.first_stack = stack;
                    p.from_init = matches!(l, LockEvent::Init { .. });
                }
            }
            match *l {
                LockEvent::Acquire {
                    addr,
                    kind,
                    mode,
                    op,
                    wait_ns,
                    stack,
                    ..
                } => {
                    let id = self.state.lock_id(addr);
                    let a = self.accs.entry((id, mode)).or_default();
                    a.kind = Some(kind);
                    if op == LockOp::CondWait {
                        a.cond_waits += 1;
                    } else {
                        a.acquisitions += 1;
                        let p = self.per_lock.entry(id).or_default();
                        if p.last_owner.is_some_and(|o| o != m.tid) {
                            a.owner_changes += 1;
                        }
                        p.last_owner = Some(m.tid);
                        if !a.threads.contains(&m.tid) {
                            a.threads.push(m.tid);
                        }
                        if !self.threads.contains(&m.tid) {
                            self.threads.push(m.tid);
                        }
                        if let Some(w) = wait_ns {
                            a.contended += 1;
                            a.wait_total += w;
                            a.wait_max = a.wait_max.max(w);
                            let s = a.sites.entry(stack).or_default();
                            s.0 += 1;
                            s.1 += w;
                        }
                    }
                }
                LockEvent::Failed {
                    addr,
                    kind,
                    mode,
                    op,
                    errno,
                    ..
                } => {
                    let a = self
                        .accs
                        .entry((self.state.lock_id(addr), mode))
                        .or_default();
                    a.kind = Some(kind);
                    if op == LockOp::Try {
                        a.try_failures += 1;
                    } else if errno == ETIMEDOUT {
                        a.timeouts += 1;
                    }
                }
                _ => {}
            }
        }
        if let Applied::Released {
            lock,
            held: Some(h),
        } = self.state.apply(m.tid, &m.event)
        {
            if h.depth == 0 {
                let a = self.accs.entry((lock, h.mode)).or_default();
                let d = m.time.saturating_sub(h.time);
                // The agent's own work inside the hold (its hooks for the
                // program's calls made while holding) is not the program's.
                let agent = match m.event {
                    Event::Lock(LockEvent::Release { agent_ns, .. }) => agent_ns,
                    _ => 0,
                };
                a.holds += 1;
                a.hold_total += d;
                a.hold_agent += agent;
                a.hold_max = a.hold_max.max(d.saturating_sub(agent));
            }
        }
    }

    fn needs(&self, chunk: ChunkSummary) -> bool {
        LockState::needs(chunk)
    }
    fn skipped(&mut self, chunk: &ChunkEntry, start: u64) {
        self.facts.skipped_chunk(chunk, start);
    }
    fn use_index(&mut self, file: &IndexFile) {
        self.state.use_index(file);
    }
    fn learned(&self) -> Learned {
        self.state.learned()
    }
    fn finish(self, index: &TraceIndex, stopped: ReadStatus) -> Result<LocksReport, TraceError> {
        let LocksAnalysis {
            top,
            facts,
            state,
            mut accs,
            per_lock,
            mut threads,
        } = self;
        // Waits under way when the trace ended (a hung program) count, up to
        // the end: a thread stuck for seconds is the most contended of all.
        for (tid, p) in state.pending() {
            let a = accs.entry((p.lock, p.mode)).or_default();
            a.kind = Some(p.kind);
            let w = facts.last_time.saturating_sub(p.time);
            a.contended += 1;
            a.waiting_at_end += 1;
            a.wait_total += w;
            a.wait_max = a.wait_max.max(w);
            let s = a.sites.entry(p.stack).or_default();
            s.0 += 1;
            s.1 += w;
            if !a.threads.contains(&tid) {
                a.threads.push(tid);
            }
            if !threads.contains(&tid) {
                threads.push(tid);
            }
        }

        // Ranked and totalled before any stack is symbolized: only the
        // listed locks' stacks are looked up.
        let mut ranked: Vec<((LockId, LockMode), Acc)> =
            accs.into_iter().filter(|(_, a)| a.kind.is_some()).collect();
        let mode_of = |&((_, mode), ref a): &((LockId, LockMode), Acc)| {
            mode_name(a.kind.unwrap_or(LockKind::Mutex), mode)
        };
        ranked.sort_by(|x, y| {
            y.1.contended
                .cmp(&x.1.contended)
                .then(y.1.owner_changes.cmp(&x.1.owner_changes))
                .then(y.1.acquisitions.cmp(&x.1.acquisitions))
                .then(x.0 .0.addr.cmp(&y.0 .0.addr))
                .then(mode_of(x).cmp(mode_of(y)))
        });
        let mut distinct: Vec<u64> = ranked.iter().map(|((id, _), _)| id.addr).collect();
        distinct.sort_unstable();
        distinct.dedup();
        let totals = LockTotals {
            locks: distinct.len() as u64,
            acquisitions: ranked.iter().map(|(_, a)| a.acquisitions).sum(),
            contended: ranked.iter().map(|(_, a)| a.contended).sum(),
            owner_changes: ranked.iter().map(|(_, a)| a.owner_changes).sum(),
            wait_ns: ranked.iter().map(|(_, a)| a.wait_total).sum(),
            threads: threads.len() as u64,
        };
        let listed = top.unwrap_or(usize::MAX).min(ranked.len());
        let locks_omitted = (ranked.len() - listed) as u64;
        ranked.truncate(listed);

        let mut sym = facts.symbolizer();
        let locks: Vec<LockReport> = ranked
            .into_iter()
            .map(|((id, mode), a)| {
                let kind = a.kind.unwrap_or(LockKind::Mutex);
                let p = per_lock.get(&id);
                let mut sites: Vec<(u32, (u64, u64))> = a.sites.into_iter().collect();
                sites.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
                LockReport {
                    address: id.addr,
                    kind: kind.name(),
                    mode: mode_name(kind, mode),
                    acquisitions: a.acquisitions,
                    contended: a.contended,
                    waiting_at_end: a.waiting_at_end,
                    owner_changes: a.owner_changes,
                    threads: a.threads.len() as u64,
                    try_failures: a.try_failures,
                    timeouts: a.timeouts,
                    cond_waits: a.cond_waits,
                    wait_ns: Durations {
                        total: a.wait_total,
                        max: a.wait_max,
                        avg: a.wait_total.checked_div(a.contended).unwrap_or(0),
                    },
                    hold_ns: {
                        let total = a.hold_total.saturating_sub(a.hold_agent);
                        Durations {
                            total,
                            max: a.hold_max,
                            avg: total.checked_div(a.holds).unwrap_or(0),
                        }
                    },
                    agent_ns_in_holds: a.hold_agent.min(a.hold_total),
                    first_use: if p.is_some_and(|p| p.from_init) {
                        "init"
                    } else {
                        "first_acquisition"
                    },
                    first_use_stack: sym.stack(&facts.stacks, p.map_or(0, |p| p.first_stack)),
                    top_sites: sites
                        .into_iter()
                        .take(TOP_SITES)
                        .map(|(stack, (contended, wait_ns))| ContendingSite {
                            contended,
                            wait_ns,
                            stack: sym.stack(&facts.stacks, stack),
                        })
                        .collect(),
                }
            })
            .collect();
        let errors = state.errors(&facts.stacks, &mut sym);
        Ok(LocksReport {
            process: facts.process_report(),
            has_lock_events: state.saw_lock_events,
            locks_recorded: !facts.locks_off,
            production_mode: facts.production.is_some(),
            totals,
            locks,
            locks_omitted,
            errors,
            events_lost: facts.events_lost(),
            trace: facts.trace_status(index, stopped),
            warnings: sym.warnings(),
        })
    }
}

const ETIMEDOUT: i32 = 110;

/// The recording clock's tick period at its longest (recording.md, "Lock
/// recording"): single holds shorter than it are not resolved.
pub const HOLD_RESOLUTION_NS: u64 = 1_000_000;

/// A duration for people: `850 ns`, `12.4 us`, `3.02 ms`, `1.50 s`.
pub fn duration_text(ns: u64) -> String {
    match ns {
        0..=999 => format!("{ns} ns"),
        1_000..=999_999 => format!("{:.1} us", ns as f64 / 1e3),
        1_000_000..=999_999_999 => format!("{:.2} ms", ns as f64 / 1e6),
        _ => format!("{:.2} s", ns as f64 / 1e9),
    }
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0%".to_string();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

/// Renders the report as text.
pub fn render_text(r: &LocksReport) -> String {
    let p = prefix(&r.process);
    let mut out = String::new();
    writeln!(out, "{p}trapline locks: lock contention").unwrap();
    writeln!(out, "{p}Command: {}", command_text(&r.process)).unwrap();
    if r.production_mode {
        writeln!(out, "{p}PRODUCTION MODE: only contended acquisitions, and the holds under which a thread first took a lock at a new pair of sites, are recorded: uncontended acquisitions are neither counted nor timed").unwrap();
    }
    if let Some(why) = crate::report::no_lock_events(
        r.locks_recorded,
        r.has_lock_events,
        r.trace.attached.is_some(),
    ) {
        writeln!(out, "{p}{why}").unwrap();
        footer_text(&mut out, &p, r.events_lost, &r.trace);
        return out;
    }
    let t = &r.totals;
    writeln!(
        out,
        "{p}Totals: {} locks, {} acquisitions, {} contended ({}), {} owner changes, {} waited, {} threads",
        thousands(t.locks),
        thousands(t.acquisitions),
        thousands(t.contended),
        percent(t.contended, t.acquisitions),
        thousands(t.owner_changes),
        duration_text(t.wait_ns),
        thousands(t.threads)
    )
    .unwrap();
    writeln!(out, "{p}").unwrap();
    writeln!(
        out,
        "{p}LOCKS (most contended first, then most owner changes):"
    )
    .unwrap();
    for (i, l) in r.locks.iter().enumerate() {
        writeln!(
            out,
            "{p}  #{} {} {:#x} ({}): {} acquisitions, {} contended ({}), {} owner changes, {} thread{}",
            i + 1,
            l.kind,
            l.address,
            l.mode,
            thousands(l.acquisitions),
            thousands(l.contended),
            percent(l.contended, l.acquisitions),
            thousands(l.owner_changes),
            l.threads,
            if l.threads == 1 { "" } else { "s" }
        )
        .unwrap();
        let wait = if l.contended > 0 {
            format!(
                "wait: total {}, avg {}, max {}; ",
                duration_text(l.wait_ns.total),
                duration_text(l.wait_ns.avg),
                duration_text(l.wait_ns.max)
            )
        } else {
            String::new()
        };
        let agent = if l.agent_ns_in_holds > 0 {
            format!(
                " (trapline's own {} inside them left out)",
                duration_text(l.agent_ns_in_holds)
            )
        } else {
            String::new()
        };
        // Holds are timed on the recording clock's tick (at most 1 ms
        // apart): when none spanned a tick, their average and maximum are
        // the stamps' 1 ns steps, not durations, and only the total
        // estimates anything.
        let hold = if l.hold_ns.max < HOLD_RESOLUTION_NS {
            format!(
                "hold: total {} (estimated), each shorter than the clock's 1 ms tick",
                duration_text(l.hold_ns.total)
            )
        } else {
            format!(
                "hold: total {}, avg {}, max {}",
                duration_text(l.hold_ns.total),
                duration_text(l.hold_ns.avg),
                duration_text(l.hold_ns.max)
            )
        };
        writeln!(out, "{p}     {wait}{hold}{agent}").unwrap();
        let extra: Vec<String> = [
            (l.try_failures, "busy trylocks"),
            (l.timeouts, "timeouts"),
            (l.cond_waits, "condition waits"),
            (l.waiting_at_end, "still waiting when the trace ended"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{} {what}", thousands(*n)))
        .collect();
        if !extra.is_empty() {
            writeln!(out, "{p}     {}", extra.join(", ")).unwrap();
        }
        let how = if l.first_use == "init" {
            "initialized"
        } else {
            "first used"
        };
        writeln!(out, "{p}     {how} at:").unwrap();
        stack_text(&mut out, &p, "       ", &l.first_use_stack);
        if !l.top_sites.is_empty() {
            writeln!(out, "{p}     top contending sites:").unwrap();
            for s in &l.top_sites {
                writeln!(
                    out,
                    "{p}       {} contended, {} waited at:",
                    thousands(s.contended),
                    duration_text(s.wait_ns)
                )
                .unwrap();
                stack_text(&mut out, &p, "         ", &s.stack);
            }
        }
    }
    if r.locks_omitted > 0 {
        writeln!(
            out,
            "{p}  ... and {} more ranked lower (--top 0 lists all)",
            thousands(r.locks_omitted),
        )
        .unwrap();
    }
    writeln!(out, "{p}").unwrap();
    errors_text(&mut out, &p, &r.errors);
    warnings_text(&mut out, &p, &r.warnings);
    footer_text(&mut out, &p, r.events_lost, &r.trace);
    out
}
