//! End-to-end: memory limits. A reachability scan whose memory would pass a
//! limit that ends or fails the program is skipped, said so in every
//! report, and the program ends as it does natively (docs/analyses.md, "Room for the scan",
//! "Room for the scan"); a program the OOM killer ends is named as such.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// The fixture: holds BLOCKS blocks; with a second argument, lowers its
/// address-space limit to what it uses plus that many MiB.
const FIXTURE: &str = "scan_room.c";

const BLOCKS: u64 = 2_000_000;

/// A cgroup with room for the program holding BLOCKS and the agent's
/// table, not for a scan. Measured peaks: the program 80 MB natively, 133
/// MB traced without a scan, 215 MB with the scan.
const CGROUP_LIMIT: u64 = 180 << 20;

/// The one skipped scan of a report.
fn only_skipped_scan(report: &Value) -> &Value {
    let skipped = as_array(report, "scans_skipped");
    assert_eq!(skipped.len(), 1, "{}", pretty(report));
    &skipped[0]
}

/// The program's blocks, unjudged: one record of exactly BLOCKS blocks
/// allocated in main at the marked line.
fn assert_unjudged_blocks(report: &Value) {
    assert!(field(report, "scan").is_null(), "{}", pretty(report));
    let held: Vec<&Value> = records(report)
        .iter()
        .filter(|r| as_u64(r, "blocks") == BLOCKS)
        .collect();
    assert_eq!(held.len(), 1, "{}", pretty(field(report, "records")));
    assert_eq!(as_str(held[0], "kind"), "unfreed_at_exit");
    assert_eq!(as_u64(held[0], "bytes"), 24 * BLOCKS);
    let line = marker_line(FIXTURE, "BLOCKS");
    assert_stack_top(
        stack_of(held[0], "stack"),
        &[("main", FIXTURE, line)],
        "the held blocks",
    );
}

/// `sh -c 'ulimit -v KIB; exec trapline run ...'`: the agent starts under
/// a limit of address space (its reserve is then 64 MiB).
fn under_address_space_limit(dir: &TestDir, prog: &Path, room_mib: u64) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -v 16000000 && exec \"$@\"")
        .arg("sh")
        .arg(trapline())
        .args(["run", "-o"])
        .arg(dir.trace())
        .arg("--")
        .arg(prog)
        .arg(BLOCKS.to_string())
        .arg(room_mib.to_string())
        .current_dir(dir.path())
        .env("TRAPLINE_AGENT", agent());
    cmd
}

/// Before the scan checked its room, its allocation failed under the
/// program's lowered limit and Rust's allocation-failure handler aborted
/// the program (exit 134 where it returned 0).
#[test]
fn an_exit_scan_that_would_pass_the_address_space_limit_is_skipped() {
    let dir = TestDir::new("scan_skipped_rlimit_as");
    let prog = compile_c(&dir, FIXTURE);
    let run = output_of(under_address_space_limit(&dir, &prog, 8), "trapline run");
    assert_eq!(run.code(), 0, "{}", run.describe());
    let limit: u64 = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("limit="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no limit printed\n{}", run.describe()));
    assert_no_events_lost_in_summary(&run);
    assert!(
        run.stderr
            .contains("WARNING: no reachability scan at exit: it would have needed about")
            && run
                .stderr
                .contains("the process's address-space limit (ulimit -v)"),
        "{}",
        run.describe()
    );

    let report = leaks(&dir.trace());
    assert_complete(&report);
    let skipped = only_skipped_scan(&report);
    assert_eq!(as_str(skipped, "trigger"), "exit");
    assert_eq!(as_str(skipped, "reason"), "address_space_limit");
    assert_eq!(as_u64(skipped, "limit_bytes"), limit);
    let (needed, available) = (
        as_u64(skipped, "needed_bytes"),
        as_u64(skipped, "available_bytes"),
    );
    assert!(
        needed >= 50 * BLOCKS && available < needed,
        "{}",
        pretty(skipped)
    );
    assert_unjudged_blocks(&report);
    let text = leaks_text(&dir.trace(), &[]);
    assert!(
        text.contains("The blocks below are unjudged, as with `trapline run --no-scan`."),
        "{text}"
    );

    let stats = stats(&dir.trace());
    let skipped = as_array(&stats, "scans_skipped");
    assert_eq!(skipped.len(), 1, "{}", pretty(&stats));
    assert_eq!(as_str(&skipped[0], "reason"), "address_space_limit");
}

/// With the room check off, the scan's allocations themselves fail under
/// the lowered limit: the scan gives way (the agent of 773f685 aborted the
/// program there, exit 134).
#[test]
fn a_scan_refused_its_memory_gives_way() {
    let dir = TestDir::new("scan_refused_memory");
    let prog = compile_c(&dir, FIXTURE);
    let mut cmd = under_address_space_limit(&dir, &prog, 8);
    cmd.env("TRAPLINE_SCAN_CHECK", "0");
    let run = output_of(cmd, "trapline run");
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout.lines().last(), Some("held 2000000"));
    assert_no_events_lost_in_summary(&run);
    assert!(
        run.stderr
            .contains("no reachability scan at exit: it needed about 115 MiB and the agent was refused the memory"),
        "{}",
        run.describe()
    );
    let report = leaks(&dir.trace());
    assert_complete(&report);
    let skipped = only_skipped_scan(&report);
    assert_eq!(as_str(skipped, "reason"), "allocation_failed");
    assert_eq!(
        (
            as_u64(skipped, "available_bytes"),
            as_u64(skipped, "limit_bytes")
        ),
        (0, 0)
    );
    assert_unjudged_blocks(&report);
}

/// Without the limit lowered, the same program is scanned.
#[test]
fn the_same_program_with_room_is_scanned() {
    let dir = TestDir::new("scan_with_room");
    let prog = compile_c(&dir, FIXTURE);
    let run = output_of(under_address_space_limit(&dir, &prog, 4096), "trapline run");
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert!(
        !run.stderr.contains("no reachability scan"),
        "{}",
        run.describe()
    );
    let report = leaks(&dir.trace());
    assert!(as_array(&report, "scans_skipped").is_empty());
    assert_eq!(as_str(field(&report, "scan"), "trigger"), "exit");
    assert_eq!(as_u64(field(&report, "scan"), "blocks"), BLOCKS + 1);
}

/// In a cgroup limited to what the program and the agent's table use, plus
/// less than a scan needs, the exit scan got the program killed by the OOM
/// killer (status 137 where it returned 0).
#[test]
fn an_exit_scan_that_would_pass_the_cgroup_limit_is_skipped() {
    let Some(group) = MemoryGroup::new("trapline-scan-test", CGROUP_LIMIT) else {
        return;
    };
    let dir = TestDir::new("scan_skipped_cgroup");
    let prog = compile_c(&dir, FIXTURE);
    let cmd = run_command(&dir, &[], &prog, &[&BLOCKS.to_string()]);
    let run = output_of(group.run_inside(&cmd), "trapline run in a cgroup");
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, format!("held {BLOCKS}\n"));
    assert_no_events_lost_in_summary(&run);
    assert!(
        run.stderr
            .contains("the memory limit of the process's cgroup"),
        "{}",
        run.describe()
    );
    let report = leaks(&dir.trace());
    assert_complete(&report);
    let skipped = only_skipped_scan(&report);
    assert_eq!(as_str(skipped, "reason"), "cgroup_memory_limit");
    assert_eq!(as_u64(skipped, "limit_bytes"), CGROUP_LIMIT);
    assert_unjudged_blocks(&report);
}

/// A program the OOM killer ends: `trapline run` says who sent the SIGKILL
/// (the kernel's count of OOM kills rose while the command ran) instead of
/// only "SIGKILL cannot be caught", and returns the command's status
/// whether or not the summary's replay fits in what the group has left.
#[test]
fn a_program_the_oom_killer_ends_is_named_as_such() {
    // Far less than the program's 80 MB.
    let Some(group) = MemoryGroup::new("trapline-oom-test", 40 << 20) else {
        return;
    };
    let dir = TestDir::new("oom_killed");
    let prog = compile_c(&dir, FIXTURE);
    let cmd = run_command(&dir, &[], &prog, &[&BLOCKS.to_string()]);
    let run = output_of(group.run_inside(&cmd), "trapline run in a cgroup");
    assert_eq!(run.code(), 128 + 9, "{}", run.describe());
    assert!(
        run.stderr.contains(&format!(
            "the program died of signal 9 (SIGKILL) before the agent could finish the trace: \
             SIGKILL cannot be caught; the OOM killer of the memory cgroup {} (limit of 40 \
             MiB) ended a process of the group while the command ran: the command reached \
             the group's limit.",
            group.path()
        )),
        "{}",
        run.describe()
    );
    // The summary's replay runs in the same group: when it does not fit,
    // its reader is ended, not trapline, and says so.
    assert!(
        run.stderr.contains("==trapline== allocation calls: ")
            || run.stderr.contains(&format!(
                "==trapline== the summary is missing: trapline's reader of the traces was \
                 killed by signal 9 (SIGKILL): the OOM killer of the memory cgroup {} (limit \
                 of 40 MiB) ended it",
                group.path()
            )),
        "{}",
        run.describe()
    );
}

/// Periodic scans that would pass the limit are skipped one by one while
/// the program runs; the text report names three and counts the rest. (In
/// a cgroup, whose limit is set from outside: a program that lowers its own
/// `ulimit -v` reads its size while a periodic scan may hold its memory.)
#[test]
fn periodic_scans_that_would_pass_the_cgroup_limit_are_skipped() {
    let Some(group) = MemoryGroup::new("trapline-periodic-test", CGROUP_LIMIT) else {
        return;
    };
    let dir = TestDir::new("scan_skipped_periodic");
    let prog = compile_c(&dir, FIXTURE);
    // Every scan due is tried (no time budget): the limit alone skips them.
    let cmd = run_command(
        &dir,
        &["--scan-every", "0.05", "--scan-budget", "100"],
        &prog,
        &[&BLOCKS.to_string(), "-", "wait"],
    );
    let mut cmd = isolated(group.run_inside(&cmd));
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("start trapline run");
    // Polled, not slept: the program waits until the trace holds five.
    let periodic = |report: &Value| {
        as_array(report, "scans_skipped")
            .iter()
            .filter(|s| as_str(s, "trigger") == "periodic")
            .count()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let polled = analysis("leaks", &dir.trace());
        let report: Option<Value> = serde_json::from_str(&polled.stdout).ok();
        if report.as_ref().is_some_and(|r| periodic(r) >= 5) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no periodic scans skipped"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    use std::io::Write as _;
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"x").expect("wake the program");
    drop(stdin);
    let run = finish(child, "trapline run");
    assert_eq!(run.code(), 0, "{}", run.describe());

    let report = leaks(&dir.trace());
    assert_complete(&report);
    let skipped = as_array(&report, "scans_skipped");
    let n = periodic(&report);
    assert!(n >= 5, "{}", pretty(&report));
    // In time order, the exit scan last; every one for the same limit.
    assert_eq!(skipped.len(), n + 1);
    assert_eq!(as_str(&skipped[n], "trigger"), "exit");
    let times: Vec<u64> = skipped.iter().map(|s| as_u64(s, "time_ns")).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert!(skipped
        .iter()
        .all(|s| as_str(s, "reason") == "cgroup_memory_limit"));
    // Scans that ran came before the limit was lowered (the program was
    // still allocating): the report's records are the last of them.
    let scan = field(&report, "scan");
    let text = leaks_text(&dir.trace(), &[]);
    let says = if scan.is_null() {
        "The blocks below are unjudged, as with `trapline run --no-scan`."
    } else {
        assert_eq!(as_str(scan, "trigger"), "periodic");
        let at = field(scan, "time_seconds").as_f64().expect("a number");
        assert!(at * 1e9 <= times[0] as f64, "{}", pretty(&report));
        "The records below are the last scan's that ran (above), not the exit's."
    };
    assert!(text.contains(says), "{text}");
    let named = text
        .lines()
        .filter(|l| l.contains("WARNING: no reachability scan at "))
        .count();
    assert_eq!(named, 3 + 1, "{text}");
    assert!(
        text.contains(&format!(
            "WARNING: {} more periodic scans were skipped (the JSON report lists them)",
            n - 3
        )),
        "{text}"
    );
}
