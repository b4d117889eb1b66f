//! `trapline run --record`: each recorder alone records what it records
//! exactly as a full recording does, and nothing of the others; every
//! analysis says what was not recorded.

mod common;

use common::*;
use serde_json::{json, Value};

/// The trace of lock_contention.c recorded with `flags`.
fn recorded(name: &str, flags: &[&str]) -> (TestDir, Value, Value) {
    let dir = TestDir::new(name);
    let prog = compile_c(&dir, "lock_contention.c");
    let run = run(&dir, flags, &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert!(run.stdout.contains("counter=4000"), "{}", run.describe());
    let stats = analysis_json("stats", &dir.trace());
    let locks = analysis_json("locks", &dir.trace());
    (dir, stats, locks)
}

/// The acquisitions of the lock whose first use is at `marker`.
fn acquisitions_at(locks: &Value, marker: &str) -> u64 {
    let line = marker_line("lock_contention.c", marker);
    let found = as_array(locks, "locks")
        .iter()
        .find(|l| {
            stack_of(l, "first_use_stack")
                .iter()
                .any(|f| f.get("line").and_then(Value::as_u64) == Some(line))
        })
        .unwrap_or_else(|| panic!("a lock first used at {marker}: {}", pretty(locks)));
    as_u64(found, "acquisitions")
}

/// `--record locks`: the 4,000 acquisitions of the counter's lock as in a
/// full recording, no allocation; `leaks` and `stats` say allocations were
/// not recorded.
#[test]
fn locks_alone_are_recorded_as_in_full() {
    let (dir, stats, locks) = recorded("record_locks", &["--record", "locks"]);
    assert_eq!(stats["recorded"], json!({"memory": false, "locks": true}));
    assert_eq!(stats["allocation_calls"], json!(0));
    assert_eq!(locks["locks_recorded"], json!(true));
    assert_eq!(acquisitions_at(&locks, "COUNTER-LOCK"), 4000);
    let leaks = leaks(&dir.trace());
    assert!(
        as_array(&leaks, "warnings").iter().any(|w| w
            .as_str()
            .unwrap()
            .starts_with("allocations were not recorded")),
        "{}",
        pretty(&leaks)
    );
    assert_eq!(as_array(&leaks, "records").len(), 0);
}

/// `--record mem`: the same allocation calls as a full recording, and no
/// lock event; `locks` says locks were not recorded.
#[test]
fn memory_alone_is_recorded_as_in_full() {
    let (_full_dir, full, _) = recorded("record_full", &[]);
    let (dir, stats, locks) = recorded("record_mem", &["--record", "mem"]);
    assert_eq!(stats["recorded"], json!({"memory": true, "locks": false}));
    assert_eq!(full["recorded"], json!({"memory": true, "locks": true}));
    assert!(as_u64(&stats, "allocation_calls") > 0);
    assert_eq!(stats["allocation_calls"], full["allocation_calls"]);
    assert_eq!(stats["release_calls"], full["release_calls"]);
    assert_eq!(locks["locks_recorded"], json!(false));
    assert_eq!(locks["has_lock_events"], json!(false));
    let out = std::process::Command::new(trapline())
        .arg("locks")
        .arg(dir.trace())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Locks were not recorded (trapline run --record without locks)."),
        "{text}"
    );
}

/// `--record cpu`: CPU samples of profile_shares.c's known functions, and
/// neither allocations nor locks.
#[test]
fn cpu_alone_is_sampled() {
    let dir = TestDir::new("record_cpu");
    let prog = compile_c(&dir, "profile_shares.c");
    let run = run(&dir, &["--record", "cpu"], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let stats = analysis_json("stats", &dir.trace());
    assert_eq!(stats["recorded"], json!({"memory": false, "locks": false}));
    assert_eq!(stats["allocation_calls"], json!(0));
    let profile = analysis_json("profile", &dir.trace());
    assert_eq!(profile["rate_hz"], json!(999));
    assert!(as_u64(&profile, "samples") > 500, "{}", pretty(&profile));
    let burn = as_array(&profile, "functions")
        .iter()
        .find(|f| f["function"] == json!("burn"))
        .unwrap_or_else(|| panic!("burn in {}", pretty(&profile)))
        .clone();
    assert!(burn["total_percent"].as_f64().unwrap() > 90.0, "{burn}");
}

/// A recorder that is not one is bad usage.
#[test]
fn an_unknown_recorder_is_refused() {
    let out = std::process::Command::new(trapline())
        .args(["run", "--record", "mem,heap", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("heap"), "{err}");
}
