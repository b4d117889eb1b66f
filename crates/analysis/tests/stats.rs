//! `stats` on synthesized traces.

mod common;

use common::*;
use trapline_analysis::stats::{analyze, render_text};
use trapline_trace::{AllocFn, ErrorKind, Event};

fn trace() -> Vec<(u32, Vec<Event>)> {
    vec![
        (0, vec![process(), module()]),
        // Flushed first, happens between thread 1's events.
        (
            2,
            vec![
                malloc(50, 0x2000, 100, 1),
                free(80, 0x2000, 0),
                malloc(90, 0x2100, 1, 1),
                error(95, ErrorKind::DoubleFree, AllocFn::Free, 0x2000, 0),
            ],
        ),
        (
            1,
            vec![
                malloc(10, 0x1000, 1000, 1),
                alloc_with(20, 0x1100, 500, AllocFn::Calloc, 2),
                free(60, 0x1000, 0),
                realloc(70, 0x1100, 0x1200, 2000, 3),
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
        (
            0,
            vec![
                snapshot_begin(150),
                live(0x1200, 2000, AllocFn::Realloc, 3),
                live(0x2100, 1, AllocFn::Malloc, 1),
                Event::SnapshotEnd {
                    blocks: 2,
                    bytes: 2001,
                },
                end(200, 0, 0),
            ],
        ),
    ]
}

#[test]
fn counts_calls_bytes_and_peak_in_time_order() {
    let bytes = build(&trace());
    let r = analyze(&mut cursor(&bytes)).unwrap();
    let calls: Vec<_> = r
        .calls
        .iter()
        .map(|c| (c.function, c.calls, c.bytes))
        .collect();
    assert_eq!(
        calls,
        vec![
            ("malloc", 3, 1101),
            ("calloc", 1, 500),
            ("realloc", 1, 2000),
            ("free", 3, 0)
        ]
    );
    assert_eq!(r.allocation_calls, 5);
    assert_eq!(r.release_calls, 3);
    assert_eq!(r.bytes_allocated, 3601);
    assert_eq!(r.errors, 1);
    // In file order the peak would be 2,001 bytes; in time order it is 2,100
    // (the realloc at 70 ns while thread 2's block is still live).
    assert_eq!(r.peak_heap.bytes, 2100);
    assert_eq!(r.peak_heap.blocks, 2);
    assert_eq!(r.peak_heap.time_ns, 70);
    assert!((r.peak_heap.time_seconds - 70e-9).abs() < 1e-15);
    assert_eq!((r.live_at_end.bytes, r.live_at_end.blocks), (2001, 2));
    assert_eq!(r.duration_ns, 200);
    assert!((r.allocations_per_second.unwrap() - 2.5e7).abs() < 1e-3);
    assert_eq!(r.threads, 2);
    assert_eq!(r.stacks, 3);
    assert_eq!(r.events, 18);
    assert_eq!(r.trace_bytes, bytes.len() as u64);
    let per_event = r.trace_bytes_per_event.unwrap();
    assert!((per_event - bytes.len() as f64 / 18.0).abs() < 1e-9);
    assert_eq!(r.events_lost, Some(0));
    assert!(r.trace.complete);
    assert!(r.trace.has_exit_snapshot);
}

#[test]
fn json_and_text() {
    let r = analyze(&mut cursor(&build(&trace()))).unwrap();
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(
        v["calls"][0],
        serde_json::json!({"function": "malloc", "calls": 3, "bytes": 1101, "failed": 0})
    );
    assert_eq!(v["peak_heap"]["bytes"], 2100);
    assert_eq!(v["peak_heap"]["time_ns"], 70);
    assert_eq!(v["events_lost"], 0);
    assert_eq!(v["threads"], 2);
    assert_eq!(v["failed_allocations"], 0);
    assert_eq!(v["trace"]["stopped"], serde_json::Value::Null);
    let t = render_text(&r);
    for needle in [
        "==4242== Command: /nonexistent/prog --flag",
        "peak heap: 2,100 bytes in 2 blocks at 0.000000 s",
        "allocation calls: 5, release calls: 3, 3,601 bytes allocated",
        "allocations per second: 25,000,000.0",
        "==4242== events lost: 0",
    ] {
        assert!(t.contains(needle), "missing {needle:?} in:\n{t}");
    }
}

#[test]
fn trace_without_end_uses_last_time_and_says_so() {
    let mut chunks = trace();
    chunks.pop();
    let r = analyze(&mut cursor(&build(&chunks))).unwrap();
    assert!(!r.trace.complete);
    assert!(!r.trace.has_end);
    assert_eq!(r.duration_ns, 95);
    assert_eq!(r.events_lost, None);
    assert_eq!(r.peak_heap.bytes, 2100);
    let t = render_text(&r);
    assert!(t.contains("events lost: unknown"), "{t}");
    assert!(t.contains("WARNING: the process did not finish"), "{t}");
}

/// A fork child: its exit snapshot holds a block inherited from the parent,
/// which no event of its own trace allocated, so the replay misses it.
#[test]
fn unfreed_at_exit_comes_from_the_exit_snapshot() {
    let chunks = vec![
        (0, vec![process(), module()]),
        (
            1,
            vec![
                malloc(10, 0x1000, 100, 1),
                malloc(20, 0x2000, 5, 1),
                free(30, 0x2000, 0),
                stack(1, &[0x401001]),
            ],
        ),
        (
            0,
            vec![
                snapshot_begin(40),
                live(0x1000, 100, AllocFn::Malloc, 1),
                live(0x9000, 4000, AllocFn::Malloc, 0),
                Event::SnapshotEnd {
                    blocks: 2,
                    bytes: 4100,
                },
                end(50, 0, 0),
            ],
        ),
    ];
    let r = analyze(&mut cursor(&build(&chunks))).unwrap();
    assert_eq!((r.live_at_end.bytes, r.live_at_end.blocks), (100, 1));
    let u = r.unfreed_at_exit.unwrap();
    assert_eq!((u.bytes, u.blocks), (4100, 2));
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(
        v["unfreed_at_exit"],
        serde_json::json!({"bytes": 4100, "blocks": 2})
    );
    let t = render_text(&r);
    assert!(
        t.contains("unfreed at exit: 4,100 bytes in 2 blocks (exit snapshot)"),
        "{t}"
    );

    // Without the snapshot (killed), there is nothing but the replay.
    let mut killed = chunks;
    killed.pop();
    let r = analyze(&mut cursor(&build(&killed))).unwrap();
    assert_eq!(r.unfreed_at_exit, None);
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["unfreed_at_exit"], serde_json::Value::Null);
}
