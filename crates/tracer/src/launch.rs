//! Starting the program under ptrace without `unsafe`: trapline runs itself
//! again with [`TRACEME_ARG`]; that process stops itself (SIGSTOP), is
//! seized by its parent (`PTRACE_SEIZE`, so that threads can be
//! interrupted later without signals), continued, and executes the
//! program, which stops at its exec event before its first instruction.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// The first argument that makes trapline become the traced program.
pub const TRACEME_ARG: &str = "__trapline-traceme";

/// Exit status of the helper when the program could not be executed.
const EXEC_FAILED: i32 = 127;

/// In the helper process: wait to be traced and execute `program` with
/// `argv` (its `argv[0]` first). Returns only by exiting.
pub fn traceme_and_exec(program: &Path, argv: &[OsString]) -> ! {
    if let Err(e) = nix::sys::signal::raise(Signal::SIGSTOP) {
        eprintln!("trapline: cannot stop to be traced: {e}");
        std::process::exit(EXEC_FAILED);
    }
    let mut cmd = Command::new(program);
    if let Some(arg0) = argv.first() {
        cmd.arg0(arg0);
    }
    cmd.args(argv.iter().skip(1));
    let e = cmd.exec();
    eprintln!("trapline: cannot run {}: {e}", program.display());
    std::process::exit(EXEC_FAILED);
}

/// Starts `program` through `self_exe` and waits for its stop at the first
/// instruction. The calling thread becomes its tracer.
pub fn spawn(self_exe: &Path, program: &Path, argv: &[OsString]) -> Result<Pid, String> {
    let child = Command::new(self_exe)
        .arg(TRACEME_ARG)
        .arg(program)
        .arg("--")
        .args(argv)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
    let pid = Pid::from_raw(child.id() as i32);
    // The child is reaped by waitpid below and in the tracer, not by `Child`.
    drop(child);
    let failed = |why: String| {
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
        let _ = waitpid(pid, None);
        why
    };
    match waitpid(pid, Some(WaitPidFlag::WUNTRACED)) {
        Ok(WaitStatus::Stopped(_, Signal::SIGSTOP)) => {}
        Ok(WaitStatus::Exited(_, code)) => {
            return Err(format!(
                "{} did not start (status {code})",
                program.display()
            ))
        }
        other => {
            return Err(failed(format!(
                "the helper starting {} did not stop: {other:?}",
                program.display()
            )))
        }
    }
    let options = ptrace::Options::PTRACE_O_TRACECLONE
        | ptrace::Options::PTRACE_O_TRACEFORK
        | ptrace::Options::PTRACE_O_TRACEVFORK
        | ptrace::Options::PTRACE_O_TRACEEXEC
        | ptrace::Options::PTRACE_O_TRACEEXIT
        | ptrace::Options::PTRACE_O_EXITKILL;
    ptrace::seize(pid, options)
        .map_err(|e| failed(format!("cannot trace {}: {e}", program.display())))?;
    nix::sys::signal::kill(pid, Signal::SIGCONT)
        .map_err(|e| failed(format!("cannot continue {}: {e}", program.display())))?;
    loop {
        match waitpid(pid, Some(WaitPidFlag::__WALL)) {
            Ok(WaitStatus::PtraceEvent(_, _, e))
                if e == ptrace::Event::PTRACE_EVENT_EXEC as i32 =>
            {
                return Ok(pid)
            }
            // The stop it was seized in, and SIGCONT's delivery.
            Ok(WaitStatus::PtraceEvent(..)) => {
                let _ = ptrace::cont(pid, None);
            }
            Ok(WaitStatus::Stopped(_, sig)) => {
                let _ = ptrace::cont(pid, (sig != Signal::SIGSTOP).then_some(sig));
            }
            Ok(WaitStatus::Exited(_, code)) => {
                return Err(format!(
                    "{} did not start (status {code})",
                    program.display()
                ))
            }
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                return Err(format!("{} did not start ({sig})", program.display()))
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                return Err(failed(format!(
                    "waiting for {} failed: {e}",
                    program.display()
                )))
            }
        }
    }
}
