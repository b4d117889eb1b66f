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

/// main_pthread_exit.c: the main thread leaves through pthread_exit and the
/// process ends when its last thread does. Under the agent it never ended
/// (the writer thread kept it alive); when a thread called exit instead,
/// the exit scan waited 2 s for main's zombie and warned that a thread was
/// not suspended, and it read no roots at all (every block "lost").
#[test]
fn a_process_whose_main_thread_called_pthread_exit_ends_with_its_last_thread() {
    let dir = TestDir::new("main_pthread_exit");
    let prog = compile_c(&dir, "main_pthread_exit.c");
    for (args, code, keeper) in [
        (&[][..], 0, "last"),
        (&["exit"][..], 7, "last"),
        (&["alone"][..], 0, "alone"),
    ] {
        let run = run(&dir, &[], &prog, args);
        assert_eq!(run.code(), code, "{args:?}\n{}", run.describe());
        assert_eq!(run.stdout, "atexit ran\n", "{args:?}\n{}", run.describe());
        let report = leaks(&dir.trace());
        assert_eq!(
            report["process"]["exit"],
            serde_json::json!({ "code": code })
        );
        assert_eq!(report["events_lost"], 0, "{report:#}");
        assert_eq!(report["warnings"], serde_json::json!([]), "{report:#}");
        let scan = &report["scan"];
        assert_eq!(scan["threads_not_suspended"], 0, "{args:?}: {scan:#}");
        let records = report["records"].as_array().expect("records");
        let kept: Vec<_> = records
            .iter()
            .filter(|r| r["bytes"] == 1111)
            .map(|r| (r["kind"].as_str(), r["stack"][0]["function"].as_str()))
            .collect();
        assert_eq!(
            kept,
            [(Some("still_reachable"), Some(keeper))],
            "{args:?}: {report:#}"
        );
        assert!(
            records.iter().all(|r| r["bytes"] != 2222),
            "{args:?}: the atexit handler freed its block: {report:#}"
        );
        // Key destructors run when a thread ends, not when one calls exit.
        let key_blocks: Vec<_> = records
            .iter()
            .filter(|r| r["bytes"] == 333)
            .map(|r| r["stack"][0]["function"].as_str())
            .collect();
        let expected: &[Option<&str>] = if code == 7 { &[Some("last")] } else { &[] };
        assert_eq!(key_blocks, expected, "{args:?}: {report:#}");
    }
}

/// thread_churn.c: 300 threads, one at a time, each taking over the
/// unwinding state an ended thread left (and its stack memory): every lost
/// block's stack names its own function and call line, no more and no less.
#[test]
fn threads_started_one_after_another_record_their_own_stacks() {
    let dir = TestDir::new("thread_churn");
    let prog = compile_c(&dir, "thread_churn.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_no_events_lost_in_summary(&run);
    let report = leaks(&dir.trace());
    assert_complete(&report);
    let source = "thread_churn.c";
    let line = |marker| marker_line(source, marker);
    for (function, size, leak, call) in [
        ("leak_even", 16, "LEAK-EVEN", "CALL-EVEN"),
        ("leak_odd", 32, "LEAK-ODD", "CALL-ODD"),
    ] {
        let record = record_with_function(&report, function);
        assert_eq!(
            (as_u64(record, "bytes"), as_u64(record, "blocks")),
            (150 * size, 150)
        );
        assert_stack_top(
            stack_of(record, "stack"),
            &[
                (function, source, line(leak)),
                ("worker", source, line(call)),
            ],
            function,
        );
    }
    assert_eq!(records(&report).len(), 2, "{}", pretty(&report));
    let threads = read_lifecycle(&dir.trace());
    assert_eq!(threads.starts.len(), 300);
    assert_eq!(threads.ends.values().filter(|&&n| n == 1).count(), 300);
}

/// exit_on_altstack.c: threads end with pthread_exit inside a handler on
/// the alternate signal stack, which under trapline is the agent's side
/// stack (pthread_exit unwinds back to the thread's own stack before the
/// key destructors run); the side stack then goes to the next thread, as
/// its alternate stack too. Every handler's block is recorded with its
/// stack, and the program ends normally.
#[test]
fn a_thread_may_end_on_its_alternate_signal_stack() {
    let dir = TestDir::new("exit_on_altstack");
    let prog = compile_c(&dir, "exit_on_altstack.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout.trim(), "done 20");
    assert_no_events_lost_in_summary(&run);
    let report = leaks(&dir.trace());
    assert_complete(&report);
    let leaked = record_with_function(&report, "on_usr1");
    assert_eq!(
        (as_u64(leaked, "bytes"), as_u64(leaked, "blocks")),
        (20 * 77, 20)
    );
    assert_stack_top(
        stack_of(leaked, "stack"),
        &[(
            "on_usr1",
            "exit_on_altstack.c",
            marker_line("exit_on_altstack.c", "LEAK-IN-HANDLER"),
        )],
        "on_usr1",
    );
}
