//! A window of a trace, as if it had been recorded by `trapline attach`
//! from `from_ns` until a detach at `to_ns`: attaching to a process that
//! `trapline run` records already takes its window out of the run's trace
//! instead of loading a second agent.
//!
//! One pass in time order (`MergedEvents`). Definitions (process, modules,
//! stacks, thread names, recording options) pass whole; timed events pass
//! when inside the window. As in an attached trace, blocks from before the
//! window are unknown: their releases are counted (`AttachTotals`), not
//! written, and a `realloc` of one is a new block (`old_addr` 0). A scan or
//! snapshot inside the window keeps the blocks born in it, its counts
//! made over them. The trace begins with `Attach` at `from_ns` and ends
//! with the process's own `End` when that is inside the window, else, as a
//! detach ends one, with a snapshot of the blocks born in the window and
//! still live, and an `End` of kind `Detach` at `to_ns`.

use std::collections::HashMap;
use std::io::{Read, Seek};

use trapline_trace::{AllocFn, EndCounters, Event, ExitKind, ScanStats, SnapshotKind, TraceError};

use crate::index::{MergedEvents, TraceIndex};

/// What the window held.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Window {
    /// Events written.
    pub events: u64,
    /// Releases of blocks from before the window, left out.
    pub earlier_releases: u64,
    /// The process ended inside the window (its `End` was written).
    pub process_ended: bool,
}

/// Sizes of the blocks of a scan or snapshot kept so far.
#[derive(Default)]
struct Kept {
    blocks: u64,
    bytes: u64,
}

/// Writes the window `[from_ns, to_ns]` of the trace `input` to `sink`
/// (the thread whose chunk held each event, 0 for the process's own
/// records); an error of the sink stops the pass and is returned.
pub fn cut<R: Read + Seek, E>(
    input: &mut R,
    from_ns: u64,
    to_ns: u64,
    mut sink: impl FnMut(u32, &Event) -> Result<(), E>,
) -> Result<Result<Window, E>, TraceError> {
    let index = TraceIndex::build(input)?;
    let mut window = Window::default();
    // The live blocks born in the window: size, function, stack.
    let mut born: HashMap<u64, (u64, AllocFn, u32)> = HashMap::new();
    // Inside a scan (or snapshot) that is kept.
    let mut scan: Option<Kept> = None;
    let mut snapshot: Option<Kept> = None;
    let mut pid = 0;
    let inside = |t: u64| t >= from_ns && t <= to_ns;
    let mut out = |tid: u32, ev: &Event, window: &mut Window| {
        window.events += 1;
        sink(tid, ev)
    };
    for m in MergedEvents::new(input, &index) {
        let ev = m.event;
        let keep = match &ev {
            Event::Process(p) => {
                pid = p.pid;
                if let Err(e) = out(m.tid, &ev, &mut window) {
                    return Ok(Err(e));
                }
                Some(Event::Attach { time: from_ns })
            }
            Event::ModuleLoad(_)
            | Event::ModuleUnload { .. }
            | Event::ThreadName { .. }
            | Event::StackDef { .. }
            | Event::CallerOnlyStack { .. }
            | Event::Recording { .. }
            | Event::ProfileStart { .. } => Some(ev),
            // This window is not served, and says itself where it began.
            Event::ControlSocket { .. }
            | Event::Attach { .. }
            | Event::AttachTotals { .. }
            | Event::RunTotals(_) => None,
            Event::Alloc {
                time,
                addr,
                size,
                func,
                stack,
                ..
            } if inside(*time) => {
                born.insert(*addr, (*size, *func, *stack));
                Some(ev)
            }
            Event::Realloc {
                time,
                old_addr,
                new_addr,
                size,
                func,
                stack,
            } if inside(*time) => {
                let known = *old_addr == 0 || born.remove(old_addr).is_some();
                if !known {
                    window.earlier_releases += 1;
                }
                if *new_addr != 0 {
                    born.insert(*new_addr, (*size, *func, *stack));
                }
                Some(Event::Realloc {
                    time: *time,
                    old_addr: if known { *old_addr } else { 0 },
                    new_addr: *new_addr,
                    size: *size,
                    func: *func,
                    stack: *stack,
                })
            }
            Event::Free { time, addr, .. } if inside(*time) => {
                if born.remove(addr).is_some() {
                    Some(ev)
                } else {
                    window.earlier_releases += 1;
                    None
                }
            }
            Event::ScanBegin { time, .. } if inside(*time) => {
                scan = Some(Kept::default());
                Some(ev)
            }
            Event::ScanBlock { addr, size, .. } => match &mut scan {
                Some(k) if born.contains_key(addr) => {
                    k.blocks += 1;
                    k.bytes += size;
                    Some(ev)
                }
                _ => None,
            },
            Event::ScanEnd { scan: n, stats } => scan.take().map(|k| Event::ScanEnd {
                scan: *n,
                stats: ScanStats {
                    blocks: k.blocks,
                    bytes: k.bytes,
                    ..*stats
                },
            }),
            Event::SnapshotBegin { time, .. } if inside(*time) => {
                snapshot = Some(Kept::default());
                Some(ev)
            }
            Event::LiveBlock { addr, size, .. } => match &mut snapshot {
                Some(k) if born.contains_key(addr) => {
                    k.blocks += 1;
                    k.bytes += size;
                    Some(ev)
                }
                _ => None,
            },
            Event::SnapshotEnd { .. } => snapshot.take().map(|k| Event::SnapshotEnd {
                blocks: k.blocks,
                bytes: k.bytes,
            }),
            Event::End { time, .. } if inside(*time) => {
                window.process_ended = true;
                let totals = Event::AttachTotals {
                    earlier_releases: window.earlier_releases,
                };
                if let Err(e) = out(m.tid, &totals, &mut window) {
                    return Ok(Err(e));
                }
                match ev {
                    Event::End {
                        time,
                        exit,
                        counters,
                    } => Some(Event::End {
                        time,
                        exit,
                        counters: EndCounters {
                            events: window.events + 1,
                            ..counters
                        },
                    }),
                    other => Some(other),
                }
            }
            other => other.time().filter(|&t| inside(t)).map(|_| ev),
        };
        if let Some(ev) = keep {
            if let Err(e) = out(m.tid, &ev, &mut window) {
                return Ok(Err(e));
            }
        }
    }
    if !window.process_ended {
        let mut live: Vec<(u64, (u64, AllocFn, u32))> = born.into_iter().collect();
        live.sort_unstable_by_key(|(addr, _)| *addr);
        let bytes = live.iter().map(|(_, b)| b.0).sum();
        let blocks = live.len() as u64;
        let mut end_events = vec![Event::SnapshotBegin {
            time: to_ns,
            kind: SnapshotKind::Exit,
        }];
        end_events.extend(
            live.into_iter()
                .map(|(addr, (size, func, stack))| Event::LiveBlock {
                    addr,
                    size,
                    func,
                    stack,
                }),
        );
        end_events.push(Event::SnapshotEnd { blocks, bytes });
        for ev in &end_events {
            if let Err(e) = out(pid, ev, &mut window) {
                return Ok(Err(e));
            }
        }
        let totals = Event::AttachTotals {
            earlier_releases: window.earlier_releases,
        };
        let end = Event::End {
            time: to_ns,
            exit: ExitKind::Detach,
            counters: EndCounters {
                events: window.events + 2,
                events_lost: 0,
                untracked_calls: 0,
            },
        };
        for ev in [totals, end] {
            if let Err(e) = out(pid, &ev, &mut window) {
                return Ok(Err(e));
            }
        }
    }
    Ok(Ok(window))
}
