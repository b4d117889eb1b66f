//! The agent's clock while the program is idle: the writer stops its
//! millisecond tick, and the first event after an idle stretch still gets
//! its true time (clock.rs in the agent).

mod common;

use common::*;
use std::collections::HashMap;
use trapline_trace::{Event, TraceReader};

/// Allocation times by size.
fn alloc_times(trace: &std::path::Path) -> HashMap<u64, u64> {
    let file = std::fs::File::open(trace).expect("trace");
    let mut reader = TraceReader::new(std::io::BufReader::new(file)).expect("header");
    let mut times = HashMap::new();
    while let Some(chunk) = reader.next_chunk().expect("chunk") {
        for ev in chunk.events() {
            if let Event::Alloc { time, size, .. } = ev.expect("event") {
                times.insert(size, time);
            }
        }
    }
    times
}

/// idle_clock.c gaps: each allocation after an idle stretch of 100 to 280
/// ms is at least the measured gap later than the previous one (within the
/// tick's millisecond). With the writer asleep and no reader refreshing the
/// clock, the event took the tick published at the writer's last wake, up
/// to 200 ms old.
#[test]
fn an_event_after_an_idle_stretch_gets_its_true_time() {
    let dir = TestDir::new("idle_clock_gaps");
    let prog = compile_c(&dir, "idle_clock.c");
    let run = run(&dir, &[], &prog, &["gaps"]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let gaps: Vec<u64> = run
        .stdout
        .lines()
        .map(|l| l.split_once(": ").expect("gap line").1.parse().expect("ns"))
        .collect();
    assert_eq!(gaps.len(), 4, "{}", run.stdout);
    let times = alloc_times(&dir.trace());
    for (i, gap) in gaps.iter().enumerate() {
        let (before, after) = (1001 + i as u64, 1002 + i as u64);
        let recorded = times[&after] - times[&before];
        assert!(
            recorded + 2_000_000 >= *gap,
            "malloc({after}) recorded {recorded} ns after malloc({before}); the program measured at least {gap} ns"
        );
    }
}

/// idle_clock.c wakes: while the program sleeps for 500 ms the writer
/// wakes for its 200 ms sweep, not every millisecond (it did: about 500
/// times, 2.4% of a core for an idle program).
#[test]
fn the_writer_sleeps_while_the_program_is_idle() {
    let dir = TestDir::new("idle_clock_wakes");
    let prog = compile_c(&dir, "idle_clock.c");
    let run = run(&dir, &[], &prog, &["wakes"]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let wakes: u64 = run
        .stdout
        .trim()
        .strip_prefix("writer wakes: ")
        .expect("wakes line")
        .parse()
        .expect("count");
    assert!(wakes <= 20, "the writer woke {wakes} times in 500 ms");
}
