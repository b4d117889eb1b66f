//! Locks on the replay: the host's lock fixtures, recorded in a QEMU guest
//! and replayed with the plugin trapping their pthread functions, give
//! the reports `trapline locks` and `trapline deadlocks` give for
//! `trapline run` on the host: counts, kinds, errors, cycles, functions
//! and lines. Addresses differ (the host randomizes them); each fixture
//! prints its locks' addresses by name.
//!
//! Needs what tests/vm.rs needs (`.ci/run` installs it).

mod common;

use common::vm::*;
use common::*;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;

/// A program's run on the host and its replay from the guest.
struct Both {
    _dir: TestDir,
    host: std::path::PathBuf,
    guest: std::path::PathBuf,
    host_addresses: HashMap<String, String>,
    guest_addresses: HashMap<String, String>,
}

/// `flags` go to both `trapline run` and `trapline vm record`.
fn host_and_guest(name: &str, source: &str, flags: &[&str], args: &[&str]) -> Both {
    let dir = TestDir::new(name);
    let program = compile_c(&dir, source);
    let host = run(&dir, flags, &program, args);
    let recorded = {
        let kernel = guest_kernel();
        let image = kernel.image.to_string_lossy().into_owned();
        let program = program.to_string_lossy().into_owned();
        let mut a = vec!["record", "-o", "rec", "--kernel", &image];
        a.extend_from_slice(flags);
        a.extend_from_slice(&["--", &program]);
        a.extend_from_slice(args);
        vm(&dir, &a)
    };
    assert_eq!(recorded.code(), host.code(), "{}", recorded.describe());
    let replayed = vm(&dir, &["replay", "rec", "-o", "guest.trace"]);
    assert_eq!(replayed.code(), 0, "{}", replayed.describe());
    Both {
        host: dir.trace(),
        guest: dir.path().join("guest.trace"),
        host_addresses: printed_addresses(&host.stdout),
        guest_addresses: printed_addresses(&recorded.stdout),
        _dir: dir,
    }
}

/// A stack as (function, file name, line) of the program's own frames.
fn own_frames(stack: &Value) -> Value {
    let frames: Vec<Value> = stack
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| {
            f["file"]
                .as_str()
                .is_some_and(|p| p.contains("tests/fixtures/"))
        })
        .map(|f| {
            let file = f["file"].as_str().unwrap_or("");
            let name = Path::new(file).file_name().and_then(|n| n.to_str());
            json!([f["function"], name, f["line"]])
        })
        .collect();
    Value::Array(frames)
}

/// Replaces every address the program printed by its name, and every
/// stack by its own frames, leaving out `ignored` keys: what must be the
/// same on the host and in the guest.
fn normalized(v: &Value, names: &HashMap<String, String>, ignored: &[&str]) -> Value {
    let by_address: HashMap<&str, &str> = names
        .iter()
        .map(|(n, a)| (a.as_str(), n.as_str()))
        .collect();
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !ignored.contains(&k.as_str()))
                .filter(|(k, _)| !matches!(k.as_str(), "thread" | "threads_ids" | "tid"))
                .map(|(k, x)| {
                    let x = if k.ends_with("stack") {
                        own_frames(x)
                    } else {
                        normalized(x, names, ignored)
                    };
                    (k.clone(), x)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|x| normalized(x, names, ignored))
                .collect(),
        ),
        Value::String(s) => match by_address.get(s.as_str()) {
            Some(name) => json!(format!("<{name}>")),
            None => v.clone(),
        },
        _ => v.clone(),
    }
}

/// lock_contention.c: every lock's kind, mode, acquisitions, threads,
/// busy trylocks, timeouts, first use and its stack, and the hand-off's
/// one contended acquisition by the waiter, as on the host. The counter's
/// contention depends on the host's scheduling, so it is left out there.
#[test]
fn a_replayed_guest_has_the_hosts_lock_profile() {
    let both = host_and_guest("vm_lock_contention", "lock_contention.c", &[], &[]);
    let host = analysis_json("locks", &both.host);
    let guest = analysis_json("locks", &both.guest);
    assert_eq!(guest["has_lock_events"], json!(true));
    let timing = [
        "wait_ns",
        "hold_ns",
        "agent_ns_in_holds",
        "address",
        "process",
        "trace",
        "totals",
    ];
    let view = |report: &Value, names: &HashMap<String, String>| {
        let mut locks: Vec<Value> = as_array(report, "locks")
            .iter()
            .map(|l| {
                let name = names
                    .iter()
                    .find(|(_, a)| l["address"] == json!(a))
                    .map(|(n, _)| n.clone())
                    .unwrap_or_default();
                let mut ignored = timing.to_vec();
                if name == "counter_lock" {
                    ignored.extend(["contended", "owner_changes", "top_sites"]);
                }
                let mut v = normalized(l, names, &ignored);
                v["name"] = json!(name);
                v
            })
            .collect();
        locks.sort_by_key(|l| format!("{}/{}", l["name"], l["mode"]));
        locks
    };
    let want = view(&host, &both.host_addresses);
    assert_eq!(want.len(), 6, "{}", pretty(&host));
    let got = view(&guest, &both.guest_addresses);
    assert_eq!(got, want, "guest:\n{}", pretty(&guest));
    for key in ["locks", "acquisitions", "threads"] {
        assert_eq!(guest["totals"][key], host["totals"][key], "{key}");
    }
    assert_eq!(guest["errors"], json!([]));
    // The hand-off's wait is the guest's clock: the waiter blocked until
    // main saw it blocked and unlocked.
    let handoff = as_array(&guest, "locks")
        .iter()
        .find(|l| l["address"] == json!(both.guest_addresses["handoff"]))
        .expect("the hand-off lock");
    assert_eq!(handoff["contended"], json!(1));
    assert!(
        as_u64(&handoff["wait_ns"], "total") > 0,
        "{}",
        pretty(handoff)
    );
}

/// lock_misuse.c errors: the unlock of a lock not held, the destroy of a
/// locked lock, a thread ending while it holds one and glibc's refusal of
/// an error-checking relock, each with its stacks, as on the host.
#[test]
fn a_replayed_guest_has_the_hosts_lock_misuse() {
    let both = host_and_guest("vm_lock_misuse", "lock_misuse.c", &[], &["errors"]);
    let host = analysis_json("deadlocks", &both.host);
    let guest = analysis_json("deadlocks", &both.guest);
    // lock_misuse.c prints no addresses: each error's stacks name its lock.
    let ignored = ["address", "process", "trace", "lock"];
    let errors = |r: &Value, names| normalized(&r["errors"], names, &ignored);
    let want = errors(&host, &both.host_addresses);
    assert_eq!(want.as_array().map(Vec::len), Some(4), "{}", pretty(&host));
    assert_eq!(errors(&guest, &both.guest_addresses), want);
    let kinds: Vec<&str> = as_array(&guest, "errors")
        .iter()
        .map(|e| as_str(e, "kind"))
        .collect();
    assert_eq!(
        kinds,
        [
            "unlock_not_held",
            "destroy_locked",
            "thread_end_holding",
            "refused_by_libc"
        ],
        "{}",
        pretty(&guest)
    );
}

/// lock_ring.c with 3 threads: one potential deadlock through the three
/// locks, each edge by its own thread, with the host's stacks.
#[test]
fn a_replayed_guest_has_the_hosts_three_lock_cycle() {
    let both = host_and_guest("vm_lock_ring", "lock_ring.c", &[], &["3"]);
    let host = analysis_json("deadlocks", &both.host);
    let guest = analysis_json("deadlocks", &both.guest);
    let ignored = ["address", "process", "trace"];
    let cycles = |r: &Value, names| normalized(&r["cycles"], names, &ignored);
    let want = cycles(&host, &both.host_addresses);
    assert_eq!(want.as_array().map(Vec::len), Some(1), "{}", pretty(&host));
    assert_eq!(cycles(&guest, &both.guest_addresses), want);
    let threads: std::collections::HashSet<String> =
        as_array(&as_array(&guest, "cycles")[0], "edges")
            .iter()
            .map(|e| e["thread"].to_string())
            .collect();
    assert_eq!(threads.len(), 3, "{}", pretty(&guest));
    assert_eq!(guest["errors"], json!([]));
}

/// lock_deadlock.c hangs in an ABBA deadlock: stopped by --timeout on the
/// host and in the guest (guest time there, the recording kept), its
/// replay has the host's actual deadlock: each thread waiting for the
/// lock the other took, at the host's functions and lines.
#[test]
fn a_replayed_guest_that_hung_has_the_hosts_actual_deadlock() {
    let both = host_and_guest(
        "vm_lock_deadlock",
        "lock_deadlock.c",
        &["--timeout", "3"],
        &[],
    );
    let host = analysis_json("deadlocks", &both.host);
    let guest = analysis_json("deadlocks", &both.guest);
    assert_eq!(
        process_exit(&guest),
        &json!({"signal": 15}),
        "{}",
        pretty(&guest)
    );
    let ignored = [
        "address",
        "process",
        "trace",
        "held_by",
        "waits_for",
        "lock",
    ];
    let want = normalized(&host["actual_deadlocks"], &both.host_addresses, &ignored);
    assert_eq!(want.as_array().map(Vec::len), Some(1), "{}", pretty(&host));
    assert_eq!(
        normalized(&guest["actual_deadlocks"], &both.guest_addresses, &ignored),
        want,
        "guest:\n{}",
        pretty(&guest)
    );
    // Who waits for whom: each thread for the other.
    let threads = as_array(&as_array(&guest, "actual_deadlocks")[0], "threads");
    assert_eq!(threads.len(), 2, "{}", pretty(&guest));
    assert_eq!(threads[0]["held_by"], threads[1]["thread"]);
    assert_eq!(threads[1]["held_by"], threads[0]["thread"]);
    assert_eq!(guest["cycles"], json!([]));
    assert_eq!(guest["errors"], json!([]));
}
