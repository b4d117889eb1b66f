//! End-to-end: allocation errors (double, invalid and mismatched frees,
//! invalid realloc) are reported with their stacks, and by default not passed
//! to the C library.

mod common;

use common::*;
use serde_json::{json, Value};

/// The only error of `kind` whose stack[0] is `function`.
fn error_at<'a>(report: &'a Value, kind: &str, function: &str) -> &'a Value {
    let found: Vec<&Value> = errors(report)
        .iter()
        .filter(|e| {
            as_str(e, "kind") == kind
                && stack_of(e, "stack").first().map(frame_function) == Some(function)
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {kind} error from {function}; errors: {}",
        pretty(field(report, "errors"))
    );
    found[0]
}

/// Fields beyond the documented contract: checked when the report has them.
fn assert_optional(error: &Value, key: &str, expected: Value) {
    if let Some(value) = error.get(key) {
        assert_eq!(value, &expected, "{key} of {}", pretty(error));
    }
}

/// Every error of these fixtures happens once at its stack, and (by default)
/// is not passed on to the C library.
fn assert_each_once(report: &Value, passed_on: bool) {
    for error in errors(report) {
        assert_optional(error, "count", json!(1));
        assert_optional(error, "passed_on", json!(passed_on));
    }
}

fn kinds(report: &Value) -> Vec<String> {
    let mut kinds: Vec<String> = errors(report)
        .iter()
        .map(|e| as_str(e, "kind").to_owned())
        .collect();
    kinds.sort();
    kinds
}

#[test]
fn errors_c_reported_and_program_survives() {
    let dir = TestDir::new("errors_c");
    let prog = compile_c(&dir, "errors.c");
    let report = record_whole(&dir, &[], &prog, &[], "survived\n");
    assert_eq!(process_exit(&report), &json!({"code": 0}));
    assert_eq!(
        kinds(&report),
        [
            "double_free",
            "invalid_free",
            "invalid_free",
            "invalid_realloc"
        ]
    );
    assert_each_once(&report, false);
    assert_eq!(
        unfreed_summary(&report),
        (0, 0),
        "records: {:?}",
        record_summaries(&report)
    );
    assert_eq!(records(&report).len(), 0);

    let src = "errors.c";
    let m = |marker: &str| marker_line(src, marker);

    let df = error_at(&report, "double_free", "double_free");
    assert_eq!(as_str(df, "function"), "free");
    assert!(as_str(df, "address").starts_with("0x"));
    assert_double_free_call_and_alloc_stacks(df);
    assert_optional(df, "alloc_size", json!(24));
    assert_optional(df, "alloc_function", json!("malloc"));
    assert_stack_top(
        stack_of(df, "free_stack"),
        &[("double_free", src, m("DF-FREE1"))],
        "double_free.free_stack",
    );

    let stack_free = error_at(&report, "invalid_free", "free_stack_address");
    assert_eq!(as_str(stack_free, "function"), "free");
    assert_stack_address_free_stack(stack_free);
    // A stack address was never allocated: no allocation stack.
    let has_alloc_stack = stack_free
        .get("alloc_stack")
        .and_then(Value::as_array)
        .is_some_and(|stack| !stack.is_empty());
    assert!(
        !has_alloc_stack,
        "alloc_stack of a stack address: {}",
        pretty(stack_free)
    );

    let interior = error_at(&report, "invalid_free", "free_interior");
    assert_eq!(as_str(interior, "function"), "free");
    assert_stack_top(
        stack_of(interior, "stack"),
        &[
            ("free_interior", src, m("INVALID-INTERIOR")),
            ("main", src, m("CALL-INVALID-INTERIOR")),
        ],
        "invalid_free (interior pointer).stack",
    );
    // If the report names the block the pointer falls into, it is the right one.
    if let Some(alloc) = interior.get("alloc_stack").and_then(Value::as_array) {
        if !alloc.is_empty() {
            assert_stack_top(
                alloc,
                &[("free_interior", src, m("INTERIOR-ALLOC"))],
                "interior alloc_stack",
            );
        }
    }

    let realloc = error_at(&report, "invalid_realloc", "realloc_stack_address");
    assert_eq!(as_str(realloc, "function"), "realloc");
    assert_stack_top(
        stack_of(realloc, "stack"),
        &[
            ("realloc_stack_address", src, m("INVALID-REALLOC")),
            ("main", src, m("CALL-INVALID-REALLOC")),
        ],
        "invalid_realloc.stack",
    );
}

#[test]
fn errors_cpp_mismatched_frees() {
    let dir = TestDir::new("errors_cpp");
    let prog = compile_cpp(&dir, "errors.cpp");
    let report = record_whole(&dir, &[], &prog, &[], "survived\n");
    assert_eq!(process_exit(&report), &json!({"code": 0}));
    assert_eq!(kinds(&report), ["mismatched_free"; 4]);
    assert_each_once(&report, false);
    // The mismatched releases still release their blocks.
    assert_eq!(
        unfreed_summary(&report),
        (0, 0),
        "records: {:?}",
        record_summaries(&report)
    );

    let src = "errors.cpp";
    for (caller, release, bad_line, alloc_line) in [
        ("new_free()", "free", "NEW-FREE", "NEW-FREE-ALLOC"),
        (
            "array_delete()",
            "operator delete(void*, unsigned long)",
            "ARRAY-DELETE",
            "ARRAY-DELETE-ALLOC",
        ),
        (
            "malloc_delete()",
            "operator delete(void*, unsigned long)",
            "MALLOC-DELETE",
            "MALLOC-DELETE-ALLOC",
        ),
        (
            "new_delete_array()",
            "operator delete[](void*)",
            "NEW-DELETE-ARRAY",
            "NEW-DELETE-ARRAY-ALLOC",
        ),
    ] {
        let error = error_at(&report, "mismatched_free", caller);
        assert_eq!(as_str(error, "function"), release, "{}", pretty(error));
        assert_bad_call_and_alloc(error, src, caller, bad_line, alloc_line);
    }
}

/// delete_mismatch.cpp: releases of the right family that give another size
/// (a Derived deleted through a Base* without a virtual destructor; a sized
/// delete[]) or alignment than the block was allocated with. Each is
/// reported once, with what the release gave, and the block is released;
/// correct sized, array and aligned deletes are not reported.
#[test]
fn errors_cpp_mismatched_sizes_and_alignments() {
    let dir = TestDir::new("delete_mismatch");
    let prog = compile_cpp(&dir, "delete_mismatch.cpp");
    let report = record_whole(&dir, &[], &prog, &[], "survived\n");
    assert_eq!(
        kinds(&report),
        [
            "mismatched_alignment",
            "mismatched_alignment",
            "mismatched_size",
            "mismatched_size"
        ]
    );
    assert_each_once(&report, false);
    assert_eq!(unfreed_summary(&report), (0, 0));
    // A mismatch is one release (its Free event), in the agent's totals too.
    assert_eq!(stats(&dir.trace())["agent_totals_match"], json!(true));
    let src = "delete_mismatch.cpp";
    for (caller, kind, release, given, alloc_fn, size, bad_line) in [
        (
            "base_delete()",
            "mismatched_size",
            "operator delete(void*, unsigned long)",
            ("given_size", 8),
            "operator new(unsigned long)",
            24,
            "BASE-DELETE",
        ),
        (
            "array_size()",
            "mismatched_size",
            "operator delete[](void*, unsigned long)",
            ("given_size", 48),
            "operator new[](unsigned long)",
            32,
            "ARRAY-SIZE",
        ),
        (
            "align_delete()",
            "mismatched_alignment",
            "operator delete(void*)",
            ("given_alignment", 0),
            "operator new(unsigned long, std::align_val_t)",
            64,
            "ALIGN-DELETE",
        ),
        (
            "plain_aligned_delete()",
            "mismatched_alignment",
            "operator delete(void*, std::align_val_t)",
            ("given_alignment", 64),
            "operator new(unsigned long)",
            64,
            "PLAIN-ALIGNED-DELETE",
        ),
    ] {
        let error = error_at(&report, kind, caller);
        assert_eq!(as_str(error, "function"), release, "{}", pretty(error));
        assert_eq!(error[given.0], json!(given.1), "{}", pretty(error));
        assert_eq!(
            error["alloc_function"],
            json!(alloc_fn),
            "{}",
            pretty(error)
        );
        assert_eq!(error["alloc_size"], json!(size), "{}", pretty(error));
        assert!(error.get("passed_on").is_none(), "{}", pretty(error));
        let alloc_line = format!("{bad_line}-ALLOC");
        assert_bad_call_and_alloc(error, src, caller, bad_line, &alloc_line);
    }
}

/// private_new.cpp with private_new_lib.cpp: a library with its own
/// operator new and delete over malloc and free, bound inside it, as
/// libLLVM.so has. Blocks that cross between its operators and the
/// program's (the agent's) are not mismatches: rust-lld, linking under
/// `cargo build`, reported 128 "mismatched free" errors for them. The
/// program's own mismatches still are.
#[test]
fn errors_cpp_blocks_of_a_librarys_own_operators_are_no_mismatch() {
    let dir = TestDir::new("private_new");
    let lib = compile_cpp_library(
        &dir,
        "private_new_lib.cpp",
        "libprivate_new.so",
        &["-O2", "-Wl,-Bsymbolic-functions"],
    );
    let prog = compile_cpp_linked_to(&dir, "private_new.cpp", &lib);
    let report = record_whole(&dir, &[], &prog, &[], "done\n");
    assert_eq!(kinds(&report), ["mismatched_free", "mismatched_free"]);
    assert_each_once(&report, false);
    assert_eq!(unfreed_summary(&report), (0, 0));
    let src = "private_new.cpp";
    for (release, alloc_fn, marker) in [
        ("free", "operator new(unsigned long)", "REAL-MISMATCH"),
        (
            "operator delete(void*, unsigned long)",
            "operator new[](unsigned long)",
            "REAL-ARRAY-MISMATCH",
        ),
    ] {
        let error = errors(&report)
            .iter()
            .find(|e| e["function"] == json!(release))
            .unwrap_or_else(|| panic!("no error by {release}: {}", pretty(&report)));
        assert_eq!(
            error["alloc_function"],
            json!(alloc_fn),
            "{}",
            pretty(error)
        );
        assert_stack_top(
            stack_of(error, "stack"),
            &[("main", src, marker_line(src, marker))],
            release,
        );
    }
}

/// replaced_operators.cpp: a program that replaces operator new(size_t) and
/// operator delete(void*) (to count, over malloc and free). C++'s default
/// new[], nothrow new, sized delete, nothrow delete and delete[] call them,
/// and do under trapline too: the agent's own forms went straight to the C
/// library, so the program counted 2 news and no delete where it counts 4
/// and 3 (and an arena behind the operators got an invalid free). No error;
/// the one leak is a malloc by the program's operator new, called at LEAK.
#[test]
fn forms_a_program_did_not_replace_call_the_ones_it_did() {
    let dir = TestDir::new("replaced_operators");
    let prog = compile_cpp(&dir, "replaced_operators.cpp");
    let report = record_whole(&dir, &[], &prog, &[], "news 4, deletes 3, leak kept\n");
    assert_eq!(kinds(&report), Vec::<&str>::new(), "{}", pretty(&report));
    assert_eq!(unfreed_summary(&report), (32, 1));
    let src = "replaced_operators.cpp";
    let records = as_array(&report, "records");
    assert_eq!(records.len(), 1, "{}", pretty(&report));
    assert_eq!(records[0]["kind"], json!("definitely_lost"));
    assert_stack_top(
        stack_of(&records[0], "stack"),
        &[
            (
                "operator new(unsigned long)",
                src,
                marker_line(src, "NEW-MALLOC"),
            ),
            ("main", src, marker_line(src, "LEAK")),
        ],
        "the leak",
    );
}

/// throwing_new.cpp: the program's operator new always throws; C++'s
/// default new[] and nothrow new[] call it, and under trapline its
/// exception passes through the agent's forms on the way: new[] throws,
/// nothrow new[] gives NULL, as natively.
#[test]
fn a_replaced_operator_new_that_throws_reaches_the_program_through_the_agent() {
    let dir = TestDir::new("throwing_new");
    let prog = compile_cpp(&dir, "throwing_new.cpp");
    let report = record_whole(
        &dir,
        &[],
        &prog,
        &[],
        "new[] threw bad_alloc\nnothrow new[] gave NULL\n",
    );
    assert_eq!(kinds(&report), Vec::<&str>::new(), "{}", pretty(&report));
}

/// The error's stack is `caller` at marker `bad_line` of `src`, called from
/// main at `CALL-<bad_line>`; its allocation stack starts in `caller` at
/// marker `alloc_line`.
fn assert_bad_call_and_alloc(
    error: &Value,
    src: &str,
    caller: &str,
    bad_line: &str,
    alloc_line: &str,
) {
    let m = |marker: &str| marker_line(src, marker);
    assert_stack_top(
        stack_of(error, "stack"),
        &[
            (caller, src, m(bad_line)),
            ("main", src, m(&format!("CALL-{bad_line}"))),
        ],
        caller,
    );
    assert_stack_top(
        stack_of(error, "alloc_stack"),
        &[(caller, src, m(alloc_line))],
        &format!("{caller} alloc_stack"),
    );
}

/// Without --pass-invalid-frees the double free is swallowed.
#[test]
fn double_free_not_passed_by_default() {
    let dir = TestDir::new("pass_invalid_default");
    let prog = compile_c(&dir, "pass_invalid.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "survived\n");
    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(kinds(&report), ["double_free"]);
    assert_each_once(&report, false);
    assert_eq!(unfreed_summary(&report), (0, 0));
}

/// With --pass-invalid-frees the C library sees the double free and aborts;
/// the trace is flushed on SIGABRT and still holds the error.
#[test]
fn pass_invalid_frees_lets_libc_abort() {
    let dir = TestDir::new("pass_invalid");
    let prog = compile_c(&dir, "pass_invalid.c");
    let run = run(&dir, &["--pass-invalid-frees"], &prog, &[]);
    assert_eq!(run.code(), 134, "{}", run.describe());
    assert_eq!(
        run.stdout, "",
        "the program must not get past the double free"
    );
    assert_no_events_lost_in_summary(&run);

    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(process_exit(&report), &json!({"signal": 6}));
    assert_eq!(kinds(&report), ["double_free"]);
    assert_each_once(&report, true);
    let src = "pass_invalid.c";
    let m = |marker: &str| marker_line(src, marker);
    let error = &errors(&report)[0];
    assert_eq!(as_str(error, "function"), "free");
    assert_stack_top(
        stack_of(error, "stack"),
        &[("main", src, m("PASS-FREE2"))],
        "stack",
    );
    assert_stack_top(
        stack_of(error, "alloc_stack"),
        &[("main", src, m("PASS-ALLOC"))],
        "alloc_stack",
    );
    assert_stack_top(
        stack_of(error, "free_stack"),
        &[("main", src, m("PASS-FREE1"))],
        "free_stack",
    );
    assert_eq!(
        unfreed_summary(&report),
        (0, 0),
        "records: {:?}",
        record_summaries(&report)
    );
}

#[test]
fn double_free_after_realloc_names_the_realloc_as_first_free() {
    let dir = TestDir::new("realloc_double_free");
    let prog = compile_c(&dir, "realloc_double_free.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "survived\n", "{}", run.describe());
    let report = leaks(&dir.trace());
    assert_eq!(kinds(&report), vec!["double_free"], "{}", pretty(&report));
    let error = error_at(&report, "double_free", "main");
    let line = |marker| marker_line("realloc_double_free.c", marker);
    assert_eq!(
        stack_of(error, "stack")[0]["line"],
        json!(line("SECOND-FREE"))
    );
    assert_eq!(
        stack_of(error, "free_stack")[0]["line"],
        json!(line("REALLOC"))
    );
    assert_eq!(
        stack_of(error, "alloc_stack")[0]["line"],
        json!(line("ALLOC"))
    );
    assert_eq!(
        field(&report["summary"]["unfreed_at_exit"], "bytes"),
        &json!(0)
    );
}

#[test]
fn failing_operator_new_still_throws_bad_alloc() {
    let dir = TestDir::new("bad_alloc");
    let prog = compile_cpp(&dir, "bad_alloc.cpp");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(
        run.stdout,
        "caught bad_alloc\ncaught again after 2 handler calls\nnothrow gives (nil)\n",
        "{}",
        run.describe()
    );
}

/// A record of `leaks --format json`'s `allocation_failures`: function,
/// count, (least, most bytes asked for), alignment, line of the call.
type Failure = (String, u64, (u64, u64), u64, Option<u64>);

fn failure_records(report: &Value) -> Vec<Failure> {
    as_array(report, "allocation_failures")
        .iter()
        .map(|f| {
            let top = &stack_of(f, "stack")[0];
            (
                as_str(f, "function").to_owned(),
                f["count"].as_u64().unwrap(),
                (
                    f["min_size"].as_u64().unwrap(),
                    f["max_size"].as_u64().unwrap(),
                ),
                f["alignment"].as_u64().unwrap(),
                top.get("line").and_then(Value::as_u64),
            )
        })
        .collect()
}

/// Asserts that the report's failed-allocation records are `expected`.
fn assert_failure_records(report: &Value, expected: &[Failure]) {
    assert_eq!(
        failure_records(report),
        expected,
        "{}",
        pretty(&report["allocation_failures"])
    );
}

/// nothrow_new_handler.cpp: nothrow `operator new` returns NULL whatever the
/// program's new-handler does. A handler that threw used to send its
/// exception out of the nothrow operator and terminate the program (the
/// agent now hands such a call to the C++ runtime's own nothrow operator,
/// which catches, and records it for the program's call). Each call is one
/// failed allocation, of the nothrow function, at the program's line.
#[test]
fn nothrow_new_returns_null_whatever_the_new_handler_does() {
    let dir = TestDir::new("nothrow_new_handler");
    let prog = compile_cpp(&dir, "nothrow_new_handler.cpp");
    let expected_out = "new[] with a throwing handler: (nil)\n\
                        aligned new with a throwing handler: (nil)\n\
                        new with a handler that gives up: (nil) after 1 call\n";
    let report = record_whole(&dir, &[], &prog, &[], expected_out);
    assert!(report["errors"].as_array().is_some_and(|e| e.is_empty()));
    assert_eq!(unfreed_summary(&report), (0, 0));
    let src = "nothrow_new_handler.cpp";
    let huge = u64::MAX / 4;
    let expected: Vec<Failure> = [
        (
            "operator new[](unsigned long, std::nothrow_t const&)",
            0,
            "THROWING-HANDLER",
        ),
        (
            "operator new(unsigned long, std::align_val_t, std::nothrow_t const&)",
            64,
            "THROWING-HANDLER-ALIGNED",
        ),
        (
            "operator new(unsigned long, std::nothrow_t const&)",
            0,
            "GIVING-UP-HANDLER",
        ),
    ]
    .into_iter()
    .map(|(function, align, marker)| {
        let line = Some(marker_line(src, marker));
        (function.to_owned(), 1, (huge, huge), align, line)
    })
    .collect();
    assert_failure_records(&report, &expected);
}

/// errors.c's double free: the stack of the second free, and the allocation stack.
fn assert_double_free_call_and_alloc_stacks(df: &Value) {
    let src = "errors.c";
    let m = |marker: &str| marker_line(src, marker);
    assert_stack_top(
        stack_of(df, "stack"),
        &[
            ("double_free", src, m("DF-FREE2")),
            ("main", src, m("CALL-DOUBLE-FREE")),
        ],
        "double_free.stack",
    );
    assert_stack_top(
        stack_of(df, "alloc_stack"),
        &[("double_free", src, m("DF-ALLOC"))],
        "double_free.alloc_stack",
    );
}

/// errors.c's free of a stack address: the stack of the bad call.
fn assert_stack_address_free_stack(stack_free: &Value) {
    let src = "errors.c";
    let m = |marker: &str| marker_line(src, marker);
    assert_stack_top(
        stack_of(stack_free, "stack"),
        &[
            ("free_stack_address", src, m("INVALID-STACK")),
            ("main", src, m("CALL-INVALID-STACK")),
        ],
        "invalid_free (stack address).stack",
    );
}

/// errors.c with `--no-release-stacks`: the same four errors, each with the
/// stack of the bad call (captured when the error is found) and the
/// allocation stack; only the double free's first-free stack is unknown, and
/// both reports say why. The summary still equals `trapline stats`.
#[test]
fn no_release_stacks_keeps_error_stacks_and_says_what_is_missing() {
    let dir = TestDir::new("errors_c_no_release_stacks");
    let prog = compile_c(&dir, "errors.c");
    let report = record_whole(&dir, &["--no-release-stacks"], &prog, &[], "survived\n");
    assert_eq!(report["release_stacks"], json!(false));
    assert_eq!(
        kinds(&report),
        [
            "double_free",
            "invalid_free",
            "invalid_free",
            "invalid_realloc"
        ]
    );
    let df = error_at(&report, "double_free", "double_free");
    assert_double_free_call_and_alloc_stacks(df);
    assert_eq!(df["free_stack"], json!([]), "{}", pretty(df));
    let stack_free = error_at(&report, "invalid_free", "free_stack_address");
    assert_stack_address_free_stack(stack_free);

    let mut cmd = std::process::Command::new(trapline());
    cmd.arg("leaks").arg(dir.trace());
    let text = output_of(cmd, "trapline leaks");
    assert_eq!(text.code(), 0, "{}", text.describe());
    assert!(
        text.stdout
            .contains("   (not recorded: the trace was made with --no-release-stacks)\n"),
        "{}",
        text.stdout
    );

    // A default recording says it kept release stacks.
    let dir = TestDir::new("errors_c_release_stacks");
    let prog = compile_c(&dir, "errors.c");
    let default_run = common::run(&dir, &[], &prog, &[]);
    assert_eq!(default_run.code(), 0, "{}", default_run.describe());
    assert_eq!(leaks(&dir.trace())["release_stacks"], json!(true));
}

/// double_free_far.c: the second free comes 20,000 releases after the
/// first, all in the few shards the program's small heap uses. It is still
/// a double free with the first free's stack (recording.md, "The ring of
/// recently freed blocks").
#[test]
fn a_double_free_far_apart_in_a_small_heap_is_still_one() {
    let dir = TestDir::new("double_free_far");
    let prog = compile_c(&dir, "double_free_far.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "survived\n");
    let report = leaks(&dir.trace());
    assert_eq!(kinds(&report), vec!["double_free"], "{}", pretty(&report));
    let error = error_at(&report, "double_free", "main");
    let line = |marker| json!(marker_line("double_free_far.c", marker));
    assert_eq!(stack_of(error, "stack")[0]["line"], line("FAR-SECOND-FREE"));
    assert_eq!(
        stack_of(error, "free_stack")[0]["line"],
        line("FAR-FIRST-FREE")
    );
}

/// alloc_failures.cpp: failed allocation calls are recorded where they
/// happen (they used to leave no trace at all). `stats` counts them per
/// function, apart from the calls that succeeded; `leaks` lists them by
/// stack, with the sizes asked for. A new-handler that throws ends its call
/// too (its exception passes a drop guard in the hook, which aborted the
/// program until the agent's own unwinder was prepared at start).
#[test]
fn failed_allocations_are_recorded_with_their_stacks() {
    let dir = TestDir::new("alloc_failures");
    let prog = compile_cpp(&dir, "alloc_failures.cpp");
    let expected_out = "posix_memalign: 22\ncalloc failed\nbad_alloc\nnothrow new failed\n\
                        the new-handler threw\nrealloc failed\n";
    let report = record_whole(&dir, &[], &prog, &[], expected_out);
    assert!(report["errors"].as_array().is_some_and(|e| e.is_empty()));
    // The run's summary (from the agent's own totals) says so too, and so
    // does its line for the other processes when the program is a child.
    let run = run(&dir, &[], &prog, &[]);
    assert!(
        run.stderr
            .contains("==trapline== failed allocation calls: 9 "),
        "{}",
        run.describe()
    );
    assert_eq!(unfreed_summary(&report), (0, 0));

    let src = "alloc_failures.cpp";
    let m = |marker: &str| marker_line(src, marker);
    let half = u64::MAX / 2;
    let expected: Vec<Failure> = [
        ("malloc", 3, (half, half + 2), 0, "HUGE-MALLOC"),
        ("posix_memalign", 1, (64, 64), 3, "BAD-ALIGN"),
        ("calloc", 1, (u64::MAX, u64::MAX), 0, "CALLOC-OVERFLOW"),
        (
            "operator new[](unsigned long)",
            1,
            (u64::MAX / 4, u64::MAX / 4),
            0,
            "THROWING-NEW",
        ),
        (
            "operator new[](unsigned long, std::nothrow_t const&)",
            1,
            (u64::MAX / 4, u64::MAX / 4),
            0,
            "NOTHROW-NEW",
        ),
        (
            "operator new[](unsigned long)",
            1,
            (u64::MAX / 4, u64::MAX / 4),
            0,
            "HANDLER-NEW",
        ),
        ("realloc", 1, (half, half), 0, "HUGE-REALLOC"),
    ]
    .into_iter()
    .map(|(f, n, sizes, align, marker)| (f.to_owned(), n, sizes, align, Some(m(marker))))
    .collect();
    assert_failure_records(&report, &expected);

    let stats = stats(&dir.trace());
    let failed: Vec<_> = as_array(&stats, "calls")
        .iter()
        .filter(|c| c["failed"] != 0)
        .map(|c| {
            (
                as_str(c, "function").to_owned(),
                c["failed"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        failed,
        [
            ("malloc".to_owned(), 3),
            ("calloc".to_owned(), 1),
            ("realloc".to_owned(), 1),
            ("posix_memalign".to_owned(), 1),
            ("operator new[](unsigned long)".to_owned(), 2),
            (
                "operator new[](unsigned long, std::nothrow_t const&)".to_owned(),
                1
            ),
        ]
    );
    assert_eq!(stats["failed_allocations"], 9);
    // The agent's own totals count successful calls only, as the replay does.
    assert_eq!(
        stats["agent_totals_match"],
        json!(true),
        "{}",
        pretty(&stats)
    );
    // The same program as a shell's child: the line for the other processes.
    let script = format!("{}; true", prog.display());
    let under_sh = common::run(&dir, &[], std::path::Path::new("/bin/sh"), &["-c", &script]);
    assert!(
        under_sh
            .stderr
            .contains(", errors found: 0, failed allocation calls: 9, events lost: 0"),
        "{}",
        under_sh.describe()
    );
    assert!(
        under_sh.stderr.contains(": 9 failed allocation calls"),
        "{}",
        under_sh.describe()
    );
}

/// static_malloc.c (memcheck's): the program's own malloc and free, and
/// glibc's realloc. The agent's finish must allocate nothing through them:
/// a failed dlsym there allocated its message with this malloc, and glibc's
/// realloc then ran on it. Natively it exits 0 with 10 bytes lost; so it
/// must under the agent.
///
/// The realloc comes from dlerror's asprintf of "AGENT: undefined symbol:
/// _ZN9__gnu_cxx9__freeresEv", AGENT the agent's path as LD_PRELOAD gave
/// it: glibc 2.36 reallocs a message of about 50-100 or 150-300 bytes and
/// copies one of 100-150 with malloc (2.37 and later realloc one over 200).
/// The tests' agent path (`crates/cli/../../target/debug/...`, 60 bytes in
/// /work/main) made a 106-byte message, and the test passed on the agent
/// that died of it (SIGSEGV with the 43-byte canonical path). So the agent
/// is run from a path of 200 bytes (a 246-byte message): on the old agent
/// glibc aborted ("realloc(): invalid pointer", exit 134).
#[test]
fn own_malloc_without_realloc_exits_as_natively() {
    let dir = TestDir::new("static_malloc");
    let prog = compile_c(&dir, "static_malloc.c");
    let agent = agent_at_path_of_length(&dir, 200);
    let mut cmd = run_command(&dir, &[], &prog, &[]);
    cmd.env("TRAPLINE_AGENT", &agent);
    let report = record_whole_of(&dir, cmd, "");
    assert_eq!(process_exit(&report), &json!({"code": 0}));
    assert!(errors(&report).is_empty(), "{}", pretty(&report));
    let src = "static_malloc.c";
    let (bytes, blocks) =
        records_all_from(&report, &[("main", src, marker_line(src, "FIRST-MALLOC"))]);
    assert_eq!((bytes, blocks), (10, 1));
    for record in records(&report) {
        assert_eq!(
            as_str(record, "kind"),
            "definitely_lost",
            "{}",
            pretty(record)
        );
        assert_eq!(
            as_str(record, "allocated_by"),
            "malloc",
            "{}",
            pretty(record)
        );
    }
}

/// A symlink to the agent, in DIR, whose path is `len` bytes long (the
/// agent must keep its file name).
fn agent_at_path_of_length(dir: &TestDir, len: usize) -> std::path::PathBuf {
    let name = "libtrapline_agent.so";
    let base = dir.path().as_os_str().len() + 2 + name.len();
    assert!(
        base < len,
        "{} is too long a test directory",
        dir.path().display()
    );
    let at = dir.path().join("a".repeat(len - base));
    std::fs::create_dir_all(&at).expect("create the agent's directory");
    let link = at.join(name);
    std::os::unix::fs::symlink(agent(), &link).expect("link the agent");
    assert_eq!(link.as_os_str().len(), len);
    link
}

/// corrupt_heap_exit.c (after memcheck's fprw): a double free the agent
/// refuses, then writes to freed blocks that break every tcache bin, so
/// that glibc's next malloc of any small size aborts. Natively it exits 0;
/// under the agent it must too, with the trace whole: the finish allocated
/// from the program's heap (the dlsym of `__gnu_cxx::__freeres`) and
/// aborted there ("malloc(): unaligned tcache chunk detected"), leaving a
/// trace of 0 events though the double free had been caught.
#[test]
fn corrupt_heap_at_exit_keeps_exit_and_trace() {
    let dir = TestDir::new("corrupt_heap_exit");
    let prog = compile_c(&dir, "corrupt_heap_exit.c");
    let report = record_whole(&dir, &[], &prog, &[], "corrupt\n");
    assert_eq!(process_exit(&report), &json!({"code": 0}));
    assert_eq!(kinds(&report), ["double_free"]);
    assert_each_once(&report, false);
    let src = "corrupt_heap_exit.c";
    let m = |marker: &str| marker_line(src, marker);
    let error = &errors(&report)[0];
    assert_eq!(as_str(error, "function"), "free", "{}", pretty(error));
    assert_eq!(
        error["alloc_function"],
        json!("malloc"),
        "{}",
        pretty(error)
    );
    assert_eq!(error["alloc_size"], json!(40), "{}", pretty(error));
    for (key, marker) in [
        ("stack", "DOUBLE-FREE"),
        ("alloc_stack", "DOUBLE-FREE-ALLOC"),
        ("free_stack", "FIRST-FREE"),
    ] {
        assert_stack_top(stack_of(error, key), &[("main", src, m(marker))], key);
    }
    // The blocks that took each bin's top: 24 + 40 + ... + 1,000 bytes.
    assert_eq!(
        records_all_from(&report, &[("main", src, m("TAKE-TOP"))]),
        (31_744, 62)
    );
}

/// freeres_aborts.c: the program's own `__gnu_cxx::__freeres`, which the
/// finish calls, aborts. The finish faulting in itself must still write
/// the trace to its end record (before, the fatal signal found a finish
/// under way and left the trace with no events at all).
#[test]
fn fault_inside_the_finish_still_writes_the_trace() {
    let dir = TestDir::new("freeres_aborts");
    let prog = compile_c_with(&dir, "freeres_aborts.c", "freeres_aborts", &["-rdynamic"]);
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 134, "{}", run.describe());
    assert_eq!(run.stdout, "main done\n", "{}", run.describe());
    assert_no_events_lost_in_summary(&run);
    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(process_exit(&report), &json!({"signal": 6}));
    assert!(errors(&report).is_empty(), "{}", pretty(&report));
    let src = "freeres_aborts.c";
    // The abort struck in program code with no agent lock held: a crash,
    // where the program's freeres called abort.
    let crash = field(field(&report, "process"), "crash");
    assert_eq!(as_u64(crash, "signal"), 6, "{}", pretty(crash));
    assert!(
        stack_of(crash, "stack")
            .iter()
            .any(|f| frame_function(f) == "_ZN9__gnu_cxx9__freeresEv"
                || frame_function(f) == "__gnu_cxx::__freeres()"),
        "{}",
        pretty(crash)
    );
    let own: Vec<&Value> = records(&report)
        .iter()
        .filter(|r| stack_of(r, "stack").first().map(frame_function) == Some("main"))
        .collect();
    assert_eq!(own.len(), 1, "{}", pretty(&report));
    assert_stack_top(
        stack_of(own[0], "stack"),
        &[("main", src, marker_line(src, "LEAK-ALLOC"))],
        "record",
    );
    assert_eq!((as_u64(own[0], "bytes"), as_u64(own[0], "blocks")), (24, 1));
    assert_eq!(as_str(own[0], "allocated_by"), "malloc");
}

/// realloc_new.cpp (after memcheck's realloc_new): realloc of a block from
/// new or new[] (realloc(p, 0) too) is a mismatched free at the realloc,
/// and an aligned delete[] giving 64 for a new[] of alignment 128 is a
/// mismatched alignment. Each is reported once; every block is released.
#[test]
fn errors_cpp_realloc_of_new_and_aligned_array_mismatch() {
    let dir = TestDir::new("realloc_new");
    let prog = compile_cpp(&dir, "realloc_new.cpp");
    let report = record_whole(&dir, &[], &prog, &[], "survived\n");
    assert_eq!(
        kinds(&report),
        [
            "mismatched_alignment",
            "mismatched_free",
            "mismatched_free",
            "mismatched_free"
        ]
    );
    assert_each_once(&report, false);
    assert_eq!(unfreed_summary(&report), (0, 0));
    let src = "realloc_new.cpp";
    for (caller, kind, release, alloc_fn, size, bad_line) in [
        (
            "realloc_new()",
            "mismatched_free",
            "realloc",
            "operator new(unsigned long)",
            4,
            "REALLOC-NEW",
        ),
        (
            "realloc_array()",
            "mismatched_free",
            "realloc",
            "operator new[](unsigned long)",
            12,
            "REALLOC-ARRAY",
        ),
        (
            "realloc_zero()",
            "mismatched_free",
            "realloc",
            "operator new(unsigned long)",
            8,
            "REALLOC-ZERO",
        ),
        (
            "aligned_array()",
            "mismatched_alignment",
            "operator delete[](void*, std::align_val_t)",
            "operator new[](unsigned long, std::align_val_t)",
            256,
            "ALIGNED-ARRAY",
        ),
    ] {
        let error = error_at(&report, kind, caller);
        assert_eq!(as_str(error, "function"), release, "{}", pretty(error));
        assert_eq!(
            error["alloc_function"],
            json!(alloc_fn),
            "{}",
            pretty(error)
        );
        assert_eq!(error["alloc_size"], json!(size), "{}", pretty(error));
        if kind == "mismatched_alignment" {
            assert_eq!(error["given_alignment"], json!(64), "{}", pretty(error));
            assert_eq!(error["alloc_alignment"], json!(128), "{}", pretty(error));
        }
        let alloc_line = format!("{bad_line}-ALLOC");
        assert_bad_call_and_alloc(error, src, caller, bad_line, &alloc_line);
    }
}
