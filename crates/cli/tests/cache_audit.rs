//! The validated unwind cache (recording.md, "The validated unwind cache") against full unwinds: an agent
//! built with the `cache-audit` feature repeats every capture with nothing
//! remembered and counts the captures whose stacks differ. Over programs
//! whose stacks change in every way the cache must notice (random walks of
//! calls and returns through frames of every shape, with and without frame
//! pointers; deep recursion; signal frames, alloca, huge frames, libc
//! callbacks; C++ exceptions; 64 threads), not one may differ.

mod common;

use common::*;
use std::path::Path;
use std::sync::OnceLock;

fn audit_agent() -> &'static Path {
    static AGENT: OnceLock<std::path::PathBuf> = OnceLock::new();
    AGENT.get_or_init(|| agent_with_feature("cache-audit"))
}

/// The number in `text` right after `prefix` (digits and thousands commas).
fn number_after(text: &str, prefix: &str) -> Option<u64> {
    let rest = &text[text.find(prefix)? + prefix.len()..];
    let digits: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Runs `program` under the auditing agent; asserts it ran as it does
/// natively (`stdout`, exit 0), and that every capture was compared and
/// none differed. Returns the number of captures compared.
fn audit(dir: &TestDir, program: &Path, stdout: &str) -> u64 {
    audit_with(dir, program, stdout, &[])
}

/// `audit` with extra environment variables for the program.
fn audit_with(dir: &TestDir, program: &Path, stdout: &str, env: &[(&str, &str)]) -> u64 {
    let mut cmd = run_command(dir, &[], program, &[]);
    cmd.env("TRAPLINE_AGENT", audit_agent());
    cmd.envs(env.iter().copied());
    let run = output_of(cmd, "trapline run with the cache-audit agent");
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, stdout, "{}", run.describe());
    assert_no_events_lost_in_summary(&run);
    // "cache-audit: 121067 captures compared, 0 differed from a full unwind"
    // (the first differences, if any, are printed on lines of their own before it).
    let report = run
        .stderr
        .lines()
        .find(|l| l.contains("captures compared, "))
        .unwrap_or_else(|| panic!("no cache-audit report:\n{}", run.describe()));
    let compared = number_after(report, "cache-audit: ").expect("captures compared");
    let differed = number_after(report, "captures compared, ").expect("captures that differed");
    assert_eq!(
        differed,
        0,
        "cached stacks differ from full unwinds:\n{}",
        run.describe()
    );
    // Every allocating and every releasing call captures (release stacks
    // are on by default), besides thread creations and errors. The report
    // comes after the C library's last frees (freeres).
    // "==trapline== allocation calls: 60,532 (60,530 releases)"
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains("allocation calls: "))
        .unwrap_or_else(|| panic!("no allocation calls in the summary:\n{}", run.describe()));
    let calls = number_after(line, "allocation calls: ").expect("allocation calls");
    let releases = number_after(line, "(").expect("releases");
    assert!(
        compared >= calls + releases,
        "{compared} captures compared for {calls} calls and {releases} releases:\n{}",
        run.describe()
    );
    compared
}

/// cache_walk.c: four threads walk 3,000 random call trees each through
/// four frame shapes, allocating or freeing at every step.
#[test]
fn random_walks_with_and_without_frame_pointers_match_full_unwinds() {
    let dir = TestDir::new("cache_walk");
    let omit = compile_c_with(
        &dir,
        "cache_walk.c",
        "walk_o2",
        &["-O2", "-fomit-frame-pointer", "-pthread"],
    );
    let frame_pointers = compile_c_with(&dir, "cache_walk.c", "walk_o0", &["-pthread"]);
    // framehop alone (TRAPLINE_RULE_TABLE=0) records the same reads.
    for (program, env) in [
        (&omit, &[][..]),
        (&frame_pointers, &[][..]),
        (&omit, &[("TRAPLINE_RULE_TABLE", "0")][..]),
    ] {
        let compared = audit_with(&dir, program, "walk done\n", env);
        // 4 threads x 3,000 walks, at least two calls per visited frame.
        assert!(compared > 4 * 3000 * 2, "{compared} captures compared");
    }
}

/// deep_stacks.c (stacks past the 64 frames kept, inner changes),
/// unwind_shapes.c at -O2 (every rule shape, a signal frame) and
/// altstack_handler.c (from an alternate signal stack onto the thread's).
#[test]
fn deep_stacks_and_every_rule_shape_match_full_unwinds() {
    let dir = TestDir::new("cache_audit_shapes");
    let deep = compile_c(&dir, "deep_stacks.c");
    audit(&dir, &deep, "deep done\n");
    let shapes = compile_c_with(&dir, "unwind_shapes.c", "unwind_shapes", &["-O2"]);
    audit(&dir, &shapes, "shapes done\n");
    let altstack = compile_c(&dir, "altstack_handler.c");
    audit(&dir, &altstack, "altstack done\n");
}

/// bad_alloc.cpp: exceptions thrown through the allocation hooks rewrite
/// the stack between captures; threads64.c: 64 threads at once.
#[test]
fn exceptions_and_many_threads_match_full_unwinds() {
    let dir = TestDir::new("cache_audit_cxx_threads");
    let cxx = compile_cpp(&dir, "bad_alloc.cpp");
    audit(
        &dir,
        &cxx,
        "caught bad_alloc\ncaught again after 2 handler calls\nnothrow gives (nil)\n",
    );
    let threads = compile_c(&dir, "threads64.c");
    audit(&dir, &threads, "threads done\n");
}
