//! What `attach`, `detach` and an attach to a `run --control` process
//! share: asking a traced process's agent over its control socket, and
//! waiting while the process runs.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::time::Duration;

/// A command's failure: its message on stderr, and the analysis-error code.
pub fn fail(command: &str, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("trapline {command}: {msg}");
    ExitCode::from(crate::args::EXIT_ANALYSIS_ERROR)
}

/// Waits `secs` seconds (an attach's `--duration`) while process `pid`
/// runs; false when it ended first.
pub fn run_for(pid: u32, secs: f64) -> bool {
    let until = std::time::Instant::now() + Duration::from_secs_f64(secs);
    while std::time::Instant::now() < until {
        if ended(pid) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100).min(until - std::time::Instant::now()));
    }
    true
}

/// Whether process `pid` has ended (gone, or a zombie not yet reaped).
fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

/// Sends `request` to the control socket of process `pid`; its answer
/// (an error answer is an `Err`).
pub fn ask(pid: u32, socket: &str, request: &str) -> Result<serde_json::Value, String> {
    let stream = UnixStream::connect(socket).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!(
            "not attached to (no control socket at {socket}; `trapline attach {pid}` attaches)"
        ),
        std::io::ErrorKind::ConnectionRefused => {
            format!("{socket} is left from a process that has ended")
        }
        _ => format!("{socket}: {e}"),
    })?;
    let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
    writer
        .write_all(format!("{request}\n").as_bytes())
        .map_err(|e| format!("cannot ask: {e}"))?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|e| format!("no answer: {e}"))?;
    let answer: serde_json::Value =
        serde_json::from_str(&line).map_err(|_| format!("unexpected answer {line:?}"))?;
    if let Some(e) = answer["error"].as_str() {
        return Err(e.to_string());
    }
    Ok(answer)
}
