//! Helpers to synthesize traces for the analysis tests.
#![allow(dead_code)]

use std::io::Cursor;

use trapline_trace::{
    AllocFn, EndCounters, ErrorKind, Event, ExitKind, ModuleInfo, ProcessInfo, Segment,
    SnapshotKind, TraceBuilder,
};

pub const PID: u32 = 4242;

pub fn process() -> Event {
    Event::Process(ProcessInfo {
        pid: PID,
        ppid: 1,
        start_unix_ns: 1_700_000_000_000_000_000,
        exe: "/nonexistent/prog".into(),
        argv: vec!["/nonexistent/prog".into(), "--flag".into()],
    })
}

pub fn module() -> Event {
    Event::ModuleLoad(ModuleInfo {
        id: 1,
        path: "/nonexistent/prog".into(),
        build_id: vec![],
        bias: 0x400000,
        segments: vec![Segment {
            start: 0x401000,
            end: 0x402000,
            flags: 5,
        }],
    })
}

pub fn malloc(time: u64, addr: u64, size: u64, stack: u32) -> Event {
    Event::Alloc {
        time,
        addr,
        size,
        align: 16,
        func: AllocFn::Malloc,
        stack,
    }
}

pub fn alloc_with(time: u64, addr: u64, size: u64, func: AllocFn, stack: u32) -> Event {
    Event::Alloc {
        time,
        addr,
        size,
        align: 16,
        func,
        stack,
    }
}

pub fn free(time: u64, addr: u64, stack: u32) -> Event {
    Event::Free {
        time,
        addr,
        func: AllocFn::Free,
        stack,
    }
}

pub fn realloc(time: u64, old_addr: u64, new_addr: u64, size: u64, stack: u32) -> Event {
    Event::Realloc {
        time,
        old_addr,
        new_addr,
        size,
        func: AllocFn::Realloc,
        stack,
    }
}

pub fn stack(id: u32, frames: &[u64]) -> Event {
    Event::StackDef {
        id,
        frames: frames.to_vec(),
    }
}

pub fn live(addr: u64, size: u64, func: AllocFn, stack: u32) -> Event {
    Event::LiveBlock {
        addr,
        size,
        func,
        stack,
    }
}

pub fn error(time: u64, kind: ErrorKind, func: AllocFn, addr: u64, stack: u32) -> Event {
    Event::Error {
        time,
        kind,
        func,
        addr,
        stack,
        alloc_func: None,
        alloc_size: 0,
        alloc_stack: 0,
        free_stack: 0,
        passed_on: false,
        given: 0,
    }
}

pub fn snapshot_begin(time: u64) -> Event {
    Event::SnapshotBegin {
        time,
        kind: SnapshotKind::Exit,
    }
}

/// `EndCounters::events` of `end`: `build` puts the trace's event count there.
const EVENTS_OF_THE_TRACE: u64 = u64::MAX;

/// An end record counting every event of the trace `build` makes.
pub fn end(time: u64, code: i32, events_lost: u64) -> Event {
    Event::End {
        time,
        exit: ExitKind::Code(code),
        counters: EndCounters {
            events: EVENTS_OF_THE_TRACE,
            events_lost,
            untracked_calls: 0,
        },
    }
}

pub fn build(chunks: &[(u32, Vec<Event>)]) -> Vec<u8> {
    let total: usize = chunks.iter().map(|(_, events)| events.len()).sum();
    let mut b = TraceBuilder::new();
    for (tid, events) in chunks {
        let events: Vec<Event> = events
            .iter()
            .map(|ev| match ev {
                Event::End {
                    time,
                    exit,
                    counters,
                } if counters.events == EVENTS_OF_THE_TRACE => Event::End {
                    time: *time,
                    exit: *exit,
                    counters: EndCounters {
                        events: total as u64,
                        ..*counters
                    },
                },
                other => other.clone(),
            })
            .collect();
        b.chunk(*tid, &events);
    }
    b.into_bytes()
}

pub fn cursor(bytes: &[u8]) -> Cursor<Vec<u8>> {
    Cursor::new(bytes.to_vec())
}

/// File offsets of the chunks of a trace built from `chunks`.
pub fn chunk_offsets(chunks: &[(u32, Vec<Event>)]) -> Vec<u64> {
    let mut offsets = Vec::new();
    let mut b = TraceBuilder::new();
    for (tid, events) in chunks {
        offsets.push(b.bytes().len() as u64);
        b.chunk(*tid, events);
    }
    offsets
}

/// A release of a mutex by its owner (the agent records it without a stack).
pub fn unlock(time: u64, addr: u64) -> Event {
    Event::Lock(trapline_trace::LockEvent::Release {
        time,
        addr,
        kind: trapline_trace::LockKind::Mutex,
        stack: 0,
        agent_ns: 0,
    })
}
