//! The exact bytes of every event: one instance of each variant and
//! sub-variant (each lock event, exit kind, error kind, optional field
//! present and absent), encoded in one chunk context so that time and
//! address deltas are exercised too. The trace format is read by older and
//! newer tools alike: a change to the codec must leave these bytes alone.

use trapline_trace::event::{encode_to_vec, NoRoom};
use trapline_trace::{
    AllocFn, ChunkContext, Decoder, Encoder, EndCounters, ErrorKind, Event, ExitKind, LockEvent,
    LockKind, LockMisuse, LockMode, LockOp, ModuleInfo, ProcessInfo, ProfileStopReason, RunTotals,
    ScanSkipReason, ScanStats, ScanTrigger, Segment, SnapshotKind, Verdict,
};

/// Start of the first timed event: a large absolute time, as a real clock gives.
const T0: u64 = 1_700_000_000_000;
const HEAP: u64 = 0x7f3a_5c00_1000;

fn lock(ev: LockEvent) -> Event {
    Event::Lock(ev)
}

/// Every event, in encoding order, with its bytes in a shared context.
fn golden() -> Vec<(Event, &'static str)> {
    vec![
        (
            Event::Process(ProcessInfo {
                pid: 4242,
                ppid: 1,
                start_unix_ns: 1_700_000_000_123_456_789,
                exe: "/usr/bin/grüße".into(),
                argv: vec!["grüße".into(), String::new(), "--flag=1".into()],
            }),
            "01 92 21 01 95 9a 97 ec e3 9f e7 cb 17 10 2f 75 73 72 2f 62 69 6e 2f 67 72 c3 bc c3 9f 65 03 07 67 72 c3 bc c3 9f 65 00 08 2d 2d 66 6c 61 67 3d 31",
        ),
        (
            Event::Process(ProcessInfo {
                pid: u32::MAX,
                ppid: 0,
                start_unix_ns: 0,
                exe: String::new(),
                argv: vec![],
            }),
            "01 ff ff ff ff 0f 00 00 00 00",
        ),
        (
            Event::Recording {
                no_release_stacks: false,
                allocator_shadowed_by: None,
                allocator_library: None,
                memory_recorded: true,
                locks_recorded: true,
                sample_bytes: 0,
                production: false,
            },
            "33 00",
        ),
        (
            Event::Recording {
                no_release_stacks: true,
                allocator_shadowed_by: Some("/opt/app/bin/server".into()),
                allocator_library: None,
                memory_recorded: true,
                locks_recorded: true,
                sample_bytes: 0,
                production: false,
            },
            "33 03 13 2f 6f 70 74 2f 61 70 70 2f 62 69 6e 2f 73 65 72 76 65 72",
        ),
        (
            Event::Recording {
                no_release_stacks: false,
                allocator_shadowed_by: None,
                allocator_library: Some("/usr/lib/libjemalloc.so.2".into()),
                memory_recorded: true,
                locks_recorded: true,
                sample_bytes: 0,
                production: false,
            },
            "33 04 19 2f 75 73 72 2f 6c 69 62 2f 6c 69 62 6a 65 6d 61 6c 6c 6f 63 2e 73 6f 2e 32",
        ),
        (
            Event::Recording {
                no_release_stacks: true,
                allocator_shadowed_by: Some("libmimalloc.so".into()),
                allocator_library: Some("libtcmalloc.so.4".into()),
                memory_recorded: true,
                locks_recorded: true,
                sample_bytes: 0,
                production: false,
            },
            "33 07 0e 6c 69 62 6d 69 6d 61 6c 6c 6f 63 2e 73 6f 10 6c 69 62 74 63 6d 61 6c 6c 6f 63 2e 73 6f 2e 34",
        ),
        (
            Event::Recording {
                no_release_stacks: false,
                allocator_shadowed_by: None,
                allocator_library: None,
                memory_recorded: false,
                locks_recorded: true,
                sample_bytes: 0,
                production: false,
            },
            "33 08",
        ),
        (
            Event::Recording {
                no_release_stacks: false,
                allocator_shadowed_by: None,
                allocator_library: None,
                memory_recorded: true,
                locks_recorded: false,
                sample_bytes: 0,
                production: false,
            },
            "33 10",
        ),
        (
            Event::Recording {
                no_release_stacks: true,
                allocator_shadowed_by: None,
                allocator_library: None,
                memory_recorded: true,
                locks_recorded: true,
                sample_bytes: 512 << 10,
                production: false,
            },
            "33 21 80 80 20",
        ),
        (
            Event::Recording {
                no_release_stacks: true,
                allocator_shadowed_by: None,
                allocator_library: None,
                memory_recorded: true,
                locks_recorded: false,
                sample_bytes: 512 << 10,
                production: true,
            },
            "33 71 80 80 20",
        ),
        (
            Event::ModuleLoad(ModuleInfo {
                id: 1,
                path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
                build_id: vec![0xde, 0xad, 0xbe, 0xef, 0x00, 0x7f, 0x80, 0xff],
                bias: 0x7f3a_5d00_0000,
                segments: vec![
                    Segment {
                        start: 0x7f3a_5d00_0000,
                        end: 0x7f3a_5d02_8000,
                        flags: 4,
                    },
                    Segment {
                        start: 0x7f3a_5d02_8000,
                        end: 0x7f3a_5d1b_d000,
                        flags: 5,
                    },
                    Segment {
                        start: 0x7f3a_5d21_3000,
                        end: 0x7f3a_5d21_9000,
                        flags: 6,
                    },
                ],
            }),
            "02 01 23 2f 75 73 72 2f 6c 69 62 2f 78 38 36 5f 36 34 2d 6c 69 6e 75 78 2d 67 6e 75 2f 6c 69 62 63 2e 73 6f 2e 36 08 de ad be ef 00 7f 80 ff 80 80 80 e8 a5 e7 1f 03 80 80 80 e8 a5 e7 1f 80 80 0a 04 80 80 8a e8 a5 e7 1f 80 a0 65 05 80 e0 84 e9 a5 e7 1f 80 c0 01 06",
        ),
        (
            Event::ModuleLoad(ModuleInfo {
                id: 300,
                path: "[vdso]".into(),
                build_id: vec![],
                bias: 0,
                segments: vec![],
            }),
            "02 ac 02 06 5b 76 64 73 6f 5d 00 00 00",
        ),
        (Event::ModuleUnload { id: 300 }, "03 ac 02"),
        (
            Event::ThreadName {
                tid: 4243,
                name: "worker-1".into(),
            },
            "04 93 21 08 77 6f 72 6b 65 72 2d 31",
        ),
        (
            Event::StackDef {
                id: 1,
                frames: vec![
                    0x5555_5555_4abc,
                    0x5555_5555_4a00,
                    0x7f3a_5d02_9d90,
                    0x10,
                    u64::MAX,
                ],
            },
            "05 01 05 f8 aa aa d5 aa d5 2a f7 02 a0 ce ea fa a0 f9 14 ff f5 94 d0 cb ce 3f 21",
        ),
        (
            Event::StackDef {
                id: 70_000,
                frames: vec![],
            },
            "05 f0 a2 04 00",
        ),
        (Event::CallerOnlyStack { id: 70_001 }, "09 f1 a2 04"),
        (
            Event::ThreadCreate {
                time: T0,
                create_id: 1,
                stack: 1,
            },
            "06 80 d0 95 ff bc 31 01 01",
        ),
        (
            Event::ThreadStart {
                time: T0 + 5,
                parent_tid: 4242,
                create_id: 1,
            },
            "07 05 92 21 01",
        ),
        (
            Event::Alloc {
                time: T0 + 100,
                addr: HEAP,
                size: 24,
                align: 0,
                func: AllocFn::Malloc,
                stack: 1,
            },
            "10 5f 80 c0 80 c0 cb ce 3f 18 00 01 01",
        ),
        (
            Event::Alloc {
                time: T0 + 300,
                addr: HEAP - 0x40,
                size: 1 << 40,
                align: 4096,
                func: AllocFn::NewArrayAlignedNothrow,
                stack: 200,
            },
            "10 c8 01 7f 80 80 80 80 80 20 80 20 12 c8 01",
        ),
        (
            Event::Free {
                time: T0 + 301,
                addr: HEAP,
                func: AllocFn::Free,
                stack: 0,
            },
            "11 01 80 01 0a 00",
        ),
        (
            Event::Free {
                time: T0 + 1_000_000,
                addr: HEAP - 0x40,
                func: AllocFn::DeleteArrayAlignedNothrow,
                stack: 70_000,
            },
            "11 93 82 3d 7f 1e f0 a2 04",
        ),
        (
            Event::Realloc {
                time: T0 + 1_000_010,
                old_addr: 0,
                new_addr: HEAP + 0x100,
                size: 64,
                func: AllocFn::Realloc,
                stack: 2,
            },
            "12 0a ff be 80 c0 cb ce 3f 80 c4 80 c0 cb ce 3f 40 03 02",
        ),
        (
            Event::Realloc {
                time: T0 + 1_000_020,
                old_addr: HEAP + 0x100,
                new_addr: 0,
                size: 0,
                func: AllocFn::ReallocArray,
                stack: 3,
            },
            "12 0a 00 ff c3 80 c0 cb ce 3f 00 04 03",
        ),
        (
            Event::AllocFailed {
                time: T0 + 1_000_030,
                func: AllocFn::Calloc,
                size: u64::MAX,
                align: 0,
                stack: 4,
            },
            "14 0a 02 ff ff ff ff ff ff ff ff ff 01 00 04",
        ),
        (
            Event::Error {
                time: T0 + 1_000_040,
                kind: ErrorKind::DoubleFree,
                func: AllocFn::Free,
                addr: HEAP,
                stack: 5,
                alloc_func: Some(AllocFn::Malloc),
                alloc_size: 24,
                alloc_stack: 1,
                free_stack: 6,
                passed_on: false,
                given: 0,
            },
            "13 0a 01 0a 80 a0 80 e0 a5 e7 1f 05 01 18 01 06 00",
        ),
        (
            Event::Error {
                time: T0 + 1_000_041,
                kind: ErrorKind::InvalidFree,
                func: AllocFn::Delete,
                addr: 0x1234,
                stack: 7,
                alloc_func: None,
                alloc_size: 0,
                alloc_stack: 0,
                free_stack: 0,
                passed_on: true,
                given: 0,
            },
            "13 01 02 13 b4 24 07 00 00 00 00 01",
        ),
        (
            Event::Error {
                time: T0 + 1_000_042,
                kind: ErrorKind::MismatchedFree,
                func: AllocFn::Free,
                addr: HEAP + 0x200,
                stack: 8,
                alloc_func: Some(AllocFn::New),
                alloc_size: 16,
                alloc_stack: 9,
                free_stack: 0,
                passed_on: true,
                given: 0,
            },
            "13 01 03 0a 80 a4 80 e0 a5 e7 1f 08 0b 10 09 00 01",
        ),
        (
            Event::Error {
                time: T0 + 1_000_043,
                kind: ErrorKind::InvalidRealloc,
                func: AllocFn::Realloc,
                addr: 0xdead_beef,
                stack: 10,
                alloc_func: None,
                alloc_size: 0,
                alloc_stack: 0,
                free_stack: 0,
                passed_on: false,
                given: 0,
            },
            "13 01 04 03 ef fd b6 f5 0d 0a 00 00 00 00 00",
        ),
        (
            Event::Error {
                time: T0 + 1_000_044,
                kind: ErrorKind::MismatchedSize,
                func: AllocFn::DeleteSized,
                addr: HEAP + 0x300,
                stack: 11,
                alloc_func: Some(AllocFn::New),
                alloc_size: 32,
                alloc_stack: 12,
                free_stack: 0,
                passed_on: true,
                given: 48,
            },
            "13 01 05 14 80 a6 80 e0 a5 e7 1f 0b 0b 20 0c 00 01 30",
        ),
        (
            Event::Error {
                time: T0 + 1_000_045,
                kind: ErrorKind::MismatchedAlignment,
                func: AllocFn::DeleteAligned,
                addr: HEAP + 0x400,
                stack: 13,
                alloc_func: Some(AllocFn::NewAligned),
                alloc_size: 64,
                alloc_stack: 14,
                free_stack: 0,
                passed_on: true,
                given: 0,
            },
            "13 01 06 15 80 a8 80 e0 a5 e7 1f 0d 0d 40 0e 00 01 00",
        ),
        (
            Event::Fork {
                time: T0 + 2_000_000,
                child_pid: 5000,
            },
            "30 93 84 3d 88 27",
        ),
        (
            Event::ProfileStart {
                time: T0 + 2_000_001,
                hz: 997,
                signal: 34,
            },
            "60 01 e5 07 22",
        ),
        (
            Event::Sample {
                time: T0 + 3_000_000,
                stack: 15,
                periods: 1,
            },
            "61 bf 84 3d 0f 01",
        ),
        (
            Event::Sample {
                time: T0 + 3_000_000,
                stack: 20_000,
                periods: 3,
            },
            "61 00 a0 9c 01 03",
        ),
        (
            Event::SamplesSkipped {
                time: T0 + 3_000_100,
                periods: 2,
            },
            "62 64 02",
        ),
        (
            Event::SamplesMissed {
                time: T0 + 3_000_200,
                periods: 1 << 33,
            },
            "64 64 80 80 80 80 20",
        ),
        (
            Event::ProfileStop {
                time: T0 + 3_000_300,
                reason: ProfileStopReason::SignalTaken,
            },
            "63 64 01",
        ),
        (
            lock(LockEvent::Init {
                time: T0 + 3_000_400,
                addr: 0x5555_5555_8040,
                kind: LockKind::MutexRecursive,
                stack: 16,
            }),
            "40 64 80 81 ac d5 aa d5 2a 01 10",
        ),
        (
            lock(LockEvent::Acquire {
                time: T0 + 3_000_410,
                addr: 0x5555_5555_8040,
                kind: LockKind::MutexRecursive,
                mode: LockMode::Exclusive,
                op: LockOp::Blocking,
                wait_ns: None,
                stack: 17,
            }),
            "42 0a 00 01 11",
        ),
        (
            lock(LockEvent::Acquire {
                time: T0 + 3_100_000,
                addr: 0x5555_5555_8080,
                kind: LockKind::RwLock,
                mode: LockMode::Shared,
                op: LockOp::Try,
                wait_ns: None,
                stack: 20_000,
            }),
            "42 86 8a 06 80 01 1c a0 9c 01",
        ),
        (
            lock(LockEvent::Request {
                time: T0 + 3_100_010,
                addr: 0x5555_5555_8040,
                kind: LockKind::MutexErrorCheck,
                mode: LockMode::Exclusive,
                stack: 18,
            }),
            "44 0a 7f 02 12",
        ),
        (
            lock(LockEvent::Acquire {
                time: T0 + 3_100_500,
                addr: 0x5555_5555_8040,
                kind: LockKind::MutexErrorCheck,
                mode: LockMode::Exclusive,
                op: LockOp::Timed,
                wait_ns: Some(490),
                stack: 18,
            }),
            "42 ea 03 00 62 12 ea 03",
        ),
        (
            lock(LockEvent::Acquire {
                time: T0 + 3_100_600,
                addr: 0x5555_5555_80c0,
                kind: LockKind::MutexAdaptive,
                mode: LockMode::Exclusive,
                op: LockOp::CondWait,
                wait_ns: Some(0),
                stack: 19,
            }),
            "42 64 80 02 73 13 00",
        ),
        (
            lock(LockEvent::Request {
                time: T0 + 3_100_700,
                addr: 0x5555_5555_8080,
                kind: LockKind::RwLock,
                mode: LockMode::Shared,
                stack: 20,
            }),
            "44 64 7f 0c 14",
        ),
        (
            lock(LockEvent::Failed {
                time: T0 + 3_100_800,
                addr: 0x5555_5555_8080,
                kind: LockKind::RwLock,
                mode: LockMode::Shared,
                op: LockOp::Timed,
                errno: 110,
                stack: 21,
            }),
            "45 64 00 2c 6e 15",
        ),
        (
            lock(LockEvent::Failed {
                time: T0 + 3_100_900,
                addr: 0x5555_5555_8100,
                kind: LockKind::Spin,
                mode: LockMode::Exclusive,
                op: LockOp::Try,
                errno: -1,
                stack: 22,
            }),
            "45 64 80 02 15 ff ff ff ff 0f 16",
        ),
        (
            lock(LockEvent::Misuse {
                time: T0 + 3_101_000,
                addr: 0x5555_5555_8040,
                kind: LockKind::Mutex,
                misuse: LockMisuse::SelfDeadlock,
                errno: 0,
                stack: 23,
            }),
            "46 64 ff 02 00 01 00 17",
        ),
        (
            lock(LockEvent::Misuse {
                time: T0 + 3_101_100,
                addr: 0x5555_5555_8040,
                kind: LockKind::Unknown,
                misuse: LockMisuse::Refused,
                errno: 1,
                stack: 24,
            }),
            "46 64 00 06 02 01 18",
        ),
        (
            lock(LockEvent::Release {
                time: T0 + 3_101_200,
                addr: 0x5555_5555_8040,
                kind: LockKind::MutexRecursive,
                stack: 0,
                agent_ns: 0,
            }),
            "43 64 00 01 00",
        ),
        (
            lock(LockEvent::Release {
                time: T0 + 3_200_000,
                addr: 0x5555_5555_8080,
                kind: LockKind::RwLock,
                stack: 25,
                agent_ns: 0,
            }),
            "43 f0 83 06 80 01 04 19",
        ),
        (
            lock(LockEvent::Destroy {
                time: T0 + 3_200_100,
                addr: 0x5555_5555_8040,
                kind: LockKind::MutexRecursive,
                stack: 26,
            }),
            "41 64 7f 01 1a",
        ),
        (
            lock(LockEvent::JoinWait {
                time: T0 + 3_200_200,
                joined: 4243,
                stack: 27,
            }),
            "4a 64 93 21 1b",
        ),
        (
            lock(LockEvent::Join {
                time: T0 + 3_200_300,
                joined: 4243,
                stack: 27,
            }),
            "47 64 93 21 1b",
        ),
        (
            lock(LockEvent::Detach {
                time: T0 + 3_200_400,
                detached: 0,
            }),
            "48 64 00",
        ),
        (
            lock(LockEvent::Exit {
                time: T0 + 3_200_500,
                stack: 28,
            }),
            "49 64 1c",
        ),
        (Event::ThreadEnd { time: T0 + 3_200_600 }, "08 64"),
        (
            Event::SnapshotBegin {
                time: T0 + 4_000_000,
                kind: SnapshotKind::Exit,
            },
            "20 a8 e5 30 01",
        ),
        (
            Event::LiveBlock {
                addr: HEAP + 0x500,
                size: 100,
                func: AllocFn::Mallocx,
                stack: 29,
            },
            "21 80 d3 d4 ea a0 f9 14 64 1f 1d",
        ),
        (
            Event::SnapshotEnd {
                blocks: 1,
                bytes: 100,
            },
            "22 01 64",
        ),
        (
            Event::ScanBegin {
                time: T0 + 4_000_100,
                scan: 1,
                trigger: ScanTrigger::Periodic,
            },
            "23 64 01 02",
        ),
        (
            Event::ScanBlock {
                scan: 1,
                addr: HEAP + 0x500,
                size: 100,
                func: AllocFn::Mallocx,
                stack: 29,
                verdict: Verdict::DefinitelyLost,
                indirect_bytes: 4096,
            },
            "24 01 00 64 1f 1d 01 80 20",
        ),
        (
            Event::ScanBlock {
                scan: 1,
                addr: HEAP + 0x80,
                size: 8,
                func: AllocFn::FreeSized,
                stack: 30,
                verdict: Verdict::StillReachable,
                indirect_bytes: 0,
            },
            "24 01 ff 11 08 24 1e 04 00",
        ),
        (
            Event::ScanEnd {
                scan: 1,
                stats: ScanStats {
                    pause_ns: 1_500_000,
                    threads: 3,
                    threads_not_suspended: 0,
                    root_bytes: 8 << 20,
                    blocks: 2,
                    bytes: 108,
                    mappings_not_excluded: 0,
                },
            },
            "25 01 e0 c6 5b 03 00 80 80 80 04 02 6c",
        ),
        (
            Event::ScanBegin {
                time: T0 + 4_000_200,
                scan: 2,
                trigger: ScanTrigger::Exit,
            },
            "23 64 02 01",
        ),
        (
            Event::ScanEnd {
                scan: 2,
                stats: ScanStats {
                    pause_ns: 20,
                    threads: 1,
                    threads_not_suspended: 1,
                    root_bytes: 0,
                    blocks: 0,
                    bytes: 0,
                    mappings_not_excluded: 925,
                },
            },
            "27 02 14 01 01 00 00 00 9d 07",
        ),
        (
            Event::ScanSkipped {
                time: T0 + 4_000_300,
                trigger: ScanTrigger::Periodic,
                reason: ScanSkipReason::OverBudget,
                needed: 1_000_000,
                available: 50_000_000_000,
                limit: 20_000,
            },
            "26 64 02 08 c0 84 3d 80 e8 ed a1 ba 01 a0 9c 01",
        ),
        (
            Event::ScanSkipped {
                time: T0 + 4_000_400,
                trigger: ScanTrigger::Exit,
                reason: ScanSkipReason::MemoryUnreadable,
                needed: 0,
                available: 0,
                limit: 0,
            },
            "26 64 01 06 00 00 00",
        ),
        (
            Event::RunTotals(RunTotals {
                allocation_calls: 1_000_000,
                release_calls: 999_999,
                errors: 6,
                failed_allocations: 1,
                peak_bytes: 1 << 30,
                peak_time: T0 + 300,
            }),
            "34 c0 84 3d bf 84 3d 06 80 80 80 80 04 ac d2 95 ff bc 31 01",
        ),
        (
            Event::End {
                time: T0 + 5_000_000,
                exit: ExitKind::Code(0),
                counters: EndCounters {
                    events: 64,
                    events_lost: 0,
                    untracked_calls: 12,
                },
            },
            "31 b0 81 3d 00 00 40 00 0c",
        ),
        (
            Event::End {
                time: T0 + 5_000_001,
                exit: ExitKind::Code(-1),
                counters: EndCounters::default(),
            },
            "31 01 00 01 00 00 00",
        ),
        (
            Event::End {
                time: T0 + 5_000_002,
                exit: ExitKind::Signal(9),
                counters: EndCounters {
                    events: u64::MAX,
                    events_lost: 3,
                    untracked_calls: 0,
                },
            },
            "31 01 01 12 ff ff ff ff ff ff ff ff ff 01 03 00",
        ),
        (
            Event::End {
                time: T0 + 5_000_003,
                exit: ExitKind::Exec,
                counters: EndCounters::default(),
            },
            "31 01 02 00 00 00",
        ),
        (
            Event::SiteVerdict {
                time: T0 + 5_000_004,
                stack: 3,
                func: AllocFn::Malloc,
                kinds: 3,
                growth_bytes_per_second: 128_000,
                watched_blocks: 70,
                untouched_blocks: 44,
                untouched_ns: 4_000_000_000,
                last_access_ns: 0,
            },
            "28 01 03 01 03 80 e8 07 46 2c 80 d0 ac f3 0e 00",
        ),
        (
            Event::ControlSocket {
                path: "/tmp/trapline-0/42.sock".into(),
            },
            "35 17 2f 74 6d 70 2f 74 72 61 70 6c 69 6e 65 2d 30 2f 34 32 2e 73 6f 63 6b",
        ),
        (
            Event::AgentSamples {
                time: T0 + 5_000_006,
                stack: 9,
                periods: 3,
            },
            "65 02 09 03",
        ),
        (
            lock(LockEvent::Release {
                time: T0 + 5_100_000,
                addr: 0x5555_5555_8040,
                kind: LockKind::Mutex,
                stack: 0,
                agent_ns: 1_048_576,
            }),
            "4b 9a 8d 06 ff c0 d4 ea a0 f9 14 00 00 80 80 40",
        ),
        (
            Event::Attach {
                time: T0 + 5_100_001,
            },
            "36 01",
        ),
        (
            Event::AttachTotals {
                earlier_releases: 300,
            },
            "37 ac 02",
        ),
        (
            Event::Crash {
                time: T0 + 5_100_001,
                signal: 11,
                code: 1,
                addr: 0x10,
                stack: 7,
            },
            "38 00 0b 01 10 07",
        ),
        (
            Event::StoppedAtCrash {
                time: T0 + 5_100_001,
                stack: 9,
            },
            "39 00 09",
        ),
        (
            Event::CallCounts {
                time: T0 + 5_100_001,
                func: AllocFn::Calloc,
                calls: 1000,
                bytes: 300,
            },
            "3a 00 02 e8 07 ac 02",
        ),
        (
            Event::End {
                time: T0 + 5_100_002,
                exit: ExitKind::Detach,
                counters: EndCounters::default(),
            },
            "31 01 03 00 00 00",
        ),
    ]
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::new();
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Each event's bytes, encoded one after the other in one chunk context,
/// with the context before each.
fn encode_all(events: &[Event]) -> Vec<(ChunkContext, Vec<u8>)> {
    let mut ctx = ChunkContext::default();
    events
        .iter()
        .map(|ev| {
            let before = ctx;
            let mut out = Vec::new();
            encode_to_vec(&mut out, &mut ctx, ev);
            (before, out)
        })
        .collect()
}

#[test]
#[ignore = "prints the golden table's bytes for a deliberate format change"]
fn print_golden_bytes() {
    let events: Vec<Event> = golden().into_iter().map(|(ev, _)| ev).collect();
    for (ev, (_, bytes)) in events.iter().zip(encode_all(&events)) {
        println!("{ev:?}\n    \"{}\"", hex(&bytes));
    }
}

#[test]
fn every_event_encodes_to_its_pinned_bytes() {
    let table = golden();
    let events: Vec<Event> = table.iter().map(|(ev, _)| ev.clone()).collect();
    let mut mismatches = Vec::new();
    for ((ev, want), (_, got)) in table.iter().zip(encode_all(&events)) {
        if hex(&got) != *want {
            mismatches.push(format!("{ev:?}\n  want {want}\n  got  {}", hex(&got)));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn the_pinned_bytes_decode_to_every_event() {
    let table = golden();
    let stream: Vec<u8> = table
        .iter()
        .flat_map(|(_, h)| h.split(' ').map(|b| u8::from_str_radix(b, 16).unwrap()))
        .collect();
    let decoded: Vec<Event> = Decoder::new(&stream).map(|r| r.unwrap()).collect();
    let events: Vec<Event> = table.into_iter().map(|(ev, _)| ev).collect();
    assert_eq!(decoded, events);
}

/// The encoder's paths for an output that may not hold the longest form of
/// an event (the hot events' field-by-field fallback, the lock events'
/// unpacked form) write the same bytes, and an output one byte short is
/// refused.
#[test]
fn an_exactly_sized_output_gets_the_same_bytes() {
    let events: Vec<Event> = golden().into_iter().map(|(ev, _)| ev).collect();
    for (ev, (before, want)) in events.iter().zip(encode_all(&events)) {
        let mut buf = vec![0u8; want.len()];
        let mut ctx = before;
        let mut enc = Encoder::new(&mut buf);
        assert_eq!(enc.event(&mut ctx, ev), Ok(()), "{ev:?}");
        assert_eq!(enc.len(), want.len(), "{ev:?}");
        assert_eq!(hex(&buf), hex(&want), "{ev:?}");

        let mut short = vec![0u8; want.len() - 1];
        let mut ctx = before;
        assert_eq!(
            Encoder::new(&mut short).event(&mut ctx, ev),
            Err(NoRoom),
            "{ev:?}"
        );
    }
}

/// The agent's direct encoders write what the event encoder writes.
#[test]
fn direct_encoders_match_the_event_encoder() {
    let events: Vec<Event> = golden().into_iter().map(|(ev, _)| ev).collect();
    let mut checked = 0;
    for (ev, (before, want)) in events.iter().zip(encode_all(&events)) {
        for room in [want.len(), 256] {
            let mut buf = vec![0u8; room];
            let mut ctx = before;
            let mut enc = Encoder::new(&mut buf);
            let r = match *ev {
                Event::Alloc {
                    time,
                    addr,
                    size,
                    align,
                    func,
                    stack,
                } => enc.alloc(&mut ctx, time, addr, size, align, func, stack),
                Event::Free {
                    time,
                    addr,
                    func,
                    stack,
                } => enc.free(&mut ctx, time, addr, func, stack),
                Event::Sample {
                    time,
                    stack,
                    periods,
                } => enc.sample(&mut ctx, time, stack, periods),
                Event::StackDef { id, ref frames } => enc.stack_def(id, frames),
                Event::Lock(LockEvent::Acquire {
                    time,
                    addr,
                    kind,
                    mode,
                    op,
                    wait_ns,
                    stack,
                }) => enc.lock_acquire(&mut ctx, time, addr, kind, mode, op, wait_ns, stack),
                Event::Lock(LockEvent::Release {
                    time,
                    addr,
                    kind,
                    stack,
                    agent_ns,
                }) => enc.lock_release(&mut ctx, time, addr, kind, stack, agent_ns),
                _ => continue,
            };
            assert_eq!(r, Ok(()), "{ev:?}");
            let n = enc.len();
            assert_eq!(hex(&buf[..n]), hex(&want), "{ev:?} with room {room}");
            checked += 1;
        }
    }
    assert_eq!(checked, 2 * 15);
}

/// The agent's caller-only stack definition is a `StackDef` of one frame
/// and the `CallerOnlyStack` marking it, or nothing when they do not fit.
#[test]
fn caller_only_stack_definitions_come_whole() {
    let caller = 0x5555_5555_4abc;
    let events = [
        Event::StackDef {
            id: 7,
            frames: vec![caller],
        },
        Event::CallerOnlyStack { id: 7 },
    ];
    let want: Vec<u8> = encode_all(&events)
        .into_iter()
        .flat_map(|(_, bytes)| bytes)
        .collect();
    for room in 0..want.len() + 2 {
        let mut buf = vec![0u8; room];
        let mut enc = Encoder::new(&mut buf);
        let done = enc.caller_only_stack_def(7, caller);
        let n = enc.len();
        match done {
            Ok(()) => assert_eq!(hex(&buf[..n]), hex(&want)),
            Err(_) => {
                assert!(room < want.len());
                assert_eq!(n, 0, "nothing half-written with room {room}");
            }
        }
    }
}

/// Tags that only older agents wrote still decode.
#[test]
fn run_totals_without_failed_allocations_decode() {
    let bytes = [50, 0xc0, 0x84, 0x3d, 0x05, 0x06, 0x80, 0x01, 0x07];
    let decoded: Vec<_> = Decoder::new(&bytes).collect();
    assert_eq!(
        decoded,
        vec![Ok(Event::RunTotals(RunTotals {
            allocation_calls: 1_000_000,
            release_calls: 5,
            errors: 6,
            failed_allocations: 0,
            peak_bytes: 128,
            peak_time: 7,
        }))]
    );
}

/// What the decoder makes of damaged input (which error, with which name,
/// or which wrong-but-valid event) is pinned too: every prefix of every
/// event, and every byte of it replaced by a few values, through a checksum
/// of the results.
#[test]
fn damaged_events_decode_as_before() {
    let events: Vec<Event> = golden().into_iter().map(|(ev, _)| ev).collect();
    let mut crc = trapline_trace::crc32::Crc32::new();
    let mut cases = 0;
    let mut decode = |bytes: &[u8]| {
        let results: Vec<_> = Decoder::new(bytes).collect();
        crc.update(format!("{results:?}\n").as_bytes());
        cases += 1;
    };
    for (_, bytes) in encode_all(&events) {
        for len in 0..bytes.len() {
            decode(&bytes[..len]);
        }
        for at in 0..bytes.len() {
            for b in [0x00, 0x01, 0x02, 0x07, 0x08, 0x40, 0x7f, 0x80, 0xff] {
                let mut bad = bytes.clone();
                bad[at] = b;
                decode(&bad);
            }
        }
    }
    for tag in 0..=255u8 {
        decode(&[tag, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    }
    // To find what changed: print `results` before and after, and diff.
    assert_eq!((cases, crc.finalize()), (9296, 0xc375_b95a));
}
