//! End-to-end: `trapline deadlocks` on the lock-order scenarios of
//! lock_orders.c, the misuse of lock_misuse.c and the real deadlock of
//! lock_deadlock.c.

mod common;

use common::*;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};

fn deadlocks(trace: &std::path::Path) -> Value {
    let finished = analysis("deadlocks", trace);
    assert_eq!(finished.code(), 0, "{}", finished.describe());
    serde_json::from_str(&finished.stdout).expect("JSON")
}

/// Runs lock_orders.c in `mode`; returns the report and the lock addresses.
fn lock_orders(mode: &str) -> (Value, HashMap<String, String>) {
    let (report, addr, _) = lock_orders_traced(mode);
    (report, addr)
}

/// The same, and the directory of the trace.
fn lock_orders_traced(mode: &str) -> (Value, HashMap<String, String>, TestDir) {
    let dir = TestDir::new(&format!("deadlocks_{mode}"));
    let prog = compile_c(&dir, "lock_orders.c");
    let run = run(&dir, &[], &prog, &[mode]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_no_events_lost_in_summary(&run);
    let report = deadlocks(&dir.trace());
    assert_eq!(report["trace"]["complete"], json!(true));
    assert_eq!(report["errors"], json!([]), "{}", pretty(&report));
    assert_eq!(report["actual_deadlocks"], json!([]), "{}", pretty(&report));
    let addr = printed_addresses(&run.stdout);
    (report, addr, dir)
}

fn cycles(report: &Value) -> &Vec<Value> {
    as_array(report, "cycles")
}

/// The lock addresses of a cycle, sorted.
fn cycle_locks(cycle: &Value) -> Vec<String> {
    let mut v: Vec<String> = as_array(cycle, "locks")
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    v.sort();
    v
}

fn sorted(names: &[&str], addr: &HashMap<String, String>) -> Vec<String> {
    let mut v: Vec<String> = names.iter().map(|n| addr[*n].clone()).collect();
    v.sort();
    v
}

/// The edge of `cycle` that requests `requested`.
fn edge_requesting<'a>(cycle: &'a Value, requested: &str) -> &'a Value {
    as_array(cycle, "edges")
        .iter()
        .find(|e| as_str(e, "requested") == requested)
        .unwrap_or_else(|| panic!("no edge requests {requested}: {}", pretty(cycle)))
}

fn assert_no_cycles(report: &Value) {
    assert_eq!(cycles(report), &Vec::<Value>::new(), "{}", pretty(report));
    assert_eq!(report["summary"]["potential_deadlocks"], json!(0));
    assert_eq!(report["summary"]["lock_order_inversions"], json!(0));
}

#[test]
fn two_threads_in_opposite_orders_are_one_potential_deadlock() {
    let (report, addr) = lock_orders("ab");
    let cycles = cycles(&report);
    assert_eq!(cycles.len(), 1, "{}", pretty(&report));
    let c = &cycles[0];
    assert_eq!(c["kind"], json!("potential_deadlock"));
    assert_eq!(cycle_locks(c), sorted(&["A", "B"], &addr));
    assert_eq!(c["occurrences"], json!(1));
    let edges = as_array(c, "edges");
    assert_eq!(edges.len(), 2);
    assert_ne!(edges[0]["thread"], edges[1]["thread"]);
    let ab = edge_requesting(c, &addr["B"]);
    assert_eq!(ab["held"], json!(addr["A"]));
    assert_eq!(ab["count"], json!(1));
    assert_stack_top(
        stack_of(ab, "requested_stack"),
        &[(
            "lock_a_then_b",
            "lock_orders.c",
            marker_line("lock_orders.c", "AB_SECOND"),
        )],
        "A->B request",
    );
    assert_eq!(
        stack_of(ab, "held_stack")[0]["line"],
        json!(marker_line("lock_orders.c", "AB_SECOND") - 1)
    );
    assert_eq!(frame_function(&stack_of(ab, "held_stack")[1]), "first_ab");
    let ba = edge_requesting(c, &addr["A"]);
    assert_stack_top(
        stack_of(ba, "requested_stack"),
        &[
            (
                "lock_b_then_a",
                "lock_orders.c",
                marker_line("lock_orders.c", "BA_SECOND"),
            ),
            (
                "second_ba",
                "lock_orders.c",
                marker_line("lock_orders.c", "CALL-BA"),
            ),
        ],
        "B->A request",
    );
    assert_eq!(report["summary"]["potential_deadlocks"], json!(1));
    assert_eq!(report["summary"]["lock_order_inversions"], json!(0));
}

#[test]
fn trylock_then_lock_against_the_opposite_order_is_one_potential_deadlock() {
    let (report, addr) = lock_orders("trylock");
    let cycles = cycles(&report);
    assert_eq!(cycles.len(), 1, "{}", pretty(&report));
    assert_eq!(cycles[0]["kind"], json!("potential_deadlock"));
    assert_eq!(cycle_locks(&cycles[0]), sorted(&["A", "B"], &addr));
    // The trylocked A is held by the edge into B, taken at the trylock.
    let edge = edge_requesting(&cycles[0], &addr["B"]);
    assert_eq!(
        stack_of(edge, "held_stack")[0]["line"],
        json!(marker_line("lock_orders.c", "TRY_FIRST"))
    );
    assert_eq!(
        stack_of(edge, "requested_stack")[0]["line"],
        json!(marker_line("lock_orders.c", "TRY_THEN_LOCK"))
    );
}

#[test]
fn a_trylock_adds_no_edge_into_its_lock() {
    let (report, _) = lock_orders("trylock_both");
    assert_no_cycles(&report);
    assert_eq!(report["summary"]["lock_graph_edges"], json!(1));
}

#[test]
fn a_common_gate_lock_prevents_the_deadlock() {
    let (report, _) = lock_orders("gate");
    assert_no_cycles(&report);
    // G->A, G->B, A->B and B->A were all seen.
    assert_eq!(report["summary"]["lock_graph_edges"], json!(4));
}

/// The parent holds G from before it creates a child (A then B) until it
/// has joined it: the child's edges are guarded by G through its parent,
/// and another thread taking G, B then A cannot deadlock with it. This was
/// reported as a potential deadlock. Released before the join, G guards
/// nothing of the child: the deadlock is real and still reported.
#[test]
fn a_gate_lock_held_by_the_parent_through_create_and_join_guards_the_child() {
    let (report, _) = lock_orders("parent_gate");
    assert_no_cycles(&report);
    let (report, addr) = lock_orders("parent_gate_released");
    let cycles = cycles(&report);
    assert_eq!(cycles.len(), 1, "{}", pretty(&report));
    assert_eq!(cycles[0]["kind"], json!("potential_deadlock"));
    assert_eq!(cycle_locks(&cycles[0]), sorted(&["A", "B"], &addr));
}

#[test]
fn threads_ordered_by_join_and_create_cannot_deadlock() {
    let (report, _) = lock_orders("joined");
    assert_no_cycles(&report);
    assert_eq!(report["summary"]["lock_graph_edges"], json!(2));
    assert_eq!(report["summary"]["threads"], json!(2));
}

#[test]
fn five_dining_philosophers_are_one_cycle_of_five_locks() {
    let (report, addr) = lock_orders("philosophers");
    let cycles = cycles(&report);
    assert_eq!(cycles.len(), 1, "{}", pretty(&report));
    let c = &cycles[0];
    assert_eq!(c["kind"], json!("potential_deadlock"));
    assert_eq!(
        cycle_locks(c),
        sorted(&["F0", "F1", "F2", "F3", "F4"], &addr)
    );
    let edges = as_array(c, "edges");
    assert_eq!(edges.len(), 5);
    let mut threads: Vec<u64> = edges.iter().map(|e| as_u64(e, "thread")).collect();
    threads.sort();
    threads.dedup();
    assert_eq!(threads.len(), 5, "five different threads: {}", pretty(c));
    for (i, e) in edges.iter().enumerate() {
        // Each step holds the lock the previous one requested.
        let next = &edges[(i + 1) % 5];
        assert_eq!(e["requested"], next["held"], "{}", pretty(c));
        assert_stack_top(
            stack_of(e, "requested_stack"),
            &[(
                "philosopher",
                "lock_orders.c",
                marker_line("lock_orders.c", "PHILOSOPHER_SECOND"),
            )],
            "philosopher request",
        );
    }
}

#[test]
fn read_read_on_an_rwlock_does_not_block() {
    let (report, _) = lock_orders("readread");
    assert_no_cycles(&report);
    assert_eq!(report["summary"]["lock_graph_edges"], json!(2));
}

#[test]
fn read_then_write_on_an_rwlock_is_a_potential_deadlock() {
    let (report, addr) = lock_orders("readwrite");
    let cycles = cycles(&report);
    assert_eq!(cycles.len(), 1, "{}", pretty(&report));
    assert_eq!(cycles[0]["kind"], json!("potential_deadlock"));
    assert_eq!(cycle_locks(&cycles[0]), sorted(&["A", "R"], &addr));
    let into_r = edge_requesting(&cycles[0], &addr["R"]);
    assert_eq!(into_r["requested_mode"], json!("write"));
    let into_a = edge_requesting(&cycles[0], &addr["A"]);
    assert_eq!(into_a["held_mode"], json!("read"));
}

#[test]
fn opposite_orders_in_one_thread_are_a_lock_order_inversion_only() {
    let (report, addr) = lock_orders("inversion");
    let cycles = cycles(&report);
    assert_eq!(cycles.len(), 1, "{}", pretty(&report));
    assert_eq!(cycles[0]["kind"], json!("lock_order_inversion"));
    assert_eq!(cycle_locks(&cycles[0]), sorted(&["A", "B"], &addr));
    let edges = as_array(&cycles[0], "edges");
    assert_eq!(edges[0]["thread"], edges[1]["thread"]);
    assert_eq!(report["summary"]["potential_deadlocks"], json!(0));
    assert_eq!(report["summary"]["lock_order_inversions"], json!(1));
}

/// The only error of `kind`.
fn error<'a>(report: &'a Value, kind: &str) -> &'a Value {
    let found: Vec<&Value> = errors(report)
        .iter()
        .filter(|e| as_str(e, "kind") == kind)
        .collect();
    assert_eq!(found.len(), 1, "one {kind} expected: {}", pretty(report));
    found[0]
}

fn top_line(item: &Value, key: &str) -> Value {
    stack_of(item, key)
        .first()
        .map_or(Value::Null, |f| f["line"].clone())
}

#[test]
fn lock_misuse_is_reported_with_its_stacks() {
    let dir = TestDir::new("deadlocks_misuse");
    let prog = compile_c(&dir, "lock_misuse.c");
    let run = run(&dir, &[], &prog, &["errors"]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let report = deadlocks(&dir.trace());
    let line = |m| json!(marker_line("lock_misuse.c", m));
    assert_eq!(errors(&report).len(), 4, "{}", pretty(&report));

    let e = error(&report, "unlock_not_held");
    assert_eq!(top_line(e, "stack"), line("UNLOCK-NOT-HELD"));
    assert_eq!(e["lock_kind"], json!("mutex"));
    assert_eq!(e["count"], json!(1));

    let e = error(&report, "destroy_locked");
    assert_eq!(top_line(e, "stack"), line("DESTROY-LOCKED"));
    assert_eq!(top_line(e, "held_stack"), line("DESTROYED-LOCK"));

    let e = error(&report, "thread_end_holding");
    assert_eq!(stack_of(e, "stack"), &Vec::<Value>::new());
    assert_eq!(top_line(e, "held_stack"), line("KEPT-LOCK"));
    assert_eq!(
        frame_function(&stack_of(e, "held_stack")[0]),
        "exits_holding"
    );

    let e = error(&report, "refused_by_libc");
    assert_eq!(e["lock_kind"], json!("errorcheck_mutex"));
    assert_eq!(top_line(e, "stack"), line("CHECKED-RELOCK"));
    assert_eq!(top_line(e, "held_stack"), line("CHECKED-LOCK"));

    assert_eq!(cycles(&report), &Vec::<Value>::new());
    assert_eq!(report["actual_deadlocks"], json!([]));
}

/// Starts FIXTURE ARGS under `trapline run FLAGS` and waits for its
/// "deadlocked PID" line (written once the kernel shows its threads blocked).
fn start_stuck(
    dir: &TestDir,
    fixture: &str,
    flags: &[&str],
    args: &[&str],
) -> (std::process::Child, i32) {
    let prog = compile_c(dir, fixture);
    let cmd = isolated(run_command(dir, flags, &prog, args));
    stuck_child(cmd)
}

/// The same, started by a shell that replaces itself with it (`exec`).
fn start_stuck_behind_exec(
    dir: &TestDir,
    fixture: &str,
    flags: &[&str],
) -> (std::process::Child, i32) {
    let prog = compile_c(dir, fixture);
    let script = format!("exec {}", prog.display());
    let cmd = isolated(run_command(
        dir,
        flags,
        Path::new("/bin/sh"),
        &["-c", &script],
    ));
    stuck_child(cmd)
}

fn stuck_child(mut cmd: Command) -> (std::process::Child, i32) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start trapline run");
    let line = read_stdout_line(&mut child);
    let Some(pid) = line
        .strip_prefix("deadlocked ")
        .and_then(|rest| rest.trim().parse().ok())
    else {
        let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
        let finished = finish(child, "trapline run");
        panic!(
            "the fixture never got stuck (got {line:?})\n{}",
            finished.describe()
        );
    };
    (child, pid)
}

#[test]
fn self_deadlock_is_recorded_before_the_thread_blocks_and_sigterm_completes_the_trace() {
    let dir = TestDir::new("deadlocks_self");
    let (child, pid) = start_stuck(&dir, "lock_misuse.c", &[], &["self_deadlock"]);
    kill(Pid::from_raw(pid), Signal::SIGTERM).expect("signal the traced program");
    let run = finish(child, "trapline run");
    assert_eq!(run.code(), 143, "{}", run.describe());
    // The summary counts what `deadlocks` reports: it said "errors found: 0".
    assert!(
        run.stderr
            .contains("==trapline== errors found: 2 (1 lock misuse, 1 actual deadlock)\n"),
        "{}",
        run.describe()
    );
    let report = deadlocks(&dir.trace());
    assert_eq!(report["trace"]["complete"], json!(true));
    assert_eq!(process_exit(&report), &json!({"signal": 15}));
    let line = |m| json!(marker_line("lock_misuse.c", m));
    let e = error(&report, "self_deadlock");
    assert_eq!(top_line(e, "stack"), line("SELF-DEADLOCK"));
    assert_eq!(top_line(e, "held_stack"), line("FIRST-LOCK"));
    assert_eq!(errors(&report).len(), 1, "{}", pretty(&report));
    // The thread waits for itself.
    let actual = as_array(&report, "actual_deadlocks");
    assert_eq!(actual.len(), 1, "{}", pretty(&report));
    let waiter = &actual[0]["threads"][0];
    assert_eq!(waiter["thread"], json!(pid));
    assert_eq!(waiter["held_by"], json!(pid));
}

#[test]
/// Behind a shell's `exec`: the hint names the program's trace, not the
/// shell's (it named the shell's).
fn a_real_deadlock_stopped_by_timeout_shows_who_waits_for_whom() {
    let dir = TestDir::new("deadlocks_actual");
    let (child, pid) = start_stuck_behind_exec(&dir, "lock_deadlock.c", &["--timeout", "3"]);
    let run = finish(child, "trapline run");
    assert_eq!(run.code(), 124, "{}", run.describe());
    let trace = dir.path().join(format!("t.trace.{pid}"));
    assert!(
        run.stderr.contains(&format!(
            "stopped by --timeout: if it hung on a lock, see: trapline deadlocks {}\n",
            trace.display()
        )),
        "{}",
        run.describe()
    );
    let report = deadlocks(&trace);
    assert_eq!(report["trace"]["complete"], json!(true));
    assert_eq!(process_exit(&report), &json!({"signal": 15}));
    let actual = as_array(&report, "actual_deadlocks");
    assert_eq!(actual.len(), 1, "{}", pretty(&report));
    let threads = as_array(&actual[0], "threads");
    assert_eq!(threads.len(), 2, "{}", pretty(&report));
    let line = |m| json!(marker_line("lock_deadlock.c", m));
    let one = threads
        .iter()
        .find(|w| stack_of(w, "requested_stack")[0]["function"] == json!("one"))
        .expect("thread one waits");
    let two = threads
        .iter()
        .find(|w| stack_of(w, "requested_stack")[0]["function"] == json!("two"))
        .expect("thread two waits");
    assert_eq!(one["held_by"], two["thread"]);
    assert_eq!(two["held_by"], one["thread"]);
    assert_eq!(top_line(one, "requested_stack"), line("ONE-WAITS-B"));
    assert_eq!(top_line(one, "held_stack"), line("TWO-HOLDS-B"));
    assert_eq!(top_line(two, "requested_stack"), line("TWO-WAITS-A"));
    assert_eq!(top_line(two, "held_stack"), line("ONE-HOLDS-A"));
    assert_ne!(one["waits_for"], two["waits_for"]);
    assert_eq!(errors(&report).len(), 0, "{}", pretty(&report));

    // In SARIF: one error, each thread a flow from the lock it took to
    // the one it waits for.
    let log = sarif("deadlocks", &trace, &[]);
    let results = as_array(&log["runs"][0], "results");
    assert_eq!(results.len(), 1, "{}", pretty(&log));
    assert_eq!(results[0]["ruleId"], json!("actual_deadlock"));
    assert_eq!(results[0]["level"], json!("error"));
    let step_lines = |flow: &Value| -> Vec<Value> {
        as_array(flow, "locations")
            .iter()
            .map(|l| l["location"]["physicalLocation"]["region"]["startLine"].clone())
            .collect()
    };
    let mut flows: Vec<Vec<Value>> = as_array(&results[0]["codeFlows"][0], "threadFlows")
        .iter()
        .map(step_lines)
        .collect();
    flows.sort_by_key(|f| f[0].as_u64());
    let mut want = vec![
        vec![line("ONE-HOLDS-A"), line("ONE-WAITS-B")],
        vec![line("TWO-HOLDS-B"), line("TWO-WAITS-A")],
    ];
    want.sort_by_key(|f| f[0].as_u64());
    assert_eq!(flows, want, "{}", pretty(&log));
}

#[test]
fn a_timeout_that_is_not_a_positive_number_is_bad_usage() {
    let dir = TestDir::new("deadlocks_bad_timeout");
    for value in ["0", "-1", "soon"] {
        let run = run(
            &dir,
            &["--timeout", value],
            std::path::Path::new("/bin/true"),
            &[],
        );
        assert_eq!(run.code(), 2, "--timeout {value}: {}", run.describe());
        assert!(run.stderr.contains("--timeout"), "{}", run.describe());
    }
}

#[test]
fn cpp_std_mutex_in_opposite_orders_is_one_potential_deadlock() {
    let dir = TestDir::new("deadlocks_cpp");
    let prog = compile_cpp(&dir, "lock_orders.cpp");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let addr = printed_addresses(&run.stdout);
    let report = deadlocks(&dir.trace());
    let cycles = cycles(&report);
    assert_eq!(cycles.len(), 1, "{}", pretty(&report));
    assert_eq!(cycles[0]["kind"], json!("potential_deadlock"));
    assert_eq!(cycle_locks(&cycles[0]), sorted(&["first", "second"], &addr));
    let into_second = edge_requesting(&cycles[0], &addr["second"]);
    let stack = stack_of(into_second, "requested_stack");
    // std::lock_guard's constructor calls std::mutex::lock (inlined or not
    // at -O0); the program's line is the first frame in lock_orders.cpp.
    let frame = stack
        .iter()
        .find(|f| basename(f.get("file")) == "lock_orders.cpp")
        .unwrap_or_else(|| panic!("no frame in lock_orders.cpp: {}", show_stack(stack)));
    assert_eq!(
        frame["line"],
        json!(marker_line("lock_orders.cpp", "CPP-FIRST-SECOND"))
    );
}

#[test]
fn a_fork_child_unlocking_its_parents_atfork_lock_is_no_error() {
    let dir = TestDir::new("deadlocks_fork");
    let prog = compile_c(&dir, "lock_fork.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let children = dir.other_traces();
    assert_eq!(children.len(), 1, "one child trace: {children:?}");
    for trace in [dir.trace(), children[0].clone()] {
        let report = deadlocks(&trace);
        assert_eq!(report["has_lock_events"], json!(true));
        assert_eq!(report["errors"], json!([]), "{}", pretty(&report));
    }
}

/// lock_ring.c: N threads in a ring, thread i taking L[i] then L[i+1]. A
/// potential deadlock through all N locks and N threads. The cycle search
/// stopped at 12 locks, and said nothing: a ring of 13 was not reported.
#[test]
fn rings_of_any_length_are_one_potential_deadlock() {
    for n in [13usize, 40] {
        let dir = TestDir::new(&format!("lock_ring_{n}"));
        let prog = compile_c(&dir, "lock_ring.c");
        let run = run(&dir, &[], &prog, &[&n.to_string()]);
        assert_eq!(run.code(), 0, "{}", run.describe());
        let addr = printed_addresses(&run.stdout);
        let report = deadlocks(&dir.trace());
        assert_eq!(report["warnings"], json!([]), "{n}: {}", pretty(&report));
        let cycles = cycles(&report);
        assert_eq!(cycles.len(), 1, "{n}: {}", pretty(&report));
        let c = &cycles[0];
        assert_eq!(c["kind"], json!("potential_deadlock"));
        let names: Vec<String> = (0..n).map(|i| format!("L{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        assert_eq!(cycle_locks(c), sorted(&names, &addr));
        let threads: std::collections::HashSet<_> = as_array(c, "edges")
            .iter()
            .map(|e| e["thread"].clone())
            .collect();
        assert_eq!(threads.len(), n, "{}", pretty(c));
    }
}

/// join_deadlock.c: main holds L and joins the worker, which waits for L.
/// The hung run was reported as no deadlock at all, and `locks` showed L
/// uncontended with nothing waited. A thread in pthread_join waits for the
/// thread it joins: the wait-for cycle is main -> worker -> main; and the
/// worker's wait, still under way at the end, counts as contention.
#[test]
fn a_deadlock_through_join_is_an_actual_deadlock() {
    let dir = TestDir::new("deadlocks_join");
    let (child, pid) = start_stuck(&dir, "join_deadlock.c", &[], &[]);
    kill(Pid::from_raw(pid), Signal::SIGTERM).expect("signal the traced program");
    let run = finish(child, "trapline run");
    assert_eq!(run.code(), 143, "{}", run.describe());
    let report = deadlocks(&dir.trace());
    assert_eq!(report["trace"]["complete"], json!(true));
    let line = |m| json!(marker_line("join_deadlock.c", m));
    let actual = as_array(&report, "actual_deadlocks");
    assert_eq!(actual.len(), 1, "{}", pretty(&report));
    let threads = as_array(&actual[0], "threads");
    assert_eq!(threads.len(), 2, "{}", pretty(&report));
    let joiner = threads
        .iter()
        .find(|w| w["waits_in"] == json!("join"))
        .expect("main waits in join");
    let worker = threads
        .iter()
        .find(|w| w["waits_in"] == json!("lock"))
        .expect("the worker waits for L");
    assert_eq!(joiner["thread"], json!(pid));
    assert_eq!(joiner["held_by"], worker["thread"]);
    assert_eq!(worker["held_by"], json!(pid));
    assert_eq!(top_line(joiner, "requested_stack"), line("MAIN-JOINS"));
    assert_eq!(top_line(worker, "requested_stack"), line("WORKER-WAITS-L"));
    assert_eq!(top_line(worker, "held_stack"), line("MAIN-HOLDS-L"));

    let locks = analysis("locks", &dir.trace());
    assert_eq!(locks.code(), 0, "{}", locks.describe());
    let locks: Value = serde_json::from_str(&locks.stdout).expect("JSON");
    let l = &as_array(&locks, "locks")[0];
    assert_eq!(l["address"], worker["waits_for"], "{}", pretty(&locks));
    assert_eq!(
        (l["contended"].clone(), l["waiting_at_end"].clone()),
        (json!(1), json!(1)),
        "{}",
        pretty(l)
    );
    assert!(as_u64(&l["wait_ns"], "total") > 0, "{}", pretty(l));
}

/// A thread holding A joins a child that took A. The child took and
/// released A before the parent, which waited for it, took A: nothing hung,
/// and nothing was reported. Had the parent taken A first, the child would
/// have waited for A and the parent for the child. The join is a step of
/// the lock graph: A -> the child's run -> A, a potential deadlock of the
/// parent's join and the child's request.
#[test]
fn holding_a_lock_the_joined_thread_takes_is_a_potential_deadlock() {
    let (report, addr, dir) = lock_orders_traced("join_holding");
    let cycles = cycles(&report);
    assert_eq!(cycles.len(), 1, "{}", pretty(&report));
    let c = &cycles[0];
    assert_eq!(c["kind"], json!("potential_deadlock"));
    assert_eq!(c["locks"], json!([addr["A"], "0x0"]), "{}", pretty(c));
    assert_eq!(c["other_edges"], json!([]), "{}", pretty(c));
    let edges = as_array(c, "edges");
    assert_eq!(edges.len(), 2, "{}", pretty(c));
    let (join, child) = (&edges[0], &edges[1]);
    let line = |m| marker_line("lock_orders.c", m);
    // The parent holds A and joins the child.
    assert_eq!(
        (
            &join["held"],
            &join["held_kind"],
            &join["requested"],
            &join["requested_kind"],
            &join["requested_mode"],
            &join["joined"],
        ),
        (
            &json!(addr["A"]),
            &json!("mutex"),
            &json!("0x0"),
            &json!("thread"),
            &json!("join"),
            &child["thread"],
        ),
        "{}",
        pretty(c)
    );
    assert_stack_top(
        stack_of(join, "held_stack"),
        &[("main", "lock_orders.c", line("JOINER_HOLDS_A"))],
        "A held at the join",
    );
    assert_stack_top(
        stack_of(join, "requested_stack"),
        &[("main", "lock_orders.c", line("JOIN_HOLDING_A"))],
        "the join",
    );
    // The child, running until the join returns, requests A.
    assert_ne!(child["thread"], join["thread"]);
    assert_eq!(
        (
            &child["held"],
            &child["held_kind"],
            &child["held_mode"],
            &child["requested"],
            &child["requested_kind"],
            &child["joined"],
        ),
        (
            &json!("0x0"),
            &json!("thread"),
            &json!("running"),
            &json!(addr["A"]),
            &json!("mutex"),
            &json!(0),
        ),
        "{}",
        pretty(c)
    );
    assert_stack_top(
        stack_of(child, "held_stack"),
        &[("main", "lock_orders.c", line("CREATE_JOINED"))],
        "the child's creation",
    );
    assert_stack_top(
        stack_of(child, "requested_stack"),
        &[(
            "takes_a_then_gives_turn",
            "lock_orders.c",
            line("JOINED_TAKES_A"),
        )],
        "the child's request",
    );
    assert_eq!(report["summary"]["potential_deadlocks"], json!(1));
    assert_eq!(report["summary"]["lock_graph_edges"], json!(0));

    let mut cmd = Command::new(trapline());
    cmd.arg("deadlocks").arg(dir.trace());
    let text = output_of(cmd, "trapline deadlocks");
    assert_eq!(text.code(), 0, "{}", text.describe());
    let child_tid = as_u64(child, "thread");
    for expected in [
        format!(
            "POTENTIAL DEADLOCK #1: {a} -> thread {child_tid} -> {a} (seen 1 time)",
            a = addr["A"]
        ),
        format!(
            "thread {} holds mutex {} (exclusive) and joins thread {child_tid}, 1 time",
            join["thread"], addr["A"]
        ),
        format!(
            "thread {child_tid} runs until joined and requests mutex {} (exclusive), 1 time",
            addr["A"]
        ),
    ] {
        assert!(
            text.stdout.contains(&expected),
            "{expected:?} in:\n{}",
            text.stdout
        );
    }
}

/// A joined thread that never takes the lock held at the join: no cycle.
#[test]
fn holding_a_lock_the_joined_thread_never_takes_is_no_cycle() {
    let (report, _) = lock_orders("join_holding_other");
    assert_no_cycles(&report);
}

/// Runs lock_misuse.c in `mode`; returns how the run ended and its report.
fn misuse_report(mode: &str) -> (Finished, Value) {
    let dir = TestDir::new(&format!("deadlocks_misuse_{mode}"));
    let prog = compile_c(&dir, "lock_misuse.c");
    let run = run(&dir, &[], &prog, &[mode]);
    let report = deadlocks(&dir.trace());
    assert_eq!(report["trace"]["complete"], json!(true), "{mode}");
    (run, report)
}

/// The main thread ending the process while it holds a lock (returning
/// from main, calling exit, killed by a signal) was not reported.
#[test]
fn the_process_ending_while_main_holds_a_lock_is_misuse() {
    let line = |m| json!(marker_line("lock_misuse.c", m));
    for (mode, code) in [
        ("main_returns_holding", 0),
        ("main_exits_holding", 0),
        ("main_killed_holding", 143),
    ] {
        let (run, report) = misuse_report(mode);
        assert_eq!(run.code(), code, "{mode}: {}", run.describe());
        assert_eq!(errors(&report).len(), 1, "{mode}: {}", pretty(&report));
        let e = error(&report, "main_end_holding");
        assert_eq!(top_line(e, "held_stack"), line("MAIN-HOLDS"), "{mode}");
        assert_eq!(e["context"], json!("taken"));
        assert_eq!(e["lock_kind"], json!("mutex"));
    }
}

/// A lock used after pthread_mutex_destroy, or after the block it lives in
/// was freed, and memory never made a lock (it was labelled
/// `adaptive_mutex`): each one report, with where it was destroyed or
/// freed. A thread that destroys a lock it holds and then ends holding it
/// is one misuse: one report (it was two).
#[test]
fn locks_used_after_destroy_or_free_or_never_made_are_misuse() {
    let line = |m| json!(marker_line("lock_misuse.c", m));
    let (run, report) = misuse_report("after_destroy");
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(errors(&report).len(), 1, "{}", pretty(&report));
    let e = error(&report, "use_after_destroy");
    assert_eq!(top_line(e, "stack"), line("LOCK-AFTER-DESTROY"));
    assert_eq!(top_line(e, "held_stack"), line("DESTROYED-HERE"));
    assert_eq!(e["context"], json!("destroyed"));
    assert_eq!(e["lock_kind"], json!("mutex"));

    let (run, report) = misuse_report("after_free");
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(errors(&report).len(), 1, "{}", pretty(&report));
    let e = error(&report, "use_after_free");
    assert_eq!(top_line(e, "stack"), line("LOCK-AFTER-FREE"));
    assert_eq!(top_line(e, "held_stack"), line("FREED-HERE"));
    assert_eq!(e["context"], json!("freed"));

    let (run, report) = misuse_report("unknown_lock");
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(errors(&report).len(), 1, "{}", pretty(&report));
    let e = error(&report, "unknown_lock");
    assert_eq!(top_line(e, "stack"), line("UNKNOWN-LOCK"));
    assert_eq!(e["lock_kind"], json!("unknown"));

    let (run, report) = misuse_report("destroy_then_end");
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(errors(&report).len(), 1, "{}", pretty(&report));
    let e = error(&report, "destroy_locked");
    assert_eq!(top_line(e, "stack"), line("DESTROY-HELD-THEN-END"));
    assert_eq!(top_line(e, "held_stack"), line("DESTROYING-THREAD-LOCK"));
}

/// Unlocks the C library refuses: a destroyed mutex and memory that was
/// never one (Helgrind's tc09_bad_unlock) return EINVAL, and were not
/// reported at all; an error-checking mutex the thread does not own
/// returns EPERM. Each is one report, named by what the replay knows of
/// the address, at the unlock. Zeroed memory is a default mutex to glibc:
/// its unlock succeeds, an unlock of a lock not held.
#[test]
fn unlocks_the_c_library_refuses_are_misuse() {
    let line = |m| json!(marker_line("lock_misuse.c", m));
    let (run, report) = misuse_report("invalid_unlock");
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(errors(&report).len(), 4, "{}", pretty(&report));

    let e = error(&report, "use_after_destroy");
    assert_eq!(top_line(e, "stack"), line("UNLOCK-AFTER-DESTROY"));
    assert_eq!(top_line(e, "held_stack"), line("DESTROYED-BEFORE-UNLOCK"));
    assert_eq!(e["context"], json!("destroyed"));
    assert_eq!(e["lock_kind"], json!("mutex"));
    assert_eq!(e["count"], json!(1));

    let e = error(&report, "unknown_lock");
    assert_eq!(top_line(e, "stack"), line("UNLOCK-BOGUS"));
    assert_eq!(e["lock_kind"], json!("unknown"));
    assert_eq!(e["count"], json!(1));

    let not_held: Vec<&Value> = errors(&report)
        .iter()
        .filter(|e| e["kind"] == json!("unlock_not_held"))
        .collect();
    let mut seen: Vec<(Value, Value, Value)> = not_held
        .iter()
        .map(|e| {
            (
                top_line(e, "stack"),
                e["lock_kind"].clone(),
                e["count"].clone(),
            )
        })
        .collect();
    seen.sort_by_key(|s| s.0.as_u64());
    assert_eq!(
        seen,
        [
            (
                line("UNLOCK-NOT-OWNED"),
                json!("errorcheck_mutex"),
                json!(1)
            ),
            (line("UNLOCK-ZEROED"), json!("mutex"), json!(1)),
        ],
        "{}",
        pretty(&report)
    );
}

/// Four unordered threads: A then B in two functions (two threads at one
/// site, one at another), B then A in one. The report showed one edge per
/// step ("1 time") and dropped the other threads and the second site: every
/// distinct thread and site is now listed.
#[test]
fn every_thread_and_site_of_a_cycle_is_listed() {
    let (report, addr) = lock_orders("sites");
    let cycles = cycles(&report);
    assert_eq!(cycles.len(), 1, "{}", pretty(&report));
    let c = &cycles[0];
    assert_eq!(cycle_locks(c), sorted(&["A", "B"], &addr));
    let all: Vec<&Value> = as_array(c, "edges")
        .iter()
        .chain(as_array(c, "other_edges"))
        .collect();
    let threads: std::collections::HashSet<_> = all.iter().map(|e| e["thread"].clone()).collect();
    assert_eq!(threads.len(), 4, "{}", pretty(c));
    let line = |m| json!(marker_line("lock_orders.c", m));
    let ab_sites: std::collections::HashSet<_> = all
        .iter()
        .filter(|e| e["held"] == json!(addr["A"]))
        .map(|e| top_line(e, "requested_stack"))
        .collect();
    assert_eq!(
        ab_sites,
        [line("AB_SECOND"), line("AB_OTHER_SITE")]
            .into_iter()
            .collect()
    );
    assert_eq!(all.len(), 4, "{}", pretty(c));
}

/// One thread takes a row of 1,000 locks pairwise forward, another
/// backward: 999 cycles at the same two call sites. The text listed each
/// (about 20,000 lines); they are one group now, shown once with a bounded
/// list of the others, while the JSON keeps every cycle.
#[test]
fn cycles_repeated_over_many_locks_are_one_group() {
    let dir = TestDir::new("deadlocks_row");
    let prog = compile_c(&dir, "lock_orders.c");
    let run = run(&dir, &[], &prog, &["row"]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let report = deadlocks(&dir.trace());
    assert_eq!(cycles(&report).len(), 999);
    assert_eq!(report["summary"]["potential_deadlocks"], json!(999));
    let groups = as_array(&report, "cycle_groups");
    assert_eq!(groups.len(), 1, "{}", pretty(&report["cycle_groups"]));
    assert_eq!(as_array(&groups[0], "cycles").len(), 999);
    assert_eq!(as_array(&groups[0], "threads").len(), 2);
    let mut cmd = Command::new(trapline());
    cmd.arg("deadlocks").arg(dir.trace());
    let text = output_of(cmd, "trapline deadlocks");
    assert_eq!(text.code(), 0, "{}", text.describe());
    let lines = text.stdout.lines().count();
    assert!(lines < 60, "{lines} lines:\n{}", text.stdout);
    assert!(
        text.stdout
            .contains("one of 999 cycles through the same call sites"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("... and 993 more"), "{}", text.stdout);
}

/// `trapline deadlocks --error-exitcode N` exits N for a potential deadlock
/// and 0 where a gate lock prevents it.
#[test]
fn deadlocks_error_exitcode() {
    for (mode, expected) in [("ab", 3), ("gate", 0)] {
        let dir = TestDir::new(&format!("deadlocks_exitcode_{mode}"));
        let prog = compile_c(&dir, "lock_orders.c");
        let run = run(&dir, &[], &prog, &[mode]);
        assert_eq!(run.code(), 0, "{}", run.describe());
        let mut cmd = Command::new(trapline());
        cmd.arg("deadlocks")
            .arg(dir.trace())
            .args(["--error-exitcode", "3"]);
        let finished = output_of(cmd, "trapline deadlocks");
        assert_eq!(finished.code(), expected, "{mode}: {}", finished.describe());
    }
}

/// What a lock_orders.c report says, with lock addresses as their names:
/// the summary's counts and, per cycle, its kind, locks and the top line
/// of each edge's held and requested stacks.
fn cycle_summary(report: &Value, addr: &HashMap<String, String>) -> Value {
    let name: HashMap<&str, &str> = addr.iter().map(|(n, a)| (a.as_str(), n.as_str())).collect();
    let named = |a: &Value| json!(name.get(a.as_str().unwrap()).copied().unwrap_or("?"));
    let summary = &report["summary"];
    let cycles: Vec<Value> = cycles(report)
        .iter()
        .map(|c| {
            let mut edges: Vec<Value> = as_array(c, "edges")
                .iter()
                .map(|e| {
                    json!([
                        named(&e["held"]),
                        top_line(e, "held_stack"),
                        named(&e["requested"]),
                        top_line(e, "requested_stack"),
                    ])
                })
                .collect();
            edges.sort_by_key(|e| e.to_string());
            json!({"kind": c["kind"], "edges": edges})
        })
        .collect();
    json!({
        "potential_deadlocks": summary["potential_deadlocks"],
        "lock_order_inversions": summary["lock_order_inversions"],
        "lock_graph_edges": summary["lock_graph_edges"],
        "cycles": cycles,
    })
}

/// Production mode records a lock-order pair once per thread, without an
/// event for the acquisitions around it: each scenario's verdict, cycles,
/// and the lines of both stacks of every edge are a full recording's.
#[test]
fn production_mode_finds_the_cycles_a_full_recording_finds() {
    let dir = TestDir::new("deadlocks_production");
    let prog = compile_c(&dir, "lock_orders.c");
    let modes = [
        "ab",
        "trylock",
        "trylock_both",
        "gate",
        "parent_gate",
        "parent_gate_released",
        "joined",
        "philosophers",
        "readread",
        "readwrite",
        "inversion",
    ];
    for mode in modes {
        let mut seen = Vec::new();
        for flags in [&[][..], &["--production"][..]] {
            let run = run(&dir, flags, &prog, &[mode]);
            assert_eq!(run.code(), 0, "{mode} {flags:?}: {}", run.describe());
            let report = deadlocks(&dir.trace());
            assert_eq!(report["errors"], json!([]), "{mode}: {}", pretty(&report));
            assert_eq!(report["actual_deadlocks"], json!([]));
            assert_eq!(report["production_mode"], json!(!flags.is_empty()));
            seen.push(cycle_summary(&report, &printed_addresses(&run.stdout)));
        }
        assert_eq!(seen[1], seen[0], "{mode}: production against full");
    }
}

/// A hung ABBA deadlock recorded in production mode: each thread's
/// contended request is recorded with the lock it holds, so the trace's end
/// shows who waits for whom, with both stacks' lines.
#[test]
fn a_real_deadlock_recorded_in_production_mode_is_found() {
    let dir = TestDir::new("deadlocks_actual_production");
    let flags = ["--production", "--timeout", "3"];
    let (child, pid) = start_stuck(&dir, "lock_deadlock.c", &flags, &[]);
    let run = finish(child, "trapline run");
    assert_eq!(run.code(), 124, "{}", run.describe());
    let report = deadlocks(&dir.trace());
    assert_eq!(report["trace"]["complete"], json!(true));
    assert_eq!(report["process"]["pid"], json!(pid));
    let actual = as_array(&report, "actual_deadlocks");
    assert_eq!(actual.len(), 1, "{}", pretty(&report));
    let line = |m| json!(marker_line("lock_deadlock.c", m));
    let mut waits: Vec<(Value, Value)> = as_array(&actual[0], "threads")
        .iter()
        .map(|w| (top_line(w, "requested_stack"), top_line(w, "held_stack")))
        .collect();
    waits.sort_by_key(|w| w.0.as_u64());
    let mut want = vec![
        (line("ONE-WAITS-B"), line("TWO-HOLDS-B")),
        (line("TWO-WAITS-A"), line("ONE-HOLDS-A")),
    ];
    want.sort_by_key(|w| w.0.as_u64());
    assert_eq!(waits, want, "{}", pretty(&report));
    assert_eq!(errors(&report).len(), 0, "{}", pretty(&report));
}
