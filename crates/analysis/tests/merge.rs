//! The time-ordered merge over chunks.

mod common;

use common::*;
use trapline_analysis::index::{MergedEvents, TraceIndex};
use trapline_trace::{AllocFn, Event};

#[test]
fn merge_is_time_ordered_and_keeps_few_chunks_open() {
    let threads = 4u32;
    let per_thread = 50u64;
    let mut chunks = vec![(0u32, vec![process()])];
    // Each thread's chunks in order, but the threads one after the other in
    // the file: the worst file order for a sequential reader.
    for t in 1..=threads {
        for j in 0..per_thread {
            let events = (0..10u64)
                .map(|k| {
                    let time = j * 1000 + k * 90 + u64::from(t);
                    malloc(time, (u64::from(t) << 32) + j * 16 + k, 1, 0)
                })
                .collect();
            chunks.push((t, events));
        }
    }
    chunks.push((1, vec![stack(1, &[0x1])]));
    let bytes = build(&chunks);
    let mut input = cursor(&bytes);
    let index = TraceIndex::build(&mut input).unwrap();
    assert_eq!(index.chunks.len(), chunks.len());
    assert_eq!(index.threads(), 4);
    let mut merged = MergedEvents::new(&mut input, &index);
    let events: Vec<_> = merged.by_ref().collect();
    assert_eq!(events.len(), 1 + 4 * 50 * 10 + 1);
    assert!(events.windows(2).all(|w| w[0].time <= w[1].time));
    assert!(
        merged.most_open() <= threads as usize + 2,
        "{}",
        merged.most_open()
    );
    let status = merged.read_status();
    assert!(status.stopped.is_none() && status.damaged.is_empty());
    // Thread 1 starts first, thread 2 one nanosecond later.
    let allocs: Vec<_> = events
        .iter()
        .filter_map(|m| match m.event {
            Event::Alloc { time, .. } => Some((time, m.tid)),
            _ => None,
        })
        .collect();
    assert_eq!(allocs[0], (1, 1));
    assert_eq!(allocs[1], (2, 2));
}

/// (time, thread) of every event of the merge.
fn times_and_threads(chunks: &[(u32, Vec<Event>)]) -> Vec<(u64, u32)> {
    let bytes = build(chunks);
    let mut input = cursor(&bytes);
    let index = TraceIndex::build(&mut input).unwrap();
    let merged = MergedEvents::new(&mut input, &index);
    merged.map(|m| (m.time, m.tid)).collect()
}

#[test]
fn untimed_events_keep_their_place_in_their_chunk() {
    let chunks = vec![
        (
            1,
            vec![
                malloc(100, 0x10, 1, 1),
                stack(1, &[0x1]),
                malloc(300, 0x20, 1, 1),
            ],
        ),
        (2, vec![malloc(200, 0x30, 1, 0)]),
    ];
    let got = times_and_threads(&chunks);
    assert_eq!(got, vec![(100, 1), (100, 1), (200, 2), (300, 1)]);
}

#[test]
fn chunk_without_times_continues_its_thread() {
    let chunks = vec![
        (0, vec![process()]),
        (1, vec![malloc(10, 0x10, 1, 0)]),
        (
            0,
            vec![
                snapshot_begin(500),
                live(0x10, 1, trapline_trace::AllocFn::Malloc, 0),
            ],
        ),
        (1, vec![malloc(600, 0x20, 1, 0)]),
        (0, vec![live(0x20, 1, trapline_trace::AllocFn::Malloc, 0)]),
        (
            0,
            vec![
                Event::SnapshotEnd {
                    blocks: 2,
                    bytes: 2,
                },
                end(700, 0, 0),
            ],
        ),
    ];
    let got = times_and_threads(&chunks);
    assert_eq!(
        got,
        vec![
            (0, 0),
            (10, 1),
            (500, 0),
            (500, 0),
            (500, 0),
            (600, 1),
            (700, 0),
            (700, 0)
        ]
    );
}

/// A large exit snapshot spans many chunks without a timed event, which all
/// start at the snapshot's time: they are decoded one after the other, in
/// file order, not all at once (10 million live blocks would otherwise take
/// gigabytes of decoded events).
#[test]
fn snapshot_chunks_starting_together_are_opened_one_at_a_time() {
    let mut chunks = vec![
        (0u32, vec![process()]),
        (1, vec![malloc(10, 0x1000, 1, 0)]),
        (
            0,
            vec![snapshot_begin(100), live(0x1000, 1, AllocFn::Malloc, 0)],
        ),
    ];
    for c in 0..50u64 {
        let blocks = (0..20u64)
            .map(|k| live(0x10_0000 + (c * 20 + k) * 16, 1, AllocFn::Malloc, 0))
            .collect();
        chunks.push((0, blocks));
    }
    chunks.push((
        0,
        vec![
            Event::SnapshotEnd {
                blocks: 1001,
                bytes: 1001,
            },
            end(101, 0, 0),
        ],
    ));
    let bytes = build(&chunks);
    let mut input = cursor(&bytes);
    let index = TraceIndex::build(&mut input).unwrap();
    let mut merged = MergedEvents::new(&mut input, &index);
    let addrs: Vec<u64> = merged
        .by_ref()
        .filter_map(|m| match m.event {
            Event::LiveBlock { addr, .. } => Some(addr),
            _ => None,
        })
        .collect();
    // File order kept.
    assert_eq!(addrs.len(), 1001);
    assert!(addrs[1..].windows(2).all(|w| w[0] < w[1]));
    assert!(merged.most_open() <= 2, "{}", merged.most_open());
}
