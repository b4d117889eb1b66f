//! End-to-end: process trees (fork, exec), and every way a process can end
//! (return, exit, _exit, exit from another thread, abort, a crash, a signal).

mod common;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Stdio;

fn single_leak(
    report: &Value,
    src: &str,
    bytes: u64,
    function: &str,
    marker: &str,
    call_marker: &str,
) {
    assert_records(
        report,
        &[ExpectedRecord {
            bytes,
            blocks: 1,
            allocated_by: "malloc",
            stack: vec![
                (function, src, marker_line(src, marker)),
                ("main", src, marker_line(src, call_marker)),
            ],
        }],
    );
}

fn file_name(path: &Path) -> &str {
    path.file_name().and_then(|n| n.to_str()).unwrap()
}

/// fork_exec.c: the parent, the child before exec and the exec'd image each
/// get a trace with exactly their own leak.
#[test]
fn fork_and_exec_give_one_trace_per_process_image() {
    let dir = TestDir::new("fork_exec");
    let prog = compile_c(&dir, "fork_exec.c");
    let target = compile_c(&dir, "exec_target.c");
    let run = run(&dir, &[], &prog, &[target.to_str().unwrap()]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    // "parent PID child PID"
    let words: Vec<&str> = run.stdout.split_whitespace().collect();
    assert!(
        words.len() == 4 && words[0] == "parent" && words[2] == "child",
        "{}",
        run.describe()
    );
    let parent_pid: u64 = words[1].parse().unwrap();
    let child_pid: u64 = words[3].parse().unwrap();
    assert_no_events_lost_in_summary(&run);

    assert!(dir.trace().is_file(), "no top trace");
    let others = dir.other_traces();
    assert_eq!(
        others.len(),
        2,
        "traces of the other process images: {others:?}"
    );
    assert_summary_names(&run, &dir.trace());
    for other in &others {
        assert_summary_names(&run, other);
    }
    assert!(
        others
            .iter()
            .any(|p| file_name(p) == format!("t.trace.{child_pid}")),
        "no t.trace.{child_pid} among {others:?}"
    );

    // The parent: its 11 bytes only (allocated after the fork).
    let parent = leaks(&dir.trace());
    assert_complete(&parent);
    assert_eq!(process_pid(&parent), parent_pid);
    assert_eq!(
        process_command(&parent),
        [prog.to_str().unwrap(), target.to_str().unwrap()]
    );
    assert_eq!(process_exit(&parent), &json!({"code": 0}));
    single_leak(
        &parent,
        "fork_exec.c",
        11,
        "parent_leak",
        "PARENT-LEAK",
        "CALL-PARENT-LEAK",
    );

    let reports: Vec<Value> = others.iter().map(|p| leaks(p)).collect();
    let exec_name = |r: &Value| {
        process_command(r)
            .first()
            .map(|c| c.rsplit('/').next().unwrap().to_owned())
    };
    let before_exec: Vec<&Value> = reports
        .iter()
        .filter(|r| exec_name(r).as_deref() == Some("fork_exec"))
        .collect();
    let after_exec: Vec<&Value> = reports
        .iter()
        .filter(|r| exec_name(r).as_deref() == Some("exec_target"))
        .collect();
    assert_eq!(
        (before_exec.len(), after_exec.len()),
        (1, 1),
        "commands: {:?}",
        reports.iter().map(process_command).collect::<Vec<_>>()
    );

    // The child until its exec: the 22 bytes it leaked.
    let child = before_exec[0];
    assert_complete(child);
    assert_eq!(process_pid(child), child_pid);
    assert_eq!(
        process_exit(child),
        &json!({"exec": true}),
        "the child image ended by exec"
    );
    single_leak(
        child,
        "fork_exec.c",
        22,
        "child_leak",
        "CHILD-LEAK",
        "CALL-CHILD-LEAK",
    );

    // The exec'd image: same pid, its own 33 bytes, exit status 7.
    let exec = after_exec[0];
    assert_complete(exec);
    assert_eq!(process_pid(exec), child_pid);
    assert_eq!(process_command(exec), [target.to_str().unwrap()]);
    assert_eq!(process_exit(exec), &json!({"code": 7}));
    single_leak(
        exec,
        "exec_target.c",
        33,
        "exec_leak",
        "EXEC-LEAK",
        "CALL-EXEC-LEAK",
    );
}

/// --no-follow: only the top process is traced.
#[test]
fn no_follow_traces_only_the_top_process() {
    let dir = TestDir::new("fork_exec_no_follow");
    let prog = compile_c(&dir, "fork_exec.c");
    let target = compile_c(&dir, "exec_target.c");
    let run = run(&dir, &["--no-follow"], &prog, &[target.to_str().unwrap()]);
    // The child still runs (and execs) normally: the parent checks its status 7.
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_no_events_lost_in_summary(&run);
    assert_eq!(
        dir.other_traces(),
        Vec::<std::path::PathBuf>::new(),
        "traces besides the top one"
    );
    let parent = leaks(&dir.trace());
    assert_complete(&parent);
    assert_eq!(process_exit(&parent), &json!({"code": 0}));
    single_leak(
        &parent,
        "fork_exec.c",
        11,
        "parent_leak",
        "PARENT-LEAK",
        "CALL-PARENT-LEAK",
    );
}

/// crash.c: killed by SIGSEGV after leaking; the trace is still complete.
#[test]
fn segfault_exit_139_and_trace_kept() {
    let dir = TestDir::new("crash");
    let prog = compile_c(&dir, "crash.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 139, "{}", run.describe());
    assert_no_events_lost_in_summary(&run);
    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(process_exit(&report), &json!({"signal": 11}));
    single_leak(
        &report,
        "crash.c",
        77,
        "crash_leak",
        "CRASH-LEAK",
        "CALL-CRASH-LEAK",
    );
}

fn exit_path(mode: &str, expected_status: i32, expected_exit: Value) -> Value {
    let dir = TestDir::new(&format!("exit_paths_{}", mode.replace('-', "_")));
    let prog = compile_c(&dir, "exit_paths.c");
    let run = run(&dir, &[], &prog, &[mode]);
    assert_eq!(
        run.code(),
        expected_status,
        "mode {mode}: {}",
        run.describe()
    );
    assert_no_events_lost_in_summary(&run);
    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(process_exit(&report), &expected_exit, "mode {mode}");
    assert_eq!(process_command(&report), [prog.to_str().unwrap(), mode]);
    report
}

#[test]
fn exit_by_return_from_main() {
    let report = exit_path("return", 0, json!({"code": 0}));
    single_leak(
        &report,
        "exit_paths.c",
        41,
        "leak_before_exit",
        "EXIT-LEAK",
        "CALL-EXIT-LEAK",
    );
}

#[test]
fn exit_by_exit() {
    let report = exit_path("exit", 3, json!({"code": 3}));
    single_leak(
        &report,
        "exit_paths.c",
        41,
        "leak_before_exit",
        "EXIT-LEAK",
        "CALL-EXIT-LEAK",
    );
}

#[test]
fn exit_by_underscore_exit() {
    let report = exit_path("_exit", 4, json!({"code": 4}));
    single_leak(
        &report,
        "exit_paths.c",
        41,
        "leak_before_exit",
        "EXIT-LEAK",
        "CALL-EXIT-LEAK",
    );
}

#[test]
fn exit_by_abort() {
    let report = exit_path("abort", 134, json!({"signal": 6}));
    single_leak(
        &report,
        "exit_paths.c",
        41,
        "leak_before_exit",
        "EXIT-LEAK",
        "CALL-EXIT-LEAK",
    );
}

/// exit() from a second thread while main waits in pthread_join. That thread
/// is still alive at the snapshot, so the C library's block for its TLS
/// (allocated in pthread_create) may be live too: at most one such record.
#[test]
fn exit_from_another_thread() {
    let report = exit_path("thread-exit", 5, json!({"code": 5}));
    let src = "exit_paths.c";
    let mine: Vec<&Value> = records(&report)
        .iter()
        .filter(|r| as_u64(r, "bytes") == 41)
        .collect();
    assert_eq!(mine.len(), 1, "records: {:?}", record_summaries(&report));
    assert_eq!(as_u64(mine[0], "blocks"), 1);
    assert_eq!(as_str(mine[0], "allocated_by"), "malloc");
    assert_stack_top(
        stack_of(mine[0], "stack"),
        &[
            ("leak_before_exit", src, marker_line(src, "EXIT-LEAK")),
            ("main", src, marker_line(src, "CALL-EXIT-LEAK")),
        ],
        "41-byte record",
    );
    let others: Vec<&Value> = records(&report)
        .iter()
        .filter(|r| as_u64(r, "bytes") != 41)
        .collect();
    assert!(
        others.len() <= 1,
        "records: {:?}",
        record_summaries(&report)
    );
    for other in others {
        let stack = stack_of(other, "stack");
        assert!(
            as_u64(other, "blocks") == 1
                && stack
                    .iter()
                    .any(|f| frame_function(f).contains("pthread_create")),
            "unexpected record (only the live thread's TLS block may remain): {}",
            pretty(other)
        );
    }
}

/// Starts sigterm_wait.c under `trapline run` and reads the "ready PID" line
/// it writes once its leak is made and it is blocked. Returns the running
/// `trapline run` and the traced program's pid.
fn start_waiting_fixture(dir: &TestDir) -> (std::process::Child, i32) {
    start_ready_fixture(dir, "sigterm_wait.c")
}

/// Starts `fixture` under `trapline run` and reads its "ready PID" line.
fn start_ready_fixture(dir: &TestDir, fixture: &str) -> (std::process::Child, i32) {
    start_ready_fixture_with(dir, fixture, &[])
}

/// The same with `trapline run FLAGS`.
fn start_ready_fixture_with(
    dir: &TestDir,
    fixture: &str,
    flags: &[&str],
) -> (std::process::Child, i32) {
    let prog = compile_c(dir, fixture);
    let mut cmd = isolated(run_command(dir, flags, &prog, &[]));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start trapline run");

    let line = read_stdout_line(&mut child);
    let pid: Option<i32> = line
        .strip_prefix("ready ")
        .and_then(|rest| rest.trim().parse().ok());
    let Some(pid) = pid else {
        let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
        let finished = finish(child, "trapline run");
        panic!(
            "the fixture did not report its pid (got {line:?})\n{}",
            finished.describe()
        );
    };
    (child, pid)
}

/// sigterm_wait.c: killed by SIGTERM while blocked; exit status 143 and a
/// complete trace. The test learns the pid from the line the fixture writes.
#[test]
fn sigterm_exit_143_and_trace_kept() {
    let dir = TestDir::new("sigterm");
    let (child, pid) = start_waiting_fixture(&dir);
    kill(Pid::from_raw(pid), Signal::SIGTERM).expect("signal the traced program");
    let run = finish(child, "trapline run");
    assert_eq!(run.code(), 143, "{}", run.describe());
    assert_no_events_lost_in_summary(&run);

    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(process_pid(&report), pid as u64);
    assert_eq!(process_exit(&report), &json!({"signal": 15}));
    single_leak(
        &report,
        "sigterm_wait.c",
        55,
        "term_leak",
        "TERM-LEAK",
        "CALL-TERM-LEAK",
    );
}

/// sigwait_term.c: a program that blocks SIGTERM in all its threads and
/// takes it with sigwait goes on and exits 0. The agent's writer thread did
/// not block it, so the kernel gave it the signal and the process died
/// (143); a pool worker killed with SIGTERM that way left no end record.
#[test]
fn a_program_that_sigwaits_for_sigterm_gets_it() {
    let dir = TestDir::new("sigwait_term");
    let (child, pid) = start_ready_fixture(&dir, "sigwait_term.c");
    kill(Pid::from_raw(pid), Signal::SIGTERM).expect("signal the traced program");
    let run = finish(child, "trapline run");
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "got 15\n", "{}", run.describe());
    assert_no_events_lost_in_summary(&run);
    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(process_exit(&report), &json!({"code": 0}));
    let src = "sigwait_term.c";
    assert_records(
        &report,
        &[ExpectedRecord {
            bytes: 55,
            blocks: 1,
            allocated_by: "malloc",
            stack: vec![("main", src, marker_line(src, "SIGWAIT-LEAK"))],
        }],
    );
}

/// SIGKILL cannot be caught: the trace must still be readable up to the last
/// chunk the agent wrote (it flushes every thread's buffer every 200 ms), and
/// `leaks` must replay it and say the process did not finish.
#[test]
fn sigkill_leaves_a_readable_trace() {
    let dir = TestDir::new("sigkill");
    let (child, pid) = start_waiting_fixture(&dir);
    // Wait until the periodic flush has put the leak into the file (the
    // condition itself, polled; bounded so a broken flush fails the test).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let flushed = |trace: &std::path::Path| {
        let out = std::process::Command::new(trapline())
            .args(["leaks", "--format", "json"])
            .arg(trace)
            .output()
            .expect("run trapline leaks");
        serde_json::from_slice::<Value>(&out.stdout)
            .map(|v| v["summary"]["unfreed_at_exit"]["bytes"] == json!(55))
            .unwrap_or(false)
    };
    while !flushed(&dir.trace()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the leak never reached the trace"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill the traced program");
    let run = finish(child, "trapline run");
    assert_eq!(run.code(), 137, "{}", run.describe());
    assert!(
        run.stderr
            .contains("died of signal 9 (SIGKILL) before the agent could finish the trace: SIGKILL cannot be caught"),
        "{}",
        run.describe()
    );

    let report = leaks(&dir.trace());
    assert_eq!(
        field(&report["trace"], "complete"),
        &json!(false),
        "{}",
        pretty(&report)
    );
    assert_eq!(process_exit(&report), &Value::Null);
    assert_eq!(process_pid(&report), pid as u64);
    let records = field(&report, "records").as_array().unwrap();
    assert_eq!(records.len(), 1, "{}", pretty(&report));
    assert_eq!(records[0]["bytes"], json!(55));
    assert_eq!(records[0]["stack"][0]["function"], json!("term_leak"));
}

/// unfinished_sites.c, killed by SIGKILL: an unfinished trace has no exit
/// verdict. `leaks` printed every live block's site (a killed perl run:
/// 698,621 lines) whatever `--kinds` said. It now says first that the trace
/// is unfinished, gives the live summary, lists the 25 largest sites and
/// counts the rest; `--kinds all` lists all 40, `--kinds none` none.
#[test]
fn an_unfinished_trace_lists_its_top_sites() {
    let dir = TestDir::new("unfinished_sites");
    let (child, pid) = start_ready_fixture(&dir, "unfinished_sites.c");
    let total: u64 = (0..40).map(|i| 100 + i).sum();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while leaks_with(&dir.trace(), &["--kinds", "all"])["summary"]["unfreed_at_exit"]["bytes"]
        != json!(total)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the blocks never reached the trace"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill the traced program");
    let run = finish(child, "trapline run");
    assert_eq!(run.code(), 137, "{}", run.describe());

    let report = leaks_with(&dir.trace(), &[]);
    assert_eq!(report["trace"]["complete"], json!(false));
    assert_eq!(report["summary"]["source"], json!("replay"));
    assert_eq!(
        report["summary"]["unfreed_at_exit"],
        json!({"bytes": total, "blocks": 40})
    );
    let records = as_array(&report, "records");
    assert_eq!(records.len(), 25, "{}", pretty(&report));
    assert_eq!(report["summary"]["records_omitted"], json!(15));
    // Largest first: the blocks of the deepest sites.
    let sizes: Vec<u64> = records.iter().map(|r| as_u64(r, "bytes")).collect();
    assert_eq!(sizes, (115..140).rev().collect::<Vec<u64>>());
    let all = leaks_with(&dir.trace(), &["--kinds", "all"]);
    assert_eq!(as_array(&all, "records").len(), 40);
    assert_eq!(all["summary"]["records_omitted"], json!(0));
    let none = leaks_with(&dir.trace(), &["--kinds", "none"]);
    assert_eq!(as_array(&none, "records").len(), 0);
    assert_eq!(none["summary"]["records_omitted"], json!(40));

    let text = leaks_text(&dir.trace(), &[]);
    let first = text.lines().nth(3).unwrap_or_default();
    assert!(first.contains("UNFINISHED TRACE"), "{text}");
    assert_eq!(text.matches(" in loss record ").count(), 25, "{text}");
    assert!(
        text.contains("... and 15 more allocation sites with blocks live at the end of the trace (--kinds all lists every one)"),
        "{text}"
    );
}

/// close_fds.c: a program that closes every descriptor it did not open
/// (closefrom, close_range, a loop of close) and takes over with dup2 every
/// number still open that is not its own. The trace file survives (its
/// descriptor is hidden from those calls and moved out of dup2's way), and
/// nothing of it lands in the program's file. Before, OpenSSH's
/// `close_range(3, ~0U, 0)` left `ssh -V` with an empty trace.
#[test]
fn a_program_that_closes_every_descriptor_keeps_its_trace() {
    let dir = TestDir::new("close_fds");
    let prog = compile_c(&dir, "close_fds.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "closed\n");
    assert_no_events_lost_in_summary(&run);
    let written = std::fs::read(dir.path().join("program.out")).expect("program.out");
    assert_eq!(written, b"program data\n");
    let report = leaks(&dir.trace());
    assert_complete(&report);
    let src = "close_fds.c";
    assert_records(
        &report,
        &[ExpectedRecord {
            bytes: 77,
            blocks: 1,
            allocated_by: "malloc",
            stack: vec![("main", src, marker_line(src, "CLOSE-LEAK"))],
        }],
    );
}

/// own_env.c: a program with its own setenv and unsetenv (no-ops before its
/// main, as bash's are) runs itself twice with main's envp. The agent used
/// to remove `TRAPLINE_ROLE` through those functions: it stayed in envp,
/// every child ran as the top process and wrote over its trace (a bash
/// pipeline left the top trace corrupt). Now the parent's trace is its own
/// and each exec'd child has one of its own, without the role.
#[test]
fn a_program_with_its_own_environment_functions_keeps_one_trace_per_process() {
    let dir = TestDir::new("own_env");
    let prog = compile_c(&dir, "own_env.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(
        run.stdout,
        "child: role none\nchild: role none\nparent done\n"
    );
    assert_no_events_lost_in_summary(&run);
    let src = "own_env.c";
    let leak = |bytes: u64, marker: &str| ExpectedRecord {
        bytes,
        blocks: 1,
        allocated_by: "malloc",
        stack: vec![("main", src, marker_line(src, marker))],
    };
    let parent = leaks(&dir.trace());
    assert_complete(&parent);
    assert_eq!(process_command(&parent), [prog.to_str().unwrap()]);
    assert_records(&parent, &[leak(11, "PARENT-LEAK")]);
    let children: Vec<Value> = dir
        .other_traces()
        .iter()
        .map(|p| leaks(p))
        .filter(|r| process_command(r).get(1).map(String::as_str) == Some("child"))
        .collect();
    assert_eq!(children.len(), 2);
    for child in &children {
        assert_complete(child);
        assert_records(child, &[leak(22, "CHILD-LEAK")]);
    }
}

/// stack_overflow.c: unbounded recursion that allocates in every frame.
/// The kernel cannot push a signal frame on the exhausted stack, so the
/// agent's handler used to never run: the trace ended at the last periodic
/// flush, without an end record. The agent now gives a thread without an
/// alternate signal stack its side stack as one (the program still sees
/// none): the process dies of SIGSEGV as natively, and the trace is whole.
#[test]
fn a_stack_overflow_still_ends_the_trace() {
    let dir = TestDir::new("stack_overflow");
    let prog = compile_c(&dir, "stack_overflow.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 139, "{}", run.describe());
    assert_eq!(run.stdout, "altstack: none\n");
    assert_no_events_lost_in_summary(&run);
    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(process_exit(&report), &json!({"signal": 11}));
    // One block per frame; stacks deeper than the 64 frames kept are one
    // stack when their innermost 64 agree (a few near the bottom differ).
    let src = "stack_overflow.c";
    let (bytes, blocks) = records_all_from(
        &report,
        &[("deeper", src, marker_line(src, "OVERFLOW-LEAK"))],
    );
    assert!(blocks > 1000, "{blocks} blocks");
    assert_eq!(bytes, 16 * blocks);
    assert_eq!(unfreed_summary(&report), (bytes, blocks));
}

/// daemon.c: glibc's daemon() ends the parent with its internal _exit, past
/// the agent's hook, so the top trace of every traced daemon had no end
/// record. The agent now provides daemon() itself, through its own fork and
/// _exit: the parent's trace is whole, and the child writes its own.
#[test]
fn a_daemon_and_its_parent_each_leave_a_whole_trace() {
    let dir = TestDir::new("daemon");
    let prog = compile_c(&dir, "daemon.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_no_events_lost_in_summary(&run);
    let parent = leaks(&dir.trace());
    assert_complete(&parent);
    assert_eq!(process_exit(&parent), &json!({"code": 0}));
    assert_eq!(records(&parent).len(), 0, "{}", pretty(&parent));
    // The daemon runs on after trapline returns: wait (bounded) for its trace.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // (Read without asserting: the file may be empty for a moment after
    // the daemon created it.)
    let read = |t: &Path| -> Option<Value> {
        let out = std::process::Command::new(trapline())
            .args(["leaks", "--kinds", "all", "--format", "json"])
            .arg(t)
            .output()
            .ok()?;
        serde_json::from_slice::<Value>(&out.stdout).ok()
    };
    let child = loop {
        let whole = dir
            .other_traces()
            .iter()
            .filter_map(|t| read(t))
            .find(|r| r["trace"]["complete"] == json!(true));
        if let Some(r) = whole {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon's trace never completed"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(process_exit(&child), &json!({"code": 0}));
    let src = "daemon.c";
    assert_records(
        &child,
        &[ExpectedRecord {
            bytes: 99,
            blocks: 1,
            allocated_by: "malloc",
            stack: vec![("main", src, marker_line(src, "DAEMON-LEAK"))],
        }],
    );
    let written = std::fs::read_to_string(dir.path().join("daemon.out")).expect("daemon.out");
    assert_eq!(written, "daemon ran\n");
}

/// atfork_early.c: a library linked to the program registers fork handlers
/// from its constructor, before the agent's constructor registers its own
/// (jemalloc does so from its first malloc). Its prepare handler then runs
/// after the agent's, while the agent holds every lock, and locks a mutex,
/// frees a tracked block and allocates. The old agent recorded those calls
/// and waited for its own locks forever (a bash script under
/// LD_PRELOAD=libjemalloc.so.2 hung at its first command substitution).
/// Both forks finish, and every trace is whole with its exact leak.
#[test]
fn fork_handlers_registered_before_the_agents_run_while_it_forks() {
    let dir = TestDir::new("atfork_early");
    let lib = compile_c_library(&dir, "atfork_early_lib.c", "libatfork_early_lib.so");
    let prog = compile_c_linked_to(&dir, "atfork_early.c", &lib);
    // Bounded: the old agent never returned.
    let run = run(&dir, &["--timeout", "60"], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "cc\nprepared 2 times\n");
    assert_no_events_lost_in_summary(&run);
    let parent = leaks(&dir.trace());
    assert_complete(&parent);
    assert_eq!(records(&parent).len(), 0, "{}", pretty(&parent));
    let src = "atfork_early.c";
    let mut child_bytes: Vec<u64> = dir
        .other_traces()
        .iter()
        .map(|t| {
            let child = leaks(t);
            assert_complete(&child);
            let (bytes, blocks) =
                records_all_from(&child, &[("main", src, marker_line(src, "CHILD-LEAK"))]);
            assert_eq!(blocks, 1, "{}", pretty(&child));
            assert_eq!(unfreed_summary(&child), (bytes, 1));
            bytes
        })
        .collect();
    child_bytes.sort();
    assert_eq!(child_bytes, [200, 201]);
}

/// raw_fork.c: children made with `_Fork` and with the fork system call,
/// which no atfork handler resets. They stop recording and write nothing
/// (the agent tells them by a MADV_WIPEONFORK page and the pid): they exit
/// at once, and the parent's trace holds exactly the parent's leak. The
/// old agent's children each waited 120 s at exit, then wrote their chunks
/// into the parent's file.
#[test]
fn children_made_without_glibcs_fork_exit_at_once_and_leave_the_parents_trace_alone() {
    let dir = TestDir::new("raw_fork");
    let prog = compile_c(&dir, "raw_fork.c");
    // Bounded: the old agent took 240 s.
    let run = run(&dir, &["--timeout", "60"], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "_Fork\nfork system call\nparent done\n");
    assert_no_events_lost_in_summary(&run);
    assert_eq!(dir.other_traces(), Vec::<std::path::PathBuf>::new());
    let report = leaks(&dir.trace());
    assert_complete(&report);
    let src = "raw_fork.c";
    assert_records(
        &report,
        &[ExpectedRecord {
            bytes: 48,
            blocks: 1,
            allocated_by: "malloc",
            stack: vec![("main", src, marker_line(src, "PARENT-LEAK"))],
        }],
    );
}

/// child_error.c: the summary of `trapline run` adds up the other processes'
/// traces and names those with errors. It used to cover the top process
/// only, and said "errors found: 0" for a tree whose child double-freed.
#[test]
fn the_run_summary_counts_the_errors_of_every_process() {
    let dir = TestDir::new("child_error");
    let prog = compile_c(&dir, "child_error.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let children = dir.other_traces();
    assert_eq!(children.len(), 1, "{}", run.describe());
    let lines = [
        "==trapline== errors found: 0\n".to_string(),
        "==trapline== other processes (1 trace): 2 allocation calls, errors found: 1, events \
         lost: 0\n"
            .to_string(),
        format!(
            "==trapline==   {}: 1 allocation error\n",
            children[0].display()
        ),
    ];
    let at: Vec<Option<usize>> = lines.iter().map(|l| run.stderr.find(l.as_str())).collect();
    assert!(
        at.iter().all(Option::is_some) && at.windows(2).all(|w| w[0] < w[1]),
        "{}",
        run.describe()
    );
    // --error-exitcode judges every process of the run.
    let quiet = common::run(&dir, &["-q", "--error-exitcode", "5"], &prog, &[]);
    assert_eq!(quiet.code(), 5, "{}", quiet.describe());
}

/// many_children.c: 25 traces. The summary names 20 of them and counts the
/// rest (a shell loop of 300 commands listed 603 lines), and adds up all 24
/// children.
#[test]
fn the_run_summary_names_twenty_traces_and_counts_the_rest() {
    let dir = TestDir::new("many_children");
    let prog = compile_c(&dir, "many_children.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "24 children\n");
    assert_eq!(dir.other_traces().len(), 24);
    let named = run
        .stderr
        .lines()
        .filter(|l| l.starts_with(&format!("==trapline==   {}", dir.trace().display())))
        .count();
    assert_eq!(named, 20, "{}", run.describe());
    let more = format!(
        "==trapline==   ... and 5 more, named {}.<pid>\n",
        dir.trace().display()
    );
    assert!(run.stderr.contains(&more), "{}", run.describe());
    assert!(
        run.stderr.contains(
            "==trapline== other processes (24 traces): 24 allocation calls, errors found: 0, \
             events lost: 0\n"
        ),
        "{}",
        run.describe()
    );
}

/// vfork_exit.c: a vfork child that calls exit() shares the parent's memory,
/// agent included. Its exit must leave the parent's trace alone: the old
/// agent finished the parent's trace from the child (end record, exit scan,
/// the C library's freeres on the parent's buffers), and the parent's later
/// allocations were not recorded. The child's exit also uses up the
/// parent's exit handlers, the agent's among them: the parent's exit()
/// finishes the trace from the agent's exit hook instead, and a return from
/// main from the agent's wrapper of main (before it, that trace had no end
/// record and none of the parent's events).
#[test]
fn a_vfork_child_that_calls_exit_leaves_the_parents_trace_alone() {
    for how in ["exit", "return"] {
        vfork_child_exit_then_parent(how);
    }
}

fn vfork_child_exit_then_parent(how: &str) {
    let dir = TestDir::new(&format!("vfork_exit_{how}"));
    let prog = compile_c(&dir, "vfork_exit.c");
    let run = run(&dir, &["--timeout", "60"], &prog, &[how]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "parent went on\n");
    assert_no_events_lost_in_summary(&run);
    assert_eq!(dir.other_traces(), Vec::<std::path::PathBuf>::new());
    let report = leaks(&dir.trace());
    assert_complete(&report);
    let src = "vfork_exit.c";
    let line = |marker| marker_line(src, marker);
    assert_records(
        &report,
        &[
            ExpectedRecord {
                bytes: 222,
                blocks: 1,
                allocated_by: "malloc",
                stack: vec![("main", src, line("AFTER-VFORK"))],
            },
            ExpectedRecord {
                bytes: 111,
                blocks: 1,
                allocated_by: "malloc",
                stack: vec![("main", src, line("BEFORE-VFORK"))],
            },
        ],
    );
    assert_eq!(errors(&report).len(), 0, "{}", pretty(&report));
}

/// reload_loop.c: a plugin loaded, called and unloaded 300 and 3,000 times.
/// Every dlopen and dlclose used to leave a new unwinder behind (never
/// freed: a thread may still walk an old one), 28 MB more for 2,000 cycles;
/// the agent now takes back the unwinder of a set of modules it has seen.
/// The peak resident memory of the 3,000-cycle run stays within a few MiB
/// of the 300-cycle run's, and every block is still attributed to the
/// plugin's function through each of its reloads.
#[test]
fn reloading_a_plugin_again_and_again_keeps_the_agents_memory_bounded() {
    let dir = TestDir::new("reload_loop");
    let plugin = compile_c_library(&dir, "reload_plugin.c", "libreload_plugin.so");
    let prog = compile_c(&dir, "reload_loop.c");
    let plugin = plugin.display().to_string();
    let mut peaks = Vec::new();
    for n in [300u64, 3000] {
        let run = run(&dir, &[], &prog, &[&plugin, &n.to_string()]);
        assert_eq!(run.code(), 0, "{}", run.describe());
        let peak_kb: u64 = run
            .stdout
            .strip_prefix(&format!("{n} reloads, peak "))
            .and_then(|rest| rest.strip_suffix(" kB\n"))
            .and_then(|kb| kb.parse().ok())
            .unwrap_or_else(|| panic!("unexpected output: {}", run.stdout));
        peaks.push(peak_kb);
        let report = leaks(&dir.trace());
        assert_complete(&report);
        let src = "reload_plugin.c";
        let (bytes, blocks) = records_all_from(
            &report,
            &[("plugin_alloc", src, marker_line(src, "PLUGIN-LEAK"))],
        );
        assert_eq!((bytes, blocks), (24 * n, n), "{}", pretty(&report));
    }
    // The old agent: about 14 KiB more per cycle (38 MB here).
    assert!(
        peaks[1] < peaks[0] + 8 * 1024,
        "peak resident memory grew from {} kB to {} kB",
        peaks[0],
        peaks[1]
    );
}

/// raw_exec.c execs through `syscall(SYS_execve, ...)`: the agent's own
/// `syscall()` sends it to the exec hook, so the first image's trace ends
/// with the exec and the new image is traced (neither happened before: the
/// trace had no end record and the new image ran without the agent).
#[test]
fn execve_through_syscall_is_followed() {
    let dir = TestDir::new("raw_exec");
    let prog = compile_c(&dir, "raw_exec.c");
    let target = compile_c(&dir, "exec_target.c");
    let run = run(&dir, &[], &prog, &[target.to_str().unwrap()]);
    assert_eq!(run.code(), 7, "{}", run.describe());
    assert_no_events_lost_in_summary(&run);
    let first = leaks(&dir.trace());
    assert_complete(&first);
    assert_eq!(process_exit(&first), &json!({"exec": true}));
    let others = dir.other_traces();
    assert_eq!(others.len(), 1, "traces besides the top one: {others:?}");
    let exec = leaks(&others[0]);
    assert_complete(&exec);
    assert_eq!(process_pid(&exec), process_pid(&first));
    assert_eq!(process_command(&exec), [target.to_str().unwrap()]);
    assert_eq!(process_exit(&exec), &json!({"code": 7}));
    single_leak(
        &exec,
        "exec_target.c",
        33,
        "exec_leak",
        "EXEC-LEAK",
        "CALL-EXEC-LEAK",
    );
}

/// A wrapper that replaces itself with the real program (`exec "$@"` in a
/// start script, a version manager's shim): the summary is the last
/// image's, the one whose exit status `trapline run` returns, and names
/// its trace for `leaks`. It used to describe the wrapper's first image
/// (`env` for a pyenv `python3`: 201 calls of locale setup). With
/// `--no-follow` the command's own images are still traced (an exec
/// replaces the process; it starts no other), its children are not (the
/// exec'd image was not traced at all).
#[test]
fn the_run_summary_follows_the_commands_execs_to_its_last_image() {
    let dir = TestDir::new("exec_chain");
    let target = compile_c(&dir, "exec_target.c");
    let script = format!(
        "/bin/true; exec /bin/sh -c 'exec {}'",
        target.to_str().unwrap()
    );
    for flags in [&[][..], &["--no-follow"][..]] {
        let run = run(&dir, flags, Path::new("/bin/sh"), &["-c", &script]);
        assert_eq!(run.code(), 7, "{flags:?}\n{}", run.describe());
        let top = leaks(&dir.trace());
        assert_eq!(process_exit(&top), &json!({"exec": true}));
        let pid = process_pid(&top);
        let (second, last) = (
            dir.path().join(format!("t.trace.{pid}")),
            dir.path().join(format!("t.trace.{pid}.1")),
        );
        let last_report = leaks(&last);
        assert_complete(&last_report);
        assert_eq!(process_exit(&last_report), &json!({"code": 7}));
        assert_eq!(process_pid(&last_report), pid);
        let shell = Path::new(process_executable(&top))
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        let lines = [
            format!(
                "==trapline== the command replaced itself with exec 2 times: {shell}, {shell}, \
                 exec_target; below, its last image ({})\n",
                last.display()
            ),
            "==trapline== unfreed at exit: 33 bytes in 1 block\n".to_string(),
            "==trapline== other processes and earlier images (".to_string(),
            format!("==trapline== see: trapline leaks {}\n", last.display()),
        ];
        let at: Vec<Option<usize>> = lines.iter().map(|l| run.stderr.find(l.as_str())).collect();
        assert!(
            at.iter().all(Option::is_some) && at.windows(2).all(|w| w[0] < w[1]),
            "{flags:?}: {at:?}\n{}",
            run.describe()
        );
        // Each image's report names the next image's trace.
        for (trace, next) in [(dir.trace(), &second), (second.clone(), &last)] {
            let mut cmd = std::process::Command::new(trapline());
            cmd.arg("leaks").arg(&trace);
            let leaks_run = output_of(cmd, "trapline leaks");
            assert!(
                leaks_run.stderr.contains(&format!(
                    "==trapline== this image replaced itself with exec; the next image's \
                     trace: {}\n",
                    next.display()
                )),
                "{}",
                leaks_run.describe()
            );
        }
        let others = dir.other_traces();
        assert!(others.contains(&second) && others.contains(&last));
        let children: Vec<Vec<String>> = others
            .iter()
            .filter(|t| **t != second && **t != last)
            .map(|t| process_command(&leaks(t)))
            .collect();
        if flags.is_empty() {
            // The shell's child (dash runs it with vfork: one image).
            assert!(
                children.contains(&vec!["/bin/true".to_string()]),
                "{children:?}"
            );
        } else {
            assert_eq!(children, Vec::<Vec<String>>::new());
        }
    }
}

/// A wrapper that execs a program the agent cannot enter (here a static
/// one): the summary is the wrapper's last traced image and says that the
/// process went on untraced, whose status `trapline run` returns.
#[test]
fn the_run_summary_says_when_the_command_execs_an_untraced_program() {
    let dir = TestDir::new("exec_untraced");
    let prog = compile_c_with(&dir, "static_hello.c", "static_hello", &["-static"]);
    let script = format!("exec {}", prog.to_str().unwrap());
    let run = run(&dir, &[], Path::new("/bin/sh"), &["-c", &script]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "static ran\n");
    assert_eq!(dir.other_traces(), Vec::<std::path::PathBuf>::new());
    assert!(
        run.stderr.contains(
            "==trapline== the process then replaced itself with a program the agent could \
             not enter (a static, setuid, 32-bit or musl program, or one that clears LD_PRELOAD): \
             the exit status is that program's\n"
        ),
        "{}",
        run.describe()
    );
    assert!(
        !run.stderr.contains("replaced itself with exec"),
        "{}",
        run.describe()
    );
}

/// term_during_exit.c: SIGTERM sent to children while the agent finishes
/// their traces at `_exit`. Each child's trace is complete and its end
/// record agrees with the status the parent saw. The signal used to kill
/// the child in the middle of the finish, leaving no end record (a Python
/// multiprocessing pool's workers, terminated as they exit).
#[test]
fn sigterm_during_the_finish_of_an_exit_leaves_a_complete_trace() {
    let dir = TestDir::new("term_during_exit");
    let prog = compile_c(&dir, "term_during_exit.c");
    let run = run(&dir, &["--no-scan"], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{}", run.describe());
    for line in lines {
        let words: Vec<&str> = line.split(' ').collect();
        let trace = dir.path().join(format!("t.trace.{}", words[0]));
        let report = leaks(&trace);
        assert_complete(&report);
        let expected = match (words[1], words[2].parse::<i32>().unwrap()) {
            ("exited", code) => json!({ "code": code }),
            (_, signal) => json!({ "signal": signal }),
        };
        assert_eq!(process_exit(&report), &expected, "{line}");
        assert_eq!(report["events_lost"], json!(0), "{line}");
    }
}

/// outlive.c: a child still runs when the command ends. The summary says
/// so ("still running") instead of "no end record", which read like a
/// crash (Python's multiprocessing resource tracker outlives its program).
#[test]
fn the_run_summary_names_a_process_that_outlived_the_command_as_still_running() {
    let dir = TestDir::new("outlive");
    let prog = compile_c(&dir, "outlive.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let child: i32 = run.stdout.trim().parse().expect("child pid");
    let trace = dir.path().join(format!("t.trace.{child}"));
    let still = format!(
        "==trapline==   {}: still running: it outlived the command, and its trace grows \
         until it ends\n",
        trace.display()
    );
    let ended = kill(Pid::from_raw(child), Signal::SIGTERM);
    assert!(
        run.stderr.contains("events lost: 0 (1 still running)\n") && run.stderr.contains(&still),
        "{}",
        run.describe()
    );
    ended.expect("signal the child");
    // Its trace completes once it has died of the signal (polled, bounded).
    // Until its writer thread has written the first chunk the file holds
    // only its header, which `leaks` refuses (exit 1): on a loaded machine
    // the child's writer may not have run yet when the signal comes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let polled = analysis("leaks", &trace);
        if polled.code() == 1 && polled.stderr.contains("the file ends after its header") {
            assert!(
                std::time::Instant::now() < deadline,
                "the child's trace never got past its header"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
            continue;
        }
        assert_eq!(polled.code(), 0, "{}", polled.describe());
        let report: serde_json::Value = serde_json::from_str(&polled.stdout).expect("JSON");
        if report["trace"]["complete"] == json!(true) {
            assert_eq!(process_exit(&report), &json!({"signal": 15}));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the child's trace never completed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// exit_race.c: three threads call exit (or two call _exit) at once. The
/// trace is complete with exit code 5, every time: a second thread's exit
/// ran the remaining exit handlers beside the first and reached glibc's own
/// _exit while the first was still finishing the trace (no end record in
/// 10 runs of 10), and a thread's _exit did not wait for another's finish.
#[test]
fn threads_that_exit_at_once_leave_a_complete_trace() {
    let dir = TestDir::new("exit_race");
    let prog = compile_c(&dir, "exit_race.c");
    for args in [&[][..], &["_exit"][..]] {
        for round in 0..5 {
            let run = run(&dir, &["--no-scan"], &prog, args);
            assert_eq!(run.code(), 5, "{args:?} round {round}: {}", run.describe());
            let report = leaks(&dir.trace());
            assert_complete(&report);
            assert_eq!(process_exit(&report), &json!({"code": 5}), "{args:?}");
            let src = "exit_race.c";
            let leaked: Vec<u64> = records(&report)
                .iter()
                .filter(|r| r["stack"][0]["function"] == json!("ender"))
                .map(|r| {
                    assert_eq!(
                        r["stack"][0]["line"],
                        json!(marker_line(src, "RACE-LEAK")),
                        "{}",
                        pretty(r)
                    );
                    as_u64(r, "bytes")
                })
                .collect();
            assert_eq!(leaked, [22], "{args:?}: {}", pretty(&report));
        }
    }
}

/// term_handler_exit.c: the program's SIGTERM handler calls exit(0) while
/// the program allocates in a loop, so the handler often runs inside one of
/// the agent's hooks, which holds a lock of the live table. The exit's
/// snapshot and scan waited for that lock for ever (a core at 100% until
/// killed, 1 run in 2). Now such a finish takes locks with bounded
/// attempts; a part of the table it cannot take is counted as lost, and
/// the reports say so. 8 rounds, each under `--timeout` in case it hangs.
#[test]
fn an_exit_from_a_signal_handler_that_interrupted_the_agent_finishes() {
    let dir = TestDir::new("term_handler_exit");
    for round in 0..8 {
        let (child, pid) =
            start_ready_fixture_with(&dir, "term_handler_exit.c", &["--timeout", "60"]);
        kill(Pid::from_raw(pid), Signal::SIGTERM).expect("signal the traced program");
        let run = finish(child, "trapline run");
        assert_eq!(run.code(), 0, "round {round}: {}", run.describe());
        let report = leaks(&dir.trace());
        assert_eq!(report["trace"]["complete"], json!(true), "round {round}");
        assert_eq!(process_exit(&report), &json!({"code": 0}));
        let lost = as_u64(&report, "events_lost");
        assert!(lost <= 1, "round {round}: {lost} lost");
        assert!(
            run.stderr
                .contains(&format!("==trapline== events lost: {lost}\n")),
            "round {round}: {}",
            run.describe()
        );
    }
}

/// dispositions.c started by a shell that ignores SIGHUP, SIGINT and
/// SIGPIPE (as `nohup`, a script's background job and systemd's services
/// do), and by one that ignores only SIGHUP: the traced program finds them
/// as natively. trapline's own handlers for the signals it forwards or
/// swallows replaced SIG_IGN, so the program found SIG_DFL and `nohup
/// trapline run -- server` died of the SIGHUP it should survive; SIGPIPE,
/// which Rust's runtime sets and its `Command` resets, reached the program
/// as SIG_DFL, and a server would die of a write to a closed socket. A
/// signal blocked when trapline starts is blocked in the command too.
/// Each shell is started through `default-exec`, from default dispositions:
/// the test itself may run as a background job (SIGINT and SIGQUIT ignored).
#[test]
fn signals_ignored_when_trapline_starts_stay_ignored_in_the_command() {
    let dir = TestDir::new("dispositions");
    let prog = compile_c(&dir, "dispositions.c");
    let p = prog.display();
    for (ignored, expected) in [
        (
            "HUP INT PIPE",
            "HUP ignored\nINT ignored\nQUIT default\nTERM default\nPIPE ignored\n",
        ),
        (
            "HUP",
            "HUP ignored\nINT default\nQUIT default\nTERM default\nPIPE default\n",
        ),
    ] {
        let native = output_of(
            {
                let mut cmd = std::process::Command::new(&prog);
                cmd.args(["default-exec", "/bin/sh", "-c"])
                    .arg(format!("trap '' {ignored}; exec {p} block-exec {p}"));
                cmd
            },
            "native",
        );
        assert_eq!(native.code(), 0, "{}", native.describe());
        assert_eq!(native.stdout, format!("{expected}USR1 blocked\n"));
        let traced = output_of(
            {
                let mut cmd = std::process::Command::new(&prog);
                cmd.args(["default-exec", "/bin/sh", "-c"]).arg(format!(
                    "trap '' {ignored}; exec {p} block-exec {} run -q -o {} -- {p}",
                    trapline().display(),
                    dir.trace().display(),
                ));
                cmd.env("TRAPLINE_AGENT", agent());
                cmd
            },
            "traced",
        );
        assert_eq!(traced.code(), 0, "{}", traced.describe());
        assert_eq!(traced.stdout, native.stdout, "{}", traced.describe());
    }
}

/// spawn_many.c: 1,000 fork+exec pairs of /bin/true, 2,000 traced images
/// that each live about a millisecond. Every one ends with its end record
/// and nothing lost; none hangs in its exit scan (the scan stopped a writer
/// thread that was still starting, inside the agent's heap, and then waited
/// for the heap's lock; rare: seen once in 20,000 processes, so this test
/// seldom catches that one, but it runs the start and end paths by the
/// thousand).
#[test]
fn a_thousand_short_processes_each_finish_their_trace() {
    let dir = TestDir::new("spawn_many");
    let prog = compile_c(&dir, "spawn_many.c");
    let run = run(&dir, &["--timeout", "300"], &prog, &["1000"]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "1000 processes\n");
    assert_no_events_lost_in_summary(&run);
    assert!(
        !run.stderr.contains("no end record") && !run.stderr.contains("did not finish"),
        "{}",
        run.describe()
    );
    assert_eq!(dir.other_traces().len(), 2000, "{}", run.describe());
}

/// heap_layout.c: where a sequence of mallocs, frees, a realloc and a calloc
/// land in the main thread's heap is the same with and without trapline.
/// The agent keeps its own memory apart, but C library calls it made at
/// start allocated through the program's heap (pthread_getattr_np's FILE
/// and buffers for /proc/self/maps, dlsym's messages for names it looked
/// up in vain), and their freed chunks were what the program's next blocks
/// of those sizes got.
#[test]
fn the_main_heap_is_laid_out_as_without_trapline() {
    let dir = TestDir::new("heap_layout");
    let prog = compile_c(&dir, "heap_layout.c");
    run_like_native(&dir, &prog);
}

/// Runs `prog` natively, then traced: both exit 0 and print the same; the
/// traced run is returned.
fn run_like_native(dir: &TestDir, prog: &std::path::Path) -> Finished {
    let native = output_of(std::process::Command::new(prog), "native");
    assert_eq!(native.code(), 0, "{}", native.describe());
    let traced = run(dir, &[], prog, &[]);
    assert_eq!(traced.code(), 0, "{}", traced.describe());
    assert_eq!(traced.stdout, native.stdout, "{}", traced.describe());
    traced
}

/// namespaces.c: setns into a mount namespace and unshare of a user
/// namespace need a process of one thread, and the agent's writer thread
/// made every traced process one of two: both failed with EINVAL under
/// trapline (`unshare -U` printed "unshare failed: Invalid argument"). The
/// writer now stops around them and a new one starts after. The outcomes
/// are the native ones, and the block allocated after them is in the
/// trace, with nothing lost.
#[test]
fn calls_that_need_a_single_thread_work_as_without_trapline() {
    let dir = TestDir::new("namespaces");
    let prog = compile_c(&dir, "namespaces.c");
    let traced = run_like_native(&dir, &prog);
    assert_no_events_lost_in_summary(&traced);
    let report = leaks(&dir.trace());
    assert_complete(&report);
    assert_eq!(unfreed_summary(&report), (24, 1), "{}", pretty(&report));
    let record = &records(&report)[0];
    let line = marker_line("namespaces.c", "AFTER");
    assert_eq!(
        stack_of(record, "stack")[0]["line"],
        serde_json::json!(line),
        "{}",
        pretty(record)
    );
}

/// A traced shell runs programs the agent cannot be loaded into: a 32-bit
/// one (its loader printed "ERROR: ld.so: object ... cannot be preloaded
/// (wrong ELF class: ELFCLASS64): ignored." on the program's stderr) and a
/// musl one (musl's loader failed on the agent's glibc symbols: the program
/// never started, 127), by path from a vfork child (dash) and by name
/// through `env`'s execvp. The exec hooks now drop the agent from their
/// LD_PRELOAD: each runs, untraced, exactly as without trapline.
#[test]
fn programs_that_cannot_take_the_agent_run_as_without_it() {
    let dir = TestDir::new("foreign_children");
    let prog32 = compile_c_with(&dir, "hello_name.c", "hello32", &["-m32"]);
    let musl = compile(&dir, "musl-gcc", "hello_name.c", "hello_musl", &["-g"]);
    let bin = prog32.parent().unwrap().display().to_string();
    let script = format!(
        "{} 2>&1; {} 2>&1; PATH={bin}:$PATH env hello32 2>&1; PATH={bin}:$PATH env hello_musl 2>&1",
        prog32.display(),
        musl.display()
    );
    let expected =
        "hello from hello32\nhello from hello_musl\nhello from hello32\nhello from hello_musl\n";
    let native = output_of(
        {
            let mut cmd = std::process::Command::new("/bin/sh");
            cmd.args(["-c", &script]);
            cmd
        },
        "native",
    );
    assert_eq!(native.stdout, expected, "{}", native.describe());
    let traced = run(&dir, &[], std::path::Path::new("/bin/sh"), &["-c", &script]);
    assert_eq!(traced.code(), 0, "{}", traced.describe());
    assert_eq!(traced.stdout, expected, "{}", traced.describe());
    assert_no_events_lost_in_summary(&traced);
}

/// spawner.c starts children with posix_spawnp, which the C library runs
/// past the exec hooks: a 32-bit one and a musl one, found along PATH, run
/// untraced exactly as without trapline (no loader complaint, a musl child
/// that starts), and a glibc one given an empty environment is traced all
/// the same (it ran untraced: the agent was not in its LD_PRELOAD).
#[test]
fn posix_spawn_children_are_followed_or_left_alone_as_exec_does() {
    let dir = TestDir::new("spawned_children");
    let prog32 = compile_c_with(&dir, "hello_name.c", "hello32", &["-m32"]);
    compile(&dir, "musl-gcc", "hello_name.c", "hello_musl", &["-g"]);
    compile_c_with(&dir, "hello_name.c", "hello64", &[]);
    let spawner = compile_c(&dir, "spawner.c");
    let bin = prog32.parent().unwrap().display().to_string();
    let path = format!("{bin}:{}", std::env::var("PATH").unwrap_or_default());
    let args = ["hello32", "hello_musl", "-e", "hello64"];
    let native = output_of(
        {
            let mut cmd = std::process::Command::new(&spawner);
            cmd.args(args).env("PATH", &path);
            cmd
        },
        "native",
    );
    assert_eq!(
        native.stdout,
        "hello from hello32\nhello from hello_musl\nhello from hello64\n",
        "{}",
        native.describe()
    );
    assert_eq!(native.stderr, "");
    let mut cmd = run_command(&dir, &[], &spawner, &args);
    cmd.env("PATH", &path);
    let traced = output_of(cmd, "traced");
    assert_eq!(traced.code(), 0, "{}", traced.describe());
    assert_eq!(
        traced.stdout,
        "hello from hello32\nhello from hello_musl\nhello from hello64 (agent preloaded)\n",
        "{}",
        traced.describe()
    );
    assert!(
        !traced.stderr.contains("ERROR: ld.so"),
        "{}",
        traced.describe()
    );
    // The spawner's trace and the glibc child's.
    assert_eq!(dir.other_traces().len(), 1, "{}", traced.describe());
}

/// exec_at.c replaces itself through glibc's execveat, which no hook saw:
/// with a 32-bit program, whose loader then complained about the agent on
/// its stderr, and with a glibc one, which is followed like any exec'd
/// image (its trace is the top trace's `.<pid>`).
#[test]
fn execveat_is_followed_like_the_other_execs() {
    let dir = TestDir::new("exec_at");
    let prog32 = compile_c_with(&dir, "hello_name.c", "hello32", &["-m32"]);
    compile_c_with(&dir, "hello_name.c", "hello64", &[]);
    let exec_at = compile_c(&dir, "exec_at.c");
    let bin = prog32.parent().unwrap().display().to_string();
    let to32 = run(&dir, &[], &exec_at, &[&bin, "hello32"]);
    assert_eq!(to32.code(), 0, "{}", to32.describe());
    assert_eq!(to32.stdout, "hello from hello32\n", "{}", to32.describe());
    assert!(!to32.stderr.contains("ERROR: ld.so"), "{}", to32.describe());
    let to64 = run(&dir, &[], &exec_at, &[&bin, "hello64"]);
    assert_eq!(to64.code(), 0, "{}", to64.describe());
    assert_eq!(
        to64.stdout,
        "hello from hello64 (agent preloaded)\n",
        "{}",
        to64.describe()
    );
    assert_eq!(dir.other_traces().len(), 1, "{}", to64.describe());
}

/// arena_count.c: a single-threaded program has no glibc arena heap of its
/// own (the main arena is [heap]), traced or not. The agent's writer
/// thread once called an allocating C library function at its start, and
/// glibc gave it an arena: 64 MiB of address space in the program, and one
/// of the arenas the program's threads are spread over.
#[test]
fn the_writer_thread_takes_no_arena_from_the_program() {
    let dir = TestDir::new("arena_count");
    let prog = compile_c(&dir, "arena_count.c");
    let traced = run_like_native(&dir, &prog);
    assert_eq!(traced.stdout, "0 arena heaps\n", "{}", traced.describe());
}

/// The traced program's environment holds two variables of trapline's,
/// `LD_PRELOAD` and `TRAPLINE_OUTPUT`: options at their defaults are left
/// out (it held eight), and a value inherited from trapline's own
/// environment (a `TRAPLINE_PASS_INVALID=1` left from another run) is
/// removed, not passed on. Options that are given are still there.
#[test]
fn the_traced_environment_holds_only_what_the_agent_needs() {
    let dir = TestDir::new("traced_environment");
    let env_of = |flags: &[&str]| {
        let mut cmd = run_command(&dir, flags, Path::new("/usr/bin/env"), &[]);
        cmd.env_clear()
            .env("TRAPLINE_AGENT", agent())
            .env("TRAPLINE_PASS_INVALID", "1")
            .env("KEPT", "yes");
        let run = output_of(cmd, "trapline run env");
        assert_eq!(run.code(), 0, "{}", run.describe());
        let mut vars: Vec<String> = run
            .stdout
            .lines()
            .map(|l| l.split('=').next().unwrap_or_default().to_string())
            .collect();
        vars.sort();
        vars
    };
    assert_eq!(
        env_of(&[]),
        ["KEPT", "LD_PRELOAD", "TRAPLINE_AGENT", "TRAPLINE_OUTPUT"]
    );
    assert_eq!(
        env_of(&["--no-scan", "--pass-invalid-frees"]),
        [
            "KEPT",
            "LD_PRELOAD",
            "TRAPLINE_AGENT",
            "TRAPLINE_OUTPUT",
            "TRAPLINE_PASS_INVALID",
            "TRAPLINE_SCAN"
        ]
    );
}

/// held_at_exit.c: the threads that the exit natively ends stay stopped
/// from the exit scan until the process ends. Before, they ran again after
/// the scan while the agent finished the trace: the sleeper, whose sleep
/// the scan's signal cut short, printed "sleeper woke", and the worker
/// recorded allocations after the scan.
#[test]
fn threads_stay_stopped_from_the_exit_scan_to_the_end() {
    let dir = TestDir::new("held_at_exit");
    let prog = compile_c(&dir, "held_at_exit.c");
    for round in 0..3 {
        let run = run(&dir, &[], &prog, &[]);
        assert_eq!(run.code(), 0, "round {round}: {}", run.describe());
        assert_eq!(run.stdout, "exiting\n", "round {round}: {}", run.describe());
        assert_no_events_lost_in_summary(&run);
        let report = leaks(&dir.trace());
        assert_complete(&report);
        let scan = &report["scan"];
        assert_eq!(scan["trigger"], json!("exit"), "{}", pretty(&report));
        assert_eq!(as_u64(scan, "threads_not_suspended"), 0);

        // The worker's last event comes before the scan began.
        let file = std::fs::File::open(dir.trace()).expect("trace");
        let mut reader =
            trapline_trace::TraceReader::new(std::io::BufReader::new(file)).expect("header");
        let (mut main_tid, mut scan_time) = (0, None);
        let mut worker_last = 0u64;
        let mut worker_events = 0u64;
        while let Some(chunk) = reader.next_chunk().expect("chunk") {
            let tid = chunk.header.tid;
            for ev in chunk.events() {
                match ev.expect("event") {
                    trapline_trace::Event::Process(p) => main_tid = p.pid,
                    trapline_trace::Event::ScanBegin { time, .. } => scan_time = Some(time),
                    trapline_trace::Event::Alloc { time, .. }
                    | trapline_trace::Event::Free { time, .. }
                        if tid != main_tid && main_tid != 0 =>
                    {
                        worker_last = worker_last.max(time);
                        worker_events += 1;
                    }
                    _ => {}
                }
            }
        }
        let scan_time = scan_time.expect("ScanBegin");
        assert!(
            worker_events > 2000,
            "round {round}: {worker_events} worker events"
        );
        assert!(
            worker_last <= scan_time,
            "round {round}: the worker recorded at {worker_last} ns, after the exit scan began at {scan_time} ns"
        );
    }
}

/// fault_in_finish.c: a thread that faults during the agent's finish (its
/// sleep cut short by the exit scan) is one the exit would natively have
/// ended asleep. The process exits 0 as natively, with a complete trace,
/// instead of dying of SIGSEGV (139) without an end record.
#[test]
fn a_thread_that_faults_during_the_finish_does_not_end_the_process() {
    let dir = TestDir::new("fault_in_finish");
    let prog = compile_c(&dir, "fault_in_finish.c");
    for round in 0..3 {
        let run = run(&dir, &[], &prog, &[]);
        assert_eq!(run.code(), 0, "round {round}: {}", run.describe());
        assert_eq!(run.stdout, "exiting\n");
        assert_no_events_lost_in_summary(&run);
        let report = leaks(&dir.trace());
        assert_complete(&report);
        assert_eq!(process_exit(&report), &json!({"code": 0}));
        // The scan ran (it is what cut the sleep short) and judged every block.
        let scan = &report["scan"];
        assert_eq!(scan["trigger"], json!("exit"), "{}", pretty(&report));
        assert_eq!(
            as_u64(scan, "blocks"),
            as_u64(&report["summary"]["unfreed_at_exit"], "blocks")
        );
    }
}

/// A driver that starts the program doing the work (g++ running cc1plus, a
/// shell running a command): the summary spoke of the driver (its few
/// allocation calls) and pointed `see:` at the driver's trace. The traces
/// with more allocation calls than the command's own are named first now,
/// and `see:` points at the busiest.
#[test]
fn the_run_summary_names_the_traces_that_carry_the_work() {
    let dir = TestDir::new("summary_work");
    let prog = compile_c(&dir, "many_pairs.c");
    let script = format!("{}; true", prog.display());
    let run = run(&dir, &[], Path::new("/bin/sh"), &["-c", &script]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let others = dir.other_traces();
    assert_eq!(others.len(), 1, "{others:?}");
    let child = &others[0];
    assert_eq!(
        process_command(&leaks(child)),
        vec![prog.display().to_string()]
    );
    assert!(
        run.stderr.contains(&format!(
            "==trapline== most of the work is in other processes: {} (many_pairs, 2,000,001 allocation calls)\n",
            child.display()
        )),
        "{}",
        run.describe()
    );
    assert!(
        run.stderr.contains(&format!(
            "==trapline== see: trapline leaks {}\n",
            child.display()
        )),
        "{}",
        run.describe()
    );
    assert!(
        run.stderr.contains(&format!(
            "==trapline==      trapline leaks {} (the command's own, ",
            dir.trace().display()
        )),
        "{}",
        run.describe()
    );
}

/// setxid.c: dropping privileges (setgroups, setgid, setuid) makes glibc
/// signal every thread it created, the agent's too, and wait for each. It
/// must not hang: in a forked child (whose writer thread is a new one), nor
/// under `--control` (whose serving thread is one more), and the process
/// that dropped them keeps its trace whole.
#[test]
fn dropping_privileges_reaches_every_agent_thread() {
    let src = "setxid.c";
    for (flags, mode) in [
        (&[][..], "fork"),
        (&["--control"][..], ""),
        (&["--control"][..], "fork"),
    ] {
        let dir = TestDir::new(&format!("setxid_{}_{mode}", flags.len()));
        let prog = compile_c(&dir, src);
        let run = run(&dir, flags, &prog, &[mode]);
        assert_eq!(run.code(), 0, "{flags:?} {mode}: {}", run.describe());
        assert_eq!(run.stdout, "dropped\n", "{flags:?} {mode}");
        assert_no_events_lost_in_summary(&run);
        let dropper = if mode == "fork" {
            let others = dir.other_traces();
            assert_eq!(others.len(), 1, "{flags:?}: {others:?}");
            others[0].clone()
        } else {
            dir.trace()
        };
        let report = leaks(&dropper);
        assert_complete(&report);
        let lost: Vec<&Value> = records(&report)
            .iter()
            .filter(|r| r["kind"] == "definitely_lost")
            .collect();
        assert_eq!(lost.len(), 1, "{flags:?} {mode}: {lost:?}");
        assert_eq!(lost[0]["bytes"], 40, "{}", lost[0]);
        let top = &lost[0]["stack"][0];
        assert_eq!(top["function"], "drop", "{}", lost[0]);
        assert_eq!(top["line"], marker_line(src, "drop-leak"), "{}", lost[0]);
    }
}

/// `redis-server --port 7777 --save ''` was shown as `... --save`: the empty
/// argument was dropped from the process record. And a program started
/// through a symlink was named by the file the symlink names
/// (`redis-server` by `redis-check-rdb`), in the process record and in
/// every frame. Now the record keeps every argument, the text quotes those
/// a shell would not read back as they are, and the program is named as it
/// was started.
#[test]
fn the_command_line_and_the_program_are_named_as_started() {
    let dir = TestDir::new("named_as_started");
    let prog = compile_c(&dir, "leaks.c");
    let alias = prog.with_file_name("alias");
    std::os::unix::fs::symlink(&prog, &alias).expect("symlink");
    let args = ["--save", "", "two words", "it's"];
    let run = run(&dir, &[], &alias, &args);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let report = leaks(&dir.trace());
    let alias_text = alias.display().to_string();
    let mut expected = vec![alias_text.clone()];
    expected.extend(args.iter().map(|a| a.to_string()));
    assert_eq!(process_command(&report), expected);
    assert_eq!(field(&report, "process")["executable"], json!(alias_text));
    let modules: Vec<&str> = records(&report)
        .iter()
        .flat_map(|r| as_array(r, "stack"))
        .filter(|f| as_str(f, "function") == "main")
        .map(|f| as_str(f, "module"))
        .collect();
    assert_eq!(modules.len(), 7, "{modules:?}");
    assert!(modules.iter().all(|m| *m == alias_text), "{modules:?}");
    let text = leaks_text(&dir.trace(), &[]);
    let line = format!("Command: {alias_text} --save '' 'two words' 'it'\\''s'\n");
    assert!(text.contains(&line), "{text}");
}
