//! `trapline export`: the files other tools read, read by those tools.
//! pprof files are read by `go tool pprof` (Debian's golang-go, which
//! .ci/run installs), and what it reports must equal trapline's own
//! analyses of the same trace.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// `go tool pprof ARGS FILE`'s standard output; it must succeed.
fn pprof(args: &[&str], file: &Path) -> String {
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .env("HOME", file.parent().unwrap())
        .env("PPROF_TMPDIR", file.parent().unwrap())
        .output()
        .unwrap_or_else(|e| panic!("cannot run go tool pprof (apt-get install golang-go): {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "go tool pprof {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The rows of `pprof -top` as (flat, name): the first column and what
/// follows the other four.
fn top_rows(top: &str) -> Vec<(String, String)> {
    top_table(top)
        .into_iter()
        .map(|cols| (cols[0].clone(), cols[5..].join(" ")))
        .collect()
}

/// The rows of `pprof -top`, split into columns (flat, flat%, sum%, cum,
/// cum%, name...).
fn top_table(top: &str) -> Vec<Vec<String>> {
    top.lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .filter(|cols| cols.len() >= 6)
        .collect()
}

fn export(trace: &Path, args: &[&str], out: &Path) -> Finished {
    let mut cmd = Command::new(trapline());
    cmd.arg("export").args(args).arg(trace).arg("-o").arg(out);
    output_of(cmd, "trapline export")
}

/// The heap profile of sampled_leaks.c: what is live at the end is the
/// exit snapshot's 21,000,000 bytes, all at make_node's malloc line, and
/// what was allocated counts every call the program made.
#[test]
fn heap_profile_is_read_by_go_tool_pprof() {
    let dir = TestDir::new("export_pprof_heap");
    let prog = compile_c(&dir, "sampled_leaks.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let file = dir.path().join("heap.pb.gz");
    let e = export(&dir.trace(), &["--format", "pprof"], &file);
    assert_eq!(e.code(), 0, "{}", e.describe());

    let line = marker_line("sampled_leaks.c", "NODE");
    let top = pprof(
        &["-top", "-lines", "-unit=B", "-sample_index=inuse_space"],
        &file,
    );
    assert!(
        top.contains("Total samples = 21000000B"),
        "inuse_space total:\n{top}"
    );
    assert_eq!(
        top.lines().next(),
        Some("File: sampled_leaks"),
        "the first line names the program:\n{top}"
    );
    let rows = top_rows(&top);
    let (flat, name) = &rows[0];
    assert_eq!(flat, "21000000B", "{top}");
    assert!(
        name.starts_with("make_node ") && name.ends_with(&format!("sampled_leaks.c:{line}")),
        "the top line is make_node's malloc: {name}\n{top}"
    );

    let leaks = leaks(&dir.trace());
    let allocs = as_u64(&leaks["summary"]["total_heap_usage"], "allocs");
    let objects = pprof(&["-top", "-sample_index=alloc_objects"], &file);
    assert!(
        objects.contains(&format!("Total samples = {allocs} ")),
        "alloc_objects total is leaks' {allocs}:\n{objects}"
    );
    let churn = top_rows(&objects)
        .into_iter()
        .find(|(_, n)| n == "churn")
        .unwrap_or_else(|| panic!("churn in:\n{objects}"));
    assert_eq!(churn.0, "100000", "{objects}");
}

/// The CPU profile of profile_shares.c: the samples go tool pprof counts
/// per function are those of `trapline profile`.
#[test]
fn cpu_profile_is_read_by_go_tool_pprof() {
    let dir = TestDir::new("export_pprof_cpu");
    let prog = compile_c(&dir, "profile_shares.c");
    let run = run(&dir, &["--profile"], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let file = dir.path().join("cpu.pb.gz");
    let e = export(
        &dir.trace(),
        &["--format", "pprof", "--profile", "cpu"],
        &file,
    );
    assert_eq!(e.code(), 0, "{}", e.describe());

    let report = analysis_json("profile", &dir.trace());
    let samples = as_u64(&report, "samples");
    let top = pprof(&["-top", "-sample_index=samples"], &file);
    assert!(
        top.contains(&format!("% of {samples} total")),
        "{samples} samples:\n{top}"
    );
    // The profile's file is the program, not the module the first stack met.
    assert_eq!(
        top.lines().next(),
        Some("File: profile_shares"),
        "the first line names the program:\n{top}"
    );
    let rows = top_table(&top);
    let mut compared = 0;
    for f in report["functions"].as_array().unwrap() {
        let name = f["function"].as_str().unwrap();
        if !["burn", "spin_a", "spin_b", "spin_c", "inner_c"].contains(&name) {
            continue;
        }
        let row = rows
            .iter()
            // pprof marks a function inlined at every address it is seen.
            .find(|cols| cols[5..].join(" ").trim_end_matches(" (inline)") == name)
            .unwrap_or_else(|| panic!("{name} in:\n{top}"));
        assert_eq!(
            (row[0].as_str(), row[3].as_str()),
            (
                f["self"].to_string().as_str(),
                f["total"].to_string().as_str()
            ),
            "{name}'s own and total samples:\n{top}"
        );
        compared += 1;
    }
    assert_eq!(compared, 5, "{top}");
}

/// An existing output file is kept unless --force; a trace without CPU
/// samples gives no CPU profile; neither leaves a file behind.
#[test]
fn export_refuses_what_it_cannot_write() {
    let dir = TestDir::new("export_refusals");
    let prog = compile_c(&dir, "leaks.c");
    assert_eq!(run(&dir, &[], &prog, &[]).code(), 0);
    let file = dir.path().join("kept.pb.gz");
    std::fs::write(&file, b"mine").unwrap();
    let e = export(&dir.trace(), &["--format", "pprof"], &file);
    assert_eq!(e.code(), 1, "{}", e.describe());
    assert!(
        e.stderr.contains("exists; --force replaces it"),
        "{}",
        e.describe()
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"mine");
    let e = export(&dir.trace(), &["--format", "pprof", "--force"], &file);
    assert_eq!(e.code(), 0, "{}", e.describe());
    assert_ne!(std::fs::read(&file).unwrap(), b"mine");
    // Its own input is never replaced, --force or not, however it is named.
    let trace = std::fs::read(dir.trace()).unwrap();
    let same = dir.path().join(".").join("t.trace");
    let e = export(&dir.trace(), &["--format", "pprof", "--force"], &same);
    assert_eq!(e.code(), 1, "{}", e.describe());
    assert!(
        e.stderr.contains("is a trace this command reads"),
        "{}",
        e.describe()
    );
    assert_eq!(std::fs::read(dir.trace()).unwrap(), trace);

    let cpu = dir.path().join("cpu.pb.gz");
    let e = export(
        &dir.trace(),
        &["--format", "pprof", "--profile", "cpu"],
        &cpu,
    );
    assert_eq!(e.code(), 1, "{}", e.describe());
    assert!(!cpu.exists());
    let leftovers: Vec<Value> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".partial"))
        .map(|e| Value::String(e.file_name().to_string_lossy().into_owned()))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The Parquet tables of sampled_leaks.c, queried by DuckDB (the duckdb
/// Python package, which .ci/run installs): the blocks never released,
/// by the caller of make_node, are the two leaking paths' bytes.
#[test]
fn parquet_tables_are_queried_by_duckdb() {
    let dir = TestDir::new("export_parquet");
    let prog = compile_c(&dir, "sampled_leaks.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let tables = dir.path().join("tables");
    let e = export(&dir.trace(), &["--format", "parquet"], &tables);
    assert_eq!(e.code(), 0, "{}", e.describe());
    // A block is live at the end when the last event at its address is
    // its allocation (a realloc's old address counts as released there).
    let query = format!(
        "import duckdb\n\
         con = duckdb.connect()\n\
         con.execute('set enable_progress_bar = false')\n\
         events, stacks = '{0}/events.parquet', '{0}/stacks.parquet'\n\
         rows = con.sql(f\"\"\"\n\
           with ends as (\n\
             select address as a, time_ns as t from '{{events}}' where kind in ('alloc', 'free', 'realloc')\n\
             union all select old_address, time_ns from '{{events}}' where kind = 'realloc'),\n\
           last as (select a, max(t) as t from ends group by a)\n\
           select s.function, s.line, sum(e.size) from '{{events}}' e\n\
           join last l on e.address = l.a and e.time_ns = l.t\n\
           join '{{stacks}}' s on s.stack_id = e.stack_id and s.frame_index = 1\n\
           where e.kind = 'alloc' group by 1, 2 order by 3 desc\"\"\").fetchall()\n\
         for r in rows: print(*r)\n",
        tables.display()
    );
    let out = Command::new("python3")
        .args(["-c", &query])
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "duckdb (pip install duckdb): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parse = marker_line("sampled_leaks.c", "PARSE");
    let load = marker_line("sampled_leaks.c", "LOAD");
    assert_eq!(
        stdout,
        format!("parse_request {parse} 20000000\nload_config {load} 1000000\n")
    );

    // An existing directory with files is kept unless --force.
    let e = export(&dir.trace(), &["--format", "parquet"], &tables);
    assert_eq!(e.code(), 1, "{}", e.describe());
    assert!(
        e.stderr.contains("is a directory that is not empty"),
        "{}",
        e.stderr
    );
    // A file is no place for the tables, even with --force.
    let file = dir.path().join("tables.txt");
    std::fs::write(&file, "mine").unwrap();
    let e = export(&dir.trace(), &["--format", "parquet", "--force"], &file);
    assert_eq!(e.code(), 1, "{}", e.describe());
    assert!(
        e.stderr
            .contains("is not a directory: parquet writes a directory"),
        "{}",
        e.stderr
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "mine");
}

/// An event on a thread's track: (name, start, duration, site, holds).
type TrackEvent = (String, f64, f64, String, u64);

/// The thread tracks Chrome DevTools' own trace engine builds from a
/// `--format perfetto` file (tests/consumers, which .ci/run installs with
/// npm): per thread, its events.
fn devtools_threads(file: &Path) -> Vec<(u64, Vec<TrackEvent>)> {
    let consumers = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/consumers");
    assert!(
        consumers
            .join("node_modules/@paulirish/trace_engine")
            .is_dir(),
        "DevTools' trace engine is missing: npm ci --prefix tests/consumers (.ci/run does)"
    );
    let out = Command::new("node")
        .arg(consumers.join("devtools_threads.mjs"))
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("cannot run node (apt-get install nodejs): {e}"));
    assert!(
        out.status.success(),
        "DevTools' trace engine failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: Value = serde_json::from_slice(&out.stdout).expect("JSON from the script");
    let processes = parsed["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1, "{parsed}");
    processes[0]["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let events = t["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    (
                        e["name"].as_str().unwrap().to_owned(),
                        e["ts"].as_f64().unwrap(),
                        e["dur"].as_f64().unwrap(),
                        e["site"].as_str().unwrap_or("").to_owned(),
                        e["holds"].as_u64().unwrap_or(1),
                    )
                })
                .collect();
            (t["tid"].as_u64().unwrap(), events)
        })
        .collect()
}

/// The file's own events of phase `ph` (counters and instants, which
/// DevTools' engine keeps no model of).
fn events_of_phase<'a>(trace: &'a Value, ph: &str) -> Vec<&'a Value> {
    trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == ph)
        .collect()
}

/// lock_contention.c's handoff lock, read back by Chrome DevTools' trace
/// engine: exactly one wait, on the waiter's track at its line, and the
/// handoff's two holds, the main thread's before the waiter's; the
/// counter lock's holds are there exactly when some worker waited for it.
#[test]
fn perfetto_timeline_is_read_by_devtools_trace_engine() {
    let dir = TestDir::new("export_perfetto");
    let prog = compile_c(&dir, "lock_contention.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let locks = printed_addresses(&run.stdout);
    let file = dir.path().join("timeline.json");
    let e = export(&dir.trace(), &["--format", "perfetto"], &file);
    assert_eq!(e.code(), 0, "{}", e.describe());
    let pid = e_pid(&dir.trace());

    let threads = devtools_threads(&file);
    let named = |prefix: &str, lock: &str| -> Vec<(u64, TrackEvent)> {
        let name = format!("{prefix} mutex {lock}");
        threads
            .iter()
            .flat_map(|(tid, evs)| evs.iter().map(move |e| (*tid, e.clone())))
            .filter(|(_, e)| e.0 == name)
            .collect()
    };
    let handoff = &locks["handoff"];
    let waits = named("wait", handoff);
    assert_eq!(waits.len(), 1, "{waits:?}");
    let (waiter, wait) = &waits[0];
    assert_ne!(*waiter, pid);
    let wait_line = marker_line("lock_contention.c", "HANDOFF-WAIT");
    assert!(
        wait.3
            .starts_with(&format!("waiter (lock_contention.c:{wait_line})")),
        "{wait:?}"
    );
    assert!(wait.2 > 0.0, "{wait:?}");
    let holds = named("hold", handoff);
    assert_eq!(holds.len(), 2, "{holds:?}");
    let (main_hold, waiter_hold) = (&holds[0], &holds[1]);
    assert_eq!(main_hold.0, pid, "{holds:?}");
    let hold_line = marker_line("lock_contention.c", "HANDOFF-HOLD");
    assert!(
        main_hold
            .1
             .3
            .starts_with(&format!("main (lock_contention.c:{hold_line})")),
        "{holds:?}"
    );
    assert_eq!(waiter_hold.0, *waiter, "{holds:?}");
    assert!(
        main_hold.1 .1 + main_hold.1 .2 <= waiter_hold.1 .1,
        "the main thread's hold ends before the waiter's begins: {holds:?}"
    );

    // 4 workers x 1000 rounds: every hold of the counter lock or none,
    // those no thread waited for merged into spans of several.
    let counter = &locks["counter_lock"];
    let counter_waits = named("wait", counter).len();
    let counter_holds = named("hold", counter).len();
    let merged = named("holds", counter);
    let merged_holds: u64 = merged.iter().map(|(_, e)| e.4).sum();
    assert!(merged.iter().all(|(_, e)| e.4 >= 2), "{merged:?}");
    assert_eq!(
        counter_holds as u64 + merged_holds,
        if counter_waits > 0 { 4000 } else { 0 },
        "{counter_waits} waits"
    );
    // Locks nobody waited for have no holds in the file.
    for name in ["busy", "table", "spin"] {
        let addr = &locks[name];
        assert!(
            threads
                .iter()
                .all(|(_, evs)| evs.iter().all(|e| !e.0.ends_with(addr.as_str()))),
            "{name}"
        );
    }

    // The counter track and the instants, read from the file itself.
    let trace: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let peak = analysis_json("stats", &dir.trace())["peak_heap"]["bytes"].clone();
    let heap = events_of_phase(&trace, "C");
    let most = heap
        .iter()
        .map(|c| &c["args"]["live bytes"])
        .max_by_key(|v| v.as_u64());
    assert_eq!(most, Some(&peak), "{heap:?}");
    let scans: Vec<&Value> = events_of_phase(&trace, "i")
        .into_iter()
        .map(|i| &i["name"])
        .collect();
    assert_eq!(scans, [&Value::from("scan (exit)")]);
    let summary = &trace["otherData"]["trapline"];
    assert_eq!(summary["waits"], 1 + counter_waits, "{summary}");
    assert_eq!(summary["holds"], 2 + counter_holds, "{summary}");
    assert_eq!(summary["merged_hold_spans"], merged.len(), "{summary}");
    assert_eq!(
        summary["left_out"]["merged_holds"], merged_holds,
        "{summary}"
    );
    // busy, table and spin, each taken and released by the main thread.
    assert!(
        summary["left_out"]["uncontended_holds"].as_u64() >= Some(3),
        "{summary}"
    );
}

/// The pid of a trace, from `trapline stats`.
fn e_pid(trace: &Path) -> u64 {
    analysis_json("stats", trace)["process"]["pid"]
        .as_u64()
        .unwrap()
}

/// lock_deadlock.c stopped by --timeout: each thread's track ends with
/// its hold of one lock and its wait for the other, up to the end.
#[test]
fn perfetto_timeline_shows_a_deadlock_as_waits_up_to_the_end() {
    let dir = TestDir::new("export_perfetto_deadlock");
    let prog = compile_c(&dir, "lock_deadlock.c");
    let run = run(&dir, &["--timeout", "3"], &prog, &[]);
    assert_eq!(run.code(), 124, "{}", run.describe());
    let file = dir.path().join("timeline.json");
    let e = export(&dir.trace(), &["--format", "perfetto"], &file);
    assert_eq!(e.code(), 0, "{}", e.describe());
    let threads = devtools_threads(&file);
    let line = |m: &str| marker_line("lock_deadlock.c", m);
    let mut seen: Vec<(String, String)> = threads
        .iter()
        .flat_map(|(_, evs)| evs.iter())
        .map(|e| {
            let kind = e.0.rsplitn(3, ' ').nth(2).unwrap().to_owned();
            (kind, e.3.split(" <- ").next().unwrap().to_owned())
        })
        .collect();
    seen.sort();
    let place = |f: &str, m: &str| format!("{f} (lock_deadlock.c:{})", line(m));
    assert_eq!(
        seen,
        [
            ("held at end".to_owned(), place("one", "ONE-HOLDS-A")),
            ("held at end".to_owned(), place("two", "TWO-HOLDS-B")),
            ("waiting at end".to_owned(), place("one", "ONE-WAITS-B")),
            ("waiting at end".to_owned(), place("two", "TWO-WAITS-A")),
        ]
    );
    // Each thread waits on the track where it holds the other lock.
    for (_, evs) in threads.iter().filter(|(_, evs)| !evs.is_empty()) {
        assert_eq!(evs.len(), 2, "{evs:?}");
    }
}

/// heap_phases.c: 3 x 1000 bytes held, 200 ms of nothing, then freed and
/// 2 x 500 bytes leaked. `--at` a time inside the pause gives phase one's
/// blocks; the default, the end's.
#[test]
fn heap_profile_at_a_chosen_time() {
    let dir = TestDir::new("export_pprof_at");
    let prog = compile_c(&dir, "heap_phases.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let stats = analysis_json("stats", &dir.trace());
    assert_eq!(stats["peak_heap"]["bytes"], 3000, "{}", stats["peak_heap"]);
    // 100 ms after the peak: in the middle of the pause.
    let pause = stats["peak_heap"]["time_ns"].as_u64().unwrap() as f64 / 1e9 + 0.1;
    // Milliseconds: the nanoseconds they round to print back the same.
    let at = format!("{pause:.3}");
    let file = dir.path().join("at.pb.gz");
    let e = export(&dir.trace(), &["--format", "pprof", "--at", &at], &file);
    assert_eq!(e.code(), 0, "{}", e.describe());
    let top = pprof(&["-top", "-unit=B", "-sample_index=inuse_space"], &file);
    assert!(top.contains("Total samples = 3000B"), "{top}");
    assert_eq!(top_rows(&top)[0], ("3000B".into(), "hold_phase_one".into()));
    let objects = pprof(&["-top", "-sample_index=inuse_objects"], &file);
    assert!(objects.contains("Total samples = 3"), "{objects}");

    let end = dir.path().join("end.pb.gz");
    let e = export(&dir.trace(), &["--format", "pprof"], &end);
    assert_eq!(e.code(), 0, "{}", e.describe());
    let top = pprof(&["-top", "-unit=B", "-sample_index=inuse_space"], &end);
    assert!(top.contains("Total samples = 1000B"), "{top}");
    assert_eq!(top_rows(&top)[0], ("1000B".into(), "leak_phase_two".into()));

    // The report draws it as a third flame graph, marked on the plot.
    let page = dir.path().join("at.html");
    let mut cmd = Command::new(trapline());
    cmd.args(["report", "--at", &at])
        .arg(dir.trace())
        .arg("-o")
        .arg(&page);
    let r = output_of(cmd, "trapline report");
    assert_eq!(r.code(), 0, "{}", r.describe());
    let html = std::fs::read_to_string(&page).unwrap();
    // The page prints the seconds as a number ("0.1", not "0.100").
    let shown: f64 = at.parse().unwrap();
    assert!(html.contains(&format!("<h3>Bytes live at {shown} s</h3>")));
    assert_eq!(html.matches("<line class=\"chosen\"").count(), 1);

    // A time after the end, and --at where it means nothing.
    let late_file = dir.path().join("late.pb.gz");
    let late = export(
        &dir.trace(),
        &["--format", "pprof", "--at", "100"],
        &late_file,
    );
    assert_eq!(late.code(), 1, "{}", late.describe());
    assert!(
        late.stderr
            .contains("--at 100 s is after the trace's end ("),
        "{}",
        late.stderr
    );
    assert!(!late_file.exists());
    let json = dir.path().join("t.json");
    let wrong = export(
        &dir.trace(),
        &["--format", "perfetto", "--at", "0.1"],
        &json,
    );
    assert_eq!(wrong.code(), 2, "{}", wrong.describe());
    assert!(!json.exists());
}

/// lock_runs.c: the holds no thread waited for merge into one span per
/// run, the waited one keeps its own, and the filters leave out what they
/// say, counted in the file.
#[test]
fn perfetto_merges_unwaited_holds_and_filters() {
    let dir = TestDir::new("export_perfetto_runs");
    let prog = compile_c(&dir, "lock_runs.c");
    let run = run(&dir, &[], &prog, &[]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let lock = printed_addresses(&run.stdout)["runs"].clone();
    let pid = e_pid(&dir.trace());
    let line = |m: &str| marker_line("lock_runs.c", m);
    let at = |f: &str, m: &str| format!("{f} (lock_runs.c:{})", line(m));

    let file = dir.path().join("all.json");
    let e = export(&dir.trace(), &["--format", "perfetto"], &file);
    assert_eq!(e.code(), 0, "{}", e.describe());
    let mut seen: Vec<(bool, String, String, u64)> = devtools_threads(&file)
        .into_iter()
        .flat_map(|(tid, evs)| evs.into_iter().map(move |e| (tid, e)))
        .map(|(tid, e)| {
            let place = e.3.split(" <- ").next().unwrap().to_owned();
            (tid == pid, e.0, place, e.4)
        })
        .collect();
    seen.sort();
    let span = |main: bool, kind: &str, place: String, holds: u64| {
        (main, format!("{kind} mutex {lock}"), place, holds)
    };
    let mut expected = vec![
        span(false, "hold", at("waiter", "RUN-WAIT"), 1),
        span(false, "wait", at("waiter", "RUN-WAIT"), 1),
        span(true, "holds", at("main", "RUN-BEFORE"), 5),
        span(true, "hold", at("main", "RUN-WAITED"), 1),
        span(true, "holds", at("main", "RUN-AFTER"), 3),
    ];
    expected.sort();
    assert_eq!(seen, expected);
    let left_out = |args: &[&str]| -> Value {
        let file = dir.path().join("filtered.json");
        let mut all = vec!["--format", "perfetto", "--force"];
        all.extend_from_slice(args);
        let e = export(&dir.trace(), &all, &file);
        assert_eq!(e.code(), 0, "{}", e.describe());
        let trace: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        let spans = events_of_phase(&trace, "X").len();
        let summary = &trace["otherData"]["trapline"];
        let mut left = summary["left_out"].clone();
        left["spans"] = spans.into();
        left["filter"] = summary["filter"].clone();
        left
    };
    let all = left_out(&[]);
    assert_eq!(all["spans"], 5, "{all}");
    assert_eq!(all["merged_holds"], 8, "{all}");
    // The lock chosen by its address, or by a place that takes it.
    for chosen in [lock.as_str(), "waiter", "lock_runs.c"] {
        let kept = left_out(&["--lock", chosen]);
        assert_eq!(
            (&kept["spans"], &kept["other_locks"]),
            (&5.into(), &0.into()),
            "{kept}"
        );
    }
    let other = left_out(&["--lock", "no_such_function"]);
    assert_eq!(
        (&other["spans"], &other["other_locks"]),
        (&0.into(), &1.into()),
        "{other}"
    );
    assert_eq!(other["filter"]["lock"], "no_such_function", "{other}");
    // No wait lasted a day: the lock counts as uncontended.
    let day = (86_400u64 * 1_000_000_000).to_string();
    let short = left_out(&["--min-wait", &day]);
    assert_eq!(short["spans"], 0, "{short}");
    assert_eq!(short["short_waits"], 1, "{short}");
    assert_eq!(short["uncontended_holds"], 10, "{short}");
    // A window after the end: the 10 holds and the wait are outside it.
    let late = left_out(&["--from", "86400"]);
    assert_eq!(
        (&late["spans"], &late["outside_window"]),
        (&0.into(), &11.into()),
        "{late}"
    );
    assert_eq!(late["filter"]["from_ns"], 86_400_000_000_000u64, "{late}");

    // Filters belong to the perfetto format, and a window must hold time.
    let pprof_file = dir.path().join("heap.pb.gz");
    let refused = export(
        &dir.trace(),
        &["--format", "pprof", "--from", "1"],
        &pprof_file,
    );
    assert_eq!(refused.code(), 2, "{}", refused.describe());
    assert!(
        refused.stderr.contains("apply only to --format perfetto"),
        "{}",
        refused.describe()
    );
    let empty = export(
        &dir.trace(),
        &["--format", "perfetto", "--from", "2", "--to", "1"],
        &dir.path().join("empty.json"),
    );
    assert_eq!(empty.code(), 2, "{}", empty.describe());
    assert!(!dir.path().join("empty.json").exists());
}
