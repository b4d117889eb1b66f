//! Shared helpers for the trace integration tests: sample traces, a seeded
//! PRNG and a reader that collects everything a trace yields.

#![allow(dead_code)]

use trapline_trace::event::{segment_flags, MAX_STACK_FRAMES};
use trapline_trace::{
    AllocFn, Chunk, EndCounters, ErrorKind, Event, ExitKind, ModuleInfo, ProcessInfo, RunTotals,
    ScanSkipReason, ScanStats, ScanTrigger, Segment, SnapshotKind, TraceBuilder, TraceError,
    TraceReader, Verdict,
};

/// xorshift64*: small, deterministic, good enough to drive mutations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform-ish in `0..n`; `n` must be non-zero.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Every error kind, in format order.
pub const ERROR_KINDS: [ErrorKind; 6] = [
    ErrorKind::DoubleFree,
    ErrorKind::InvalidFree,
    ErrorKind::MismatchedFree,
    ErrorKind::InvalidRealloc,
    ErrorKind::MismatchedSize,
    ErrorKind::MismatchedAlignment,
];

pub fn process() -> Event {
    Event::Process(ProcessInfo {
        pid: 4242,
        ppid: 1,
        start_unix_ns: 1_700_000_000_123_456_789,
        exe: "/usr/bin/grüße-😀".into(),
        argv: vec![
            "grüße".into(),
            String::new(),
            "--日本語".into(),
            "x".repeat(300),
        ],
    })
}

/// A chunk's worth of agent records: process, modules, threads, stacks.
pub fn agent_events() -> Vec<Event> {
    let long_stack: Vec<u64> = (0..MAX_STACK_FRAMES as u64)
        .map(|i| {
            if i % 2 == 0 {
                u64::MAX - i * 977
            } else {
                i * 0x1000
            }
        })
        .collect();
    vec![
        process(),
        Event::ModuleLoad(ModuleInfo {
            id: 0,
            path: String::new(),
            build_id: Vec::new(),
            bias: 0,
            segments: Vec::new(),
        }),
        Event::ModuleLoad(ModuleInfo {
            id: u32::MAX,
            path: "/lib/x86_64-linux-gnu/libç.so.6".into(),
            build_id: (0..=255u8).collect(),
            bias: u64::MAX - 0xfff,
            segments: vec![
                Segment {
                    start: 0x5555_0000,
                    end: 0x5556_0000,
                    flags: segment_flags::READ,
                },
                Segment {
                    start: 0x7fff_0000_0000,
                    end: 0x7fff_0001_0000,
                    flags: segment_flags::READ | segment_flags::EXEC,
                },
                Segment {
                    start: 0,
                    end: 0,
                    flags: 0,
                },
                Segment {
                    start: u64::MAX - 10,
                    end: u64::MAX,
                    flags: 0xff,
                },
            ],
        }),
        Event::ModuleUnload { id: 0 },
        Event::ModuleUnload { id: u32::MAX },
        Event::ThreadName {
            tid: 7,
            name: "wörker-線程".into(),
        },
        Event::ThreadName {
            tid: 0,
            name: String::new(),
        },
        Event::StackDef {
            id: 1,
            frames: vec![0x401000, 0x401234, 0x7f00_0000_1000],
        },
        Event::StackDef {
            id: 0,
            frames: Vec::new(),
        },
        Event::StackDef {
            id: u32::MAX,
            frames: long_stack,
        },
        Event::StackDef {
            id: 2,
            frames: vec![u64::MAX, 0, u64::MAX, 1, u64::MAX - 1],
        },
    ]
}

/// Allocation-path events with monotonic times (the encoder clamps backward
/// steps, so only monotonic times round-trip exactly).
pub fn hot_events(base_time: u64) -> Vec<Event> {
    let mut v = Vec::new();
    let mut t = base_time;
    let mut tick = |d: u64| {
        t += d;
        t
    };
    for (i, &func) in AllocFn::ALL.iter().enumerate() {
        let i = i as u64;
        if func.is_release() {
            v.push(Event::Free {
                time: tick(i),
                addr: 0x10_0000 + i * 64,
                func,
                stack: i as u32,
            });
        } else {
            v.push(Event::Alloc {
                time: tick(1),
                addr: 0x10_0000 + i * 64,
                size: i * 13,
                align: if i.is_multiple_of(3) {
                    0
                } else {
                    1 << (i % 12)
                },
                func,
                stack: i as u32 + 1,
            });
        }
        v.push(Event::LiveBlock {
            addr: u64::MAX - i,
            size: i,
            func,
            stack: u32::MAX - i as u32,
        });
    }
    v.extend([
        Event::Alloc {
            time: tick(0),
            addr: 0,
            size: 0,
            align: 0,
            func: AllocFn::Malloc,
            stack: 0,
        },
        Event::Alloc {
            time: tick(1_000_000_007),
            addr: u64::MAX,
            size: u64::MAX,
            align: u64::MAX,
            func: AllocFn::NewArrayAlignedNothrow,
            stack: u32::MAX,
        },
        Event::Free {
            time: tick(0),
            addr: 0,
            func: AllocFn::Free,
            stack: 0,
        },
        Event::Free {
            time: tick(5),
            addr: u64::MAX - 1,
            func: AllocFn::DeleteArray,
            stack: 9,
        },
        Event::AllocFailed {
            time: tick(6),
            func: AllocFn::Calloc,
            size: u64::MAX,
            align: 0,
            stack: 11,
        },
        Event::AllocFailed {
            time: tick(0),
            func: AllocFn::NewArrayAligned,
            size: 1 << 40,
            align: 4096,
            stack: 0,
        },
        Event::Realloc {
            time: tick(3),
            old_addr: 0,
            new_addr: 0x20_0000,
            size: 100,
            func: AllocFn::Realloc,
            stack: 3,
        },
        Event::Realloc {
            time: tick(3),
            old_addr: 0x20_0000,
            new_addr: 0,
            size: 0,
            func: AllocFn::ReallocArray,
            stack: 4,
        },
        Event::Realloc {
            time: tick(0),
            old_addr: u64::MAX,
            new_addr: 1,
            size: u64::MAX,
            func: AllocFn::Realloc,
            stack: u32::MAX,
        },
    ]);
    for (k, &kind) in ERROR_KINDS.iter().enumerate() {
        for (j, alloc_func) in [
            None,
            Some(AllocFn::Malloc),
            Some(AllocFn::DeleteArrayAlignedNothrow),
        ]
        .into_iter()
        .enumerate()
        {
            v.push(Event::Error {
                time: tick(k as u64 + j as u64),
                kind,
                func: AllocFn::ALL[(k * 7 + j) % AllocFn::ALL.len()],
                addr: if j == 0 { 0 } else { u64::MAX - k as u64 },
                stack: k as u32,
                alloc_func,
                alloc_size: if j == 2 { u64::MAX } else { j as u64 },
                alloc_stack: if j == 1 { u32::MAX } else { 0 },
                free_stack: j as u32,
                passed_on: (k + j) % 2 == 0,
                // Encoded for the two mismatches that carry it (and
                // large, to cover a long varint).
                given: if k >= 4 { u64::MAX - 17 } else { 0 },
            });
        }
    }
    v.push(Event::Fork {
        time: tick(1),
        child_pid: 4243,
    });
    v.push(Event::ThreadCreate {
        time: tick(3),
        create_id: 1,
        stack: 2,
    });
    v.push(Event::ThreadCreate {
        time: tick(0),
        create_id: u64::MAX,
        stack: u32::MAX,
    });
    v.push(Event::ThreadStart {
        time: tick(1),
        parent_tid: 4242,
        create_id: 1,
    });
    v.push(Event::ThreadStart {
        time: tick(0),
        parent_tid: u32::MAX,
        create_id: u64::MAX,
    });
    v.push(Event::ThreadEnd { time: tick(5) });
    v.push(Event::Fork {
        time: tick(0),
        child_pid: u32::MAX,
    });
    v.extend([
        Event::ProfileStart {
            time: tick(2),
            hz: 999,
            signal: 64,
        },
        Event::Sample {
            time: tick(1_001_001),
            stack: 7,
            periods: 1,
        },
        Event::Sample {
            time: tick(0),
            stack: u32::MAX,
            periods: u32::MAX,
        },
        Event::SamplesSkipped {
            time: tick(4_000_000),
            periods: 3,
        },
        Event::SamplesSkipped {
            time: tick(0),
            periods: u64::MAX,
        },
        Event::SamplesMissed {
            time: tick(1),
            periods: 41,
        },
        Event::ProfileStop {
            time: tick(9),
            reason: trapline_trace::ProfileStopReason::SignalTaken,
        },
    ]);
    v
}

/// Events that end a process: snapshot and every exit kind.
pub fn end_events(base_time: u64) -> Vec<Event> {
    let mut v = vec![
        Event::SnapshotBegin {
            time: base_time,
            kind: SnapshotKind::Exit,
        },
        Event::LiveBlock {
            addr: 0x1234,
            size: 16,
            func: AllocFn::Calloc,
            stack: 2,
        },
        Event::ScanBegin {
            time: base_time,
            scan: 1,
            trigger: ScanTrigger::Exit,
        },
        Event::ScanBlock {
            scan: 1,
            addr: 0x1234,
            size: 16,
            func: AllocFn::Calloc,
            stack: 2,
            verdict: Verdict::DefinitelyLost,
            indirect_bytes: 48,
        },
        Event::ScanBlock {
            scan: u32::MAX,
            addr: u64::MAX,
            size: u64::MAX,
            func: AllocFn::NewArrayAlignedNothrow,
            stack: u32::MAX,
            verdict: Verdict::StillReachable,
            indirect_bytes: u64::MAX,
        },
        Event::ScanEnd {
            scan: 1,
            stats: ScanStats {
                pause_ns: 1_234_567,
                threads: 3,
                threads_not_suspended: 1,
                root_bytes: 1 << 20,
                blocks: 2,
                bytes: 16,
                mappings_not_excluded: 0,
            },
        },
        Event::ScanBegin {
            time: base_time,
            scan: u32::MAX,
            trigger: ScanTrigger::Periodic,
        },
        Event::ScanEnd {
            scan: u32::MAX,
            stats: ScanStats {
                pause_ns: u64::MAX,
                threads: u32::MAX,
                threads_not_suspended: u32::MAX,
                root_bytes: u64::MAX,
                blocks: u64::MAX,
                bytes: u64::MAX,
                mappings_not_excluded: u64::MAX,
            },
        },
        Event::ScanSkipped {
            time: base_time,
            trigger: ScanTrigger::Exit,
            reason: ScanSkipReason::CgroupMemory,
            needed: 262_144_000,
            available: 110_000_000,
            limit: 440_401_920,
        },
        Event::SnapshotEnd {
            blocks: 1,
            bytes: 16,
        },
        Event::SnapshotEnd {
            blocks: 0,
            bytes: 0,
        },
    ];
    for reason in ScanSkipReason::ALL {
        v.push(Event::ScanSkipped {
            time: base_time,
            trigger: ScanTrigger::Periodic,
            reason,
            needed: u64::MAX,
            available: 0,
            limit: u64::MAX,
        });
    }
    v.extend([
        Event::SnapshotEnd {
            blocks: u64::MAX,
            bytes: u64::MAX,
        },
        Event::RunTotals(RunTotals {
            allocation_calls: 15_493_954,
            release_calls: 14_653_298,
            errors: 0,
            failed_allocations: 3,
            peak_bytes: 40_836_575,
            peak_time: 30_511_000_123,
        }),
        Event::RunTotals(RunTotals::default()),
        Event::Recording {
            no_release_stacks: true,
            allocator_shadowed_by: None,
            allocator_library: None,
            memory_recorded: true,
            locks_recorded: true,
            sample_bytes: 0,
            production: false,
        },
        Event::Recording {
            no_release_stacks: false,
            allocator_shadowed_by: None,
            allocator_library: None,
            memory_recorded: true,
            locks_recorded: true,
            sample_bytes: 0,
            production: false,
        },
        Event::Recording {
            no_release_stacks: true,
            allocator_shadowed_by: Some("/usr/bin/program with its own malloc".into()),
            allocator_library: None,
            memory_recorded: true,
            locks_recorded: true,
            sample_bytes: 0,
            production: false,
        },
        Event::Recording {
            no_release_stacks: false,
            allocator_shadowed_by: None,
            allocator_library: Some("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2".into()),
            memory_recorded: true,
            locks_recorded: true,
            sample_bytes: 0,
            production: false,
        },
        Event::Recording {
            no_release_stacks: true,
            allocator_shadowed_by: Some("/a/b".into()),
            allocator_library: Some("/c/d".into()),
            memory_recorded: true,
            locks_recorded: true,
            sample_bytes: 0,
            production: false,
        },
        Event::Recording {
            no_release_stacks: false,
            allocator_shadowed_by: Some(String::new()),
            allocator_library: None,
            memory_recorded: true,
            locks_recorded: true,
            sample_bytes: 0,
            production: false,
        },
        Event::RunTotals(RunTotals {
            allocation_calls: u64::MAX,
            release_calls: u64::MAX,
            errors: u64::MAX,
            failed_allocations: u64::MAX,
            peak_bytes: u64::MAX,
            peak_time: u64::MAX,
        }),
    ]);
    let exits = [
        ExitKind::Code(0),
        ExitKind::Code(1),
        ExitKind::Code(-1),
        ExitKind::Code(i32::MAX),
        ExitKind::Code(i32::MIN),
        ExitKind::Signal(9),
        ExitKind::Signal(i32::MIN),
        ExitKind::Signal(i32::MAX),
        ExitKind::Exec,
    ];
    for (i, exit) in exits.into_iter().enumerate() {
        v.push(Event::End {
            time: base_time + i as u64,
            exit,
            counters: EndCounters {
                events: i as u64 * 1000,
                events_lost: if i == 0 { u64::MAX } else { 0 },
                untracked_calls: i as u64,
            },
        });
    }
    v
}

/// The chunks of a representative multi-chunk trace, as (tid, events).
pub fn sample_chunks() -> Vec<(u32, Vec<Event>)> {
    // Many small allocations so one chunk is large and compresses (LZ4 codec).
    let compressible: Vec<Event> = (0..400u64)
        .map(|i| Event::Alloc {
            time: 1_000 + i,
            addr: 0x55_0000 + i * 32,
            size: 32,
            align: 0,
            func: AllocFn::Malloc,
            stack: 1,
        })
        .collect();
    vec![
        (0, agent_events()),
        (7, hot_events(0)),
        (
            8,
            vec![Event::ThreadName {
                tid: 8,
                name: "t".into(),
            }],
        ),
        (9, compressible),
        (10, Vec::new()),
        (u32::MAX, hot_events(u64::MAX / 2)),
        (0, end_events(u64::MAX - 100)),
    ]
}

pub fn build(chunks: &[(u32, Vec<Event>)]) -> Vec<u8> {
    let mut b = TraceBuilder::new();
    for (tid, events) in chunks {
        b.chunk(*tid, events);
    }
    b.into_bytes()
}

/// Where in a chunk payload an event failed to decode, and why.
pub type DecodeFailure = Option<(usize, trapline_trace::DecodeError)>;

/// What reading a whole trace produced.
#[derive(Debug)]
pub struct Outcome {
    /// The file header was rejected.
    pub open_error: Option<TraceError>,
    pub chunks: Vec<Chunk>,
    /// The error that stopped chunk reading, if any.
    pub error: Option<TraceError>,
    /// Per chunk: decoded events, and the decode error with the payload
    /// position of the bad event.
    pub events: Vec<(Vec<Event>, DecodeFailure)>,
}

/// Reads everything from `bytes`, decoding every event of every chunk, the
/// way an analysis would. Must never panic, whatever the input.
pub fn read_all(bytes: &[u8]) -> Outcome {
    let mut out = Outcome {
        open_error: None,
        chunks: Vec::new(),
        error: None,
        events: Vec::new(),
    };
    let mut reader = match TraceReader::new(bytes) {
        Ok(r) => r,
        Err(e) => {
            out.open_error = Some(e);
            return out;
        }
    };
    loop {
        match reader.next_chunk() {
            Ok(Some(chunk)) => {
                out.events.push(decode_chunk(&chunk));
                out.chunks.push(chunk);
            }
            Ok(None) => break,
            Err(e) => {
                // Nothing after an error: the reader must stay stopped.
                assert!(
                    matches!(reader.next_chunk(), Ok(None)),
                    "reader resumed after {e}"
                );
                // The message must say where (and the Display must not panic).
                let msg = e.to_string();
                if let Some(off) = e.offset() {
                    assert!(msg.contains(&off.to_string()), "{msg}");
                }
                out.error = Some(e);
                break;
            }
        }
    }
    out
}

pub fn decode_chunk(chunk: &Chunk) -> (Vec<Event>, DecodeFailure) {
    decode_payload(&chunk.payload)
}

pub fn decode_payload(payload: &[u8]) -> (Vec<Event>, DecodeFailure) {
    let mut dec = trapline_trace::Decoder::new(payload);
    let mut events = Vec::new();
    let mut steps = 0usize;
    while let Some(r) = dec.next() {
        steps += 1;
        // Every event takes at least its tag byte.
        assert!(steps <= payload.len(), "decoder does not advance");
        match r {
            Ok(ev) => events.push(ev),
            Err(e) => {
                let at = dec.position();
                assert!(at < payload.len(), "error position {at} outside payload");
                let _ = e.to_string();
                assert!(dec.next().is_none(), "decoder resumed after an error");
                return (events, Some((at, e)));
            }
        }
    }
    assert_eq!(dec.position(), payload.len());
    (events, None)
}

/// A one-chunk trace whose chunk header claims `codec`, `raw_len` and
/// `stored_len` (its checksum no longer matches; sizes are checked first).
pub fn with_chunk_sizes(codec: u8, raw_len: u32, stored_len: u32) -> Vec<u8> {
    let at = trapline_trace::format::FILE_HEADER_LEN;
    let mut b = build(&[(
        1,
        vec![Event::ThreadName {
            tid: 1,
            name: "a".into(),
        }],
    )]);
    b[at + 4] = codec;
    b[at + 12..at + 16].copy_from_slice(&raw_len.to_le_bytes());
    b[at + 16..at + 20].copy_from_slice(&stored_len.to_le_bytes());
    b
}

/// Every lock event, every kind, mode and operation, with monotonic times.
pub fn lock_events(base_time: u64) -> Vec<Event> {
    use trapline_trace::{LockEvent, LockKind, LockMisuse, LockMode, LockOp};
    let mut v = Vec::new();
    let mut t = base_time;
    for (i, &kind) in LockKind::ALL.iter().enumerate() {
        let addr = 0x7f00_0000_1000 + i as u64 * 64;
        t += 3;
        v.push(Event::Lock(LockEvent::Init {
            time: t,
            addr,
            kind,
            stack: i as u32,
        }));
        for (j, op) in [
            LockOp::Blocking,
            LockOp::Try,
            LockOp::Timed,
            LockOp::CondWait,
        ]
        .into_iter()
        .enumerate()
        {
            for mode in [LockMode::Exclusive, LockMode::Shared] {
                t += 1;
                v.push(Event::Lock(LockEvent::Request {
                    time: t,
                    addr,
                    kind,
                    mode,
                    stack: 7,
                }));
                v.push(Event::Lock(LockEvent::Acquire {
                    time: t,
                    addr,
                    kind,
                    mode,
                    op,
                    wait_ns: (j % 2 == 0).then_some(u64::MAX >> j),
                    stack: u32::MAX - j as u32,
                }));
                v.push(Event::Lock(LockEvent::Release {
                    time: t + 1,
                    addr,
                    kind,
                    stack: 0,
                    agent_ns: 0,
                }));
                t += 1;
                v.push(Event::Lock(LockEvent::Failed {
                    time: t,
                    addr: 0,
                    kind,
                    mode,
                    op,
                    errno: if j == 3 { -1 } else { 16 },
                    stack: 3,
                }));
            }
        }
        for misuse in [LockMisuse::SelfDeadlock, LockMisuse::Refused] {
            v.push(Event::Lock(LockEvent::Misuse {
                time: t,
                addr: u64::MAX,
                kind,
                misuse,
                errno: 35,
                stack: 2,
            }));
        }
        v.push(Event::Lock(LockEvent::Destroy {
            time: t,
            addr,
            kind,
            stack: 1,
        }));
    }
    v.push(Event::Lock(LockEvent::JoinWait {
        time: t + 10,
        joined: 0,
        stack: 5,
    }));
    v.push(Event::Lock(LockEvent::Join {
        time: t + 10,
        joined: u32::MAX,
        stack: 4,
    }));
    v.push(Event::Lock(LockEvent::Detach {
        time: t + 11,
        detached: 77,
    }));
    v.push(Event::Lock(LockEvent::Exit {
        time: t + 11,
        stack: 0,
    }));
    v
}
