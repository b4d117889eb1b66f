//! `trapline run --production`: only the sampled blocks are recorded, with
//! their releases; every call is counted by function, exactly; estimates by
//! stack cover what leaked; a double free of a sampled block is caught;
//! the scan at exit and on request calls lost exactly the sampled blocks
//! nothing points to. The sampler is seeded (`TRAPLINE_SAMPLE_SEED`), so
//! each run samples the same blocks.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

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

const REACH: &str = "production_reach.c";
const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
const BIG: u64 = 4 << 20;

/// A seeded production run of production_reach.c (`args`), jemalloc
/// preloaded or not, started: `trapline run` with its pipes.
fn reach_command(dir: &TestDir, flags: &[&str], args: &[&str], preload: bool) -> Command {
    let prog = compile_c(dir, REACH);
    let mut cmd = run_command(dir, flags, &prog, args);
    cmd.env("TRAPLINE_SAMPLE_SEED", "20261207");
    if preload {
        assert!(Path::new(JEMALLOC).is_file(), "{JEMALLOC} is missing");
        cmd.env("LD_PRELOAD", JEMALLOC);
    }
    cmd
}

/// A scan's records as (kind, blocks, bytes, innermost function, its
/// line), sorted.
fn verdicts_of(report: &Value) -> Vec<(String, u64, u64, String, u64)> {
    let mut got: Vec<_> = records(report)
        .iter()
        .map(|r| {
            let top = &stack_of(r, "stack")[0];
            (
                as_str(r, "kind").to_owned(),
                as_u64(r, "blocks"),
                as_u64(r, "bytes"),
                frame_function(top).to_owned(),
                top.get("line").and_then(Value::as_u64).unwrap_or(0),
            )
        })
        .collect();
    got.sort();
    got
}

/// What production_reach.c's scan must find: every big block sampled and
/// judged, none of the small ones sampled.
fn expected_verdicts() -> Vec<(String, u64, u64, String, u64)> {
    let one = |kind: &str, bytes, function: &str, marker| {
        let line = marker_line(REACH, marker);
        (kind.to_owned(), 1, bytes, function.to_owned(), line)
    };
    let mut want = vec![
        (
            "definitely_lost".to_owned(),
            3,
            3 * BIG,
            "lose_big".to_owned(),
            marker_line(REACH, "LOST"),
        ),
        // The head, with its tail lost through it.
        one("definitely_lost", 2 * BIG, "lose_chain", "HEAD"),
        one("indirectly_lost", BIG, "tail", "TAIL"),
        one("still_reachable", BIG, "keep_big", "KEPT"),
        one("still_reachable", BIG, "keep_big", "KEPT"),
        // Only a block the agent did not sample points to it: a scan of
        // the sampled blocks alone would call it lost.
        one("still_reachable", BIG, "hold_big", "HELD"),
        // Pointers into it only.
        one("still_reachable", BIG, "keep_inside", "INSIDE"),
        one("still_reachable", BIG, "keep_end", "END"),
        // The limit: a lost block not sampled points to it.
        one("still_reachable", BIG, "lose_behind", "BEHIND"),
    ];
    want.sort();
    want
}

/// Production mode's exit scan reads all of the process's memory, the
/// heap with the blocks it did not sample included, against the sampled
/// blocks: exactly those nothing points to are lost (with the blocks only
/// they point to), with their stacks; a block kept only by a small block
/// the agent never saw, or only by pointers into it (to its last byte
/// too, from the heap), is not. Under jemalloc as under glibc's malloc:
/// jemalloc's records of its extents, which name every large block, are
/// not taken for pointers.
#[test]
fn production_scan_calls_lost_only_the_blocks_nothing_points_to() {
    for preload in [false, true] {
        let name = ["production_reach", "production_reach_jemalloc"][usize::from(preload)];
        let dir = TestDir::new(name);
        let run = run_of(reach_command(&dir, &["--production"], &[], preload));
        assert_eq!(
            (run.code(), run.stdout.as_str()),
            (0, "done\n"),
            "{}",
            run.describe()
        );
        let all = leaks(&dir.trace());
        let scan = &all["scan"];
        assert_eq!(scan["production"], true, "{name}: {}", pretty(scan));
        assert_eq!(as_str(scan, "trigger"), "exit", "{name}");
        assert_eq!(as_u64(scan, "blocks"), 11, "{name}: {}", pretty(scan));
        assert_eq!(verdicts_of(&all), expected_verdicts(), "{name}");
        let head = records(&all)
            .iter()
            .find(|r| frame_function(&stack_of(r, "stack")[0]) == "lose_chain")
            .expect("the chain's head");
        assert_eq!(
            (as_u64(head, "direct_bytes"), as_u64(head, "indirect_bytes")),
            (BIG, BIG),
            "{name}"
        );
        // By default the leaks alone, with their estimate.
        let report = leaks_with(&dir.trace(), &[]);
        let kinds: Vec<&str> = records(&report).iter().map(|r| as_str(r, "kind")).collect();
        assert_eq!(kinds, ["definitely_lost", "definitely_lost"], "{name}");
        let summary = &report["summary"];
        let lost = &summary["estimated_lost"];
        assert_eq!(
            as_u64(lost, "sampled_blocks"),
            5,
            "{name}: {}",
            pretty(summary)
        );
        // A block of 4 MiB is sampled with probability 1 - exp(-8).
        let estimate = as_u64(lost, "bytes");
        assert!(
            estimate.abs_diff(5 * BIG) * 100 <= 5 * BIG,
            "{name}: {estimate}"
        );
        assert_eq!(as_u64(&summary["definitely_lost"], "blocks"), 4, "{name}");
        assert_eq!(as_u64(&summary["possibly_lost"], "blocks"), 0, "{name}");
        let text = leaks_text(&dir.trace(), &[]);
        for said in [
            "Production mode: a sampled block is definitely lost when no word of the process's memory",
            "a leak reachable only from a leaked structure of unsampled blocks is missed",
            ": 11 sampled blocks, ",
        ] {
            assert!(text.contains(said), "{name}: {said}\n{text}");
        }
    }
}

/// A scan asked for on the control socket (`trapline watch --scan-every
/// 1`) of a production run judges as the exit scan does: the watcher's
/// look counts the lost sampled blocks, and the trace's first scan has
/// the exit scan's verdicts.
#[test]
fn production_scan_on_request_judges_as_at_exit() {
    let dir = TestDir::new("production_reach_request");
    let cmd = reach_command(&dir, &["--production", "--control"], &["wait"], false);
    let (mut child, pid) = start_printing(cmd, "pid=");
    let mut watch = Command::new(trapline());
    watch
        .args(["watch", &pid, "--count", "1", "--scan-every", "1"])
        .args(["--no-stale", "--format", "jsonl", "--top", "20"]);
    let look = output_of(watch, "trapline watch");
    assert_eq!(look.code(), 0, "{}", look.describe());
    let look: Value = serde_json::from_str(&look.stdout).expect("one JSON look");
    let (mut bytes, mut blocks) = (0, 0);
    for site in as_array(&look, "sites") {
        if let Some(u) = site["unreachable"].as_array() {
            bytes += u[0].as_u64().unwrap();
            blocks += u[1].as_u64().unwrap();
        }
    }
    assert_eq!((bytes, blocks), (5 * BIG, 5), "{}", pretty(&look));
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"go\n").unwrap();
    let run = finish(child, "trapline run");
    assert_eq!(run.code(), 0, "{}", run.describe());
    let on_request = leaks_with(&dir.trace(), &["--snapshot", "1", "--kinds", "all"]);
    assert_eq!(as_str(&on_request["scan"], "trigger"), "periodic");
    assert_eq!(on_request["scan"]["production"], true);
    assert_eq!(verdicts_of(&on_request), expected_verdicts());
    let at_exit = leaks(&dir.trace());
    assert_eq!(as_u64(&at_exit["scan"], "snapshots"), 2);
    assert_eq!(verdicts_of(&at_exit), expected_verdicts());
}

/// The heap profile `go tool pprof` reads from a production trace says how
/// it was sampled, and its in-use bytes through each leaking function are
/// the estimates `leaks` gives for that function's stack.
#[test]
fn production_pprof_holds_the_estimates_and_says_so() {
    let (dir, report) = production_run(
        "production_pprof",
        &["--production", "--sample=64K"],
        &["no"],
    );
    let profile = dir.path().join("heap.pb.gz");
    let mut cmd = std::process::Command::new(trapline());
    cmd.args(["export", "--format", "pprof", "--output"])
        .arg(&profile)
        .arg(dir.trace());
    let export = output_of(cmd, "trapline export");
    assert_eq!(export.code(), 0, "{}", export.describe());
    let go_pprof = |args: &[&str]| {
        let out = std::process::Command::new("go")
            .args(["tool", "pprof"])
            .args(args)
            .arg(&profile)
            .env("HOME", dir.path())
            .env("PPROF_TMPDIR", dir.path())
            .output()
            .expect("go tool pprof (apt-get install golang-go)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let one_in = as_u64(&report["sampling"]["production"], "allocation_calls")
        / as_u64(&report["sampling"]["production"], "sampled_allocations");
    let comments = go_pprof(&["-comments"]);
    assert!(
        comments.contains(&format!(
            "production mode: about 1 block in {one_in} sampled"
        )),
        "{comments}"
    );
    let top = go_pprof(&["-top", "-cum", "-unit=B", "-sample_index=inuse_space"]);
    for function in ["parse_request", "load_config"] {
        let estimate = as_u64(
            &record_with_function(&report, function)["estimate"],
            "bytes",
        );
        let row = top
            .lines()
            .find(|l| l.split_whitespace().last() == Some(function))
            .unwrap_or_else(|| panic!("no {function} row:\n{top}"));
        let cum = row.split_whitespace().nth(3).expect("cum column");
        assert_eq!(cum, format!("{estimate}B"), "{function}:\n{top}");
    }
}
