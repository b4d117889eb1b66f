//! End-to-end: `trapline locks` on lock_contention.c, whose locks have exact
//! acquisition counts and exactly one contended acquisition.

mod common;

use common::*;
use serde_json::{json, Value};

fn lock<'a>(report: &'a Value, address: &str, mode: &str) -> &'a Value {
    let found: Vec<&Value> = as_array(report, "locks")
        .iter()
        .filter(|l| as_str(l, "address") == address && as_str(l, "mode") == mode)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one lock {address} ({mode}) expected: {}",
        pretty(report)
    );
    found[0]
}

/// The hand-off lock's one contending site: the waiter's HANDOFF-WAIT.
fn assert_one_contending_site(handoff: &Value) {
    let sites = as_array(handoff, "top_sites");
    assert_eq!(sites.len(), 1, "{}", pretty(handoff));
    assert_eq!(sites[0]["contended"], json!(1));
    assert_stack_top(
        stack_of(&sites[0], "stack"),
        &[(
            "waiter",
            "lock_contention.c",
            marker_line("lock_contention.c", "HANDOFF-WAIT"),
        )],
        "handoff contending site",
    );
}

#[test]
fn contention_profile_counts_every_acquisition() {
    let dir = TestDir::new("locks_contention");
    let prog = compile_c(&dir, "lock_contention.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_no_events_lost_in_summary(&run);
    let addr = printed_addresses(&run.stdout);
    let report = {
        let finished = analysis("locks", &dir.trace());
        assert_eq!(finished.code(), 0, "{}", finished.describe());
        serde_json::from_str::<Value>(&finished.stdout).expect("JSON")
    };
    assert_eq!(report["has_lock_events"], json!(true));
    assert_eq!(report["trace"]["complete"], json!(true));

    // 4 workers x 1000 rounds; none of them is forced to wait, but every
    // worker's first acquisition follows another thread's.
    let counter = lock(&report, &addr["counter_lock"], "exclusive");
    assert_eq!(counter["kind"], json!("mutex"));
    assert_eq!(counter["acquisitions"], json!(4000));
    assert_eq!(counter["threads"], json!(4));
    assert!(as_u64(counter, "owner_changes") >= 3, "{}", pretty(counter));
    assert!(as_u64(counter, "contended") <= 4000);
    assert_eq!(counter["first_use"], json!("first_acquisition"));
    let line = marker_line("lock_contention.c", "COUNTER-LOCK");
    assert_stack_top(
        stack_of(counter, "first_use_stack"),
        &[("worker", "lock_contention.c", line)],
        "counter_lock first use",
    );

    // The hand-off: exactly one contended acquisition, by the waiter.
    let handoff = lock(&report, &addr["handoff"], "exclusive");
    assert_eq!(handoff["acquisitions"], json!(2));
    assert_eq!(handoff["contended"], json!(1));
    assert_eq!(handoff["owner_changes"], json!(1));
    assert_eq!(handoff["threads"], json!(2));
    assert!(handoff["wait_ns"]["total"].as_u64().unwrap() > 0);
    assert_eq!(handoff["wait_ns"]["total"], handoff["wait_ns"]["max"]);
    assert_eq!(handoff["first_use"], json!("init"));
    assert_stack_top(
        stack_of(handoff, "first_use_stack"),
        &[(
            "main",
            "lock_contention.c",
            marker_line("lock_contention.c", "HANDOFF-INIT"),
        )],
        "handoff init",
    );
    assert_one_contending_site(handoff);
    // Most contended first, then most owner changes.
    let order: Vec<(u64, u64)> = as_array(&report, "locks")
        .iter()
        .map(|l| (as_u64(l, "contended"), as_u64(l, "owner_changes")))
        .collect();
    let mut sorted = order.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(order, sorted, "{}", pretty(&report));

    let busy = lock(&report, &addr["busy"], "exclusive");
    assert_eq!(busy["acquisitions"], json!(1));
    assert_eq!(busy["try_failures"], json!(1));
    assert_eq!(busy["timeouts"], json!(1));
    assert_eq!(busy["contended"], json!(0));

    let read = lock(&report, &addr["table"], "read");
    assert_eq!(read["kind"], json!("rwlock"));
    assert_eq!(read["acquisitions"], json!(3));
    let write = lock(&report, &addr["table"], "write");
    assert_eq!(write["acquisitions"], json!(2));
    let spin = lock(&report, &addr["spin"], "exclusive");
    assert_eq!(spin["kind"], json!("spinlock"));
    assert_eq!(spin["acquisitions"], json!(10));

    assert_eq!(as_array(&report, "locks").len(), 6, "{}", pretty(&report));
    assert_eq!(report["totals"]["locks"], json!(5));
    assert_eq!(report["totals"]["acquisitions"], json!(4018));
    assert_eq!(report["errors"], json!([]));

    // The text form says the same.
    let mut cmd = std::process::Command::new(trapline());
    cmd.arg("locks").arg(dir.trace());
    let text = output_of(cmd, "trapline locks");
    assert_eq!(text.code(), 0, "{}", text.describe());
    assert!(
        text.stdout
            .contains("mutex ADDR (exclusive): 2 acquisitions, 1 contended (50.0%), 1 owner changes, 2 threads".replace("ADDR", &addr["handoff"]).as_str())
            && text.stdout.contains("Totals: 5 locks, 4,018 acquisitions,"),
        "{}",
        text.stdout
    );
    assert_eq!(report["locks_omitted"], json!(0));

    // --top lists the highest-ranked entries of the same order, and the
    // totals still count them all.
    let mut cmd = std::process::Command::new(trapline());
    cmd.arg("locks")
        .arg(dir.trace())
        .args(["--top", "2", "--format", "json"]);
    let top = output_of(cmd, "trapline locks --top 2");
    assert_eq!(top.code(), 0, "{}", top.describe());
    let top: Value = serde_json::from_str(&top.stdout).expect("JSON");
    assert_eq!(as_array(&top, "locks")[..], as_array(&report, "locks")[..2]);
    assert_eq!(top["locks_omitted"], json!(4));
    assert_eq!(top["totals"], report["totals"]);
    let mut cmd = std::process::Command::new(trapline());
    cmd.arg("locks").arg(dir.trace()).args(["--top", "5"]);
    let text = output_of(cmd, "trapline locks --top 5");
    assert!(
        text.stdout
            .contains("  ... and 1 more ranked lower (--top 0 lists all)\n"),
        "{}",
        text.stdout
    );
    assert_eq!(text.stdout.matches("  #").count(), 5, "{}", text.stdout);
}

#[test]
fn a_trace_without_locks_says_so() {
    let dir = TestDir::new("locks_none");
    let prog = compile_c(&dir, "clean.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    for command in ["locks", "deadlocks"] {
        let finished = analysis(command, &dir.trace());
        assert_eq!(finished.code(), 0, "{}", finished.describe());
        let report: Value = serde_json::from_str(&finished.stdout).unwrap();
        assert_eq!(report["has_lock_events"], json!(false));
        let mut cmd = std::process::Command::new(trapline());
        cmd.arg(command).arg(dir.trace());
        let text = output_of(cmd, command);
        assert!(
            text.stdout.contains("The trace holds no lock events"),
            "{}",
            text.stdout
        );
    }
}

/// lock_lifetimes.c: ThreadSanitizer's real_deadlock_detector_stress_test,
/// rwlocks destroyed by one thread, initialised again by another and locked
/// by a third, ordered only by atomics. Every use lies inside its lock's
/// lifetime; requests of a busy lock were stamped in their thread's order
/// rather than the lock's, so one could sort before the lock's init (or
/// after its destroy) and read as a use after destroy: 3-8 such reports
/// per run. None, every run.
#[test]
fn locks_destroyed_and_reinitialised_across_threads_are_no_misuse() {
    let dir = TestDir::new("locks_lifetimes");
    let prog = compile_c(&dir, "lock_lifetimes.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_no_events_lost_in_summary(&run);
    for command in ["locks", "deadlocks"] {
        let report = analysis_json(command, &dir.trace());
        assert_eq!(report["trace"]["complete"], json!(true));
        assert_eq!(
            report["errors"],
            json!([]),
            "{command}: {}",
            pretty(&report)
        );
    }
    let report = analysis_json("deadlocks", &dir.trace());
    assert_eq!(report["cycles"], json!([]), "{}", pretty(&report));
}

/// Production mode: the one contended acquisition is recorded with its
/// wait and stack; the uncontended rwlock and spinlock, never held while
/// taking another lock or creating a thread, write no event at all.
#[test]
fn production_mode_records_the_contended_acquisition_and_nothing_uncontended() {
    let dir = TestDir::new("locks_production");
    let prog = compile_c(&dir, "lock_contention.c");
    let run = run(&dir, &["--production"], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_no_events_lost_in_summary(&run);
    let addr = printed_addresses(&run.stdout);
    let finished = analysis("locks", &dir.trace());
    assert_eq!(finished.code(), 0, "{}", finished.describe());
    let report: Value = serde_json::from_str(&finished.stdout).expect("JSON");
    assert_eq!(report["production_mode"], json!(true));
    assert_eq!(report["errors"], json!([]), "{}", pretty(&report));
    // Main's hold, recorded as it creates the waiter under it, and the
    // waiter's.
    let handoff = lock(&report, &addr["handoff"], "exclusive");
    assert_eq!(handoff["acquisitions"], json!(2), "{}", pretty(handoff));
    assert_eq!(handoff["contended"], json!(1));
    assert!(handoff["wait_ns"]["total"].as_u64().unwrap() > 0);
    assert_one_contending_site(handoff);
    for name in ["table", "spin"] {
        let listed = as_array(&report, "locks")
            .iter()
            .any(|l| as_str(l, "address") == addr[name]);
        assert!(!listed, "{name} has events: {}", pretty(&report));
    }
    let mut cmd = std::process::Command::new(trapline());
    cmd.arg("locks").arg(dir.trace());
    let text = output_of(cmd, "trapline locks");
    assert!(
        text.stdout
            .contains("PRODUCTION MODE: only contended acquisitions"),
        "{}",
        text.stdout
    );
}
