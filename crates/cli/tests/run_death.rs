//! `trapline run` killed with SIGKILL. A test binary of its own: it makes
//! itself the subreaper of the orphans it creates, which must not adopt
//! the processes of other tests.

mod common;

use common::*;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::path::Path;
use std::process::Stdio;

/// `trapline run FLAGS` of sigterm_wait.c, with a control socket; the
/// running `trapline run` and the program's pid, once it is blocked.
fn start(dir: &TestDir, flags: &[&str]) -> (std::process::Child, Pid) {
    let prog = compile_c(dir, "sigterm_wait.c");
    let mut cmd = isolated(run_command(dir, flags, &prog, &[]));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("start trapline run");
    let line = read_stdout_line(&mut child);
    let pid = line
        .strip_prefix("ready ")
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ready line: {line:?}"));
    (child, Pid::from_raw(pid))
}

fn socket_of(pid: Pid) -> String {
    let dir = trapline_contract::control::socket_dir(
        std::env::var("XDG_RUNTIME_DIR").ok().as_deref(),
        nix::unistd::geteuid().as_raw(),
    );
    trapline_contract::control::socket_path(&dir, pid.as_raw() as u32)
}

/// How `pid`, a child of ours, ended; a panic if it runs on past `secs`.
fn reap_within(pid: Pid, secs: u64) -> WaitStatus {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)).expect("waitpid") {
            WaitStatus::StillAlive => {
                if std::time::Instant::now() > deadline {
                    let _ = kill(pid, Signal::SIGKILL);
                    panic!("{pid} still runs {secs} s after trapline run died");
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            status => return status,
        }
    }
}

/// After SIGKILL of `trapline run`, its command ran on, orphaned and still
/// recording, and its control socket stayed behind. Now the kernel kills
/// the command with it (unless `--outlive`), and the next agent that
/// serves a socket removes those of processes that are gone.
#[test]
fn the_command_dies_with_trapline_run_unless_it_may_outlive_it() {
    nix::sys::prctl::set_child_subreaper(true).expect("become a subreaper");
    let dir = TestDir::new("dies_with_run");
    let (mut run, pid) = start(&dir, &["--control"]);
    let socket = socket_of(pid);
    assert!(Path::new(&socket).exists(), "{socket}");
    run.kill().expect("SIGKILL trapline run");
    run.wait().expect("reap trapline run");
    // Orphaned, the program is ours to reap.
    assert_eq!(
        reap_within(pid, 60),
        WaitStatus::Signaled(pid, Signal::SIGKILL, false)
    );
    assert!(Path::new(&socket).exists(), "SIGKILL leaves the socket");

    let outlives = TestDir::new("outlives_run");
    let (mut run, second) = start(&outlives, &["--control", "--outlive"]);
    assert!(!Path::new(&socket).exists(), "the stale {socket} stayed");
    run.kill().expect("SIGKILL trapline run");
    run.wait().expect("reap trapline run");
    // It runs on until told otherwise; SIGTERM ends it with its trace.
    assert_eq!(kill(second, None), Ok(()));
    kill(second, Signal::SIGTERM).expect("SIGTERM the program");
    assert_eq!(
        reap_within(second, 60),
        WaitStatus::Signaled(second, Signal::SIGTERM, false)
    );
    assert!(!Path::new(&socket_of(second)).exists());
    let report = leaks(&outlives.trace());
    assert_complete(&report);
}
