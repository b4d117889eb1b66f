//! `trapline run --sample`: every block counted and judged exactly, full
//! stacks only for the sampled ones, and estimates of each full stack's
//! blocks that cover the truth.

mod common;

use common::*;
use serde_json::{json, Value};

const SOURCE: &str = "sampled_leaks.c";

/// What sampled_leaks.c leaks through each path: (function, marker, blocks,
/// bytes per block).
const PATHS: [(&str, &str, u64, u64); 2] = [
    ("parse_request", "PARSE", 20_000, 1_000),
    ("load_config", "LOAD", 5_000, 200),
];

fn sampled_run(name: &str, flags: &[&str], args: &[&str]) -> (TestDir, Value) {
    let dir = TestDir::new(name);
    let prog = compile_c(&dir, SOURCE);
    let run = run(&dir, flags, &prog, args);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let report = leaks(&dir.trace());
    (dir, report)
}

/// The leaks of a sampled run: the loss summary is exact; the blocks that
/// took no full stack form one record of their caller (`make_node`), the
/// sampled ones a record per full stack whose estimate covers what that
/// path leaked; the double free is caught with its full stack.
#[test]
fn sampled_leaks_are_exact_by_caller_and_estimated_by_stack() {
    let (dir, report) = sampled_run("sampled_leaks", &["--sample=64K"], &["double-free"]);
    assert_eq!(report["sampling"], json!({"mean_bytes": 65536}));
    assert_eq!(
        report["summary"]["definitely_lost"],
        json!({"bytes": 21_000_000, "blocks": 25_000}),
        "{}",
        pretty(&report["summary"])
    );
    let node = ("make_node", SOURCE, marker_line(SOURCE, "NODE"));
    let recs = records(&report);
    let mut blocks = 0;
    let mut caller_only = 0;
    for r in recs {
        assert_eq!(as_str(r, "kind"), "definitely_lost", "{}", pretty(r));
        // The innermost program frame is the caller, in every record.
        let stack = stack_of(r, "stack");
        assert_stack_top(stack, &[node], "a record's caller");
        blocks += as_u64(r, "blocks");
        if r.get("caller_only") == Some(&json!(true)) {
            caller_only += 1;
            assert_eq!(stack.len(), 1, "the caller alone: {}", show_stack(stack));
            assert!(r.get("estimate").is_none(), "{}", pretty(r));
        }
    }
    assert_eq!(blocks, 25_000);
    assert_eq!(
        caller_only,
        1,
        "one record of the caller: {}",
        pretty(&report)
    );

    for (function, marker, path_blocks, size) in PATHS {
        let r = recs
            .iter()
            .find(|r| {
                stack_of(r, "stack")
                    .iter()
                    .any(|f| frame_function(f) == function)
            })
            .unwrap_or_else(|| panic!("no record through {function}: {}", pretty(&report)));
        let stack = stack_of(r, "stack");
        assert_stack_top(
            stack,
            &[node, (function, SOURCE, marker_line(SOURCE, marker))],
            function,
        );
        assert!(r.get("caller_only").is_none(), "{}", pretty(r));
        let e = &r["estimate"];
        assert_eq!(as_u64(e, "sampled_blocks"), as_u64(r, "blocks"));
        assert_eq!(as_u64(r, "bytes"), as_u64(r, "blocks") * size);
        // A few samples at least: p = 1 - exp(-size / 64 KiB) per block.
        assert!(as_u64(r, "blocks") >= 3, "{}", pretty(r));
        let truth = path_blocks * size;
        let (estimate, error) = (as_u64(e, "bytes"), as_u64(e, "bytes_error"));
        // 2.5 times the 95% half-width: about 5 standard deviations.
        assert!(
            estimate.abs_diff(truth) * 2 <= error * 5,
            "{function}: estimated {estimate} ± {error}, leaked {truth}"
        );
    }

    let double = errors(&report)
        .iter()
        .find(|e| as_str(e, "kind") == "double_free")
        .unwrap_or_else(|| panic!("no double free: {}", pretty(&report)));
    assert_stack_top(
        stack_of(double, "stack"),
        &[("main", SOURCE, marker_line(SOURCE, "DOUBLE-FREE"))],
        "the double free",
    );
    assert_stack_top(
        stack_of(double, "alloc_stack"),
        &[("main", SOURCE, marker_line(SOURCE, "DOUBLE-ALLOC"))],
        "the double-freed block's allocation",
    );

    let text = leaks_text(&dir.trace(), &[]);
    assert!(
        text.contains("SAMPLED RECORDING: every block is counted, but only about one per 65,536 bytes allocated took its full stack."),
        "{text}"
    );
    assert!(
        text.contains(
            "(sampled recording: these blocks took no full stack; the stack is their caller)"
        ),
        "{text}"
    );
}

/// Without `--sample`, every record has its full stack and neither field.
#[test]
fn full_recording_has_no_sampling_fields() {
    let (_dir, report) = sampled_run("sampled_leaks_full", &[], &[]);
    assert_eq!(report["sampling"], Value::Null);
    let recs = records(&report);
    assert_eq!(recs.len(), 2, "{}", pretty(&report));
    for r in recs {
        assert!(r.get("caller_only").is_none() && r.get("estimate").is_none());
    }
}

/// A mean that is no byte count is bad usage.
#[test]
fn sample_rejects_what_is_no_byte_count() {
    let dir = TestDir::new("sample_bad_usage");
    for bad in [
        "--sample=0",
        "--sample=12Q",
        "--sample=-4K",
        "--sample=99999999999G",
    ] {
        let out = std::process::Command::new(trapline())
            .args(["run", bad, "-o"])
            .arg(dir.trace())
            .args(["--", "/bin/true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("is not a byte count"), "{bad}: {err}");
        assert!(!dir.trace().exists(), "{bad} wrote a trace");
    }
}
