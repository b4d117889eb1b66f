//! `trapline attach` and `detach` on a process already running:
//! attach_service.c waits in read() for commands on a pipe and answers
//! each when done, so the test knows what ran while attached.

mod common;

use common::*;
use object::{Object, ObjectSection, ObjectSegment};
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

struct Service {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Service {
    fn start(program: &Path) -> Service {
        let mut cmd = Command::new(program);
        cmd.env_remove("LD_PRELOAD");
        Service::start_command(cmd)
    }

    /// The service as `cmd` starts it (`trapline run -- service`).
    fn start_command(mut cmd: Command) -> Service {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the service starts");
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        let mut s = Service {
            child,
            input,
            output,
        };
        assert_eq!(s.line(), "ready");
        s
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.output.read_line(&mut l).unwrap();
        l.trim_end().to_string()
    }

    /// Sends a command and returns its answer (the command has run).
    fn ask(&mut self, command: &str) -> String {
        writeln!(self.input, "{command}").unwrap();
        self.line()
    }

    fn quit(mut self) -> std::process::ExitStatus {
        writeln!(self.input, "quit").unwrap();
        self.child.wait().unwrap()
    }
}

fn trapline_cmd(args: &[&str]) -> Finished {
    let mut cmd = Command::new(trapline());
    cmd.args(args).env("TRAPLINE_AGENT", agent());
    output_of(cmd, "trapline")
}

/// Every word of every module's import slots (`.got` and `.got.plt`) in
/// process `pid`: (module and section, address, value).
fn import_slots(pid: u32) -> Vec<(String, u64, u64)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (Some(path), Some("00000000")) = (f.get(5), f.get(2).copied()) else {
            continue;
        };
        if !path.starts_with('/') || !seen.insert(path.to_string()) {
            continue;
        }
        let start = u64::from_str_radix(f[0].split('-').next().unwrap(), 16).unwrap();
        let Ok(data) = std::fs::read(path) else {
            continue;
        };
        let Ok(elf) = object::File::parse(&*data) else {
            continue;
        };
        let first = elf.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
        for name in [".got", ".got.plt"] {
            if let Some(s) = elf.section_by_name(name) {
                let at = start + s.address() - first;
                let mut bytes = vec![0u8; s.size() as usize];
                mem.read_exact_at(&mut bytes, at).unwrap();
                for (i, w) in bytes.chunks_exact(8).enumerate() {
                    let value = u64::from_le_bytes(w.try_into().unwrap());
                    out.push((format!("{path} {name}"), at + 8 * i as u64, value));
                }
            }
        }
    }
    out
}

/// What the descriptors of process `pid` name.
fn descriptors(pid: u32) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                target.display().to_string(),
            ))
        })
        .collect();
    v.sort();
    v
}

/// How many threads process `pid` has.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count()
}

/// The addresses process `pid` maps the agent library at.
fn agent_range(pid: u32) -> std::ops::Range<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let ranges: Vec<(u64, u64)> = maps
        .lines()
        .filter(|l| l.contains("libtrapline_agent"))
        .map(|l| {
            let (a, b) = l
                .split_whitespace()
                .next()
                .unwrap()
                .split_once('-')
                .unwrap();
            (
                u64::from_str_radix(a, 16).unwrap(),
                u64::from_str_radix(b, 16).unwrap(),
            )
        })
        .collect();
    let start = ranges
        .iter()
        .map(|r| r.0)
        .min()
        .expect("the agent is mapped");
    let end = ranges.iter().map(|r| r.1).max().unwrap();
    start..end
}

#[test]
fn attach_records_a_running_service_and_detach_puts_every_slot_back() {
    let dir = TestDir::new("attach_service");
    let prog = compile_c(&dir, "attach_service.c");
    let mut svc = Service::start(&prog);
    let pid = svc.pid().to_string();
    // Every call the test makes below has been made once: the lazily bound
    // slots are bound before the first look.
    assert_eq!(svc.ask("leak 1"), "leaked 1");
    assert_eq!(svc.ask("lock"), "locked");
    let before = import_slots(svc.pid());
    let fds_before = descriptors(svc.pid());
    let threads_before = threads(svc.pid());

    let trace = dir.trace();
    let trace_arg = trace.to_str().unwrap();
    let a = trapline_cmd(&["attach", &pid, "-o", trace_arg]);
    assert_eq!(a.code(), 0, "{}", a.describe());
    // The slots patched point into the agent: some of the program's own.
    let agent = agent_range(svc.pid());
    let during = import_slots(svc.pid());
    // (The agent's own slots, and those of libraries it brought, are new.)
    let patched: Vec<&(String, u64, u64)> = during
        .iter()
        .filter(|s| agent.contains(&s.2) && before.iter().any(|b| b.1 == s.1))
        .collect();
    assert!(
        patched
            .iter()
            .any(|s| s.0.starts_with(&prog.display().to_string())),
        "the program's own slots were not patched: {patched:?}"
    );

    assert_eq!(svc.ask("early"), "freed");
    assert_eq!(svc.ask("leak 3"), "leaked 3");
    assert_eq!(svc.ask("lock"), "locked");
    assert_eq!(svc.ask("double"), "double");
    let twice = trapline_cmd(&["attach", &pid, "-o", &format!("{trace_arg}.2")]);
    assert_eq!(twice.code(), 1, "{}", twice.describe());
    assert!(
        twice.stderr.contains("is recorded already"),
        "{}",
        twice.stderr
    );

    let d = trapline_cmd(&["detach", &pid]);
    assert_eq!(d.code(), 0, "{}", d.describe());
    assert!(d.stderr.contains("import slots put back"), "{}", d.stderr);
    // Every patched slot holds again what it held before (read through
    // /proc/PID/mem), and none points into the agent any more.
    let after = import_slots(svc.pid());
    for p in &patched {
        let was = before
            .iter()
            .find(|b| b.1 == p.1)
            .expect("a slot of before");
        let now = after.iter().find(|a| a.1 == p.1).expect("a slot of after");
        assert_eq!(now.2, was.2, "{} at {:#x}", p.0, p.1);
    }
    let left: Vec<_> = after
        .iter()
        .filter(|s| agent.contains(&s.2) && before.iter().any(|b| b.1 == s.1))
        .collect();
    assert!(left.is_empty(), "slots still patched: {left:?}");
    // The agent's threads end and its descriptors (trace, socket) close
    // once it has answered.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while (descriptors(svc.pid()) != fds_before || threads(svc.pid()) != threads_before)
        && std::time::Instant::now() < deadline
    {
        std::thread::yield_now();
    }
    assert_eq!(descriptors(svc.pid()), fds_before);
    assert_eq!(threads(svc.pid()), threads_before);
    // The process goes on, untraced.
    assert_eq!(svc.ask("leak 2"), "leaked 2");
    // Once per process: the idle agent stays.
    let again = trapline_cmd(&["attach", &pid, "-o", &format!("{trace_arg}.3")]);
    assert_eq!(again.code(), 1, "{}", again.describe());
    assert!(
        again.stderr.contains("attached to and detached"),
        "{}",
        again.stderr
    );
    assert!(svc.quit().success());

    let leaks = analysis_json("leaks", &trace);
    assert_eq!(leaks["process"]["exit"], json!({"detached": true}));
    assert_eq!(
        leaks["trace"]["attached"]["earlier_releases"],
        json!(5),
        "{}",
        pretty(&leaks["trace"])
    );
    let records = as_array(&leaks, "records");
    assert_eq!(records.len(), 1, "{}", pretty(&leaks));
    assert_eq!(records[0]["bytes"], json!(144));
    assert_eq!(records[0]["blocks"], json!(3));
    let frames = &records[0]["stack"];
    let line = marker_line("attach_service.c", "LEAK-ATTACHED");
    assert!(
        frames
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["function"] == "leak_while_attached" && f["line"] == json!(line)),
        "{}",
        pretty(frames)
    );
    // The double free is one, not an earlier block's release.
    let errors = as_array(&leaks, "errors");
    assert_eq!(errors.len(), 1, "{}", pretty(&leaks));
    assert_eq!(
        errors[0]["kind"],
        json!("double_free"),
        "{}",
        pretty(&errors[0])
    );
    let double = marker_line("attach_service.c", "DOUBLE-FREE");
    assert!(
        errors[0]["stack"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["line"] == json!(double)),
        "{}",
        pretty(&errors[0])
    );
    let text = trapline_cmd(&["leaks", trace_arg]);
    assert!(
        text.stdout
            .contains("NOTE: the trace began when trapline attached to the running process"),
        "{}",
        text.stdout
    );
    // The page says so too, with what it lists as in use.
    let page = dir.path().join("attached.html");
    let r = trapline_cmd(&["report", trace_arg, "-o", page.to_str().unwrap()]);
    assert_eq!(r.code(), 0, "{}", r.describe());
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("<div>in use at detach</div>"),
        "the detach card"
    );
    assert!(
        html.contains("<ul class=\"warnings\"><li>NOTE: the trace began when trapline attached"),
        "the attach note"
    );
    let locks = analysis_json("locks", &trace);
    assert_eq!(
        locks["totals"]["acquisitions"],
        json!(10),
        "{}",
        pretty(&locks)
    );
}

#[test]
fn attach_and_detach_refuse_what_they_cannot_do() {
    let dir = TestDir::new("attach_refusals");
    // No such process.
    let gone = trapline_cmd(&["attach", "999999999"]);
    assert_eq!(gone.code(), 1, "{}", gone.describe());
    assert_eq!(gone.stderr, "trapline attach: no process 999999999\n");
    // A process never attached to.
    let prog = compile_c(&dir, "attach_service.c");
    let svc = Service::start(&prog);
    let pid = svc.pid().to_string();
    let d = trapline_cmd(&["detach", &pid]);
    assert_eq!(d.code(), 1, "{}", d.describe());
    assert!(
        d.stderr
            .contains(&format!("trapline detach: process {pid}: not attached to")),
        "{}",
        d.stderr
    );
    // Another user's process (the test runs as root: nobody asks, with a
    // copy of the binary where nobody may run it).
    let bin = dir.path().join("nobody");
    std::fs::create_dir_all(&bin).unwrap();
    let lone = bin.join("trapline");
    if std::fs::hard_link(trapline(), &lone).is_err() {
        std::fs::copy(trapline(), &lone).unwrap();
    }
    let mut as_nobody = Command::new("setpriv");
    as_nobody
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&lone)
        .args(["attach", &pid, "-o", "/nonexistent/x.trace"]);
    let other = output_of(as_nobody, "trapline attach as nobody");
    assert_eq!(other.code(), 1, "{}", other.describe());
    assert_eq!(
        other.stderr,
        format!(
            "trapline attach: process {pid} belongs to user {}: attach as that user or as root\n",
            nix::unistd::geteuid()
        )
    );
    // An existing trace is kept.
    let kept = dir.path().join("kept.trace");
    std::fs::write(&kept, b"mine").unwrap();
    let a = trapline_cmd(&["attach", &pid, "-o", kept.to_str().unwrap()]);
    assert_eq!(a.code(), 1, "{}", a.describe());
    assert!(
        a.stderr.contains("exists; --force replaces it"),
        "{}",
        a.stderr
    );
    assert_eq!(std::fs::read(&kept).unwrap(), b"mine");
    assert!(svc.quit().success());

    // A static program has no dlopen to load the agent with.
    let stat = compile_c_with(
        &dir,
        "attach_service.c",
        "static_service",
        &["-static", "-pthread"],
    );
    let svc = Service::start(&stat);
    let a = trapline_cmd(&["attach", &svc.pid().to_string()]);
    assert_eq!(a.code(), 1, "{}", a.describe());
    assert!(a.stderr.contains("has no C library loaded"), "{}", a.stderr);
    assert!(svc.quit().success());

    // A kernel thread runs no program (was: "a static program"). One is
    // visible unless the test runs in a PID namespace of its own.
    let kthread = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')?
                        .1
                        .split_whitespace()
                        .nth(6)?
                        .parse::<u64>()
                        .ok()
                })
                .is_some_and(|flags| flags & 0x0020_0000 != 0)
        });
    if let Some(k) = kthread {
        let a = trapline_cmd(&["attach", &k.to_string()]);
        assert_eq!(a.code(), 1, "{}", a.describe());
        assert_eq!(
            a.stderr,
            format!("trapline attach: process {k} is a kernel thread: it runs no program to attach to\n")
        );
    }
}

/// The process ends while attached: the trace ends with its exit. Built
/// without PIE, the service exports `free` as its PLT stub (it takes
/// free's address): the agent must find the C library's `free` behind it,
/// or the program's own calls of free would not be trapped.
#[test]
fn a_process_that_exits_while_attached_completes_its_trace() {
    let dir = TestDir::new("attach_exit");
    let prog = compile_c_with(
        &dir,
        "attach_service.c",
        "attach_service_no_pie",
        &["-no-pie", "-fno-pie", "-pthread"],
    );
    let mut svc = Service::start(&prog);
    let pid = svc.pid().to_string();
    let trace = dir.trace();
    let a = trapline_cmd(&["attach", &pid, "-o", trace.to_str().unwrap()]);
    assert_eq!(a.code(), 0, "{}", a.describe());
    assert_eq!(svc.ask("early"), "freed");
    assert_eq!(svc.ask("leak 4"), "leaked 4");
    assert!(svc.quit().success());
    let leaks = analysis_json("leaks", &trace);
    assert_eq!(leaks["process"]["exit"], json!({"code": 0}));
    assert_eq!(leaks["trace"]["complete"], json!(true));
    let records = as_array(&leaks, "records");
    assert_eq!(records.len(), 1, "{}", pretty(&leaks));
    assert_eq!(records[0]["bytes"], json!(4 * 48));
    // The 5 frees through free's address reached the agent.
    assert_eq!(
        leaks["trace"]["attached"]["earlier_releases"],
        json!(5),
        "{}",
        pretty(&leaks["trace"])
    );
}

/// `--duration`: a detach after it, or the process's end before it.
#[test]
fn attach_for_a_duration() {
    let dir = TestDir::new("attach_duration");
    let prog = compile_c(&dir, "attach_service.c");
    let svc = Service::start(&prog);
    let pid = svc.pid().to_string();
    let short = dir.path().join("short.trace");
    let a = trapline_cmd(&[
        "attach",
        &pid,
        "--duration",
        "0.5",
        "-o",
        short.to_str().unwrap(),
    ]);
    assert_eq!(a.code(), 0, "{}", a.describe());
    assert!(
        a.stderr
            .contains(&format!("detached from process {pid} after 0.5 s")),
        "{}",
        a.stderr
    );
    assert!(svc.quit().success());
    // Without the lock recorder, `locks` names the command that chose (a
    // process is attached to once: another one).
    let svc = Service::start(&prog);
    let memory_only = dir.path().join("memory_only.trace");
    let a = trapline_cmd(&[
        "attach",
        &svc.pid().to_string(),
        "--duration",
        "0.2",
        "--record",
        "mem",
        "-o",
        memory_only.to_str().unwrap(),
    ]);
    assert_eq!(a.code(), 0, "{}", a.describe());
    let locks = trapline_cmd(&["locks", memory_only.to_str().unwrap()]);
    assert!(
        locks
            .stdout
            .contains("Locks were not recorded (trapline attach --record without locks)."),
        "{}",
        locks.describe()
    );
    assert!(svc.quit().success());
    let leaks = analysis_json("leaks", &short);
    assert_eq!(leaks["process"]["exit"], json!({"detached": true}));

    // The process ends first: the attach returns when it does.
    let mut svc = Service::start(&prog);
    let pid = svc.pid().to_string();
    let long = dir.path().join("long.trace");
    let mut attach = Command::new(trapline())
        .args(["attach", &pid, "--duration", "600", "-o"])
        .arg(&long)
        .env("TRAPLINE_AGENT", agent())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(attach.stderr.take().unwrap());
    let mut first = String::new();
    stderr.read_line(&mut first).unwrap();
    assert!(first.contains("recording process"), "{first}");
    assert_eq!(svc.ask("leak 2"), "leaked 2");
    assert!(svc.quit().success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert!(attach.wait().unwrap().success(), "{rest}");
    assert!(rest.contains("ended while attached"), "{rest}");
    let leaks = analysis_json("leaks", &long);
    assert_eq!(leaks["process"]["exit"], json!({"code": 0}));
    assert_eq!(as_array(&leaks, "records")[0]["bytes"], json!(96));
}

/// attach_service.c under `trapline run --control` into `run_trace`, and
/// the service's pid (trapline run's child).
fn service_under_run(dir: &TestDir, run_trace: &Path) -> (Service, String) {
    service_under_run_as(dir, run_trace, &[])
}

/// The same, started through `wrapper` (a shell that execs the service).
fn service_under_run_as(dir: &TestDir, run_trace: &Path, wrapper: &[&str]) -> (Service, String) {
    let prog = compile_c(dir, "attach_service.c");
    let mut cmd = Command::new(trapline());
    cmd.args(["run", "--control", "-q", "-o"])
        .arg(run_trace)
        .arg("--")
        .args(wrapper)
        .arg(&prog)
        .env("TRAPLINE_AGENT", agent());
    let svc = Service::start_command(cmd);
    let runner = svc.pid();
    let children = std::fs::read_to_string(format!("/proc/{runner}/task/{runner}/children"))
        .expect("trapline run's children");
    let pid = children
        .split_whitespace()
        .next()
        .expect("the service")
        .to_string();
    (svc, pid)
}

/// A process `trapline run --control` records already is attached to
/// through its control channel: no second agent; detach cuts the window
/// out of the run's trace, with the attach's semantics (earlier blocks'
/// releases counted, the blocks born in it live at detach), and the run
/// goes on recording.
#[test]
fn attach_to_a_process_trapline_run_records_cuts_its_window() {
    let dir = TestDir::new("attach_run");
    let run_trace = dir.path().join("run.trace");
    let (mut svc, pid) = service_under_run(&dir, &run_trace);
    assert_eq!(svc.ask("leak 1"), "leaked 1");

    let window = dir.path().join("window.trace");
    let window_arg = window.to_str().unwrap();
    let a = trapline_cmd(&["attach", &pid, "-o", window_arg]);
    assert_eq!(a.code(), 0, "{}", a.describe());
    assert!(
        a.stderr.contains("is recorded by `trapline run` into"),
        "{}",
        a.stderr
    );
    assert_eq!(svc.ask("early"), "freed");
    assert_eq!(svc.ask("leak 3"), "leaked 3");
    assert_eq!(svc.ask("lock"), "locked");
    assert_eq!(svc.ask("double"), "double");
    let twice = trapline_cmd(&["attach", &pid, "-o", &format!("{window_arg}.2")]);
    assert_eq!(twice.code(), 1, "{}", twice.describe());
    assert!(
        twice.stderr.contains("is attached to already"),
        "{}",
        twice.stderr
    );
    let d = trapline_cmd(&["detach", &pid]);
    assert_eq!(d.code(), 0, "{}", d.describe());
    assert!(
        d.stderr.contains("5 releases of earlier blocks"),
        "{}",
        d.stderr
    );
    // The run goes on recording.
    assert_eq!(svc.ask("leak 2"), "leaked 2");
    let again = trapline_cmd(&["detach", &pid]);
    assert_eq!(again.code(), 1, "{}", again.describe());
    assert!(svc.quit().success());

    let leaks = analysis_json("leaks", &window);
    assert_eq!(leaks["process"]["exit"], json!({"detached": true}));
    assert_eq!(leaks["trace"]["attached"]["earlier_releases"], json!(5));
    let records = as_array(&leaks, "records");
    assert_eq!(records.len(), 1, "{}", pretty(&leaks));
    assert_eq!(
        (records[0]["bytes"].clone(), records[0]["blocks"].clone()),
        (json!(144), json!(3))
    );
    let line = marker_line("attach_service.c", "LEAK-ATTACHED");
    assert!(
        as_array(&records[0], "stack")
            .iter()
            .any(|f| f["function"] == "leak_while_attached" && f["line"] == json!(line)),
        "{}",
        pretty(&records[0])
    );
    let errors = as_array(&leaks, "errors");
    assert_eq!(errors.len(), 1, "{}", pretty(&leaks));
    assert_eq!(errors[0]["kind"], json!("double_free"));
    let locks = analysis_json("locks", &window);
    assert_eq!(
        locks["totals"]["acquisitions"],
        json!(10),
        "{}",
        pretty(&locks)
    );
    // The run's own trace has everything: 1 + 3 + 2 blocks leaked.
    let run = analysis_json("leaks", &run_trace);
    let held: u64 = as_array(&run, "records")
        .iter()
        .filter(|r| {
            as_array(r, "stack")
                .iter()
                .any(|f| f["function"] == "leak_while_attached")
        })
        .map(|r| r["blocks"].as_u64().unwrap())
        .sum();
    assert_eq!(held, 6, "{}", pretty(&run));
}

/// The README's attach to a `run --control` process, when the command is
/// a wrapper that execs the service (pyenv's `python3` shim): the exec'd
/// image served no socket, attach answered "recorded already" and detach
/// "not attached to". Every image of a `--control` run serves one now, and
/// the window comes from the image's own trace.
#[test]
fn attach_to_a_service_a_wrapper_execd_under_run_cuts_its_window() {
    let dir = TestDir::new("attach_run_wrapped");
    let run_trace = dir.path().join("run.trace");
    let (mut svc, pid) = service_under_run_as(&dir, &run_trace, &["/bin/sh", "-c", "exec \"$0\""]);
    let window = dir.path().join("window.trace");
    let a = trapline_cmd(&["attach", &pid, "-o", window.to_str().unwrap()]);
    assert_eq!(a.code(), 0, "{}", a.describe());
    assert_eq!(svc.ask("leak 3"), "leaked 3");
    let d = trapline_cmd(&["detach", &pid]);
    assert_eq!(d.code(), 0, "{}", d.describe());
    assert!(svc.quit().success());
    let leaks = analysis_json("leaks", &window);
    let records = as_array(&leaks, "records");
    assert_eq!(records.len(), 1, "{}", pretty(&leaks));
    assert_eq!(
        (records[0]["bytes"].clone(), records[0]["blocks"].clone()),
        (json!(144), json!(3))
    );
}

/// A window attach whose process ends before the detach: the window runs
/// to the process's end and ends with its exit, its exit scan kept for the
/// blocks born in the window.
#[test]
fn a_window_attach_ends_with_the_process_that_ends_in_it() {
    let dir = TestDir::new("attach_run_exit");
    let run_trace = dir.path().join("run.trace");
    let (mut svc, pid) = service_under_run(&dir, &run_trace);
    let window = dir.path().join("window.trace");
    let a = trapline_cmd(&["attach", &pid, "-o", window.to_str().unwrap()]);
    assert_eq!(a.code(), 0, "{}", a.describe());
    assert_eq!(svc.ask("leak 2"), "leaked 2");
    assert!(svc.quit().success());
    let d = trapline_cmd(&["detach", &pid]);
    assert_eq!(d.code(), 0, "{}", d.describe());
    assert!(
        d.stderr.contains("the process ended inside it"),
        "{}",
        d.stderr
    );
    let leaks = analysis_json("leaks", &window);
    assert_eq!(
        leaks["process"]["exit"],
        json!({"code": 0}),
        "{}",
        pretty(&leaks)
    );
    let records = as_array(&leaks, "records");
    assert_eq!(records.len(), 1, "{}", pretty(&leaks));
    assert_eq!(records[0]["kind"], json!("definitely_lost"));
    assert_eq!(records[0]["bytes"], json!(96));
    assert_eq!(leaks["summary"]["definitely_lost"]["blocks"], json!(2));
}

/// attach_service.c built without PIE takes `free`'s address, so the
/// dynamic loader's `free` goes through the executable's PLT, which attach
/// patches; its allocations do not. Threads whose DTV the loader carves from
/// a block the program just freed, and frees at the join, are no double
/// frees: the attached trace reports no error, as `trapline run` does not.
#[test]
fn the_loaders_releases_while_attached_are_no_errors() {
    let dir = TestDir::new("attach_loader_frees");
    let prog = compile_c_with(
        &dir,
        "attach_service.c",
        "attach_service_nopie",
        &["-pthread", "-fno-pie", "-no-pie"],
    );
    let mut svc = Service::start(&prog);
    let pid = svc.pid().to_string();
    assert_eq!(svc.ask("threads 2"), "threads 2");
    let trace = dir.trace();
    let a = trapline_cmd(&["attach", &pid, "-o", trace.to_str().unwrap()]);
    assert_eq!(a.code(), 0, "{}", a.describe());
    assert_eq!(svc.ask("threads 20"), "threads 20");
    let d = trapline_cmd(&["detach", &pid]);
    assert_eq!(d.code(), 0, "{}", d.describe());
    assert!(svc.quit().success());

    let leaks = analysis_json("leaks", &trace);
    assert_eq!(
        as_array(&leaks, "errors"),
        &[] as &[serde_json::Value],
        "{}",
        pretty(&leaks)
    );
    // The DTVs' releases were seen, and passed on as the loader's own.
    let earlier = leaks["trace"]["attached"]["earlier_releases"]
        .as_u64()
        .unwrap();
    assert!(earlier >= 20, "{}", pretty(&leaks["trace"]));
}

/// Root attached to a process of another user's (an nginx worker running
/// as nobody): the agent, running as that user, could not make its socket
/// in root's directory, which the CLI named for it; the attach said
/// "recording" and nothing could end it (`detach` and `watch` looked in the
/// caller's directory alone). And an attach whose trace the process could
/// not write failed, and left every later attach refused. Now the agent
/// makes its socket in its own user's directory and fails the attach if it
/// cannot; `detach` and `watch` find the socket the process listens on
/// wherever it is; a directory the process may not write in is refused
/// before anything is injected, and a trace the agent cannot open leaves
/// it idle, for the next attach to take up.
#[test]
fn root_attaches_to_another_users_process_and_ends_it() {
    let dir = TestDir::new("attach_other_user");
    let prog = compile_c(&dir, "attach_service.c");
    let open = dir.path().join("open");
    std::fs::create_dir_all(&open).unwrap();
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&prog)
        .env_remove("LD_PRELOAD");
    let mut svc = Service::start_command(cmd);
    let pid = svc.pid().to_string();

    let closed = dir.path().join("closed.trace");
    let a = trapline_cmd(&["attach", &pid, "-o", closed.to_str().unwrap()]);
    assert_eq!(a.code(), 1, "{}", a.describe());
    assert_eq!(
        a.stderr,
        format!(
            "trapline attach: {}: process {pid} (user 65534) cannot make its trace there; -o \
             names a directory that user may write (nothing was changed)\n",
            closed.display()
        )
    );
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        !maps.contains("libtrapline_agent"),
        "the agent was injected"
    );

    let roots = open.join("roots.trace");
    std::fs::write(&roots, b"root's").unwrap();
    let a = trapline_cmd(&["attach", &pid, "-o", roots.to_str().unwrap(), "--force"]);
    assert_eq!(a.code(), 1, "{}", a.describe());
    assert!(
        a.stderr.contains(&format!(
            "the agent could not start: cannot write trace {}: Permission denied",
            roots.display()
        )),
        "{}",
        a.stderr
    );
    assert_eq!(std::fs::read(&roots).unwrap(), b"root's");
    assert_eq!(svc.ask("leak 2"), "leaked 2");

    // Root's agent where nobody may not read it (a clone in a 0700
    // directory): the process is given a copy it can open.
    let private = dir.path().join("private");
    std::fs::create_dir_all(&private).unwrap();
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let private_agent = private.join("libtrapline_agent.so");
    std::fs::copy(agent(), &private_agent).unwrap();
    let trace = open.join("nobody.trace");
    let mut cmd = Command::new(trapline());
    cmd.args(["attach", &pid, "-o", trace.to_str().unwrap()])
        .env("TRAPLINE_AGENT", &private_agent);
    let a = output_of(cmd, "trapline attach");
    assert_eq!(a.code(), 0, "{}", a.describe());
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        maps.contains("/tmp/trapline-agents-0/libtrapline_agent-"),
        "the copy is not mapped"
    );
    let socket = format!("/tmp/trapline-65534/{pid}.sock");
    assert!(Path::new(&socket).exists(), "no {socket}");
    assert_eq!(svc.ask("leak 3"), "leaked 3");
    let w = trapline_cmd(&["watch", &pid, "--count", "1", "--format", "jsonl"]);
    assert_eq!(w.code(), 0, "{}", w.describe());
    let look: serde_json::Value = serde_json::from_str(w.stdout.trim()).expect("a look");
    assert_eq!(look["pid"], json!(svc.pid()));
    let d = trapline_cmd(&["detach", &pid]);
    assert_eq!(d.code(), 0, "{}", d.describe());
    assert!(d
        .stderr
        .starts_with(&format!("trapline detach: detached from process {pid} (")));
    assert!(!Path::new(&socket).exists(), "{socket} stayed");
    assert!(svc.quit().success());
    let report = leaks(&trace);
    assert_complete(&report);
    let leaked: u64 = records(&report)
        .iter()
        .filter(|r| {
            as_array(r, "stack")
                .iter()
                .any(|f| as_str(f, "function") == "leak_while_attached")
        })
        .map(|r| as_u64(r, "blocks"))
        .sum();
    assert_eq!(leaked, 3);
}
