//! `leaks` on synthesized traces.

mod common;

use common::*;
use trapline_analysis::leaks::{analyze, render_text};
use trapline_trace::{AllocFn, EndCounters, ErrorKind, Event, ExitKind, TraceError};

/// A finished process: three threads, chunks out of time order, stacks
/// defined after their first use, an exit snapshot.
fn finished_trace() -> Vec<(u32, Vec<Event>)> {
    vec![
        (0, vec![process(), module()]),
        // Thread 2 flushed first although its events come later.
        (
            2,
            vec![
                malloc(300, 0x9000, 100, 2),
                free(310, 0x9000, 3),
                malloc(320, 0x9100, 7, 2),
            ],
        ),
        (
            1,
            vec![
                malloc(100, 0x1000, 1024, 1),
                malloc(110, 0x2000, 10, 1),
                malloc(120, 0x3000, 5, 0),
            ],
        ),
        (
            3,
            vec![
                stack(1, &[0x401234, 0x401500]),
                stack(2, &[0x401111]),
                stack(3, &[0x401222]),
            ],
        ),
        (
            0,
            vec![
                snapshot_begin(1000),
                live(0x1000, 1024, AllocFn::Malloc, 1),
                live(0x2000, 10, AllocFn::Malloc, 1),
                live(0x9100, 7, AllocFn::Malloc, 2),
                live(0x3000, 5, AllocFn::Malloc, 0),
                live(0x4000, 7, AllocFn::New, 4),
                Event::SnapshotEnd {
                    blocks: 5,
                    bytes: 1053,
                },
                end(1001, 0, 0),
            ],
        ),
    ]
}

#[test]
fn exit_snapshot_gives_loss_records_sorted_by_bytes() {
    let bytes = build(&finished_trace());
    let r = analyze(&mut cursor(&bytes)).unwrap();
    assert!(r.trace.complete);
    assert!(r.trace.has_end);
    assert!(r.trace.has_exit_snapshot);
    assert_eq!(r.trace.stopped, None);
    assert_eq!(r.summary.source, "exit_snapshot");
    assert_eq!(r.summary.unfreed_at_exit.bytes, 1053);
    assert_eq!(r.summary.unfreed_at_exit.blocks, 5);
    let got: Vec<_> = r
        .records
        .iter()
        .map(|x| (x.bytes, x.blocks, x.stack_id, x.allocated_by))
        .collect();
    assert_eq!(
        got,
        vec![
            (1034, 2, 1, "malloc"),
            // Same bytes and blocks: ordered by first frame; stack 4 was never defined.
            (7, 1, 2, "malloc"),
            (7, 1, 4, "operator new(unsigned long)"),
            (5, 1, 0, "malloc"),
        ]
    );
    assert!(r.records.iter().all(|x| x.kind == "unfreed_at_exit"));
    assert_eq!(r.records[0].stack.len(), 2);
    assert_eq!(r.records[0].stack[0].address, 0x401234);
    assert_eq!(r.records[0].stack[1].address, 0x401500);
    assert!(r.records[2].stack.is_empty());
    assert_eq!(r.summary.total_heap_usage.allocs, 5);
    assert_eq!(r.summary.total_heap_usage.frees, 1);
    assert_eq!(r.summary.total_heap_usage.bytes_allocated, 1146);
    assert_eq!(r.process.pid, Some(PID));
    assert_eq!(r.process.command, vec!["/nonexistent/prog", "--flag"]);
    assert_eq!(r.process.exit.unwrap().code, Some(0));
    assert_eq!(r.events_lost, Some(0));
    assert_eq!(r.trace.chunks, 5);
}

#[test]
fn json_has_the_documented_shape() {
    let bytes = build(&finished_trace());
    let r = analyze(&mut cursor(&bytes)).unwrap();
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["process"]["pid"], 4242);
    assert_eq!(v["process"]["command"][1], "--flag");
    assert_eq!(v["process"]["exit"], serde_json::json!({"code": 0}));
    assert_eq!(
        v["summary"]["unfreed_at_exit"],
        serde_json::json!({"bytes": 1053, "blocks": 5})
    );
    let rec = &v["records"][0];
    assert_eq!(rec["kind"], "unfreed_at_exit");
    assert_eq!(rec["bytes"], 1034);
    assert_eq!(rec["blocks"], 2);
    assert_eq!(rec["allocated_by"], "malloc");
    let frame = &rec["stack"][0];
    assert_eq!(frame["address"], "0x401234");
    for key in ["function", "file", "line", "inlined", "module"] {
        assert!(frame.get(key).is_some(), "frame has {key}");
    }
    assert_eq!(v["errors"], serde_json::json!([]));
    assert_eq!(v["events_lost"], 0);
    assert_eq!(v["trace"]["complete"], true);
    assert_eq!(v["trace"]["stopped"], serde_json::Value::Null);
}

#[test]
fn text_reads_like_memcheck() {
    let bytes = build(&finished_trace());
    let r = analyze(&mut cursor(&bytes)).unwrap();
    let t = render_text(&r);
    let expect = [
        "==4242== Command: /nonexistent/prog --flag",
        "==4242== HEAP SUMMARY:",
        "==4242==     in use at exit: 1,053 bytes in 5 blocks",
        "==4242==   total heap usage: 5 allocs, 1 frees, 1,146 bytes allocated",
        "==4242== 1,034 bytes in 2 blocks are still allocated at exit in loss record 1 of 4",
        "==4242==    at malloc",
        "==4242==    by 0x401234: ???",
        "==4242==    by 0x401500: ???",
        "==4242== 7 bytes in 1 blocks are still allocated at exit in loss record 3 of 4",
        "==4242==    at operator new(unsigned long)",
        "==4242==    (stack 4 is missing from the trace)",
        "==4242==    (no stack recorded)",
        "==4242== ERROR SUMMARY: 0 errors from 0 contexts",
        "==4242== events lost: 0",
    ];
    for line in expect {
        assert!(
            t.lines().any(|l| l.starts_with(line)),
            "missing {line:?} in:\n{t}"
        );
    }
    assert!(!t.contains("WARNING"), "{t}");
}

#[test]
fn errors_are_listed_and_identical_ones_merged() {
    let df = |time, addr| Event::Error {
        time,
        kind: ErrorKind::DoubleFree,
        func: AllocFn::Free,
        addr,
        stack: 5,
        alloc_func: Some(AllocFn::Malloc),
        alloc_size: 16,
        alloc_stack: 1,
        free_stack: 2,
        passed_on: false,
        given: 0,
    };
    let mismatch = Event::Error {
        time: 40,
        kind: ErrorKind::MismatchedFree,
        func: AllocFn::Delete,
        addr: 0x7000,
        stack: 6,
        alloc_func: Some(AllocFn::NewArray),
        alloc_size: 40,
        alloc_stack: 1,
        free_stack: 0,
        passed_on: true,
        given: 0,
    };
    let chunks = vec![
        (0, vec![process()]),
        (
            1,
            vec![
                alloc_with(5, 0x7000, 40, AllocFn::NewArray, 1),
                df(10, 0x5000),
                error(20, ErrorKind::InvalidFree, AllocFn::Free, 0x1234, 7),
                df(30, 0x5100),
                mismatch,
                Event::Free {
                    time: 40,
                    addr: 0x7000,
                    func: AllocFn::Delete,
                    stack: 6,
                },
                error(50, ErrorKind::InvalidRealloc, AllocFn::Realloc, 0x42, 0),
                error(60, ErrorKind::InvalidRealloc, AllocFn::Realloc, 0x43, 0),
            ],
        ),
        (
            0,
            vec![
                stack(1, &[0x401001]),
                stack(2, &[0x401002]),
                stack(5, &[0x401005]),
                snapshot_begin(70),
                Event::SnapshotEnd {
                    blocks: 0,
                    bytes: 0,
                },
                end(71, 0, 0),
            ],
        ),
    ];
    let r = analyze(&mut cursor(&build(&chunks))).unwrap();
    let got: Vec<_> = r
        .errors
        .iter()
        .map(|e| (e.kind, e.count, e.address))
        .collect();
    assert_eq!(
        got,
        vec![
            ("double_free", 2, 0x5000),
            ("invalid_free", 1, 0x1234),
            ("mismatched_free", 1, 0x7000),
            ("invalid_realloc", 1, 0x42),
            ("invalid_realloc", 1, 0x43),
        ]
    );
    assert_eq!(r.summary.errors, 6);
    assert_eq!(r.summary.error_contexts, 5);
    let d = &r.errors[0];
    assert_eq!(d.alloc_function, Some("malloc"));
    assert_eq!(d.alloc_size, Some(16));
    assert_eq!(d.alloc_stack[0].address, 0x401001);
    assert_eq!(d.free_stack[0].address, 0x401002);
    assert_eq!(d.stack[0].address, 0x401005);
    assert_eq!(r.errors[1].alloc_size, None);
    assert_eq!(r.errors[2].function, "operator delete(void*)");
    assert_eq!(
        r.errors[2].alloc_function,
        Some("operator new[](unsigned long)")
    );
    // The mismatched free released the block.
    assert_eq!(r.summary.unfreed_at_exit.blocks, 0);
    assert!(r.records.is_empty());

    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["errors"][0]["kind"], "double_free");
    assert_eq!(v["errors"][0]["address"], "0x5000");
    assert_eq!(v["errors"][0]["function"], "free");
    assert_eq!(v["errors"][0]["count"], 2);
    assert_eq!(v["errors"][0]["passed_on"], false);
    // A mismatched free is always performed: no passed_on.
    assert_eq!(v["errors"][2].get("passed_on"), None);
    assert_eq!(v["errors"][0]["free_stack"][0]["address"], "0x401002");

    let t = render_text(&r);
    for line in [
        "==4242== Invalid free() / delete / delete[] / realloc() (double free)",
        "==4242==  (happened 2 times at this stack; the first is shown)",
        "==4242==  Address 0x5000 is 0 bytes inside a block of size 16 free'd",
        "==4242==  Block was alloc'd at",
        "==4242== Mismatched free() / delete / delete []",
        "==4242==    at operator delete(void*)",
        "==4242==  Address 0x7000 is 0 bytes inside a block of size 40 alloc'd",
        "==4242==    at operator new[](unsigned long)",
        "==4242== ERROR SUMMARY: 6 errors from 5 contexts",
    ] {
        assert!(
            t.lines().any(|l| l.starts_with(line)),
            "missing {line:?} in:\n{t}"
        );
    }
}

#[test]
fn freed_section_starts_with_the_release_function_like_memcheck() {
    let double_free = Event::Error {
        time: 30,
        kind: ErrorKind::DoubleFree,
        func: AllocFn::Free,
        addr: 0x5000,
        stack: 5,
        alloc_func: Some(AllocFn::New),
        alloc_size: 16,
        alloc_stack: 1,
        free_stack: 2,
        passed_on: false,
        given: 0,
    };
    let chunks = vec![
        (0, vec![process()]),
        (
            1,
            vec![
                alloc_with(10, 0x5000, 16, AllocFn::New, 1),
                Event::Free {
                    time: 20,
                    addr: 0x5000,
                    func: AllocFn::DeleteSized,
                    stack: 2,
                },
                double_free,
                stack(1, &[0x401001]),
                stack(2, &[0x401002, 0x401003]),
                stack(5, &[0x401005]),
            ],
        ),
        (0, vec![end(71, 0, 0)]),
    ];
    let r = analyze(&mut cursor(&build(&chunks))).unwrap();
    let e = &r.errors[0];
    assert_eq!(
        e.free_function,
        Some("operator delete(void*, unsigned long)")
    );
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(
        v["errors"][0]["free_function"],
        "operator delete(void*, unsigned long)"
    );
    let t = render_text(&r);
    // Bad call, free'd and alloc'd sections: the function, then the frames.
    let expect = "\
==4242==    at free
==4242==    by 0x401005: ???
==4242==  Address 0x5000 is 0 bytes inside a block of size 16 free'd
==4242==    at operator delete(void*, unsigned long)
==4242==    by 0x401002: ???
==4242==    by 0x401003: ???
==4242==  Block was alloc'd at
==4242==    at operator new(unsigned long)
==4242==    by 0x401001: ???
";
    assert!(t.contains(expect), "missing\n{expect}in:\n{t}");
}

/// Address reuse across threads whose chunks are out of time order in the file.
fn killed_trace() -> Vec<(u32, Vec<Event>)> {
    vec![
        (0, vec![process(), module()]),
        // Written first, happens last: the block at 0x5000 is reused here.
        (
            2,
            vec![malloc(300, 0x5000, 64, 2), realloc(310, 0, 0x6000, 32, 3)],
        ),
        (
            1,
            vec![
                malloc(100, 0x5000, 8, 1),
                free(200, 0x5000, 0),
                malloc(210, 0x7000, 10, 1),
                realloc(220, 0x7000, 0x7000, 20, 3), // grown in place
                malloc(230, 0x8000, 1, 1),
                realloc(240, 0x8000, 0, 0, 3), // realloc(p, 0) freed it
                malloc(250, 0x9000, 5, 1),
                realloc(260, 0x9000, 0, 500, 3), // failed: the block stays
                realloc(270, 0x9000, 0xa000, 6, 3), // moved
            ],
        ),
        (
            1,
            vec![
                stack(1, &[0x401001]),
                stack(2, &[0x401002]),
                stack(3, &[0x401003]),
            ],
        ),
    ]
}

#[test]
fn killed_process_is_replayed_in_time_order() {
    let r = analyze(&mut cursor(&build(&killed_trace()))).unwrap();
    assert!(!r.trace.complete);
    assert!(!r.trace.has_end);
    assert!(!r.trace.has_exit_snapshot);
    assert_eq!(r.trace.stopped, None);
    assert_eq!(r.process.exit, None);
    assert_eq!(r.events_lost, None);
    assert_eq!(r.summary.source, "replay");
    // In file order, thread 1's free would have released thread 2's block.
    let got: Vec<_> = r
        .records
        .iter()
        .map(|x| (x.kind, x.bytes, x.blocks, x.stack_id, x.allocated_by))
        .collect();
    assert_eq!(
        got,
        vec![
            ("live_at_end_of_trace", 64, 1, 2, "malloc"),
            ("live_at_end_of_trace", 58, 3, 3, "realloc"),
        ]
    );
    let u = r.summary.total_heap_usage;
    assert_eq!((u.allocs, u.frees, u.bytes_allocated), (8, 4, 146));
    assert_eq!(r.summary.unfreed_at_exit.bytes, 122);
    assert_eq!(r.summary.unfreed_at_exit.blocks, 4);

    let t = render_text(&r);
    assert!(
        t.contains("in use at end of trace: 122 bytes in 4 blocks"),
        "{t}"
    );
    assert!(
        t.contains(
            "64 bytes in 1 blocks were still allocated when the trace ends in loss record 1 of 2"
        ),
        "{t}"
    );
    assert!(t.contains("WARNING: the process did not finish"), "{t}");
    assert!(t.contains("events lost: unknown"), "{t}");
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["process"]["exit"], serde_json::Value::Null);
    assert_eq!(v["trace"]["complete"], false);
    assert_eq!(v["events_lost"], serde_json::Value::Null);
}

#[test]
fn truncated_trace_reports_what_was_read_and_where_it_stopped() {
    let mut chunks = killed_trace();
    // The agent was killed while appending a last chunk.
    chunks.push((
        3,
        vec![malloc(400, 0xb000, 1000, 1), malloc(410, 0xc000, 1000, 1)],
    ));
    let offsets = chunk_offsets(&chunks);
    let full = build(&chunks);
    let cut = &full[..full.len() - 5];
    let r = analyze(&mut cursor(cut)).unwrap();
    assert!(!r.trace.complete);
    let stopped = r.trace.stopped.clone().expect("stopped");
    assert_eq!(stopped.offset, offsets[4]);
    assert!(stopped.reason.contains("truncated"), "{}", stopped.reason);
    assert_eq!(r.trace.chunks, 4);
    // Same result as without the torn chunk.
    assert_eq!(r.summary.unfreed_at_exit.bytes, 122);
    assert_eq!(r.summary.unfreed_at_exit.blocks, 4);
    let t = render_text(&r);
    let last = t.lines().last().unwrap();
    assert!(
        last.starts_with(&format!(
            "==4242== WARNING: reading stopped at byte {}",
            offsets[4]
        )),
        "{t}"
    );
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["trace"]["stopped"]["offset"], offsets[4]);
    assert!(v["trace"]["stopped"]["reason"]
        .as_str()
        .unwrap()
        .contains("truncated"));
}

#[test]
fn snapshot_cut_short_falls_back_to_replay() {
    let mut chunks = killed_trace();
    chunks.push((
        0,
        vec![snapshot_begin(500), live(0x5000, 64, AllocFn::Malloc, 2)],
    ));
    let r = analyze(&mut cursor(&build(&chunks))).unwrap();
    assert!(!r.trace.has_exit_snapshot);
    assert_eq!(r.summary.source, "replay");
    assert_eq!(r.summary.unfreed_at_exit.bytes, 122);
}

#[test]
fn corrupt_chunk_is_skipped_and_the_rest_read() {
    let chunks = vec![
        (0, vec![process()]),
        (1, vec![malloc(10, 0x1000, 10, 0)]),
        (2, vec![malloc(20, 0x2000, 20, 0)]),
        (1, vec![malloc(30, 0x3000, 30, 0)]),
    ];
    let offsets = chunk_offsets(&chunks);
    let mut bytes = build(&chunks);
    // Damage the payload of the third chunk: its checksum no longer matches.
    let at = offsets[2] as usize + 44;
    bytes[at] ^= 0xff;
    let r = analyze(&mut cursor(&bytes)).unwrap();
    assert_eq!(r.trace.stopped, None);
    assert!(!r.trace.complete);
    let damaged = &r.trace.damaged_chunks;
    assert_eq!(damaged.len(), 1, "{damaged:?}");
    assert_eq!(damaged[0].offset, offsets[2]);
    assert!(
        damaged[0].reason.contains("corrupt"),
        "{}",
        damaged[0].reason
    );
    assert!(
        damaged[0].reason.contains(&format!("byte {}", offsets[2])),
        "{}",
        damaged[0].reason
    );
    // The chunk after the damaged one is read: 10 + 30 bytes live.
    assert_eq!(r.summary.unfreed_at_exit.bytes, 40);
    assert_eq!(r.summary.unfreed_at_exit.blocks, 2);
}

#[test]
fn lost_events_are_reported_everywhere() {
    let chunks = vec![
        (0, vec![process()]),
        (1, vec![malloc(10, 0x1000, 10, 0)]),
        (
            0,
            vec![
                snapshot_begin(20),
                live(0x1000, 10, AllocFn::Malloc, 0),
                Event::SnapshotEnd {
                    blocks: 1,
                    bytes: 10,
                },
                Event::End {
                    time: 21,
                    exit: ExitKind::Signal(6),
                    counters: EndCounters {
                        events: 5,
                        events_lost: 1234,
                        untracked_calls: 2,
                    },
                },
            ],
        ),
    ];
    let r = analyze(&mut cursor(&build(&chunks))).unwrap();
    assert_eq!(r.events_lost, Some(1234));
    assert_eq!(r.untracked_calls, Some(2));
    // Events the end record counts as written but the file does not hold
    // (a chunk that never reached it) are lost too: 6 read of 9.
    let mut short = chunks.clone();
    if let Some(Event::End { counters, .. }) = short[2].1.last_mut() {
        counters.events = 9;
    }
    let missing = analyze(&mut cursor(&build(&short))).unwrap();
    assert_eq!(missing.events_lost, Some(1234 + 3));
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["events_lost"], 1234);
    assert_eq!(v["process"]["exit"], serde_json::json!({"signal": 6}));
    let t = render_text(&r);
    assert!(
        t.contains("==4242== WARNING: 1,234 events were lost"),
        "{t}"
    );
    assert!(t.contains("==4242== events lost: 1,234"), "{t}");
    assert!(t.contains("==4242== Exit: killed by signal 6"), "{t}");
}

#[test]
fn not_a_trace_and_newer_versions_are_errors() {
    let e = analyze(&mut cursor(b"hello world, this is not a trace")).unwrap_err();
    assert!(matches!(e, TraceError::NotATrace), "{e}");
    let mut newer = build(&[(0, vec![process()])]);
    newer[8] = 0xff;
    let e = analyze(&mut cursor(&newer)).unwrap_err();
    assert!(matches!(e, TraceError::NewerVersion { .. }), "{e}");
    let e = analyze(&mut cursor(b"TRAPLINE")).unwrap_err();
    assert!(matches!(e, TraceError::Truncated { .. }), "{e}");
}

#[test]
fn header_only_trace_is_empty_but_not_an_error() {
    let r = analyze(&mut cursor(&build(&[]))).unwrap();
    assert_eq!(r.trace.events, 0);
    assert_eq!(r.trace.chunks, 0);
    assert!(!r.trace.complete);
    assert!(r.records.is_empty());
    assert!(render_text(&r).starts_with("==?== "));
}

#[test]
fn exit_snapshot_spread_over_chunks_without_times() {
    let chunks = vec![
        (0, vec![process()]),
        (
            1,
            vec![
                malloc(10, 0x1000, 10, 1),
                malloc(20, 0x2000, 20, 1),
                malloc(30, 0x3000, 30, 1),
            ],
        ),
        (
            0,
            vec![snapshot_begin(100), live(0x1000, 10, AllocFn::Malloc, 1)],
        ),
        (
            0,
            vec![stack(1, &[0x401001]), live(0x2000, 20, AllocFn::Malloc, 1)],
        ),
        (
            0,
            vec![
                live(0x3000, 30, AllocFn::Malloc, 1),
                Event::SnapshotEnd {
                    blocks: 3,
                    bytes: 60,
                },
            ],
        ),
        (0, vec![module(), end(101, 0, 0)]),
    ];
    let r = analyze(&mut cursor(&build(&chunks))).unwrap();
    assert!(r.trace.complete);
    assert_eq!(r.summary.source, "exit_snapshot");
    assert_eq!(
        (
            r.summary.unfreed_at_exit.bytes,
            r.summary.unfreed_at_exit.blocks
        ),
        (60, 3)
    );
    assert_eq!(r.records.len(), 1);
    assert_eq!(r.records[0].stack[0].address, 0x401001);
}

#[test]
fn symbolizer_warnings_are_reported_after_symbolizing() {
    // A module whose file exists but is not the traced build, and one whose
    // file is gone: both leave their frames unnamed, and say why.
    let exe = std::env::current_exe().unwrap();
    let exe = exe.to_str().unwrap().to_string();
    let module_at = |id, path: &str, start| {
        Event::ModuleLoad(trapline_trace::ModuleInfo {
            id,
            path: path.into(),
            build_id: vec![0xde, 0xad, 0xbe, 0xef],
            bias: 0,
            segments: vec![trapline_trace::Segment {
                start,
                end: start + 0x1000,
                flags: 5,
            }],
        })
    };
    let chunks = vec![
        (
            0,
            vec![
                process(),
                module_at(1, &exe, 0x10000),
                module_at(2, "/nonexistent/libgone.so", 0x20000),
            ],
        ),
        (
            1,
            vec![
                malloc(10, 0x1000, 8, 1),
                stack(1, &[0x10010, 0x20020]),
                snapshot_begin(20),
                live(0x1000, 8, AllocFn::Malloc, 1),
                Event::SnapshotEnd {
                    blocks: 1,
                    bytes: 8,
                },
                end(21, 0, 0),
            ],
        ),
    ];
    let r = analyze(&mut cursor(&build(&chunks))).unwrap();
    assert_eq!(r.records[0].stack[0].function, None);
    assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
    assert!(
        r.warnings[0].starts_with(&format!("{exe}: ")) && r.warnings[0].contains("build id"),
        "{:?}",
        r.warnings
    );
    assert!(
        r.warnings[1].starts_with("/nonexistent/libgone.so: "),
        "{:?}",
        r.warnings
    );
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["warnings"].as_array().unwrap().len(), 2);
    // Text: warning lines at the end, before the footer.
    let t = render_text(&r);
    let last: Vec<&str> = t.lines().rev().take(3).collect();
    assert!(
        last[2].starts_with(&format!("==4242== warning: {exe}: ")),
        "{t}"
    );
    assert!(
        last[1].starts_with("==4242== warning: /nonexistent/libgone.so: "),
        "{t}"
    );
    assert_eq!(last[0], "==4242== events lost: 0", "{t}");
}

#[test]
fn library_unloaded_and_replaced_at_the_same_addresses() {
    let lib = |id, path: &str| {
        Event::ModuleLoad(trapline_trace::ModuleInfo {
            id,
            path: path.into(),
            build_id: vec![],
            bias: 0x7f00_0000_0000,
            segments: vec![trapline_trace::Segment {
                start: 0x7f00_0000_1000,
                end: 0x7f00_0000_5000,
                flags: 5,
            }],
        })
    };
    // liba is loaded, leaks a block, is unloaded; libb is loaded at the same
    // addresses and leaks one too. The module chunks have no time: their
    // order in the merge is not their load order (here libb's chunk even
    // comes first in the file), the module ids are.
    let chunks = vec![
        (0, vec![process()]),
        (0, vec![lib(3, "/nonexistent/libb.so")]),
        (
            0,
            vec![
                lib(2, "/nonexistent/liba.so"),
                Event::ModuleUnload { id: 2 },
            ],
        ),
        (
            1,
            vec![
                malloc(10, 0x1000, 8, 1),
                malloc(20, 0x2000, 16, 2),
                stack(1, &[0x7f00_0000_1234]),
                stack(2, &[0x7f00_0000_2345]),
                snapshot_begin(30),
                live(0x1000, 8, AllocFn::Malloc, 1),
                live(0x2000, 16, AllocFn::Malloc, 2),
                Event::SnapshotEnd {
                    blocks: 2,
                    bytes: 24,
                },
                end(31, 0, 0),
            ],
        ),
    ];
    let r = analyze(&mut cursor(&build(&chunks))).unwrap();
    // The unloaded library is still known (removing it would leave its
    // addresses in no module), and the one loaded last names the range.
    for rec in &r.records {
        assert_eq!(
            rec.stack[0].module.as_deref(),
            Some("/nonexistent/libb.so"),
            "{rec:?}"
        );
    }
    // The ambiguity is not silent.
    let overlap: Vec<_> = r
        .warnings
        .iter()
        .filter(|w| w.contains("was mapped where"))
        .collect();
    assert_eq!(overlap.len(), 1, "{:?}", r.warnings);
    assert!(
        overlap[0]
            .starts_with("/nonexistent/libb.so was mapped where /nonexistent/liba.so had been"),
        "{overlap:?}"
    );
}
