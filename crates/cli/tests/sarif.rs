//! `--format sarif` on `leaks` and `deadlocks`: every log is validated
//! against the OASIS SARIF 2.1.0 schema, and each finding the JSON report
//! holds is one result, located at the program's first frame with a file
//! and a line, at the level `--error-exitcode` gives it.

mod common;

use common::*;
use serde_json::{json, Value};
use std::path::Path;

fn results(log: &Value) -> &Vec<Value> {
    let runs = as_array(log, "runs");
    assert_eq!(runs.len(), 1, "{}", pretty(log));
    as_array(&runs[0], "results")
}

/// (ruleId, level, file name, line) of a result's primary location.
fn placed(result: &Value) -> (String, String, String, u64) {
    let physical = &result["locations"][0]["physicalLocation"];
    let uri = physical["artifactLocation"]["uri"]
        .as_str()
        .unwrap_or_else(|| panic!("no file: {}", pretty(result)));
    assert!(uri.starts_with("file:///"), "{uri}");
    (
        as_str(result, "ruleId").to_owned(),
        as_str(result, "level").to_owned(),
        uri.rsplit('/').next().unwrap().to_owned(),
        physical["region"]["startLine"].as_u64().expect("a line"),
    )
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

/// The rule of each result is in the run's rules, at its ruleIndex.
fn assert_rules_indexed(log: &Value) {
    let rules = as_array(&log["runs"][0]["tool"]["driver"], "rules");
    for r in results(log) {
        let i = as_u64(r, "ruleIndex") as usize;
        assert_eq!(rules[i]["id"], r["ruleId"], "{}", pretty(log));
        assert!(
            rules[i]["shortDescription"]["text"].is_string(),
            "{}",
            pretty(&rules[i])
        );
    }
}

#[test]
fn every_loss_record_is_a_result_at_its_line_in_the_program() {
    let dir = TestDir::new("sarif_leaks");
    let prog = compile_c(&dir, "leaks.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let trace = dir.trace();
    let log = sarif("leaks", &trace, &["--kinds", "all"]);
    assert_eq!(log["version"], json!("2.1.0"));
    assert_rules_indexed(&log);
    let report = leaks(&trace);
    // The same records, judged the same: the rule is the JSON kind.
    let kinds = |bytes: u64| {
        records(&report)
            .iter()
            .find(|r| r["bytes"] == json!(bytes))
            .map(|r| as_str(r, "kind").to_owned())
            .unwrap_or_else(|| panic!("no record of {bytes} bytes: {}", pretty(&report)))
    };
    let level = |kind: &str| match kind {
        "definitely_lost" | "possibly_lost" => "error",
        "indirectly_lost" => "warning",
        _ => "note",
    };
    let line = |marker| marker_line("leaks.c", marker);
    let expected = [
        (100, "LEAK-ONE"),
        (192, "LOOP"),
        (200, "CALLOC"),
        (300, "REALLOC-GROW"),
        (128, "POSIX-MEMALIGN"),
        (96, "ALIGNED-ALLOC"),
        // strdup's own frame has a file and line (libc's debug
        // information): the location is the program's caller.
        (16, "STRDUP"),
    ];
    let want: Vec<_> = expected
        .iter()
        .map(|&(bytes, marker)| {
            let kind = kinds(bytes);
            let lvl = level(&kind).to_owned();
            (kind, lvl, "leaks.c".to_owned(), line(marker), bytes)
        })
        .collect();
    let got: Vec<_> = results(&log)
        .iter()
        .map(|r| {
            let (rule, level, file, line) = placed(r);
            (rule, level, file, line, as_u64(&r["properties"], "bytes"))
        })
        .collect();
    assert_eq!(sorted(got), sorted(want), "{}", pretty(&log));
    assert_eq!(results(&log).len(), records(&report).len());
    // The whole stack follows, innermost frame first.
    let strdup = results(&log)
        .iter()
        .find(|r| r["properties"]["bytes"] == json!(16))
        .unwrap();
    let frames = as_array(&strdup["stacks"][0], "frames");
    let function = |f: &Value| {
        f["location"]["logicalLocations"][0]["fullyQualifiedName"]
            .as_str()
            .unwrap_or("?")
            .to_owned()
    };
    let names: Vec<String> = frames.iter().map(function).collect();
    let at = names
        .iter()
        .position(|n| n == "leak_strdup")
        .expect("leak_strdup");
    assert_eq!(names[at + 1], "main", "{names:?}");
    let kind = kinds(16).replace('_', " ");
    assert_eq!(
        strdup["message"]["text"],
        json!(format!(
            "16 bytes in 1 block is {kind}, allocated by malloc in leak_strdup (leaks.c:{}).",
            line("STRDUP")
        ))
    );
    let fingerprint = &strdup["partialFingerprints"]["trapline/stackFunctions/v1"];
    assert_eq!(
        fingerprint.as_str().map(str::len),
        Some(16),
        "{}",
        pretty(strdup)
    );
}

#[test]
fn allocation_errors_are_errors_with_their_other_stacks() {
    let dir = TestDir::new("sarif_errors");
    let prog = compile_c(&dir, "errors.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let log = sarif("leaks", &dir.trace(), &[]);
    assert_rules_indexed(&log);
    let line = |marker| marker_line("errors.c", marker);
    let got: Vec<_> = results(&log).iter().map(placed).collect();
    let error = |rule: &str, marker| {
        (
            rule.to_owned(),
            "error".to_owned(),
            "errors.c".to_owned(),
            line(marker),
        )
    };
    assert_eq!(
        sorted(got),
        sorted(vec![
            error("double_free", "DF-FREE2"),
            error("invalid_free", "INVALID-STACK"),
            error("invalid_free", "INVALID-INTERIOR"),
            error("invalid_realloc", "INVALID-REALLOC"),
        ]),
        "{}",
        pretty(&log)
    );
    let double = results(&log)
        .iter()
        .find(|r| r["ruleId"] == json!("double_free"))
        .unwrap();
    let related: Vec<(String, u64)> = as_array(double, "relatedLocations")
        .iter()
        .map(|l| {
            (
                l["message"]["text"].as_str().unwrap().to_owned(),
                l["physicalLocation"]["region"]["startLine"]
                    .as_u64()
                    .unwrap(),
            )
        })
        .collect();
    assert_eq!(
        related,
        vec![
            ("where the block was allocated".to_owned(), line("DF-ALLOC")),
            ("where it was first released".to_owned(), line("DF-FREE1")),
        ]
    );
    assert_eq!(as_array(double, "stacks").len(), 3, "{}", pretty(double));
}

#[test]
fn a_potential_deadlock_is_an_error_with_a_flow_per_thread() {
    let dir = TestDir::new("sarif_cycle");
    let prog = compile_c(&dir, "lock_orders.c");
    let run = run(&dir, &[], &prog, &["ab"]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let addr = printed_addresses(&run.stdout);
    let log = sarif("deadlocks", &dir.trace(), &[]);
    assert_rules_indexed(&log);
    let all = results(&log);
    assert_eq!(all.len(), 1, "{}", pretty(&log));
    let (rule, level, file, line) = placed(&all[0]);
    assert_eq!(
        (rule.as_str(), level.as_str(), file.as_str()),
        ("potential_deadlock", "error", "lock_orders.c")
    );
    let requests = [
        marker_line("lock_orders.c", "AB_SECOND"),
        marker_line("lock_orders.c", "BA_SECOND"),
    ];
    assert!(requests.contains(&line), "{line} {}", pretty(&log));
    let flows = as_array(&all[0]["codeFlows"][0], "threadFlows");
    assert_eq!(flows.len(), 2, "{}", pretty(&log));
    assert_ne!(flows[0]["id"], flows[1]["id"]);
    // Each thread takes one lock, then requests the other.
    let mut steps: Vec<(u64, String)> = Vec::new();
    for flow in flows {
        let locations = as_array(flow, "locations");
        assert_eq!(locations.len(), 2, "{}", pretty(flow));
        let request = &locations[1]["location"];
        steps.push((
            request["physicalLocation"]["region"]["startLine"]
                .as_u64()
                .unwrap(),
            request["message"]["text"].as_str().unwrap().to_owned(),
        ));
    }
    let ab = marker_line("lock_orders.c", "AB_SECOND");
    let ba = marker_line("lock_orders.c", "BA_SECOND");
    assert_eq!(
        sorted(steps),
        sorted(vec![
            (
                ab,
                format!("requests mutex {} (exclusive) while holding it", addr["B"])
            ),
            (
                ba,
                format!("requests mutex {} (exclusive) while holding it", addr["A"])
            ),
        ])
    );
}

#[test]
fn lock_misuse_is_located_where_it_happened() {
    let dir = TestDir::new("sarif_misuse");
    let prog = compile_c(&dir, "lock_misuse.c");
    let run = run(&dir, &[], &prog, &["errors"]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let log = sarif("deadlocks", &dir.trace(), &[]);
    assert_rules_indexed(&log);
    let line = |m| marker_line("lock_misuse.c", m);
    let got: Vec<_> = results(&log).iter().map(placed).collect();
    let error = |rule: &str, marker| {
        (
            rule.to_owned(),
            "error".to_owned(),
            "lock_misuse.c".to_owned(),
            line(marker),
        )
    };
    assert_eq!(
        sorted(got),
        sorted(vec![
            error("unlock_not_held", "UNLOCK-NOT-HELD"),
            error("destroy_locked", "DESTROY-LOCKED"),
            // A thread's end has no stack: where it took the lock names it.
            error("thread_end_holding", "KEPT-LOCK"),
            error("refused_by_libc", "CHECKED-RELOCK"),
        ]),
        "{}",
        pretty(&log)
    );
}

#[test]
fn a_trace_without_findings_is_a_valid_log_with_no_results() {
    let dir = TestDir::new("sarif_clean");
    let prog = compile_c(&dir, "clean.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    for command in ["leaks", "deadlocks"] {
        let log = sarif(command, &dir.trace(), &[]);
        assert_eq!(results(&log), &Vec::<Value>::new(), "{}", pretty(&log));
        let invocation = &log["runs"][0]["invocations"][0];
        assert_eq!(invocation["executionSuccessful"], json!(true));
        assert_eq!(
            invocation["properties"]["trace"],
            json!(dir.trace().display().to_string())
        );
    }
    assert!(Path::new(&dir.trace()).exists());
}
