//! End-to-end: the analyses on a 10 GB trace, inside a memory cgroup whose
//! limit is a small fraction of the trace. The trace is a synthetic
//! service's (`trapline_trace::synthetic`), written through the real
//! encoder; what it holds at once is bounded (4,096 live blocks, 4,102
//! stacks, three locks), so an analysis whose memory grew with the trace's
//! length (a few bits per event would do) is killed by the group's OOM
//! killer, and the test fails. `report` runs the same passes (bench/results.jsonl
//! has its peak on this trace); it is left out here for time, as each
//! analysis takes minutes at this size. `TRAPLINE_SCALE_BYTES` sets another
//! size (docs/analyses.md, "Memory of an analysis").

mod common;

use common::*;
use serde_json::Value;
use std::process::Command;
use trapline_trace::synthetic::{self, Service, Written};

/// The trace's size.
const BYTES: u64 = 10_000_000_000;
/// The group's limit: what the analyses hold, plus room for the page
/// cache's churn. Measured peaks on the 10 GB trace are in
/// bench/results.jsonl ("synthetic-10g").
const LIMIT: u64 = 96 << 20;

fn size() -> u64 {
    std::env::var("TRAPLINE_SCALE_BYTES")
        .ok()
        .map(|v| v.parse().expect("TRAPLINE_SCALE_BYTES: a number of bytes"))
        .unwrap_or(BYTES)
}

/// `trapline ARGS...` inside the group, which must succeed.
fn inside(group: &MemoryGroup, args: &[&str], what: &str) -> Finished {
    let mut cmd = Command::new(trapline());
    cmd.args(args);
    let finished = output_of(group.run_inside(&cmd), what);
    assert_eq!(
        finished.status.code(),
        Some(0),
        "{what} on the synthetic trace failed inside a {} MiB cgroup (killed by its OOM \
         killer if signal 9)\n{}",
        LIMIT >> 20,
        finished.describe()
    );
    finished
}

fn json(finished: &Finished, what: &str) -> Value {
    serde_json::from_str(&finished.stdout)
        .unwrap_or_else(|e| panic!("{what} did not print JSON ({e})\n{}", finished.describe()))
}

fn u64_at(value: &Value, path: &[&str]) -> u64 {
    let mut v = value;
    for key in path {
        v = field(v, key);
    }
    v.as_u64()
        .unwrap_or_else(|| panic!("{path:?} is not a number: {v}"))
}

#[test]
fn every_analysis_reads_a_10_gb_trace_in_bounded_memory() {
    let Some(group) = MemoryGroup::new("trapline-scale", LIMIT) else {
        return;
    };
    let dir = TestDir::new("scale");
    let bytes = size();
    let room = nix::sys::statvfs::statvfs(dir.path()).expect("statvfs of the test directory");
    let free = room.blocks_available() * room.fragment_size();
    assert!(
        free > bytes + (1 << 30),
        "{} has {free} bytes free; the synthetic trace needs {bytes} and 1 GiB more (set \
         TRAPLINE_SCALE_BYTES for a smaller one)",
        dir.path().display()
    );
    let trace = dir.trace();
    let service = Service {
        threads: 4,
        live_per_thread: 1024,
        bytes,
    };
    let file = std::fs::File::create(&trace).expect("create the trace");
    let written: Written = synthetic::write(&service, file).expect("write the synthetic trace");
    let path = trace.to_str().expect("a UTF-8 path");
    eprintln!("synthetic trace: {bytes} bytes, {} events", written.events);

    let stats = json(
        &inside(&group, &["stats", path, "--format", "json"], "stats"),
        "stats",
    );
    assert_eq!(u64_at(&stats, &["events"]), written.events);
    assert_eq!(u64_at(&stats, &["allocation_calls"]), written.allocations);
    assert_eq!(u64_at(&stats, &["release_calls"]), written.frees);
    assert_eq!(
        u64_at(&stats, &["bytes_allocated"]),
        written.allocated_bytes
    );
    assert_eq!(
        u64_at(&stats, &["live_at_end", "blocks"]),
        written.live_blocks
    );
    assert_eq!(
        u64_at(&stats, &["live_at_end", "bytes"]),
        written.live_bytes
    );
    assert_eq!(u64_at(&stats, &["stacks"]), u64::from(synthetic::SITES) + 6);
    assert_eq!(u64_at(&stats, &["duration_ns"]), written.end_time);

    let leaks = json(
        &inside(&group, &["leaks", path, "--format", "json"], "leaks"),
        "leaks",
    );
    let summary = field(&leaks, "summary");
    assert_eq!(
        u64_at(summary, &["unfreed_at_exit", "blocks"]),
        written.live_blocks
    );
    assert_eq!(
        u64_at(summary, &["unfreed_at_exit", "bytes"]),
        written.live_bytes
    );
    assert_eq!(
        u64_at(summary, &["total_heap_usage", "allocs"]),
        written.allocations
    );
    assert_eq!(
        u64_at(summary, &["total_heap_usage", "frees"]),
        written.frees
    );
    assert_eq!(u64_at(summary, &["loss_records"]), written.live_stacks);

    let locks = json(
        &inside(&group, &["locks", path, "--format", "json"], "locks"),
        "locks",
    );
    let shared = field(&locks, "locks")
        .as_array()
        .and_then(|l| l.first())
        .expect("a lock");
    assert_eq!(
        field(shared, "address"),
        &format!("{:#x}", synthetic::SHARED_LOCK)
    );
    assert_eq!(u64_at(shared, &["acquisitions"]), written.acquisitions);
    assert_eq!(u64_at(shared, &["contended"]), written.contended);
    assert_eq!(u64_at(shared, &["wait_ns", "total"]), written.wait_ns);
    assert_eq!(u64_at(&locks, &["totals", "locks"]), 3);

    let deadlocks = json(
        &inside(
            &group,
            &["deadlocks", path, "--format", "json"],
            "deadlocks",
        ),
        "deadlocks",
    );
    assert_eq!(
        u64_at(&deadlocks, &["summary", "potential_deadlocks"]),
        1,
        "{}",
        pretty(&deadlocks)
    );
    let cycle = &field(&deadlocks, "cycles")[0];
    let expected: Vec<String> = synthetic::ORDER_LOCKS
        .iter()
        .map(|l| format!("{l:#x}"))
        .collect();
    assert_eq!(field(cycle, "locks"), &serde_json::json!(expected));
}
