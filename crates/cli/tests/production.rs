//! `trapline run --production`: only the sampled blocks are recorded, with
//! their releases; every call is counted by function, exactly; estimates by
//! stack cover what leaked; a double free of a sampled block is caught.
//! The sampler is seeded (`TRAPLINE_SAMPLE_SEED`), so each run samples the
//! same blocks.

mod common;

use common::*;
use serde_json::Value;

const SOURCE: &str = "sampled_leaks.c";

fn production_run(name: &str, flags: &[&str], args: &[&str]) -> (TestDir, Value) {
    let (dir, _) = production_run_finished(name, flags, args);
    let report = leaks(&dir.trace());
    (dir, report)
}

/// The run, and how `trapline run` ended.
fn production_run_finished(name: &str, flags: &[&str], args: &[&str]) -> (TestDir, Finished) {
    let dir = TestDir::new(name);
    let prog = compile_c(&dir, SOURCE);
    let mut cmd = run_command(&dir, flags, &prog, args);
    cmd.env("TRAPLINE_SAMPLE_SEED", "20261207");
    let run = run_of(cmd);
    assert_eq!(run.code(), 0, "{}", run.describe());
    (dir, run)
}

/// The run, and what the program printed.
fn production_run_printing(name: &str, flags: &[&str], args: &[&str]) -> (TestDir, String) {
    let (dir, run) = production_run_finished(name, flags, args);
    (dir, run.stdout)
}

/// A single-threaded program stays single-threaded: production mode's
/// writer waits for a second thread of the program's (a thread of the
/// agent's would end glibc's single-thread fast paths); the trace is
/// whole all the same.
#[test]
fn production_mode_adds_no_thread_to_a_single_threaded_program() {
    let (dir, stdout) =
        production_run_printing("production_tasks", &["--production"], &["tasks", "1000"]);
    assert_eq!(stdout, "tasks=1\n");
    let (full, stdout) = production_run_printing("production_tasks_full", &[], &["tasks", "1000"]);
    assert_ne!(stdout, "tasks=1\n", "a full recording's writer runs");
    assert_eq!(calls_of(&dir.trace()), calls_of(&full.trace()));
    assert_complete(&leaks(&dir.trace()));
}

/// Every allocator function's calls and bytes, as `stats` lists them.
fn calls_of(trace: &std::path::Path) -> Vec<Value> {
    as_array(&stats(trace), "calls").clone()
}

/// Production mode counts each function's calls and bytes as a full
/// recording does, though it records only a few of them.
#[test]
fn production_counts_every_call_as_full_recording_does() {
    let (full, _) = production_run("production_counts_full", &[], &["no"]);
    let (prod, run) = production_run_finished("production_counts", &["--production"], &["no"]);
    let report = leaks(&prod.trace());
    let full_calls = calls_of(&full.trace());
    assert_eq!(calls_of(&prod.trace()), full_calls);
    // The run's summary counts every call too.
    let s = stats(&full.trace());
    let line = format!(
        "==trapline== allocation calls: {} ({} releases)",
        thousands(as_u64(&s, "allocation_calls")),
        thousands(as_u64(&s, "release_calls"))
    );
    assert!(run.stderr.contains(&line), "{line}\n{}", run.describe());
    let malloc = full_calls
        .iter()
        .find(|c| as_str(c, "function") == "malloc")
        .expect("malloc is called");
    // 25,000 requests, 100,000 blocks of churn and one more.
    assert!(as_u64(malloc, "calls") >= 125_001, "{}", pretty(malloc));
    let production = &report["sampling"]["production"];
    let sampled = as_u64(production, "sampled_allocations");
    // About 25.2 MB allocated at one sample per 512 KiB on average.
    assert!((10..=200).contains(&sampled), "{}", pretty(production));
    assert_eq!(stats(&full.trace())["production_mode"], false);
    let prod_stats = stats(&prod.trace());
    assert_eq!(prod_stats["production_mode"], true);
    let recorded = as_u64(&prod_stats, "events");
    assert!(
        recorded < 2_000,
        "{recorded} events recorded for 250,000 calls"
    );
}

/// The leaks of a production run: one record per sampled stack, whose
/// estimate covers what its path leaked within 15%; the churn's blocks,
/// released at the address the last one had, are all seen released; no
/// release is taken for a double free.
#[test]
fn production_estimates_each_leaking_stack() {
    let (dir, report) = production_run(
        "production_leaks",
        &["--production", "--sample=64K"],
        &["no"],
    );
    let production = &report["sampling"]["production"];
    assert_eq!(as_u64(&report["sampling"], "mean_bytes"), 65536);
    assert!(
        as_u64(production, "allocation_calls") >= 125_002,
        "{}",
        pretty(production)
    );
    assert!(errors(&report).is_empty(), "{}", pretty(&report));
    let node = ("make_node", SOURCE, marker_line(SOURCE, "NODE"));
    let recs = records(&report);
    for r in recs {
        let stack = stack_of(r, "stack");
        assert!(
            !stack.iter().any(|f| frame_function(f) == "churn"),
            "a released block is listed: {}",
            pretty(r)
        );
    }
    for (function, marker, truth) in [
        ("parse_request", "PARSE", 20_000_000u64),
        ("load_config", "LOAD", 1_000_000),
    ] {
        let r = record_with_function(&report, function);
        assert_stack_top(
            stack_of(r, "stack"),
            &[node, (function, SOURCE, marker_line(SOURCE, marker))],
            function,
        );
        let e = &r["estimate"];
        let (estimate, error) = (as_u64(e, "bytes"), as_u64(e, "bytes_error"));
        assert!(
            estimate.abs_diff(truth) * 2 <= error * 5,
            "{function}: estimated {estimate} ± {error}, leaked {truth}"
        );
        if function == "parse_request" {
            assert!(
                estimate.abs_diff(truth) * 100 <= truth * 15,
                "{function}: estimated {estimate}, leaked {truth}"
            );
        }
    }
    let text = leaks_text(&dir.trace(), &[]);
    assert!(
        text.contains("PRODUCTION MODE: about 1 block in "),
        "{text}"
    );
    assert!(
        text.contains("one per 65,536 bytes allocated on average"),
        "{text}"
    );
}

/// A sampled block released twice: the second release is reported with
/// both stacks and not passed on (the C library would abort).
#[test]
fn production_catches_a_double_free_of_a_sampled_block() {
    let (_dir, report) = production_run(
        "production_double_free",
        &["--production", "--sample=64K"],
        &["double-free-large", "100"],
    );
    let doubles: Vec<&Value> = errors(&report)
        .iter()
        .filter(|e| as_str(e, "kind") == "double_free")
        .collect();
    assert_eq!(doubles.len(), 1, "{}", pretty(&report));
    assert_stack_top(
        stack_of(doubles[0], "stack"),
        &[("main", SOURCE, marker_line(SOURCE, "LARGE-DOUBLE-FREE"))],
        "the double free",
    );
    assert_stack_top(
        stack_of(doubles[0], "alloc_stack"),
        &[("main", SOURCE, marker_line(SOURCE, "LARGE-ALLOC"))],
        "the double-freed block's allocation",
    );
}

/// atfork_early_lib.c allocates from its constructor, before the agent's
/// reads its options: that block is recorded as a full recording records
/// it, without a stack. Its release (in the library's fork handler) is
/// recorded too, so it is not left listed as unfreed; it was, since the
/// release of a block production mode had not sampled went unseen.
#[test]
fn a_block_allocated_before_the_agent_started_and_freed_is_not_listed() {
    let dir = TestDir::new("production_early_block");
    let lib = compile_c_library(&dir, "atfork_early_lib.c", "libatfork_early_lib.so");
    let prog = compile_c_linked_to(&dir, "atfork_early.c", &lib);
    let run = run(&dir, &["--production"], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "cc\nprepared 2 times\n");
    let report = leaks(&dir.trace());
    assert_complete(&report);
    let stackless: Vec<&Value> = records(&report)
        .iter()
        .filter(|r| r["stack_id"] == 0)
        .collect();
    assert!(stackless.is_empty(), "{}", pretty(&report));
}
