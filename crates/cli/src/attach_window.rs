//! `trapline attach` to a process `trapline run --control` records
//! already: no second agent is loaded. The agent's control channel gives
//! its trace and its clock; attach notes when the window began, and detach
//! (or `--duration`) waits until the trace holds everything up to its end,
//! then cuts the window out of the run's trace (`analysis::window`) into
//! the attach's own trace, as an attached recording would have it. The
//! process and its recording go on untouched.

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use trapline_contract::{control, env};
use trapline_trace::ChunkWriter;

use crate::control_client::{ask, fail, run_for};

/// Writer sweeps to wait for past the window's end: one may have begun
/// before it (its events made after its steal wait for the next).
const SWEEPS_PAST_END: u64 = 2;
/// How long a detach waits for those sweeps (the writer sweeps every
/// 200 ms) before it gives up.
const SWEEP_WAIT: Duration = Duration::from_secs(10);

/// The file that notes a window attach of process `pid`.
fn state_path(pid: u32) -> PathBuf {
    let (dir, _) = crate::watch::socket_of(pid);
    PathBuf::from(format!("{dir}/{pid}.window"))
}

/// Whether process `pid` was started by `trapline run --control`: its
/// first environment names a trace and asks for the control socket, and
/// the socket is there.
pub fn recorded_with_control(pid: u32) -> bool {
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let has = |prefix: &str| {
        environ
            .split(|&b| b == 0)
            .any(|v| v.starts_with(prefix.as_bytes()))
    };
    let (_, socket) = crate::watch::socket_of(pid);
    has(&format!("{}=", env::OUTPUT))
        && has(&format!("{}=1", env::CONTROL))
        && Path::new(&socket).exists()
}

/// The agent's clock, the run's trace and the writer's sweeps.
struct Now {
    time_ns: u64,
    trace: PathBuf,
    sweeps: u64,
}

fn now(pid: u32) -> Result<Now, String> {
    let (_, socket) = crate::watch::socket_of(pid);
    let a = ask(pid, &socket, control::COUNTERS)?;
    match (
        a["time_ns"].as_u64(),
        a["trace"].as_str(),
        a["sweeps"].as_u64(),
    ) {
        (Some(time_ns), Some(trace), Some(sweeps)) if !trace.is_empty() => Ok(Now {
            time_ns,
            trace: PathBuf::from(trace),
            sweeps,
        }),
        _ => Err(format!(
            "its agent answered without its trace and clock: {a}"
        )),
    }
}

pub fn attach(pid: u32, output: Option<PathBuf>, duration: Option<f64>, force: bool) -> ExitCode {
    let state = state_path(pid);
    if state.exists() {
        return fail(
            "attach",
            format!("process {pid} is attached to already: `trapline detach {pid}` ends it"),
        );
    }
    let output = output.unwrap_or_else(|| PathBuf::from(format!("trapline-{pid}.trace")));
    let output = std::path::absolute(&output).unwrap_or(output);
    if output.exists() && !force {
        return fail(
            "attach",
            format!(
                "{}: exists; --force replaces it (nothing was changed)",
                output.display()
            ),
        );
    }
    // Written at detach: checked now, where nothing is lost yet.
    if let Err(e) = std::fs::File::create(&output) {
        return fail("attach", format!("cannot write {}: {e}", output.display()));
    }
    let start = match now(pid) {
        Ok(n) => n,
        Err(why) => return fail("attach", format!("process {pid}: {why}")),
    };
    let note = serde_json::json!({
        "trace": start.trace,
        "output": output,
        "from_ns": start.time_ns,
    });
    if let Err(e) = std::fs::write(&state, format!("{note}\n")) {
        return fail("attach", format!("cannot write {}: {e}", state.display()));
    }
    eprintln!(
        "trapline attach: process {pid} is recorded by `trapline run` into {}: its window from \
         now goes into {} at `trapline detach {pid}`",
        start.trace.display(),
        output.display()
    );
    let Some(secs) = duration else {
        return ExitCode::SUCCESS;
    };
    // Ended first or not, the window is cut now.
    run_for(pid, secs);
    detach(pid).unwrap_or(ExitCode::SUCCESS)
}

/// Ends a window attach of `pid`; None when there is none.
pub fn detach(pid: u32) -> Option<ExitCode> {
    let state = state_path(pid);
    let note: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).ok()?).ok()?;
    let (Some(trace), Some(output), Some(from_ns)) = (
        note["trace"].as_str(),
        note["output"].as_str(),
        note["from_ns"].as_u64(),
    ) else {
        return Some(fail("detach", format!("{} is damaged", state.display())));
    };
    let result = finish_window(pid, Path::new(trace), Path::new(output), from_ns);
    let _ = std::fs::remove_file(&state);
    Some(match result {
        Ok(summary) => {
            eprintln!("trapline detach: {summary}");
            ExitCode::SUCCESS
        }
        Err(why) => fail("detach", format!("process {pid}: {why}")),
    })
}

/// Waits until the run's trace holds the window, and cuts it.
fn finish_window(pid: u32, trace: &Path, output: &Path, from_ns: u64) -> Result<String, String> {
    // The window ends now, or where the process ended.
    let to_ns = match now(pid) {
        Ok(end) => {
            let deadline = Instant::now() + SWEEP_WAIT;
            loop {
                match now(pid) {
                    Ok(n) if n.sweeps >= end.sweeps + SWEEPS_PAST_END => break,
                    Ok(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    Ok(_) => return Err("its trace's writer did not sweep in 10 s".into()),
                    // Ended meanwhile: its trace is complete.
                    Err(_) => break,
                }
            }
            end.time_ns
        }
        // Ended: the window runs to its trace's end.
        Err(_) => u64::MAX,
    };
    let file = std::fs::File::open(trace).map_err(|e| format!("{}: {e}", trace.display()))?;
    let mut input = BufReader::with_capacity(1 << 16, file);
    let out = std::fs::File::create(output).map_err(|e| format!("{}: {e}", output.display()))?;
    let mut writer = ChunkWriter::new(out).map_err(|e| format!("{}: {e}", output.display()))?;
    let window =
        trapline_analysis::window::cut(&mut input, from_ns, to_ns, |tid, ev| writer.push(tid, ev))
            .map_err(|e| format!("{}: {e}", trace.display()))?
            .map_err(|e| format!("{}: {e}", output.display()))?;
    writer
        .finish()
        .map_err(|e| format!("{}: {e}", output.display()))?;
    let mut summary = format!(
        "process {pid}'s window of {} is in {} ({} events, {} releases of earlier blocks)",
        trace.display(),
        output.display(),
        window.events,
        window.earlier_releases
    );
    if window.process_ended {
        summary.push_str("; the process ended inside it");
    }
    Ok(summary + &format!("; see: trapline leaks {}", output.display()))
}
