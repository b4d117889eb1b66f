//! Shared helpers of the end-to-end tests: build the agent, compile fixture
//! programs, record them with `trapline run`, and read the JSON reports.
//!
//! Every test works in its own directory (tests run in parallel). A directory
//! is removed when its test passes and kept (its path printed) when it fails,
//! so a failing trace can be inspected; set `TRAPLINE_KEEP_TEST_DIRS=1` to
//! keep them all.

#![allow(dead_code)]

pub mod vm;

use serde_json::Value;
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, OnceLock};
use std::time::Duration;

/// The `trapline` binary under test.
pub fn trapline() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_trapline"))
}

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// tests/fixtures/ of the workspace.
pub fn fixtures_dir() -> PathBuf {
    workspace_root().join("tests/fixtures")
}

/// The path of a fixture source file.
pub fn fixture(name: &str) -> PathBuf {
    let path = fixtures_dir().join(name);
    assert!(path.is_file(), "fixture {} does not exist", path.display());
    path
}

/// A run of a traced program is never expected to take long; past this the
/// helpers kill it (and everything it started) so that a hang fails the test
/// instead of blocking the whole suite. This is a safety net, not a timing
/// assertion.
const HANG_GUARD: Duration = Duration::from_secs(600);

// ---------------------------------------------------------------------------
// The agent.

/// Builds `libtrapline_agent.so` once per test binary, with the profile the
/// tests were built with, and returns its path.
pub fn agent() -> &'static Path {
    static AGENT: OnceLock<PathBuf> = OnceLock::new();
    AGENT.get_or_init(|| build_agent(None))
}

/// Builds the agent with a checking feature (e.g. `cache-audit`), into a
/// target directory of its own (`<target>/feature-<name>`) so that the
/// agent the other tests load is never replaced under them.
#[allow(dead_code)] // not every test binary uses it
pub fn agent_with_feature(feature: &str) -> PathBuf {
    build_agent(Some(feature))
}

fn build_agent(feature: Option<&str>) -> PathBuf {
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|dir| {
            if dir.is_relative() {
                workspace_root().join(dir)
            } else {
                dir
            }
        })
        .unwrap_or_else(|| workspace_root().join("target"));
    let target_dir = match feature {
        Some(name) => target_dir.join(format!("feature-{name}")),
        None => target_dir,
    };
    // The trapline binary lives in <target>/<profile dir>/; build the agent
    // into the same place with the same profile.
    let exe = trapline();
    let profile_dir = exe
        .parent()
        .and_then(Path::file_name)
        .and_then(OsStr::to_str)
        .expect("trapline binary in a profile directory")
        .to_owned();
    let profile = match profile_dir.as_str() {
        "debug" => "dev".to_owned(),
        other => other.to_owned(),
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let output = Command::new(&cargo)
        .current_dir(workspace_root())
        .args([
            "build",
            "-p",
            "trapline-agent",
            "--profile",
            &profile,
            "--target-dir",
        ])
        .arg(&target_dir)
        .args(
            feature
                .map(|name| ["--features", name])
                .into_iter()
                .flatten(),
        )
        .stdin(Stdio::null())
        .output()
        .expect("run cargo build -p trapline-agent");
    assert!(
        output.status.success(),
        "cargo build -p trapline-agent --profile {profile} (feature {feature:?}) failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let mut candidates = vec![target_dir.join(&profile_dir).join("libtrapline_agent.so")];
    if let Some(dir) = exe.parent().filter(|_| feature.is_none()) {
        candidates.push(dir.join("libtrapline_agent.so"));
    }
    candidates
        .iter()
        .find(|path| path.is_file())
        .cloned()
        .unwrap_or_else(|| panic!("the agent was built but is not at any of {candidates:?}"))
}

// ---------------------------------------------------------------------------
// Per-test directories.

/// A directory of its own for one test.
pub struct TestDir {
    path: PathBuf,
}

impl TestDir {
    pub fn new(test_name: &str) -> TestDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir()
            .join("trapline-tests")
            .join(format!("{test_name}-{}-{n}", std::process::id()));
        if path.exists() {
            std::fs::remove_dir_all(&path).expect("remove a stale test directory");
        }
        std::fs::create_dir_all(path.join("bin")).expect("create the test directory");
        TestDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `t.trace` in this directory: the trace of the top process.
    pub fn trace(&self) -> PathBuf {
        self.path.join("t.trace")
    }

    /// The traces of the last run's other processes (`t.trace.<pid>...`; an
    /// earlier run's, moved aside to `t.trace.old*`, and the index files
    /// analyses leave beside traces are not among them).
    pub fn other_traces(&self) -> Vec<PathBuf> {
        let mut traces = self.files_starting_with("t.trace.");
        traces.retain(|t| {
            !t.file_name().and_then(OsStr::to_str).is_some_and(|n| {
                n.starts_with("t.trace.old") || n.ends_with(".idx") || n.ends_with(".tmp")
            })
        });
        traces
    }

    pub fn files_starting_with(&self, prefix: &str) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.path)
            .expect("list the test directory")
            .map(|entry| entry.expect("directory entry").path())
            .filter(|path| {
                path.file_name()
                    .and_then(OsStr::to_str)
                    .is_some_and(|name| name.starts_with(prefix))
            })
            .collect();
        files.sort();
        files
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("TRAPLINE_KEEP_TEST_DIRS").is_some() {
            eprintln!("test directory kept: {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

// ---------------------------------------------------------------------------
// Compiling fixtures.

pub fn compile(
    dir: &TestDir,
    compiler: &str,
    source: &str,
    out_name: &str,
    flags: &[&str],
) -> PathBuf {
    let src = fixture(source);
    let out = dir.path().join("bin").join(out_name);
    let output = Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
    assert!(
        output.status.success(),
        "{compiler} {flags:?} {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

fn stem(source: &str) -> &str {
    source.rsplit_once('.').map_or(source, |(stem, _)| stem)
}

/// Compiles a C fixture with `gcc -g -O0 -pthread`; the binary is named after
/// the source file without its extension.
pub fn compile_c(dir: &TestDir, source: &str) -> PathBuf {
    compile(
        dir,
        "gcc",
        source,
        stem(source),
        &["-g", "-O0", "-Wall", "-pthread"],
    )
}

/// Compiles a C fixture with extra flags (e.g. `-static`) into `out_name`.
pub fn compile_c_with(dir: &TestDir, source: &str, out_name: &str, extra: &[&str]) -> PathBuf {
    let mut flags = vec!["-g", "-O0", "-Wall"];
    flags.extend_from_slice(extra);
    compile(dir, "gcc", source, out_name, &flags)
}

/// Compiles a C fixture into the shared library `out_name` (`-fPIC -shared -pthread`).
pub fn compile_c_library(dir: &TestDir, source: &str, out_name: &str) -> PathBuf {
    compile_c_with(dir, source, out_name, &["-fPIC", "-shared", "-pthread"])
}

/// Compiles a C program fixture linked to the shared library `lib` (kept
/// even if the program calls none of its functions, found through an
/// rpath), with `-pthread`; named after the source.
pub fn compile_c_linked_to(dir: &TestDir, source: &str, lib: &Path) -> PathBuf {
    let lib_dir = lib
        .parent()
        .expect("library directory")
        .display()
        .to_string();
    compile_c_with(
        dir,
        source,
        stem(source),
        &[
            "-pthread",
            "-Wl,--no-as-needed",
            &lib.display().to_string(),
            &format!("-Wl,-rpath,{lib_dir}"),
        ],
    )
}

/// Compiles a C++ fixture with `g++ -g -O0`.
pub fn compile_cpp(dir: &TestDir, source: &str) -> PathBuf {
    compile(dir, "g++", source, stem(source), &["-g", "-O0", "-Wall"])
}

/// Compiles a C++ fixture into the shared library `out_name` with `g++
/// -fPIC -shared` and `extra` flags.
pub fn compile_cpp_library(dir: &TestDir, source: &str, out_name: &str, extra: &[&str]) -> PathBuf {
    let mut flags = vec!["-g", "-Wall", "-fPIC", "-shared"];
    flags.extend_from_slice(extra);
    compile(dir, "g++", source, out_name, &flags)
}

/// Compiles a C++ program fixture with `g++ -g -O0` linked to the shared
/// library `lib` (found through an rpath); named after the source.
pub fn compile_cpp_linked_to(dir: &TestDir, source: &str, lib: &Path) -> PathBuf {
    let lib_dir = lib
        .parent()
        .expect("library directory")
        .display()
        .to_string();
    compile(
        dir,
        "g++",
        source,
        stem(source),
        &[
            "-g",
            "-O0",
            "-Wall",
            "-Wno-mismatched-new-delete",
            "-Wl,--no-as-needed",
            &lib.display().to_string(),
            &format!("-Wl,-rpath,{lib_dir}"),
        ],
    )
}

/// Compiles a Rust fixture with `rustc -g -C opt-level=0`.
pub fn compile_rust(dir: &TestDir, source: &str) -> PathBuf {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    compile(
        dir,
        &rustc,
        source,
        stem(source),
        &["-g", "-C", "opt-level=0", "--edition", "2021"],
    )
}

/// The line number (1-based) of the only line of a fixture that carries the
/// marker comment `/* MARKER */` or ends with `// MARKER`.
pub fn marker_line(source: &str, marker: &str) -> u64 {
    let text = std::fs::read_to_string(fixture(source)).expect("read the fixture");
    let block = format!("/* {marker} */");
    let line_comment = format!("// {marker}");
    let lines: Vec<u64> = text
        .lines()
        .enumerate()
        .filter(|(_, line)| line.contains(&block) || line.trim_end().ends_with(&line_comment))
        .map(|(i, _)| i as u64 + 1)
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "marker {marker} must be on exactly one line of {source}: {lines:?}"
    );
    lines[0]
}

// ---------------------------------------------------------------------------
// Running commands.

/// The result of a finished command.
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// The exit code; panics if the command itself was killed by a signal.
    pub fn code(&self) -> i32 {
        match self.status.code() {
            Some(code) => code,
            None => panic!(
                "the command was killed by signal {:?}\nstdout:\n{}\nstderr:\n{}",
                self.status.signal(),
                self.stdout,
                self.stderr
            ),
        }
    }

    /// For assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "status {}\nstdout:\n{}\nstderr:\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Puts the command in a process group of its own, so that the hang guard can
/// end it together with everything it started.
pub fn isolated(mut cmd: Command) -> Command {
    cmd.process_group(0);
    cmd
}

/// Waits for a child started with [`isolated`], collecting its output; kills
/// its whole process group if it runs past [`HANG_GUARD`].
pub fn finish(mut child: Child, what: &str) -> Finished {
    let pgid = child.id() as libc::pid_t;
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let guard = std::thread::spawn(move || match done_rx.recv_timeout(HANG_GUARD) {
        Err(mpsc::RecvTimeoutError::Timeout) => {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
            true
        }
        _ => false,
    });
    let mut stdout_pipe = child.stdout.take();
    let stdout_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(pipe) = stdout_pipe.as_mut() {
            let _ = pipe.read_to_end(&mut buf);
        }
        buf
    });
    let mut stderr = Vec::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_end(&mut stderr);
    }
    let status = child.wait().expect("wait for the command");
    let stdout = stdout_reader.join().expect("stdout reader");
    let _ = done_tx.send(());
    let hung = guard.join().expect("hang guard");
    let finished = Finished {
        status,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    };
    assert!(
        !hung,
        "{what} did not finish within {HANG_GUARD:?} and was killed (hang?)\n{}",
        finished.describe()
    );
    finished
}

/// Runs a command to its end with the hang guard.
pub fn output_of(cmd: Command, what: &str) -> Finished {
    let mut cmd = isolated(cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    finish(child, what)
}

/// `trapline run [FLAGS] -o DIR/t.trace -- PROGRAM ARGS` as a Command, with
/// the agent in TRAPLINE_AGENT.
pub fn run_command(dir: &TestDir, flags: &[&str], program: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(trapline());
    cmd.arg("run")
        .args(flags)
        .arg("-o")
        .arg(dir.trace())
        .arg("--")
        .arg(program)
        .args(args)
        .current_dir(dir.path())
        .env("TRAPLINE_AGENT", agent());
    cmd
}

/// Reads one line of a running child's stdout, byte by byte so that nothing
/// after it is consumed (the child keeps its pipe).
pub fn read_stdout_line(child: &mut Child) -> String {
    let mut stdout = child.stdout.take().expect("the child's stdout is piped");
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.last() != Some(&b'\n') {
        match stdout.read(&mut byte) {
            Ok(1) => line.push(byte[0]),
            _ => break,
        }
    }
    child.stdout = Some(stdout);
    String::from_utf8_lossy(&line).into_owned()
}

/// Starts `cmd` with its standard streams piped and reads the first line
/// its program prints, `PREFIX` and a pid: the child and the pid.
pub fn start_printing(mut cmd: Command, prefix: &str) -> (Child, String) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start trapline run");
    let first = read_stdout_line(&mut child);
    let pid = first
        .trim()
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("the program printed no {prefix:?} first: {first:?}"));
    let pid = pid.to_owned();
    (child, pid)
}

/// The `NAME=0xADDRESS` lines a fixture printed, by name.
pub fn printed_addresses(stdout: &str) -> std::collections::HashMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(_, v)| v.starts_with("0x"))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Records PROGRAM ARGS into DIR/t.trace and returns how `trapline run` ended.
pub fn run(dir: &TestDir, flags: &[&str], program: &Path, args: &[&str]) -> Finished {
    run_of(run_command(dir, flags, program, args))
}

/// Runs a `run_command` the caller changed (its environment, say) to its
/// end: `run` of that command.
pub fn run_of(cmd: Command) -> Finished {
    let finished = output_of(cmd, "trapline run");
    assert!(
        !finished.stderr.contains("panicked"),
        "trapline run panicked\n{}",
        finished.describe()
    );
    finished
}

/// Records PROGRAM ARGS, which must exit 0 printing exactly `stdout` with no
/// event lost, and returns the `leaks` report of its trace, asserted whole.
pub fn record_whole(
    dir: &TestDir,
    flags: &[&str],
    program: &Path,
    args: &[&str],
    stdout: &str,
) -> Value {
    record_whole_of(dir, run_command(dir, flags, program, args), stdout)
}

/// `record_whole` of a `run_command` the caller changed.
pub fn record_whole_of(dir: &TestDir, cmd: Command, stdout: &str) -> Value {
    let run = run_of(cmd);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout, stdout, "{}", run.describe());
    assert_no_events_lost_in_summary(&run);
    let report = leaks(&dir.trace());
    assert_complete(&report);
    report
}

/// Asserts that the summary `trapline run` printed on stderr reports no lost
/// events: at least one "events lost: N", and every N is 0.
pub fn assert_no_events_lost_in_summary(finished: &Finished) {
    let counts: Vec<&str> = finished
        .stderr
        .match_indices("events lost: ")
        .map(|(i, m)| {
            let rest = &finished.stderr[i + m.len()..];
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect();
    assert!(
        !counts.is_empty(),
        "no \"events lost: \" in the run summary\n{}",
        finished.describe()
    );
    assert!(
        counts.iter().all(|n| *n == "0"),
        "events were lost: {counts:?}\n{}",
        finished.describe()
    );
}

/// Asserts that the run summary names a trace file.
pub fn assert_summary_names(finished: &Finished, trace: &Path) {
    let name = trace
        .file_name()
        .and_then(OsStr::to_str)
        .expect("trace file name");
    assert!(
        finished.stderr.contains(name),
        "the run summary does not name the trace {name}\n{}",
        finished.describe()
    );
}

/// `trapline SUBCOMMAND TRACE --format json`, however it ends.
pub fn analysis(subcommand: &str, trace: &Path) -> Finished {
    let mut cmd = Command::new(trapline());
    cmd.arg(subcommand).arg(trace).args(["--format", "json"]);
    let finished = output_of(cmd, &format!("trapline {subcommand}"));
    assert!(
        !finished.stderr.contains("panicked"),
        "trapline {subcommand} {} panicked\n{}",
        trace.display(),
        finished.describe()
    );
    finished
}

pub fn analysis_json(subcommand: &str, trace: &Path) -> Value {
    let finished = analysis(subcommand, trace);
    assert_eq!(
        finished.code(),
        0,
        "trapline {subcommand} {} failed\n{}",
        trace.display(),
        finished.describe()
    );
    serde_json::from_str(&finished.stdout).unwrap_or_else(|e| {
        panic!(
            "trapline {subcommand} did not print JSON ({e})\n{}",
            finished.describe()
        )
    })
}

/// The parsed `trapline leaks TRACE --format json --kinds all` (which must
/// succeed): every live block is in a record, whatever the scan judged.
pub fn leaks(trace: &Path) -> Value {
    leaks_with(trace, &["--kinds", "all"])
}

/// The text of `trapline leaks TRACE EXTRA...` (which must succeed).
pub fn leaks_text(trace: &Path, extra: &[&str]) -> String {
    let mut cmd = Command::new(trapline());
    cmd.arg("leaks").arg(trace).args(extra);
    let finished = output_of(cmd, "trapline leaks");
    assert_eq!(finished.code(), 0, "{}", finished.describe());
    finished.stdout
}

/// The parsed `trapline leaks TRACE --format json EXTRA...` (which must succeed).
pub fn leaks_with(trace: &Path, extra: &[&str]) -> Value {
    let mut cmd = Command::new(trapline());
    cmd.arg("leaks")
        .arg(trace)
        .args(["--format", "json"])
        .args(extra);
    let finished = output_of(cmd, "trapline leaks");
    assert_eq!(
        finished.code(),
        0,
        "trapline leaks {} {extra:?} failed\n{}",
        trace.display(),
        finished.describe()
    );
    serde_json::from_str(&finished.stdout).unwrap_or_else(|e| {
        panic!(
            "trapline leaks did not print JSON ({e})\n{}",
            finished.describe()
        )
    })
}

/// The parsed `trapline stats TRACE --format json` (which must succeed).
pub fn stats(trace: &Path) -> Value {
    analysis_json("stats", trace)
}

// ---------------------------------------------------------------------------
// Reading the leaks report.

/// `value[key]` that must exist.
pub fn field<'a>(value: &'a Value, key: &str) -> &'a Value {
    value
        .get(key)
        .unwrap_or_else(|| panic!("no \"{key}\" in {}", pretty(value)))
}

pub fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

pub fn as_u64(value: &Value, key: &str) -> u64 {
    field(value, key)
        .as_u64()
        .unwrap_or_else(|| panic!("\"{key}\" is not an unsigned integer in {}", pretty(value)))
}

pub fn as_str<'a>(value: &'a Value, key: &str) -> &'a str {
    field(value, key)
        .as_str()
        .unwrap_or_else(|| panic!("\"{key}\" is not a string in {}", pretty(value)))
}

pub fn as_array<'a>(value: &'a Value, key: &str) -> &'a Vec<Value> {
    field(value, key)
        .as_array()
        .unwrap_or_else(|| panic!("\"{key}\" is not an array in {}", pretty(value)))
}

pub fn records(report: &Value) -> &Vec<Value> {
    as_array(report, "records")
}

pub fn errors(report: &Value) -> &Vec<Value> {
    as_array(report, "errors")
}

/// (bytes, blocks) of summary.unfreed_at_exit.
pub fn unfreed_summary(report: &Value) -> (u64, u64) {
    let unfreed = field(field(report, "summary"), "unfreed_at_exit");
    (as_u64(unfreed, "bytes"), as_u64(unfreed, "blocks"))
}

/// The name of a frame's function ("" when unknown).
pub fn frame_function(frame: &Value) -> &str {
    frame.get("function").and_then(Value::as_str).unwrap_or("")
}

/// The base name of a path ("" for null or missing).
pub fn basename(path: Option<&Value>) -> &str {
    path.and_then(Value::as_str)
        .map(|p| p.rsplit('/').next().unwrap_or(p))
        .unwrap_or("")
}

/// A frame as "function (file:line)" for messages.
pub fn show_frame(frame: &Value) -> String {
    format!(
        "{} ({}:{})",
        frame_function(frame),
        basename(frame.get("file")),
        frame.get("line").map_or("?".to_owned(), Value::to_string)
    )
}

pub fn show_stack(stack: &[Value]) -> String {
    stack
        .iter()
        .map(show_frame)
        .collect::<Vec<_>>()
        .join(" <- ")
}

/// The frames of `key` ("stack", "alloc_stack", "free_stack") of a record or error.
pub fn stack_of<'a>(item: &'a Value, key: &str) -> &'a Vec<Value> {
    as_array(item, key)
}

/// Asserts a frame: function name, file base name and line.
pub fn assert_frame(frame: &Value, function: &str, file: &str, line: u64, context: &str) {
    assert_eq!(
        frame_function(frame),
        function,
        "{context}: function of frame {}",
        pretty(frame)
    );
    assert_eq!(
        basename(frame.get("file")),
        file,
        "{context}: file of frame {}",
        pretty(frame)
    );
    assert_eq!(
        frame.get("line").and_then(Value::as_u64),
        Some(line),
        "{context}: line of frame {}",
        pretty(frame)
    );
    let address = as_str(frame, "address");
    assert!(
        address.starts_with("0x"),
        "{context}: address {address:?} is not 0x-hex"
    );
}

/// Asserts that `stack[i]` is (function, file, line) for each expected entry,
/// in order from stack[0], and that none of these frames is inlined.
/// Every record's stack starts with `expected` (the scan's verdicts, or
/// stacks that differ only beyond the frames kept, may split one site into
/// several records); returns their (bytes, blocks) together.
pub fn records_all_from(report: &Value, expected: &[(&str, &str, u64)]) -> (u64, u64) {
    let (mut bytes, mut blocks) = (0, 0);
    for (i, record) in records(report).iter().enumerate() {
        assert_stack_top(
            stack_of(record, "stack"),
            expected,
            &format!("records[{i}]"),
        );
        bytes += as_u64(record, "bytes");
        blocks += as_u64(record, "blocks");
    }
    (bytes, blocks)
}

pub fn assert_stack_top(stack: &[Value], expected: &[(&str, &str, u64)], context: &str) {
    assert!(
        stack.len() >= expected.len(),
        "{context}: stack too short: {}",
        show_stack(stack)
    );
    for (i, (function, file, line)) in expected.iter().enumerate() {
        let ctx = format!("{context}, stack[{i}] of {}", show_stack(stack));
        assert_frame(&stack[i], function, file, *line, &ctx);
        assert_eq!(
            stack[i].get("inlined"),
            Some(&Value::Bool(false)),
            "{ctx}: inlined"
        );
    }
}

/// The only record whose stack has a frame of `function`.
pub fn record_with_function<'a>(report: &'a Value, function: &str) -> &'a Value {
    let found: Vec<&Value> = records(report)
        .iter()
        .filter(|r| {
            stack_of(r, "stack")
                .iter()
                .any(|f| frame_function(f) == function)
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected exactly one record with {function} in its stack, in {}",
        pretty(report)
    );
    found[0]
}

/// The records of a report as (bytes, blocks, allocated_by, stack[0] function).
pub fn record_summaries(report: &Value) -> Vec<(u64, u64, String, String)> {
    records(report)
        .iter()
        .map(|r| {
            let stack = stack_of(r, "stack");
            (
                as_u64(r, "bytes"),
                as_u64(r, "blocks"),
                as_str(r, "allocated_by").to_owned(),
                stack.first().map(frame_function).unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// Asserts the parts of a report every complete trace shares: the process
/// fields, no lost events, a complete trace.
pub fn assert_complete(report: &Value) {
    assert_eq!(
        as_u64(report, "events_lost"),
        0,
        "events_lost in {}",
        pretty(report)
    );
    let trace = field(report, "trace");
    assert_eq!(
        field(trace, "complete"),
        &Value::Bool(true),
        "trace.complete in {}",
        pretty(trace)
    );
    assert_eq!(
        field(trace, "stopped"),
        &Value::Null,
        "trace.stopped in {}",
        pretty(trace)
    );
}

/// process.exit of a report.
pub fn process_exit(report: &Value) -> &Value {
    field(field(report, "process"), "exit")
}

/// process.pid of a report.
pub fn process_pid(report: &Value) -> u64 {
    as_u64(field(report, "process"), "pid")
}

/// process.executable of a report.
pub fn process_executable(report: &Value) -> &str {
    field(field(report, "process"), "executable")
        .as_str()
        .expect("executable string")
}

/// process.command of a report, as strings.
pub fn process_command(report: &Value) -> Vec<String> {
    as_array(field(report, "process"), "command")
        .iter()
        .map(|a| a.as_str().expect("command argument string").to_owned())
        .collect()
}

/// Asserts a one-record-per-leak report exactly: summary, then each record's
/// bytes, blocks, allocated_by and the top of its stack.
pub struct ExpectedRecord<'a> {
    pub bytes: u64,
    pub blocks: u64,
    pub allocated_by: &'a str,
    pub stack: Vec<(&'a str, &'a str, u64)>,
}

pub fn assert_records(report: &Value, expected: &[ExpectedRecord<'_>]) {
    let got = records(report);
    assert_eq!(
        got.len(),
        expected.len(),
        "number of records: got {:?}\n{}",
        record_summaries(report),
        pretty(report)
    );
    let total_bytes: u64 = expected.iter().map(|e| e.bytes).sum();
    let total_blocks: u64 = expected.iter().map(|e| e.blocks).sum();
    assert_eq!(
        unfreed_summary(report),
        (total_bytes, total_blocks),
        "summary (bytes, blocks)"
    );
    for (i, (record, want)) in got.iter().zip(expected).enumerate() {
        let ctx = format!("records[{i}]");
        // With a reachability scan (the default) a record has a verdict;
        // these fixtures' blocks point to no other block, so bytes are the
        // blocks' own either way.
        let kinds: &[&str] = if report["scan"].is_null() {
            &["unfreed_at_exit"]
        } else {
            &[
                "definitely_lost",
                "indirectly_lost",
                "possibly_lost",
                "still_reachable",
            ]
        };
        assert!(kinds.contains(&as_str(record, "kind")), "{ctx}.kind");
        assert_eq!(
            (
                as_u64(record, "bytes"),
                as_u64(record, "blocks"),
                as_str(record, "allocated_by")
            ),
            (want.bytes, want.blocks, want.allocated_by),
            "{ctx} (bytes, blocks, allocated_by); all records: {:?}",
            record_summaries(report)
        );
        assert_stack_top(stack_of(record, "stack"), &want.stack, &ctx);
    }
}

/// `n` with thousands separators, as the text reports (and inferno) write it.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

// ---------------------------------------------------------------------------
// Reports of two recorders of one program, compared.

/// A record or error reduced to what both builds must agree on: the kind,
/// the sizes, the function, and the frames in `source` (function, line).
#[allow(dead_code)] // not every test binary uses it
pub fn program_view(v: &Value, source: &str, keys: &[&str]) -> Option<String> {
    let frames = |stack: &Value| -> Vec<String> {
        stack
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f["file"].as_str().is_some_and(|p| p.ends_with(source)))
            .map(|f| format!("{}:{}", f["function"].as_str().unwrap(), f["line"]))
            .collect()
    };
    let own = frames(&v["stack"]);
    if own.is_empty() {
        return None;
    }
    let first_is_own = v["stack"][0]["file"]
        .as_str()
        .is_some_and(|p| p.ends_with(source));
    if v["kind"] == "still_reachable" && !first_is_own {
        return None;
    }
    let mut out: Vec<String> = keys.iter().map(|k| format!("{k}={}", v[*k])).collect();
    out.push(format!("stack={}", own.join(" < ")));
    if !v["alloc_stack"].is_null() {
        out.push(format!(
            "alloc_stack={}",
            frames(&v["alloc_stack"]).join(" < ")
        ));
    }
    Some(out.join(" "))
}

#[allow(dead_code)]
pub fn views(report: &Value, section: &str, source: &str, keys: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = report[section]
        .as_array()
        .unwrap_or_else(|| panic!("no {section} in {report}"))
        .iter()
        .filter_map(|r| program_view(r, source, keys))
        .collect();
    v.sort();
    v
}

/// What an error's two reports must agree on.
#[allow(dead_code)]
pub const ERROR_KEYS: [&str; 5] = [
    "kind",
    "function",
    "alloc_function",
    "alloc_size",
    "passed_on",
];

/// The parsed `trapline SUBCOMMAND TRACE --format sarif EXTRA...`, which
/// must succeed and be valid against the OASIS SARIF 2.1.0 schema
/// (tests/data/sarif-schema-2.1.0.json).
pub fn sarif(subcommand: &str, trace: &Path, extra: &[&str]) -> Value {
    let mut cmd = Command::new(trapline());
    cmd.arg(subcommand)
        .arg(trace)
        .args(["--format", "sarif"])
        .args(extra);
    let finished = output_of(cmd, &format!("trapline {subcommand}"));
    assert_eq!(finished.code(), 0, "{}", finished.describe());
    let log: Value = serde_json::from_str(&finished.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e})\n{}", finished.describe()));
    let schema_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/sarif-schema-2.1.0.json");
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_path).expect("the SARIF schema"))
            .expect("the SARIF schema is JSON");
    let validator = jsonschema::options()
        .should_validate_formats(true)
        .build(&schema)
        .expect("the SARIF schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(&log)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    // The validator is live: a log of another version is refused.
    let mut other = log.clone();
    other["version"] = Value::from("2.0.0");
    assert!(!validator.is_valid(&other), "the schema accepts anything");
    assert!(
        errors.is_empty(),
        "trapline {subcommand} --format sarif is not valid SARIF 2.1.0:\n{}\n{}",
        errors.join("\n"),
        pretty(&log)
    );
    log
}

/// A memory cgroup of the kernel's first version (the one this machine and
/// CI have) or its second, made for one test and removed after it.
pub struct MemoryGroup {
    dir: std::path::PathBuf,
}

impl MemoryGroup {
    /// A new group limited to `limit` bytes, if this process may make one
    /// (root, and a memory controller mounted); if not, says that the test
    /// does not run.
    pub fn new(name: &str, limit: u64) -> Option<MemoryGroup> {
        let group = MemoryGroup::make(name, limit);
        if group.is_none() {
            eprintln!(
                "no memory cgroup can be made here (not root, or no memory controller): not run"
            );
        }
        group
    }

    fn make(name: &str, limit: u64) -> Option<MemoryGroup> {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        for line in mounts.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let dash = fields.iter().position(|&f| f == "-")?;
            let (point, fs, opts) = (fields[4], fields[dash + 1], fields[dash + 3]);
            let (file, v1) = if fs == "cgroup" && opts.split(',').any(|o| o == "memory") {
                ("memory.limit_in_bytes", true)
            } else if fs == "cgroup2"
                && std::fs::read_to_string(format!("{point}/cgroup.subtree_control"))
                    .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
            {
                ("memory.max", false)
            } else {
                continue;
            };
            let dir = Path::new(point).join(format!("{name}-{}", std::process::id()));
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            let group = MemoryGroup { dir };
            if v1 {
                // No swap for the group: the limit is the limit.
                let _ = std::fs::write(group.dir.join("memory.swappiness"), "0");
            } else {
                let _ = std::fs::write(group.dir.join("memory.swap.max"), "0");
            }
            if std::fs::write(group.dir.join(file), limit.to_string()).is_ok() {
                return Some(group);
            }
        }
        None
    }

    /// The group as `/proc/self/cgroup` names it (below the mount's root).
    pub fn path(&self) -> String {
        format!(
            "/{}",
            self.dir.file_name().and_then(|n| n.to_str()).unwrap_or("")
        )
    }

    /// `sh -c 'echo $$ > GROUP/cgroup.procs && exec CMD...'`.
    pub fn run_inside(&self, cmd: &Command) -> Command {
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec \"$@\"",
                self.dir.display()
            ))
            .arg("sh")
            .arg(cmd.get_program())
            .args(cmd.get_args());
        if let Some(d) = cmd.get_current_dir() {
            sh.current_dir(d);
        }
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => sh.env(k, v),
                None => sh.env_remove(k),
            };
        }
        sh
    }
}

impl Drop for MemoryGroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}
