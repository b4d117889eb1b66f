//! `trapline diff A B`: two runs of sampled_leaks.c that differ only in
//! how many requests they serve, matched site by site.

mod common;

use common::*;
use serde_json::{json, Value};
use std::process::Command;

fn diff(a: &std::path::Path, b: &std::path::Path, format: &str) -> Finished {
    let mut cmd = Command::new(trapline());
    cmd.args(["diff", "--format", format]).arg(a).arg(b);
    output_of(cmd, "trapline diff")
}

/// 30,000 requests against 25,000: parse_request's path leaks 4,000 more
/// blocks of 1,000 bytes and load_config's 1,000 more of 200; every other
/// site (churn, main's malloc and realloc) is the same.
#[test]
fn diff_names_the_sites_that_changed_by_exactly_how_much() {
    let dir = TestDir::new("diff_runs");
    let prog = compile_c(&dir, "sampled_leaks.c");
    let a = dir.path().join("a.trace");
    let b = dir.path().join("b.trace");
    for (trace, requests) in [(&a, "25000"), (&b, "30000")] {
        let mut cmd = Command::new(trapline());
        cmd.args(["run", "-q", "-o"])
            .arg(trace)
            .arg("--")
            .arg(&prog)
            .args(["no", requests])
            .env("TRAPLINE_AGENT", agent());
        let run = output_of(cmd, "trapline run");
        assert_eq!(run.code(), 0, "{}", run.describe());
    }
    let out = diff(&a, &b, "json");
    assert_eq!(out.code(), 0, "{}", out.describe());
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    let sites = as_array(&report, "sites");
    assert_eq!(sites.len(), 2, "{}", pretty(&report));
    let node = (
        "make_node",
        "sampled_leaks.c",
        marker_line("sampled_leaks.c", "NODE"),
    );
    for (site, (function, marker, blocks, size)) in sites.iter().zip([
        ("parse_request", "PARSE", 4_000u64, 1_000u64),
        ("load_config", "LOAD", 1_000, 200),
    ]) {
        assert_stack_top(
            stack_of(site, "stack"),
            &[
                node,
                (
                    function,
                    "sampled_leaks.c",
                    marker_line("sampled_leaks.c", marker),
                ),
            ],
            function,
        );
        assert_eq!(site["delta_calls"], json!(blocks), "{}", pretty(site));
        assert_eq!(site["delta_live_at_end_bytes"], json!(blocks * size));
        assert_eq!(site["delta_bytes_allocated"], json!(blocks * size));
        let a_live = as_u64(&site["a"], "live_at_end_bytes");
        assert_eq!(
            as_u64(&site["b"], "live_at_end_bytes"),
            a_live + blocks * size
        );
    }
    assert_eq!(
        (
            as_u64(&report["a"], "live_at_end_bytes"),
            as_u64(&report["b"], "live_at_end_bytes")
        ),
        (21_000_000, 25_200_000)
    );
    assert!(
        as_u64(&report, "sites_unchanged") >= 3,
        "{}",
        pretty(&report)
    );

    let same = diff(&a, &a, "text");
    assert_eq!(same.code(), 0, "{}", same.describe());
    assert!(
        same.stdout.contains("No allocation site changed"),
        "{}",
        same.stdout
    );
    let missing = diff(&a, &dir.path().join("nothing.trace"), "text");
    assert_eq!(missing.code(), 1, "{}", missing.describe());
    assert!(
        missing.stderr.contains("nothing.trace: cannot open"),
        "{}",
        missing.stderr
    );
}
