//! A program that crashes under `trapline run`: the trace says which
//! signal, at which address and where it struck, and the exit scan judges
//! the heap as the crash left it (memcheck prints the faulting stack and
//! still runs its leak check), with every other thread's stack.

mod common;

use common::*;
use serde_json::Value;

/// crash_heap.c with `how`: the run ends as the program does, the leak
/// report's process section holds the crash, and the heap is judged.
fn crash_report(how: &str, signal: i32) -> (Value, String, Finished) {
    let dir = TestDir::new(&format!("crash_{how}"));
    let prog = compile_c(&dir, "crash_heap.c");
    let run = run_allowing_failure(&dir, &prog, how);
    assert_eq!(run.code(), 128 + signal, "{}", run.describe());
    let report = leaks(&dir.trace());
    assert_complete(&report);
    let text = leaks_text(&dir.trace(), &[]);
    // The heap as the crash left it: the lost block is found lost, the
    // kept one reachable.
    let src = "crash_heap.c";
    let judged: Vec<(String, u64, u64)> = records(&report)
        .iter()
        .filter(|r| as_u64(r, "bytes") != 288) // the worker's TLS vector
        .map(|r| {
            let line = stack_of(r, "stack")[0]["line"].as_u64().unwrap_or(0);
            (as_str(r, "kind").to_owned(), as_u64(r, "bytes"), line)
        })
        .collect();
    assert_eq!(
        judged,
        [
            ("definitely_lost".to_owned(), 100, marker_line(src, "LOST")),
            ("still_reachable".to_owned(), 50, marker_line(src, "KEPT")),
        ],
        "{}",
        pretty(&report)
    );
    // Every other thread, where the crash's scan stopped it: the worker
    // in read, called from idle.
    let crash = field(field(&report, "process"), "crash");
    let others = crash["other_threads"]
        .as_array()
        .unwrap_or_else(|| panic!("no other_threads: {}", pretty(crash)));
    assert_eq!(others.len(), 1, "{}", pretty(crash));
    let worker = as_u64(&others[0], "tid");
    assert_ne!(worker, as_u64(crash, "tid"));
    let stack = stack_of(&others[0], "stack");
    assert!(
        frame_function(&stack[0]).contains("read"),
        "the worker stopped in read: {}",
        pretty(&others[0])
    );
    assert!(
        stack
            .iter()
            .any(|f| frame_function(f) == "idle"
                && f["line"].as_u64() == Some(marker_line(src, "IDLE"))),
        "the worker's stack runs through idle's read: {}",
        pretty(&others[0])
    );
    assert!(
        text.contains(&format!("thread {worker} was stopped at")),
        "{text}"
    );
    (report, text, run)
}

fn run_allowing_failure(dir: &TestDir, prog: &std::path::Path, how: &str) -> Finished {
    output_of(run_command(dir, &[], prog, &[how]), "trapline run")
}

/// SIGSEGV at address 16: the signal, the cause, the address, and the
/// stack from the faulting line; the run's summary points at it.
#[test]
fn a_segfault_is_reported_with_its_address_and_stack_and_the_heap_is_judged() {
    let (report, text, run) = crash_report("segv", libc::SIGSEGV);
    let crash = field(field(&report, "process"), "crash");
    assert_eq!(as_u64(crash, "signal"), 11);
    assert_eq!(as_str(crash, "signal_name"), "SIGSEGV");
    assert_eq!(crash["code"], 1);
    assert_eq!(as_str(crash, "cause"), "address not mapped");
    assert_eq!(as_str(crash, "address"), "0x10");
    assert_eq!(
        as_u64(crash, "tid"),
        as_u64(field(&report, "process"), "pid")
    );
    let src = "crash_heap.c";
    assert_stack_top(
        stack_of(crash, "stack"),
        &[
            ("crash_here", src, marker_line(src, "FAULT")),
            ("main", src, marker_line(src, "CALL-SEGV")),
        ],
        "the crash's stack",
    );
    assert!(
        text.contains("Exit: killed by signal 11 (SIGSEGV)"),
        "{text}"
    );
    assert!(
        text.contains("died of SIGSEGV (address not mapped) at address 0x10"),
        "{text}"
    );
    assert!(
        run.stderr
            .contains("==trapline== CRASH: the program died of SIGSEGV"),
        "{}",
        run.describe()
    );
}

/// abort(): SIGABRT, no address, the stack through abort to its caller.
#[test]
fn an_abort_is_reported_with_its_stack_and_the_heap_is_judged() {
    let (report, _, _) = crash_report("abort", libc::SIGABRT);
    let crash = field(field(&report, "process"), "crash");
    assert_eq!(as_str(crash, "signal_name"), "SIGABRT");
    assert!(crash["address"].is_null(), "{}", pretty(crash));
    let stack = stack_of(crash, "stack");
    let at = stack
        .iter()
        .position(|f| frame_function(f) == "give_up")
        .unwrap_or_else(|| panic!("no give_up frame: {}", pretty(crash)));
    assert!(
        stack[..at]
            .iter()
            .any(|f| frame_function(f).contains("abort")),
        "{}",
        pretty(crash)
    );
    let src = "crash_heap.c";
    assert_stack_top(
        &stack[at..],
        &[
            ("give_up", src, marker_line(src, "ABORT")),
            ("main", src, marker_line(src, "CALL-ABORT")),
        ],
        "the abort's stack",
    );
}
