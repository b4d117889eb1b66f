//! End-to-end: `trapline run --profile` samples every thread on its own CPU
//! time, and `trapline profile` attributes the samples. The fixtures spend
//! known amounts of their own CPU time (read from the thread's CPU clock, so
//! machine load does not change them) in known functions.

mod common;

use common::*;
use serde_json::Value;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

/// Shares must be within this many percentage points of the truth.
const TOLERANCE: f64 = 5.0;

/// `trapline profile TRACE --format FORMAT [EXTRA]`, however it ends.
fn profile_cmd(trace: &Path, format: &str, extra: &[&str]) -> Finished {
    let mut cmd = Command::new(trapline());
    cmd.arg("profile")
        .arg(trace)
        .args(["--format", format])
        .args(extra);
    let finished = output_of(cmd, "trapline profile");
    assert!(
        !finished.stderr.contains("panicked"),
        "{}",
        finished.describe()
    );
    finished
}

/// The parsed JSON profile (which must succeed).
fn profile(trace: &Path, extra: &[&str]) -> Value {
    let finished = profile_cmd(trace, "json", extra);
    assert_eq!(finished.code(), 0, "{}", finished.describe());
    serde_json::from_str(&finished.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e})\n{}", finished.describe()))
}

/// The fixtures burn known CPU time; recording them one at a time keeps
/// them from competing with each other (shares hold under load, but a busy
/// machine can let a thread run between the kernel's timer checks, see
/// `samples_missed`).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Records PROGRAM ARGS with `--profile`; it must exit 0.
fn record(dir: &TestDir, program: &Path, args: &[&str]) -> Finished {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let finished = run(dir, &["--profile"], program, args);
    assert_eq!(finished.code(), 0, "{}", finished.describe());
    assert_no_events_lost_in_summary(&finished);
    finished
}

/// Whether the kernel signalled at least 99% of the CPU time of a recording.
/// It checks CPU timers only at ticks that find the thread running; on an
/// overloaded machine (or a VM whose host steals its CPU) a thread can run
/// between ticks, and the agent counts that time as `samples_missed`
/// (unattributed). Shares are only defined over the time that was sampled,
/// and the missed time may all fall in one function: 1% of 0.9 s moves a
/// function's share within its 0.4 s thread by at most 2.3 points, which
/// leaves room in the 5-point tolerance; the 5% allowed before did not (a CI
/// run missed 40 periods, all in work_b).
fn covered(report: &Value) -> bool {
    let missed = as_u64(report, "samples_missed");
    missed * 100 <= as_u64(report, "samples") + missed
}

/// Records PROGRAM ARGS until every profile `reports` makes of the run is
/// covered (at most 4 times). Returns the last run, its reports, and whether
/// they are covered: a test checks shares only then (and says so otherwise),
/// and checks the accounting always.
fn record_covered(
    dir: &TestDir,
    program: &Path,
    args: &[&str],
    reports: impl Fn(&TestDir) -> Vec<Value>,
) -> (Finished, Vec<Value>, bool) {
    let mut attempt = 0;
    loop {
        let run = record(dir, program, args);
        let profiles = reports(dir);
        attempt += 1;
        let ok = profiles.iter().all(covered);
        if ok || attempt == 4 {
            if !ok {
                eprintln!(
                    "the kernel signalled less than 99% of the CPU time in {attempt} recordings (machine overloaded): shares not checked"
                );
            }
            return (run, profiles, ok);
        }
    }
}

/// The row of `function` in a functions[] array.
fn function<'a>(functions: &'a Value, name: &str) -> &'a Value {
    functions
        .as_array()
        .expect("functions[]")
        .iter()
        .find(|f| f["function"] == name)
        .unwrap_or_else(|| panic!("no function {name} in {}", pretty(functions)))
}

fn assert_share(what: &str, got: f64, expected: f64, report: &Value) {
    assert!(
        (got - expected).abs() <= TOLERANCE,
        "{what}: {got:.1}% instead of {expected:.1}% (±{TOLERANCE})\n{}",
        pretty(report)
    );
}

fn percent(part: u64, whole: u64) -> f64 {
    part as f64 * 100.0 / whole as f64
}

/// profile_shares.c: 0.3 s, 0.5 s and 0.2 s of CPU in spin_a, spin_b and
/// spin_c (through the inlined inner_c), all in burn.
#[test]
fn known_shares_within_five_points() {
    let dir = TestDir::new("profile_shares");
    let prog = compile_c(&dir, "profile_shares.c");
    let (run, reports, covered) =
        record_covered(&dir, &prog, &[], |d| vec![profile(&d.trace(), &[])]);
    assert_eq!(run.stdout, "shares done\n");
    let report = &reports[0];
    assert_eq!(as_u64(report, "rate_hz"), 999);
    let samples = as_u64(report, "samples");
    // 1 s of CPU at 999 Hz, sampled or counted as missed: none lost silently.
    let accounted = samples + as_u64(report, "samples_missed");
    assert!(
        (900..=1100).contains(&accounted),
        "{accounted} periods for 1 s of CPU\n{}",
        pretty(report)
    );
    if !covered {
        return;
    }
    let report = report.clone();
    let functions = field(&report, "functions");
    for (name, share) in [
        ("spin_a", 30.0),
        ("spin_b", 50.0),
        ("spin_c", 20.0),
        ("inner_c", 20.0),
        ("burn", 100.0),
        ("main", 100.0),
    ] {
        let f = function(functions, name);
        assert_share(
            &format!("total of {name}"),
            percent(as_u64(f, "total"), samples),
            share,
            &report,
        );
        assert!(as_str(f, "file").ends_with("profile_shares.c"));
    }
    // Self time is burn's; only the clock reads (in the vDSO) are elsewhere.
    let burn = function(functions, "burn");
    assert_share(
        "self of burn",
        percent(as_u64(burn, "self"), samples),
        100.0,
        &report,
    );
    assert_eq!(as_u64(function(functions, "spin_b"), "self"), 0);
    // The most self time comes first.
    assert_eq!(functions[0]["function"], "burn");
    // The inlined frame sits between its caller and its callee.
    let folded = profile_cmd(&dir.trace(), "folded", &[]);
    assert_eq!(folded.code(), 0, "{}", folded.describe());
    assert!(
        folded
            .stdout
            .lines()
            .any(|l| l.starts_with("_start;") && l.contains(";main;spin_c;inner_c;burn ")),
        "{}",
        folded.stdout
    );
    let threads = as_array(&report, "threads");
    assert_eq!(threads.len(), 1, "{}", pretty(&report));
    assert_eq!(as_u64(&threads[0], "samples"), samples);
    assert_eq!(as_str(&threads[0], "name"), "profile_shares");
}

/// profile_threads.c: worker-a 0.4 s in work_a, worker-b 0.2 s each in
/// work_b and work_c, the main thread 0.1 s in main_work.
#[test]
fn threads_have_their_own_shares_and_names() {
    check_thread_shares("profile_threads", &[]);
}

/// The same with every signal blocked in every thread by the program: the
/// sampling signal stays deliverable.
#[test]
fn threads_blocking_every_signal_are_still_sampled() {
    check_thread_shares("profile_threads_blocked", &["block-all"]);
}

fn check_thread_shares(test: &str, args: &[&str]) {
    let dir = TestDir::new(test);
    let prog = compile_c(&dir, "profile_threads.c");
    let (run, reports, covered) =
        record_covered(&dir, &prog, args, |d| vec![profile(&d.trace(), &[])]);
    assert_eq!(run.stdout, "threads done\n");
    let report = reports[0].clone();
    let accounted = as_u64(&report, "samples") + as_u64(&report, "samples_missed");
    assert!(
        (800..=1000).contains(&accounted),
        "{accounted} periods for 0.9 s of CPU\n{}",
        pretty(&report)
    );
    let names: Vec<&str> = as_array(&report, "threads")
        .iter()
        .map(|t| as_str(t, "name"))
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    if !covered {
        return;
    }
    let samples = as_u64(&report, "samples");
    let threads = as_array(&report, "threads");
    assert_eq!(threads.len(), 3, "{}", pretty(&report));
    let thread = |name: &str| {
        threads
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no thread {name}\n{}", pretty(&report)))
    };
    let pid = as_u64(field(&report, "process"), "pid");
    let main = thread("profile_threads");
    assert_eq!(as_u64(main, "tid"), pid);
    for (t, share) in [
        (thread("worker-a"), 400.0 / 9.0),
        (thread("worker-b"), 400.0 / 9.0),
        (main, 100.0 / 9.0),
    ] {
        assert_share(
            &format!("thread {}", t["name"]),
            percent(as_u64(t, "samples"), samples),
            share,
            &report,
        );
    }
    // Within worker-b: half work_b, half work_c, no work_a.
    let b = thread("worker-b");
    let b_samples = as_u64(b, "samples");
    for name in ["work_b", "work_c"] {
        assert_share(
            &format!("{name} in worker-b"),
            percent(as_u64(function(&b["functions"], name), "total"), b_samples),
            50.0,
            &report,
        );
    }
    assert!(!b["functions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["function"] == "work_a"));
    // The agent's pthread_create wrapper is not the program's: no frame of
    // the agent's library. (Samples that struck inside the agent serving
    // the program's calls are the program's, under the pseudo-function
    // `[trapline agent]`; whether any does depends on timing.)
    assert!(
        !field(&report, "functions")
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["module"]
                .as_str()
                .is_some_and(|m| m.contains("libtrapline_agent"))
                || as_str(f, "function").contains("trapline")
                    && as_str(f, "function") != "[trapline agent]"),
        "{}",
        pretty(&report)
    );

    // --thread keeps that thread's samples only.
    let tid = as_u64(b, "tid").to_string();
    let only_b = profile(&dir.trace(), &["--thread", &tid]);
    assert_eq!(as_u64(&only_b, "samples"), b_samples);
    assert_eq!(as_u64(&only_b, "thread_filter").to_string(), tid);
    let functions = field(&only_b, "functions");
    assert_share(
        "work_b with --thread",
        percent(as_u64(function(functions, "work_b"), "total"), b_samples),
        50.0,
        &only_b,
    );
    assert!(!functions
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["function"] == "work_a" || f["function"] == "main_work"));
}

/// Folded output is what flame-graph tools read: inferno parses every line,
/// counts the same samples, and draws them; `--format svg` is its flame graph.
#[test]
fn folded_output_feeds_a_flame_graph_tool() {
    let dir = TestDir::new("profile_folded");
    let prog = compile_c(&dir, "profile_threads.c");
    record(&dir, &prog, &[]);
    let report = profile(&dir.trace(), &[]);
    let samples = as_u64(&report, "samples");
    let folded = profile_cmd(&dir.trace(), "folded", &[]);
    assert_eq!(folded.code(), 0, "{}", folded.describe());
    let mut total = 0;
    for line in folded.stdout.lines() {
        let (stack, count) = line.rsplit_once(' ').expect("STACK COUNT");
        total += count.parse::<u64>().expect("a count");
        assert!(!stack.is_empty() && !stack.starts_with(';') && !stack.ends_with(';'));
    }
    assert_eq!(total, samples);

    let mut options = inferno::flamegraph::Options::default();
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, folded.stdout.lines(), &mut svg)
        .expect("inferno reads the folded stacks");
    let svg = String::from_utf8(svg).unwrap();
    assert!(
        svg.contains(&format!("all ({} samples, 100%)", thousands(samples))),
        "inferno counted other totals than {samples}"
    );
    // Every function of a stack with 1% of the samples or more is drawn
    // (inferno leaves out frames narrower than its minimum width).
    for line in folded.stdout.lines() {
        let (stack, count) = line.rsplit_once(' ').unwrap();
        if count.parse::<u64>().unwrap() * 100 >= samples {
            for name in stack.split(';') {
                assert!(svg.contains(name), "{name} missing from the flame graph");
            }
        }
    }
    for name in ["work_a", "work_b", "work_c"] {
        assert!(
            folded.stdout.contains(name),
            "{name} missing from the folded stacks"
        );
    }

    let ours = profile_cmd(&dir.trace(), "svg", &[]);
    assert_eq!(ours.code(), 0, "{}", ours.describe());
    assert!(ours.stdout.starts_with("<?xml"), "{}", &ours.stdout[..100]);
    assert!(ours.stdout.contains("<svg") && ours.stdout.contains("<script"));
    assert!(ours
        .stdout
        .contains(&format!("all ({} samples, 100%)", thousands(samples))));
}

/// profile_signals.c uses its own SIGPROF and SIGALRM timers, handlers
/// without SA_RESTART and checks every real-time signal's disposition: it
/// must print exactly what it prints untraced.
#[test]
fn program_timers_and_signals_keep_working() {
    let dir = TestDir::new("profile_signals");
    let prog = compile_c(&dir, "profile_signals.c");
    let native = output_of(Command::new(&prog), "profile_signals");
    assert_eq!(native.code(), 0, "{}", native.describe());
    assert_eq!(
        native.stdout,
        "sigprof 40 sigalrm 2 read -1 EINTR rt-default 1\n"
    );
    let traced = record(&dir, &prog, &[]);
    assert_eq!(traced.stdout, native.stdout);
    let report = profile(&dir.trace(), &[]);
    assert!(field(&report, "stopped_early").is_null());
    // 40 SIGPROFs of 5 ms of the process's CPU time, which counts every
    // thread's (the agent's writer too): the main thread's share is tens of
    // samples, nearly all in the burning loop.
    let samples = as_u64(&report, "samples");
    let burn = function(field(&report, "functions"), "burn_until_profs");
    assert!(samples >= 20, "{}", pretty(&report));
    assert_share(
        "self of burn_until_profs",
        percent(as_u64(burn, "self"), samples),
        100.0,
        &report,
    );
}

/// A program that installs a handler for the sampling signal gets the signal
/// (its own sigqueue reaches its handler exactly once); sampling stops, and
/// the profile says so.
#[test]
fn program_taking_the_sampling_signal_gets_it() {
    let dir = TestDir::new("profile_signal_taken");
    let prog = compile_c(&dir, "profile_signals.c");
    let native = output_of(
        {
            let mut c = Command::new(&prog);
            c.arg("take-rtmax");
            c
        },
        "profile_signals take-rtmax",
    );
    assert!(
        native.stdout.ends_with("rtmax handler 1\n"),
        "{}",
        native.describe()
    );
    let traced = record(&dir, &prog, &["take-rtmax"]);
    assert_eq!(traced.stdout, native.stdout);
    assert!(
        traced.stderr.contains("CPU sampling stopped"),
        "{}",
        traced.describe()
    );
    let report = profile(&dir.trace(), &[]);
    assert!(
        as_str(&report, "stopped_early").contains("installed a handler"),
        "{}",
        pretty(&report)
    );
    assert_eq!(as_u64(&report, "signal"), 64);
    let text = profile_cmd(&dir.trace(), "text", &[]);
    assert!(text.stdout.contains("WARNING: sampling stopped early"));
}

/// The sampling signal sent by someone else while the program leaves it at
/// its default disposition kills the program, as it would untraced.
#[test]
fn sampling_signal_from_elsewhere_kills_as_by_default() {
    let dir = TestDir::new("profile_signal_raised");
    let prog = compile_c(&dir, "profile_signals.c");
    let native = output_of(
        {
            let mut c = Command::new(&prog);
            c.arg("raise-rtmax");
            c
        },
        "profile_signals raise-rtmax",
    );
    assert_eq!(native.status.signal(), Some(64), "{}", native.describe());
    let traced = run(&dir, &["--profile"], &prog, &["raise-rtmax"]);
    assert_eq!(traced.code(), 128 + 64, "{}", traced.describe());
    assert_eq!(traced.stdout, native.stdout);
    let report = profile(&dir.trace(), &[]);
    assert_eq!(
        field(field(&report, "process"), "exit"),
        &serde_json::json!({"signal": 64})
    );
    assert!(as_u64(&report, "samples") > 0, "{}", pretty(&report));
    assert_eq!(
        field(field(&report, "trace"), "complete"),
        &serde_json::json!(true)
    );
}

/// profile_fork.c: sampling follows into the fork child (a timer of its own)
/// and into the image it execs (profile_shares.c, a new agent).
#[test]
fn fork_child_and_exec_image_are_sampled() {
    let dir = TestDir::new("profile_fork");
    let prog = compile_c(&dir, "profile_fork.c");
    let target = compile_c(&dir, "profile_shares.c");
    let (run, _, covered) = record_covered(&dir, &prog, &[target.to_str().unwrap()], |d| {
        let mut all = vec![profile(&d.trace(), &[])];
        all.extend(d.other_traces().iter().map(|t| profile(t, &[])));
        all
    });
    assert_eq!(run.stdout, "shares done\n");
    assert_eq!(dir.other_traces().len(), 2);
    if !covered {
        return;
    }
    let parent = profile(&dir.trace(), &[]);
    let share = |report: &Value, name: &str| {
        percent(
            as_u64(function(field(report, "functions"), name), "total"),
            as_u64(report, "samples"),
        )
    };
    assert_share("parent_work", share(&parent, "parent_work"), 100.0, &parent);
    let others = dir.other_traces();
    assert_eq!(others.len(), 2, "{others:?}");
    let reports: Vec<Value> = others.iter().map(|t| profile(t, &[])).collect();
    let child = reports
        .iter()
        .find(|r| {
            r["functions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["function"] == "child_work")
        })
        .expect("the fork child's profile");
    assert_share("child_work", share(child, "child_work"), 100.0, child);
    let image = reports
        .iter()
        .find(|r| {
            r["functions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["function"] == "spin_b")
        })
        .expect("the exec'd image's profile");
    assert_share("spin_b after exec", share(image, "spin_b"), 50.0, image);
}

/// Without `--profile` there is nothing to report; an unknown thread is an error.
#[test]
fn traces_without_samples_and_unknown_threads_are_clear_errors() {
    let dir = TestDir::new("profile_errors");
    let prog = compile_c(&dir, "profile_shares.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let off = profile_cmd(&dir.trace(), "text", &[]);
    assert_eq!(off.code(), 1, "{}", off.describe());
    assert!(
        off.stderr.contains("no CPU samples") && off.stderr.contains("--profile"),
        "{}",
        off.describe()
    );

    let dir = TestDir::new("profile_errors_thread");
    let run = record(&dir, &prog, &[]);
    assert_eq!(run.code(), 0);
    let unknown = profile_cmd(&dir.trace(), "json", &["--thread", "1"]);
    assert_eq!(unknown.code(), 1, "{}", unknown.describe());
    assert!(unknown.stderr.contains("thread 1 has no CPU samples"));
    let bad_rate = output_of(
        run_command(&dir, &["--profile=0"], &prog, &[]),
        "trapline run --profile=0",
    );
    assert_eq!(bad_rate.code(), 2, "{}", bad_rate.describe());
}

/// stderr_reuse.c: a program that closed stderr and got descriptor 2 for a
/// file of its own, then took the sampling signal. The agent's note that
/// sampling stopped went to descriptor 2, into the program's file; it now
/// writes only while descriptor 2 is still the stderr the program started
/// with. The file holds the program's line alone.
#[test]
fn agent_diagnostics_never_go_to_a_reused_descriptor_2() {
    let dir = TestDir::new("stderr_reuse");
    let prog = compile_c(&dir, "stderr_reuse.c");
    let data = dir.path().join("data.txt");
    let data_arg = data.display().to_string();
    let traced = run(&dir, &["--profile"], &prog, &[&data_arg]);
    assert_eq!(traced.code(), 0, "{}", traced.describe());
    assert_eq!(traced.stdout, "fd 2\n", "{}", traced.describe());
    assert_eq!(
        std::fs::read_to_string(&data).unwrap(),
        "the program's own data\n"
    );
}

/// profile_alloc.c: 0.4 s of CPU allocating and releasing in churn. The
/// samples that strike inside the agent while it serves those calls are
/// charged to them, under `[trapline agent]` called from churn at the
/// MALLOC and FREE lines, not skipped: with the samples in the program's
/// own code, churn holds all the samples.
#[test]
fn samples_inside_the_agent_are_charged_to_the_calls_it_serves() {
    let dir = TestDir::new("profile_alloc");
    let prog = compile_c(&dir, "profile_alloc.c");
    let (run, reports, covered) =
        record_covered(&dir, &prog, &[], |d| vec![profile(&d.trace(), &[])]);
    assert_eq!(run.stdout, "churned\n");
    let report = &reports[0];
    let samples = as_u64(report, "samples");
    let in_agent = as_u64(report, "samples_in_agent");
    assert!(in_agent > 0, "{}", pretty(report));
    let agent = function(field(report, "functions"), "[trapline agent]");
    assert_eq!(as_u64(agent, "self"), in_agent);
    assert_eq!(as_u64(agent, "total"), in_agent);
    // Every in-agent sample is charged to a call the program made from
    // main: churn's, or puts' allocation of stdout's buffer at the end (a
    // sample may land there too: the first unwind through the C library
    // takes a while).
    let folded = profile_cmd(&dir.trace(), "folded", &[]);
    assert_eq!(folded.code(), 0, "{}", folded.describe());
    let (mut charged, mut in_churn) = (0, 0);
    for line in folded.stdout.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        if stack.ends_with(";[trapline agent]") {
            let count = count.parse::<u64>().unwrap();
            if stack.ends_with(";main;churn;[trapline agent]") {
                in_churn += count;
            } else {
                assert!(
                    stack.contains(";main;") && stack.contains("puts;"),
                    "{line}"
                );
            }
            charged += count;
        }
    }
    assert_eq!(charged, in_agent, "{}", folded.stdout);
    assert!(in_churn > 0, "{}", folded.stdout);
    if covered {
        let churn = function(field(report, "functions"), "churn");
        assert_share(
            "total of churn",
            percent(as_u64(churn, "total"), samples),
            100.0,
            report,
        );
    }
}
