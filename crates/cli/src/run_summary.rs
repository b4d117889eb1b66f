//! The short report `trapline run` prints when the command ends: the
//! command's process, the others added up, and why a trace is incomplete.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;
use rayon::prelude::*;

use trapline_analysis::findings::Findings;

use crate::trace_names;

/// The warning about an allocator linked into the executable under names of
/// its own, repeated in the end-of-run summary.
pub(crate) static PRIVATE_ALLOCATOR: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The signals a crash ends a program with (a fault, `abort`): the agent
/// records where it struck and judges the heap (lifecycle.rs).
const CRASH_SIGNALS: [i32; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGABRT,
];

/// The short report printed when the command ends: about the command's
/// process as it ended (its last image, when it replaced itself with exec),
/// then the other processes added up. `top_pid`: the command's process;
/// `killed_by`: the signal that ended it, if one did. Returns the trace of
/// that last image, and what the analyses found in all of the run's traces.
fn summarize(
    output: &Path,
    program: &Path,
    top_pid: u32,
    killed_by: Option<i32>,
) -> (PathBuf, Findings) {
    let mut files = vec![output.to_path_buf()];
    files.extend(trace_names::family_files(output));
    let empty = std::fs::metadata(output)
        .map(|m| m.len() == 0)
        .unwrap_or(true);
    eprintln!(
        "==trapline== traces written: {}",
        files.len() - usize::from(empty)
    );
    // Every file is read once, for the list and the summaries both.
    let summaries: Vec<Option<ReadSummary>> = files
        .iter()
        .map(|f| {
            if f == output && empty {
                None
            } else {
                read_summary(f)
            }
        })
        .collect();
    list_traces(output, &files, &summaries, empty);
    if empty {
        warn_no_trace(program, killed_by);
        return (output.to_path_buf(), Findings::default());
    }
    // One read per trace, on every core: a build's tree has hundreds.
    let findings: Vec<Option<Findings>> = files
        .par_iter()
        .zip(&summaries)
        .map(|(f, s)| {
            s.as_ref()
                .and_then(|s| s.as_ref().ok())
                .and(read_findings(f))
        })
        .collect();
    let mut total = Findings::default();
    for f in findings.iter().flatten() {
        total.add(f);
    }
    let images = top_images(output, top_pid, &files, &summaries);
    let last = *images.last().unwrap_or(&0);
    let last_trace = &files[last];
    if images.len() > 1 {
        eprintln!(
            "==trapline== the command replaced itself with exec {}: {}; below, its last image ({})",
            if images.len() == 2 {
                "once".to_string()
            } else {
                format!("{} times", images.len() - 1)
            },
            image_names(&images, &summaries),
            last_trace.display()
        );
    }
    let mut summaries = summaries;
    let last_calls = print_last_image(
        summaries[last].take(),
        findings[last].as_ref(),
        killed_by,
        last_trace,
    );
    let (others, others_summaries): (Vec<PathBuf>, Vec<_>) = files
        .iter()
        .zip(summaries.into_iter().zip(findings))
        .enumerate()
        .filter(|(i, _)| *i != last)
        .map(|(_, (f, s))| (f.clone(), s))
        .unzip();
    let others_are = if images.len() > 1 {
        "other processes and earlier images"
    } else {
        "other processes"
    };
    let busiest = summarize_others(output, others_are, &others, others_summaries.into_iter());
    point_at_the_work(
        &busiest,
        &files,
        &images,
        last_calls.unwrap_or(0),
        last_trace,
    );
    (last_trace.clone(), total)
}

/// The status `trapline run` exits with: `error_exitcode` when asked for
/// and the analyses found something it stands for (`found`; None when the
/// traces could not be judged), else the command's.
pub(crate) fn exit_status(
    command: u8,
    error_exitcode: Option<u8>,
    found: Option<bool>,
) -> std::process::ExitCode {
    match (error_exitcode, found) {
        (Some(n), Some(true)) => std::process::ExitCode::from(n),
        _ => std::process::ExitCode::from(command),
    }
}

/// The argument that makes `trapline` the reader of a run's traces:
/// `trapline __trapline-summary OUTPUT PROGRAM PID SIGNAL|- summary|findings
/// GROUP_OOM_KILLS|- SYSTEM_OOM_KILLS|- [PRIVATE_ALLOCATOR_WARNING]`.
pub(crate) const READER_ARG: &str = "__trapline-summary";

/// What the reader of the traces tells `trapline run`.
pub(crate) struct Summarized {
    /// The trace of the command's last image.
    pub(crate) last_image: PathBuf,
    /// Whether the analyses found what `--error-exitcode` stands for; None
    /// when the reader could not finish.
    pub(crate) found: Option<bool>,
}

/// Reads the run's traces in a process of its own (this binary, with
/// READER_ARG) and prints the summary when `print`, else only judges them.
/// A replay holds every block that was live; run inside the program's
/// memory cgroup, it would get trapline itself ended by the group's OOM
/// killer, the command's status and the note on its death lost with it.
/// The reader goes first to the OOM killer (`oom_score_adj` 1000), before
/// the processes the command left running in the group.
pub(crate) fn summarize_apart(
    output: &Path,
    program: &Path,
    top_pid: u32,
    killed_by: Option<i32>,
    print: bool,
) -> Summarized {
    let in_process = || {
        let (last_image, findings) = read_here(output, program, top_pid, killed_by, print);
        Summarized {
            last_image,
            found: Some(findings.fail()),
        }
    };
    let Ok(exe) = std::env::current_exe() else {
        return in_process();
    };
    let count = |n: Option<u64>| n.map_or("-".to_string(), |n| n.to_string());
    let start = OOM_KILLS_AT_START.get();
    let mut cmd = std::process::Command::new(exe);
    cmd.arg(READER_ARG)
        .arg(output)
        .arg(program)
        .arg(top_pid.to_string())
        .arg(killed_by.map_or("-".to_string(), |s| s.to_string()))
        .arg(if print { "summary" } else { "findings" })
        .arg(count(start.and_then(|o| o.group.as_ref().map(|g| g.1))))
        .arg(count(start.and_then(|o| o.system)))
        .args(PRIVATE_ALLOCATOR.get())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    let before = OomKills::now();
    let Ok(reader) = cmd.output() else {
        return in_process();
    };
    if reader.status.success() {
        let text = reader.stdout;
        let (verdict, path) = text
            .iter()
            .position(|&b| b == b'\n')
            .map_or((&text[..], &[][..]), |i| (&text[..i], &text[i + 1..]));
        return Summarized {
            last_image: PathBuf::from(std::ffi::OsStr::from_bytes(path)),
            found: Some(verdict == b"found"),
        };
    }
    let how = match reader.status.signal() {
        Some(signal) => {
            let oom = before.group_killer().map(|killer| {
                format!(
                    ": {killer} ended it (a replay holds every block that was live, and the \
                     reader runs in the command's group)"
                )
            });
            format!(
                "was killed by signal {signal} ({}){}",
                Signal::try_from(signal).map_or("?", |s| s.as_str()),
                oom.unwrap_or_default()
            )
        }
        None => format!(
            "failed (status {})",
            reader.status.code().unwrap_or_default()
        ),
    };
    let judged = if print {
        "the summary"
    } else {
        "--error-exitcode"
    };
    eprintln!(
        "==trapline== {judged} is missing: trapline's reader of the traces {how}; the command's \
         status is returned. Read the trace where there is room: trapline leaks {}",
        output.display()
    );
    // What the summary would have said of the program's death.
    if print && killed_by == Some(libc::SIGKILL) {
        eprintln!("==trapline== {}", unflushed_death(libc::SIGKILL));
    } else if let Some(note) = killed_by
        .and_then(|s| crash_note(s, output))
        .filter(|_| print)
    {
        eprintln!("==trapline== {note}");
    }
    Summarized {
        last_image: output.to_path_buf(),
        found: None,
    }
}

/// The reader of the traces (READER_ARG's process): prints the summary
/// to stderr, or only judges the traces, and tells `trapline run` on stdout
/// `found` or `clean`, a newline and the trace of the command's last image.
pub(crate) fn reader_main(args: &[std::ffi::OsString]) -> std::process::ExitCode {
    let [output, program, pid, signal, mode, group_kills, system_kills, rest @ ..] = args else {
        eprintln!("==trapline== {READER_ARG}: bad arguments");
        return std::process::ExitCode::from(2);
    };
    // The OOM killer's first choice in the group, before the command's
    // processes still running there: the reader holds a replay's blocks.
    let _ = std::fs::write("/proc/self/oom_score_adj", "1000");
    let number = |s: &std::ffi::OsString| s.to_str().and_then(|s| s.parse::<u64>().ok());
    let group = trapline_memlimits::Group::of_this_process();
    let _ = OOM_KILLS_AT_START.set(OomKills {
        group: group.zip(number(group_kills)),
        system: number(system_kills),
    });
    if let Some(warning) = rest.first().and_then(|w| w.to_str()) {
        let _ = PRIVATE_ALLOCATOR.set(warning.to_string());
    }
    let (last_image, findings) = read_here(
        Path::new(output),
        Path::new(program),
        number(pid).unwrap_or_default() as u32,
        number(signal).map(|s| s as i32),
        mode == "summary",
    );
    let verdict: &[u8] = if findings.fail() { b"found" } else { b"clean" };
    let mut out = std::io::stdout().lock();
    let _ = out
        .write_all(verdict)
        .and_then(|_| out.write_all(b"\n"))
        .and_then(|_| out.write_all(last_image.as_os_str().as_bytes()));
    std::process::ExitCode::SUCCESS
}

/// Reads the run's traces in this process: prints the summary when
/// `print`, else only judges them. Returns the trace of the command's last
/// image and what the analyses found.
fn read_here(
    output: &Path,
    program: &Path,
    top_pid: u32,
    killed_by: Option<i32>,
    print: bool,
) -> (PathBuf, Findings) {
    if print {
        summarize(output, program, top_pid, killed_by)
    } else {
        (output.to_path_buf(), run_findings(output))
    }
}

/// What the analyses find in all the traces of the run at `output`, for
/// `--error-exitcode` when no summary is printed.
fn run_findings(output: &Path) -> Findings {
    let mut total = Findings::default();
    let mut files = vec![output.to_path_buf()];
    files.extend(trace_names::family_files(output));
    let found: Vec<Option<Findings>> = files.par_iter().map(|f| read_findings(f)).collect();
    for f in found.iter().flatten() {
        total.add(f);
    }
    total
}

/// A trace's findings (one read for the leaks and deadlocks analyses);
/// None when it cannot be read.
fn read_findings(path: &Path) -> Option<Findings> {
    let file = std::fs::File::open(path).ok()?;
    let mut input = std::io::BufReader::new(file);
    trapline_analysis::findings::of_trace(&mut input).ok()
}

/// Lists the traces written, the first `TRACES_LISTED` and those that warn.
fn list_traces(output: &Path, files: &[PathBuf], summaries: &[Option<ReadSummary>], empty: bool) {
    let mut unlisted = 0usize;
    for (i, (f, summary)) in files.iter().zip(summaries).enumerate() {
        if f == output && empty {
            continue;
        }
        // The top process's summary below says so; other processes here.
        let allocators = summary
            .as_ref()
            .and_then(|s| s.as_ref().ok())
            .filter(|_| f != output)
            .map(|s| s.allocators.clone())
            .unwrap_or_default();
        // A long tree (a build, a shell loop) lists its first traces only,
        // and after them those that warn.
        let listed = i < TRACES_LISTED;
        match (allocators.shadowed_by, allocators.library) {
            (Some(module), _) => eprintln!(
                "==trapline==   {} (WARNING: its allocator of its own, in {module}, is not traced)",
                f.display()
            ),
            (None, Some(library)) if listed => {
                eprintln!("==trapline==   {} (allocator: {library})", f.display())
            }
            _ if listed => eprintln!("==trapline==   {}", f.display()),
            _ => unlisted += 1,
        }
    }
    if unlisted > 0 {
        eprintln!(
            "==trapline==   ... and {} more, named {}.<pid>",
            th(unlisted as u64),
            output.display()
        );
    }
}

/// The top process wrote nothing: why that may be.
fn warn_no_trace(program: &Path, killed_by: Option<i32>) {
    let not_loaded = "the agent was not loaded into it (a static, setuid, 32-bit or musl program started by a script? a program that clears LD_PRELOAD?)";
    match killed_by {
        // SIGKILL, or a crash the agent's handler could not run for
        // (a stack overflow without an alternate stack), before the
        // first chunk was written.
        Some(signal) => eprintln!(
            "==trapline== warning: {} wrote no trace: it was killed by signal {signal} before the agent wrote anything, or {not_loaded}",
            program.display()
        ),
        None => eprintln!(
            "==trapline== warning: {} wrote no trace: {not_loaded}",
            program.display()
        ),
    }
}

/// Where to look when the program died of a crash signal.
fn crash_note(signal: i32, trace: &Path) -> Option<String> {
    CRASH_SIGNALS.contains(&signal).then(|| {
        format!(
            "CRASH: the program died of {}: where it struck, and the heap as it left it: trapline leaks {}",
            trapline_analysis::report::signal_name(signal as u32),
            trace.display()
        )
    })
}

/// The summary of the command's last image, and what its end says (a
/// crash, an exit past the agent); its allocation calls.
fn print_last_image(
    summary: Option<ReadSummary>,
    findings: Option<&Findings>,
    killed_by: Option<i32>,
    last_trace: &Path,
) -> Option<u64> {
    let mut last_calls = None;
    match summary {
        Some(Ok(s)) => {
            last_calls = Some(s.allocation_calls);
            print_summary(&s, findings);
            let exec_untraced = s.process.exit.is_some_and(|e| e.exec);
            if exec_untraced {
                eprintln!("==trapline== {EXEC_UNTRACED}");
            }
            if s.events_lost.is_none() {
                match killed_by {
                    Some(signal) => eprintln!("==trapline== {}", unflushed_death(signal)),
                    None => eprintln!("==trapline== {UNFLUSHED_EXIT}"),
                }
            } else if let Some(note) = killed_by.and_then(|s| crash_note(s, last_trace)) {
                eprintln!("==trapline== {note}");
            }
        }
        Some(Err(e)) => eprintln!("==trapline== cannot read {}: {e}", last_trace.display()),
        None => {}
    }
    last_calls
}

/// Points at the trace to read: the command's own, or the other processes
/// that carry the work.
fn point_at_the_work(
    busiest: &[Busy],
    files: &[PathBuf],
    images: &[usize],
    mine: u64,
    last_trace: &Path,
) {
    // A driver (g++, make, a shell) makes few allocation calls; the other
    // processes that carry the work (ten times the command's own calls, and
    // a thousand at least) are named first. The command's earlier images
    // are the command.
    let working: Vec<&Busy> = busiest
        .iter()
        .filter(|b| b.calls >= WORK_CALLS_AT_LEAST.max(mine.saturating_mul(10)))
        .filter(|b| !images.iter().any(|&i| files[i] == b.path))
        .collect();
    if working.is_empty() {
        eprintln!("==trapline== see: trapline leaks {}", last_trace.display());
    } else {
        let named: Vec<String> = working
            .iter()
            .map(|b| {
                format!(
                    "{} ({}, {} allocation calls)",
                    b.path.display(),
                    b.name,
                    th(b.calls)
                )
            })
            .collect();
        eprintln!(
            "==trapline== most of the work is in other processes: {}",
            named.join(", ")
        );
        eprintln!(
            "==trapline== see: trapline leaks {}",
            working[0].path.display()
        );
        eprintln!(
            "==trapline==      trapline leaks {} (the command's own, {} allocation calls)",
            last_trace.display(),
            th(mine)
        );
    }
}

/// A trace of another process with many allocation calls.
struct Busy {
    path: PathBuf,
    /// Its executable's file name.
    name: String,
    calls: u64,
}

/// Traces of other processes named as the ones that carry the work.
const BUSIEST_NAMED: usize = 3;
/// Allocation calls another process must make to be named as the work.
const WORK_CALLS_AT_LEAST: u64 = 1000;

/// The exec'd image after the last trace was not traced.
const EXEC_UNTRACED: &str = "the process then replaced itself with a program the agent \
     could not enter (a static, setuid, 32-bit or musl program, or one that clears LD_PRELOAD): the \
     exit status is that program's";

/// The command's process, image by image: indexes into `files` of its
/// first trace (`output`), then of each image it exec'd, which writes
/// `output.<pid>`, then `output.<pid>.1`, ... (a failed exec goes on in a
/// new file too). Follows the chain while each trace ends with an exec.
fn top_images(
    output: &Path,
    top_pid: u32,
    files: &[PathBuf],
    summaries: &[Option<ReadSummary>],
) -> Vec<usize> {
    let mut images = vec![0];
    for generation in 0.. {
        let current = images[images.len() - 1];
        let exec = matches!(
            &summaries[current],
            Some(Ok(s)) if s.process.exit.is_some_and(|e| e.exec)
        );
        if !exec {
            break;
        }
        let next = trace_names::image_trace(output, top_pid, generation);
        match files.iter().position(|f| *f == next) {
            Some(i) => images.push(i),
            None => break,
        }
    }
    images
}

/// "env, bash, python3.11": the images' executables, by file name (the
/// first and last three of a longer chain).
fn image_names(images: &[usize], summaries: &[Option<ReadSummary>]) -> String {
    let name = |i: &usize| match &summaries[*i] {
        Some(Ok(s)) => s
            .process
            .executable
            .as_deref()
            .map(|e| e.rsplit('/').next().unwrap_or(e).to_string())
            .unwrap_or_else(|| "?".to_string()),
        _ => "?".to_string(),
    };
    if images.len() <= 6 {
        images.iter().map(name).collect::<Vec<_>>().join(", ")
    } else {
        let first: Vec<_> = images[..3].iter().map(name).collect();
        let last: Vec<_> = images[images.len() - 3..].iter().map(name).collect();
        format!("{}, ..., {}", first.join(", "), last.join(", "))
    }
}

/// A trace file's summary, or why it could not be read.
type ReadSummary = Result<trapline_analysis::stats::RunSummary, trapline_trace::TraceError>;

/// The summary of one trace file: the agent's own totals, from the end of
/// the file, when it could keep them exactly; otherwise a replay of the
/// whole trace. None if the file cannot be opened.
fn read_summary(path: &Path) -> Option<ReadSummary> {
    let mut file = std::fs::File::open(path).ok()?;
    Some(
        match trapline_analysis::stats::summary_from_tail(&mut file) {
            Ok(Some(s)) => Ok(s),
            _ => {
                // A replay reads every event: say why trapline has not returned yet.
                let len = file.metadata().map(|m| m.len()).unwrap_or(0);
                if len >= SLOW_SUMMARY_BYTES {
                    eprintln!(
                        "==trapline== reading {} MB of {} for the summary (-q skips this)...",
                        th(len >> 20),
                        path.display()
                    );
                }
                trapline_analysis::stats::analyze_totals(&mut file)
                    .map(|s| trapline_analysis::stats::RunSummary::from_stats(&s))
            }
        },
    )
}

/// Trace files listed by name before the summary.
const TRACES_LISTED: usize = 20;

/// Traces of other processes listed one by one when they need a look.
const OTHERS_LISTED: usize = 10;

/// The totals of the other processes' traces (children, exec'd images), and
/// which of them hold errors or lost events: the top process's summary
/// alone said "errors found: 0" for a tree whose child double-freed. Their
/// unfreed blocks are not added up: a fork child that execs lists the heap
/// it inherited, and a shell's children would sum to many times its heap.
/// Returns the traces with the most allocation calls, most first.
fn summarize_others(
    output: &Path,
    others_are: &str,
    others: &[PathBuf],
    summaries: impl Iterator<Item = (Option<ReadSummary>, Option<Findings>)>,
) -> Vec<Busy> {
    let mut busiest: Vec<Busy> = Vec::new();
    if others.is_empty() {
        return busiest;
    }
    let (mut calls, mut errors, mut lost, mut unfinished) = (0u64, 0u64, 0u64, 0usize);
    let mut running = 0usize;
    let mut failed = 0u64;
    let mut notable = Vec::new();
    for (path, (summary, findings)) in others.iter().zip(summaries) {
        let s = match summary {
            Some(Ok(s)) => s,
            // A process that has just started may not have written its
            // first chunk yet.
            Some(Err(_)) if trace_names::pid_in_name(output, path).is_some_and(is_alive) => {
                running += 1;
                notable.push(format!("{}: {STILL_RUNNING}", path.display()));
                continue;
            }
            Some(Err(e)) => {
                notable.push(format!("{}: cannot read it: {e}", path.display()));
                continue;
            }
            None => continue,
        };
        calls += s.allocation_calls;
        busiest.push(Busy {
            path: path.clone(),
            name: s
                .process
                .executable
                .as_deref()
                .map(|e| e.rsplit('/').next().unwrap_or(e).to_string())
                .unwrap_or_else(|| "?".to_string()),
            calls: s.allocation_calls,
        });
        busiest.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.path.cmp(&b.path)));
        busiest.truncate(BUSIEST_NAMED);
        let found = findings.map_or(s.errors, |f| f.errors());
        errors += found;
        failed += s.failed_allocations;
        // A process that outlived the command (a daemon, Python's
        // resource tracker) is still writing its trace.
        // The pid from the file's name when its first chunk is not written
        // yet (a child that has just started).
        let pid = s
            .process
            .pid
            .or_else(|| trace_names::pid_in_name(output, path));
        let still_running = s.events_lost.is_none() && pid.is_some_and(is_alive);
        match s.events_lost {
            Some(n) => lost += n,
            None if still_running => running += 1,
            None => unfinished += 1,
        }
        let mut what = Vec::new();
        match findings {
            Some(f) => what.extend(f.error_kinds_text()),
            None if found > 0 => what.push(counted(found, "error")),
            _ => {}
        }
        if s.failed_allocations > 0 {
            what.push(counted(s.failed_allocations, "failed allocation call"));
        }
        match s.events_lost {
            Some(0) => {}
            Some(n) => what.push(format!("{} lost", counted(n, "event"))),
            None if still_running => what.push(STILL_RUNNING.to_string()),
            None => what.push("no end record".to_string()),
        }
        if !what.is_empty() {
            notable.push(format!("{}: {}", path.display(), what.join(", ")));
        }
    }
    let unfinished = match (running, unfinished) {
        (0, 0) => String::new(),
        (0, u) => format!(" ({u} without an end record)"),
        (r, 0) => format!(" ({r} still running)"),
        (r, u) => format!(" ({r} still running, {u} without an end record)"),
    };
    let failed = if failed > 0 {
        format!(", failed allocation calls: {}", th(failed))
    } else {
        String::new()
    };
    eprintln!(
        "==trapline== {others_are} ({}): {} allocation calls, errors found: {}{failed}, events lost: {}{unfinished}",
        counted(others.len() as u64, "trace"),
        th(calls),
        th(errors),
        th(lost)
    );
    for line in notable.iter().take(OTHERS_LISTED) {
        eprintln!("==trapline==   {line}");
    }
    if notable.len() > OTHERS_LISTED {
        eprintln!(
            "==trapline==   ... and {} more with errors, failed allocations or lost events",
            counted((notable.len() - OTHERS_LISTED) as u64, "trace")
        );
    }
    busiest
}

const STILL_RUNNING: &str =
    "still running: it outlived the command, and its trace grows until it ends";

/// Whether process `pid` runs: it exists and is no zombie (it may be
/// another process that got the pid since, which only makes a trace
/// without end record "still running").
fn is_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) S ...": the command may hold ')', the state follows the last.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, None | Some('Z') | Some('X'))
}

/// Why a trace has no end record although the program exited.
const UNFLUSHED_EXIT: &str = "the program exited, yet its trace has no end record: its exit \
     went past the agent (the exit_group system call made directly, or a vfork child that \
     called exit()), or the agent could not write its last chunks (its message above says \
     why); what it did since the agent's last flush (at most about 200 ms) is missing";

/// What the kernel's OOM killer has done: in the memory cgroup that
/// trapline and the command share (which names the limit), and system-wide
/// (`oom_kill` of `/proc/vmstat`, Linux 4.13, which counts a cgroup's kills
/// too).
pub(crate) struct OomKills {
    group: Option<(trapline_memlimits::Group, u64)>,
    system: Option<u64>,
}

impl OomKills {
    pub(crate) fn now() -> OomKills {
        let group = trapline_memlimits::Group::of_this_process()
            .and_then(|g| g.oom_kills().map(|n| (g, n)));
        OomKills {
            group,
            system: trapline_memlimits::system_oom_kills(),
        }
    }

    /// "the OOM killer of the memory cgroup G (limit of N MiB)", when the
    /// group's count of OOM kills has risen since these counts.
    fn group_killer(&self) -> Option<String> {
        let (group, n) = self.group.as_ref()?;
        group.oom_kills().filter(|now| now > n)?;
        let limit = group
            .limit()
            .map(|l| format!(" of {} MiB", l >> 20))
            .unwrap_or_default();
        Some(format!(
            "the OOM killer of the memory cgroup {} (limit{limit})",
            group.path
        ))
    }
}

pub(crate) static OOM_KILLS_AT_START: std::sync::OnceLock<OomKills> = std::sync::OnceLock::new();

/// Why a SIGKILL came, when the OOM killer ended processes while the
/// command ran: the cgroup's, with its limit, when its count rose (then
/// it was the command or another process of the group), else the system's
/// (most likely the command: it is the one that grew).
fn oom_kill_note() -> Option<String> {
    let before = OOM_KILLS_AT_START.get()?;
    let agent = "Under trapline a program also holds the agent's table (about 26 bytes per \
                 live block) and its buffers";
    if let Some(killer) = before.group_killer() {
        return Some(format!(
            "{killer} ended a process of the group while the command ran: the command reached \
             the group's limit. {agent}"
        ));
    }
    let killed = trapline_memlimits::system_oom_kills()?
        .checked_sub(before.system?)
        .filter(|&n| n > 0)?;
    let processes = if killed == 1 {
        "a process".to_string()
    } else {
        format!("{killed} processes")
    };
    Some(format!(
        "the kernel's OOM killer ended {processes} while the command ran (/proc/vmstat), most \
         likely this one: its memory cgroup or the system ran out of memory. {agent}"
    ))
}

/// Why a trace has no end record although the program died of `signal`,
/// which the agent's handler normally records before it lets the program die.
fn unflushed_death(signal: i32) -> String {
    let name = Signal::try_from(signal).map_or("a signal", |s| s.as_str());
    let why = match Signal::try_from(signal) {
        Ok(Signal::SIGKILL) => match oom_kill_note() {
            Some(note) => format!("SIGKILL cannot be caught; {note}"),
            None => "SIGKILL cannot be caught".to_string(),
        },
        Ok(Signal::SIGSEGV | Signal::SIGBUS) => {
            "perhaps a stack overflow on an alternate signal stack of the program's own too \
             small for the agent's handler, or a handler of the program's that ended it"
                .to_string()
        }
        _ => format!("the program handled {name} itself, or the agent's handler could not run"),
    };
    format!(
        "the program died of signal {signal} ({name}) before the agent could finish the trace: \
         {why}; what it did since the agent's last flush (at most about 200 ms) is missing"
    )
}

/// Trace size from which a summary replay takes long enough (about a second)
/// to be announced.
const SLOW_SUMMARY_BYTES: u64 = 32 << 20;

fn th(n: u64) -> String {
    trapline_analysis::report::thousands(n)
}

/// "1 trace", "2 traces".
fn counted(n: u64, noun: &str) -> String {
    let s = if n == 1 { "" } else { "s" };
    format!("{} {noun}{s}", th(n))
}

/// The summary lines after the trace names.
fn print_summary(s: &trapline_analysis::stats::RunSummary, findings: Option<&Findings>) {
    eprintln!(
        "==trapline== allocation calls: {} ({} releases)",
        th(s.allocation_calls),
        th(s.release_calls)
    );
    eprintln!(
        "==trapline== peak heap: {} bytes at {:.3} s",
        th(s.peak_heap_bytes),
        trapline_analysis::report::seconds(s.peak_heap_time_ns)
    );
    // The exit snapshot is the agent's own table at exit; a replay of the
    // events misses what the process did not allocate itself (a fork child's
    // inherited blocks) and what ran after the last chunk.
    let (bytes, blocks) = (th(s.unfreed.bytes), counted(s.unfreed.blocks, "block"));
    if s.unfreed_replayed {
        eprintln!("==trapline== unfreed at end of trace: {bytes} bytes in {blocks} (replayed: the process did not finish)");
    } else {
        eprintln!("==trapline== unfreed at exit: {bytes} bytes in {blocks}");
    }
    match findings {
        Some(f) => {
            if let Some(leaks) = f.leaks_text() {
                eprintln!("==trapline== {leaks}");
            }
            eprintln!("==trapline== {}", f.errors_text());
        }
        None => eprintln!("==trapline== errors found: {}", th(s.errors)),
    }
    if s.failed_allocations > 0 {
        eprintln!(
            "==trapline== failed allocation calls: {} (out of memory? `trapline leaks` lists where)",
            th(s.failed_allocations)
        );
    }
    match s.events_lost {
        Some(n) => eprintln!("==trapline== events lost: {}", th(n)),
        None => eprintln!("==trapline== events lost: unknown (the trace has no end record)"),
    }
    for w in &s.warnings {
        eprintln!("==trapline== {w}");
    }
    if let Some(w) = PRIVATE_ALLOCATOR.get() {
        eprintln!("==trapline== {w}");
    }
}
