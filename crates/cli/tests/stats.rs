//! End-to-end: `trapline stats --format json` counts every allocator call of
//! a program whose calls are known exactly.

mod common;

use common::*;
use serde_json::{json, Value};

/// calls[] as (function, calls, bytes).
fn calls(report: &Value) -> Vec<(String, u64, u64)> {
    as_array(report, "calls")
        .iter()
        .map(|c| {
            (
                as_str(c, "function").to_owned(),
                as_u64(c, "calls"),
                as_u64(c, "bytes"),
            )
        })
        .collect()
}

fn call_list(expected: &[(&str, u64, u64)]) -> Vec<(String, u64, u64)> {
    expected
        .iter()
        .map(|(f, c, b)| ((*f).to_owned(), *c, *b))
        .collect()
}

/// leaks.c (see the call counts in its header comment).
#[test]
fn stats_of_leaks_c() {
    let dir = TestDir::new("stats_leaks_c");
    let prog = compile_c(&dir, "leaks.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let report = stats(&dir.trace());

    // malloc: 100 + 3 * 64 + 16 (grown by realloc) + 16 (strdup)
    //         + 8 * (1 + 2 + ... + 50) (churn) = 10,524 bytes
    // calloc: 10 * 20 + 4 * 4; realloc: 300 + 1000.
    assert_eq!(
        calls(&report),
        call_list(&[
            ("malloc", 56, 10_524),
            ("calloc", 2, 216),
            ("realloc", 2, 1_300),
            ("posix_memalign", 1, 128),
            ("aligned_alloc", 1, 96),
            ("free", 51, 0),
        ]),
        "{}",
        pretty(&report)
    );
    assert_eq!(as_u64(&report, "allocation_calls"), 62);
    assert_eq!(as_u64(&report, "release_calls"), 51);
    assert_eq!(as_u64(&report, "bytes_allocated"), 12_264);
    // The peak is the 50 churn blocks, all live at once: 8 * 1275 bytes.
    let peak = field(&report, "peak_heap");
    assert_eq!(
        (as_u64(peak, "bytes"), as_u64(peak, "blocks")),
        (10_200, 50),
        "{}",
        pretty(peak)
    );
    assert_eq!(
        field(&report, "live_at_end"),
        &json!({"bytes": 1032, "blocks": 9})
    );
    assert_eq!(as_u64(&report, "errors"), 0);
    assert_eq!(as_u64(&report, "threads"), 1);
    assert_eq!(as_u64(&report, "events_lost"), 0);
    assert_eq!(
        field(field(&report, "trace"), "complete"),
        &Value::Bool(true)
    );
    assert_eq!(process_exit(&report), &json!({"code": 0}));
}

/// threads64.c: 64 * 10,000 pairs + 2080 leaked blocks, plus what the C
/// library does for the program: one stdout buffer (malloc, freed at exit) and
/// one TLS vector per thread (calloc in pthread_create, freed at exit).
/// These library counts are those of glibc 2.36 (as valgrind counts them).
#[test]
fn stats_of_threads64() {
    let dir = TestDir::new("stats_threads64");
    let prog = compile_c(&dir, "threads64.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let report = stats(&dir.trace());
    let by_function: Vec<(String, u64)> =
        calls(&report).into_iter().map(|(f, c, _)| (f, c)).collect();
    assert_eq!(
        by_function,
        vec![
            ("malloc".to_owned(), 642_081),
            ("calloc".to_owned(), 64),
            ("free".to_owned(), 640_065)
        ],
        "{}",
        pretty(&report)
    );
    assert_eq!(
        field(&report, "live_at_end"),
        &json!({"bytes": 66_560, "blocks": 2080})
    );
    assert_eq!(as_u64(&report, "threads"), 65, "main + 64 workers");
    // The workers wait on one barrier, so all 64 are alive together.
    assert_eq!(
        field(&report, "thread_lifecycle"),
        &json!({"started": 64, "ended": 64, "peak_alive": 65})
    );
    assert_eq!(as_u64(&report, "events_lost"), 0);
    assert_eq!(as_u64(&report, "errors"), 0);
}

/// errors.c: four errors, counted among the calls.
#[test]
fn stats_count_errors() {
    let dir = TestDir::new("stats_errors_c");
    let prog = compile_c(&dir, "errors.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let report = stats(&dir.trace());
    assert_eq!(as_u64(&report, "errors"), 4, "{}", pretty(&report));
    assert_eq!(as_u64(&report, "events_lost"), 0);
}

/// The numbers of `trapline run`'s end-of-run summary, parsed from its lines:
/// (allocation calls, releases, peak bytes, peak time as printed, unfreed
/// bytes, unfreed blocks, errors, events lost).
fn summary_numbers(stderr: &str) -> (u64, u64, u64, String, u64, u64, u64, u64) {
    let line = |prefix: &str| -> &str {
        stderr
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no summary line {prefix:?} in:\n{stderr}"))
    };
    let nums = |text: &str| -> Vec<u64> {
        text.replace(',', "")
            .split(|c: char| !c.is_ascii_digit() && c != '.')
            .filter(|w| !w.is_empty() && !w.contains('.'))
            .map(|w| w.parse().unwrap())
            .collect()
    };
    let calls = nums(line("==trapline== allocation calls: "));
    let peak = line("==trapline== peak heap: ");
    let (peak_bytes, peak_time) = peak.split_once(" bytes at ").expect("peak line");
    let unfreed = nums(line("==trapline== unfreed at exit: "));
    (
        calls[0],
        calls[1],
        peak_bytes.replace(',', "").parse().unwrap(),
        peak_time.to_owned(),
        unfreed[0],
        unfreed[1],
        nums(line("==trapline== errors found: "))[0],
        nums(line("==trapline== events lost: "))[0],
    )
}

/// `trapline run`'s summary comes from the totals the agent kept itself when
/// one thread recorded every heap event (read from the end of the trace,
/// without a replay), else from a replay. Either way it must say exactly what
/// `trapline stats` computes, and `stats` checks the agent's totals against
/// its replay (`agent_totals_match`).
#[test]
fn run_summary_equals_stats_with_and_without_agent_totals() {
    let cases: [(&str, &[&str], bool); 6] = [
        ("leaks.c", &[], true),
        ("errors.c", &[], true),
        ("realloc_double_free.c", &[], true),
        ("cpp_leak.cpp", &[], true),
        ("deep_stacks.c", &[], true),
        // 64 threads allocate: no agent totals, the summary replays.
        ("threads64.c", &[], false),
    ];
    for (source, args, agent_totals) in cases {
        let dir = TestDir::new(&format!("summary_{}", source.replace('.', "_")));
        let prog = if source.ends_with(".cpp") {
            compile_cpp(&dir, source)
        } else {
            compile_c(&dir, source)
        };
        let run = run(&dir, &[], &prog, args);
        assert_eq!(run.code(), 0, "{source}: {}", run.describe());
        let report = stats(&dir.trace());
        let peak = field(&report, "peak_heap");
        let unfreed = field(&report, "unfreed_at_exit");
        assert_eq!(
            summary_numbers(&run.stderr),
            (
                as_u64(&report, "allocation_calls"),
                as_u64(&report, "release_calls"),
                as_u64(peak, "bytes"),
                format!("{:.3} s", peak["time_seconds"].as_f64().unwrap()),
                as_u64(unfreed, "bytes"),
                as_u64(unfreed, "blocks"),
                as_u64(&report, "errors"),
                as_u64(&report, "events_lost"),
            ),
            "{source}: summary against stats\n{}\n{}",
            run.stderr,
            pretty(&report)
        );
        let expected = if agent_totals {
            json!(true)
        } else {
            Value::Null
        };
        assert_eq!(
            report["agent_totals_match"],
            expected,
            "{source}: agent totals\n{}",
            pretty(&report)
        );
    }
}

/// A program killed by a signal that is no crash leaves no agent totals
/// (the signal may have struck between a count and its event); its summary
/// replays the trace. A crash outside the agent (abort) finishes as an exit
/// does, with totals that match.
#[test]
fn no_agent_totals_after_a_fatal_signal() {
    let dir = TestDir::new("summary_abort");
    let prog = compile_c(&dir, "exit_paths.c");
    for (mode, status, totals) in [("term", 143, Value::Null), ("abort", 134, json!(true))] {
        let run = run(&dir, &[], &prog, &[mode]);
        assert_eq!(run.code(), status, "{}", run.describe());
        let report = stats(&dir.trace());
        assert_eq!(
            report["agent_totals_match"],
            totals,
            "{mode}: {}",
            pretty(&report)
        );
        assert_eq!(
            summary_numbers(&run.stderr).0,
            as_u64(&report, "allocation_calls")
        );
    }
}

/// The site views of sampled_leaks.c (see its header comment): churn's
/// 100,000 calls are all temporary; at the heap's peak the two leaking
/// paths held 20,000,000 and 1,000,000 bytes beside main's 1 MiB realloc.
#[test]
fn site_views_rank_calls_temporaries_peak_and_bytes() {
    let dir = TestDir::new("stats_site_views");
    let prog = compile_c(&dir, "sampled_leaks.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let report = stats(&dir.trace());
    let sites = &report["sites"];
    // (calls, temporary, peak bytes, bytes allocated, caller) of a view.
    let view = |name: &str| -> Vec<(u64, u64, u64, u64, String)> {
        as_array(sites, name)
            .iter()
            .map(|s| {
                let stack = stack_of(s, "stack");
                let caller = stack
                    .iter()
                    .filter_map(|f| f["function"].as_str())
                    .nth(1)
                    .unwrap_or("")
                    .to_owned();
                (
                    as_u64(s, "calls"),
                    as_u64(s, "temporary"),
                    as_u64(s, "peak_bytes"),
                    as_u64(s, "bytes_allocated"),
                    caller,
                )
            })
            .collect()
    };
    let calls = view("most_calls");
    assert_eq!(calls[0].0, 100_000, "{}", pretty(sites));
    assert_eq!(
        (
            calls[1].0,
            calls[1].4.as_str(),
            calls[2].0,
            calls[2].4.as_str()
        ),
        (20_000, "parse_request", 5_000, "load_config"),
        "{}",
        pretty(sites)
    );
    let temporary = view("most_temporary");
    assert_eq!(temporary[0].1, 100_000, "{}", pretty(sites));
    assert_frame(
        &stack_of(&as_array(sites, "most_temporary")[0], "stack")[0],
        "churn",
        "sampled_leaks.c",
        marker_line("sampled_leaks.c", "CHURN"),
        "the temporary allocations",
    );
    let peak: Vec<u64> = view("peak_contribution").iter().map(|s| s.2).collect();
    assert_eq!(peak, [20_000_000, 1 << 20, 1_000_000], "{}", pretty(sites));
    assert_eq!(
        as_u64(&report["peak_heap"], "bytes"),
        21_000_000 + (1 << 20)
    );
    let allocated: Vec<u64> = view("most_allocated").iter().map(|s| s.3).collect();
    assert_eq!(
        allocated,
        [20_000_000, 6_400_000, 1 << 20, 1_000_000, 16],
        "{}",
        pretty(sites)
    );

    // --top 2: the first two of each view, in the same order.
    let mut cmd = std::process::Command::new(trapline());
    cmd.arg("stats")
        .arg(dir.trace())
        .args(["--top", "2", "--format", "json"]);
    let top = output_of(cmd, "trapline stats --top 2");
    assert_eq!(top.code(), 0, "{}", top.describe());
    let top: Value = serde_json::from_str(&top.stdout).expect("JSON");
    for name in [
        "most_calls",
        "most_temporary",
        "peak_contribution",
        "most_allocated",
    ] {
        let all = as_array(sites, name);
        let listed = as_array(&top["sites"], name);
        assert_eq!(listed[..], all[..2.min(all.len())], "{name}");
    }
}

/// alloc_wrappers.c: sites are named by their first frame outside the
/// allocation wrappers, a known one (xmalloc) and one named with
/// `--alloc-fn`; the wrapper stays in the stack. redis's sites all read
/// `zmalloc_usable <- _sdsnewlen` before.
#[test]
fn sites_are_named_past_allocation_wrappers() {
    let dir = TestDir::new("alloc_wrappers");
    let prog = compile_c(&dir, "alloc_wrappers.c");
    let r = run(&dir, &[], &prog, &[]);
    assert_eq!(r.code(), 0, "{}", r.describe());
    let src = "alloc_wrappers.c";
    let line = |marker| marker_line(src, marker);
    let sites = |extra: &[&str]| -> Vec<String> {
        let mut cmd = std::process::Command::new(trapline());
        cmd.arg("stats").arg(dir.trace()).args(extra);
        let out = output_of(cmd, "trapline stats");
        assert_eq!(out.code(), 0, "{}", out.describe());
        let text = out.stdout;
        let start = text
            .find("SITES, most allocation calls:")
            .expect("the sites");
        text[start..]
            .lines()
            .skip(1)
            .take_while(|l| l.contains(" calls "))
            .map(|l| l.split(" calls  ").nth(1).unwrap_or("").to_owned())
            .collect()
    };
    let first = format!("first_user ({src}:{}) <- main", line("FIRST"));
    let second = format!("second_user ({src}:{}) <- main", line("SECOND"));
    let through = format!("my_alloc ({src}:{}) <- second_user", line("MY-ALLOC"));
    let plain = sites(&[]);
    assert!(plain.iter().any(|s| s.starts_with(&first)), "{plain:?}");
    assert!(plain.iter().any(|s| s.starts_with(&through)), "{plain:?}");
    let named = sites(&["--alloc-fn", "my_*"]);
    assert!(named.iter().any(|s| s.starts_with(&first)), "{named:?}");
    assert!(named.iter().any(|s| s.starts_with(&second)), "{named:?}");
    // The wrapper is still in the site's stack.
    let report = stats(&dir.trace());
    let site = as_array(field(&report, "sites"), "most_calls")
        .iter()
        .find(|s| {
            stack_of(s, "stack")
                .iter()
                .any(|f| frame_function(f) == "first_user")
        })
        .expect("first_user's site");
    assert_eq!(frame_function(&stack_of(site, "stack")[0]), "xmalloc");
    // pool_get is recognised from its code: its sites are named by its
    // callers, and its frame says it is a wrapper; my_alloc, called from
    // one function only, is not.
    let third = format!("third_user ({src}:{}) <- main", line("THIRD"));
    let fourth = format!("fourth_user ({src}:{}) <- main", line("FOURTH"));
    assert!(plain.iter().any(|s| s.starts_with(&third)), "{plain:?}");
    assert!(plain.iter().any(|s| s.starts_with(&fourth)), "{plain:?}");
    let innermost = |caller: &str| -> Value {
        let site = as_array(field(&report, "sites"), "most_calls")
            .iter()
            .find(|s| {
                stack_of(s, "stack")
                    .iter()
                    .any(|f| frame_function(f) == caller)
            })
            .unwrap_or_else(|| panic!("{caller}'s site: {}", pretty(&report)));
        stack_of(site, "stack")[0].clone()
    };
    let pool = innermost("third_user");
    assert_eq!(frame_function(&pool), "pool_get");
    assert_eq!(pool["line"].as_u64(), Some(line("POOL")));
    assert_eq!(pool["allocation_wrapper"], Value::Bool(true), "{pool}");
    let mine = innermost("second_user");
    assert_eq!(frame_function(&mine), "my_alloc");
    assert_eq!(mine["allocation_wrapper"], Value::Bool(false), "{mine}");
}
