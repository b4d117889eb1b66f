//! `trapline watch PID` against a service started with `trapline run
//! --control`: the agent answers on its socket while the program runs, and
//! the watcher, which may come and go, finds the sites that keep growing.

mod common;

use common::*;
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// `trapline watch PID ARGS...` to its end: (status, stdout, stderr).
fn watch(pid: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(trapline())
        .arg("watch")
        .arg(pid)
        .args(args)
        .output()
        .expect("run trapline watch");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `trapline run --control` of watched_service.c, and the service's pid.
fn start_service(dir: &TestDir) -> (std::process::Child, String) {
    let prog = compile_c(dir, "watched_service.c");
    start_printing(run_command(dir, &["--control"], &prog, &[]), "pid=")
}

/// Waits (asking with one-look watchers) until the service's cache holds
/// its 2,000 entries: the service has served that many requests.
fn until_cache_is_full(pid: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the cache never filled"
        );
        let (code, out, err) = watch(pid, &["--count", "1", "--format", "jsonl", "--top", "10"]);
        assert_eq!(code, 0, "{err}");
        let look: Value = serde_json::from_str(out.trim()).expect("one JSON look");
        if site(&look, "CACHE").is_some_and(|s| as_u64(s, "bytes") == 256 * 2_000) {
            break;
        }
    }
}

/// The control socket of process `pid`.
fn socket_of(pid: &str) -> String {
    let uid = nix::unistd::geteuid().as_raw();
    let dir = trapline_contract::control::socket_dir(
        std::env::var("XDG_RUNTIME_DIR").ok().as_deref(),
        uid,
    );
    trapline_contract::control::socket_path(&dir, pid.parse().unwrap())
}

/// Connects to `path`, sends one request line, and returns the connection
/// and the answer's line.
fn ask(path: &str, request: &str) -> (std::os::unix::net::UnixStream, String) {
    let mut s = std::os::unix::net::UnixStream::connect(path).expect("connect");
    s.write_all(format!("{request}\n").as_bytes()).unwrap();
    let mut answer = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(&s), &mut answer).unwrap();
    (s, answer)
}

/// The site of `look` with a frame at `marker` of service_sites.h.
fn site<'a>(look: &'a Value, marker: &str) -> Option<&'a Value> {
    entry_at(field(look, "sites"), "service_sites.h", marker)
}

/// The entry of `list` (sites of a look, records of a report) with a
/// frame at `marker` of `file`.
fn entry_at<'a>(list: &'a Value, file: &str, marker: &str) -> Option<&'a Value> {
    list.as_array()
        .unwrap()
        .iter()
        .find(|s| has_frame_at(s, file, marker))
}

/// Waits, at most `secs` seconds, for the last look `trapline run
/// --watch` wrote beside the trace of `dir` to satisfy `judged`.
fn until_a_look(dir: &TestDir, secs: u64, what: &str, judged: impl Fn(&Value) -> bool) -> Value {
    let mut looks_file = dir.trace().into_os_string();
    looks_file.push(".watch.jsonl");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no look within {secs} s found {what}"
        );
        let text = std::fs::read_to_string(&looks_file).unwrap_or_default();
        let last = text
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str::<Value>(l).ok());
        if let Some(l) = last.filter(|l| judged(l)) {
            return l;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// watched_service.c: a leak per request and a list never read again keep
/// growing; a cache that filled and holds, and a working set, do not. The
/// watcher is started three times without disturbing the program: twice to
/// see the cache full, once for fifteen looks. The socket goes with the
/// process.
#[test]
fn a_watcher_finds_the_sites_that_keep_growing_while_the_program_runs() {
    let dir = TestDir::new("watch");
    let (mut child, pid) = start_service(&dir);
    // The cache holds its 2,000 entries before the looks that judge begin.
    until_cache_is_full(&pid);
    let (code, out, err) = watch(
        &pid,
        &[
            "--count",
            "15",
            "--interval",
            "0.1",
            "--format",
            "jsonl",
            "--top",
            "10",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let looks: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(looks.len(), 15);
    let last = looks.last().unwrap();
    for marker in ["LEAK", "LIST"] {
        let s = site(last, marker).unwrap_or_else(|| panic!("{marker} in {}", pretty(last)));
        assert!(!field(s, "growth").is_null(), "{marker}: {}", pretty(s));
    }
    let cache = site(last, "CACHE").expect("the cache is among the largest");
    assert!(field(cache, "growth").is_null(), "{}", pretty(cache));
    if let Some(work) = site(last, "WORK") {
        assert!(field(work, "growth").is_null(), "{}", pretty(work));
    }
    // Standard input closes: the service ends as it would untraced.
    drop(child.stdin.take());
    let status = child.wait().expect("trapline run ends");
    assert_eq!(status.code(), Some(0));
    // The process is gone: said so, not "no control socket".
    let (code, _, err) = watch(&pid, &["--count", "1"]);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!("trapline watch: no process {pid} (it has ended, or never ran)\n")
    );
    // A live process nobody records (this test): said so, with both ways.
    let me = std::process::id().to_string();
    let (code, _, err) = watch(&me, &["--count", "1"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with(&format!(
            "trapline watch: process {me} is not being recorded"
        )) && err.contains(&format!("`trapline attach {me}`")),
        "{err}"
    );
}

/// `watch -o FILE` keeps at most `--log-limit` on disk: FILE becomes
/// FILE.1 when it reaches half the limit, and the latest looks are all
/// kept, in order. (The log of `run --watch` grew without bound: 9.3 MB in
/// 11 minutes for an idle memcached.) An existing log is kept unless
/// --force.
#[test]
fn a_watch_log_is_bounded_and_keeps_the_latest_looks() {
    let dir = TestDir::new("watch_log");
    let (mut child, pid) = start_service(&dir);
    let log = dir.path().join("looks.jsonl");
    let rotated = dir.path().join("looks.jsonl.1");
    let log_arg = log.to_str().unwrap();
    let args = [
        "--count",
        "120",
        "--interval",
        "0.01",
        "--format",
        "jsonl",
        "--no-stale",
        "--log-limit",
        "64K",
        "-o",
        log_arg,
    ];
    let (code, out, err) = watch(&pid, &args);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "", "the looks go to the file");
    let looks_in = |path: &Path| -> Vec<u64> {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(
            text.len() <= 32 << 10,
            "{}: {} bytes",
            path.display(),
            text.len()
        );
        text.lines()
            .map(|l| as_u64(&serde_json::from_str::<Value>(l).unwrap(), "looks"))
            .collect()
    };
    let (older, latest) = (looks_in(&rotated), looks_in(&log));
    assert!(!older.is_empty() && !latest.is_empty());
    let kept: Vec<u64> = older.iter().chain(&latest).copied().collect();
    let first = kept[0];
    assert!(first > 1, "120 looks do not fit in 64 KiB: {kept:?}");
    assert_eq!(kept, (first..=120).collect::<Vec<u64>>());

    let (code, _, err) = watch(&pid, &args);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("looks.jsonl: exists; --force replaces it"),
        "{err}"
    );
    assert_eq!(looks_in(&log), latest);
    let mut forced = args.to_vec();
    forced[1] = "1";
    forced.push("--force");
    let (code, _, err) = watch(&pid, &forced);
    assert_eq!(code, 0, "{err}");
    assert_eq!(looks_in(&log), [1]);
    assert!(!rotated.exists());
    drop(child.stdin.take());
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// A client that sends garbage, leaves mid-request, or stays connected
/// asking nothing changes nothing: a watcher is answered.
#[test]
fn garbage_and_a_client_that_leaves_do_not_disturb_the_agent() {
    let dir = TestDir::new("watch_garbage");
    let (mut child, pid) = start_service(&dir);
    let path = socket_of(&pid);
    let (mut s, answer) = ask(&path, "no such request");
    assert!(answer.contains("\"error\""), "{answer}");
    // Half a request, then gone.
    s.write_all(b"sit").unwrap();
    drop(s);
    // Another client stays connected and asks nothing: a watcher is
    // answered beside it.
    let idle = std::os::unix::net::UnixStream::connect(&path).expect("connect");
    let (code, out, err) = watch(&pid, &["--count", "1", "--format", "jsonl"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"looks\":1"), "{out}");
    drop(idle);
    drop(child.stdin.take());
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// `trapline run --watch`: the watcher runs beside the program, its looks
/// go to TRACE.watch.jsonl, and the summary names the sites still growing
/// at the last look, by function and line: the leak and the list, not the
/// cache.
#[test]
fn run_watch_names_the_growing_sites_in_its_summary() {
    let dir = TestDir::new("run_watch");
    let prog = compile_c(&dir, "watched_service.c");
    let mut child = run_command(&dir, &["--watch=0.1"], &prog, &[])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start trapline run");
    read_stdout_line(&mut child);
    let growing =
        |look: &Value, marker| site(look, marker).is_some_and(|s| !field(s, "growth").is_null());
    let _ = until_a_look(&dir, 120, "both growing sites", |l| {
        growing(l, "LEAK") && growing(l, "LIST")
    });
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("trapline run ends");
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = |marker| marker_line("service_sites.h", marker);
    for (function, marker) in [("leak", "LEAK"), ("remember", "LIST")] {
        let said = format!(
            "watch: growing at the last look: {function} (service_sites.h:{})",
            line(marker)
        );
        assert!(stderr.contains(&said), "{said}\n{stderr}");
    }
    assert!(!stderr.contains("cache_put"), "{stderr}");
}

/// A scan asked for on the socket runs while the program runs and is in
/// the trace as snapshot 1: the leak's blocks of that moment are
/// definitely lost there, the list's still reachable.
#[test]
fn a_scan_asked_for_on_the_socket_is_a_snapshot_of_the_trace() {
    let dir = TestDir::new("watch_scan");
    let (mut child, pid) = start_service(&dir);
    until_cache_is_full(&pid);
    let (s, answer) = ask(&socket_of(&pid), "scan");
    let answer: Value = serde_json::from_str(&answer).expect("one JSON line");
    assert_eq!(answer["scan"], 1, "{answer}");
    assert!(as_u64(&answer, "blocks") > 0, "{answer}");
    drop(s);
    drop(child.stdin.take());
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let first = leaks_with(&dir.trace(), &["--snapshot", "1", "--kinds", "all"]);
    assert_eq!(field(field(&first, "scan"), "trigger"), "periodic");
    let kind_at = |marker| {
        let line = marker_line("service_sites.h", marker);
        field(&first, "records")
            .as_array()
            .unwrap()
            .iter()
            .find(|r| {
                let top = &field(r, "stack")[0];
                basename(top.get("file")) == "service_sites.h"
                    && top.get("line").and_then(Value::as_u64) == Some(line)
            })
            .map(|r| field(r, "kind").as_str().unwrap().to_owned())
    };
    assert_eq!(kind_at("LEAK").as_deref(), Some("definitely_lost"));
    assert_eq!(kind_at("LIST").as_deref(), Some("still_reachable"));
}

/// Whether `v`'s stack has a frame at `marker` of `file`.
fn has_frame_at(v: &Value, file: &str, marker: &str) -> bool {
    let line = marker_line(file, marker);
    field(v, "stack").as_array().unwrap().iter().any(|f| {
        basename(f.get("file")) == file && f.get("line").and_then(Value::as_u64) == Some(line)
    })
}

/// `trapline run --control` of leaky_server.c at 2,000 requests a second,
/// and the server's pid.
fn start_server(dir: &TestDir) -> (std::process::Child, String) {
    let prog = compile_c(dir, "leaky_server.c");
    start_printing(run_command(dir, &["--control"], &prog, &["2000"]), "pid=")
}

fn verdicts(v: &Value) -> Vec<&str> {
    field(v, "verdicts")
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect()
}

/// leaky_server.c, two worker threads answering a local client at 2,000
/// requests a second: the watcher finds the dropped copies and the history
/// nobody reads growing and stale (their watched blocks untouched for 4 s),
/// and neither the cache (full, read at every request) nor the working
/// set. The server checks every byte it reads, the watched ones included,
/// and ends as untraced; `trapline leaks` shows the watcher's verdicts.
#[test]
fn a_watcher_finds_a_servers_leak_and_history_growing_and_stale() {
    let dir = TestDir::new("watch_server");
    let (mut child, pid) = start_server(&dir);
    let (code, out, err) = watch(
        &pid,
        &[
            "--wait",
            "30",
            "--count",
            "24",
            "--stale-after",
            "4",
            "--format",
            "jsonl",
            "--top",
            "10",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let last: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(
        last.pointer("/monitor/mechanism").and_then(Value::as_str),
        Some("userfaultfd"),
        "{}",
        pretty(&last)
    );
    for marker in ["LEAK", "HISTORY"] {
        let s = entry_at(field(&last, "sites"), "leaky_server.c", marker)
            .unwrap_or_else(|| panic!("{marker} in {}", pretty(&last)));
        let v = verdicts(s);
        assert!(
            v.contains(&"growing") && v.contains(&"stale"),
            "{marker}: {}",
            pretty(s)
        );
    }
    for marker in ["CACHE", "WORKING"] {
        let s = entry_at(field(&last, "sites"), "leaky_server.c", marker)
            .unwrap_or_else(|| panic!("{marker} in {}", pretty(&last)));
        assert!(verdicts(s).is_empty(), "{marker}: {}", pretty(s));
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("trapline run ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(" history="), "{stdout}");
    // Offline: the watcher's stale verdicts are in the trace.
    let report = leaks_with(&dir.trace(), &["--kinds", "all"]);
    let record = |marker| {
        entry_at(field(&report, "records"), "leaky_server.c", marker)
            .unwrap_or_else(|| panic!("{marker} record in {}", pretty(&report)))
            .clone()
    };
    let leak = record("LEAK");
    assert_eq!(
        verdicts(&leak),
        ["unreachable", "growing", "stale", "unfreed_at_exit"],
        "{}",
        pretty(&leak)
    );
    assert!(as_u64(field(&leak, "staleness"), "untouched_blocks") >= 4);
    let history = record("HISTORY");
    assert_eq!(
        verdicts(&history),
        ["growing", "stale", "unfreed_at_exit"],
        "{}",
        pretty(&history)
    );
}

/// watched_pages.c asks its own agent to watch a block's pages, then
/// reads into one with read(2) (the kernel writes it) and forks: both work
/// as without trapline (the child sees every byte), the kernel's write is
/// the page's access, and the fork gives the other pages back first.
#[test]
fn watched_pages_stay_whole_through_read_and_fork() {
    let dir = TestDir::new("watched_pages");
    let prog = compile_c(&dir, "watched_pages.c");
    let out = run_command(&dir, &["--control"], &prog, &[])
        .output()
        .expect("run trapline run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    for check in [
        "read(2) into a watched page: ok",
        "fork child sees every byte: ok",
        "the program sees every byte: ok",
    ] {
        assert!(stdout.contains(check), "{check}\n{stdout}");
    }
    let json_after = |prefix: &str| -> Value {
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("{prefix}\n{stdout}"));
        serde_json::from_str(line).unwrap()
    };
    let armed = json_after("arm: ");
    let block = armed["armed"][0][0].as_u64().unwrap();
    let pages: Vec<u64> = armed["armed"][0][1]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    assert_eq!(pages.len(), 8, "{armed}");
    let last_page = (block + (1 << 20) - 1) & !4095;
    let watches = json_after("watches: ");
    let outcomes: Vec<(u64, &str, u64)> = watches["watches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w[0].as_u64().unwrap(),
                w[1].as_str().unwrap(),
                w[4].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(outcomes.len(), 8, "{watches}");
    for (page, outcome, tid) in outcomes {
        if page == last_page {
            assert_eq!(outcome, "touched", "{watches}");
            assert!(tid > 0, "{watches}");
        } else {
            assert_eq!(outcome, "released", "{watches}");
        }
    }
}

/// Bad input for a watcher: a socket file left by a process that ended is
/// named as such; two watchers at once are both answered; a watcher killed
/// while pages are watched leaves the server answering, a new watcher is
/// served, and the server ends as untraced with every byte it reads intact.
#[test]
fn stale_sockets_second_watchers_and_killed_watchers_are_handled() {
    let dir = TestDir::new("watch_bad_input");
    let uid = nix::unistd::geteuid().as_raw();
    let sockets = trapline_contract::control::socket_dir(
        std::env::var("XDG_RUNTIME_DIR").ok().as_deref(),
        uid,
    );
    std::fs::create_dir_all(&sockets).unwrap();
    let gone = 4_194_000u32;
    let path = trapline_contract::control::socket_path(&sockets, gone);
    let _ = std::fs::remove_file(&path);
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let (code, _, err) = watch(&gone.to_string(), &["--count", "1"]);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("left from a process that has ended"), "{err}");

    let (mut child, pid) = start_server(&dir);
    // A watcher that watches pages, killed once it has armed some.
    let mut doomed = Command::new(trapline())
        .args(["watch", &pid, "--wait", "30", "--interval", "0.2"])
        .args(["--stale-after", "4", "--format", "jsonl"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut looks = std::io::BufReader::new(doomed.stdout.take().unwrap());
    loop {
        let mut line = String::new();
        assert!(
            std::io::BufRead::read_line(&mut looks, &mut line).unwrap() > 0,
            "the watcher ended"
        );
        let look: Value = serde_json::from_str(&line).unwrap();
        if look
            .pointer("/monitor/armed_pages")
            .and_then(Value::as_u64)
            .is_some_and(|n| n > 0)
        {
            break;
        }
    }
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    // Two watchers at once, after it: both answered.
    let second = Command::new(trapline())
        .args(["watch", &pid, "--count", "3", "--interval", "0.1"])
        .args(["--format", "jsonl"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, out, err) = watch(
        &pid,
        &["--count", "3", "--interval", "0.1", "--format", "jsonl"],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 3, "{out}");
    let second = second.wait_with_output().unwrap();
    assert_eq!(second.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&second.stdout).lines().count(), 3);
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("trapline run ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains(" history="), "{stdout}");
}

/// `trapline run FLAGS --watch --stale-after 4` of leaky_server.c at 2,000
/// requests a second, until a look (the one returned) judges both leak
/// sites growing and stale, within `secs` seconds.
fn run_leaky_server_until_both_leaks_are_stale(
    dir: &TestDir,
    flags: &[&str],
    secs: u64,
) -> (std::process::Child, Value) {
    let prog = compile_c(dir, "leaky_server.c");
    let flags: Vec<&str> = flags
        .iter()
        .copied()
        .chain(["--watch", "--stale-after", "4"])
        .collect();
    // Unchecked: reading the history back at the end would be an access.
    let mut child = run_command(dir, &flags, &prog, &["2000", "0", "unchecked"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start trapline run");
    read_stdout_line(&mut child);
    let judged = |look: &Value, marker| {
        entry_at(field(look, "sites"), "leaky_server.c", marker).is_some_and(|s| {
            let v = verdicts(s);
            v.contains(&"growing") && v.contains(&"stale")
        })
    };
    let last = until_a_look(dir, secs, "both leak sites growing and stale", |l| {
        judged(l, "LEAK") && judged(l, "HISTORY")
    });
    (child, last)
}

/// `trapline run --watch --stale-after 4` of leaky_server.c: once a look
/// has judged both leak sites growing and stale, standard input closes,
/// and the summary names them by function and line with their verdicts
/// and evidence, and neither the cache nor the working set.
#[test]
fn run_watch_names_a_servers_stale_and_growing_sites_in_its_summary() {
    let dir = TestDir::new("run_watch_server");
    let (mut child, _) = run_leaky_server_until_both_leaks_are_stale(&dir, &[], 60);
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("trapline run ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    for (function, marker) in [("keep_reply_copy", "LEAK"), ("log_request", "HISTORY")] {
        let said = format!(
            "watch: growing, stale at the last look: {function} (leaky_server.c:{}), +",
            marker_line("leaky_server.c", marker)
        );
        assert!(stderr.contains(&said), "{said}\n{stderr}");
    }
    assert!(stderr.contains("watched blocks untouched"), "{stderr}");
    for function in ["cache_fill", "working_set_init"] {
        assert!(!stderr.contains(function), "{stderr}");
    }
}

/// The same server in production mode (`--sample 1024`, so that a few
/// seconds sample enough of its small blocks): a look judges the dropped
/// copies and the history growing and stale from their sampled blocks,
/// and no watched block of theirs was touched. Most of their pages hold
/// blocks nobody sampled, the cache's and the scratch blocks read at every
/// request among them: only a touch at one of the watched block's own bytes
/// (the fault's exact address) counts as its access. `trapline leaks`
/// shows the verdicts offline.
#[test]
fn production_watch_judges_staleness_on_the_sampled_blocks_alone() {
    let dir = TestDir::new("run_watch_production");
    let (mut child, last) =
        run_leaky_server_until_both_leaks_are_stale(&dir, &["--production", "--sample=1024"], 90);
    for marker in ["LEAK", "HISTORY"] {
        let s = entry_at(field(&last, "sites"), "leaky_server.c", marker).unwrap();
        let staleness = field(s, "staleness");
        assert_eq!(
            as_u64(staleness, "touched_blocks"),
            0,
            "{marker}: {}",
            pretty(s)
        );
        assert!(as_u64(staleness, "untouched_blocks") >= 4, "{}", pretty(s));
        assert_eq!(field(s, "growth")["estimated"], true, "{}", pretty(s));
    }
    let cache = entry_at(field(&last, "sites"), "leaky_server.c", "CACHE")
        .unwrap_or_else(|| panic!("CACHE in {}", pretty(&last)));
    assert!(verdicts(cache).is_empty(), "{}", pretty(cache));
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("trapline run ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let report = leaks_with(&dir.trace(), &["--kinds", "all"]);
    for marker in ["LEAK", "HISTORY"] {
        let record = entry_at(field(&report, "records"), "leaky_server.c", marker)
            .unwrap_or_else(|| panic!("{marker} record in {}", pretty(&report)));
        assert!(verdicts(record).contains(&"stale"), "{}", pretty(record));
    }
}

/// watched_roots.c has its own agent watch the pages of a block that
/// points to 8 others, then clears it (each page's first write gives it
/// back). The copies the agent kept of the pages are no roots: the 8 blocks
/// are definitely lost, as without watching, and only the holder is
/// still reachable.
#[test]
fn the_copies_of_watched_pages_are_not_roots() {
    let dir = TestDir::new("watched_roots");
    let src = "watched_roots.c";
    let prog = compile_c(&dir, src);
    let run = run(&dir, &["--control"], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, "cleared\n", "{}", run.describe());
    let report = leaks_with(&dir.trace(), &["--kinds", "all"]);
    assert_complete(&report);
    let mut summary: Vec<(String, u64, u64)> = records(&report)
        .iter()
        .map(|r| {
            let top = &r["stack"][0];
            assert_eq!(basename(top.get("file")), src, "{}", pretty(r));
            (
                as_str(r, "kind").to_owned(),
                as_u64(r, "bytes"),
                top["line"].as_u64().unwrap(),
            )
        })
        .collect();
    summary.sort();
    assert_eq!(
        summary,
        [
            ("definitely_lost".to_owned(), 512, marker_line(src, "LOST")),
            (
                "still_reachable".to_owned(),
                65536,
                marker_line(src, "HOLDER")
            ),
        ],
        "{}",
        pretty(&report)
    );
}

/// `trapline run FLAG` of forked_worker.c, and the worker's pid.
fn start_forked_worker(dir: &TestDir, flag: &str) -> (std::process::Child, String) {
    let prog = compile_c(dir, "forked_worker.c");
    start_printing(isolated(run_command(dir, &[flag], &prog, &[])), "worker ")
}

/// `trapline watch <nginx worker>` was refused ("not started with
/// `trapline run --control`"): only the top process served a socket, and
/// in a master/worker server the master does no work. Now every traced
/// process of a `--control` run serves its own.
#[test]
fn the_worker_a_master_forked_is_watched() {
    let dir = TestDir::new("forked_worker");
    let (mut child, worker) = start_forked_worker(&dir, "--control");
    // Until the worker's trace holds the block's stack (its writer sweeps
    // every 200 ms).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let look = loop {
        let (code, out, err) = watch(&worker, &["--count", "1", "--format", "jsonl"]);
        assert_eq!(code, 0, "{err}");
        let look: Value = serde_json::from_str(out.trim()).expect("one JSON look");
        if entry_at(field(&look, "sites"), "forked_worker.c", "WORKER-BLOCK").is_some() {
            break look;
        }
        assert!(std::time::Instant::now() < deadline, "{look}");
    };
    assert_eq!(look["pid"].as_u64(), worker.parse().ok());
    let block = entry_at(field(&look, "sites"), "forked_worker.c", "WORKER-BLOCK").unwrap();
    assert_eq!(as_u64(block, "bytes"), 4000);
    let socket = socket_of(&worker);
    drop(child.stdin.take());
    let finished = finish(child, "trapline run");
    assert_eq!(finished.code(), 0, "{}", finished.describe());
    assert!(!Path::new(&socket).exists(), "{socket} stayed");
}

/// `trapline run --watch` watches every process of the tree that serves a
/// socket, not only the top one (in a master/worker service the master
/// does no work): the worker's looks go to `TRACE.<pid>.watch.jsonl`, and
/// the summary names them.
#[test]
fn run_watch_watches_the_worker_a_master_forked() {
    let dir = TestDir::new("run_watch_worker");
    let (mut child, worker) = start_forked_worker(&dir, "--watch=0.1");
    let looks = dir.path().join(format!("t.trace.{worker}.watch.jsonl"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(&looks).unwrap_or_default();
        let seen = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .any(|look| {
                look["pid"].as_u64() == worker.parse().ok()
                    && entry_at(field(&look, "sites"), "forked_worker.c", "WORKER-BLOCK")
                        .is_some_and(|s| as_u64(s, "bytes") == 4000)
            });
        if seen {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{}: {text}",
            looks.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(child.stdin.take());
    let finished = finish(child, "trapline run");
    assert_eq!(finished.code(), 0, "{}", finished.describe());
    let said = format!("==trapline== watch (process {worker}): ");
    assert!(
        finished.stderr.contains(&said),
        "{said}\n{}",
        finished.stderr
    );
}
