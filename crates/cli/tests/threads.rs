//! Thread lifecycle events: every thread's creator, its start and its end,
//! however it ends (return, pthread_exit, cancellation).

mod common;

use common::*;
use std::collections::HashMap;
use trapline_trace::{Event, TraceReader};

#[derive(Debug, Default)]
struct Recorded {
    /// create_id -> (creating tid, time, stack)
    creates: HashMap<u64, (u32, u64, u32)>,
    /// tid -> (parent tid, create_id, time)
    starts: HashMap<u32, (u32, u64, u64)>,
    /// tid -> number of ThreadEnd events
    ends: HashMap<u32, u32>,
    /// stack id -> frames
    stacks: HashMap<u32, Vec<u64>>,
}

fn read_lifecycle(trace: &std::path::Path) -> Recorded {
    let file = std::fs::File::open(trace).expect("trace");
    let mut reader = TraceReader::new(std::io::BufReader::new(file)).expect("header");
    let mut rec = Recorded::default();
    while let Some(chunk) = reader.next_chunk().expect("chunk") {
        let tid = chunk.header.tid;
        for ev in chunk.events() {
            match ev.expect("event") {
                Event::ThreadCreate {
                    time,
                    create_id,
                    stack,
                } => {
                    assert!(rec.creates.insert(create_id, (tid, time, stack)).is_none());
                }
                Event::ThreadStart {
                    time,
                    parent_tid,
                    create_id,
                } => {
                    assert!(rec
                        .starts
                        .insert(tid, (parent_tid, create_id, time))
                        .is_none());
                }
                Event::ThreadEnd { .. } => *rec.ends.entry(tid).or_default() += 1,
                Event::StackDef { id, frames } => {
                    rec.stacks.insert(id, frames);
                }
                _ => {}
            }
        }
    }
    rec
}

/// thread_lifecycle.c: main -> returner -> grandchild, main -> exiter,
/// main -> cancelled. Parents, create/start pairing and order, one end each.
#[test]
fn every_thread_has_its_creator_start_and_end() {
    let dir = TestDir::new("thread_lifecycle");
    let prog = compile_c(&dir, "thread_lifecycle.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let tid: HashMap<&str, u32> = run
        .stdout
        .lines()
        .map(|l| {
            let (name, tid) = l.split_once(' ').expect("name tid");
            (name, tid.parse().expect("tid"))
        })
        .collect();
    assert_eq!(tid.len(), 5, "{}", run.stdout);

    let rec = read_lifecycle(&dir.trace());
    let expected_parent = [
        ("returner", "main"),
        ("grandchild", "returner"),
        ("exiter", "main"),
        ("cancelled", "main"),
    ];
    assert_eq!(rec.starts.len(), 4, "{rec:?}");
    assert_eq!(rec.creates.len(), 4, "{rec:?}");
    for (child, parent) in expected_parent {
        let (recorded_parent, create_id, start_time) = rec.starts[&tid[child]];
        assert_eq!(recorded_parent, tid[parent], "parent of {child}");
        let (creator, create_time, stack) = rec.creates[&create_id];
        assert_eq!(creator, tid[parent], "creator of {child}");
        assert!(
            create_time < start_time,
            "{child}: created before it starts"
        );
        let frames = &rec.stacks[&stack];
        assert!(frames.len() >= 2, "{child}: create stack {frames:x?}");
        assert_eq!(rec.ends.get(&tid[child]), Some(&1), "{child} ends once");
    }
    assert_eq!(rec.ends.get(&tid["main"]), None, "main has no ThreadEnd");
}
