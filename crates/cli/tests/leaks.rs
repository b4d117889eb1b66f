//! End-to-end: `trapline run` then `trapline leaks --format json` on programs
//! whose leaks are known exactly (tests/fixtures/).

mod common;

use common::*;
use serde_json::{json, Value};

/// leaks.c: seven leak records from every allocation function, sorted by
/// bytes, each with the allocating line and its caller; the blocks that were
/// freed are not reported.
#[test]
fn leaks_c_reports_each_leak_with_its_stack() {
    let dir = TestDir::new("leaks_c");
    let prog = compile_c(&dir, "leaks.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_no_events_lost_in_summary(&run);
    assert_summary_names(&run, &dir.trace());
    // From the exit snapshot, not from a replay.
    assert!(
        run.stderr
            .contains("==trapline== unfreed at exit: 1,032 bytes in 9 blocks\n"),
        "{}",
        run.describe()
    );
    // The summary counts the kinds as `trapline leaks` does.
    assert!(
        run.stderr.contains(
            "==trapline== definitely lost: 1,032 bytes in 9 blocks, indirectly lost: 0 bytes \
             in 0 blocks, possibly lost: 0 bytes in 0 blocks\n==trapline== errors found: 0\n"
        ),
        "{}",
        run.describe()
    );

    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(process_exit(&report), &json!({"code": 0}));
    assert_eq!(
        process_command(&report),
        vec![prog.to_str().unwrap().to_owned()]
    );
    assert!(process_pid(&report) > 0);
    assert_eq!(errors(&report), &Vec::<Value>::new(), "errors");

    let m = |marker: &str| marker_line("leaks.c", marker);
    let src = "leaks.c";
    assert_records(
        &report,
        &[
            ExpectedRecord {
                bytes: 300,
                blocks: 1,
                allocated_by: "realloc",
                stack: vec![
                    ("leak_realloc", src, m("REALLOC-GROW")),
                    ("main", src, m("CALL-REALLOC")),
                ],
            },
            ExpectedRecord {
                bytes: 200,
                blocks: 1,
                allocated_by: "calloc",
                stack: vec![
                    ("leak_calloc", src, m("CALLOC")),
                    ("main", src, m("CALL-CALLOC")),
                ],
            },
            ExpectedRecord {
                bytes: 192,
                blocks: 3,
                allocated_by: "malloc",
                stack: vec![("leak_loop", src, m("LOOP")), ("main", src, m("CALL-LOOP"))],
            },
            ExpectedRecord {
                bytes: 128,
                blocks: 1,
                allocated_by: "posix_memalign",
                stack: vec![
                    ("leak_aligned", src, m("POSIX-MEMALIGN")),
                    ("main", src, m("CALL-ALIGNED")),
                ],
            },
            ExpectedRecord {
                bytes: 100,
                blocks: 1,
                allocated_by: "malloc",
                stack: vec![
                    ("leak_one", src, m("LEAK-ONE")),
                    ("middle", src, m("CALL-LEAK-ONE")),
                    ("main", src, m("MAIN-MIDDLE")),
                ],
            },
            ExpectedRecord {
                bytes: 96,
                blocks: 1,
                allocated_by: "aligned_alloc",
                stack: vec![
                    ("leak_aligned", src, m("ALIGNED-ALLOC")),
                    ("main", src, m("CALL-ALIGNED")),
                ],
            },
            // strdup is checked separately below: its stack[0] is the C library.
            ExpectedRecord {
                bytes: 16,
                blocks: 1,
                allocated_by: "malloc",
                stack: vec![],
            },
        ],
    );

    // The block strdup allocated: stack[0] is strdup inside the C library
    // (no line information), stack[1] the fixture's caller.
    let strdup = &records(&report)[6];
    let stack = stack_of(strdup, "stack");
    assert!(stack.len() >= 3, "strdup stack: {}", show_stack(stack));
    assert!(
        frame_function(&stack[0]).contains("strdup"),
        "stack[0] of the strdup block should be strdup: {}",
        show_stack(stack)
    );
    assert!(
        basename(stack[0].get("module")).starts_with("libc"),
        "strdup's module: {}",
        pretty(&stack[0])
    );
    assert_stack_top(
        &stack[1..],
        &[
            ("leak_strdup", src, m("STRDUP")),
            ("main", src, m("CALL-STRDUP")),
        ],
        "strdup record, from stack[1]",
    );

    // The fixture's frames belong to the fixture's module.
    for record in records(&report).iter().take(6) {
        let frame = &stack_of(record, "stack")[0];
        assert_eq!(
            basename(frame.get("module")),
            "leaks",
            "module of {}",
            pretty(frame)
        );
    }
}

/// clean.c frees everything; the C library's own allocations (stdio buffers,
/// NSS, locale, time zone) are released before the snapshot.
#[test]
fn clean_c_reports_nothing() {
    let dir = TestDir::new("clean_c");
    let prog = compile_c(&dir, "clean.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert!(run.stdout.ends_with("clean done\n"), "{}", run.describe());
    assert_no_events_lost_in_summary(&run);

    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(process_exit(&report), &json!({"code": 0}));
    assert_eq!(
        unfreed_summary(&report),
        (0, 0),
        "records: {:?}",
        record_summaries(&report)
    );
    assert_eq!(records(&report).len(), 0, "{}", pretty(&report));
    assert_eq!(errors(&report).len(), 0, "{}", pretty(&report));
    // An empty heap at exit: the scan judged nothing and read no roots
    // (analyses.md, "Scan order", step 0; it read about 100 KB before).
    let scan = &report["scan"];
    assert_eq!(scan["trigger"], json!("exit"), "{}", pretty(&report));
    assert_eq!(as_u64(scan, "blocks"), 0);
    assert_eq!(as_u64(scan, "root_bytes"), 0, "{}", pretty(scan));
}

/// threads64.c: 64 threads, 640,000 malloc/free pairs, and 1 + 2 + ... + 64
/// leaked blocks of 32 bytes from one line: exactly one record of 2080 blocks.
#[test]
fn threads64_exact_totals() {
    let dir = TestDir::new("threads64");
    let prog = compile_c(&dir, "threads64.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_threads64_report(&dir, &run);
}

/// threads3000.c: 3,000 threads alive at once, ending together past the
/// writer's queue cap: every block recorded, nothing lost.
#[test]
fn three_thousand_threads_ending_together() {
    let dir = TestDir::new("threads3000");
    let prog = compile_c(&dir, "threads3000.c");
    let report = record_whole(&dir, &[], &prog, &[], "3000 threads done\n");
    // The scan's verdicts may split the blocks (a stale interior pointer
    // in a root makes a few of them possibly lost); every record has the
    // same stack, and together they hold every block.
    let src = "threads3000.c";
    let totals = records_all_from(
        &report,
        &[
            ("leak_one", src, marker_line(src, "MANY-LEAK")),
            ("worker", src, marker_line(src, "CALL-MANY-LEAK")),
        ],
    );
    assert_eq!(totals, (3000 * 24, 3000));
    assert_eq!(unfreed_summary(&report), (3000 * 24, 3000));
}

/// mapping_limit.c: the program uses up the process's memory mappings, then
/// starts a thread with room for its stack only. The agent's allocations for
/// that thread then come from the reserve it set aside at start (heap.rs),
/// and the thread runs without a side stack; the old agent's allocation
/// failed and Rust's handler aborted the program (exit 134).
#[test]
fn a_program_out_of_memory_mappings_runs_as_natively() {
    let dir = TestDir::new("mapping_limit");
    let prog = compile_c(&dir, "mapping_limit.c");
    let run = run(&dir, &[], &prog, &[]);
    if run.code() == 4 {
        // vm.max_map_count raised past what a test should map.
        eprintln!("skipped: {}", run.stdout.trim());
        return;
    }
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "thread ran: 1 block\n");
    assert_no_events_lost_in_summary(&run);
    let report = leaks(&dir.trace());
    assert_complete(&report);
    let src = "mapping_limit.c";
    assert_records(
        &report,
        &[ExpectedRecord {
            bytes: 40,
            blocks: 1,
            allocated_by: "malloc",
            stack: vec![("worker", src, marker_line(src, "MAPPED-OUT-LEAK"))],
        }],
    );
}

/// threads64.c again, with a library preloaded beside the agent that takes
/// pthread keys 0..39 first (many_keys_lib.c): the agent's key is then above
/// 31, and glibc's first `pthread_setspecific` in every thread calls
/// `calloc` while the agent sets the thread up. The agent used to recurse
/// until the stack overflowed (SIGSEGV before the first event).
#[test]
fn threads64_with_the_low_pthread_keys_taken() {
    let dir = TestDir::new("threads64_keys");
    let prog = compile_c(&dir, "threads64.c");
    let lib = compile_c_library(&dir, "many_keys_lib.c", "libmany_keys.so");
    let mut cmd = run_command(&dir, &[], &prog, &[]);
    cmd.env("LD_PRELOAD", &lib);
    let run = output_of(cmd, "trapline run threads64 with many_keys_lib");
    assert_threads64_report(&dir, &run);
}

fn assert_threads64_report(dir: &TestDir, run: &Finished) {
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "threads done\n");
    assert_no_events_lost_in_summary(run);

    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(process_exit(&report), &json!({"code": 0}));
    assert_eq!(errors(&report).len(), 0, "{}", pretty(&report));
    let src = "threads64.c";
    assert_records(
        &report,
        &[ExpectedRecord {
            bytes: 2080 * 32,
            blocks: 2080,
            allocated_by: "malloc",
            stack: vec![
                ("leak_blocks", src, marker_line(src, "THREAD-LEAK")),
                ("worker", src, marker_line(src, "CALL-THREAD-LEAK")),
            ],
        }],
    );
    // The agent's thread-start wrapper sits between start_thread and the
    // worker; it is no frame of the program.
    let frames = stack_of(&records(&report)[0], "stack");
    for frame in frames {
        let module = frame["module"].as_str().unwrap_or("");
        assert!(
            !module.ends_with("libtrapline_agent.so"),
            "agent frame in a stack: {frame}"
        );
    }
}

/// cpp_leak.cpp: demangled C++ names and the operator new spellings.
#[test]
fn cpp_leak_demangled_names() {
    let dir = TestDir::new("cpp_leak");
    let prog = compile_cpp(&dir, "cpp_leak.cpp");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_no_events_lost_in_summary(&run);

    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(errors(&report).len(), 0, "{}", pretty(&report));
    let src = "cpp_leak.cpp";
    let m = |marker: &str| marker_line(src, marker);
    assert_records(
        &report,
        &[
            ExpectedRecord {
                bytes: 400,
                blocks: 1,
                allocated_by: "operator new[](unsigned long)",
                stack: vec![
                    ("ns::Factory::make_array(int)", src, m("CPP-NEW-ARRAY")),
                    ("main", src, m("CALL-CPP-NEW-ARRAY")),
                ],
            },
            ExpectedRecord {
                bytes: 40,
                blocks: 1,
                allocated_by: "operator new(unsigned long)",
                stack: vec![
                    ("ns::Factory::make(int)", src, m("CPP-NEW")),
                    ("main", src, m("CALL-CPP-NEW")),
                ],
            },
        ],
    );
}

/// rust_leak.rs: the leaking functions appear under their demangled paths,
/// without hash suffixes, at the right lines.
#[test]
fn rust_leak_demangled_names() {
    let dir = TestDir::new("rust_leak");
    let prog = compile_rust(&dir, "rust_leak.rs");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_no_events_lost_in_summary(&run);

    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(errors(&report).len(), 0, "{}", pretty(&report));
    let src = "rust_leak.rs";
    for (bytes, function, marker) in [
        (4242, "rust_leak::inner::make_leak", "RUST-FORGET"),
        (777, "rust_leak::inner::make_box_leak", "RUST-BOX-LEAK"),
    ] {
        let record = record_with_function(&report, function);
        assert_eq!(
            (
                as_u64(record, "bytes"),
                as_u64(record, "blocks"),
                as_str(record, "allocated_by")
            ),
            (bytes, 1, "malloc"),
            "record of {function}"
        );
        let stack = stack_of(record, "stack");
        let frame = stack
            .iter()
            .find(|f| frame_function(f) == function)
            .unwrap();
        assert_frame(
            frame,
            function,
            src,
            marker_line(src, marker),
            &show_stack(stack),
        );
        assert_eq!(
            frame.get("inlined"),
            Some(&Value::Bool(false)),
            "{}",
            pretty(frame)
        );
        // The caller is rust_leak::main.
        let index = stack
            .iter()
            .position(|f| frame_function(f) == function)
            .unwrap();
        assert_eq!(
            stack.get(index + 1).map(frame_function),
            Some("rust_leak::main"),
            "caller of {function}: {}",
            show_stack(stack)
        );
    }
    // No frame anywhere keeps a legacy hash suffix (::h0123456789abcdef).
    for record in records(&report) {
        for frame in stack_of(record, "stack") {
            let name = frame_function(frame);
            let hashed = name.rsplit_once("::h").is_some_and(|(_, tail)| {
                tail.len() == 16 && tail.chars().all(|c| c.is_ascii_hexdigit())
            });
            assert!(!hashed, "mangling hash left in {name:?}");
            assert!(
                !name.starts_with("_ZN") && !name.starts_with("_R"),
                "not demangled: {name:?}"
            );
        }
    }
}

/// deep_stacks.c: a stack deeper than 64 frames keeps its innermost 64 (so
/// two depth-100 calls from different lines of main are one record), also
/// when it is captured by reusing part of a previous stack that was itself
/// cut at 64 (30 frames out from the bottom of a depth-100 recursion), and
/// stacks captured one after another that differ only in their inner frames
/// (depth 10, 11, 10, 11 from one line) are told apart exactly.
#[test]
fn deep_stacks_keep_64_frames_and_inner_changes_are_told_apart() {
    let dir = TestDir::new("deep_stacks");
    let prog = compile_c(&dir, "deep_stacks.c");
    let report = record_whole(&dir, &[], &prog, &[], "deep done\n");
    let src = "deep_stacks.c";
    let m = |marker: &str| marker_line(src, marker);
    let recs = records(&report);
    assert_eq!(
        recs.len(),
        5,
        "records: {:?}\n{}",
        record_summaries(&report),
        pretty(&report)
    );
    assert_eq!(unfreed_summary(&report), (80 + 48 + 48 + 56 + 64, 8));

    // leaf, the innermost down, then n more downs, then (if in view) main.
    let expected = |downs: usize, caller: Option<&str>| {
        let mut frames = vec![("leaf", src, m("LEAF")), ("down", src, m("DOWN-LEAF"))];
        frames.extend(std::iter::repeat_n(("down", src, m("DOWN")), downs));
        if let Some(marker) = caller {
            frames.push(("main", src, m(marker)));
        }
        frames
    };

    let deep = recs
        .iter()
        .find(|r| as_u64(r, "bytes") == 80)
        .unwrap_or_else(|| panic!("no 80-byte record: {:?}", record_summaries(&report)));
    assert_eq!(as_u64(deep, "blocks"), 2);
    let stack = stack_of(deep, "stack");
    assert_eq!(stack.len(), 64, "{}", show_stack(stack));
    assert_stack_top(stack, &expected(62, None), "deep record");

    // The way back: leaf, the down_back that called it, 62 more down_back.
    for (bytes, inner_marker) in [(56, "BACK-BOTTOM"), (64, "BACK-LEAF")] {
        let rec = recs
            .iter()
            .find(|r| as_u64(r, "bytes") == bytes)
            .unwrap_or_else(|| panic!("no {bytes}-byte record: {:?}", record_summaries(&report)));
        assert_eq!(as_u64(rec, "blocks"), 1);
        let stack = stack_of(rec, "stack");
        assert_eq!(stack.len(), 64, "{bytes} bytes: {}", show_stack(stack));
        let mut want = vec![
            ("leaf", src, m("LEAF")),
            ("down_back", src, m(inner_marker)),
        ];
        want.extend(std::iter::repeat_n(("down_back", src, m("BACK-DOWN")), 62));
        assert_stack_top(stack, &want, &format!("{bytes} bytes"));
    }

    for downs in [10, 11] {
        let want = expected(downs, Some("SHALLOW"));
        let found: Vec<&Value> = recs
            .iter()
            .filter(|r| {
                let stack = stack_of(r, "stack");
                stack.len() > want.len()
                    && stack[..want.len() + 1]
                        .iter()
                        .filter(|f| frame_function(f) == "down")
                        .count()
                        == downs + 1
                    && frame_function(&stack[want.len() - 1]) == "main"
            })
            .collect();
        assert_eq!(
            found.len(),
            1,
            "one record at depth {downs}: {:?}",
            record_summaries(&report)
        );
        assert_eq!(
            (as_u64(found[0], "bytes"), as_u64(found[0], "blocks")),
            (48, 2)
        );
        assert_stack_top(
            stack_of(found[0], "stack"),
            &want,
            &format!("depth {downs}"),
        );
    }
}

/// signal_fault.c at -O2: a block allocated in a SIGSEGV handler. Past the
/// signal frame, the faulting function is named at the faulting line (its
/// address is looked up as the interrupted instruction, not as a return
/// address, which would give the line before).
#[test]
fn the_frame_a_signal_interrupted_is_named_at_its_own_instruction() {
    let dir = TestDir::new("signal_fault");
    let prog = compile_c_with(&dir, "signal_fault.c", "signal_fault", &["-O2"]);
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "fault handled\n");
    let report = leaks_with(&dir.trace(), &["--kinds", "all"]);
    let rec = record_with_function(&report, "on_segv");
    assert_eq!((as_u64(rec, "bytes"), as_u64(rec, "blocks")), (77, 1));
    let stack = stack_of(rec, "stack");
    let src = "signal_fault.c";
    let m = |marker: &str| marker_line(src, marker);
    assert_stack_top(stack, &[("on_segv", src, m("HANDLER"))], "handler");
    assert_eq!(
        frame_function(&stack[1]),
        "__restore_rt",
        "{}",
        show_stack(stack)
    );
    assert_stack_top(
        &stack[2..],
        &[
            ("fault_here", src, m("FAULT")),
            ("main", src, m("CALL-FAULT")),
        ],
        "past the signal frame",
    );
}

/// altstack_handler.c: a block allocated in a handler on an alternate signal
/// stack, six frames deep (more than a page of it): the stack holds every
/// handler frame, the signal frame, and past it the interrupted code on the
/// thread's own stack, down to main. (It used to end within the page the
/// capture started on.)
/// Built with -DNO_ALTSTACK, the program sets no alternate stack but its
/// handler asks for SA_ONSTACK: it runs on the side stack the agent gives
/// such threads (agent.md, "Stack use and the side stack"), and the stack is the same.
#[test]
fn a_handler_on_an_alternate_signal_stack_is_unwound_into_the_interrupted_code() {
    for (name, flags) in [
        ("altstack_handler", &[][..]),
        ("altstack_handler_agent_stack", &["-DNO_ALTSTACK"][..]),
    ] {
        let dir = TestDir::new(name);
        let prog = compile_c_with(&dir, "altstack_handler.c", name, flags);
        check_altstack_handler(&dir, &prog);
    }
}

fn check_altstack_handler(dir: &TestDir, prog: &std::path::Path) {
    let run = run(dir, &[], prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "altstack done\n");
    let report = leaks_with(&dir.trace(), &["--kinds", "all"]);
    let rec = record_with_function(&report, "deep");
    assert_eq!((as_u64(rec, "bytes"), as_u64(rec, "blocks")), (321, 1));
    let stack = stack_of(rec, "stack");
    let src = "altstack_handler.c";
    let m = |marker: &str| marker_line(src, marker);
    let mut handler = vec![("deep", src, m("ALT-LEAK"))];
    handler.extend([("deep", src, m("ALT-DEEP")); 5]);
    handler.push(("on_usr1", src, m("ALT-HANDLER")));
    assert_stack_top(stack, &handler, "on the alternate stack");
    let shown = show_stack(stack);
    assert_eq!(frame_function(&stack[7]), "__restore_rt", "{shown}");
    let interrupted = stack
        .iter()
        .position(|f| frame_function(f) == "interrupted_here")
        .unwrap_or_else(|| panic!("no interrupted_here past the signal frame: {shown}"));
    assert_stack_top(
        &stack[interrupted..],
        &[
            ("interrupted_here", src, m("ALT-RAISE")),
            ("main", src, m("ALT-CALL")),
        ],
        "on the thread's own stack",
    );
}

/// unwind_shapes.c at -O2: stacks through stack-pointer rules, a frame
/// pointer (alloca), a frame over 64 KiB (not held by the shared rule
/// table), glibc's qsort and a signal frame come out with exact functions
/// and lines, and identical whether the shared rule table or framehop alone
/// unwinds them (TRAPLINE_RULE_TABLE=0), except past the signal frame, which
/// only the rule table unwinds.
#[test]
fn every_unwind_rule_shape_gives_exact_stacks_with_and_without_the_rule_table() {
    let dir = TestDir::new("unwind_shapes");
    let prog = compile_c_with(&dir, "unwind_shapes.c", "unwind_shapes", &["-O2"]);
    type Frame = (String, String, Option<u64>, bool);
    // A recording's report, and its records as comparable values.
    let record = |table: &str| -> (Value, Vec<(u64, u64, Vec<Frame>)>) {
        let mut cmd = run_command(&dir, &[], &prog, &[]);
        cmd.env("TRAPLINE_RULE_TABLE", table);
        let run = output_of(cmd, "trapline run");
        assert_eq!(run.code(), 0, "{}", run.describe());
        assert_eq!(run.stdout, "shapes done\n");
        assert_no_events_lost_in_summary(&run);
        let report = leaks_with(&dir.trace(), &["--kinds", "all"]);
        assert_complete(&report);
        let mut recs: Vec<(u64, u64, Vec<Frame>)> = records(&report)
            .iter()
            .map(|r| {
                let frames = stack_of(r, "stack")
                    .iter()
                    .map(|f| {
                        (
                            frame_function(f).to_owned(),
                            basename(f.get("file")).to_owned(),
                            f.get("line").and_then(Value::as_u64),
                            f.get("inlined") == Some(&Value::Bool(true)),
                        )
                    })
                    .collect();
                (as_u64(r, "bytes"), as_u64(r, "blocks"), frames)
            })
            .collect();
        recs.sort();
        (report, recs)
    };
    let (report, with_table) = record("1");
    let (_, framehop_only) = record("0");
    // framehop cannot unwind the signal frame (its CFA is an expression that
    // reads memory) and stops there; the rule table continues past it.
    let apart_from_signal = |recs: &[(u64, u64, Vec<Frame>)]| -> Vec<(u64, u64, Vec<Frame>)> {
        recs.iter().filter(|r| r.0 != 1010).cloned().collect()
    };
    assert_eq!(
        apart_from_signal(&with_table),
        apart_from_signal(&framehop_only)
    );

    let src = "unwind_shapes.c";
    let m = |marker: &str| marker_line(src, marker);
    let sizes: Vec<(u64, u64)> = with_table.iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(sizes, [(202, 2), (404, 2), (606, 2), (808, 2), (1010, 2)]);
    let stack = |bytes: u64| {
        let r = records(&report)
            .iter()
            .find(|r| as_u64(r, "bytes") == bytes)
            .unwrap_or_else(|| panic!("no {bytes}-byte record: {}", pretty(&report)));
        stack_of(r, "stack")
    };
    assert_stack_top(
        stack(202),
        &[
            ("sp_c", src, m("SP-C")),
            ("sp_b", src, m("SP-B")),
            ("sp_a", src, m("SP-A")),
            ("main", src, m("MAIN-SP")),
        ],
        "stack-pointer rules",
    );
    assert_stack_top(
        stack(404),
        &[
            ("with_alloca", src, m("ALLOCA")),
            ("main", src, m("MAIN-ALLOCA")),
        ],
        "frame pointer",
    );
    assert_stack_top(
        stack(606),
        &[
            ("huge_frame", src, m("HUGE")),
            ("main", src, m("MAIN-HUGE")),
        ],
        "frame over 64 KiB",
    );
    assert_stack_top(stack(1010), &[("on_signal", src, m("SIGNAL"))], "signal");
    // Past the handler: the signal frame (glibc's __restore_rt, named
    // although the byte before it, where return addresses are looked up, has
    // no symbol), the frames raise was in when the signal arrived, then main
    // at the raise call.
    let handled = stack(1010);
    let shown = show_stack(handled);
    assert_eq!(frame_function(&handled[1]), "__restore_rt", "{shown}");
    let main = handled
        .iter()
        .position(|f| frame_function(f) == "main")
        .unwrap_or_else(|| panic!("no main past the signal frame: {shown}"));
    assert_stack_top(&handled[main..], &[("main", src, m("MAIN-RAISE"))], &shown);
    assert!(
        handled[2..main]
            .iter()
            .any(|f| frame_function(f).contains("raise")),
        "{shown}"
    );
    let signal_top =
        |recs: &[(u64, u64, Vec<Frame>)]| recs.iter().find(|r| r.0 == 1010).unwrap().2[0].clone();
    assert_eq!(signal_top(&framehop_only), signal_top(&with_table));

    // The comparator, glibc's sort frames, qsort itself, then main.
    let sort = stack(808);
    let shown = show_stack(sort);
    assert_stack_top(sort, &[("compare_and_keep", src, m("COMPARE"))], &shown);
    let qsort = sort
        .iter()
        .position(|f| frame_function(f).contains("qsort"))
        .unwrap_or_else(|| panic!("no qsort frame: {shown}"));
    assert!(qsort > 1, "glibc's sort frames come before qsort: {shown}");
    assert_stack_top(
        &sort[qsort + 1..],
        &[("main", src, m("MAIN-QSORT"))],
        &shown,
    );
}

/// dl_rules.c: a library is loaded, unwound through, and closed; a second
/// build with the same return addresses but other frame sizes is loaded at
/// the same address. The 48-byte block it leaks has its exact stack (rules
/// remembered for the first build would have made garbage of it).
#[test]
fn unwind_rules_follow_dlclose_and_dlopen_at_the_same_address() {
    let dir = TestDir::new("dl_rules");
    let prog = compile_c(&dir, "dl_rules.c");
    let lib_flags = |pad: &'static str| ["-O2", "-fPIC", "-shared", "-Wl,-z,noseparate-code", pad];
    let first = compile_c_with(&dir, "dl_rules_lib.c", "lib8.so", &lib_flags("-DPAD=8"));
    let second = compile_c_with(&dir, "dl_rules_lib.c", "lib72.so", &lib_flags("-DPAD=72"));
    // The kernel picks the second address; a mapping the agent made in
    // between may have taken the first one's place (it did on a CI machine,
    // where the gap the first build left was larger). Run again until the
    // second build reuses the address: only such a run tests anything.
    let args = [first.to_str().unwrap(), second.to_str().unwrap()];
    let reused = (0..8).find_map(|_| {
        let run = run(&dir, &[], &prog, &args);
        assert_eq!(run.code(), 0, "{}", run.describe());
        assert!(run.stdout.ends_with("dl done\n"), "{}", run.stdout);
        let bases = printed_addresses(&run.stdout);
        (bases.get("BASE1") == bases.get("BASE2")).then_some(())
    });
    assert!(
        reused.is_some(),
        "in 8 runs the second build never reused the first one's address"
    );

    let report = leaks(&dir.trace());
    assert_complete(&report);
    // The loader's own blocks for the library still open are records too.
    let rec = record_with_function(&report, "lib_inner");
    assert_eq!((as_u64(rec, "bytes"), as_u64(rec, "blocks")), (48, 1));
    let lib = "dl_rules_lib.c";
    assert_stack_top(
        stack_of(rec, "stack"),
        &[
            ("lib_inner", lib, marker_line(lib, "LIB-INNER")),
            ("lib_outer", lib, marker_line(lib, "LIB-OUTER")),
            ("main", "dl_rules.c", marker_line("dl_rules.c", "SECOND")),
            ("__libc_start_call_main", "libc_start_call_main.h", 58),
        ],
        "second build",
    );
}

/// small_stacks.c: threads with 16 KiB stacks (PTHREAD_STACK_MIN) allocate,
/// lock, take a signal on a 16 KiB alternate stack, and one ends the process
/// with exit() from its small stack. The agent's deep work (thread set-up,
/// CFI evaluation, framehop's caches, the exit scan and flush) needs more
/// stack than that; it used to overflow it (SIGSEGV in the first hooked call
/// of the thread: node's worker threads died the same way). With and
/// without the shared rule table (framehop then unwinds every frame).
#[test]
fn threads_with_the_smallest_stacks_are_traced_to_the_end() {
    let dir = TestDir::new("small_stacks");
    let prog = compile_c(&dir, "small_stacks.c");
    let src = "small_stacks.c";
    let m = |marker: &str| marker_line(src, marker);
    for table in ["1", "0"] {
        let mut cmd = run_command(&dir, &[], &prog, &[]);
        cmd.env("TRAPLINE_RULE_TABLE", table);
        let run = output_of(cmd, "trapline run small_stacks");
        assert_eq!(run.code(), 3, "rule table {table}: {}", run.describe());
        assert_eq!(run.stdout, "small stacks done\n");
        assert_no_events_lost_in_summary(&run);
        let report = leaks(&dir.trace());
        assert_complete(&report);
        assert_eq!(process_exit(&report), &json!({"code": 3}));
        assert_eq!(errors(&report).len(), 0, "{}", pretty(&report));
        let got = records(&report);
        assert_eq!(got.len(), 4, "{:?}", record_summaries(&report));
        // main is still alive (joining the ender), so the C library's freeres
        // does not run at exit (it assumes a single thread): stdout's buffer
        // stays, and so do the TLS vectors of the thread still running and
        // of the three ended ones whose stacks glibc caches (the ender took
        // the fourth).
        let stdout_buffer = &got[0];
        let buffer_stack = show_stack(stack_of(stdout_buffer, "stack"));
        assert_eq!(
            (
                as_u64(stdout_buffer, "bytes"),
                as_u64(stdout_buffer, "blocks")
            ),
            (4096, 1),
            "{buffer_stack}"
        );
        assert!(
            buffer_stack.contains("_IO_file_doallocate"),
            "{buffer_stack}"
        );
        let dtv = &got[1];
        let dtv_stack = show_stack(stack_of(dtv, "stack"));
        assert_eq!(
            (as_u64(dtv, "blocks"), as_str(dtv, "allocated_by")),
            (4, "calloc"),
            "{dtv_stack}"
        );
        assert!(dtv_stack.contains("allocate_dtv"), "{dtv_stack}");
        assert_eq!(
            (as_u64(&got[2], "bytes"), as_u64(&got[2], "blocks")),
            (5 * 48, 5)
        );
        assert_stack_top(
            stack_of(&got[2], "stack"),
            &[
                ("leak_here", src, m("SMALL-LEAK")),
                ("worker", src, m("CALL-SMALL-LEAK")),
            ],
            "leak_here",
        );
        assert_eq!(
            (as_u64(&got[3], "bytes"), as_u64(&got[3], "blocks")),
            (5 * 24, 5)
        );
        let handler = stack_of(&got[3], "stack");
        assert_stack_top(handler, &[("on_signal", src, m("HANDLER-LEAK"))], "handler");
        // framehop alone stops at the signal frame (unwind_shapes above).
        if table == "1" {
            let raised = handler
                .iter()
                .position(|f| frame_function(f) == "worker")
                .unwrap_or_else(|| {
                    panic!("no worker past the signal frame: {}", show_stack(handler))
                });
            assert_stack_top(
                &handler[raised..],
                &[("worker", src, m("CALL-RAISE"))],
                "past the signal frame",
            );
        }
        assert_eq!(
            unfreed_summary(&report),
            (4096 + as_u64(dtv, "bytes") + 5 * 48 + 5 * 24, 15)
        );
    }
}

/// own_malloc.c: an executable with an allocator of its own (as a Rust
/// program with jemalloc or mimalloc has), which a library's constructor
/// calls before the agent's constructor has run. The allocator takes a
/// mutex: the agent's lock hook runs inside it on a thread with no agent
/// state yet, and used to create that state with pthread_getattr_np, whose
/// fopen called this malloc again and waited for its own lock forever
/// (rustc hung so). Every module's malloc binds to the executable's, so
/// the agent detours its entry points (runtime/inline_alloc.rs): the
/// program's calls are recorded, exactly, and no report warns.
#[test]
fn a_program_with_its_own_allocator_is_traced_through_its_entry_points() {
    let dir = TestDir::new("own_malloc");
    let lib = compile_c_library(&dir, "own_malloc_lib.c", "libown_malloc_lib.so");
    let prog = compile_c_linked_to(&dir, "own_malloc.c", &lib);
    // Bounded: the old agent never returned.
    let run = run(&dir, &["--timeout", "60"], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "own malloc done: 3 blocks\n");
    assert!(
        !run.stderr.contains("allocator of its own"),
        "{}",
        run.describe()
    );

    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(
        field(&report, "trace")["allocator_shadowed_by"],
        json!(null),
        "{}",
        pretty(&report)
    );
    assert_eq!(records(&report).len(), 0);
    // main's malloc, calloc and realloc, stdout's buffer; the library
    // constructor's block came before the agent.
    let stats = analysis_json("stats", &dir.trace());
    assert_eq!(
        stats["calls"],
        json!([
            {"function": "malloc", "calls": 2, "bytes": 4196, "failed": 0},
            {"function": "calloc", "calls": 1, "bytes": 100, "failed": 0},
            {"function": "realloc", "calls": 1, "bytes": 300, "failed": 0},
            {"function": "free", "calls": 3, "bytes": 0, "failed": 0},
        ])
    );
}

/// malloc_address.c, built without PIE: taking the address of malloc makes
/// the executable export it (an undefined symbol with a PLT stub as its
/// value), as node and gcc's cc1plus do. dlsym then names the executable,
/// but its calls reach the agent: no allocator-of-its-own warning (both
/// used to get one), and the blocks are recorded.
#[test]
fn taking_the_address_of_malloc_is_no_allocator_of_its_own() {
    let dir = TestDir::new("malloc_address");
    let prog = compile_c_with(
        &dir,
        "malloc_address.c",
        "malloc_address",
        &["-no-pie", "-fno-pie"],
    );
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "through pointers\n");
    assert!(
        !run.stderr.contains("allocator of its own"),
        "{}",
        run.describe()
    );
    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(
        field(&report, "trace")["allocator_shadowed_by"],
        json!(null)
    );
    assert_eq!(field(&report, "trace")["allocator_library"], json!(null));
    let src = "malloc_address.c";
    assert_records(
        &report,
        &[ExpectedRecord {
            bytes: 40,
            blocks: 1,
            allocated_by: "malloc",
            stack: vec![("main", src, marker_line(src, "ADDRESS-LEAK"))],
        }],
    );
}

/// allocator_maps_full.c on jemalloc without retained memory: 5,000 blocks
/// of 4 MiB, each a mapping of jemalloc's own, more than the agent's table
/// of the allocator's mappings holds (4,096). The scan reads the mappings it
/// could not note as roots, where jemalloc's metadata names blocks, so leaks
/// can be missed: the report says how many (it said nothing before). With
/// 1,000 blocks the table holds them all and nothing is said.
#[test]
fn allocator_mappings_read_as_roots_are_counted() {
    let dir = TestDir::new("allocator_maps_full");
    let prog = compile_c_with(
        &dir,
        "allocator_maps_full.c",
        "allocator_maps_full",
        &["-Wl,--no-as-needed", "-ljemalloc"],
    );
    for (blocks, over) in [(5000u64, true), (1000, false)] {
        let mut cmd = run_command(&dir, &[], &prog, &[&blocks.to_string()]);
        cmd.env("MALLOC_CONF", "retain:false");
        let run = output_of(cmd, "allocator_maps_full");
        assert_eq!(run.code(), 0, "{}", run.describe());
        assert_eq!(run.stdout, format!("kept {blocks}\n"));
        let report = leaks(&dir.trace());
        assert_complete(&report);
        let scan = &report["scan"];
        assert_eq!(as_u64(scan, "blocks"), blocks + 1, "{}", pretty(scan));
        let not_excluded = as_u64(scan, "mappings_not_excluded");
        let text = leaks_text(&dir.trace(), &[]);
        let digits = not_excluded.to_string();
        let grouped = match digits.len() {
            4..=6 => format!(
                "{},{}",
                &digits[..digits.len() - 3],
                &digits[digits.len() - 3..]
            ),
            _ => digits,
        };
        let warning =
            format!("WARNING: {grouped} mappings of the allocator or the agent read as roots");
        if over {
            // One mapping per block at least, less the table's 4,096 slots.
            assert!(not_excluded >= blocks - 4096, "{}", pretty(scan));
            assert!(not_excluded <= blocks, "{}", pretty(scan));
            assert!(text.contains(&warning), "{text}");
        } else {
            assert_eq!(not_excluded, 0, "{}", pretty(scan));
            assert!(!text.contains("read as roots"), "{text}");
        }
    }
}

/// next_allocator.c on jemalloc, linked and preloaded after the agent: the
/// agent passes every call on to jemalloc (jemalloc's own counters see each
/// allocation function and free), malloc_usable_size is jemalloc's, and a
/// block from malloc can be released with jemalloc's sdallocx. The old agent
/// forwarded to glibc: the program ran on another allocator under trapline,
/// and sdallocx of a glibc block crashed it. jemalloc's own interface is
/// trapped: mallocx and rallocx blocks are listed under their function, a
/// block xallocx shrank in place has its new size, a failed xallocx changes
/// nothing, and a second dallocx is a double free naming the first. 72,000
/// live 8-byte blocks, half of them only 8-aligned, are all accounted for
/// (the agent used to keep 16-aligned blocks only: the others overflowed its
/// untracked set, were lost, and their frees were taken for invalid ones).
/// Every report names the library (agent.md, "Trapping limits").
#[test]
fn calls_reach_the_programs_own_allocator_library_linked_or_preloaded() {
    let jemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
    assert!(
        std::path::Path::new(jemalloc).is_file(),
        "{jemalloc} is missing: apt-get install libjemalloc-dev (.ci/run does)"
    );
    let dir = TestDir::new("next_allocator");
    let linked = compile_c_with(
        &dir,
        "next_allocator.c",
        "next_allocator_linked",
        &["-Wl,--no-as-needed", "-ljemalloc"],
    );
    let plain = compile_c_with(&dir, "next_allocator.c", "next_allocator", &[]);
    // jemalloc linked into the executable (its archive), its functions
    // exported for the program's dlsym: detoured (runtime/inline_alloc.rs).
    let archive = "/usr/lib/x86_64-linux-gnu/libjemalloc.a";
    let inside = compile_c_with(
        &dir,
        "next_allocator.c",
        "next_allocator_static_jemalloc",
        &[
            "-rdynamic",
            "-Wl,--whole-archive",
            archive,
            "-Wl,--no-whole-archive",
            "-lpthread",
            "-lm",
            "-ldl",
            "-lstdc++",
        ],
    );
    let src = "next_allocator.c";
    let line = |marker| marker_line(src, marker);
    for (program, preload) in [(&linked, None), (&plain, Some(jemalloc)), (&inside, None)] {
        let run = run_preloading(&dir, program, preload);
        let shrunk: u64 = run
            .stdout
            .strip_prefix("all through jemalloc; xallocx gave ")
            .and_then(|rest| rest.trim_end().parse().ok())
            .unwrap_or_else(|| panic!("{}", run.describe()));
        let note = "NOTE: the program's allocator is ";
        let report = leaks(&dir.trace());
        assert_complete(&report);
        if program == &inside {
            // No library: the allocator is the executable's, traced.
            assert!(!run.stderr.contains(note), "{}", run.describe());
            assert!(
                !run.stderr.contains("allocator of its own"),
                "{}",
                run.describe()
            );
            assert_eq!(field(&report, "trace")["allocator_library"], json!(null));
            assert_eq!(
                field(&report, "trace")["allocator_shadowed_by"],
                json!(null)
            );
        } else {
            assert!(run.stderr.contains(note), "{}", run.describe());
            let library = as_str(field(&report, "trace"), "allocator_library");
            assert!(library.ends_with("/libjemalloc.so.2"), "{library}");
            assert!(leaks_text(&dir.trace(), &[]).contains(&format!("{note}{library}")));
        }
        let one = |bytes, allocated_by, marker| ExpectedRecord {
            bytes,
            blocks: 1,
            allocated_by,
            stack: vec![("main", src, line(marker))],
        };
        assert_records(
            &report,
            &[
                ExpectedRecord {
                    bytes: 72_000 * 8,
                    blocks: 72_000,
                    allocated_by: "malloc",
                    stack: vec![("main", src, line("SMALL-KEEP"))],
                },
                one(shrunk, "xallocx", "XALLOCX-LEAK"),
                one(700, "rallocx", "RALLOCX-LEAK"),
                one(300, "mallocx", "MALLOCX-LEAK"),
                one(123, "malloc", "NEXT-ALLOCATOR-LEAK"),
                one(20, "malloc", "XALLOCX-FAILED"),
            ],
        );
        let errs = errors(&report);
        assert_eq!(errs.len(), 1, "{}", pretty(&report));
        let double = &errs[0];
        assert_eq!(
            (
                as_str(double, "kind"),
                as_str(double, "function"),
                as_str(double, "alloc_function"),
                as_str(double, "free_function"),
                as_u64(double, "alloc_size"),
            ),
            ("double_free", "dallocx", "mallocx", "dallocx", 40),
        );
        assert_stack_top(
            stack_of(double, "stack"),
            &[("main", src, line("DOUBLE-DALLOCX"))],
            "stack",
        );
        assert_stack_top(
            stack_of(double, "free_stack"),
            &[("main", src, line("FIRST-DALLOCX"))],
            "free_stack",
        );
        assert_stack_top(
            stack_of(double, "alloc_stack"),
            &[("main", src, line("TWICE-ALLOC"))],
            "alloc_stack",
        );
        let stats = stats(&dir.trace());
        // The agent's own totals (xallocx's resize included) equal the replay's.
        assert_eq!(stats["agent_totals_match"], json!(true));
        let want = [
            ("mallocx", 3),
            ("rallocx", 2),
            ("xallocx", 1),
            ("sdallocx", 2),
            ("dallocx", 3),
        ];
        assert_calls(&stats, |f| f.ends_with("allocx"), &want);
    }
}

/// free_sized.c: C23's `free_sized` and `free_aligned_sized` are trapped and
/// checked like `free` (glibc 2.41 defines them; before it, the agent's own
/// definitions release with `free`), and the agent's failed lookups of them
/// leave nothing for the program's `dlerror()`. Untrapped, their blocks
/// stayed listed as live and were reported as leaks.
#[test]
fn c23_sized_releases_are_trapped() {
    let dir = TestDir::new("free_sized");
    let prog = compile_c(&dir, "free_sized.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "sized: 2\n");
    let report = leaks(&dir.trace());
    assert_complete(&report);
    let src = "free_sized.c";
    assert_records(
        &report,
        &[ExpectedRecord {
            bytes: 24,
            blocks: 1,
            allocated_by: "malloc",
            stack: vec![("main", src, marker_line(src, "FREE-SIZED-LEAK"))],
        }],
    );
    assert_eq!(errors(&report).len(), 0, "{}", pretty(&report));
    let want = [("free_sized", 1), ("free_aligned_sized", 1)];
    assert_calls(&stats(&dir.trace()), |f| f.starts_with("free_"), &want);
}

/// `trapline run` of `program` with `preload` in LD_PRELOAD (after the
/// agent), which must exit 0.
fn run_preloading(dir: &TestDir, program: &std::path::Path, preload: Option<&str>) -> Finished {
    let mut cmd = run_command(dir, &[], program, &[]);
    if let Some(lib) = preload {
        cmd.env("LD_PRELOAD", lib);
    }
    let run = output_of(cmd, "trapline run");
    assert_eq!(run.code(), 0, "{}", run.describe());
    run
}

/// The leak reports of `plain` run with glibc's malloc and with jemalloc
/// preloaded, and of `linked` (linked with jemalloc), each named for the
/// assertion messages; every run must print "done".
fn reports_under_each_allocator(
    dir: &TestDir,
    plain: &std::path::Path,
    linked: &std::path::Path,
) -> Vec<(String, Value)> {
    let jemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
    [(plain, None), (linked, None), (plain, Some(jemalloc))]
        .into_iter()
        .map(|(program, preload)| {
            let run = run_preloading(dir, program, preload);
            assert_eq!(run.stdout, "done\n");
            let report = leaks(&dir.trace());
            assert_complete(&report);
            (format!("{preload:?} {}", program.display()), report)
        })
        .collect()
}

/// Each loss record's kind, bytes and the line of its innermost frame.
fn kinds_bytes_lines(report: &Value) -> Vec<(String, u64, u64)> {
    records(report)
        .iter()
        .map(|r| {
            let top = stack_of(r, "stack").first();
            let line = top.and_then(|f| f["line"].as_u64()).unwrap_or(0);
            (as_str(r, "kind").to_owned(), as_u64(r, "bytes"), line)
        })
        .collect()
}

/// Asserts the calls of the functions `which` picks in a `trapline stats`
/// report, in format order.
fn assert_calls(stats: &Value, which: impl Fn(&str) -> bool, want: &[(&str, u64)]) {
    let got: Vec<(&str, u64)> = as_array(stats, "calls")
        .iter()
        .map(|c| (as_str(c, "function"), as_u64(c, "calls")))
        .filter(|(f, _)| which(f))
        .collect();
    assert_eq!(got, want, "calls per function");
}

/// allocator_leaks.c with glibc's malloc and with jemalloc, linked and
/// preloaded: the same verdicts each time. Under jemalloc every block used
/// to be "still reachable", through the addresses jemalloc keeps in its own
/// anonymous mappings; the agent now notes the mappings the allocator's code
/// makes and the exit scan leaves them out of its roots, while a block held
/// only in the program's own mapping stays reachable.
#[test]
fn leaks_under_an_allocator_library_are_found_lost() {
    let dir = TestDir::new("allocator_leaks");
    let linked = compile_c_with(
        &dir,
        "allocator_leaks.c",
        "allocator_leaks_linked",
        &["-Wl,--no-as-needed", "-ljemalloc"],
    );
    let plain = compile_c_with(&dir, "allocator_leaks.c", "allocator_leaks", &[]);
    let src = "allocator_leaks.c";
    let line = |marker| marker_line(src, marker);
    for (label, report) in reports_under_each_allocator(&dir, &plain, &linked) {
        let got = kinds_bytes_lines(&report);
        let lost = |bytes| ("definitely_lost".to_owned(), bytes, line("LOST"));
        let reachable = |bytes, marker| ("still_reachable".to_owned(), bytes, line(marker));
        assert_eq!(
            got,
            [
                lost(3_000_000),
                lost(100_000),
                lost(5000),
                reachable(456, "MAPPED"),
                reachable(123, "KEPT"),
                lost(64),
            ],
            "{label}"
        );
    }
}

/// allocator_tls.c with glibc's malloc and with jemalloc, linked and
/// preloaded: the two 1 GiB blocks (one from the main thread, one from a
/// worker blocked at exit) are definitely lost. Under jemalloc they were
/// both "possibly lost": the exit scan read jemalloc's thread state in each
/// thread's static TLS, where the radix-tree cache keeps the key of the
/// block's last page (its address masked to 1 GiB, inside the block), as
/// a root.
#[test]
fn the_allocator_librarys_thread_state_is_no_root() {
    let dir = TestDir::new("allocator_tls");
    let flags = ["-pthread", "-Wl,--no-as-needed", "-ljemalloc"];
    let linked = compile_c_with(&dir, "allocator_tls.c", "allocator_tls_linked", &flags);
    let plain = compile_c_with(&dir, "allocator_tls.c", "allocator_tls", &["-pthread"]);
    let src = "allocator_tls.c";
    let lost = (
        "definitely_lost".to_owned(),
        1u64 << 30,
        marker_line(src, "LOST"),
    );
    for (label, report) in reports_under_each_allocator(&dir, &plain, &linked) {
        let mut got = kinds_bytes_lines(&report);
        got.retain(|(kind, _, _)| kind != "still_reachable");
        assert_eq!(got, [lost.clone(), lost.clone()], "{label}");
    }
}

/// weak_jemalloc_api.c, without jemalloc: the agent defines jemalloc's
/// mallocx, rallocx, xallocx, sdallocx and dallocx (to trap jemalloc's), so
/// the program's weak references find them; they must serve the program as
/// jemalloc would (alignment and zeroing flags, a resize in place that
/// cannot grow) on the C library's allocator, and their calls are recorded.
#[test]
fn jemalloc_api_without_jemalloc_is_served_by_the_c_library() {
    let dir = TestDir::new("weak_jemalloc_api");
    let prog = compile_c(&dir, "weak_jemalloc_api.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "released\n");
    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(unfreed_summary(&report), (0, 0), "{}", pretty(&report));
    assert_eq!(errors(&report).len(), 0, "{}", pretty(&report));
    assert_eq!(field(&report, "trace")["allocator_library"], json!(null));
    let want = [
        ("mallocx", 1),
        ("rallocx", 2),
        ("sdallocx", 1),
        ("dallocx", 1),
    ];
    assert_calls(&stats(&dir.trace()), |f| f.ends_with("allocx"), &want);
}

/// `trapline run --error-exitcode N`, as memcheck's: N for a run that
/// leaked, the command's own status for one that did not, with or without
/// the summary.
#[test]
fn run_error_exitcode_fails_a_leaking_run_only() {
    let dir = TestDir::new("run_error_exitcode");
    let leaky = compile_c(&dir, "leaks.c");
    let clean = compile_c(&dir, "clean.c");
    for flags in [
        &["--error-exitcode", "9"][..],
        &["--error-exitcode", "9", "-q"],
    ] {
        let r = run(&dir, flags, &leaky, &[]);
        assert_eq!(r.code(), 9, "{}", r.describe());
        let r = run(&dir, flags, &clean, &[]);
        assert_eq!(r.code(), 0, "{}", r.describe());
    }
}
